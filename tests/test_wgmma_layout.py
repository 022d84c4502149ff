"""CPU model of the a8 GEMM kernel's two main loops (csrc/ternary_gemm.cu a8_gemm_kernel), at the
level of bytes and fragment layouts, against the integer reference. No GPU: it checks the index
algebra the wgmma loop (TRIT_A8_GEMM_WG) rests on before a GPU ever runs it:

* the packed weight layout (trit.ops docstring) + a8_frag give the m16n8k32 A fragments, and the
  plain quantizer byte order + the mma.sync loop's x loads give its B fragments: modelled
  here, this must reproduce sum_k (W + 1) * xq exactly (it does on the GPU: the mma.sync loop is
  bit-identical to the reference there), which validates the model itself;
* CUTLASS's register-A layout for 8-bit wgmma (ALayout_64x32, decoded literally from its shape and
  stride) is, per warp, the m16n8k32 A fragment layout: the same decoded weight words feed it;
* the wgmma byte order of quant_rows_perm_kernel<T, true>, the cp.async placement into the
  128-byte swizzle and the hardware's swizzled descriptor reads (k-step i at +32 B) give the
  wgmma the same x byte for every (k, row) as the mma.sync loop gives its lanes;
* CUTLASS's accumulator layout (CLayout_64xN) is what the kernel's epilogue writes to s_acc.
"""
import torch

from trit import ops

PERM = [0, 4, 1, 5, 2, 6, 3, 7]  # quantizer: group byte t holds input 8G + PERM[t]


def cute_index(coord, stride):
    return sum(c * s for c, s in zip(coord, stride))


