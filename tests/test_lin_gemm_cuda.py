"""GPU tests of lin_gemm_kernel: the fp op (trit::ternary_mm) through the x-stationary GEMM kernel
(TRIT_LIN_GEMM=1; csrc/ternary_gemm.cu): x k-blocks staged per CTA in a cp.async ring, split-K over a
thread-block cluster reduced through distributed shared memory. Against the float64 reference on awkward
shapes, under every launch knob, eager and replayed from a CUDA graph, and behind programmatic dependent
launch; deterministic; x it cannot take (fp32, unaligned rows, K % 8 != 0) takes the other kernels."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: lin_gemm_kernel needs a GPU", allow_module_level=True)
if torch.cuda.get_device_capability(0)[0] < 9:
    pytest.skip("lin_gemm_kernel runs on compute capability 9.0+ (thread-block clusters)", allow_module_level=True)

from trit import ops  # noqa: E402

try:
    from .test_ops import TOL, assert_close_rel, make_case  # noqa: E402
except ImportError:
    from test_ops import TOL, assert_close_rel, make_case  # noqa: E402

DEV = "cuda"
HALF = [torch.bfloat16, torch.float16]
EXAMPLES = int(os.environ.get("TRIT_HYPOTHESIS_EXAMPLES", "60"))


def _set(monkeypatch, env):
    for k in ("TRIT_LIN_GEMM", "TRIT_LG_KS", "TRIT_LG_NW", "TRIT_LG_WN", "TRIT_LG_STAGES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def _lg_kernels_ran(fn):
    """Names of the CUDA kernels fn() launched (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(M=st.one_of(st.integers(1, 140), st.sampled_from([255, 256, 257, 300, 1000])),
       N=st.sampled_from([1, 3, 15, 16, 17, 31, 33, 100, 127, 129, 255, 640, 1000]),
       K=st.sampled_from([8, 16, 120, 128, 136, 256, 520, 1000, 2560, 4104]),
       dtype=st.sampled_from(HALF), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_lin_gemm_matches_reference(monkeypatch, M, N, K, dtype, bias, seed):
    _set(monkeypatch, {"TRIT_LIN_GEMM": "1"})
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed, DEV)
    assert_close_rel(torch.ops.trit.ternary_mm(x, p, s, N, K, b), ops.ternary_mm_ref(x, p, s, N, K, b), TOL[dtype],
                     f"lin_gemm M={M} N={N} K={K} {dtype}")


KNOBS = [{}, {"TRIT_LG_KS": "1"}, {"TRIT_LG_KS": "2"}, {"TRIT_LG_KS": "3"}, {"TRIT_LG_KS": "8"},
         {"TRIT_LG_NW": "1"}, {"TRIT_LG_NW": "2", "TRIT_LG_KS": "5"}, {"TRIT_LG_NW": "8"}, {"TRIT_LG_WN": "1"},
         {"TRIT_LG_STAGES": "2"}, {"TRIT_LG_STAGES": "3", "TRIT_LG_KS": "4"}, {"TRIT_LG_STAGES": "4"},
         {"TRIT_LG_WN": "1", "TRIT_LG_NW": "3", "TRIT_LG_KS": "7", "TRIT_LG_STAGES": "2"},
         {"TRIT_PDL": "0", "TRIT_LG_KS": "2"}]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(f"{a[5:]}={v}" for a, v in k.items()) or "default")
@pytest.mark.parametrize("M,N,K", [(1, 100, 1000), (17, 100, 1000), (64, 2560, 2560), (100, 1000, 4104),
                                   (128, 640, 2560), (129, 33, 136), (300, 129, 520), (40, 6160, 8)])
def test_lin_gemm_launch_knobs(monkeypatch, knobs, M, N, K):
    """Every launch shape (split-K 1-8 incl. uneven k ranges and more CTAs than k-blocks, 1-8 warps along N, one
    or two tiles per warp, ring depth 2-4, PDL off) against the reference, bf16 and fp16, and deterministic: a
    second call is bit-identical."""
    _set(monkeypatch, {"TRIT_LIN_GEMM": "1", **knobs})
    for dtype in HALF:
        x, w, p, s, b = make_case(M, N, K, dtype, True, M + N + K, DEV)
        y = torch.ops.trit.ternary_mm(x, p, s, N, K, b)
        assert_close_rel(y, ops.ternary_mm_ref(x, p, s, N, K, b), TOL[dtype], f"lin_gemm {knobs} M={M} N={N} K={K}")
        assert torch.equal(y, torch.ops.trit.ternary_mm(x, p, s, N, K, b)), f"not deterministic: {knobs} M={M}"


