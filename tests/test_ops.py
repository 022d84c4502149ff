"""CPU tests of trit.ops: layout round trip, CPU op vs float64 reference, opcheck, any-rank API."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from trit import ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# tolerance on max|y - ref| / max(1, max|ref|): output rounding of the dtype dominates
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make_case(M, N, K, dtype, bias=False, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (N, K), generator=g, dtype=torch.int8)
    x = torch.randn(M, K, generator=g).to(dtype)
    scale = torch.rand(N, generator=g) + 0.5
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    packed = ops.repack(w)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(w), to(packed), to(scale), to(b)


def assert_close_rel(y, ref, tol, what):
    assert y.shape == ref.shape and y.dtype == ref.dtype, (what, y.shape, ref.shape, y.dtype, ref.dtype)
    assert torch.isfinite(y).all(), f"{what}: non-finite output"
    err = (y.double() - ref.double()).abs()
    denom = max(1.0, ref.double().abs().max().item())
    worst = err.argmax().item()
    m, n = divmod(worst, ref.shape[-1])
    assert err.max().item() / denom <= tol, (
        f"{what}: max err {err.max().item():.3g} (rel {err.max().item() / denom:.3g} > {tol}) at [m={m}, n={n}]: "
        f"got {y.reshape(-1)[worst].item()}, ref {ref.reshape(-1)[worst].item()}")


# ------------------------------------------------------------------ layout
@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 70), K=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_repack_round_trip(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (N, K), generator=g, dtype=torch.int8)
    p = ops.repack(w)
    assert p.dtype == torch.int32 and tuple(p.shape) == ops.packed_shape(N, K)
    assert torch.equal(ops.unpack(p, N, K), w)


def test_layout_bits_documented():
    """The docstring's bit formula, element by element, on one tile."""
    N, K = 16, 128
    w = torch.randint(-1, 2, (N, K), dtype=torch.int8)
    p = ops.repack(w)
    for n in range(N):
        for k in range(K):
            g, rs = n % 8, n // 8
            c, i, kk = k // 32, (k % 32) // 8, k % 8
            word = p[0, (g * 4 + c) * 4 + i].item() & 0xFFFFFFFF
            b = 16 * (kk & 1) + 2 * (4 * (kk >> 2) + 2 * ((kk >> 1) & 1) + rs)
            assert ((word >> b) & 3) - 1 == w[n, k].item(), (n, k)


def test_padding_is_zero_code():
    p = ops.repack(torch.zeros(1, 1, dtype=torch.int8))
    assert p.shape == (1, 128)
    assert (p == 0x55555555).all()  # code 1 everywhere


def test_repack_rejects_bad_values():
    with pytest.raises(ValueError, match=r"W\[0, 1\] = 2"):
        ops.repack(torch.tensor([[0, 2]], dtype=torch.int8))
    with pytest.raises(ValueError, match="2-D"):
        ops.repack(torch.zeros(3, dtype=torch.int8))


# ------------------------------------------------------------------ ops on CPU vs references
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_ternary_mm_cpu(dtype, bias):
    x, w, p, s, b = make_case(5, 37, 300, dtype, bias)
    y = torch.ops.trit.ternary_mm(x, p, s, 37, 300, b)
    assert_close_rel(y, ops.ternary_mm_ref(x, p, s, 37, 300, b), TOL[dtype], "ternary_mm cpu")
    # and against the plain dense formula on the logical weight
    dense = (x.double() @ w.double().t()) * s.double() + (0 if b is None else b.double())
    assert_close_rel(y, dense.to(dtype), TOL[dtype], "ternary_mm vs dense")


