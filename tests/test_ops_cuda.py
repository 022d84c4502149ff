"""GPU tests of the trit CUDA kernels: fused, a8, naive and decode vs the float64 references."""
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the trit CUDA kernels need a GPU (tests/test_ops.py covers CPU)",
                allow_module_level=True)

from trit import ops  # noqa: E402  (builds/loads the extension)

try:  # tests/ as a package or as rootdir-relative modules
    from .test_ops import DTYPES, TOL, assert_close_rel, compiled_norm_and_pre, make_case  # noqa: E402
except ImportError:
    from test_ops import DTYPES, TOL, assert_close_rel, compiled_norm_and_pre, make_case  # noqa: E402

DEV = "cuda"
SETTINGS = settings(max_examples=int(os.environ.get("TRIT_HYPOTHESIS_EXAMPLES", "60")), deadline=None, suppress_health_check=list(HealthCheck))
# awkward sizes around the kernel's tile edges (16 rows, 128-input blocks, 8-row mma columns)
AWKWARD_N = st.sampled_from([1, 3, 15, 16, 17, 31, 33, 100, 127, 129, 255, 640, 1000])
AWKWARD_K = st.sampled_from([1, 7, 8, 100, 127, 128, 129, 255, 256, 300, 1000, 2560, 4099])
M_SIZES = st.one_of(st.integers(1, 72), st.sampled_from([127, 128, 129, 256, 1000, 1024, 4096]))


def test_extension_loaded():
    assert ops.EXTENSION_LOADED, f"CUDA extension failed to load: {ops.EXTENSION_ERROR}"


def poison(t):
    return t.fill_(float("nan")) if t.is_floating_point() else t


def capture(fn, static_x, warmup=1):
    """fn(static_x) warmed up on a side stream, then captured: (the CUDA graph, its output tensor)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(static_x)  # outside capture: first-call setup (workspaces, attributes) happens here
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = fn(static_x)
    return g, static_y


def eager_or_replayed(fn, x, graph):
    """fn(x) eagerly, or captured (capture) and replayed once onto a poisoned output: what a stale
    or missing write inside the graph would leave shows up in the result."""
    if not graph:
        return fn(x)
    g, static_y = capture(fn, x.clone())
    poison(static_y)
    g.replay()
    return static_y


@SETTINGS
@given(M=M_SIZES, N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_ternary_mm_cuda(M, N, K, dtype, bias, seed):
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    ref = ops.ternary_mm_ref(x, p, s, N, K, b)
    assert_close_rel(torch.ops.trit.ternary_mm(x, p, s, N, K, b), ref, TOL[dtype],
                     f"ternary_mm M={M} N={N} K={K} {dtype}")
    assert_close_rel(ops.ternary_linear(x, p, s, N, K, b), ref, TOL[dtype],
                     f"ternary_linear M={M} N={N} K={K} {dtype}")


@SETTINGS
@given(M=M_SIZES, N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_ternary_mm_a8_cuda(M, N, K, dtype, bias, seed):
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    y = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    ref = ops.ternary_mm_a8_ref(x, p, s, N, K, b)
    # same fp32 operations in the same order: allow only last-bit differences
    assert_close_rel(y, ref, {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype],
                     f"ternary_mm_a8 M={M} N={N} K={K} {dtype}")
    frac = (y != ref).float().mean().item()
    assert frac < 1e-3, f"a8: {frac:.2%} of outputs differ from the reference"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(M=st.integers(1, 20), N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_naive_cuda(M, N, K, dtype, bias, seed):
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    assert_close_rel(torch.ops.trit.ternary_mm_naive(x, p, s, N, K, b), ops.ternary_mm_ref(x, p, s, N, K, b),
                     TOL[dtype], f"naive M={M} N={N} K={K}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("NK", [(1, 1), (33, 300), (640, 2560), (129, 1001)])
def test_decode_cuda(dtype, NK):
    N, K = NK
    x, w, p, s, _ = make_case(1, N, K, torch.float32, False, 1, DEV)
    sc = None if dtype == torch.int8 else s
    d = torch.ops.trit.ternary_decode(p, sc, N, K, dtype)
    assert torch.equal(d, ops.ternary_decode_ref(p, sc, N, K, dtype))


def test_repack_on_cuda_matches_cpu():
    w = torch.randint(-1, 2, (77, 333), dtype=torch.int8)
    assert torch.equal(ops.repack(w.to(DEV)).cpu(), ops.repack(w))
    assert torch.equal(ops.unpack(ops.repack(w.to(DEV)), 77, 333).cpu(), w)


def test_every_output_written_and_deterministic():
    x, w, p, s, b = make_case(9, 1000, 4099, torch.bfloat16, True, 3, DEV)
    ys = [torch.ops.trit.ternary_mm(x, p, s, 1000, 4099, b) for _ in range(3)]
    assert torch.isfinite(ys[0]).all()
    assert all(torch.equal(ys[0], y) for y in ys[1:]), "run-to-run difference: race?"


def test_non_contiguous_and_offset_input():
    x, w, p, s, b = make_case(8, 64, 256, torch.bfloat16, True, 4, DEV)
    big = torch.randn(8, 300, device=DEV).to(torch.bfloat16)
    big[:, 5:261] = x  # 5-element offset: misaligned rows
    xv = big[:, 5:261]
    assert_close_rel(torch.ops.trit.ternary_mm(xv, p, s, 64, 256, b), ops.ternary_mm_ref(x, p, s, 64, 256, b),
                     TOL[torch.bfloat16], "strided x")


@pytest.mark.parametrize("name", ["ternary_mm", "ternary_mm_a8", "ternary_mm_naive"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_cuda(name, dtype):
    x, w, p, s, b = make_case(5, 40, 300, dtype, True, 5, DEV)
    torch.library.opcheck(getattr(torch.ops.trit, name), (x, p, s, 40, 300, b))


# The bitplane (+1/-1 bitmask) layout: ternary_mm_a8_bp runs ternary_mm_a8's route with the other decode
# (a8_frag_w<true>), so its results must be those of ternary_mm_a8 bit for bit, under every launch choice
# the route makes (fused quantizer, one or two tiles per warp, 1 / 2 / 4 row tiles), eagerly and replayed.
@pytest.mark.parametrize("M", [1, 3, 8, 9, 16, 17, 32])
@pytest.mark.parametrize("NK", [(33, 300), (100, 1000), (2560, 2560), (640, 4104), (6160, 520)])
def test_a8_bitplane_matches_codes_cuda(monkeypatch, M, NK):
    N, K = NK
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    for dtype in DTYPES:
        x, w, p, s, b = make_case(M, N, K, dtype, True, 41 + M, DEV)
        bp = ops.repack_bitplane(p)
        assert torch.equal(ops.repack_bitplane(p.cpu()).to(DEV), bp)
        a0 = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        for env in ({}, {"TRIT_A8_FUSEQ": "1"}, {"TRIT_A8_FUSEQ": "0"}, {"TRIT_WN": "1"}, {"TRIT_WN": "2"},
                    {"TRIT_PDL": "0", "TRIT_L2PF": "0"}, {"TRIT_L2PF": "2"}, {"TRIT_NW": "3"}):
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            got = torch.ops.trit.ternary_mm_a8_bp(x, bp, s, N, K, b)
            assert torch.equal(got, a0), f"{dtype} {env}"
            for k in env:
                monkeypatch.delenv(k)
        y = eager_or_replayed(lambda t: torch.ops.trit.ternary_mm_a8_bp(t, bp, s, N, K, b), x, True)
        assert torch.equal(y, a0), f"{dtype} graph replay"


def test_a8_bitplane_outside_its_route_cuda(monkeypatch):
    x, w, p, s, b = make_case(33, 100, 1000, torch.bfloat16, False, 9, DEV)
    bp = ops.repack_bitplane(p)
    with pytest.raises(RuntimeError, match=r"trit::ternary_mm_a8_bp: the bitplane layout runs only .*M = 33"):
        torch.ops.trit.ternary_mm_a8_bp(x, bp, s, 100, 1000, None)
    monkeypatch.setenv("TRIT_KERNEL", "v4")
    with pytest.raises(RuntimeError, match="TRIT_KERNEL=v4 has no bitplane kernel"):
        torch.ops.trit.ternary_mm_a8_bp(x[:4], bp, s, 100, 1000, None)
    monkeypatch.delenv("TRIT_KERNEL")
    assert torch.ops.trit.ternary_mm_a8_bp(x[:0], bp, s, 100, 1000, None).shape == (0, 100)


# Bad input to the CUDA ops must raise a RuntimeError that names the op and the expected value, never
# crash the process: on the H200 (run 33) every refusal whose message held a number segfaulted, because
# c10::str streamed the integer inside the extension (csrc/bindings.cpp builds its messages itself now).
# Each case runs in its own process, so a crash is reported as one (signal and stderr), not as a dead run.
REFUSALS = {
    "ternary_mm(x, p[:, :-128].contiguous(), s, N, K)": r"trit::ternary_mm: packed has shape \[7, 896\] but N=100, "
                                                          r"K=1000 needs \(7, 1024\)",
    "ternary_mm_a8(x, p, s[:-1].contiguous(), N, K)": r"trit::ternary_mm_a8: scale must be \[N\]=\[100\], got \[99\]",
    "ternary_mm_naive(x[:, :-1].contiguous(), p, s, N, K)": r"trit::ternary_mm_naive: x.size\(1\)=999 but K=1000",
    "ternary_mm(x.double(), p, s, N, K)": r"trit::ternary_mm: unsupported dtype Double",
    "ternary_mm(x[0], p, s, N, K)": r"trit::ternary_mm: x must be 2-D \[M, K\], got \[1000\]",
    "ternary_mm(x, p, s, N, K, torch.zeros(3, device='cuda', dtype=x.dtype))": r"bias must be \[N\]=\[100\], got \[3\]",
    "ternary_mm_a8_bp(x, ops.repack_bitplane(p), s, N, K)": r"trit::ternary_mm_a8_bp: the bitplane layout runs only .*"
                                                            r"\(M = 33, N = 100, K = 1000;",
    "ternary_mm_a8q(x, xq[:, :-128].contiguous(), xs, rs, p, s, N, K)":
        r"trit::ternary_mm_a8q: xq must be int8 \[33, 1024\] \(trit.ops.a8_quantize of x \[33, 1000\], layout=0\), "
        r"got Char \[33, 896\]",
    "rms_norm_a8q(x, None, s.to(x.dtype), 1e-6)": r"trit::rms_norm_a8q: weight must be a contiguous BFloat16 \[1000\] "
                                                 r"on cuda:0, got BFloat16 \[100\] on cuda:0",
}


@pytest.mark.parametrize("call", list(REFUSALS))
def test_cuda_ops_refuse_bad_input_cleanly(call):
    code = ("import torch\nfrom trit import ops\nfrom torch.ops import trit as T\n"
            "N, K = 100, 1000\nx = torch.randn(33, K, device='cuda', dtype=torch.bfloat16)\n"
            "w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device='cuda')\n"
            "p, s = ops.repack(w), torch.rand(N, device='cuda')\nxq, xs, rs = ops.a8_quantize(x)\n"
            f"try:\n    T.{call}\nexcept RuntimeError as e:\n    print('RAISED', str(e))\n"
            "else:\n    print('NO ERROR')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, f"{call}: the process died (rc {r.returncode}): {r.stderr[-1500:]}"
    assert "RAISED" in r.stdout, f"{call}: {r.stdout[-500:]}"
    assert re.search(REFUSALS[call], r.stdout), f"{call}: message {r.stdout[-800:]!r}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_a8_bitplane_cuda(dtype):
    x, w, p, s, b = make_case(5, 40, 300, dtype, True, 5, DEV)
    torch.library.opcheck(torch.ops.trit.ternary_mm_a8_bp, (x, ops.repack_bitplane(p), s, 40, 300, b))


def test_opcheck_decode_cuda():
    _, _, p, s, _ = make_case(1, 40, 300, torch.float32, False, 6, DEV)
    torch.library.opcheck(torch.ops.trit.ternary_decode, (p, s, 40, 300, torch.bfloat16))


# (300, 512): a8 runs as int8 decode + torch._int_mm + epilogue (M >= 256, N % 8 == 0)
@pytest.mark.parametrize("M, N", [(1, 257), (16, 257), (64, 257), (300, 257), (300, 512)])
@pytest.mark.parametrize("fn", ["linear", "a8"])
def test_cuda_graph_capture_replay(M, N, fn):
    K = 1030
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 7, DEV)
    f = ops.ternary_linear if fn == "linear" else ops.ternary_linear_a8
    reff = ops.ternary_mm_ref if fn == "linear" else ops.ternary_mm_a8_ref
    static_x = x.clone()
    g, static_y = capture(lambda t: f(t, p, s, N, K, b), static_x, warmup=2)
    for seed in (11, 12):
        new_x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV)
        static_x.copy_(new_x)
        poison(static_y)
        g.replay()
        torch.cuda.synchronize()
        tol = TOL[torch.bfloat16] if fn == "linear" else 8e-3
        assert_close_rel(static_y, reff(new_x, p, s, N, K, b), tol, f"graph replay {fn} M={M}")


def test_any_rank_cuda():
    x, w, p, s, b = make_case(12, 50, 200, torch.float16, True, 8, DEV)
    y = ops.ternary_linear(x.view(3, 2, 2, 200), p, s, 50, 200, b)
    assert y.shape == (3, 2, 2, 50)
    assert_close_rel(y.reshape(12, 50), ops.ternary_mm_ref(x, p, s, 50, 200, b), TOL[torch.float16], "4-D")


# ------------------------------------------------------------------ v5 small-M kernels vs v4
# M <= 8 runs tmm_small_kernel (bf16/fp16 x, K % 8 == 0, 16-byte aligned x) and a8_small_kernel
# + the permuted quantizer, unless TRIT_KERNEL=v4. Sizes hit: K < 128 (tail only), K % 128 != 0
# with K % 8 == 0 (partial last k-block), K % 8 != 0 and misaligned x (v4 fallback), k-block
# counts per warp that leave 0..3 blocks after the 4-block chunks, and large split-K.
V5_K = [8, 120, 128, 136, 256, 384, 520, 1000, 1024, 2560, 4096, 4104, 8192, 300, 4099]
V5_N = [1, 16, 17, 100, 640]  # larger N: test_small_m_v5_matches_v4


@pytest.fixture(params=["v4", "v5"])
def kernel_gen(request, monkeypatch):
    if request.param in ("v4", "v5"):
        monkeypatch.setenv("TRIT_KERNEL", request.param)
    else:
        monkeypatch.delenv("TRIT_KERNEL", raising=False)
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 2, 5, 8, 9, 16, 23, 32, 33, 57, 64])  # MT = 1, 2, 4 and 8 (a8) tiles
@pytest.mark.parametrize("K", V5_K)
def test_small_m_kernels(kernel_gen, dtype, M, K):
    for N in V5_N:
        x, w, p, s, b = make_case(M, N, K, dtype, True, M * 1000 + K + N, DEV)
        ref = ops.ternary_mm_ref(x, p, s, N, K, b)
        y = torch.ops.trit.ternary_mm(x, p, s, N, K, b)
        assert_close_rel(y, ref, TOL[dtype], f"{kernel_gen} ternary_mm M={M} N={N} K={K} {dtype}")
        ya = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        assert_close_rel(ya, ops.ternary_mm_a8_ref(x, p, s, N, K, b), {torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype],
                         f"{kernel_gen} ternary_mm_a8 M={M} N={N} K={K} {dtype}")


@pytest.mark.parametrize("M", [1, 3, 8, 16, 31, 40, 64])
@pytest.mark.parametrize("NK", [(100, 1000), (2560, 2560), (1024, 8192), (640, 4104)])
def test_small_m_v5_matches_v4(monkeypatch, M, NK):
    """a8 accumulates in int32: v4 and v5 must agree bit for bit. fp: within rounding."""
    N, K = NK
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, w, p, s, b = make_case(M, N, K, dtype, True, 17 + M, DEV)
        monkeypatch.setenv("TRIT_KERNEL", "v4")
        y4, a4 = torch.ops.trit.ternary_mm(x, p, s, N, K, b), torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        monkeypatch.setenv("TRIT_KERNEL", "v5")
        y5, a5 = torch.ops.trit.ternary_mm(x, p, s, N, K, b), torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        assert torch.equal(a4, a5), f"a8 v4 != v5 at M={M} N={N} K={K} {dtype}"
        assert_close_rel(y5, y4, TOL[dtype], f"v5 vs v4 M={M} N={N} K={K} {dtype}")


def test_small_m_misaligned_x(monkeypatch):
    """With v5 selected, x not 16-byte aligned takes the v4 kernel (fp) / the scalar quantizer loads (a8)."""
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    M, N, K = 4, 64, 1000
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 9, DEV)
    ref = ops.ternary_mm_ref(x, p, s, N, K, b)
    flat = torch.full((M * K + 8,), float("nan"), device=DEV, dtype=torch.bfloat16)
    xo = flat[4:4 + M * K].view(M, K)  # 8-byte offset, contiguous
    xo.copy_(x)
    assert_close_rel(torch.ops.trit.ternary_mm(xo, p, s, N, K, b), ref, TOL[torch.bfloat16], "misaligned")
    assert torch.equal(torch.ops.trit.ternary_mm_a8(xo, p, s, N, K, b), torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b))


# ------------------------------------------------------------------ small-M launch knobs
# TRIT_PDL (programmatic dependent launch), TRIT_L2PF (bulk L2 prefetch), TRIT_KS (split-K
# warps) and TRIT_NW (tiles per CTA) change scheduling only: a8 (int32 accumulation) must be
# bit-identical under all of them; fp is bit-identical for a fixed split and within rounding
# across splits (TRIT_NW does not change the split: bit-identical).
@pytest.mark.parametrize("M", [17, 32])
@pytest.mark.parametrize("NK", [(28672, 8192), (8192, 28672), (13000, 10330)])
def test_a8_wide_layer_m32_launch_shape(monkeypatch, M, NK):
    """16 < M <= 32 on layers of >= 128M weights (two tiles per warp): the default launch shape, one wave
    of CTAs (csrc/a8_route.h a8_mt4_wide_nw: nw = 8 / 2 / 4 here), gives the bits of every forced
    (TRIT_NW, TRIT_KS), the general rule's among them, and matches the reference."""
    N, K = NK
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 5 + M, DEV)
    a = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    assert_close_rel(a, ops.ternary_mm_a8_ref(x, p, s, N, K, b), 8e-3, f"a8 M={M} N={N} K={K}")
    for nw, ks in (("1", "1"), ("4", "2"), ("1", "8"), ("2", "4"), ("8", "1"), ("4", "1")):
        monkeypatch.setenv("TRIT_NW", nw)
        monkeypatch.setenv("TRIT_KS", ks)
        assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a), f"nw={nw} ks={ks} M={M} N={N} K={K}"


