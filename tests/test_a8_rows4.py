"""The "rows4" decode of the M <= 32 W1.58A8 GEMV and the chain kernel (csrc/ternary_gemm.cu a8_frag_r4 and
a8_rows4_fix), checked on the CPU against the plain decode (a8_frag) with the integer arithmetic as written there.

a8_frag turns one packed word into the four u8 registers of an mma.m16n8k32 A fragment with three shifts and four
ANDs; a8_frag_r4 masks the registers of rows g + 8 (1 and 3) where they sit - one shift, four ANDs - so those
registers hold 4x the codes, the mma's accumulators of rows g + 8 hold 4x the sums, and a8_rows4_fix divides them.
Three things make that exact, each tested here: registers 1 and 3 hold rows g + 8 of trit.ops.repack's layout
(and 0 and 2 rows g); the scaled registers are 4x the plain ones byte for byte (no carry: codes <= 2); and the
m16n8k32 product (PTX ISA fragment layouts, emulated) of scaled fragments, with rows g + 8 of the accumulator
shifted right by 2, equals the plain product for every lane."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trit import ops

try:
    from .test_bitplane import M32, frag_codes
except ImportError:
    from test_bitplane import M32, frag_codes


def a8_frag(w: torch.Tensor) -> torch.Tensor:
    """The plain decode of single words (test_bitplane.frag_codes: af[j] = (w >> 2j) & 0x03030303) -> [..., 4]."""
    return frag_codes(w.unsqueeze(-1), 0)


def a8_frag_r4(w: torch.Tensor) -> torch.Tensor:
    """t = w >> 4; af = {w & 0x03030303, w & 0x0c0c0c0c, t & 0x03030303, t & 0x0c0c0c0c} (as in the kernel)."""
    t = w >> 4
    return torch.stack([w & 0x03030303, w & 0x0C0C0C0C, t & 0x03030303, t & 0x0C0C0C0C], -1)


def bytes_of(r: torch.Tensor, signed: bool = False) -> torch.Tensor:
    """[..., 4 registers] int64 -> [..., 4 registers, 4 bytes] (byte e = bits 8e..8e+7)."""
    b = torch.stack([(r >> (8 * e)) & 0xFF for e in range(4)], -1)
    return torch.where(b > 127, b - 256, b) if signed else b


def mma_m16n8k32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """mma.sync.m16n8k32.row.col.s32.u8.s8 over one warp, with the PTX fragment layouts: a [32 lanes, 4 regs]
    (u8), b [32, 2] (s8) -> c [32, 4] (s32). Lane = 4 g + c. A: reg r, byte e at row g + 8 (r & 1), column
    4 c + e + 16 (r >> 1). B: reg r, byte e at row (k) 4 c + e + 16 r, column g. C: c[q] at row g + 8 (q >> 1),
    column 2 c + (q & 1)."""
    A = torch.zeros(16, 32, dtype=torch.int64)
    B = torch.zeros(32, 8, dtype=torch.int64)
    ab, bb = bytes_of(a), bytes_of(b, signed=True)
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for e in range(4):
            for r in range(4):
                A[g + 8 * (r & 1), 4 * c + e + 16 * (r >> 1)] = ab[lane, r, e]
            for r in range(2):
                B[4 * c + e + 16 * r, g] = bb[lane, r, e]
    C = A @ B
    out = torch.zeros(32, 4, dtype=torch.int64)
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for q in range(4):
            out[lane, q] = C[g + 8 * (q >> 1), 2 * c + (q & 1)]
    return out


def lane_words(p: torch.Tensor, t: int, kb: int) -> torch.Tensor:
    """The four words of each lane's 16-byte load of tile t, k-block kb: [32 lanes, 4] int64."""
    return p[t, kb * 128:(kb + 1) * 128].reshape(32, 4).to(torch.int64) & M32


