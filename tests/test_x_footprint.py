"""bench.x_footprint's CPU-side pieces: the case parser and the scaled launches (same grid, narrower x)."""
import pytest

from bench import x_footprint as xf


def test_parse_cases():
    assert xf.parse_cases("32:6144x4096, 64:14336X4096") == [(32, 6144, 4096), (64, 14336, 4096)]
    for bad in ("32-6144x4096", "8:4096x4096", "65:4096x4096", "32:4096"):
        with pytest.raises(SystemExit, match="case"):
            xf.parse_cases(bad)


def test_scaled_launches_keep_grid_and_warps():
    # 6144x4096 at M = 32: ks = 4 split-K warps, one tile per CTA (the narrow launch)
    got = xf.scaled_launches(6144, 4096, ks=4, nw=1)
    assert [(s["f"], s["N"], s["K"], s["ks"], s["nw"]) for s in got] == [(2, 12288, 2048, 2, 2), (4, 24576, 1024, 1, 4)]
    for s in got:  # same warps per CTA, same k-blocks per warp, same CTAs (tiles / nw)
        assert s["ks"] * s["nw"] == 4
        assert (s["K"] // xf.KBLOCK) // s["ks"] == (4096 // xf.KBLOCK) // 4
        assert (s["N"] // 16) // s["nw"] == 6144 // 16
    # ks = 1: nothing to scale; a K that f does not divide into whole k-blocks is skipped
    assert xf.scaled_launches(28672, 4096, ks=1, nw=4) == []
    assert [s["f"] for s in xf.scaled_launches(4096, 384, ks=8, nw=1)] == []  # 384 / 128 = 3 k-blocks
    # the CTA's 8 warps bound f * nw
    assert [s["f"] for s in xf.scaled_launches(4096, 4096, ks=8, nw=1)] == [2, 4, 8]
    assert [s["f"] for s in xf.scaled_launches(4096, 4096, ks=4, nw=2)] == [2, 4]


def test_no_scale_markdown_splits_the_op():
    rows = [dict(M=32, N=6144, K=4096, f=1, ks=4, nw=1, us=6.8, quant_us=1.5, op_us=9.1, x_kib=128),
            dict(M=64, N=2560, K=6912, f=1, ks=8, nw=1, us=10.5, quant_us=None, op_us=12.0, x_kib=432)]
    md = xf.markdown({"device": "H200", "date": "d", "commit": "c"}, rows)
    assert "| 32 | 6144x4096 | 4 x 1 | 6.80 | 1.50 | 9.10 | 0.80 |" in md
    assert "| 64 | 2560x6912 | 8 x 1 | 10.50 | - | 12.00 | 1.50 |" in md


def test_no_scale_markdown_with_the_norm_route():
    rows = [dict(M=32, N=6144, K=4096, f=1, ks=4, nw=1, us=6.8, quant_us=2.5, op_us=9.1, x_kib=128,
                 norm_q_us=3.0, gemv_pre_us=6.9)]
    md = xf.markdown({"device": "H200"}, rows)
    assert "| 32 | 6144x4096 | 3.00 | 6.90 | 9.30 |" in md
    assert "rms_norm_a8q 3.00 us + its GEMV 6.90 us" in xf.fmt(dict(rows[0], grid=[1], block=[128, 1, 1], weight_gbps=900.0))