@pytest.mark.parametrize("M", [17, 24, 32])
@pytest.mark.parametrize("NK", [(6144, 4096), (8192, 8192), (6912, 2560), (14336, 4096), (3000, 1800)])
@pytest.mark.parametrize("bp", [False, True])
def test_a8_narrow_layer_m32_launch_shape(monkeypatch, M, NK, bp):
    """16 < M <= 32 on layers with one tile per warp: one tile per CTA where K is split 4+ ways (csrc/a8_route.h
    a8_mt4_narrow_nw; 14336x4096 keeps ks = 2 with 4 tiles per CTA) gives the bits of the general rule's launch
    (TRIT_A8_NARROW_NW1=0) and of forced shapes, on the code-layout and the bitplane weights, and matches the
    reference."""
    N, K = NK
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 7 + M, DEV)
    q = ops.repack_bitplane(p) if bp else p
    f = torch.ops.trit.ternary_mm_a8_bp if bp else torch.ops.trit.ternary_mm_a8
    a = f(x, q, s, N, K, b)
    assert_close_rel(a, ops.ternary_mm_a8_ref(x, p, s, N, K, b), 8e-3, f"a8 M={M} N={N} K={K} bp={bp}")
    monkeypatch.setenv("TRIT_A8_NARROW_NW1", "0")
    assert torch.equal(f(x, q, s, N, K, b), a), f"the general rule's launch, M={M} N={N} K={K} bp={bp}"
    for nw, ks in (("2", "4"), ("1", "4"), ("1", "3")):
        monkeypatch.setenv("TRIT_NW", nw)
        monkeypatch.setenv("TRIT_KS", ks)
        assert torch.equal(f(x, q, s, N, K, b), a), f"nw={nw} ks={ks} M={M} N={N} K={K} bp={bp}"


@pytest.mark.parametrize("M", [1, 4, 8, 16, 29, 64])
@pytest.mark.parametrize("NK", [(100, 1000), (2560, 2560), (640, 4104), (48, 8200), (6160, 520)])
def test_small_m_knobs_do_not_change_results(monkeypatch, M, NK):
    N, K = NK
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    for dtype in (torch.bfloat16, torch.float16):
        x, w, p, s, b = make_case(M, N, K, dtype, True, 31 + M, DEV)
        monkeypatch.setenv("TRIT_PDL", "0")
        monkeypatch.setenv("TRIT_L2PF", "0")
        y0, a0 = torch.ops.trit.ternary_mm(x, p, s, N, K, b), torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        # 2: whole-range prefetch forced on; 3: the head of each warp's range (TRIT_L2PF_HEAD k-blocks:
        # 1, the default 8, and more than a warp owns)
        for pdl, pf, head in (("1", "0", ""), ("0", "2", ""), ("1", "2", ""), ("1", "1", ""), ("1", "3", ""),
                              ("1", "3", "1"), ("0", "3", "100000")):
            monkeypatch.setenv("TRIT_PDL", pdl)
            monkeypatch.setenv("TRIT_L2PF", pf)
            monkeypatch.setenv("TRIT_L2PF_HEAD", head)
            assert torch.equal(torch.ops.trit.ternary_mm(x, p, s, N, K, b), y0), f"fp pdl={pdl} pf={pf} head={head}"
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 pdl={pdl} pf={pf} head={head}"
        monkeypatch.delenv("TRIT_L2PF_HEAD")
        # the defaults choose per shape (wn_auto: 2 tiles per warp at N >= 6144; fuseq_auto: the
        # quantizer fused into the GEMV at M = 1 on small layers): each choice forced both ways
        for fq in ("1", "0"):  # quantizer fused into the GEMV (M <= 8, fits in 48 KB) / never
            monkeypatch.setenv("TRIT_A8_FUSEQ", fq)
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 fused quantizer={fq}"
            monkeypatch.setenv("TRIT_WN", "1")
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 wn=1 fused quantizer={fq}"
            monkeypatch.delenv("TRIT_WN")
            for nw in ("3", "8"):  # the fused quantizer with several tiles per CTA (the last CTA's warps clamp)
                monkeypatch.setenv("TRIT_NW", nw)
                assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 nw={nw} fused quantizer={fq}"
            monkeypatch.delenv("TRIT_NW")
        monkeypatch.delenv("TRIT_A8_FUSEQ")
        for gm in ("1", "0"):  # the GEMM-shaped a8 kernel (16 < M <= 256) forced on / off
            monkeypatch.setenv("TRIT_A8_GEMM", gm)
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 gemm kernel={gm}"
        monkeypatch.delenv("TRIT_A8_GEMM")
        for ks in ("1", "2", "3", "8", "64"):
            monkeypatch.setenv("TRIT_KS", ks)
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 ks={ks}"
            assert_close_rel(torch.ops.trit.ternary_mm(x, p, s, N, K, b), y0, TOL[dtype], f"fp ks={ks}")
        monkeypatch.delenv("TRIT_KS")
        for nw in ("1", "2", "3", "8"):  # 3: the last CTA has clamped duplicate tiles
            monkeypatch.setenv("TRIT_NW", nw)
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 nw={nw}"
            assert torch.equal(torch.ops.trit.ternary_mm(x, p, s, N, K, b), y0), f"fp nw={nw}"
            monkeypatch.setenv("TRIT_WN", "2")  # two weight tiles per warp (a8, M <= 32), odd tile counts too
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), a0), f"a8 wn=2 nw={nw}"
            monkeypatch.delenv("TRIT_WN")
        monkeypatch.delenv("TRIT_NW")


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("kernel", ["v4", "v4-q0", "v5", "v5-nofuseq", "v5-fuseq", "v5-wn2", "v5-gemm", "v5-gemm2",
                                    "v5-gemm-late", "v5-gemm-wg", "v5-gemm-wg2", "v5-gemm-wg-ov",
                                    "v5-gemm-wg-deep", "v5-gemm-wg2-deep", "v5-qcl", "v5-rows2"])
@pytest.mark.parametrize("M", [1, 24, 64, 128])
def test_dependent_chain(monkeypatch, graph, kernel, M):
    """Each layer reads the previous layer's output: with PDL, a kernel that read x (or wrote y)
    before its griddepcontrol.wait would see stale data here. Our kernels back to back, a torch
    kernel in between, and the a8 workspace reused from layer to layer; eager and CUDA graph.
    M = 128: the v4 route every default takes there on these layers (the quantizer and a8_kernel under PDL,
    TRIT_A8_V4Q), v4-q0 its plain launches."""
    monkeypatch.setenv("TRIT_KERNEL", kernel.split("-")[0])
    if kernel.endswith("-q0"):  # the v4 route's quantizer before TRIT_A8_V4Q: one element per load, no PDL
        monkeypatch.setenv("TRIT_A8_V4Q", "0")
    if kernel.endswith("rows2"):  # M = 128: the MT = 8 GEMV over two row tiles (TRIT_A8_MT8_ROWS2) under PDL
        monkeypatch.setenv("TRIT_A8_MT8_ROWS2", "1")
    if kernel.endswith("fuseq"):  # plain v5: the default (fuseq_auto fuses the quantizer at M = 1 on these layers)
        monkeypatch.setenv("TRIT_A8_FUSEQ", "0" if kernel.endswith("nofuseq") else "1")
    if kernel.endswith("qcl"):  # the cluster quantizer (M <= 8; one CTA per row at D = 1024), under PDL
        monkeypatch.setenv("TRIT_A8_FUSEQ", "0")
        monkeypatch.setenv("TRIT_QUANT_CLUSTER", "8")
    if kernel.endswith("wn2"):  # two weight tiles per warp (M = 24: the MT = 4 kernel)
        monkeypatch.setenv("TRIT_WN", "2")
    if "gemm" in kernel:  # the GEMM-shaped a8 kernel at M = 24 and 64 (cp.async ring, PDL wait)
        monkeypatch.setenv("TRIT_A8_GEMM", "1")
        if "gemm-wg" not in kernel:  # its mma.sync loop (on sm_90a the default route would pick wgmma)
            monkeypatch.setenv("TRIT_A8_GEMM_WG", "0")
    if kernel.endswith("gemm-late"):  # weights only after the PDL wait (TRIT_A8_GEMM_EARLY=0, not the default), split 3
        monkeypatch.setenv("TRIT_A8_GEMM_EARLY", "0")
        monkeypatch.setenv("TRIT_A8_GEMM_KS", "3")
    if "gemm-wg" in kernel:  # its wgmma main loop (TRIT_A8_GEMM_WG=1 / 2: 64 / 128 rows, sm_90a), split-K 2
        if not ops.WGMMA:
            pytest.skip("the wgmma main loop: compute capability 9.0 with an sm_90a build only")
        monkeypatch.setenv("TRIT_A8_GEMM_WG", "2" if "wg2" in kernel else "1")
        monkeypatch.setenv("TRIT_A8_GEMM_WG_OVERLAP", "1" if kernel.endswith(("-ov", "-deep")) else "0")
        monkeypatch.setenv("TRIT_A8_GEMM_WG_DEEP", "1" if kernel.endswith("-deep") else "0")
        monkeypatch.setenv("TRIT_A8_GEMM_KS", "2")
    if kernel.endswith("gemm2"):  # its 16-tile, 8-row-tile warp tile (TRIT_A8_GEMM_CFG=2, over 48 KB of shared
        monkeypatch.setenv("TRIT_A8_GEMM_CFG", "2")  # memory) with split-K (2 at D = 1024: the quantizer
        monkeypatch.setenv("TRIT_A8_GEMM_KS", "2")   # zeroes the tile counters, layer after layer)
    D, L = 1024, 6
    gen = torch.Generator().manual_seed(5)
    layers = []
    for i in range(L):
        w = torch.randint(-1, 2, (D, D), generator=gen, dtype=torch.int8)
        layers.append((ops.repack(w).to(DEV), (torch.rand(D, generator=gen) * 0.05 + 0.01).to(DEV)))

    def forward(x):
        for i, (p, s) in enumerate(layers):
            if i % 2 == 0:
                x = torch.ops.trit.ternary_mm_a8(x, p, s, D, D, None)
            else:
                x = torch.ops.trit.ternary_mm(x, p, s, D, D, None)
            x = torch.nn.functional.silu(x) if i % 3 == 2 else x
        return x

    def forward_ref(x):
        for i, (p, s) in enumerate(layers):
            f = ops.ternary_mm_a8_ref if i % 2 == 0 else ops.ternary_mm_ref
            x = f(x, p, s, D, D, None).to(torch.bfloat16)
            x = torch.nn.functional.silu(x) if i % 3 == 2 else x
        return x

    static_x = torch.randn(M, D, generator=gen).to(torch.bfloat16).to(DEV)
    if graph:
        g, static_y = capture(forward, static_x)
    for seed in (1, 2, 3):
        xin = torch.randn(M, D, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV)
        if graph:
            static_x.copy_(xin)
            poison(static_y)
            g.replay()
            y = static_y
        else:
            y = forward(xin)
        torch.cuda.synchronize()
        # per-layer ops are checked elsewhere; here a stale read shows up as a gross error
        assert_close_rel(y, forward_ref(xin), 3e-2, f"chain {kernel} graph={graph} seed={seed}")


# ------------------------------------------------------------------ the v4 route's quantizer (TRIT_A8_V4Q)
# Default 1: quant_rows_perm_kernel in natural byte order (16-byte loads where K % 8 == 0 and x is 16-byte aligned,
# scalar loads else) and a8_kernel launched under PDL; 0: quant_rows_kernel and plain launches. The same xq, xs and
# row sums, so the a8 outputs bit for bit: on the v4 route (GEMM kernel and int8 cuBLAS off) at every M, and on
# a8_dense's int8 cuBLAS route (its quantizer is the same kernel, without PDL), for every activation dtype, odd K
# (the scalar path and the zero padding to 128), zero rows (the 1e-5 floor) and an x 16-byte misaligned.
@pytest.mark.parametrize("M", [1, 9, 33, 65, 100, 128, 256, 300])
@pytest.mark.parametrize("NK", [(64, 1000), (2560, 2560), (1000, 4104), (24, 8200), (100, 300), (130, 520),
                                (48, 1001), (16, 7)])
def test_a8_v4_quantizer_matches_old(monkeypatch, M, NK):
    N, K = NK
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, w, p, s, b = make_case(M, N, K, dtype, True, 17 + M + N + K, DEV)
        x[M // 2].zero_()
        xm = torch.empty(M * K + 1, dtype=dtype, device=DEV)[1:].view(M, K)  # 2 / 4 bytes off 16-byte alignment
        xm.copy_(x)
        routes = [{"TRIT_KERNEL": "v4", "TRIT_A8_GEMM": "0", "TRIT_A8_DENSE_MIN_M": str(1 << 30)}]
        if N % 8 == 0 and M > 16:
            routes.append({"TRIT_A8_GEMM": "0", "TRIT_A8_DENSE_MIN_M": "17"})  # int8 cuBLAS where M > 64
        for route in routes:
            for k, v in route.items():
                monkeypatch.setenv(k, v)
            for xin in (x, xm):
                monkeypatch.setenv("TRIT_A8_V4Q", "0")
                y0 = torch.ops.trit.ternary_mm_a8(xin, p, s, N, K, b)
                monkeypatch.setenv("TRIT_A8_V4Q", "1")
                y1 = torch.ops.trit.ternary_mm_a8(xin, p, s, N, K, b)
                assert torch.equal(y1, y0), f"v4q 1 vs 0 M={M} N={N} K={K} {dtype} {route} aligned={xin is x}"
                monkeypatch.setenv("TRIT_PDL", "0")  # the new quantizer without PDL: same values
                assert torch.equal(torch.ops.trit.ternary_mm_a8(xin, p, s, N, K, b), y0), f"v4q pdl 0 M={M}"
                monkeypatch.delenv("TRIT_PDL")
            for k in route:
                monkeypatch.delenv(k)
        assert_close_rel(y1, ops.ternary_mm_a8_ref(x, p, s, N, K, b),
                         {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[dtype], "a8 v4q vs ref")


# ------------------------------------------------------------------ the MT = 8 GEMV over two row tiles
# At 64 < M <= 128 the MT = 8 GEMV with two CTA rows of 64 x rows over one quantizer's xq of 128 rows (interleaved, or
# plain with TRIT_A8_XI=0; the loop or the cluster quantizer): by default on layers of <= 16 Mi weights,
# TRIT_A8_MT8_ROWS2=1 on every layer the GEMV takes at M = 64, =0 never (the GEMM kernel / v4). Bit for bit the other
# routes' results (exact int32 sums) at row counts around the tile edges, every dtype, odd K, a misaligned x, zero
# rows, without PDL; the profiler sees the route the rule names.
@pytest.mark.parametrize("M", [65, 72, 100, 127, 128])
@pytest.mark.parametrize("NK", [(64, 1000), (2560, 2560), (1000, 4104), (24, 8200), (100, 300), (130, 520),
                                (48, 1001), (6912, 2560), (2560, 6912), (4096, 4096)])
def test_a8_mt8_two_row_tiles(monkeypatch, M, NK):
    N, K = NK
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, w, p, s, b = make_case(M, N, K, dtype, True, 23 + M + N + K, DEV)
        x[M - 1].zero_()
        xm = torch.empty(M * K + 1, dtype=dtype, device=DEV)[1:].view(M, K)
        xm.copy_(x)
        monkeypatch.setenv("TRIT_A8_MT8_ROWS2", "0")
        y0 = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)  # the GEMM kernel or v4
        monkeypatch.delenv("TRIT_A8_MT8_ROWS2")
        assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y0), f"rows2 default M={M} N={N} {dtype}"
        monkeypatch.setenv("TRIT_A8_MT8_ROWS2", "1")
        for env in ({}, {"TRIT_A8_XI": "0"}, {"TRIT_QUANT_CLUSTER": "8"}, {"TRIT_QUANT_CLUSTER_XI": "0"},
                    {"TRIT_PDL": "0"}, {"TRIT_L2PF": "0"}):
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            for xin in (x, xm):
                assert torch.equal(torch.ops.trit.ternary_mm_a8(xin, p, s, N, K, b), y0), \
                    f"rows2 {env} M={M} N={N} K={K} {dtype} aligned={xin is x}"
            for k in env:
                monkeypatch.delenv(k)
        monkeypatch.delenv("TRIT_A8_MT8_ROWS2")
        assert_close_rel(y0, ops.ternary_mm_a8_ref(x, p, s, N, K, b),
                         {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[dtype], "a8 rows2 vs ref")
    x = x.to(torch.bfloat16)

    def kernels():
        torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages()]
        gemv = any("a8_small_kernel" in n for n in names)
        other = any("a8_gemm_kernel" in n or re.search(r"\ba8_kernel", n) for n in names)
        assert gemv != other, names
        return gemv

    assert kernels() == (N * K <= 16 << 20), "default: the two-row-tile GEMV on layers of <= 16 Mi weights only"
    monkeypatch.setenv("TRIT_A8_MT8_ROWS2", "1")
    assert kernels()
    monkeypatch.setenv("TRIT_A8_MT8_ROWS2", "0")
    assert not kernels()


