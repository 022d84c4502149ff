"""bench.norm_quant's CPU-side pieces: the argument parsers, the output check against the one-CTA kernel (on the
CPU implementation of rms_norm_a8q) and the Markdown table."""
import pytest
import torch

from bench import norm_quant as nq
from trit import ops  # noqa: F401  (registers torch.ops.trit)


def test_parse_cases():
    assert nq.parse_cases("32:4096, 16:8192") == [(32, 4096), (16, 8192)]
    for bad in ("32x4096", "0:4096", "32:4100", "32:20000", "32:4", ""):
        with pytest.raises(SystemExit, match="case|no case"):
            nq.parse_cases(bad)


def test_parse_clusters_puts_the_one_cta_kernel_first():
    assert nq.parse_clusters("2,8") == [0, 2, 8]
    assert nq.parse_clusters("0,1,1,4") == [0, 1, 4]
    for bad in ("a", "-1", ""):
        with pytest.raises(SystemExit, match="--clusters"):
            nq.parse_clusters(bad)


@pytest.mark.parametrize("M,layout", [(5, 0), (24, 1)])
def test_check_passes_equal_outputs_and_names_each_difference(M, layout):
    K = 256
    g = torch.Generator().manual_seed(M)
    x = (torch.randn(M, K, generator=g) * 3).to(torch.bfloat16)
    r = (torch.randn(M, K, generator=g) * 3).to(torch.bfloat16)
    w = (torch.rand(K, generator=g) + 0.5).to(torch.bfloat16)
    ref = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-5, layout)
    assert nq.check(ref, ref, "same", layout) == []
    # one rounding step of out is allowed only with its own quantization; a changed residual, a far-off out,
    # or an xq that is not the quantization of the out returned are each named
    out, res, xq, xs, rs = (t.clone() for t in ref)
    res[0, 0] += 1
    assert any("residual" in p for p in nq.check(ref, (out, res, xq, xs, rs), "v", layout))
    out2 = ref[0].clone()
    out2[1, 3] = out2[1, 3] * 1.5 + 1
    bad = nq.check(ref, (out2, ref[1], ref[2], ref[3], ref[4]), "v", layout)
    assert any("outputs off" in p for p in bad) and any("xq" in p or "xs" in p or "rowsum" in p for p in bad)
    xq2 = ref[2].clone()
    xq2[0, 0] += 1
    assert [p for p in nq.check(ref, (ref[0], ref[1], xq2, ref[3], ref[4]), "v", layout)] == ["v: xq is not a8_quantize of its out"]


def test_markdown_table():
    rows = [dict(M=32, K=4096, layout=1, rnq0_us=3.8, rnq0_grid=[32, 1, 1], rnq2_us=2.9, rnq2_grid=[2, 32, 1],
                 inductor_norm_us=2.5, quant_us=2.5, default_us=5.0)]
    md = nq.markdown({"device": "H200", "date": "d", "commit": "c", "command": "cmd"}, rows, [0, 2], [])
    assert "| 32 | 4096 | 3.80 [32, 1, 1] | 2.90 [2, 32, 1] | 2.50 | 2.50 | 5.00 | 0.58 |" in md
    assert "all passed" in md
    md = nq.markdown({"device": "H200", "date": "d", "commit": "c", "command": "cmd"}, rows, [0, 2], ["M=32: xq"])
    assert "- M=32: xq" in md


def test_kernel_time_sums_each_calls_kernels(monkeypatch):
    """Kernels named alike in one call (Inductor's norm split in two) are added per call, then the median taken;
    a count that does not divide into the calls is an error."""
    evs = [{"cat": "kernel", "name": "triton_red_0", "dur": 1.0, "args": {"grid": [4, 1, 1]}},
           {"cat": "kernel", "name": "triton_poi_1", "dur": 2.0}] * 2 + [{"cat": "kernel", "name": "other", "dur": 9.0}]
    evs[2] = dict(evs[2], dur=3.0)
    monkeypatch.setattr(nq, "cupti_kernel_events", lambda fn, n: evs)
    us, grid = nq._median_kernel(None, 2, "triton")
    assert us == 4.0 and grid == [4, 1, 1]  # calls: 1 + 2 = 3 and 3 + 2 = 5, median 4
    with pytest.raises(RuntimeError, match="3 kernels named like 'triton' in 2 calls"):
        monkeypatch.setattr(nq, "cupti_kernel_events", lambda fn, n: evs[:3])
        nq._median_kernel(None, 2, "triton")
    with pytest.raises(RuntimeError, match="no kernel named like 'quant_rows'"):
        nq._median_kernel(None, 2, "quant_rows")