@settings(max_examples=40, deadline=None)
@given(M=st.integers(1, 40), N=st.integers(1, 80), K=st.integers(1, 300),
       dtype=st.sampled_from(DTYPES), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_ops_cpu_hypothesis(M, N, K, dtype, bias, seed):
    x, w, p, s, b = make_case(M, N, K, dtype, bias, seed)
    ref = ops.ternary_mm_ref(x, p, s, N, K, b)
    assert_close_rel(torch.ops.trit.ternary_mm(x, p, s, N, K, b), ref, TOL[dtype], "ternary_mm")
    assert_close_rel(torch.ops.trit.ternary_mm_naive(x, p, s, N, K, b), ref, TOL[dtype], "naive")
    ya = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    assert torch.equal(ya, ops.ternary_mm_a8_ref(x, p, s, N, K, b)), "a8 must match its ref exactly on CPU"


def test_a8_matches_bitlinear_formula():
    """The a8 reference against the BitNet formula written out independently."""
    x, w, p, s, _ = make_case(4, 24, 200, torch.float32)
    xs = 127 / x.abs().max(dim=-1, keepdim=True).values.clamp(min=1e-5)
    xq = (x * xs).round().clamp(-128, 127)
    y = (xq.double() @ w.double().t()).float() / xs * s
    assert torch.equal(ops.ternary_mm_a8_ref(x, p, s, 24, 200), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_decode_cpu(dtype):
    x, w, p, s, _ = make_case(1, 21, 133, torch.float32)
    if dtype == torch.int8:
        assert torch.equal(torch.ops.trit.ternary_decode(p, None, 21, 133, dtype), w)
    else:
        d = torch.ops.trit.ternary_decode(p, s, 21, 133, dtype)
        assert torch.equal(d, (w.float() * s[:, None]).to(dtype))


def test_any_rank_linear():
    x, w, p, s, b = make_case(6, 19, 70, torch.float32, bias=True)
    x3 = x.view(2, 3, 70)
    y = ops.ternary_linear(x3, p, s, 19, 70, b)
    assert y.shape == (2, 3, 19)
    assert_close_rel(y.view(6, 19), ops.ternary_mm_ref(x, p, s, 19, 70, b), 1e-5, "ternary_linear 3-D")
    ya = ops.ternary_linear_a8(x3, p, s, 19, 70, b)
    assert torch.equal(ya.view(6, 19), ops.ternary_mm_a8_ref(x, p, s, 19, 70, b))


def test_shape_errors_name_the_size():
    x, w, p, s, _ = make_case(2, 20, 64, torch.float32)
    with pytest.raises(ValueError, match="K=65"):
        torch.ops.trit.ternary_mm(x, p, s, 20, 65, None)
    with pytest.raises(ValueError, match=r"scale must be float32 \[21\]"):
        torch.ops.trit.ternary_mm(x, ops.repack(torch.zeros(21, 64, dtype=torch.int8)), s, 21, 64, None)


@pytest.mark.parametrize("name", ["ternary_mm", "ternary_mm_a8", "ternary_mm_naive"])
def test_opcheck_cpu(name):
    x, w, p, s, b = make_case(3, 20, 150, torch.bfloat16, bias=True)
    op = getattr(torch.ops.trit, name)
    torch.library.opcheck(op, (x, p, s, 20, 150, b))
    torch.library.opcheck(op, (x.float(), p, s, 20, 150, None))


def test_opcheck_decode_cpu():
    _, _, p, s, _ = make_case(1, 20, 150, torch.float32)
    torch.library.opcheck(torch.ops.trit.ternary_decode, (p, s, 20, 150, torch.bfloat16))
    torch.library.opcheck(torch.ops.trit.ternary_decode, (p, None, 20, 150, torch.int8))


def test_compile_cpu():
    x, w, p, s, b = make_case(4, 20, 150, torch.float32, bias=True)
    f = torch.compile(lambda x: ops.ternary_linear(x, p, s, 20, 150, b), fullgraph=True, backend="eager")
    assert_close_rel(f(x), ops.ternary_mm_ref(x, p, s, 20, 150, b), 1e-5, "compiled")


def test_linear_dispatch_is_one_opaque_op():
    """torch.compile must see one op (no Python branch on M to freeze at trace time)."""
    x, w, p, s, b = make_case(5, 20, 150, torch.float32, bias=True)
    torch.library.opcheck(torch.ops.trit.ternary_linear_2d.default, (x, p, s, 20, 150, b))
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    f = torch.compile(lambda x: ops.ternary_linear(x, p, s, 20, 150, b), backend=backend, dynamic=True)
    assert_close_rel(f(x), ops.ternary_mm_ref(x, p, s, 20, 150, b), 1e-5, "compiled")
    assert any("ternary_linear_2d" in t for t in seen), seen


# ------------------------------------------------------------------ a8 with the quantizer in front (a8q)


@settings(max_examples=40, deadline=None)
@given(M=st.integers(1, 12), K=st.integers(1, 400), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_a8_quantize_is_bitlinear_quant_in_kernel_order(M, K, dtype, seed):
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to(dtype)
    if seed % 3 == 0:
        x[0] = 0  # an all-zero row: xs from the 1e-5 clamp, xq all zero
    xq, xs, rowsum = ops.a8_quantize(x)
    q, s = ops.act_quant_a8_ref(x)
    Kp = (K + 127) // 128 * 128
    assert xq.dtype == torch.int8 and xq.shape == (M, Kp) and xs.shape == (M,) and rowsum.dtype == torch.int32
    assert torch.equal(ops.a8_unpermute(xq, K).float(), q)
    assert torch.equal(xs, s[:, 0])
    assert torch.equal(rowsum, q.sum(-1).to(torch.int32))
    assert not xq.view(M, Kp // 8, 4, 2).transpose(-1, -2).reshape(M, Kp)[:, K:].any(), "padding past K not zero"
    # the byte order within each group of 8 inputs: {0,4,1,5,2,6,3,7}
    g = ops.a8_unpermute(xq, K).to(torch.int8)
    if K >= 8:
        assert xq[0, :8].tolist() == g[0, [0, 4, 1, 5, 2, 6, 3, 7]].tolist()


@settings(max_examples=30, deadline=None)
@given(M=st.integers(1, 20), N=st.integers(1, 60), K=st.integers(1, 300), dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_a8q_equals_a8_cpu(M, N, K, dtype, bias, seed):
    x, w, p, s, b = make_case(M, N, K, dtype, bias=bias, seed=seed)
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    assert torch.equal(torch.ops.trit.ternary_mm_a8q(x, *ops.a8_quantize(x), p, s, N, K, b), want)
    assert torch.equal(ops.ternary_linear_a8_pre(x.view(1, M, K), p, s, N, K, b), want.view(1, M, N))


def test_a8q_bad_quantization_is_named():
    x, w, p, s, b = make_case(3, 20, 150, torch.bfloat16)
    xq, xs, rs = ops.a8_quantize(x)
    with pytest.raises(ValueError, match=r"xq must be torch.int8 \[3, 256\]"):
        torch.ops.trit.ternary_mm_a8q(x, xq[:, :150], xs, rs, p, s, 20, 150, None)
    with pytest.raises(ValueError, match=r"xs must be torch.float32 \[3\]"):
        torch.ops.trit.ternary_mm_a8q(x, xq, xs.double(), rs, p, s, 20, 150, None)
    with pytest.raises(ValueError, match=r"rowsum must be torch.int32 \[3\]"):
        torch.ops.trit.ternary_mm_a8q(x, xq, xs, rs[:2], p, s, 20, 150, None)


def test_opcheck_a8q_cpu():
    x, w, p, s, b = make_case(3, 20, 150, torch.bfloat16, bias=True)
    torch.library.opcheck(torch.ops.trit.ternary_mm_a8q, (x, *ops.a8_quantize(x), p, s, 20, 150, b))


def compiled_norm_and_pre(g, p, s, N, K, b):
    """Inductor-compiled (symbolic batch) RMSNorm with bf16 output and weight g, alone (the default
    route's input) and followed by a8_quantize + ternary_mm_a8q (what TRIT_A8_PREQUANT compiles):
    (c_pre: x -> ((xq, xs, rowsum), y), c_norm: x -> h)."""
    def norm(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * g

    def pre(x):
        h = norm(x)
        q = ops.a8_quantize(h)
        return q, torch.ops.trit.ternary_mm_a8q(h, *q, p, s, N, K, b)

    torch._dynamo.reset()
    return (torch.compile(pre, backend="inductor", dynamic=True, fullgraph=True),
            torch.compile(norm, backend="inductor", dynamic=True, fullgraph=True))


def test_a8_pre_compiles_into_the_norm_with_inductor():
    """What vLLM's torch.compile does with TRIT_A8_PREQUANT: RMSNorm (bf16 output) then the a8 linear,
    batch size symbolic. The quantizer is torch ops, so Inductor compiles it into the norm's kernel
    (fullgraph: the op is the only opaque call). Inductor keeps the norm's output in fp32 inside that
    kernel; a8_quantize's bf16 pin must make it quantize exactly the bf16 value that the default route
    (the compiled norm alone, output stored as bf16) quantizes: same xq / xs / rowsum, same output."""
    N, K = 48, 2560
    x, w, p, s, b = make_case(8, N, K, torch.bfloat16, bias=True, seed=3)
    g = (torch.rand(K, generator=torch.Generator().manual_seed(4)) + 0.5).to(torch.bfloat16)

    c_pre, c_norm = compiled_norm_and_pre(g, p, s, N, K, b)
    for M in (2, 5, 1):  # 2 and 5 share one graph with a symbolic batch size; 1 is specialised by Dynamo
        (xq, xs, rowsum), y = c_pre(x[:M])
        h = c_norm(x[:M])
        want_q = ops.a8_quantize(h)
        for name, got, want in zip(("xq", "xs", "rowsum"), (xq, xs, rowsum), want_q):
            assert torch.equal(got, want), f"M={M}: compiled {name} differs in {(got != want).sum().item()} places"
        assert torch.equal(y, torch.ops.trit.ternary_mm_a8(h, p, s, N, K, b)), f"M={M}"


# ------------------------------------------------------------------ RMSNorm + a8 quantizer
def _rms_norm_f64(x, residual, weight, eps):
    z = x.double() if residual is None else (x.double() + residual.double()).to(x.dtype).double()
    return z * torch.rsqrt(z.square().mean(-1, keepdim=True) + eps) * weight.double()


@settings(max_examples=50, deadline=None)
@given(M=st.integers(1, 9), K=st.integers(1, 700), dtype=st.sampled_from(DTYPES), res=st.booleans(),
       seed=st.integers(0, 2**16))
def test_rms_norm_a8q_cpu(M, K, dtype, res, seed):
    """trit::rms_norm_a8q on the CPU: the residual stream is x + residual rounded to the dtype, out is
    the float64 RMSNorm within one rounding step, and (xq, xs, rowsum) is a8_quantize(out) exactly,
    so ternary_mm_a8q on it gives what ternary_mm_a8 gives on out."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * 3).to(dtype)
    r = (torch.randn(M, K, generator=g) * 3).to(dtype) if res else None
    w = (torch.rand(K, generator=g) + 0.5).to(dtype)
    out, res_out, xq, xs, rowsum = torch.ops.trit.rms_norm_a8q(x, r, w, 1e-6)
    if res:
        assert torch.equal(res_out, (x.float() + r.float()).to(dtype))
    else:
        assert res_out.numel() == 0
    ref = _rms_norm_f64(x, r, w, 1e-6)
    ulp = {torch.float32: 2e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
    assert ((out.double() - ref).abs() <= ulp * ref.abs() + 1e-6).all()
    want = ops.a8_quantize(out)
    for got, exp, name in zip((xq, xs, rowsum), want, ("xq", "xs", "rowsum")):
        assert torch.equal(got, exp), name
    N = 24
    _, _, p, s, _ = make_case(M, N, K, dtype, seed=seed)
    assert torch.equal(torch.ops.trit.ternary_mm_a8q(out, xq, xs, rowsum, p, s, N, K),
                       torch.ops.trit.ternary_mm_a8(out, p, s, N, K))


def _prologue_inputs(M, K, dtype, act, res, norm, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, 2 * K if act else K, generator=g) * 3).to(dtype)
    r = (torch.randn(M, K, generator=g) * 3).to(dtype) if res else None
    w = (torch.rand(K, generator=g) + 0.5).to(dtype) if norm else None
    return x, r, w


@settings(max_examples=60, deadline=None)
@given(M=st.integers(1, 5), K=st.integers(1, 300), dtype=st.sampled_from(DTYPES), act=st.sampled_from([0, 1, 2]),
       res=st.booleans(), norm=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_ternary_mm_a8_prologue_cpu(M, K, dtype, act, res, norm, bias, seed):
    """trit::ternary_mm_a8_prologue on the CPU is the composition of the ops it replaces: act(gate) * up
    (torch's ops, each rounding to the dtype: checked against float64 here) or x (+ residual), then
    rms_norm_a8q's norm when norm_weight is given, then ternary_mm_a8; residual_out is x + residual."""
    res = res and not act
    x, r, w = _prologue_inputs(M, K, dtype, act, res, norm, seed)
    N = 20
    _, _, p, s, b = make_case(M, N, K, dtype, bias=bias, seed=seed)
    y, res_out = torch.ops.trit.ternary_mm_a8_prologue(x, r, w, 1e-6, act, p, s, N, K, b)
    a = x
    if act:
        g, u = x[:, :K].double(), x[:, K:].double()
        f64 = ((torch.relu(g).square() if act == 1 else g * torch.sigmoid(g)).to(dtype).double() * u).to(dtype).double()
        a = (torch.relu(x[:, :K]).square() if act == 1 else torch.nn.functional.silu(x[:, :K])) * x[:, K:]
        ulp = {torch.float32: 2e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
        # relu^2: every product exact in float64, so each rounding is torch's; silu: within a step
        tol = 0.0 if act == 1 else 2 * ulp
        assert ((a.double() - f64).abs() <= tol * f64.abs() + (0 if act == 1 else 1e-30)).all()
    if norm:
        h, want_res, *_ = torch.ops.trit.rms_norm_a8q(a.contiguous(), r, w, 1e-6)
    else:
        want_res = (a.float() + r.float()).to(dtype) if res else a.new_empty(0)
        h = want_res if res else a
    assert torch.equal(res_out, want_res)
    assert torch.equal(y, torch.ops.trit.ternary_mm_a8(h.contiguous(), p, s, N, K, b))


def test_ternary_mm_a8_prologue_opcheck_and_errors():
    K, N = 260, 24
    _, _, p, s, b = make_case(3, N, K, torch.bfloat16, bias=True)
    x, r, w = _prologue_inputs(3, K, torch.bfloat16, 0, True, True, 1)
    gu, _, _ = _prologue_inputs(3, K, torch.bfloat16, 1, False, True, 2)
    op = torch.ops.trit.ternary_mm_a8_prologue
    torch.library.opcheck(op, (x, r, w, 1e-5, 0, p, s, N, K, b))
    torch.library.opcheck(op, (gu, None, w, 1e-5, 1, p, s, N, K, None))
    torch.library.opcheck(op, (gu, None, None, 1e-5, 2, p, s, N, K, None))
    with pytest.raises(ValueError, match=r"x must be .* \[M, 520\] tensor \(\[gate \| up\]\)"):
        op(x, None, w, 1e-5, 1, p, s, N, K)
    with pytest.raises(ValueError, match="a residual goes with act=0 only"):
        op(gu, r, w, 1e-5, 1, p, s, N, K)
    with pytest.raises(ValueError, match=r"norm_weight must be torch.bfloat16 \[260\]"):
        op(x, r, w[:10], 1e-5, 0, p, s, N, K)
    with pytest.raises(ValueError, match="act must be one of"):
        op(x, r, w, 1e-5, 3, p, s, N, K)
    with pytest.raises(ValueError, match="residual must be"):
        op(x, r[:2], w, 1e-5, 0, p, s, N, K)


def _chain_case(M, D, A, I, act, subnorm, dtype, seed, device="cpu"):
    """A decoder layer's tail as trit::ternary_chain arguments: attn_sub_norm -> o_proj [D, A], + residual ->
    post_attention_layernorm -> gate_up_proj [2I, D], act(gate) * up -> ffn_sub_norm -> down_proj [D, I];
    sub-norms only with subnorm (Llama has none)."""
    g = torch.Generator().manual_seed(seed)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731

    def lin(n, k):
        return (to(ops.repack(torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8))),
                to(torch.rand(n, generator=g) * 0.05 + 0.01))

    nw = lambda k: to((torch.rand(k, generator=g) + 0.5).to(dtype))  # noqa: E731
    (po, so), (pg, sg), (pd, sd) = lin(D, A), lin(2 * I, D), lin(D, I)
    x = to((torch.randn(M, A, generator=g) * 2).to(dtype))
    r = to((torch.randn(M, D, generator=g) * 2).to(dtype))
    return (x, r, 1, [nw(A) if subnorm else None, nw(D), nw(I) if subnorm else None], [0, 0, act], [po, pg, pd],
            [so, sg, sd], [D, 2 * I, D], [A, D, I])


@settings(max_examples=30, deadline=None)
@given(M=st.integers(1, 4), D=st.sampled_from([8, 24, 136, 264]), A=st.sampled_from([8, 40, 136]),
       I=st.sampled_from([8, 72, 200]), act=st.sampled_from([1, 2]), subnorm=st.booleans(),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_ternary_chain_cpu(M, D, A, I, act, subnorm, dtype, seed):
    """trit::ternary_chain on the CPU is its stages' ternary_mm_a8_prologue calls in a row, each on the
    previous output, with the residual stream of residual_stage returned (bit for bit)."""
    x, r, rs, nws, acts, P, S, Ns, Ks = _chain_case(M, D, A, I, act, subnorm, dtype, seed)
    y, res_out = torch.ops.trit.ternary_chain(x, r, rs, nws, acts, P, S, Ns, Ks, 1e-6)
    h = x
    for s in range(3):
        h, ro = torch.ops.trit.ternary_mm_a8_prologue(h, r if s == rs else None, nws[s], 1e-6, acts[s], P[s], S[s],
                                                      Ns[s], Ks[s])
        if s == rs:
            want_res = ro
    assert torch.equal(y, h) and torch.equal(res_out, want_res)
    assert torch.equal(res_out, (ops.ternary_mm_a8_prologue_ref(x, None, nws[0], 1e-6, 0, P[0], S[0], Ns[0], Ks[0])[0]
                                 .float() + r.float()).to(dtype))


def test_ternary_chain_opcheck_and_errors():
    args = _chain_case(2, 40, 24, 16, 1, True, torch.bfloat16, 3)
    op = torch.ops.trit.ternary_chain
    torch.library.opcheck(op, args + (1e-5,))
    x, r, rs, nws, acts, P, S, Ns, Ks = args
    torch.library.opcheck(op, (x, None, -1, nws[:1], [0], P[:1], S[:1], Ns[:1], Ks[:1], 1e-5))
    with pytest.raises(ValueError, match=r"every per-stage list must have 3 entries .* \{'acts': 2\}"):
        op(x, r, rs, nws, acts[:2], P, S, Ns, Ks, 1e-5)
    with pytest.raises(ValueError, match="stage 2 reads stage 1's output of 32 features, but its K=16 with act=0 "
                                         "needs 16"):
        op(x, r, rs, nws, [0, 0, 0], P, S, Ns, Ks, 1e-5)
    with pytest.raises(ValueError, match="residual and residual_stage go together"):
        op(x, None, 1, nws, acts, P, S, Ns, Ks, 1e-5)
    with pytest.raises(ValueError, match="residual_stage=2 must name a stage without act"):
        op(x, r, 2, nws, acts, P, S, Ns, Ks, 1e-5)
    with pytest.raises(ValueError, match="1 to 4 stages, got 5"):
        op(x, r, rs, nws + nws[:2], acts + [0, 0], P + P[:2], S + S[:2], Ns + Ns[:2], Ks + Ks[:2], 1e-5)
    with pytest.raises(ValueError, match=r"residual must be torch.bfloat16 \[2, 40\]"):
        op(x, r[:, :8], rs, nws, acts, P, S, Ns, Ks, 1e-5)


def test_rms_norm_a8q_opcheck_and_errors():
    x = torch.randn(3, 260, dtype=torch.bfloat16)
    r = torch.randn(3, 260, dtype=torch.bfloat16)
    w = torch.rand(260, dtype=torch.bfloat16) + 0.5
    torch.library.opcheck(torch.ops.trit.rms_norm_a8q, (x, r, w, 1e-5))
    torch.library.opcheck(torch.ops.trit.rms_norm_a8q, (x.float(), None, w.float(), 1e-5))
    with pytest.raises(ValueError, match=r"weight must be torch.bfloat16 \[260\]"):
        torch.ops.trit.rms_norm_a8q(x, r, w[:100], 1e-5)
    with pytest.raises(ValueError, match="residual must be"):
        torch.ops.trit.rms_norm_a8q(x, r[:2], w, 1e-5)
    with pytest.raises(ValueError, match="K=20000 outside"):
        torch.ops.trit.rms_norm_a8q(torch.zeros(1, 20000), None, torch.ones(20000), 1e-5)


# ------------------------------------------------------------------ the tiled xq (layout 1: trit.ops.a8_tile)
def _tiled_by_formula(xq, M):
    """a8_tile written out byte by byte: rows of 32 * ceil(M / 32); at 8 < M <= 32 row m = 8t + g's byte at
    row-major offset kb * 128 + 32c + 16h + 8q + j goes to kb * Mp * 128 + 1024t + 512h + 64g + 16c + 8q + j
    (Mp = 16 / 32), every other byte zero; elsewhere the rows row-major, then zero rows."""
    Kp = xq.shape[1]
    rows = (M + 31) // 32 * 32
    out = torch.zeros(rows * Kp, dtype=torch.int8)
    mp = 16 if 8 < M <= 16 else 32 if 16 < M <= 32 else 0
    for m in range(M):
        for k in range(Kp):
            if mp == 0:
                at = m * Kp + k
            else:
                kb, kk = divmod(k, 128)
                t, g = divmod(m, 8)
                at = (kb * mp * 128 + 1024 * t + 512 * (kk // 16 % 2) + 64 * g + 16 * (kk // 32)
                      + 8 * (kk // 8 % 2) + kk % 8)
            out[at] = xq[m, k]
    return out.view(rows, Kp)


@settings(max_examples=25, deadline=None)
@given(M=st.one_of(st.integers(1, 34), st.sampled_from([64, 65])), K=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_a8_tile_layout_written_out(M, K, seed):
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed))
    xq, _, _ = ops.a8_quantize(x)
    t = ops.a8_tile(xq, M)
    assert t.shape == (ops.a8_tile_rows(M), xq.shape[1]) and t.dtype == torch.int8
    assert torch.equal(t, _tiled_by_formula(xq, M))
    assert torch.equal(ops.a8_untile(t, M), xq)


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 40), N=st.integers(1, 60), K=st.integers(1, 300), dtype=st.sampled_from(DTYPES),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_a8q_tiled_equals_a8_cpu(M, N, K, dtype, bias, seed):
    """ternary_mm_a8q on the tiled xq (layout=1) = ternary_mm_a8, and rms_norm_a8q's layout 1 is a8_tile of its
    layout 0 (same out, residual, xs, rowsum)."""
    x, w, p, s, b = make_case(M, N, K, dtype, bias=bias, seed=seed)
    xq, xs, rs = ops.a8_quantize(x)
    want = torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b)
    assert torch.equal(torch.ops.trit.ternary_mm_a8q(x, ops.a8_tile(xq, M), xs, rs, p, s, N, K, b, 1), want)
    wn = torch.rand(K, generator=torch.Generator().manual_seed(seed)).to(dtype) + 0.5
    r = torch.randn(M, K, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    row = torch.ops.trit.rms_norm_a8q(x, r, wn, 1e-6)
    tiled = torch.ops.trit.rms_norm_a8q(x, r, wn, 1e-6, 1)
    for i in (0, 1, 3, 4):
        assert torch.equal(tiled[i], row[i]), i
    assert torch.equal(tiled[2], ops.a8_tile(row[2], M))


@pytest.mark.parametrize("M", [3, 12, 32, 40])
def test_opcheck_tiled_layout_cpu(M):
    x, w, p, s, b = make_case(M, 40, 300, torch.bfloat16, bias=True, seed=M)
    wn = (torch.rand(300) + 0.5).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.trit.rms_norm_a8q, (x, x.clone(), wn, 1e-6, 1))
    _, _, xq, xs, rs = torch.ops.trit.rms_norm_a8q(x, None, wn, 1e-6, 1)
    torch.library.opcheck(torch.ops.trit.ternary_mm_a8q, (x, xq, xs, rs, p, s, 40, 300, b, 1))


def test_tiled_layout_errors_name_the_problem():
    x, w, p, s, b = make_case(12, 40, 300, torch.bfloat16, seed=1)
    xq, xs, rs = ops.a8_quantize(x)
    with pytest.raises((ValueError, RuntimeError), match=r"xq must be torch.int8 \[32, 384\].*a8_tile.*layout=1"):
        torch.ops.trit.ternary_mm_a8q(x, xq, xs, rs, p, s, 40, 300, None, 1)  # the row-major xq, 12 rows
    with pytest.raises((ValueError, RuntimeError), match="layout=2 not in"):
        torch.ops.trit.ternary_mm_a8q(x, ops.a8_tile(xq, 12), xs, rs, p, s, 40, 300, None, 2)
    with pytest.raises((ValueError, RuntimeError), match="layout=2 not in"):
        torch.ops.trit.rms_norm_a8q(x, None, torch.ones(300, dtype=torch.bfloat16), 1e-6, 2)