# ------------------------------------------------------------------ the cluster quantizer
# TRIT_QUANT_CLUSTER=n: at M <= 8 the row split over a cluster of CTAs (quant_rows_cluster_kernel,
# distributed shared memory for the row maximum and sum). Same values as the loop kernel: a8 outputs
# bit-identical to the default, for every cluster size (1: one CTA, registers only; 2 / 8: the size
# rule; K past one CTA's capacity forces more CTAs), K tails (K % 8 != 0: scalar loads), rows of
# zeros (the 1e-5 floor), all activation dtypes; K > 65536 falls back to the loop kernel.
@pytest.mark.parametrize("K", [8, 300, 1000, 2560, 4100, 8192, 14336, 28672, 30001, 65536, 70000])
@pytest.mark.parametrize("n", ["1", "2", "8"])
def test_quant_cluster_matches_default(monkeypatch, K, n):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    monkeypatch.setenv("TRIT_A8_FUSEQ", "0")  # the separate quantizer, at every M <= 8
    N = 96
    for M in (1, 3, 8):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            x, w, p, s, b = make_case(M, N, K, dtype, True, 7 * M + K % 97, DEV)
            if M == 3:
                x[1].zero_()  # a row of zeros: xs from the 1e-5 floor, rowsum 0
                x[2, K // 2] = 1e4  # one large outlier in the middle of the row (another CTA's part)
            monkeypatch.setenv("TRIT_QUANT_CLUSTER", "0")  # the one-CTA loop kernel
            want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
            monkeypatch.setenv("TRIT_QUANT_CLUSTER", n)
            # poison the memory the op's workspace (xq, xs, rowsum) is likely to reuse, so that a group,
            # scale or row sum the cluster kernel fails to write cannot pass on the default's values
            Kp = (K + 127) // 128 * 128
            torch.empty(64 * Kp + 64 * M, dtype=torch.int8, device=DEV).fill_(0x5A)
            got = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
            assert torch.equal(got, want), f"K={K} n={n} M={M} {dtype}: {(got != want).sum().item()} outputs differ"


def _a8_pdl_chain(M, seed, D=4608, L=4):
    """L ternary_mm_a8 layers of D x D with SiLU between (each GEMV's PDL wait on the kernel before it) and an
    M-row bf16 input, from one generator: (forward, x)."""
    gen = torch.Generator().manual_seed(seed)
    layers = [(ops.repack(torch.randint(-1, 2, (D, D), generator=gen, dtype=torch.int8)).to(DEV),
               (torch.rand(D, generator=gen) * 0.02 + 0.005).to(DEV)) for _ in range(L)]

    def forward(x):
        for p, s in layers:
            x = torch.nn.functional.silu(torch.ops.trit.ternary_mm_a8(x, p, s, D, D, None))
        return x

    return forward, torch.randn(M, D, generator=gen).to(torch.bfloat16).to(DEV)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("M,knob", [(1, "TRIT_QUANT_CLUSTER"), (24, "TRIT_QUANT_CLUSTER_XI")])
def test_quant_cluster_chain(monkeypatch, graph, M, knob):
    """Several CTAs per row (D = 4608: S = 2 at n = 8) layer after layer under PDL, eager and replayed
    from a CUDA graph: bit-identical to the loop quantizer's chain. M = 1: the row-major layout (TRIT_QUANT_CLUSTER=8
    against 0); M = 24: the interleaved xq (TRIT_QUANT_CLUSTER_XI=1 against 0, TRIT_QUANT_CLUSTER=8), whose
    zero-row clusters write while the GEMV before may still read xq."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    monkeypatch.setenv("TRIT_A8_FUSEQ", "0")
    monkeypatch.delenv("TRIT_A8_XI", raising=False)
    forward, xin = _a8_pdl_chain(M, 11)
    monkeypatch.setenv(knob, "0")
    want = forward(xin)
    monkeypatch.setenv(knob, "8" if knob == "TRIT_QUANT_CLUSTER" else "1")
    monkeypatch.setenv("TRIT_QUANT_CLUSTER", "8")
    got = eager_or_replayed(forward, xin, graph)
    torch.cuda.synchronize()
    assert torch.equal(got, want), f"M={M} graph={graph}: {(got != want).sum().item()} outputs differ"


def _quantizer_kernels(M, N, K):
    """The quantizer kernels one ternary_mm_a8 call at [M, K] x [N, K] launches (profiler names)."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, False, 3, DEV)
    torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if "quant_rows" in e.key]


@pytest.mark.parametrize("K", [1000, 14336, 28672])
def test_quant_cluster_launch(monkeypatch, K):
    """TRIT_QUANT_CLUSTER=8 at M = 1: the cluster kernel runs instead of the loop kernel (up to 65536)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    monkeypatch.setenv("TRIT_A8_FUSEQ", "0")
    monkeypatch.setenv("TRIT_QUANT_CLUSTER", "8")
    names = _quantizer_kernels(1, 64, K)
    assert any("quant_rows_cluster_kernel" in n for n in names), names
    assert not any("quant_rows_perm_kernel" in n for n in names), names


@pytest.mark.parametrize("M,N,K,kernel", [(1, 8192, 28672, "cluster"), (8, 4096, 14336, "cluster"),
                                          (4, 2560, 6912, "cluster"), (8, 4096, 4096, "perm"),
                                          (2, 28672, 4096, "perm"), (8, 2560, 2560, "perm"),
                                          (16, 4096, 14336, None)])
def test_quant_cluster_default_route(monkeypatch, M, N, K, kernel):
    """The default (TRIT_QUANT_CLUSTER unset): the separate quantizer at M <= 8 is the cluster kernel on
    rows longer than 4096 and the loop kernel up to 4096 (quant_cluster_auto); at M > 8 neither
    row-major quantizer (the k-block-major layout of the loop kernel, or the GEMM route). The interleaved xq's
    cluster route at 8 < M <= 32 (on by default) is held off here: test_quant_cluster_xi_route checks it."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    monkeypatch.setenv("TRIT_A8_FUSEQ", "0")
    monkeypatch.setenv("TRIT_QUANT_CLUSTER_XI", "0")
    monkeypatch.delenv("TRIT_QUANT_CLUSTER", raising=False)
    names = _quantizer_kernels(M, N, K)
    cluster = any("quant_rows_cluster_kernel" in n for n in names)
    assert cluster == (kernel == "cluster"), names
    if kernel == "perm":
        assert any("quant_rows_perm_kernel" in n for n in names), names