def test_registers_1_and_3_hold_rows_g_plus_8():
    # rows 0-7 of the tile -1 (code 0), rows 8-15 +1 (code 2): only registers 1 and 3 may be non-zero
    w = torch.cat([-torch.ones(8, 128, dtype=torch.int8), torch.ones(8, 128, dtype=torch.int8)])
    words = lane_words(ops.repack(w), 0, 0)
    for i in range(4):
        f = bytes_of(a8_frag(words[:, i]))
        assert (f[:, 0] == 0).all() and (f[:, 2] == 0).all(), f"word {i}: rows g"
        assert (f[:, 1] == 2).all() and (f[:, 3] == 2).all(), f"word {i}: rows g + 8"
        r4 = bytes_of(a8_frag_r4(words[:, i]))
        assert (r4[:, 1] == 8).all() and (r4[:, 3] == 8).all() and (r4[:, 0] == 0).all() and (r4[:, 2] == 0).all()


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(N=st.integers(1, 40), K=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_rows4_fragments_are_the_plain_ones_times_4_on_rows_g8(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    p = ops.repack(torch.randint(-1, 2, (N, K), generator=g, dtype=torch.int8))
    w = p.reshape(-1).to(torch.int64) & M32  # every word of every lane, padding included
    plain, r4 = a8_frag(w), a8_frag_r4(w)
    assert torch.equal(r4[:, 0], plain[:, 0]) and torch.equal(r4[:, 2], plain[:, 2])
    assert torch.equal(r4[:, 1], 4 * plain[:, 1]) and torch.equal(r4[:, 3], 4 * plain[:, 3])  # no carry
    assert int(bytes_of(r4).max()) <= 8  # u8 operands, codes <= 2


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**16), kblocks=st.integers(1, 3))
def test_rows4_mma_with_the_fix_equals_the_plain_mma(seed, kblocks):
    gen = torch.Generator().manual_seed(seed)
    p = ops.repack(torch.randint(-1, 2, (16, 128 * kblocks), generator=gen, dtype=torch.int8))
    acc_plain = torch.zeros(32, 4, dtype=torch.int64)
    acc_r4 = torch.zeros(32, 4, dtype=torch.int64)
    for kb in range(kblocks):
        words = lane_words(p, 0, kb)
        for i in range(4):  # one mma per word, as the kernels do, with random int8 activations
            b = torch.randint(0, 2**32, (32, 2), generator=gen, dtype=torch.int64)
            acc_plain += mma_m16n8k32(a8_frag(words[:, i]), b)
            acc_r4 += mma_m16n8k32(a8_frag_r4(words[:, i]), b)
    assert torch.equal(acc_r4[:, :2], acc_plain[:, :2])  # rows g unchanged
    assert torch.equal(acc_r4[:, 2:] % 4, torch.zeros_like(acc_r4[:, 2:]))  # rows g + 8: multiples of 4
    fixed = acc_r4.clone()
    fixed[:, 2:] = fixed[:, 2:] >> 2  # a8_rows4_fix: arithmetic shift, exact on multiples of 4 (negatives too)
    assert torch.equal(fixed, acc_plain)
    assert (acc_plain < 0).any()  # the negative case is exercised


def test_the_kernel_source_is_what_is_emulated():
    """The CUDA functions hold the arithmetic emulated above (a guard against the two drifting apart)."""
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "csrc" / "ternary_gemm.cu").read_text()
    body = re.search(r"void a8_frag_r4\(uint32_t w, uint32_t \(&af\)\[4\]\) \{(.*?)\n\}", src, re.S).group(1)
    assert [" ".join(s.split()) for s in body.strip().split("\n")] == [
        "const uint32_t t = w >> 4;", "af[0] = w & 0x03030303u;", "af[1] = w & 0x0c0c0c0cu;",
        "af[2] = t & 0x03030303u;", "af[3] = t & 0x0c0c0c0cu;"]
    fix = re.search(r"void a8_rows4_fix\(int \(&acc\)\[4\]\) \{(.*?)\n\}", src, re.S).group(1)
    assert " ".join(fix.split()) == "acc[2] >>= 2; acc[3] >>= 2;"
    # every use of the scaled fragments is paired with the division: the GEMV's epilogue and the chain's flush
    assert src.count("a8_frag_r4(") == 3  # definition, a8_frag_w<false>, chain_kernel
    assert src.count("a8_rows4_fix(") == 3  # definition, a8_small_kernel's epilogue, chain_kernel's flush
    assert "a8_rows4_fix(acc[t])" in src and "a8_rows4_fix(acc);" in src
