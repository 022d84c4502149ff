"""bench.read_floor on the CPU: its byte counts are the packed weights' (trit.ops.repack), its launch-shape
sweep stays within the H200's thread limits, and its table is computed from the rows (the probe itself runs in
tests/test_ops_cuda.py on a GPU)."""
import json

import pytest
import torch

from bench import read_floor as rf


@pytest.mark.parametrize("N,K", [(1, 1), (17, 129), (640, 2560), (28672, 8192)])
def test_packed_bytes_are_the_repacked_weights(N, K):
    from trit import ops

    if N * K > 1 << 24:  # the formula is what repack's shape gives; no need to pack 235M weights here
        small = ops.repack(torch.zeros(min(N, 64), min(K, 512), dtype=torch.int8))
        assert small.shape == (-(-min(N, 64) // 16), -(-min(K, 512) // 128) * 128)
    else:
        p = ops.repack(torch.zeros(N, K, dtype=torch.int8))
        assert rf.packed_bytes(N, K) == p.numel() * 4 + N * 4


def test_sweep_fits_the_sm():
    cfgs = rf.configs_for(132)
    assert len(cfgs) == len(set(cfgs)) > 10
    assert all(b % 132 == 0 and t % 32 == 0 and t <= 1024 and (b // 132) * t <= 2048 and u in (2, 4, 8)
               for b, t, u in cfgs)


def test_tma_sweep_fits_shared_memory():
    cfgs = rf.tma_configs_for(132)
    assert len(cfgs) == len(set(cfgs)) > 8
    assert all(b % 132 == 0 and t % 32 == 0 and c % 16 == 0 and c <= 65536 and 1 <= s <= 16
               and (b // 132) * c * s <= 200 * 1024 for b, t, c, s in cfgs)
    assert {rf.config_name(c) for c in cfgs}.isdisjoint(rf.config_name(c) for c in rf.configs_for(132))
    assert rf.config_name((264, 128, 32768, 3)) == "tma:264x128x32Kx3"


def test_xor_words_is_the_xor_of_uint32_words():
    t = torch.tensor([1, 2, 4, -1], dtype=torch.int32)
    assert rf.xor_words(t) == (1 ^ 2 ^ 4 ^ 0xFFFFFFFF)


def test_table_from_rows(tmp_path):
    rec = tmp_path / "k.json"
    nb = rf.packed_bytes(28672, 8192)
    rec.write_text(json.dumps({"rows": [{"N": 28672, "K": 8192, "M": 1, "packed_bytes": nb, "a8_us": 21.3,
                                         "a8_pre_us": 19.3, "fused_us": 27.6},
                                        {"N": 28672, "K": 8192, "M": 16, "a8_us": 99.0}]}))
    k = rf.kernel_rows(rec)
    assert k[(28672, 8192)]["a8_us"] == 21.3
    row = {"N": 28672, "K": 8192, "bytes": nb, "read_us": 16.0, "best_config": "264x512x4",
           "copy_floor_us": nb / 4.18e12 * 1e6, **{x: k[(28672, 8192)][x] for x in ("a8_us", "a8_pre_us", "fused_us")}}
    md = rf.markdown({"device": "H200", "date": "d", "commit": "c", "command": "x", "n_configs": 27}, [row])
    line = [ln for ln in md.splitlines() if ln.startswith("| 28672x8192")][0]
    cf = nb / 4.18e12 * 1e6
    assert f"{100 * cf / 19.3:.0f}% / {100 * 16.0 / 19.3:.0f}%" in line  # GEMV: % of copy floor / % of read floor
    assert f"{100 * 16.0 / 27.6:.0f}%" in line


def test_most_over_bf16_is_bf16_over_the_read_floor():
    row = {"N": 4096, "K": 4096, "bytes": rf.packed_bytes(4096, 4096), "read_us": 3.7, "best_config": "132x256x2",
           "copy_floor_us": 1.0, "bf16_us": 13.9}
    md = rf.markdown({"device": "H200", "date": "d", "commit": "c", "command": "x", "n_configs": 27}, [row])
    line = [ln for ln in md.splitlines() if ln.startswith("| 4096x4096")][0]
    assert line.endswith(f"| 13.9 | {13.9 / 3.7:.2f}x |")