# ------------------------------------------------------------------ a8 GEMM-shaped kernel
# TRIT_A8_GEMM=1: 16 < M <= 256 through a8_gemm_kernel (128 channels x 32 / 64 rows per CTA,
# cp.async ring, split-K by stores into per-split slices added by the last CTA, the epilogue
# through shared memory). Exact integer sums and store_out's arithmetic: bit-identical to the
# default kernels, on partial CTA tiles in N (N % 128), in M (M % 64), K tails, forced split-K
# counts (the slices are never zeroed: poisoned workspaces) and every activation dtype.
@pytest.mark.parametrize("M", [17, 33, 64, 65, 100, 128, 200, 256])
@pytest.mark.parametrize("NK", [(64, 1000), (2560, 2560), (1000, 4104), (24, 8200), (100, 300), (130, 520)])
def test_a8_gemm_kernel_matches_default(monkeypatch, M, NK):
    N, K = NK
    monkeypatch.setenv("TRIT_A8_DENSE_MIN_M", str(1 << 30))  # M = 256: the fused kernels, not cuBLAS
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, w, p, s, b = make_case(M, N, K, dtype, dtype != torch.float32, 11 + M + N, DEV)
        monkeypatch.setenv("TRIT_A8_GEMM", "0")
        y0 = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        monkeypatch.setenv("TRIT_A8_GEMM", "1")
        y1 = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)  # the route's own loop (sm_90a: wgmma)
        assert torch.equal(y1, y0), f"a8 gemm vs default M={M} N={N} K={K} {dtype}"
        monkeypatch.setenv("TRIT_A8_GEMM_WG", "0")  # below: the mma.sync loop and its knobs
        assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y0), f"a8 gemm mma.sync M={M} N={N}"
        for ks in ("1", "2", "3", "7", "16"):  # split-K forced: exact integer sums in any order; the
            monkeypatch.setenv("TRIT_A8_GEMM_KS", ks)  # workspace (slices and counters) poisoned first
            junk = torch.full((1 << 20,), -7, dtype=torch.int32, device=DEV)
            del junk
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y0), f"a8 gemm ks={ks} M={M} N={N}"
            # TRIT_A8_GEMM_EARLY=0 (the default is 1): weights only after the PDL wait, slices one by one
            monkeypatch.setenv("TRIT_A8_GEMM_EARLY", "0")
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y0), f"a8 gemm late ks={ks} M={M} N={N}"
            monkeypatch.delenv("TRIT_A8_GEMM_EARLY")
        monkeypatch.delenv("TRIT_A8_GEMM_KS")
        # the other warp tiles (TRIT_A8_GEMM_CFG 1-4: 8 row tiles per warp, 16 weight tiles per CTA,
        # 4 weight tiles per warp, at 64 and 32 rows per CTA), with the default split and split-K forced
        for cfg in ("1", "2", "3", "4"):
            monkeypatch.setenv("TRIT_A8_GEMM_CFG", cfg)
            for ks in ("0", "3"):
                monkeypatch.setenv("TRIT_A8_GEMM_KS", ks)
                assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y0), \
                    f"a8 gemm cfg={cfg} ks={ks} M={M} N={N} K={K} {dtype}"
        monkeypatch.delenv("TRIT_A8_GEMM_CFG")
        # TRIT_A8_GEMM_WG=1 / 2: the wgmma main loop, 64 / 128 rows per CTA (ops.WGMMA: compute
        # capability 9.0 with an sm_90a build; elsewhere the knob is ignored)
        # TRIT_A8_GEMM_WG_OVERLAP=1: the next k-block fetched under the running wgmma
        if ops.WGMMA:
            for wg in ("1", "2"):
                monkeypatch.setenv("TRIT_A8_GEMM_WG", wg)
                for ov in ("0", "1", "deep"):  # deep: the overlapped loop's deeper ring (TRIT_A8_GEMM_WG_DEEP)
                    monkeypatch.setenv("TRIT_A8_GEMM_WG_OVERLAP", "0" if ov == "0" else "1")
                    monkeypatch.setenv("TRIT_A8_GEMM_WG_DEEP", "1" if ov == "deep" else "0")
                    for ks in ("0", "1", "3"):
                        monkeypatch.setenv("TRIT_A8_GEMM_KS", ks)
                        for early in ("0", "1") if ov == "0" else ("1",):
                            monkeypatch.setenv("TRIT_A8_GEMM_EARLY", early)
                            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y0), \
                                f"a8 gemm wgmma wg={wg} ov={ov} ks={ks} early={early} M={M} N={N} K={K} {dtype}"
            monkeypatch.delenv("TRIT_A8_GEMM_EARLY")
            monkeypatch.delenv("TRIT_A8_GEMM_WG_DEEP")
            monkeypatch.delenv("TRIT_A8_GEMM_WG_OVERLAP")
            monkeypatch.delenv("TRIT_A8_GEMM_WG")
        monkeypatch.delenv("TRIT_A8_GEMM_KS")
        monkeypatch.delenv("TRIT_A8_GEMM")
        assert_close_rel(y1, ops.ternary_mm_a8_ref(x, p, s, N, K, b),
                         {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[dtype], "a8 gemm vs ref")


@pytest.mark.parametrize("M,N,K", [(17, 6144, 8192), (40, 6144, 8192), (64, 13824, 2560), (64, 6144, 4096),
                                   (64, 4096, 4096), (128, 4096, 4096),
                                   (100, 6912, 2560), (129, 4100, 4104), (200, 2048, 8192), (256, 6144, 8192),
                                   (256, 4096, 4096), (256, 2560, 2560),
                                   # csrc/a8_route.h's edges: the deep ring up to one wave of 64-row tiles,
                                   # then the 128-row loop (the 64-row one at M = 192 - 250), any M > 256
                                   # with >= 48 CTAs (640 channels x 8 row tiles: int8 cuBLAS)
                                   (96, 14336, 4500), (128, 4096, 14336), (250, 6144, 4000), (300, 6144, 520),
                                   (1000, 640, 2560), (1000, 2560, 1000)])
def test_a8_route_defaults_match_forced_routes(monkeypatch, M, N, K):
    """The shape-chosen a8 routes (a8_gemm_on: the GEMM kernel at 32 < M <= 256 on > 64 Mi weights
    up to M = 64 (TRIT_A8_MT8_MAXW), >= 16M up to M = 128, > 4M above, ahead of int8 cuBLAS at M = 256; on sm_90a its
    wgmma loops per csrc/a8_route.h, the 128-row one also at M > 256; wn_auto at M <= 32 on
    >= 128M weights is covered by the knob test) give the same bits as every forced route on the
    layers where the default switches."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 3 + M, DEV)
    y = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    envs = [{"TRIT_A8_GEMM": "1"}, {"TRIT_A8_GEMM": "0"}, {"TRIT_A8_GEMM": "0", "TRIT_A8_DENSE_MIN_M": "17"},
            {"TRIT_A8_GEMM": "0", "TRIT_A8_DENSE_MIN_M": str(1 << 30)}, {"TRIT_A8_GEMM_WG": "0"},
            {"TRIT_A8_MT8_MAXW": "4096"}, {"TRIT_A8_MT8_MAXW": "0"},
            {"TRIT_A8_MT8_ROWS2": "1"}, {"TRIT_A8_MT8_ROWS2": "1", "TRIT_A8_XI": "0"}]
    if ops.WGMMA:
        envs += [{"TRIT_A8_GEMM": "1", "TRIT_A8_GEMM_WG": "2"}, {"TRIT_A8_GEMM_WG_OVERLAP": "0"},
                 {"TRIT_A8_GEMM_WG_DEEP": "1"}, {"TRIT_A8_GEMM_WG_DEEP": "0"}]
    for env in envs:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), y), f"{env} M={M} N={N} K={K}"
        for k in env:
            monkeypatch.delenv(k)
    assert_close_rel(y, ops.ternary_mm_a8_ref(x, p, s, N, K, b), 8e-3, "a8 default vs ref")


# the default loops' template arguments (ternary_gemm.cu GemmWG: GemmCfg<1, BM / 8, 8, 1, 2, DIST>)
_WG_LOOPS = {"wg2": (1, 16, 8, 1, 2, 2), "deep": (1, 8, 8, 1, 2, 6), "wg": (1, 8, 8, 1, 2, 2)}


@pytest.mark.skipif(not ops.WGMMA, reason="the wgmma loops need compute capability 9.0 and an sm_90a build")
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).multi_processor_count != 132,
                    reason="the expected loops below assume 132 SMs (H100 / H200 SXM)")
@pytest.mark.parametrize("M,N,K,loop", [(1000, 6144, 2560, "wg2"), (128, 28672, 4096, "wg2"), (4096, 2560, 2560, "wg2"),
                                        (128, 4096, 14336, "deep"), (64, 28672, 8192, "deep"), (256, 8192, 8192, "deep"),
                                        (192, 14336, 4096, "wg"), (1000, 640, 2560, None), (40, 2560, 2560, None)])
def test_a8_wgmma_default_route_taken(M, N, K, loop):
    """csrc/a8_route.h really routes: the default a8 call at these shapes launches the GEMM kernel's
    wgmma loop that the route names (deep ring while the 64-row tiles fit one wave of 2 CTAs per SM,
    the 128-row loop past it and at M > 256, the shallow 64-row loop at M = 192), and no wgmma loop
    where the op takes int8 cuBLAS or the GEMV kernels."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 11 + M, DEV)
    torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    def runs(args):  # demangled (GemmCfg<1, 16, 8, 1, 2, 2>) or, where the profiler gives it so, mangled
        dem = "GemmCfg<" + ", ".join(map(str, args)) + ">"
        man = "GemmCfgI" + "".join(f"Li{a}E" for a in args) + "E"
        return any("a8_gemm_kernel" in n and (dem in n or man in n) for n in names)

    got = [k for k, args in _WG_LOOPS.items() if runs(args)]
    assert got == ([loop] if loop else []), f"M={M} N={N} K={K}: kernels {names}"


# ------------------------------------------------------------------ large-M a8: int8 cuBLAS
# M >= TRIT_A8_DENSE_MIN_M (default 256), M > 16 and N % 8 == 0: quantizer + int8 W decode +
# torch._int_mm + the a8 epilogue. The sums are exact integers and the epilogue is the kernels'
# arithmetic, so the result must equal the fused kernel's bit for bit.
@pytest.mark.parametrize("M", [17, 65, 130, 1000])
@pytest.mark.parametrize("NK", [(64, 1000), (2560, 2560), (1000, 4104), (24, 8200), (100, 300)])
def test_a8_dense_path_matches_kernel(monkeypatch, M, NK):
    N, K = NK
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x, w, p, s, b = make_case(M, N, K, dtype, True, 5 + M + N, DEV)
        monkeypatch.setenv("TRIT_A8_DENSE_MIN_M", "1000000000")  # never: fused kernels
        yk = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        monkeypatch.setenv("TRIT_A8_DENSE_MIN_M", "17")  # int8 cuBLAS whenever allowed (N % 8 == 0)
        yd = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        assert torch.equal(yd, yk), f"a8 dense vs kernel M={M} N={N} K={K} {dtype}"
        if ops.WGMMA:  # the 128-row wgmma GEMM loop, forced at any M
            monkeypatch.setenv("TRIT_A8_GEMM", "1")
            monkeypatch.setenv("TRIT_A8_GEMM_WG", "2")
            monkeypatch.setenv("TRIT_A8_GEMM_WG_OVERLAP", "0")
            yw = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
            monkeypatch.setenv("TRIT_A8_GEMM_WG_OVERLAP", "1")
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), yw), f"a8 wgmma 128 overlap M={M}"
            monkeypatch.setenv("TRIT_A8_GEMM_WG_DEEP", "1")
            assert torch.equal(torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b), yw), f"a8 wgmma 128 deep M={M}"
            monkeypatch.delenv("TRIT_A8_GEMM_WG_DEEP")
            monkeypatch.delenv("TRIT_A8_GEMM_WG_OVERLAP")
            monkeypatch.delenv("TRIT_A8_GEMM_WG")
            monkeypatch.delenv("TRIT_A8_GEMM")
            assert torch.equal(yw, yk), f"a8 wgmma 128 vs kernel M={M} N={N} K={K} {dtype}"
        assert_close_rel(yd, ops.ternary_mm_a8_ref(x, p, s, N, K, b),
                         {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[dtype], "a8 dense vs ref")


# ------------------------------------------------------------------ a8 with the quantizer in front (a8q)
@SETTINGS
@given(M=st.one_of(st.integers(1, 8), st.sampled_from([9, 64, 300])), N=AWKWARD_N, K=AWKWARD_K,
       dtype=st.sampled_from(DTYPES), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_a8q_equals_a8_cuda(M, N, K, dtype, bias, seed):
    """ternary_mm_a8q on a8_quantize's output (torch ops, eager) = ternary_mm_a8 bit for bit: at M <= 8
    the GEMV reads the given quantization (the same values as the CUDA quantizer's); above it the op
    quantizes x again (those M check the fallback route, equal by construction)."""
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    xq, xs, rowsum = ops.a8_quantize(x)
    q, qs, qr = ops.a8_quantize(x.cpu())
    assert torch.equal(xq.cpu(), q) and torch.equal(xs.cpu(), qs) and torch.equal(rowsum.cpu(), qr)
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    got = torch.ops.trit.ternary_mm_a8q(x, xq, xs, rowsum, p, s, N, K, b)
    assert torch.equal(got, want), f"a8q M={M} N={N} K={K} {dtype}: {(got != want).sum().item()} outputs differ"


@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (1, 28672, 4096), (8, 6144, 4096), (3, 100, 300)])
def test_a8q_runs_the_gemv_alone(M, N, K):
    """At M <= 8 the a8q op launches the GEMV and nothing else (no quantizer): the launch it saves."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, False, 5, DEV)
    args = (*ops.a8_quantize(x), p, s, N, K, None)
    torch.ops.trit.ternary_mm_a8q(x, *args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.ops.trit.ternary_mm_a8q(x, *args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(names) == 1 and "a8_small_kernel" in names[0], names


def test_a8q_misaligned_xq_falls_back():
    M, N, K = 2, 100, 256
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 9, DEV)
    xq, xs, rs = ops.a8_quantize(x)
    buf = torch.zeros(xq.numel() + 1, dtype=torch.int8, device=DEV)
    xq_odd = buf[1:].view(M, -1)
    xq_odd.copy_(xq)
    assert torch.equal(torch.ops.trit.ternary_mm_a8q(x, xq_odd, xs, rs, p, s, N, K, b),
                       torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_a8q_cuda(dtype):
    x, w, p, s, b = make_case(5, 40, 300, dtype, True, 5, DEV)
    torch.library.opcheck(torch.ops.trit.ternary_mm_a8q, (x, *ops.a8_quantize(x), p, s, 40, 300, b))


@pytest.mark.parametrize("M", [1, 3, 8])
def test_a8_quantize_compiled_for_triton_is_exact(M):
    """a8_quantize compiled by Inductor into Triton (the code vLLM runs with TRIT_A8_PREQUANT) equals the
    eager quantizer bit for bit on a stored bf16 input: amax, the float64 reciprocal (Triton's float32
    division is approximate), round half to even, clamp, the byte order and the int32 row sums."""
    K = 2560 + 40  # a padded tail
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).mul(3).to(torch.bfloat16).to(DEV)
    torch._dynamo.reset()
    cq = torch.compile(ops.a8_quantize, backend="inductor", dynamic=True, fullgraph=True)
    for name, got, want in zip(("xq", "xs", "rowsum"), cq(x), ops.a8_quantize(x)):
        assert torch.equal(got, want), f"M={M}: compiled {name} differs in {(got != want).sum().item()} places"


@pytest.mark.parametrize("M", [1, 3, 8])
def test_a8_pre_graph_capture_and_inductor(M):
    """ternary_linear_a8_pre's pieces compiled by Inductor after an RMSNorm (the quantizer in the norm's
    Triton kernel) and captured in a CUDA graph, as vLLM runs them. Self-consistent bit for bit (row sums
    of xq, the op on the graph's own quantization); against the compiled norm alone (the default route's
    input) close: the two kernels may sum the squares in different orders (Inductor tunes each
    reduction), so h, and through it a few quantized values, may move by an ulp / a step."""
    N, K = 640, 2560
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 3, DEV)
    g = (torch.rand(K, device=DEV) + 0.5).to(torch.bfloat16)
    c_pre, c_norm = compiled_norm_and_pre(g, p, s, N, K, b)
    static_x = x.clone()
    c_pre(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (sq, sxs, srs), static_y = c_pre(static_x)
    for seed in (1, 2):
        static_x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV))
        poison(static_y)
        graph.replay()
        torch.cuda.synchronize()
        h = c_norm(static_x)
        assert torch.equal(srs, ops.a8_unpermute(sq, K).to(torch.int32).sum(-1, dtype=torch.int32)), "rowsum"
        assert torch.equal(static_y, torch.ops.trit.ternary_mm_a8q(h, sq, sxs, srs, p, s, N, K, b)), "replay"
        q, xs, _ = ops.a8_quantize(h)
        assert ((sxs - xs).abs() / xs).max().item() <= 2 ** -7, "xs beyond one bf16 ulp of amax"
        dq = (sq.int() - q.int()).abs()
        assert dq.max().item() <= 1 and dq.count_nonzero().item() <= 0.01 * dq.numel(), \
            f"M={M}: {dq.count_nonzero().item()} quantized values differ from the default route's"
        assert_close_rel(static_y, torch.ops.trit.ternary_mm_a8(h, p, s, N, K, b), 8e-3, f"a8_pre M={M}")


@pytest.mark.parametrize("knobs", [{"TRIT_KS": "2", "TRIT_NW": "2"}, {"TRIT_PDL": "0"}, {"TRIT_L2PF": "2"},
                                   {"TRIT_WN": "2"}, {"TRIT_WN": "1", "TRIT_A8_FUSEQ": "1"}, {"TRIT_KERNEL": "v4"}])
@pytest.mark.parametrize("M,N,K", [(1, 6160, 1000), (4, 257, 4099), (8, 4096, 2560)])
def test_a8q_direct_path_under_knobs(monkeypatch, knobs, M, N, K):
    """The GEMV on a given quantization (M <= 8) under every launch knob (TRIT_KERNEL=v4: the op falls
    back to quantizing x itself): the default a8 result bit for bit."""
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, M + N, DEV)
    got = torch.ops.trit.ternary_mm_a8q(x, *ops.a8_quantize(x), p, s, N, K, b)
    for k in knobs:
        monkeypatch.delenv(k)
    assert torch.equal(got, torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)), knobs


# ------------------------------------------------------------------ RMSNorm + a8 quantizer (rms_norm_a8q)
def _rnq_inputs(M, K, dtype, res, seed, misalign=()):
    """x [M, K], residual (or None), weight [K]; the tensors named in misalign ("x", "r", "w") are
    contiguous views 2 / 4 bytes off a 16-byte boundary (the kernel's scalar path)."""
    g = torch.Generator().manual_seed(seed)

    def t(name, v):
        if name not in misalign:
            return v.to(DEV)
        buf = torch.empty(v.numel() + 1, dtype=dtype, device=DEV)
        out = buf[1:].view(*v.shape)
        out.copy_(v)
        return out

    x = t("x", (torch.randn(M, K, generator=g) * 3).to(dtype))
    r = t("r", (torch.randn(M, K, generator=g) * 3).to(dtype)) if res else None
    w = t("w", (torch.rand(K, generator=g) + 0.5).to(dtype))
    return x, r, w


@pytest.mark.parametrize("K", [8, 100, 1001, 2560, 4096, 4100, 6912, 10240, 10241, 16384])
@pytest.mark.parametrize("M", [1, 5, 70])
@pytest.mark.parametrize("res", [False, True])
def test_rms_norm_a8q_cuda(K, M, res):
    """The CUDA kernel against the op's torch definition (rms_norm_a8q_ref, on the GPU): the residual
    stream bit for bit, out within one rounding step (the reduction order differs), and its xq / xs /
    rowsum exactly a8_quantize of the out it returned; 16-byte and misaligned rows, every dtype."""
    for dtype in DTYPES:
        for misalign in ((), ("x", "r"), ("w",), ("r",)):
            if "r" in misalign and not res:
                continue
            x, r, w = _rnq_inputs(M, K, dtype, res, K + M, misalign)
            # leave non-zero bytes where the op's outputs will be allocated: a padding byte or an
            # output the kernel fails to write cannot pass on a fresh allocation's zeros
            Kp = (K + 127) // 128 * 128
            torch.empty(4 * (M * Kp + 2 * M * K * x.element_size()), dtype=torch.uint8, device=DEV).fill_(0x7F)
            out, res_out, xq, xs, rowsum = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6)
            ref_out, ref_res, *_ = ops.rms_norm_a8q_ref(x, r, w, 1e-6)
            what = f"K={K} M={M} res={res} {dtype} misalign={misalign}"
            if res:
                assert torch.equal(res_out, ref_res), what
            else:
                assert res_out.numel() == 0, what
            step = {torch.float32: 4e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
            bad = (out.double() - ref_out.double()).abs() > step * ref_out.double().abs() + 1e-6
            assert not bad.any(), f"{what}: {bad.sum().item()} outputs off by more than one rounding step"
            for got, want, name in zip((xq, xs, rowsum), ops.a8_quantize(out), ("xq", "xs", "rowsum")):
                assert torch.equal(got, want), f"{what}: {name}"


def test_rms_norm_a8q_opcheck_cuda():
    x, r, w = _rnq_inputs(3, 2560, torch.bfloat16, True, 0)
    torch.library.opcheck(torch.ops.trit.rms_norm_a8q, (x, r, w, 1e-5))
    torch.library.opcheck(torch.ops.trit.rms_norm_a8q, (x, None, w, 1e-5))


@pytest.mark.parametrize("graph", [False, True])
def test_rms_norm_a8q_chain(monkeypatch, graph):
    """Norm -> layer four times at M = 1 under PDL, eager and replayed from a CUDA graph: the fused norm +
    ternary_mm_a8q gives what ternary_mm_a8 gives on the norm's output, bit for bit; and the profiler
    sees one norm kernel and the GEMV per layer, no quantizer."""
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    # no quantizer fused into the GEMV: were ternary_mm_a8q to fall back to ternary_mm_a8, a quantizer
    # kernel would run (and show below)
    monkeypatch.setenv("TRIT_A8_FUSEQ", "0")
    D, L = 2560, 4
    gen = torch.Generator().manual_seed(5)
    layers = [(ops.repack(torch.randint(-1, 2, (D, D), generator=gen, dtype=torch.int8)).to(DEV),
               (torch.rand(D, generator=gen) * 0.02 + 0.005).to(DEV),
               (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(DEV)) for _ in range(L)]

    def fused(x):
        res = x
        for p, s, w in layers:
            h, res, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, res, w, 1e-6)
            x = torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, D, D, None)
        return x + res

    def plain(x):
        res = x
        for p, s, w in layers:
            h, res, *_ = ops.rms_norm_a8q_ref(x, res, w, 1e-6)
            x = torch.ops.trit.ternary_mm_a8(h, p, s, D, D, None)
        return x + res

    xin = torch.randn(1, D, generator=gen).to(torch.bfloat16).to(DEV)
    got = eager_or_replayed(fused, xin, graph)
    torch.cuda.synchronize()
    # the reference norm may differ from the kernel's by a rounding step: compare each layer's GEMV on
    # the kernel's own norm output instead of chaining two norms
    res = xin
    x = xin
    for p, s, w in layers:
        h, res, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, res, w, 1e-6)
        x = torch.ops.trit.ternary_mm_a8(h, p, s, D, D, None)
    assert torch.equal(got, x + res), f"graph={graph}"
    assert_close_rel(got, plain(xin), 3e-2, "fused chain vs torch norm + ternary_mm_a8")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fused(xin)
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages()]
    # one norm kernel a layer: the one-CTA kernel or (TRIT_RNQ_CLUSTER unset: n = 1) the cluster kernel's one-CTA form
    assert sum(e.count for e in prof.key_averages() if "rms_norm_quant" in e.key) == L, names
    assert not any("quant_rows" in n for n in names), names
    # and the GEMV reads the given quantization: a different xs changes the output
    p, s, w = layers[0]
    h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(xin, None, w, 1e-6)
    y = torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, D, D, None)
    assert not torch.equal(torch.ops.trit.ternary_mm_a8q(h, xq, xs * 2, rs, p, s, D, D, None), y)


# ------------------------------------------------------------------ norm / activation prologue (ternary_mm_a8_prologue)
def _exact_prologue_inputs(M, K, dtype, act, res, norm, seed):
    """Inputs whose squares and every partial sum of squares are exact in fp32 (quarter steps in [-2, 2],
    or gate / up in {-1, -1/2, 0, 1/2, 1}: the sum of up to 2^14 squares stays below 2^24 units), so
    any reduction order gives the same norm and a fused kernel must match the composed ops bit for bit."""
    g = torch.Generator().manual_seed(seed)
    if act:
        x = (torch.randint(-2, 3, (M, 2 * K), generator=g).float() / 2).to(dtype)
    else:
        x = (torch.randint(-8, 9, (M, K), generator=g).float() / 4).to(dtype)
    r = (torch.randint(-8, 9, (M, K), generator=g).float() / 4).to(dtype) if res else None
    w = (torch.rand(K, generator=g) + 0.5).to(dtype) if norm else None
    to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return to(x), to(r), to(w)


def _composed_prologue(x, r, w, eps, act, p, s, N, K, b):
    """What the model runs without the prologue op: torch's activation ops, rms_norm_a8q (its quantization
    into ternary_mm_a8q), or the residual add; the reference route of trit::ternary_mm_a8_prologue."""
    a = x
    if act:
        a = ((torch.relu(x[:, :K]).square() if act == 1 else torch.nn.functional.silu(x[:, :K])) * x[:, K:]).contiguous()
    if w is not None:
        h, res, xq, xs, rs = torch.ops.trit.rms_norm_a8q(a, r, w, eps)
        return torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, N, K, b), res
    if r is not None:
        a = (a.float() + r.float()).to(a.dtype)
        return torch.ops.trit.ternary_mm_a8(a, p, s, N, K, b), a
    return torch.ops.trit.ternary_mm_a8(a, p, s, N, K, b), a.new_empty(0)


