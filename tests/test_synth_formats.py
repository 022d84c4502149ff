"""The synthetic checkpoints of reference.synth match each public convention bit for bit.

Each writer is checked against an *independent* packer: the real library function where it is
installed (transformers ``pack_weights``, compressed-tensors ``pack_to_int32``), otherwise a
line-by-line transcription of the public code (AutoGPTQ v1 ``QuantLinear.pack``, the seed's
``unpack_ternary_packed``, bitnet.cpp I2_S lane rule).  A writer that is wrong here would make
the inspector tests prove nothing.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as hst

from reference import synth
from reference.checkpoint import Checkpoint
from reference.formats import PackSpec, pack, unpack

ROOT = Path(__file__).resolve().parent.parent
TRAINED = ROOT / "models" / "tiny-trained"
Q = "model.layers.1.self_attn.k_proj"  # (64, 128): non-square
D = "model.layers.1.mlp.down_proj"  # (128, 384)


@pytest.fixture(scope="module")
def logical():
    return synth.Logical.from_dir(TRAINED)


def _write(fmt, logical, tmp_path):
    out = tmp_path / fmt
    truth = synth.write(fmt, logical, out)
    return Checkpoint(out), truth


# ---------------------------------------------------------------------------------------
# independent packers


def seed_unpack(packed: torch.Tensor, out_dim: int, in_dim: int) -> torch.Tensor:
    """The seed article's unpack_ternary_packed, verbatim in logic: 0->0, 1->+1, 2->-1, 3->0."""
    packed = packed.reshape(out_dim, in_dim // 4).to(torch.uint8)
    out = torch.empty(out_dim, in_dim, dtype=torch.int8)
    for i in range(4):
        code = (packed >> (2 * i)) & 0x3
        out[:, i::4] = torch.where(code == 1, 1, torch.where(code == 2, -1, 0)).to(torch.int8)
    return out


def gptq_v1_pack(w: torch.Tensor, bits: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoGPTQ v1 QuantLinear.pack for symmetric ternary: intweight = w + 2 (z = 2), qzeros = z - 1."""
    intweight = (w.to(torch.int64) + 2).t().contiguous()  # (K, N)
    qweight = torch.zeros(intweight.shape[0] // 32 * bits, intweight.shape[1], dtype=torch.int64)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + 32 // bits):
            qweight[row] |= intweight[j] << (bits * (j - i))
        i += 32 // bits
        row += 1
    return qweight


def i2s_pack(w: torch.Tensor) -> torch.Tensor:
    """bitnet.cpp I2_S: per 128-block, byte j holds elements j, 32+j, 64+j, 96+j at bits 7-6..1-0."""
    q = (w.to(torch.int64) + 1).reshape(w.shape[0], -1, 4, 32)  # (N, K/128, slot, j)
    b = (q[:, :, 0] << 6) | (q[:, :, 1] << 4) | (q[:, :, 2] << 2) | q[:, :, 3]  # (N, K/128, 32)
    return b.reshape(w.shape[0], -1).to(torch.uint8)


def as_u32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,lc", [("hf-bitlinear", "bitlinear"), ("hf-autobitlinear", "autobitlinear")])
def test_hf_bitnet_matches_transformers(fmt, lc, logical, tmp_path):
    from transformers.integrations.bitnet import pack_weights

    ck, truth = _write(fmt, logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod]
        want = pack_weights(t.clone().to(torch.int8))  # pack_weights adds 1 in place: pass a copy
        assert torch.equal(ck.get(f"{mod}.weight"), want), mod
        s = ck.get(f"{mod}.weight_scale")
        m = float(logical.mult[mod])
        assert s.shape == (1,)
        assert float(s) == pytest.approx(1 / m if lc == "bitlinear" else m, rel=1e-6)


def test_seed_matches_article_unpack(logical, tmp_path):
    ck, truth = _write("seed", logical, tmp_path)
    for mod in (Q, D):
        n, k = logical.ternary[mod].shape
        packed = ck.get(f"{mod}.weight_ternary")
        assert packed.dtype == torch.uint8 and packed.shape == (n, k // 4)
        assert torch.equal(seed_unpack(packed, n, k), logical.ternary[mod])
        assert ck.get(f"{mod}.scale").shape == (n,)


def test_msb_variant_reverses_slots(logical, tmp_path):
    ck_l, _ = _write("seed", logical, tmp_path)
    ck_m, _ = _write("seed-msb", logical, tmp_path)
    a, b = ck_l.get(f"{Q}.weight_ternary").to(torch.int64), ck_m.get(f"{Q}.weight_ternary").to(torch.int64)
    rev = sum(((a >> (2 * s)) & 3) << (2 * (3 - s)) for s in range(4))
    assert torch.equal(rev, b)


def test_group_scales_shape(logical, tmp_path):
    ck, truth = _write("group", logical, tmp_path)
    s = ck.get(f"{D}.scale")
    assert s.shape == (128, 384 // 64) and s.dtype == torch.float16


@pytest.mark.parametrize("fmt", ["compressed-tensors", "compressed-tensors-group"])
def test_compressed_tensors_matches_library(fmt, logical, tmp_path):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    ck, truth = _write(fmt, logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod]
        got = ck.get(f"{mod}.weight_packed")
        assert torch.equal(got, pack_to_int32(t.to(torch.int8), 2))
        assert torch.equal(unpack_from_int32(got, 2, t.shape), t)  # library unpack: v = code - 2
        assert ck.get(f"{mod}.weight_shape").tolist() == list(t.shape)
    n = logical.ternary[D].shape[0]
    assert ck.get(f"{D}.weight_scale").shape == ((n, 1) if fmt == "compressed-tensors" else (n, 384 // 64))


def test_gptq_matches_autogptq_v1(logical, tmp_path):
    ck, truth = _write("gptq", logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod]
        n, k = t.shape
        assert torch.equal(as_u32(ck.get(f"{mod}.qweight")), gptq_v1_pack(t))
        qz = as_u32(ck.get(f"{mod}.qzeros"))
        assert qz.shape == (k // 64, n // 16)
        assert bool((qz == 0x55555555).all())  # every 2-bit field holds z - 1 = 1
        assert ck.get(f"{mod}.scales").shape == (k // 64, n)
        assert torch.equal(ck.get(f"{mod}.g_idx"), (torch.arange(k) // 64).to(torch.int32))


def test_i2s_lane_rule(logical, tmp_path):
    ck, truth = _write("i2s", logical, tmp_path)
    for mod in (Q, D):
        key = synth.rename(mod, "gguf")
        assert torch.equal(ck.get(f"{key}.weight"), i2s_pack(logical.ternary[mod]))
        assert ck.get(f"{key}.scale").dtype == torch.float32
    assert "token_embd.weight" in ck and "blk.0.attn_sub_norm.weight" in ck


@pytest.mark.parametrize("fmt", ["trilm", "trilm-row"])
def test_trilm_unpacked_shards(fmt, logical, tmp_path):
    ck, truth = _write(fmt, logical, tmp_path)
    w = ck.get(f"{Q}.weight")
    assert w.dtype == torch.float16
    mags = torch.unique(w.float().abs()[w != 0])
    assert (len(mags) == 2) if fmt == "trilm" else (len(mags) > 2)  # two row shards / one s per row
    assert torch.equal(torch.sign(w.float()).to(torch.int8), logical.ternary[Q])


def test_bitnet_gpu_fused(logical, tmp_path):
    ck, truth = _write("bitnet-gpu", logical, tmp_path)
    wqkv = ck.get("layers.1.attention.wqkv.weight")
    assert wqkv.dtype == torch.int8 and wqkv.shape == (128 + 64 + 64, 128 // 4)
    t = torch.cat([logical.ternary[f"model.layers.1.self_attn.{p}_proj"] for p in "qkv"])
    # lane rule: 4-byte groups, byte j of a group holds elements j, 4+j, 8+j, 12+j at bits 2s; code w+2
    u = wqkv.to(torch.int64) & 0xFF
    codes = torch.stack([(u >> (2 * s)) & 3 for s in range(4)], -1)  # (N, K/4, slot)
    codes = codes.reshape(256, -1, 4, 4).permute(0, 1, 3, 2).reshape(256, 128)  # (N, K)
    assert torch.equal(codes - 2, t.to(torch.int64))
    assert ck.get("layers.1.attention.wqkv.weight_scale").shape == (3,)
    assert ck.get("layers.1.feed_forward.w13.weight").shape == (2 * 384, 32)


def test_sharded_index(logical, tmp_path):
    out = tmp_path / "sharded"
    synth.write("seed", logical, out, shards=3)
    assert (out / "model.safetensors.index.json").exists()
    ck = Checkpoint(out)
    assert len({ck.info(k).file for k in ck.keys()}) == 3


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 40), k=hst.integers(1, 70), container=hst.sampled_from(["uint8", "int8", "int16", "int32"]),
       axis=hst.integers(0, 1), lanes=hst.sampled_from(["interleaved", "blocked", "block_interleaved"]),
       order=hst.sampled_from(["lsb", "msb"]), transposed=hst.booleans(), seed=hst.integers(0, 2**16))
def test_packspec_roundtrip(n, k, container, axis, lanes, order, transposed, seed):
    """Any point of the PackSpec space the inspector searches round-trips exactly (odd sizes pad)."""
    v = {"uint8": 4, "int8": 4, "int16": 8, "int32": 16}[container]
    spec = PackSpec(bits=2, container=container, pack_axis=axis, lanes=lanes, block=4 * v if lanes == "block_interleaved"
                    else None, bit_order=order, codes=(None, -1, 0, 1), transposed=transposed, pad_code=2)
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (n, k), generator=g).to(torch.int8)
    assert torch.equal(unpack(pack(w, spec), spec, (n, k)), w)


# ---------------------------------------------------------------------------------------
# unpacked integer ternary, 4-bit containers, symmetric low-bit integers


def test_unpacked_int8_ternary_stores_values(logical, tmp_path):
    ck, _ = _write("int8-ternary", logical, tmp_path)
    for mod in (Q, D):
        w = ck.get(f"{mod}.weight")
        assert w.dtype == torch.int8 and torch.equal(w, logical.ternary[mod])  # -1 / 0 / +1 as is
        assert ck.get(f"{mod}.weight_scale").dtype == torch.bfloat16


@pytest.mark.parametrize("fmt,code", [("uint8-ternary", lambda t: t + 1),
                                      ("uint8-ternary-perm", lambda t: torch.where(t < 0, 2, t))])
def test_unpacked_uint8_codes(fmt, code, logical, tmp_path):
    ck, _ = _write(fmt, logical, tmp_path)
    for mod in (Q, D):
        w = ck.get(f"{mod}.weight")
        assert w.dtype == torch.uint8 and w.shape == logical.ternary[mod].shape
        assert torch.equal(w.to(torch.int64), code(logical.ternary[mod].to(torch.int64)))


def test_nibble_ternary_high_nibble_first(logical, tmp_path):
    ck, _ = _write("nibble-ternary", logical, tmp_path)
    for mod in (Q, D):
        t = logical.ternary[mod].to(torch.int64)
        w = ck.get(f"{mod}.weight").to(torch.int64)
        assert w.shape == (t.shape[0], t.shape[1] // 2)
        assert torch.equal(w, ((t[:, 0::2] + 1) << 4) | (t[:, 1::2] + 1))


@pytest.mark.parametrize("fmt,bits", [("compressed-tensors-int4-ternary", 4), ("compressed-tensors-int2", 2),
                                      ("compressed-tensors-int4", 4)])
def test_compressed_tensors_int_matches_library(fmt, bits, logical, tmp_path):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    lg = logical if fmt.endswith("ternary") else logical.requantized(bits, seed=1)
    out = tmp_path / fmt
    synth.write(fmt, lg, out)
    ck = Checkpoint(out)
    for mod in (Q, D):
        t = lg.ternary[mod]
        got = ck.get(f"{mod}.weight_packed")
        assert torch.equal(got, pack_to_int32(t.to(torch.int8), bits))
        assert torch.equal(unpack_from_int32(got, bits, t.shape), t)
    if not fmt.endswith("ternary"):
        levels = torch.unique(torch.cat([t.reshape(-1) for t in lg.ternary.values()]))
        assert levels.tolist() == list(range(-(1 << (bits - 1)), 1 << (bits - 1)))  # every level used


@settings(max_examples=40, deadline=None)
@given(n=hst.integers(1, 40), k=hst.integers(1, 70), container=hst.sampled_from(["uint8", "int8", "int16", "int32"]),
       bits=hst.sampled_from([4, 8]), axis=hst.integers(0, 1),
       lanes=hst.sampled_from(["interleaved", "blocked", "block_interleaved"]), order=hst.sampled_from(["lsb", "msb"]),
       transposed=hst.booleans(), levels=hst.booleans(), seed=hst.integers(0, 2**16))
def test_packspec_roundtrip_wide_codes(n, k, container, bits, axis, lanes, order, transposed, levels, seed):
    """4-bit and one-per-element (8-bit) codes, ternary or full symmetric integer range, round-trip."""
    from reference.formats import code_table, offset_table, twos_complement_table

    if bits == 8 and container not in ("uint8", "int8"):
        bits = 4
    v = {"uint8": 8, "int8": 8, "int16": 16, "int32": 32}[container] // bits
    lanes = "interleaved" if v == 1 else lanes
    codes = (offset_table(bits, 1 << (bits - 1)) if bits == 4 else twos_complement_table(bits)) if levels \
        else code_table(bits, {(1 << bits) - 1: -1, 0: 0, 1: 1})
    spec = PackSpec(bits=bits, container=container, pack_axis=axis, lanes=lanes,
                    block=4 * v if lanes == "block_interleaved" else None, bit_order=order, codes=codes,
                    transposed=transposed, pad_code=codes.index(0))
    g = torch.Generator().manual_seed(seed)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if levels else (-1, 2)
    w = torch.randint(lo, hi, (n, k), generator=g)
    got = unpack(pack(w, spec), spec, (n, k))
    assert torch.equal(got.to(torch.int64), w)


@pytest.mark.parametrize("fmt", ["gptq-int4-ternary", "gptq-int4"])
def test_gptq_int4_matches_autogptq_v1(fmt, logical, tmp_path):
    """AutoGPTQ v1 QuantLinear.pack at bits=4: intweight = w + 8, 8 per int32 along K; qzeros = z - 1 = 7."""
    lg = logical if fmt.endswith("ternary") else logical.requantized(4, seed=4)
    out = tmp_path / fmt
    synth.write(fmt, lg, out)
    ck = Checkpoint(out)
    for mod in (Q, D):
        t = lg.ternary[mod]
        n, k = t.shape
        intweight = (t.to(torch.int64) + 8).t().contiguous()  # (K, N)
        want = torch.zeros(k // 8, n, dtype=torch.int64)
        for row in range(k // 8):
            for j in range(8):
                want[row] |= intweight[row * 8 + j] << (4 * j)
        assert torch.equal(as_u32(ck.get(f"{mod}.qweight")), want)
        assert bool((as_u32(ck.get(f"{mod}.qzeros")) == 0x77777777).all())