@pytest.mark.parametrize("M", [24, 64, 128])
def test_lin_gemm_route_taken(monkeypatch, M):
    """TRIT_LIN_GEMM=1 runs lin_gemm_kernel for bf16 / fp16 x with K % 8 == 0 and aligned rows; fp32 x,
    K % 8 != 0 and unaligned rows take the other kernels (same values within rounding)."""
    _set(monkeypatch, {"TRIT_LIN_GEMM": "1"})
    N, K = 1000, 2560
    x, w, p, s, b = make_case(M, N, K, torch.bfloat16, True, 3, DEV)
    names = _lg_kernels_ran(lambda: torch.ops.trit.ternary_mm(x, p, s, N, K, b))
    assert any("lin_gemm_kernel" in n for n in names), names
    x32 = x.float()
    assert not any("lin_gemm_kernel" in n for n in _lg_kernels_ran(lambda: torch.ops.trit.ternary_mm(
        x32, p, s, N, K, b.float())))
    flat = torch.full((M * K + 8,), float("nan"), device=DEV, dtype=torch.bfloat16)
    xo = flat[4:4 + M * K].view(M, K)  # 8-byte offset
    xo.copy_(x)
    assert not any("lin_gemm_kernel" in n for n in _lg_kernels_ran(lambda: torch.ops.trit.ternary_mm(
        xo, p, s, N, K, b)))
    ref = ops.ternary_mm_ref(x, p, s, N, K, b)
    assert_close_rel(torch.ops.trit.ternary_mm(xo, p, s, N, K, b), ref, TOL[torch.bfloat16], "unaligned")
    x7, _, p7, s7, b7 = make_case(M, N, 1001, torch.bfloat16, True, 4, DEV)
    assert not any("lin_gemm_kernel" in n for n in _lg_kernels_ran(lambda: torch.ops.trit.ternary_mm(
        x7, p7, s7, N, 1001, b7)))
    _set(monkeypatch, {})
    assert not any("lin_gemm_kernel" in n for n in _lg_kernels_ran(lambda: torch.ops.trit.ternary_mm(
        x, p, s, N, K, b))), "TRIT_LIN_GEMM unset must keep the default kernels"


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("knobs", [{}, {"TRIT_LG_KS": "3"}, {"TRIT_LG_KS": "1", "TRIT_LG_STAGES": "2"}])
@pytest.mark.parametrize("M", [24, 64, 100])
def test_lin_gemm_dependent_chain(monkeypatch, graph, knobs, M):
    """Six layers, each reading the one before (PDL: x must not be read before griddepcontrol.wait), a torch
    kernel between some, eager and replayed from a CUDA graph onto a poisoned output with new inputs."""
    _set(monkeypatch, {"TRIT_LIN_GEMM": "1", **knobs})
    D, L = 1024, 6
    gen = torch.Generator().manual_seed(7)
    layers = []
    for _ in range(L):
        w = torch.randint(-1, 2, (D, D), generator=gen, dtype=torch.int8)
        layers.append((ops.repack(w).to(DEV), (torch.rand(D, generator=gen) * 0.05 + 0.01).to(DEV)))

    def forward(x):
        for i, (p, s) in enumerate(layers):
            x = torch.ops.trit.ternary_mm(x, p, s, D, D, None)
            x = torch.nn.functional.silu(x) if i % 3 == 2 else x
        return x

    def forward_ref(x):
        for i, (p, s) in enumerate(layers):
            x = ops.ternary_mm_ref(x, p, s, D, D, None).to(torch.bfloat16)
            x = torch.nn.functional.silu(x) if i % 3 == 2 else x
        return x

    static_x = torch.randn(M, D, generator=gen).to(torch.bfloat16).to(DEV)
    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward(static_x)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = forward(static_x)
    for seed in (1, 2):
        xin = torch.randn(M, D, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEV)
        if graph:
            static_x.copy_(xin)
            static_y.fill_(float("nan"))
            g.replay()
            y = static_y
        else:
            y = forward(xin)
        torch.cuda.synchronize()
        assert_close_rel(y, forward_ref(xin), 3e-2, f"lin_gemm chain {knobs} graph={graph} seed={seed}")


def test_lin_gemm_opcheck(monkeypatch):
    _set(monkeypatch, {"TRIT_LIN_GEMM": "1"})
    x, w, p, s, b = make_case(33, 100, 1000, torch.bfloat16, True, 1, DEV)
    torch.library.opcheck(torch.ops.trit.ternary_mm.default, (x, p, s, 100, 1000, b))