PRO_MODES = [(0, True, True), (0, False, True), (1, False, True), (2, False, True), (2, False, False),
             (1, False, False), (0, True, False)]


# (N, K): awkward N, K up to rms_norm_a8q's limit, and the CTA shapes of the one-kernel route (pro_cfg:
# 13824x2560 8 tiles x 1 split-K warp per CTA, 6912x2560 2 x 4, 2560-wide 1 x 8)
PRO_NK = [(n, k) for n in (17, 2560) for k in (8, 128, 1000, 2560, 6912, 14336, 16384)] + [
    (13824, 2560), (6912, 2560), (640, 2560), (3840, 2560)]


@pytest.mark.parametrize("NK", PRO_NK, ids=[f"{n}x{k}" for n, k in PRO_NK])
@pytest.mark.parametrize("mode", PRO_MODES)
def test_prologue_exact_cuda(NK, mode):
    """At M = 1 the one-kernel prologue GEMV equals the composed ops bit for bit on inputs whose norm is
    exact in any order (every dtype; residual_out too). fp32 SiLU: the kernel's expf and torch's may
    differ in the last bit, which no bf16 / fp16 rounding hides there: within the a8 tolerance."""
    N, K = NK
    act, res, norm = mode
    for dtype in DTYPES:
        x, r, w = _exact_prologue_inputs(1, K, dtype, act, res, norm, K + N + act)
        _, _, p, s, b = make_case(1, N, K, dtype, bias=True, seed=K, device=DEV)
        y, res_out = torch.ops.trit.ternary_mm_a8_prologue(x, r, w, 1e-6, act, p, s, N, K, b)
        want_y, want_res = _composed_prologue(x, r, w, 1e-6, act, p, s, N, K, b)
        what = f"K={K} N={N} act={act} res={res} norm={norm} {dtype}"
        assert torch.equal(res_out, want_res), what
        if act == 2 and dtype == torch.float32:
            assert_close_rel(y, want_y, 3e-2, what)
        else:
            assert torch.equal(y, want_y), what


@SETTINGS
@given(M=st.integers(1, 12), N=AWKWARD_N, K=st.sampled_from([1, 7, 8, 100, 128, 300, 1000, 2560, 4100, 17000]),
       dtype=st.sampled_from(DTYPES), mode=st.sampled_from(PRO_MODES), bias=st.booleans(), maxm=st.sampled_from([None, 0, 8]),
       seed=st.integers(0, 2**16))
def test_prologue_cuda(M, N, K, dtype, mode, bias, maxm, seed):
    """Every route of the op (the one kernel at M <= TRIT_A8_PROLOGUE_MAXM, the composed kernels above it,
    for K % 8 != 0 and past rms_norm_a8q's K) against its torch definition on random inputs: residual_out
    bit for bit, y within the a8 tolerance (a norm one rounding step off may move a quantization step)."""
    act, res, norm = mode
    old = os.environ.pop("TRIT_A8_PROLOGUE_MAXM", None)
    try:
        if maxm is not None:
            os.environ["TRIT_A8_PROLOGUE_MAXM"] = str(maxm)
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(M, 2 * K if act else K, generator=g) * 2).to(dtype).to(DEV)
        r = (torch.randn(M, K, generator=g) * 2).to(dtype).to(DEV) if res else None
        w = (torch.rand(K, generator=g) + 0.5).to(dtype).to(DEV) if norm else None
        _, _, p, s, b = make_case(M, N, K, dtype, bias=bias, seed=seed, device=DEV)
        y, res_out = torch.ops.trit.ternary_mm_a8_prologue(x, r, w, 1e-6, act, p, s, N, K, b)
        ref_y, ref_res = ops.ternary_mm_a8_prologue_ref(x, r, w, 1e-6, act, p, s, N, K, b)
        what = f"M={M} N={N} K={K} {dtype} mode={mode} maxm={maxm}"
        assert torch.equal(res_out, ref_res), what
        assert_close_rel(y, ref_y, 3e-2, what)
    finally:
        os.environ.pop("TRIT_A8_PROLOGUE_MAXM", None)
        if old is not None:
            os.environ["TRIT_A8_PROLOGUE_MAXM"] = old


def test_prologue_opcheck_cuda():
    K, N = 2560, 640
    x, r, w = _exact_prologue_inputs(1, K, torch.bfloat16, 0, True, True, 3)
    gu, _, _ = _exact_prologue_inputs(1, K, torch.bfloat16, 1, False, True, 4)
    _, _, p, s, b = make_case(1, N, K, torch.bfloat16, bias=True, device=DEV)
    op = torch.ops.trit.ternary_mm_a8_prologue
    torch.library.opcheck(op, (x, r, w, 1e-6, 0, p, s, N, K, b))
    torch.library.opcheck(op, (gu, None, w, 1e-6, 1, p, s, N, K, None))


@pytest.mark.parametrize("graph", [False, True])
def test_prologue_chain(graph):
    """A BitNet-like block at M = 1 under PDL, eager and replayed from a CUDA graph: norm -> qkv-like,
    residual + norm -> gate_up, relu^2 * up + sub-norm -> down, twice: the graph replay equals the eager
    chain bit for bit, the chain is within the a8 tolerance of the composed ops, and the profiler sees
    one kernel per layer (no norm, activation or quantizer kernel)."""
    D, I, L = 2560, 3456, 2
    gen = torch.Generator().manual_seed(7)

    def lin(n, k):
        return (ops.repack(torch.randint(-1, 2, (n, k), generator=gen, dtype=torch.int8)).to(DEV),
                (torch.rand(n, generator=gen) * 0.02 + 0.005).to(DEV))

    nw = lambda k: (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16).to(DEV)  # noqa: E731
    layers = [(lin(D, D), nw(D), lin(2 * I, D), nw(D), lin(D, I), nw(I)) for _ in range(L)]

    def chain(op):  # the block through op: the prologue op, or _composed_prologue
        def run(x):
            res = x
            for (p1, s1), w1, (p2, s2), w2, (p3, s3), w3 in layers:
                a, res = op(x, res, w1, 1e-6, 0, p1, s1, D, D, None)
                gu, res = op(a, res, w2, 1e-6, 0, p2, s2, 2 * I, D, None)
                x, _ = op(gu, None, w3, 1e-6, 1, p3, s3, D, I, None)
            return x, res
        return run

    steps = chain(torch.ops.trit.ternary_mm_a8_prologue)

    xin = torch.randn(1, D, generator=gen).to(torch.bfloat16).to(DEV)
    got = eager_or_replayed(lambda t: torch.cat(steps(t), dim=1), xin, graph)
    torch.cuda.synchronize()
    want = torch.cat(steps(xin), dim=1)
    assert torch.equal(got, want), f"graph={graph}"

    assert_close_rel(got, torch.cat(chain(_composed_prologue)(xin), dim=1), 3e-2, "prologue chain vs the composed ops")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        steps(xin)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = [e.key for e in kernels]
    assert sum(e.count for e in kernels if "a8_small_kernel" in e.key) == 3 * L, names
    assert not any("rms_norm_quant" in n or "quant_rows" in n for n in names), names


# ------------------------------------------------------------------ layer chains (ternary_chain)
try:
    from .test_ops import _chain_case  # noqa: E402
except ImportError:
    from test_ops import _chain_case  # noqa: E402

# (D, A, I, act, sub-norms): awkward sizes (N % 16, K % 128 != 0), a Llama-like tail, the 2B and 8B tails
CHAIN_TAILS = {"tiny": (264, 136, 200, 1, True), "odd": (1000, 520, 1032, 2, True), "llama": (1024, 1024, 2816, 2, False),
               "2b": (2560, 2560, 6912, 1, True), "8b": (4096, 4096, 14336, 1, True)}


def _chain_kernels(fn):
    """(chain_kernel launches, every CUDA kernel name) while fn() runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ks = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.count for e in ks if "chain_kernel" in e.key), [e.key for e in ks]


def _stage_by_stage(x, r, rs, nws, acts, P, S, Ns, Ks, eps):
    """The chain as one single-stage chain launch per stage: the same kernel code per stage."""
    h, res_out = x, x.new_empty(0)
    for s in range(len(P)):
        h, ro = torch.ops.trit.ternary_chain(h, r if s == rs else None, 0 if s == rs else -1, [nws[s]], [acts[s]],
                                             [P[s]], [S[s]], [Ns[s]], [Ks[s]], eps)
        if s == rs:
            res_out = ro
    return h, res_out


@pytest.mark.parametrize("NK", PRO_NK, ids=[f"{n}x{k}" for n, k in PRO_NK])
@pytest.mark.parametrize("mode", PRO_MODES)
def test_chain_one_stage_exact_cuda(NK, mode):
    """A one-stage chain at M = 1 (the persistent kernel) equals the composed ops bit for bit on inputs
    whose norm is exact in any order, every dtype, residual_out too (fp32 SiLU: within the a8 tolerance,
    expf vs torch's last bit as for the prologue kernel)."""
    N, K = NK
    act, res, norm = mode
    for dtype in DTYPES:
        x, r, w = _exact_prologue_inputs(1, K, dtype, act, res, norm, K + N + act)
        _, _, p, s, _ = make_case(1, N, K, dtype, seed=K, device=DEV)
        run = lambda: torch.ops.trit.ternary_chain(x, r, 0 if res else -1, [w], [act], [p], [s], [N], [K], 1e-6)  # noqa: E731
        if dtype == DTYPES[0]:
            n_chain, names = _chain_kernels(run)
            assert n_chain == 1, names
        y, res_out = run()
        want_y, want_res = _composed_prologue(x, r, w, 1e-6, act, p, s, N, K, None)
        what = f"K={K} N={N} act={act} res={res} norm={norm} {dtype}"
        assert torch.equal(res_out, want_res if res else x.new_empty(0)), what
        if act == 2 and dtype == torch.float32:
            assert_close_rel(y, want_y, 3e-2, what)
        else:
            assert torch.equal(y, want_y), what


class _env:
    """Environment variables set inside a with block (the extension reads its knobs per call)."""
    def __init__(self, **kv):
        self.kv, self.old = kv, {}

    def __enter__(self):
        for k, v in self.kv.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("tail", list(CHAIN_TAILS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qkv", [False, True])
@pytest.mark.parametrize("pair", ["0", "1"])
def test_chain_stages_cuda(tail, dtype, qkv, pair):
    """A 3-stage layer tail (4 with the next layer's input norm -> qkv) in one kernel equals the same stages
    as one single-stage launch each, bit for bit (so the grid barrier hands every stage the complete
    previous output), and is within the a8 tolerance of the torch reference. TRIT_CHAIN_PAIR=1 (gate_up's
    epilogue computes act(gate) * up where I % 16 == 0: llama, 2b, 8b) must not change a bit either."""
    D, A, I, act, sub = CHAIN_TAILS[tail]
    args = list(_chain_case(1, D, A, I, act, sub, dtype, seed=D + I + int(qkv), device=DEV))
    if qkv:  # the next layer: input_layernorm -> qkv_proj on the tail's output
        x, r, rs, nws, acts, P, S, Ns, Ks = args
        _, _, pq, sq, _ = make_case(1, A + 2 * 136, D, dtype, seed=5, device=DEV)
        args = [x, r, rs, nws + [nws[1]], acts + [0], P + [pq], S + [sq], Ns + [A + 2 * 136], Ks + [D]]
    with _env(TRIT_CHAIN_PAIR=pair):
        n_chain, names = _chain_kernels(lambda: torch.ops.trit.ternary_chain(*args, 1e-6))
        assert n_chain == 1 and not any("a8_small" in n for n in names), names
        y, res_out = torch.ops.trit.ternary_chain(*args, 1e-6)
        with _env(TRIT_CHAIN_EARLY="0"):  # each stage's norm weight and scales requested at its stage
            y_late, res_late = torch.ops.trit.ternary_chain(*args, 1e-6)
    assert torch.equal(y_late, y) and torch.equal(res_late, res_out), f"{tail} {dtype}: TRIT_CHAIN_EARLY=0 differs"
    want_y, want_res = _stage_by_stage(*args, 1e-6)
    assert torch.equal(res_out, want_res), tail
    assert torch.equal(y, want_y), f"{tail} {dtype}: max diff {(y.float() - want_y.float()).abs().max().item()}"
    ref_y, ref_res = ops.ternary_chain_ref(*[a.cpu() if torch.is_tensor(a) else
                                             [t.cpu() if torch.is_tensor(t) else t for t in a] if isinstance(a, list) else a
                                             for a in args], 1e-6)
    # the residual stream adds stage 0's output, whose norm sums in another order than the reference's
    assert_close_rel(res_out.cpu(), ref_res, 3e-2, f"{tail} {dtype} residual_out vs reference")
    assert_close_rel(y.cpu(), ref_y, 3e-2, f"{tail} {dtype} chain vs reference")


@SETTINGS
@given(M=st.integers(1, 3), D=st.sampled_from([8, 24, 136, 264, 1000, 2560]), A=st.sampled_from([8, 40, 136, 516]),
       I=st.sampled_from([8, 72, 200, 1032, 1024]), act=st.sampled_from([1, 2]), sub=st.booleans(),
       dtype=st.sampled_from(DTYPES), knob=st.sampled_from(["", "TRIT_CHAIN_KERNEL", "TRIT_CHAIN_TMA", "TRIT_CHAIN_CU",
                                                      "TRIT_CHAIN_PAIR", "TRIT_CHAIN_EARLY", "TRIT_CHAIN_PROF"]),
       seed=st.integers(0, 2**16))
def test_chain_cuda(M, D, A, I, act, sub, dtype, knob, seed):
    """Every route of trit::ternary_chain (the persistent kernel at M = 1, the composed prologue ops at
    M > 1 or with TRIT_CHAIN_KERNEL=0; the kernel's input rows by bulk copy with TRIT_CHAIN_TMA=1, its
    8-k-block register chunks with TRIT_CHAIN_CU=8, gate and up unpaired with TRIT_CHAIN_PAIR=0, each stage's
    norm weight and scales requested at its stage with TRIT_CHAIN_EARLY=0, the kernel with its phase-stamp code
    compiled in but stamping nothing with TRIT_CHAIN_PROF=0) against its torch definition on random inputs,
    within the a8 tolerance (y and residual_out: both follow stage 0's norm, whose sum order differs)."""
    args = _chain_case(M, D, A, I, act, sub, dtype, seed, device=DEV)
    value = {"TRIT_CHAIN_KERNEL": "0", "TRIT_CHAIN_TMA": "1", "TRIT_CHAIN_CU": "8", "TRIT_CHAIN_PAIR": "0",
             "TRIT_CHAIN_EARLY": "0", "TRIT_CHAIN_PROF": "0"}.get(knob)
    with _env(**({knob: value} if knob else {})):
        y, res_out = torch.ops.trit.ternary_chain(*args, 1e-6)
    cpu = [a.cpu() if torch.is_tensor(a) else [t.cpu() if torch.is_tensor(t) else t for t in a]
           if isinstance(a, list) else a for a in args]
    ref_y, ref_res = ops.ternary_chain_ref(*cpu, 1e-6)
    what = f"M={M} D={D} A={A} I={I} act={act} sub={sub} {dtype} knob={knob}"
    # residual_out = stage 0's output + residual: stage 0's norm sums in another order on the GPU
    assert_close_rel(res_out.cpu(), ref_res, 3e-2, what + " residual_out")
    assert_close_rel(y.cpu(), ref_y, 3e-2, what)


def test_chain_opcheck_cuda():
    args = _chain_case(1, 264, 136, 200, 1, True, torch.bfloat16, 3, device=DEV)
    torch.library.opcheck(torch.ops.trit.ternary_chain, args + (1e-5,))


def test_chain_graph_replays_cuda():
    """Two 2B-sized tails and a GEMV between them under PDL, captured once and replayed 30 times on fresh
    inputs: each replay equals the eager run bit for bit (the barrier counter needs no reset between
    launches), and the capture holds two chain kernels."""
    D, A, I, act, sub = CHAIN_TAILS["2b"]
    t1 = _chain_case(1, D, A, I, act, sub, torch.bfloat16, 11, device=DEV)
    t2 = _chain_case(1, D, A, I, act, sub, torch.bfloat16, 12, device=DEV)
    _, _, pm, sm, _ = make_case(1, A, D, torch.bfloat16, seed=2, device=DEV)

    def block(xr):
        x, r = xr[:, :A], xr[:, A:]
        y, res = torch.ops.trit.ternary_chain(x, r, *t1[2:], 1e-6)
        h = torch.ops.trit.ternary_mm_a8(y, pm, sm, A, D)  # an attention-like layer in between
        y2, res2 = torch.ops.trit.ternary_chain(h, res, *t2[2:], 1e-6)
        return torch.cat([y2, res2], dim=1)

    static_in = torch.cat([t1[0], t1[1]], dim=1).clone()
    g, static_out = capture(block, static_in)
    gen = torch.Generator().manual_seed(5)
    for i in range(30):
        fresh = (torch.randn(1, A + D, generator=gen) * 2).to(torch.bfloat16).to(DEV)
        static_in.copy_(fresh)
        poison(static_out)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, block(fresh)), f"replay {i}"
    n_chain, _ = _chain_kernels(g.replay)
    assert n_chain == 2


def test_chain_falls_back_cuda():
    """M = 2, K % 8 != 0 or TRIT_CHAIN_KERNEL=0: no chain kernel, the same results as the reference."""
    args = _chain_case(2, 264, 136, 200, 1, True, torch.bfloat16, 4, device=DEV)
    n, names = _chain_kernels(lambda: torch.ops.trit.ternary_chain(*args, 1e-6))
    assert n == 0, names
    odd = _chain_case(1, 264, 132, 200, 1, True, torch.bfloat16, 4, device=DEV)  # K = 132 of o_proj: not % 8
    n, names = _chain_kernels(lambda: torch.ops.trit.ternary_chain(*odd, 1e-6))
    assert n == 0, names


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [1, 2])
def test_act_mul_kernel_cuda(dtype, act):
    """TRIT_ACT_MUL=1: the composed prologue route's act(gate) * up in one kernel equals torch's three ops bit
    for bit (fp32 SiLU: expf vs torch's last bit, within the a8 tolerance), K % 8 == 0 or not, through the
    prologue op above M = 1 and through the chain op at M = 2."""
    for M, K in ((2, 2560), (5, 1000), (3, 37), (12, 6912)):
        g = torch.Generator().manual_seed(M * K + act)
        x = (torch.randn(M, 2 * K, generator=g) * 2).to(dtype).to(DEV)
        w = (torch.rand(K, generator=g) + 0.5).to(dtype).to(DEV)
        _, _, p, s, _ = make_case(M, 48, K, dtype, seed=K, device=DEV)
        outs = []
        for flag in ("1", "0"):
            with _env(TRIT_ACT_MUL=flag):
                outs.append(torch.ops.trit.ternary_mm_a8_prologue(x, None, w, 1e-6, act, p, s, 48, K, None)[0])
                outs.append(torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, act, p, s, 48, K, None)[0])
        what = f"M={M} K={K} act={act} {dtype}"
        for got, want in zip(outs[:2], outs[2:]):
            if act == 2 and dtype == torch.float32:
                assert_close_rel(got, want, 3e-2, what)
            else:
                assert torch.equal(got, want), what
    args = _chain_case(2, 264, 136, 200, act, True, dtype, 9, device=DEV)
    with _env(TRIT_ACT_MUL="1"):
        y1, r1 = torch.ops.trit.ternary_chain(*args, 1e-6)
    y0, r0 = torch.ops.trit.ternary_chain(*args, 1e-6)
    assert torch.equal(r1, r0)
    if act == 2 and dtype == torch.float32:
        assert_close_rel(y1, y0, 3e-2, "chain M = 2")
    else:
        assert torch.equal(y1, y0)