def alayout_64x32(warp: int, lane: int, reg: int, byte: int) -> tuple[int, int]:
    """CUTLASS GMMA::ALayout_64x32: Shape ((4,8,4),(4,2,2)), Stride ((256,1,16),(64,8,1024)) over a
    64 x 32 (m, k) column-major tile; thread = (lane % 4, lane // 4, warp), value = (byte, v1, v2),
    register = value // 4."""
    t = (lane % 4, lane // 4, warp)
    v1, v2 = reg % 2, reg // 2
    idx = cute_index(t, (256, 1, 16)) + cute_index((byte, v1, v2), (64, 8, 1024))
    return idx % 64, idx // 64


def clayout_64xn(warp: int, lane: int, val: int) -> tuple[int, int]:
    """CUTLASS GMMA::CLayout_64xN: Shape ((4,8,4),(2,2,N/8)), Stride ((128,1,16),(64,8,512))."""
    t = (lane % 4, lane // 4, warp)
    v = (val % 2, (val // 2) % 2, val // 4)
    idx = cute_index(t, (128, 1, 16)) + cute_index(v, (64, 8, 512))
    return idx % 64, idx // 64


def mma_a_m16n8k32(lane: int, reg: int, byte: int) -> tuple[int, int]:
    """PTX mma.m16n8k32 .u8 A fragment: a0 / a1 rows g / g + 8 at k 4c + byte, a2 / a3 at k + 16."""
    g, c = lane // 4, lane % 4
    return g + 8 * (reg % 2), 4 * c + byte + 16 * (reg // 2)


def test_wgmma_register_a_layout_is_the_mma_a_fragment_per_warp():
    for warp in range(4):
        for lane in range(32):
            for reg in range(4):
                for byte in range(4):
                    m, k = alayout_64x32(warp, lane, reg, byte)
                    mm, kk = mma_a_m16n8k32(lane, reg, byte)
                    assert (m, k) == (16 * warp + mm, kk)


def test_epilogue_writes_the_cutlass_accumulator_layout():
    for n_rows in (64, 128):
        for warp in range(4):
            for lane in range(32):
                g, c = lane // 4, lane % 4
                for val in range(n_rows // 2):
                    m, n = clayout_64xn(warp, lane, val)
                    j, q = val // 4, val % 4
                    # a8_gemm_kernel: s_acc[(8j + 2c + (q & 1)) * kLd + warp * 16 + g + 8 * (q >> 1)] = accw[4j + q]
                    assert (n, m) == (8 * j + 2 * c + (q & 1), 16 * warp + g + 8 * (q >> 1))


def model(N=64, K=256, T=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-1, 2, (N, K), generator=gen, dtype=torch.int8)
    packed = ops.repack(w).to(torch.int64) & 0xFFFFFFFF
    x = torch.randn(T, K, generator=gen)
    xq, _ = ops.act_quant_a8_ref(x)
    xq = xq.to(torch.int64)
    KB = K // 128
    # plain quantizer order: byte p of a k-block row holds input 8 (p // 8) + PERM[p % 8]
    src = torch.tensor([8 * (p // 8) + PERM[p % 8] for p in range(128)])
    Xp = torch.stack([xq[:, kb * 128 + src] for kb in range(KB)], 1)  # [T, KB, 128]
    # the wgmma byte order: group G = 4c + i -> bytes 32i + 4c (first half), 32i + 16 + 4c (second)
    wg_src = torch.empty(128, dtype=torch.long)
    for G in range(16):
        c, i = G >> 2, G & 3
        for t in range(8):
            wg_src[32 * i + 16 * (t >> 2) + 4 * c + (t & 3)] = 8 * G + t
    Xw = Xp[:, :, wg_src]
    return w, packed, xq, Xp, Xw


def a_codes(packed, t, kb, i):
    """[16 rows, 32 k] codes (w + 1) of tile t, k-block kb, k-step i, as a8_frag decodes each lane's
    word i and the m16n8k32 A layout places them."""
    A = torch.full((16, 32), -99, dtype=torch.int64)
    for lane in range(32):
        word = int(packed[t, kb * 128 + lane * 4 + i])
        for reg in range(4):
            for byte in range(4):
                m, k = mma_a_m16n8k32(lane, reg, byte)
                A[m, k] = (word >> (8 * byte + 2 * reg)) & 3
    assert (A >= 0).all()
    return A


def b_mma(Xp, kb, i):
    """[32 k, T] the x bytes the mma.sync loop's lanes load for k-step i: b0 of lane (g, c) = bytes
    32c + 8i .. + 3 of row g (k = 4c ..), b1 = the 4 after them (k = 16 + 4c ..)."""
    T = Xp.shape[0]
    B = torch.empty(32, T, dtype=torch.int64)
    for c in range(4):
        for bb in range(4):
            B[4 * c + bb] = Xp[:, kb, 32 * c + 8 * i + bb]
            B[16 + 4 * c + bb] = Xp[:, kb, 32 * c + 8 * i + 4 + bb]
    return B


def b_wgmma(Xw, kb, i):
    """[32 k, T] what wgmma reads through the K-major 128-byte-swizzle descriptor at start +32i:
    the tile as cp.async placed it (chunk ch of row r at chunk ch ^ (r % 8), 1024-byte-aligned
    atoms of 8 rows), read back through the hardware's address swizzle (bits 4-6 ^= bits 7-9)."""
    T = Xw.shape[0]
    smem = torch.full((T * 128,), -999, dtype=torch.int64)
    for r in range(T):
        for ch in range(8):
            off = r * 128 + ((ch ^ (r & 7)) << 4)
            smem[off:off + 16] = Xw[r, kb, ch * 16:(ch + 1) * 16]
    B = torch.empty(32, T, dtype=torch.int64)
    for n in range(T):
        for k in range(32):
            u = 32 * i + (n // 8) * 1024 + (n % 8) * 128 + k  # SBO = 1024 between 8-row atoms
            p = u ^ (((u >> 7) & 7) << 4)
            B[k, n] = smem[p]
    assert (B > -999).all()
    return B


def test_both_loops_match_the_integer_reference():
    N, K, T = 64, 256, 64
    w, packed, xq, Xp, Xw = model(N, K, T)
    ref = (w.to(torch.int64) + 1) @ xq.t()  # [N, T]: codes x quantized inputs (rowsum removed later)
    acc_mma = torch.zeros(N, T, dtype=torch.int64)
    acc_wg = torch.zeros(N, T, dtype=torch.int64)
    for kb in range(K // 128):
        for i in range(4):
            Bm, Bw = b_mma(Xp, kb, i), b_wgmma(Xw, kb, i)
            assert torch.equal(Bw, Bm), f"wgmma x operand differs from the mma.sync loop's at kb={kb} i={i}"
            for t in range(N // 16):
                A = a_codes(packed, t, kb, i)
                acc_mma[16 * t:16 * t + 16] += A @ Bm
                acc_wg[16 * t:16 * t + 16] += A @ Bw
    assert torch.equal(acc_mma, ref)
    assert torch.equal(acc_wg, ref)


def test_a_wrong_swizzle_or_byte_order_is_caught():
    """The model is not vacuous: the plain byte order, or no swizzle on the write side, breaks it."""
    _, _, _, Xp, Xw = model(16, 128, 16, seed=1)
    assert not torch.equal(b_wgmma(Xp, 0, 1), b_mma(Xp, 0, 1))  # quantizer without the wgmma order
    T = Xw.shape[0]
    flat = Xw[:, 0, :].reshape(-1)  # unswizzled placement, swizzled read
    B = torch.empty(32, T, dtype=torch.int64)
    for n in range(T):
        for k in range(32):
            u = 32 * 2 + n * 128 + k
            B[k, n] = flat[u ^ (((u >> 7) & 7) << 4)]
    assert not torch.equal(B, b_mma(Xp, 0, 2))
