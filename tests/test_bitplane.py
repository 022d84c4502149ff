"""The bitplane (+1/-1 bitmask) weight layout and trit::ternary_mm_a8_bp on the CPU.

The CUDA kernel decodes each 16-byte weight load with a8_frag_w<kBP> (csrc/ternary_gemm.cu); the layout test
below runs that decode's integer arithmetic, as written there, on every lane of random tensors and requires the
fragments a8_frag builds from the 2-bit codes of the same weights - the CPU check that the two layouts feed the
tensor cores identical operands (tests/test_ops_cuda.py then compares the kernels bit for bit on a GPU)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trit import ops

try:
    from .test_ops import DTYPES, make_case
except ImportError:
    from test_ops import DTYPES, make_case

M32 = 0xFFFFFFFF


def frag_codes(C: torch.Tensor, i: int) -> torch.Tensor:
    """a8_frag(word i): af[j] = (C_i >> 2j) & 0x03030303, for every lane. C: int64 [..., 4] -> [..., 4 (j)]."""
    w = C[..., i]
    return torch.stack([(w >> (2 * j)) & 0x03030303 for j in range(4)], -1)


def frag_bitplane(B: torch.Tensor, i: int) -> torch.Tensor:
    """a8_frag_w<true>(load, i): p, n = words (i < 2 ? 0, 1 : 2, 3); af[j] = 0x01010101 + ((p >> (sh + j)) &
    0x01010101) - ((n >> (sh + j)) & 0x01010101) modulo 2^32, sh = 4 (i & 1)."""
    p, n = (B[..., 0], B[..., 1]) if i < 2 else (B[..., 2], B[..., 3])
    sh = 4 * (i & 1)
    return torch.stack([(0x01010101 + ((p >> (sh + j)) & 0x01010101) - ((n >> (sh + j)) & 0x01010101)) & M32
                        for j in range(4)], -1)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(N=st.integers(1, 70), K=st.integers(1, 700), seed=st.integers(0, 2**16))
def test_bitplane_roundtrip_and_kernel_fragments(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (N, K), generator=g, dtype=torch.int8)
    p = ops.repack(w)
    bp = ops.repack_bitplane(p)
    assert bp.dtype == torch.int32 and bp.shape == p.shape  # 2 bits per weight, as the codes
    assert torch.equal(ops.bitplane_to_packed(bp), p)
    assert torch.equal(ops.unpack_bitplane(bp, N, K), w)
    # the kernel's decode of each lane's load, both layouts: the same u8 A fragments
    C = (p.reshape(-1, 4).to(torch.int64) & M32)
    B = (bp.reshape(-1, 4).to(torch.int64) & M32)
    for i in range(4):
        assert torch.equal(frag_bitplane(B, i), frag_codes(C, i)), f"word {i}"
    # padding (rows past N, inputs past K) holds code 1: neither bit
    T, Kp = p.shape
    full = ops.unpack_bitplane(bp, T * 16, Kp)
    assert (full[N:] == 0).all() and (full[:, K:] == 0).all()


def test_bitplane_words_by_hand():
    # one lane: C0 has code 2 (+1) at byte 0, sub-position s = 1 -> P0 bit 8*0 + 4*0 + 1 = 1; C3 (j = 1, h = 1)
    # has code 0 (-1) at byte 2, s = 3 -> N1 bit 8*2 + 4 + 3 = 23; every other weight code 1 (0)
    ones = 0x55555555
    c = [ones, ones, ones, ones]
    c[0] = (ones & ~(3 << 2)) | (2 << 2)
    c[3] = ones & ~(3 << (16 + 6))
    p = torch.tensor([c + [ones] * 124], dtype=torch.int64)
    p = torch.where(p >= 2**31, p - 2**32, p).to(torch.int32)
    bp = ops.repack_bitplane(p)
    assert bp[0, :4].tolist() == [1 << 1, 0, 0, 1 << 23]
    assert (bp[0, 4:] == 0).all()


def test_bitplane_refuses_what_is_not_a_weight():
    p = torch.full((1, 128), 0x55555555, dtype=torch.int32)
    p[0, 5] = 0x55555557  # code 3 at bits 0-1 of word 5
    with pytest.raises(ValueError, match=r"packed\[0, 5\] holds code 3"):
        ops.repack_bitplane(p)
    bp = torch.zeros(2, 256, dtype=torch.int32)
    bp[1, 130] = 1 << 9
    bp[1, 131] = 1 << 9  # P1 and N1 of the lane at words 128..131 both set bit 9
    with pytest.raises(ValueError, match=r"packed_bp\[1, 130\] and \[1, 131\] both set bit 9"):
        ops.bitplane_to_packed(bp)
    with pytest.raises(ValueError, match="repack_bitplane: expected int32"):
        ops.repack_bitplane(torch.zeros(2, 100, dtype=torch.int32))
    with pytest.raises(ValueError, match="bitplane_to_packed: expected int32"):
        ops.bitplane_to_packed(torch.zeros(2, 128, dtype=torch.int64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 33, 300), (5, 640, 2560), (32, 100, 1000)])
def test_ternary_mm_a8_bp_cpu_equals_a8(dtype, M, N, K):
    x, w, p, s, b = make_case(M, N, K, dtype, True, 7 + M)
    bp = ops.repack_bitplane(p)
    y = torch.ops.trit.ternary_mm_a8_bp(x, bp, s, N, K, b)
    assert torch.equal(y, torch.ops.trit.ternary_mm_a8(x, p, s, N, K, b))
    # against the float64 reference of the weights read back from the planes
    ref = ops.ternary_mm_a8_bp_ref(x, bp, s, N, K, b)
    err = (y.double() - ref.double()).abs().max().item() / max(1.0, ref.double().abs().max().item())
    assert err <= 8e-3, err


def test_ternary_mm_a8_bp_checks_and_opcheck():
    x, w, p, s, b = make_case(4, 40, 300, torch.bfloat16, True, 3)
    bp = ops.repack_bitplane(p)
    with pytest.raises(ValueError, match=r"trit::ternary_mm_a8_bp: packed .* does not match N=60"):
        torch.ops.trit.ternary_mm_a8_bp(x, bp, torch.ones(60), 60, 300, None)
    bad = bp.clone()
    bad[0, 0] = 1
    bad[0, 1] = 1
    with pytest.raises(ValueError, match="both set bit 0"):
        torch.ops.trit.ternary_mm_a8_bp(x, bad, s, 40, 300, b)
    torch.library.opcheck(torch.ops.trit.ternary_mm_a8_bp.default, (x, bp, s, 40, 300, b))