# ------------------------------------------------------------------ act(gate) * up inside the quantizer (TRIT_ACT_QUANT)
# trit::ternary_mm_a8_prologue(x = [gate | up], None, None, 0, act, ...) with TRIT_ACT_QUANT=1 runs csrc
# trit_mm_a8_act where trit_mm_a8_act_ok: the cluster quantizer computes act(gate) * up (torch's roundings) and
# quantizes it, then the GEMV ternary_mm_a8 runs at this M. It must give ternary_mm_a8 of torch's act(gate) * up.


def _act_ref_input(x, act, K):
    """act(gate) * up as torch's ops compute it in x's dtype (the model's SiLU-mul / relu^2-mul)."""
    g, u = x[:, :K], x[:, K:]
    return (torch.relu(g).square() if act == 1 else torch.nn.functional.silu(g)) * u


def _check_act_quant(M, N, K, dtype, act, bias, seed, what="", misaligned=False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, 2 * K, generator=g) * 2).to(dtype).to(DEV)
    if misaligned:  # the same values at an address 1 element past a 16-byte boundary: the quantizer's scalar path
        buf = torch.empty(M * 2 * K + 1, dtype=dtype, device=DEV)
        buf[1:].view(M, 2 * K).copy_(x)
        x = buf[1:].view(M, 2 * K)
    _, _, p, s, b = make_case(M, N, K, dtype, bias, seed, device=DEV)
    with _env(TRIT_ACT_QUANT="1"):
        got = torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, act, p, s, N, K, b)[0]
    want = torch.ops.trit.ternary_mm_a8(_act_ref_input(x, act, K), p, s, N, K, b)
    what = f"M={M} N={N} K={K} act={act} {dtype} bias={bias}{' misaligned' if misaligned else ''} {what}"
    if act == 2 and dtype == torch.float32:  # fp32 SiLU: expf vs torch's last bit (test_act_mul_kernel_cuda)
        assert_close_rel(got, want, 3e-2, what)
    else:
        assert torch.equal(got, want), f"{what}: {(got != want).sum().item()} outputs differ"
    # against the routes that compute act(gate) * up with the same device function (chain_act: the M = 1 prologue
    # kernel, act_mul_kernel past it): bit for bit in every dtype, fp32 SiLU included
    with _env(TRIT_ACT_QUANT="0", TRIT_ACT_MUL="1"):
        same = torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, act, p, s, N, K, b)[0]
    assert torch.equal(got, same), f"{what}: {(got != same).sum().item()} outputs differ from the act_mul route"


def _act_quant_kernels(M, N, K, act=2, dtype=torch.bfloat16):
    """Every CUDA kernel one TRIT_ACT_QUANT=1 prologue call at [M, 2K] x [N, K] launches (profiler names)."""
    x = torch.randn(M, 2 * K, device=DEV).to(dtype)
    _, _, p, s, _ = make_case(M, N, K, dtype, False, 5, device=DEV)
    with _env(TRIT_ACT_QUANT="1"):
        torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, act, p, s, N, K, None)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, act, p, s, N, K, None)
            torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]


def _sm90():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")


@pytest.mark.parametrize("M", [1, 2, 8, 9, 16, 17, 32, 33, 64])
@pytest.mark.parametrize("K", [37, 1000, 2560, 6912, 14336, 28672, 65536])
def test_act_quant_equals_plain_op_cuda(M, K):
    """TRIT_ACT_QUANT=1 gives ternary_mm_a8 of torch's act(gate) * up bit for bit at every M of the v5 GEMV (MT = 1
    row-major, MT = 2 / 4 / 8 interleaved xq), every dtype, both acts, K % 8 == 0 or not, with and without bias,
    clusters of 1 to 8 CTAs per row (K = 28672: Llama-70B's down_proj, 7; 65536: 8)."""
    _sm90()
    for dtype in DTYPES:
        for act in (1, 2):
            _check_act_quant(M, 200, K, dtype, act, (M + act) % 2 == 0, M * K + act)


@pytest.mark.parametrize("M,K", [(1, 6912), (9, 2560), (32, 14336), (64, 1000)])
def test_act_quant_misaligned_input_cuda(M, K):
    """[gate | up] at an address that is not 16-byte aligned (K % 8 == 0 or not): the quantizer's scalar loads,
    the plain op's result."""
    _sm90()
    for dtype in DTYPES:
        _check_act_quant(M, 640, K, dtype, 2, True, M + K, misaligned=True)


def test_act_quant_zero_rows_cuda():
    """M = 0 (an empty batch): a [0, N] result on every route of the prologue op with an activation (the composed
    route used to hand [0, 2K] to ternary_mm_a8)."""
    N, K = 640, 2560
    _, _, p, s, b = make_case(1, N, K, torch.bfloat16, True, 3, device=DEV)
    x = torch.empty(0, 2 * K, dtype=torch.bfloat16, device=DEV)
    for env in ({"TRIT_ACT_QUANT": "1"}, {"TRIT_ACT_QUANT": "0"}, {"TRIT_ACT_MUL": "1"}):
        with _env(**env):
            for act in (1, 2):
                y = torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, act, p, s, N, K, b)[0]
                assert tuple(y.shape) == (0, N) and y.dtype == torch.bfloat16, (env, act)


@SETTINGS
@given(M=st.integers(1, 72), N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES), act=st.sampled_from([1, 2]),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_act_quant_hypothesis_cuda(M, N, K, dtype, act, bias, seed):
    """Hypothesis-chosen M (past 64: the composed route), awkward N / K: the plain op on torch's act(gate) * up."""
    _sm90()
    _check_act_quant(M, N, K, dtype, act, bias, seed)


@pytest.mark.parametrize("M,N,K,fused,dtype", [
    (1, 4096, 14336, True, torch.bfloat16), (32, 4096, 14336, True, torch.bfloat16),
    (64, 4096, 14336, True, torch.bfloat16), (16, 2560, 6912, True, torch.bfloat16),
    (32, 640, 1000, True, torch.bfloat16), (72, 4096, 14336, False, torch.bfloat16),
    (8, 640, 1000, True, torch.float16), (16, 640, 4099, True, torch.float32), (1, 1000, 28672, True, torch.float16)])
def test_act_quant_runs_two_kernels(M, N, K, fused, dtype):
    """Where it runs, the op is two kernels: the cluster quantizer reading [gate | up] and the GEMV - no activation
    kernel, no other quantizer (in every dtype, K % 8 == 0 or not: an exact result elsewhere could be the
    fallback's); past M = 64 (the GEMM route) the composed kernels, the activation as one act_mul_kernel (not two
    torch ops)."""
    _sm90()
    names = _act_quant_kernels(M, N, K, dtype=dtype)
    quant = [n for n in names if "quant_rows" in n]
    if fused:
        assert len(names) == 2 and len(quant) == 1 and "quant_rows_cluster_kernel" in quant[0], names
        assert any("a8_small_kernel" in n for n in names), names
    else:
        assert len(names) > 2 and sum("act_mul_kernel" in n for n in names) == 1, names
        assert not any("silu" in n.lower() or "mulfunctor" in n.lower() for n in names), names


@pytest.mark.parametrize("knobs", [{"TRIT_QUANT_CLUSTER": "0"}, {"TRIT_QUANT_CLUSTER": "1"}, {"TRIT_A8_XI": "0"},
                                   {"TRIT_A8_GEMM": "1"}, {"TRIT_PDL": "0"}, {"TRIT_KERNEL": "v4"},
                                   {"TRIT_A8_DENSE_MIN_M": "17"}, {"TRIT_ACT_MUL": "1"}, {"TRIT_ACT_QUANT_VECS": "2"}])
def test_act_quant_under_knobs(knobs):
    """The knobs that take the fused route away (no cluster kernel, the plain xq at MT >= 2, the GEMM / v4 / int8
    cuBLAS routes) or change its launch (one CTA per row, PDL off) leave the results those of the plain op."""
    _sm90()
    with _env(**knobs):
        for M, N, K in ((1, 640, 6912), (9, 200, 2560), (24, 4096, 14336), (40, 1000, 4096)):
            for act in (1, 2):
                _check_act_quant(M, N, K, torch.bfloat16, act, True, M + K + act, str(knobs))


@pytest.mark.parametrize("vecs,M,K,S", [("", 1, 6912, 4), ("", 32, 6912, 4), ("", 1, 14336, 7), ("", 16, 2560, 2),
                                         ("", 1, 28672, 8), ("", 1, 65536, 8), ("2", 1, 6912, 2), ("2", 32, 14336, 4),
                                         ("4", 1, 14336, 2), ("9", 1, 14336, 2), ("0", 1, 6912, 4)])
def test_act_quant_cluster_size(vecs, M, K, S):
    """The act quantizer's CTAs per row (a8_act_cluster_size): aimed at one group of 8 per thread (K / 2048 CTAs,
    at most 8, at least what holds the row in registers: 65536 -> 8), TRIT_ACT_QUANT_VECS=2 / 4 the plain
    quantizer's sizing / fewer (values outside 1 - 4 clamped: 0 -> 1, 9 -> 4); rows: M, or the interleaved tile's 16 / 32 at M = 16 /
    32. Exact at each size (_check_act_quant)."""
    from bench.kernels import cupti_kernel_events

    _sm90()
    N = 640
    x = torch.randn(M, 2 * K, device=DEV).to(torch.bfloat16)
    _, _, p, s, _ = make_case(M, N, K, torch.bfloat16, False, 5, device=DEV)
    with _env(TRIT_ACT_QUANT="1", TRIT_ACT_QUANT_VECS=vecs):
        ev = [e for e in cupti_kernel_events(
            lambda i: torch.ops.trit.ternary_mm_a8_prologue(x, None, None, 0.0, 2, p, s, N, K, None), 2)
            if e.get("cat") == "kernel" and "quant_rows_cluster_kernel" in e.get("name", "")]
        assert len(ev) == 2, ev
        grid = list(ev[0].get("args", {}).get("grid", []))
        assert grid[0] == S and grid[1] >= M, grid
        _check_act_quant(M, N, K, torch.bfloat16, 2, True, M + K, f"TRIT_ACT_QUANT_VECS={vecs!r}")


@pytest.mark.parametrize("M", [1, 16, 32, 64])
def test_act_quant_in_a_cuda_graph(M):
    """Captured with TRIT_ACT_QUANT=1 and replayed onto a poisoned output: the plain op's result, every output
    written (the quantizer's workspace is the graph's own)."""
    _sm90()
    N, K = 1000, 6912
    _, _, p, s, b = make_case(M, N, K, torch.bfloat16, True, 11, device=DEV)
    x = (torch.randn(M, 2 * K, generator=torch.Generator().manual_seed(M)) * 2).to(torch.bfloat16).to(DEV)
    with _env(TRIT_ACT_QUANT="1"):
        got = eager_or_replayed(lambda t: torch.ops.trit.ternary_mm_a8_prologue(t, None, None, 0.0, 2, p, s, N, K,
                                                                               b)[0], x, True)
    torch.cuda.synchronize()
    want = torch.ops.trit.ternary_mm_a8(_act_ref_input(x, 2, K), p, s, N, K, b)
    assert torch.equal(got, want), f"M={M}: {(got != want).sum().item()} outputs differ"


@pytest.mark.parametrize("nbytes", [16, 48, 4096, (1 << 20) + 16, 3 * (1 << 22) + 208])
def test_read_probe_xors_every_word(nbytes):
    """bench.read_floor's probe (csrc/read_probe.cu) reads every 16-byte word once in each launch shape it
    times: the XOR of the buffer equals the host's, including grid-stride tails; bad arguments are refused."""
    from bench import read_floor as rf

    lib = rf.build()
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    configs = rf.configs_for(sm)
    if torch.cuda.get_device_capability(0)[0] >= 9:  # the bulk-copy reader: every ring shape, short last chunks
        configs += rf.tma_configs_for(sm) + [(1, 32, 16, 1), (3, 64, 48, 2), (sm, 128, 4096, 16)]
    rf.check(lib, nbytes, configs)
    buf = torch.zeros(8, dtype=torch.int32, device=DEV)
    out = torch.zeros(1, dtype=torch.int32, device=DEV)
    for bad in [(buf[1:5], 132, 256, 4), (buf, 0, 256, 4), (buf, 132, 48, 4), (buf, 132, 256, 3),
                (buf[1:5], 132, 128, 4096, 2), (buf, 132, 128, 24, 2), (buf, 132, 128, 65536, 4),
                (buf, 132, 128, 4096, 0), (buf, 132, 128, 4096, 17), (buf, 132, 48, 4096, 2)]:
        with pytest.raises(RuntimeError, match="returned -1"):
            rf.probe(lib, *bad[:1], out, *bad[1:])


# ------------------------------------------------------------------ a8q past M = 8 (TRIT_A8_PRE_MAXM)
# (_env above: hypothesis tests cannot take monkeypatch per example)


@SETTINGS
@given(M=st.integers(9, 32), N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a8q_row_major_past_m8_equals_a8(M, N, K, dtype, bias, seed):
    """TRIT_A8_PRE_MAXM=32: at 8 < M <= 32 the MT = 2 / 4 GEMVs read a8_quantize's row-major xq (each row tile at
    its own offset, rows past M clamped) and give ternary_mm_a8's result (quantizer + k-block-major xq) bit for
    bit, for every dtype and awkward N, K."""
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    with _env(TRIT_A8_PRE_MAXM="32"):
        got = torch.ops.trit.ternary_mm_a8q(x, *ops.a8_quantize(x), p, s, N, K, b)
    assert torch.equal(got, want), f"a8q M={M} N={N} K={K} {dtype}: {(got != want).sum().item()} outputs differ"


def _cuda_kernels(fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("M,N,K", [(16, 4096, 4096), (32, 6144, 4096), (32, 4096, 14336), (12, 100, 300)])
def test_a8q_past_m8_runs_the_gemv_alone_unless_told_not_to(monkeypatch, M, N, K):
    """Up to M = 32 the a8q op runs the GEMV alone on the given quantization (default TRIT_A8_PRE_MAXM = 32: one
    launch); with TRIT_A8_PRE_MAXM below M it quantizes x again (two launches)."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, False, 7, DEV)
    args = (x, *ops.a8_quantize(x), p, s, N, K, None)
    monkeypatch.delenv("TRIT_A8_PRE_MAXM", raising=False)
    names = _cuda_kernels(lambda: torch.ops.trit.ternary_mm_a8q(*args))
    assert len(names) == 1 and "a8_small_kernel" in names[0], names
    monkeypatch.setenv("TRIT_A8_PRE_MAXM", "8")
    names = _cuda_kernels(lambda: torch.ops.trit.ternary_mm_a8q(*args))
    assert len(names) == 2 and any("quant_rows" in n for n in names), names
    monkeypatch.setenv("TRIT_A8_PRE_MAXM", "12")
    if M > 12:  # past the limit it asks for: quantized again
        assert len(_cuda_kernels(lambda: torch.ops.trit.ternary_mm_a8q(*args))) == 2


@pytest.mark.parametrize("knobs", [{"TRIT_WN": "2"}, {"TRIT_WN": "1"}, {"TRIT_KS": "2", "TRIT_NW": "2"},
                                   {"TRIT_KS": "4", "TRIT_NW": "1"}, {"TRIT_PDL": "0"}, {"TRIT_KERNEL": "v4"}])
@pytest.mark.parametrize("M,N,K", [(9, 6160, 1000), (16, 257, 4099), (24, 4096, 2560), (32, 28672, 8192),
                                   (32, 13000, 10330)])
def test_a8q_row_major_under_knobs(monkeypatch, knobs, M, N, K):
    """The row-major GEMV under every launch knob, two tiles per warp included, and on the wide layers whose
    M = 32 launch is one wave (a8_mt4_wide_nw); TRIT_KERNEL=v4: the op falls back to quantizing x itself."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, M + N, DEV)
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    monkeypatch.setenv("TRIT_A8_PRE_MAXM", "32")
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    got = torch.ops.trit.ternary_mm_a8q(x, *ops.a8_quantize(x), p, s, N, K, b)
    assert torch.equal(got, want), knobs


def test_a8q_row_major_in_a_cuda_graph(monkeypatch):
    """Captured at M = 32 with TRIT_A8_PRE_MAXM=32 (the env is read at capture) and replayed on new inputs: the
    eager result of the same inputs."""
    monkeypatch.setenv("TRIT_A8_PRE_MAXM", "32")
    M, N, K = 32, 2560, 6912
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 11, DEV)
    static_x = x.clone()
    q = [t.clone() for t in ops.a8_quantize(static_x)]
    run = lambda: torch.ops.trit.ternary_mm_a8q(static_x, *q, p, s, N, K, b)  # noqa: E731
    g, out = capture(lambda _: run(), static_x)
    for seed in (1, 2):
        static_x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV))
        for dst, src in zip(q, ops.a8_quantize(static_x)):
            dst.copy_(src)
        poison(out)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.ops.trit.ternary_mm_a8(static_x, p, s, N, K, b)), f"replay {seed}"


# ------------------------------------------------------------------ interleaved xq (8 < M <= 64, TRIT_A8_XI)
# The default: the quantizer writes each k-block's 8-row tiles interleaved for 512-byte (MT = 8: 256-byte) warp
# loads and the MT = 2 / 4 / 8 GEMVs read them (kXI); TRIT_A8_XI=0 the plain k-block-major layout. Only where x is
# read from changes: the same exact int32 sums, so the results match bit for bit.


@SETTINGS
@given(M=st.integers(9, 64), N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       wn=st.sampled_from(["", "1", "2"]), seed=st.integers(0, 2**16))
def test_a8_interleaved_xq_equals_the_plain_layout(M, N, K, dtype, bias, wn, seed):
    """At 8 < M <= 64 (MT = 2 / 4 with one or two tiles per warp, MT = 8 with one) the default (interleaved xq) and
    TRIT_A8_XI=0 give the same result bit for bit, every dtype, awkward N and K (zero rows up to the tile, padded
    last k-block)."""
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    with _env(TRIT_WN=wn, TRIT_A8_XI="0"):
        want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    with _env(TRIT_WN=wn):
        got = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    assert torch.equal(got, want), f"M={M} N={N} K={K} {dtype} wn={wn}: {(got != want).sum().item()} outputs differ"
    assert_close_rel(got, ops.ternary_mm_a8_ref(x, p, s, N, K, b), {torch.float32: 1e-6, torch.float16: 1e-3,
                                                                    torch.bfloat16: 8e-3}[dtype], "a8 interleaved vs ref")


@pytest.mark.parametrize("knobs", [{"TRIT_WN": "2"}, {"TRIT_KS": "2", "TRIT_NW": "2"}, {"TRIT_KS": "8", "TRIT_NW": "1"},
                                   {"TRIT_KS": "1", "TRIT_NW": "8"}, {"TRIT_PDL": "0"}, {"TRIT_L2PF": "2"}])
@pytest.mark.parametrize("M,N,K", [(9, 6160, 1000), (16, 4096, 14336), (24, 2560, 6912), (32, 4096, 14336),
                                   (32, 8192, 28672), (32, 28672, 8192), (32, 13000, 10330), (33, 4096, 4096),
                                   (64, 2560, 2560), (57, 640, 2560)])
def test_a8_interleaved_xq_under_knobs(monkeypatch, knobs, M, N, K):
    """The interleaved-xq GEMV under the launch knobs (tiles per CTA, split-K warps, PDL off, L2 prefetch on) on
    model-sized layers, bias included, the wide layers' one-wave M = 32 launch and the MT = 8 GEMV (M 33 - 64):
    the plain layout's result."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, M + N, DEV)
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TRIT_A8_XI", "0")
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    monkeypatch.delenv("TRIT_A8_XI")
    got = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    assert torch.equal(got, want), knobs


@pytest.mark.parametrize("M,N,K", [(32, 4096, 14336), (16, 2560, 6912), (8, 4096, 4096), (33, 2560, 2560),
                                   (64, 4096, 4096), (64, 4096, 14336), (40, 2560, 6912), (64, 28672, 4096),
                                   (40, 8192, 8200)])
def test_a8_interleaved_xq_only_on_the_mt2_to_mt8_gemv(monkeypatch, M, N, K):
    """The interleaved layout takes other kernels (quantizer and GEMV) than TRIT_A8_XI=0 exactly where the v5 GEMV
    runs past M = 8: 8 < M <= 32, and 32 < M <= 64 on layers of <= 64 Mi weights; at M <= 8 and on the GEMM routes
    the two launch the same kernels."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, False, 5, DEV)
    run = lambda: torch.ops.trit.ternary_mm_a8(x, p, s, N, K, None)  # noqa: E731
    monkeypatch.delenv("TRIT_A8_XI", raising=False)
    monkeypatch.delenv("TRIT_A8_MT8_MAXW", raising=False)
    default = _cuda_kernels(run)
    monkeypatch.setenv("TRIT_A8_XI", "0")
    plain = _cuda_kernels(run)
    xi = 8 < M <= 32 or (32 < M <= 64 and N * K <= 64 << 20)
    assert (default != plain) == xi, (default, plain)
    if xi:
        assert len(default) == len(plain) == 2 and all(a != b for a, b in zip(default, plain)), (default, plain)
        assert any("a8_small_kernel" in n for n in default), default


@pytest.mark.parametrize("M,N,K,maxw,v5", [(64, 8192, 8192, "", True), (48, 28672, 4096, "4096", True),
                                          (64, 8192, 8192, "63", False), (64, 2560, 2560, "0", False),
                                          (64, 4096, 4096, "16", True), (64, 4096, 4100, "16", False),
                                          (64, 8192, 8200, "", False), (33, 14336, 4096, "", True),
                                          (32, 8192, 8192, "0", True)])
def test_a8_mt8_maxw_routes_and_matches(monkeypatch, M, N, K, maxw, v5):
    """TRIT_A8_MT8_MAXW (Mi weights, default 64): at 32 < M <= 64 the MT = 8 GEMV (a8_small_kernel) on layers up to
    that size, the GEMM kernel above; M <= 32 is the GEMV whatever it says. Both routes give the same bits."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 7 + M, DEV)
    run = lambda: torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)  # noqa: E731
    monkeypatch.delenv("TRIT_A8_GEMM", raising=False)
    monkeypatch.delenv("TRIT_A8_MT8_MAXW", raising=False)
    if maxw:
        monkeypatch.setenv("TRIT_A8_MT8_MAXW", maxw)
    names = _cuda_kernels(run)
    assert any("a8_small_kernel" in n for n in names) == v5, names
    assert any("a8_gemm_kernel" in n for n in names) == (not v5), names
    got = run()
    monkeypatch.setenv("TRIT_A8_MT8_MAXW", "4096" if not v5 else "0")
    assert torch.equal(got, run()), f"M={M} N={N} K={K} maxw={maxw}"


@pytest.mark.parametrize("M,N,K", [(32, 4096, 14336), (64, 4096, 4096)])
def test_a8_interleaved_xq_in_a_cuda_graph(monkeypatch, M, N, K):
    """Captured at M = 32 / 64 with the default layout and replayed on new inputs: TRIT_A8_XI=0's eager result."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 13, DEV)
    static_x = x.clone()
    monkeypatch.delenv("TRIT_A8_XI", raising=False)
    g, out = capture(lambda sx: torch.ops.trit.ternary_mm_a8(sx, p, s, N, K, b), static_x)
    monkeypatch.setenv("TRIT_A8_XI", "0")
    for seed in (1, 2):
        static_x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV))
        poison(out)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.ops.trit.ternary_mm_a8(static_x, p, s, N, K, b)), f"replay {seed}"


# ------------------------------------------------------------------ the cluster quantizer on the interleaved xq
# TRIT_QUANT_CLUSTER_XI=1 (the default since H200 run 45; 0: the loop kernel): at 8 < M <= 32 the interleaved xq's quantizer is
# quant_rows_cluster_kernel kXI (grid (S, Mp), one cluster per row, the clusters of rows M .. Mp - 1 write zeros)
# where TRIT_QUANT_CLUSTER's size rule gives S > 0: the loop kernel's bytes, so the op's output bit for bit.


@pytest.mark.parametrize("K", [300, 2560, 4100, 8192, 14336, 30001, 65536])
@pytest.mark.parametrize("n", ["1", "2", "8"])
def test_quant_cluster_xi_matches_the_loop_kernel(monkeypatch, K, n):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    monkeypatch.delenv("TRIT_A8_XI", raising=False)
    N = 96
    for M in (9, 13, 16, 17, 32, 33, 64):
        for dtype in DTYPES:
            x, w, p, s, b = make_case(M, N, K, dtype, True, 5 * M + K % 89, DEV)
            x[1].zero_()  # a row of zeros: xs from the 1e-5 floor, rowsum 0
            x[M - 1, K // 2] = 1e4  # an outlier in another CTA's part of the row
            monkeypatch.setenv("TRIT_QUANT_CLUSTER_XI", "0")
            want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
            monkeypatch.setenv("TRIT_QUANT_CLUSTER_XI", "1")
            monkeypatch.setenv("TRIT_QUANT_CLUSTER", n)
            Kp = (K + 127) // 128 * 128  # poison what the workspace (xq of Mp rows, xs, rowsum) may reuse
            torch.empty(64 * Kp + 64 * M, dtype=torch.int8, device=DEV).fill_(0x5A)
            got = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
            monkeypatch.delenv("TRIT_QUANT_CLUSTER")
            assert torch.equal(got, want), f"K={K} n={n} M={M} {dtype}: {(got != want).sum().item()} outputs differ"


@pytest.mark.parametrize("M,K,knobs,kernel", [
    (32, 14336, {"TRIT_QUANT_CLUSTER_XI": "1"}, "cluster"), (16, 8192, {"TRIT_QUANT_CLUSTER_XI": "1"}, "cluster"),
    (32, 4096, {"TRIT_QUANT_CLUSTER_XI": "1"}, "perm"),
    (32, 4096, {"TRIT_QUANT_CLUSTER_XI": "1", "TRIT_QUANT_CLUSTER": "8"}, "cluster"),
    (32, 14336, {}, "cluster"), (32, 4096, {}, "perm"), (32, 14336, {"TRIT_QUANT_CLUSTER_XI": "0"}, "perm"),
    (24, 14336, {"TRIT_QUANT_CLUSTER_XI": "1", "TRIT_A8_XI": "0"}, "perm"),
    (40, 14336, {"TRIT_QUANT_CLUSTER_XI": "1"}, "cluster"), (64, 4096, {}, "perm"),
    (40, 16400, {"TRIT_QUANT_CLUSTER_XI": "1", "TRIT_A8_GEMM_QCL": "0"}, None),
    (40, 16400, {"TRIT_QUANT_CLUSTER_XI": "1"}, "gemm")])
def test_quant_cluster_xi_route(monkeypatch, M, K, knobs, kernel):
    """Which quantizer the a8 op launches at 8 < M <= 32: the cluster kernel on rows longer than 4096 (by default
    and with TRIT_QUANT_CLUSTER_XI=1; every row with TRIT_QUANT_CLUSTER=8), the loop kernel on shorter rows, with
    TRIT_QUANT_CLUSTER_XI=0 and on the plain layout (TRIT_A8_XI=0); the same at 32 < M <= 64 where the MT = 8 GEMV
    runs (4096 x K <= 64 Mi weights); neither on the GEMM routes (4096 x 16400), where a cluster kernel runs only as
    the GEMM kernel's own quantizer (kKbm, TRIT_A8_GEMM_QCL: by default past K = 8192; the case expected it absent
    until H100 run 86 found it there)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_KERNEL", "v5")
    for k in ("TRIT_QUANT_CLUSTER", "TRIT_QUANT_CLUSTER_XI", "TRIT_A8_XI", "TRIT_A8_GEMM_QCL"):
        monkeypatch.delenv(k, raising=False)
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    names = _quantizer_kernels(M, 4096, K)
    # the cluster kernel's template arguments <T, kXI, kAct, kKbm>: kKbm > 0 is the GEMM kernel's layout
    kbm = [int(m.group(1)) for n in names for m in [re.search(r"quant_rows_cluster_kernel<[^<>]*, (\d+)>", n)] if m]
    assert len(kbm) == sum("quant_rows_cluster_kernel" in n for n in names), names  # every name parsed
    assert any(k == 0 for k in kbm) == (kernel == "cluster"), names
    assert any(k > 0 for k in kbm) == (kernel == "gemm"), names
    if kernel == "perm":
        assert any("quant_rows_perm_kernel" in n for n in names), names


# ------------------------------------------------------------------ the cluster quantizer in front of the GEMM kernel
# TRIT_A8_GEMM_QCL=n > 0 (default: n = 1 past K = 8192, gemm_qcl_auto; 0 the one-CTA loop kernel): a8_gemm_kernel's
# quantizer is quant_rows_cluster_kernel kKbm (grid (S, Mp), the row in registers, one pass) writing the loop
# kernel's k-block-major xq (plain, or the wgmma byte order) and zeroing the split-K tile counters: the op's output bit
# for bit, on every main loop and split.


def _unaligned(x):
    """x's values in a tensor 2 bytes off 16-byte alignment (fp16 / bf16): the quantizers' scalar loads (vec false)."""
    return torch.zeros(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape).copy_(x)


@pytest.mark.parametrize("M,N,K", [(17, 1000, 4104), (40, 24, 8200), (65, 2560, 2560), (100, 130, 520),
                                   (128, 6912, 2560), (128, 640, 14336), (200, 300, 30001), (256, 2048, 8192),
                                   (300, 4096, 4096)])
@pytest.mark.parametrize("n", ["1", "8"])
def test_a8_gemm_cluster_quantizer_matches_the_loop_kernel(monkeypatch, M, N, K, n):
    """Eagerly, and from a CUDA graph replayed twice: first on other values of x (its workspace then holds their
    xq / xs / rowsum, and the split-K counters the count the last CTA of each tile left), then on x with the output
    poisoned - a group, scale or row sum the cluster kernel failed to write, or counters it failed to zero (no tile
    would then be stored), cannot pass on earlier values."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    monkeypatch.setenv("TRIT_A8_GEMM", "1")
    monkeypatch.setenv("TRIT_A8_DENSE_MIN_M", str(1 << 30))
    loops = [("0", "0")] + ([("1", "0"), ("1", "1"), ("2", "1")] if ops.WGMMA else [])
    if M > 256:  # past 256 only the 128-row wgmma loop runs the GEMM kernel
        loops = [("2", "1")] if ops.WGMMA else []
    if not loops:
        pytest.skip("M > 256: the GEMM kernel needs the wgmma loop (sm_90a build)")
    for dtype in DTYPES:
        x, w, p, s, b = make_case(M, N, K, dtype, dtype != torch.float32, 7 * M + K % 97, DEV)
        x[min(1, M - 1)].zero_()  # a row of zeros: xs from the 1e-5 floor, rowsum 0
        x[M - 1, K // 2] = 1e4  # an outlier in another CTA's part of the row
        other = torch.randn(M, K, generator=torch.Generator().manual_seed(M + K)).mul_(3).to(dtype).to(DEV)
        if dtype == torch.float16:  # x 2 bytes off 16-byte alignment: the quantizers' scalar loads (vec false)
            x = _unaligned(x)
        op = lambda t: torch.ops.trit.ternary_mm_a8(t, p, s, N, K, b)  # noqa: E731
        for wg, ov in loops:
            monkeypatch.setenv("TRIT_A8_GEMM_WG", wg)
            monkeypatch.setenv("TRIT_A8_GEMM_WG_OVERLAP", ov)
            for ks in ("0", "1", "3"):
                monkeypatch.setenv("TRIT_A8_GEMM_KS", ks)
                monkeypatch.setenv("TRIT_A8_GEMM_QCL", "0")
                want = op(x)
                monkeypatch.setenv("TRIT_A8_GEMM_QCL", n)
                got = op(x)
                assert torch.equal(got, want), \
                    f"M={M} N={N} K={K} n={n} wg={wg} ks={ks} {dtype}: {(got != want).sum().item()} outputs differ"
                static_x = x.clone() if dtype != torch.float16 else _unaligned(x)
                g, static_y = capture(op, static_x)
                static_x.copy_(other)
                g.replay()
                static_x.copy_(x)
                poison(static_y)
                g.replay()
                assert torch.equal(static_y, want), \
                    f"replayed M={M} N={N} K={K} n={n} wg={wg} ks={ks} {dtype}: " \
                    f"{(static_y != want).sum().item()} outputs differ"
        assert_close_rel(got, ops.ternary_mm_a8_ref(x, p, s, N, K, b),
                         {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-5}[dtype], "a8 gemm qcl vs ref")


@pytest.mark.parametrize("M,N,K,env,kernel", [
    (128, 6912, 2560, {}, "perm"), (128, 6912, 2560, {"TRIT_A8_GEMM_QCL": "8"}, "cluster"),
    (128, 4096, 14336, {}, "cluster"), (128, 4096, 14336, {"TRIT_A8_GEMM_QCL": "0"}, "perm"),
    (128, 4096, 8192, {}, "perm"), (128, 4096, 14336, {"TRIT_A8_GEMM_QCL": "1"}, "cluster"),
    (256, 2560, 6912, {"TRIT_A8_GEMM_QCL": "0"}, "perm"),
    # not the GEMM route there (a8_gemm_on): the knob changes nothing, each route's own loop quantizer runs
    # (quant_rows_perm_kernel: the two-row-tile GEMV's interleaved xq by default, the v4 route's natural order)
    (128, 2560, 2560, {"TRIT_A8_GEMM_QCL": "8"}, "perm"),
    (128, 2560, 2560, {"TRIT_A8_GEMM_QCL": "8", "TRIT_A8_MT8_ROWS2": "0"}, "perm")])
def test_a8_gemm_quantizer_route(monkeypatch, M, N, K, env, kernel):
    """Which quantizer runs in front of the GEMM kernel: by default the loop kernel on rows up to 8192 and the cluster
    kernel past them (gemm_qcl_auto, H100 run 73), the loop kernel with TRIT_A8_GEMM_QCL=0, the cluster kernel with
    n > 0 (n = 1 on a 14336 row: 2 CTAs, the fewest that hold it in registers); off the GEMM route the knob does
    nothing."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: compute capability 9.0+")
    for k in ("TRIT_A8_GEMM", "TRIT_A8_GEMM_QCL", "TRIT_A8_DENSE_MIN_M", "TRIT_A8_MT8_ROWS2"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    names = _quantizer_kernels(M, N, K)
    assert any("quant_rows_cluster_kernel" in n for n in names) == (kernel == "cluster"), names
    assert any("quant_rows_perm_kernel" in n for n in names) == (kernel == "perm"), names


# ------------------------------------------------------------------ the tiled xq on the fused-norm route (layout 1)
# rms_norm_a8q(..., layout=1) writes trit.ops.a8_tile's layout: at 8 < M <= 32 the interleaved row tiles that the
# MT = 2 / 4 GEMV reads with kXI (ternary_mm_a8q(..., layout=1)); TRIT_FUSED_NORM_LAYOUT=1 in vLLM.


@pytest.mark.parametrize("K", [100, 2560, 4100, 14336])
@pytest.mark.parametrize("M", [1, 5, 9, 16, 17, 24, 32, 33, 70])
def test_rms_norm_a8q_tiled_cuda(K, M):
    """The kernel's tiled xq is a8_tile of the row-major one, every byte (zero rows and tail included: the output is
    allocated over non-zero bytes), the other outputs as with layout 0, every dtype and misaligned rows."""
    for dtype in DTYPES:
        for misalign in ((), ("x", "r")):
            x, r, w = _rnq_inputs(M, K, dtype, True, K + M, misalign)
            Kp = (K + 127) // 128 * 128
            torch.empty(4 * (ops.a8_tile_rows(M) * Kp + 2 * M * K * x.element_size()), dtype=torch.uint8,
                        device=DEV).fill_(0x7F)
            row = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6)
            tiled = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6, 1)
            what = f"K={K} M={M} {dtype} misalign={misalign}"
            for i in (0, 1, 3, 4):
                assert torch.equal(tiled[i], row[i]), f"{what}: output {i}"
            assert tiled[2].shape == (ops.a8_tile_rows(M), Kp), what
            assert torch.equal(tiled[2], ops.a8_tile(row[2], M)), what


@SETTINGS
@given(M=st.integers(1, 40), N=AWKWARD_N, K=AWKWARD_K, dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       wn=st.sampled_from(["", "1", "2"]), seed=st.integers(0, 2**16))
def test_a8q_tiled_equals_a8_cuda(M, N, K, dtype, bias, wn, seed):
    """ternary_mm_a8q on the tiled xq (layout 1; the interleaved GEMV at 8 < M <= 32, one or two tiles per warp) gives
    ternary_mm_a8's result bit for bit, every dtype, awkward N and K; past M = 32 the op quantizes again."""
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    xq, xs, rs = ops.a8_quantize(x)
    with _env(TRIT_WN=wn):
        want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
        got = torch.ops.trit.ternary_mm_a8q(x, ops.a8_tile(xq, M), xs, rs, p, s, N, K, b, 1)
    assert torch.equal(got, want), f"M={M} N={N} K={K} {dtype} wn={wn}: {(got != want).sum().item()} outputs differ"


@pytest.mark.parametrize("M,N,K", [(24, 4096, 4096), (32, 28672, 4096), (12, 6144, 4096), (5, 2560, 2560)])
def test_a8q_tiled_runs_the_gemv_alone_unless_xi_is_off(monkeypatch, M, N, K):
    """On the tiled xq the a8q op is one launch, the interleaved GEMV at 8 < M <= 32 (the kernel ternary_mm_a8 runs
    behind its quantizer); with TRIT_A8_XI=0 it quantizes x again (two launches), with the same result."""
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 3, DEV)
    xq, xs, rs = ops.a8_quantize(x)
    args = (x, ops.a8_tile(xq, M), xs, rs, p, s, N, K, b, 1)
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    monkeypatch.delenv("TRIT_A8_XI", raising=False)
    names = _cuda_kernels(lambda: torch.ops.trit.ternary_mm_a8q(*args))
    assert len(names) == 1 and "a8_small_kernel" in names[0], names
    if 8 < M <= 32:
        own = _cuda_kernels(lambda: torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b))
        assert names[0] == own[-1], (names, own)
    assert torch.equal(torch.ops.trit.ternary_mm_a8q(*args), want)
    monkeypatch.setenv("TRIT_A8_XI", "0")
    if 8 < M <= 32:
        assert len(_cuda_kernels(lambda: torch.ops.trit.ternary_mm_a8q(*args))) == 2
    assert torch.equal(torch.ops.trit.ternary_mm_a8q(*args), want)


@pytest.mark.parametrize("M", [16, 32])
def test_rms_norm_a8q_tiled_chain_in_a_cuda_graph(M):
    """Norm (layout 1) -> GEMV (layout 1) captured and replayed on new inputs: the eager row-major route's output,
    bit for bit (the same quantization, read from the other layout)."""
    N, K = 6144, 4096
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 21, DEV)
    r = torch.randn(M, K, generator=torch.Generator().manual_seed(22)).to(torch.bfloat16).to(DEV)
    wn = (torch.rand(K, generator=torch.Generator().manual_seed(23)) + 0.5).to(torch.bfloat16).to(DEV)

    def route(sx, layout):
        h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(sx, r, wn, 1e-6, layout)
        return torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, N, K, b, layout)

    static_x = x.clone()
    g, out = capture(lambda sx: route(sx, 1), static_x)
    for seed in (1, 2):
        static_x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV))
        poison(out)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, route(static_x, 0)), f"replay {seed}"


def test_opcheck_tiled_layout_cuda():
    x, r, w = _rnq_inputs(24, 2560, torch.bfloat16, True, 0)
    torch.library.opcheck(torch.ops.trit.rms_norm_a8q, (x, r, w, 1e-6, 1))
    _, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, None, w, 1e-6, 1)
    _, _, p, s, b = make_case(24, 640, 2560, torch.bfloat16, True, 4, DEV)
    torch.library.opcheck(torch.ops.trit.ternary_mm_a8q, (x, xq, xs, rs, p, s, 640, 2560, b, 1))


# ------------------------------------------------------------------ rms_norm_a8q over a thread-block cluster
# TRIT_RNQ_CLUSTER=n (csrc rms_norm_quant_cluster_kernel, rnq_cluster_size): the row split over up to n CTAs, the norm
# weight loaded before the PDL wait; n = 1 one CTA with the one-CTA kernel's sums (bit for bit), n > 1 the sum of
# squares added in another order (out within one rounding step); 0 / unset the one-CTA kernel.
RNQ_CLUSTERS = ["1", "2", "4", "8"]


@pytest.mark.parametrize("n", RNQ_CLUSTERS)
@pytest.mark.parametrize("K", [8, 1000, 2560, 4096, 4104, 6912, 8192, 10240, 16384])
@pytest.mark.parametrize("M", [1, 5, 16, 32, 33, 70])
@pytest.mark.parametrize("res", [False, True])
def test_rms_norm_a8q_cluster_cuda(n, K, M, res):
    """Against the one-CTA kernel and the op's torch definition: the residual stream bit for bit, out bit for bit at
    n = 1 (else within one rounding step of the torch definition), xq / xs / rowsum exactly a8_quantize of the out it
    returned, in both xq layouts, every dtype; misaligned rows fall back to the one-CTA kernel (same results)."""
    for dtype in DTYPES:
        for misalign in ((), ("w",)):
            x, r, w = _rnq_inputs(M, K, dtype, res, K + M + 7, misalign)
            for layout in (0, 1):
                Kp = (K + 127) // 128 * 128
                torch.empty(4 * (ops.a8_tile_rows(M) * Kp + 2 * M * K * x.element_size()), dtype=torch.uint8,
                            device=DEV).fill_(0x7F)
                with _env(TRIT_RNQ_CLUSTER="0"):
                    one = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6, layout)
                with _env(TRIT_RNQ_CLUSTER=n):
                    out, res_out, xq, xs, rowsum = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6, layout)
                ref_out, ref_res, *_ = ops.rms_norm_a8q_ref(x, r, w, 1e-6)
                what = f"n={n} K={K} M={M} res={res} {dtype} misalign={misalign} layout={layout}"
                if res:
                    assert torch.equal(res_out, ref_res), what
                if (n == "1" and K <= 8192) or misalign:  # one CTA (K > 8192 takes two at n = 1) or the fallback
                    assert torch.equal(out, one[0]), f"{what}: out differs from the one-CTA kernel's"
                    for got, want, name in zip((xq, xs, rowsum), one[2:], ("xq", "xs", "rowsum")):
                        assert torch.equal(got, want), f"{what}: {name} differs from the one-CTA kernel's"
                step = {torch.float32: 4e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
                bad = (out.double() - ref_out.double()).abs() > step * ref_out.double().abs() + 1e-6
                assert not bad.any(), f"{what}: {bad.sum().item()} outputs off by more than one rounding step"
                want = ops.a8_quantize(out)
                if layout == 1:
                    want = (ops.a8_tile(want[0], M), want[1], want[2])
                for got, wv, name in zip((xq, xs, rowsum), want, ("xq", "xs", "rowsum")):
                    assert got.shape == wv.shape and torch.equal(got, wv), f"{what}: {name}"


@pytest.mark.parametrize("n,K,S", [("1", 4096, 1), ("2", 4096, 2), ("8", 4096, 2), ("8", 8192, 4),
                                   ("2", 16384, 2), ("1", 16384, 2), ("8", 14336, 7), ("0", 4096, None),
                                   ("", 4096, 1), ("", 8192, 1), ("", 16384, 2)])
def test_rms_norm_a8q_cluster_launch(n, K, S):
    """The kernel and CTAs per row each TRIT_RNQ_CLUSTER value gives (rnq_cluster_size): n = 0 the one-CTA kernel;
    else at most n, at most one CTA per 256 groups of 8, at least what holds the row in registers (K = 16384 at
    n = 1: two); unset ('': rnq_cluster_auto) as n = 1, the fastest in H100 run 66."""
    from bench.kernels import cupti_kernel_events

    M = 4
    x, r, w = _rnq_inputs(M, K, torch.bfloat16, True, 3)
    with _env(TRIT_RNQ_CLUSTER=n):
        ev = [e for e in cupti_kernel_events(lambda i: torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6), 2)
              if e.get("cat") == "kernel"]
    assert len(ev) == 2, [e.get("name") for e in ev]
    name, grid = ev[0]["name"], list(ev[0].get("args", {}).get("grid", []))
    if S is None:
        assert "rms_norm_quant_kernel" in name and grid[:2] == [M, 1], (name, grid)
    else:
        assert "rms_norm_quant_cluster_kernel" in name and grid[:2] == [S, M], (name, grid)


@pytest.mark.parametrize("n", ["1", "2", "8"])
@pytest.mark.parametrize("M", [1, 16, 32, 48])
def test_rms_norm_a8q_cluster_chain_in_a_cuda_graph(n, M):
    """Norm (cluster kernel, PDL on) -> GEMV captured and replayed on new inputs: what the same chain gives eagerly,
    bit for bit, and at n = 1 what the one-CTA kernel's chain gives."""
    N, K = 6144, 4096
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 31, DEV)
    r = torch.randn(M, K, generator=torch.Generator().manual_seed(32)).to(torch.bfloat16).to(DEV)
    wn = (torch.rand(K, generator=torch.Generator().manual_seed(33)) + 0.5).to(torch.bfloat16).to(DEV)
    layout = 1 if 8 < M <= 32 else 0

    def route(sx):
        h, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(sx, r, wn, 1e-6, layout)
        return torch.ops.trit.ternary_mm_a8q(h, xq, xs, rs, p, s, N, K, b, layout)

    with _env(TRIT_RNQ_CLUSTER=n):
        static_x = x.clone()
        g, out = capture(route, static_x)
        for seed in (1, 2):
            static_x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV))
            poison(out)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, route(static_x)), f"replay {seed}"
    if n == "1":
        with _env(TRIT_RNQ_CLUSTER="0"):
            assert torch.equal(out, route(static_x)), "n = 1 differs from the one-CTA kernel's chain"


@pytest.mark.parametrize("sizes", [(128, 64, 64), (200, 200), (344,), (40, 24, 24)],
                         ids=["qkv-16x", "gate_up-odd", "one", "qkv-small"])
@pytest.mark.parametrize("M", [1, 5, 16, 33, 64, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_module_rows_of_one_packed_tensor(sizes, M, dtype):
    """The vLLM plugin's per-module route (input RMSNorms, use_rms_norm): each module of a fused layer repacked on
    its own and concatenated, module i's GEMV / GEMM reading the contiguous row slice packed[p0:p1] (a view at a
    tile-row offset). Every route of the a8 and bf16 ops on that view equals the op on the module's own tensor, bit
    for bit, and is within the float64 reference's tolerance."""
    from trit.vllm.kernels import get_backend

    be, K = get_backend("trit"), 640
    g = torch.Generator(device=DEV).manual_seed(M * 7 + len(sizes))
    ws = [torch.randint(-1, 2, (n, K), generator=g, device=DEV, dtype=torch.int8) for n in sizes]
    parts = [be.repack(w) for w in ws]
    packed = torch.cat(parts)
    x = torch.randn(M, K, generator=g, device=DEV).to(dtype)
    p0 = 0
    for w, part in zip(ws, parts):
        n, p1 = w.shape[0], p0 + part.shape[0]
        view = packed[p0:p1]
        assert view.is_contiguous() and view.data_ptr() % 16 == 0
        s = torch.rand(n, generator=g, device=DEV) + 0.5
        for name, fn in (("a8", be.linear_a8), ("w1.58a16", be.linear)):
            got, want = fn(x, view, s, n, K, None), fn(x, part, s, n, K, None)
            assert torch.equal(got, want), f"{name} M={M} n={n}: the row view differs from the module's own tensor"
        ref = (x.double() @ w.double().t()) * s.double()
        assert_close_rel(be.linear(x, view, s, n, K, None).double(), ref, TOL[dtype], f"w1.58a16 M={M} n={n}")
        p0 = p1
