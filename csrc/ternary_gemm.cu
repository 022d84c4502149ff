// Ternary (W in {-1,0,+1}, 2-bit packed) linear kernels. Plain CUDA: no torch headers, so
// CI can compile this file alone with nvcc on a machine without a CUDA torch.
//
// Kernels
//   tmm_kernel<T, MT, WN>   fused dequant + mma.sync (bf16/fp16 tensor cores, fp32 accumulate)
//                           for any M; the small/medium-M workhorse. fp32 x runs as three
//                           bf16 pieces (hi + mid + lo) so its products stay fp32-exact.
//   a8_kernel<T, MT, WN>    W1.58A8: int8 activations (per-row absmax) x 2-bit weights on
//                           mma.m16n8k32 u8.s8 -> s32.
//   quant_rows_kernel<T>    the a8 activation quantizer (one CTA per row).
//   tmm_small_kernel<T>     v5, M <= 8, bf16/fp16 x (K % 8 == 0, 16-byte aligned x): the
//                           small-M fused kernel with per-k-block overhead cut.
//   a8_small_kernel<T, MT, WN, ...>  v5 W1.58A8 for M <= 8 * MT (MT = 1, 2, 4, 8), fed by
//                           quant_rows_perm_kernel<T> (xq permuted within groups of 8 so the mma
//                           B registers need no PRMT; k-block-major for MT >= 2), or quantizing x
//                           itself (kFuseQ).
//                           kBP: the same kernel reading the bitplane layout (ternary.h; trit_mm_a8_bp, M <= 32).
//   M <= 8 (fp) / 32-64 (a8, see a8_v5) goes to the v5 kernels (TRIT_KERNEL=v4 in the
//   environment: the v4 kernels), launched with programmatic dependent launch (TRIT_PDL) and an
//   L2 bulk prefetch (TRIT_L2PF): see Knobs.
//   a8_epilogue_kernel<T>   a8 at M >= 256: the scale/bias epilogue after int8 cuBLAS
//                           (bindings.cpp: quantizer + int8 decode + torch._int_mm + this).
//   naive_kernel<T>         one thread per output: the correctness anchor.
//   decode_kernel<T>        packed -> dense [N,K] (optionally x scale): the large-M path
//                           hands the result to cuBLAS.
// Packed layout: see ternary.h.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "a8_route.h"
#include "ternary.h"

namespace {

constexpr int kTileN = 16;    // output channels per packed row (one mma M dimension)
constexpr int kBlockK = 128;  // inputs per k-block: 32 lanes x 16 bytes = 16 x 128 weights

// ---------------------------------------------------------------- small helpers

// Weights are read exactly once: keep them out of L1 so x (re-read by every warp) stays.
__device__ __forceinline__ int4 ld_weights(const int4* p) {
  int4 v;
  asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <int I>
__device__ __forceinline__ uint32_t word_of(const int4& v) {
  return static_cast<uint32_t>(I == 0 ? v.x : I == 1 ? v.y : I == 2 ? v.z : v.w);
}

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---------------------------------------------------------------- weight decode
// One 32-bit word = 8 pairs p (bits 2p of each 16-bit half). A pair becomes one half2 register
// holding {q_lo - 1, q_hi - 1}. Trick: OR the field into the mantissa of a magic number
// (bf16 128.0 = 0x4300, fp16 1024.0 = 0x6400) without shifting it down: the value is
// magic + q * 4^j for a field at bit 2j, exact; one FMA (x 4^-j, - (magic * 4^-j + 1)) then
// gives q - 1 exactly. bf16 has 7 mantissa bits -> 3 positions per shift; fp16 has 10 -> 5.
// Pair p feeds mma A register (p & 3) of k16 step (p >> 2): see the layout in ternary.h.
template <typename DT> struct Decode;

template <> struct Decode<__nv_bfloat16> {
  static __device__ __forceinline__ void run(uint32_t w, uint32_t (&o)[8]) {
    const uint32_t src[3] = {w, w >> 6, w >> 12};
    const uint32_t mul[3] = {0x3F803F80u, 0x3E803E80u, 0x3D803D80u};  // 1, 1/4, 1/16
    const uint32_t add[3] = {0xC301C301u, 0xC204C204u, 0xC110C110u};  // -129, -33, -9
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int j = p % 3;
      const uint32_t h = (src[p / 3] & (0x00030003u << (2 * j))) | 0x43004300u;
      o[p] = fma_bf16x2(h, mul[j], add[j]);
    }
  }
};

template <> struct Decode<__half> {
  static __device__ __forceinline__ void run(uint32_t w, uint32_t (&o)[8]) {
    const uint32_t src[2] = {w, w >> 10};
    // 1, 1/4, 1/16, 1/64, 1/256 and -1025, -257, -65, -17, -5
    const uint32_t mul[5] = {0x3C003C00u, 0x34003400u, 0x2C002C00u, 0x24002400u, 0x1C001C00u};
    const uint32_t add[5] = {0xE401E401u, 0xDC04DC04u, 0xD410D410u, 0xCC40CC40u, 0xC500C500u};
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int j = p < 5 ? p : p - 5;
      const uint32_t h = (src[p < 5 ? 0 : 1] & (0x00030003u << (2 * j))) | 0x64006400u;
      o[p] = fma_f16x2(h, mul[j], add[j]);
    }
  }
};

// ---------------------------------------------------------------- mma wrappers
template <typename DT> __device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t* a,
                                                                uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t* a,
                                                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t* a,
                                                             uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16832_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ---------------------------------------------------------------- Hopper warpgroup MMA (sm_90a only)
// wgmma.mma_async m64n64k32 u8 x s8 -> s32 with A (64 weight channels x 32 inputs) in registers:
// warp w of the warpgroup holds rows 16w .. 16w + 15 in exactly the layout of the m16n8k32 A
// fragment (a8_frag's output), and B (32 inputs x 64 x rows) comes from shared memory through a
// matrix descriptor: K-major, 128-byte swizzle (each x row's 128-byte k-block is one swizzle row,
// 8 rows = one 1024-byte atom; SBO = 1024 B between atoms, LBO unused), k-step i at +32 i bytes.
// D: d[4j + q] = (row 16w + g + 8 (q >> 1), column 8j + 2c + (q & 1)), the m16n8 C layout per 8
// columns. Compiled only for sm_90a (the `a` features); elsewhere the kernel traps, and the host
// selects it only when the extension says it was built for sm_90a (TRIT_HOST_SM90A, set by
// trit/ops.py with the arch list) on a compute capability 9.0 device (wgmma_supported()).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TRIT_WGMMA 1
#endif
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wgmma_fence() {
#ifdef TRIT_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef TRIT_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef TRIT_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// generic-proxy writes to shared memory (cp.async, st.shared) -> visible to wgmma's async proxy
__device__ __forceinline__ void fence_proxy_async_smem() {
#ifdef TRIT_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// keeps the compiler from moving accumulator accesses across the asynchronous wgmma (as CUTLASS's
// warpgroup_fence_operand)
template <int R>
__device__ __forceinline__ void wgmma_pin(int (&d)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) asm volatile("" : "+r"(d[r])::"memory");
}
__device__ __forceinline__ void wgmma_m64n64k32_u8s8(int (&d)[32], const uint32_t (&a)[4], uint64_t bdesc) {
#ifdef TRIT_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(1)
      : "memory");
#else
  __trap();
#endif
}

// N = 64 or 128 x rows: 128 as two m64n64k32 on the two 64-row halves of the x tile (8 atoms of
// 1024 B further), accumulators d[0, 32) and d[32, 64) (columns 0-63 and 64-127)
template <int N>
__device__ __forceinline__ void wgmma_u8s8(int (&d)[N / 2], const uint32_t (&a)[4], uint64_t bdesc) {
  static_assert(N == 64 || N == 128, "64 or 128 x rows");
  wgmma_m64n64k32_u8s8(*reinterpret_cast<int(*)[32]>(d), a, bdesc);
  if constexpr (N == 128) wgmma_m64n64k32_u8s8(*reinterpret_cast<int(*)[32]>(d + 32), a, bdesc + ((8 * 1024) >> 4));
}

// One packed word (16 weights of 2 bits, code = w + 1) -> the u8 A fragment of mma16832_u8s8:
// af[j] holds the codes at bits 2j of each byte (the a8 epilogue removes the +1 with rowsum).
__device__ __forceinline__ void a8_frag(uint32_t w, uint32_t (&af)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) af[j] = (w >> (2 * j)) & 0x03030303u;
}
// The same fragment with rows g + 8 at 4x their codes ("rows4"): af[1] / af[3] (rows g + 8, see the layout
// in csrc/ternary.h: bit pair j holds rs = j & 1) are masked where they sit instead of shifted down, so a word
// costs one shift and four ANDs instead of three shifts and four ANDs. The mma then accumulates 4x the true
// sums in the accumulators of rows g + 8 (acc[2], acc[3] of the m16n8 C layout); a8_rows4_fix divides them
// back - exactly, as every term is a multiple of 4 (codes <= 2, so a byte holds <= 8; |acc| <= 1024 K fits
// int32 far beyond any K here). The M <= 32 GEMV and the chain kernel are bound by instruction issue
// (H200 runs 32b / 34), which is what this is for.
__device__ __forceinline__ void a8_frag_r4(uint32_t w, uint32_t (&af)[4]) {
  const uint32_t t = w >> 4;
  af[0] = w & 0x03030303u;
  af[1] = w & 0x0c0c0c0cu;
  af[2] = t & 0x03030303u;
  af[3] = t & 0x0c0c0c0cu;
}
// accumulators of a8_frag_r4 fragments -> the true sums (rows g + 8 divided by 4; exact)
__device__ __forceinline__ void a8_rows4_fix(int (&acc)[4]) {
  acc[2] >>= 2;
  acc[3] >>= 2;
}

// ---------------------------------------------------------------- activation fragments
// XIn<T>: 8 consecutive inputs of one x row in raw form (loaded ahead of use), and their
// conversion to the mma B registers of two k16 steps: b[s][h][0..1] for split piece s, step h.
// Step h covers inputs k0 + 4h + {0,1} (b0) and k0 + 4h + {2,3} (b1): natural order.
template <typename T> struct XIn;

template <typename H> struct XInHalf {  // bf16 or fp16 activations: one piece, no conversion
  using DT = H;
  static constexpr int kPieces = 1;
  uint4 v;
  template <bool VEC>
  __device__ __forceinline__ void load(const H* row, int k0, int K) {
    if constexpr (VEC) {
      v = __ldg(reinterpret_cast<const uint4*>(row + k0));
    } else {
      uint32_t e[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        e[i] = (k0 + i < K) ? __ldg(reinterpret_cast<const unsigned short*>(row) + k0 + i) : 0u;
      v = make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16), e[6] | (e[7] << 16));
    }
  }
  __device__ __forceinline__ void frag(uint32_t (&b)[1][2][2]) const {
    b[0][0][0] = v.x; b[0][0][1] = v.y; b[0][1][0] = v.z; b[0][1][1] = v.w;
  }
};
template <> struct XIn<__nv_bfloat16> : XInHalf<__nv_bfloat16> {};
template <> struct XIn<__half> : XInHalf<__half> {};

// fp32 activations: x = hi + mid + lo, each piece bf16 (8 + 8 + 8 mantissa bits), so products
// with the exact +-1/0 weights are fp32-exact and the tensor core accumulates in fp32.
template <> struct XIn<float> {
  using DT = __nv_bfloat16;
  static constexpr int kPieces = 3;
  float4 u, w;
  template <bool VEC>
  __device__ __forceinline__ void load(const float* row, int k0, int K) {
    if constexpr (VEC) {
      u = __ldg(reinterpret_cast<const float4*>(row + k0));
      w = __ldg(reinterpret_cast<const float4*>(row + k0 + 4));
    } else {
      float e[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = (k0 + i < K) ? __ldg(row + k0 + i) : 0.f;
      u = make_float4(e[0], e[1], e[2], e[3]);
      w = make_float4(e[4], e[5], e[6], e[7]);
    }
  }
  __device__ __forceinline__ static uint32_t pack(float a, float c) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, c);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ __forceinline__ void frag(uint32_t (&b)[3][2][2]) const {
    float e[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      float p[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        p[i] = __bfloat162float(__float2bfloat16_rn(e[i]));
        e[i] -= p[i];  // exact: the remainder of a round-to-nearest is representable
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        b[s][h][0] = pack(p[4 * h + 0], p[4 * h + 1]);
        b[s][h][1] = pack(p[4 * h + 2], p[4 * h + 3]);
      }
    }
  }
};

// ---------------------------------------------------------------- kernel shape parameters
// MT: 8-row column tiles of x per warp (M <= 8*MT per grid row), WN: 16-row packed tiles per
// warp. kU k-blocks form a chunk; chunk n+1's weights are loaded while chunk n computes
// (register double buffer), so each warp keeps 2*kU*WN 16-byte loads in flight.
template <int MT> struct Shape {
  static constexpr int kMaxThreads = MT == 1 ? 512 : 256;
  static constexpr int kU = MT <= 2 ? 4 : 2;
};
// x of k-block u+1 is loaded while k-block u computes when the registers allow it.
// (fp32 x never: its split into three bf16 pieces already needs the registers.)
template <typename T, int MT> struct XPrefetch {
  static constexpr bool value = sizeof(T) == 2 && MT == 1;
};

template <int WN, int KU>
__device__ __forceinline__ void load_chunk(int4 (&a)[KU][WN], const int4* const (&wtile)[WN], int kb,
                                           int kb_end) {
#pragma unroll
  for (int u = 0; u < KU; ++u)
#pragma unroll
    for (int wn = 0; wn < WN; ++wn)
      a[u][wn] = (kb + u < kb_end) ? ld_weights(wtile[wn] + (size_t)(kb + u) * 32) : make_int4(0, 0, 0, 0);
}

// ---------------------------------------------------------------- epilogues (all kernels)
// y[m, n] from an output's accumulated sum v. fp: v is the dot product. a8: the kernels multiply
// the codes q = w + 1 with xq, so v = sum_k w xq + sum_k xq and the row sum comes off.
// The a8 output before the bias: v = the exact int32 sum with the row's code sum already off,
// / xs (the row's quantizer scale), * the channel scale - each op rounded on its own. Every a8 route
// (store_out, the GEMM kernel's epilogue, a8_epilogue_kernel after int8 cuBLAS) uses it: bit-identical.
__device__ __forceinline__ float a8_value(int v, float xs, float scale) { return __fmul_rn((float)v / xs, scale); }

template <typename T, bool kA8, typename Acc>
__device__ __forceinline__ void store_out(Acc v, int m, int n, int N, const float* __restrict__ scale,
                                          const T* __restrict__ bias, T* __restrict__ y, const float* xs,
                                          const int32_t* rowsum) {
  float o;
  if constexpr (kA8) {
    o = a8_value(v - rowsum[m], xs[m], scale[n]);
  } else {
    o = __fmul_rn(v, scale[n]);
  }
  // __fmul_rn / __fadd_rn: never contracted into an FMA, so y rounds as torch's unfused ops do
  if (bias != nullptr) o = __fadd_rn(o, to_f32<T>(bias[n]));
  y[(size_t)m * N + n] = from_f32<T>(o);
}

// v4 kernels: split-K reduction over the KS warps of each nw through shared memory, in a fixed
// order (deterministic), then the scaled store. red: [NW][KS][WN][MT][4][32] accumulators.
template <typename T, bool kA8, int WN, int MT, int kChains, typename Acc>
__device__ __forceinline__ void tile_epilogue(const Acc (&acc)[kChains][WN][MT][4], Acc* red, int m0, int M, int N,
                                              int n_tiles, const float* __restrict__ scale,
                                              const T* __restrict__ bias, T* __restrict__ y, const float* xs,
                                              const int32_t* rowsum) {
  const int lane = threadIdx.x & 31, kw = threadIdx.x >> 5, KS = blockDim.x >> 5;
  const int nw = threadIdx.y, NW = blockDim.y;
  constexpr int kSlots = WN * MT * 4 * 32;
  Acc* mine = red + (nw * KS) * kSlots;
#pragma unroll
  for (int wn = 0; wn < WN; ++wn)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        Acc v = acc[0][wn][mt][r];
#pragma unroll
        for (int q = 1; q < kChains; ++q) v += acc[q][wn][mt][r];
        mine[kw * kSlots + ((wn * MT + mt) * 4 + r) * 32 + lane] = v;
      }
  __syncthreads();
  const int tn0 = blockIdx.x * NW * WN;
  for (int s = threadIdx.y * blockDim.x + threadIdx.x; s < NW * kSlots; s += blockDim.x * blockDim.y) {
    const int q = s / kSlots, sl = s % kSlots;  // q: which nw
    Acc v = 0;
    for (int w = 0; w < KS; ++w) v += red[(q * KS + w) * kSlots + sl];
    const int ln = sl & 31, r = (sl >> 5) & 3, mt = (sl >> 7) % MT, wn = (sl >> 7) / MT;
    const int tile = tn0 + q * WN + wn;
    const int n = tile * kTileN + (ln >> 2) + 8 * (r >> 1);
    const int m = m0 + mt * 8 + 2 * (ln & 3) + (r & 1);
    if (tile < n_tiles && n < N && m < M) store_out<T, kA8>(v, m, n, N, scale, bias, y, xs, rowsum);
  }
}

// ---------------------------------------------------------------- fused GEMM (fp activations)
// Grid: x = groups of NW*WN packed rows, y = chunks of 8*MT activation rows.
// Block: (32*KS, NW): warp (kw, nw) owns packed rows t0 + nw*WN .. and the kw-th of KS equal
// slices of the k-blocks (split-K inside the CTA, reduced deterministically through shared
// memory at the end: no atomics). The NW warps of a CTA read the same x slices at about the
// same time, so x comes from L1 rather than L2 for all but one of them.
template <typename T, int MT, int WN>
__global__ void __launch_bounds__(Shape<MT>::kMaxThreads)
    tmm_kernel(const T* __restrict__ x, const int4* __restrict__ wp, const float* __restrict__ scale,
               const T* __restrict__ bias, T* __restrict__ y, int M, int N, int K, int KB, int n_tiles,
               bool x_vec) {
  using In = XIn<T>;
  using DT = typename In::DT;
  constexpr int kU = Shape<MT>::kU;
  constexpr bool kPre = XPrefetch<T, MT>::value;
  extern __shared__ float red[];  // [NW][KS][WN][MT][4][32]
  const int lane = threadIdx.x & 31, kw = threadIdx.x >> 5, KS = blockDim.x >> 5;
  const int nw = threadIdx.y, NW = blockDim.y;
  const int g = lane >> 2, c = lane & 3;
  const int t0 = (blockIdx.x * NW + nw) * WN;
  const int m0 = blockIdx.y * (8 * MT);
  const int kb_begin = (KB * kw) / KS, kb_end = (KB * (kw + 1)) / KS;

  // M <= 8 has one 16x8 accumulator per warp: split it into kChains independent chains so
  // consecutive mma do not wait on each other (summed before the reduction).
  constexpr int kChains = 1;  // 2 measured slower at M=1 (117 vs 102 registers): kept as a knob
  float acc[kChains][WN][MT][4];
#pragma unroll
  for (int q = 0; q < kChains; ++q)
#pragma unroll
    for (int a = 0; a < WN; ++a)
#pragma unroll
      for (int b = 0; b < MT; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[q][a][b][r] = 0.f;

  // Rows past M read row M-1 instead: mma column g only feeds output column g, which the
  // epilogue drops for m >= M, so no zero-fill (and no divergent branch) is needed.
  const T* xrow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xrow[mt] = x + (size_t)min(m0 + mt * 8 + g, M - 1) * K;
  const int4* wtile[WN];
#pragma unroll
  for (int wn = 0; wn < WN; ++wn) wtile[wn] = wp + (size_t)min(t0 + wn, n_tiles - 1) * KB * 32 + lane;

  // x of one k-block: MT tiles x 4 words
  // one uniform branch per k-block: aligned full blocks take the 16-byte path
  auto load_x = [&](In (&xi)[MT][4], int kb) {
    const int kblk = kb * kBlockK;
    if (x_vec && (kblk + kBlockK <= K)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) xi[mt][i].template load<true>(xrow[mt], kblk + c * 32 + 8 * i, K);
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) xi[mt][i].template load<false>(xrow[mt], kblk + c * 32 + 8 * i, K);
    }
  };
  auto compute_word = [&](const int4 (&a)[WN], int i, const In (&xi)[MT]) {
    uint32_t af[WN][8];
#pragma unroll
    for (int wn = 0; wn < WN; ++wn) {
      const uint32_t w = i == 0 ? word_of<0>(a[wn]) : i == 1 ? word_of<1>(a[wn]) : i == 2 ? word_of<2>(a[wn])
                                                                                            : word_of<3>(a[wn]);
      Decode<DT>::run(w, af[wn]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t b[In::kPieces][2][2];
      xi[mt].frag(b);
#pragma unroll
      for (int wn = 0; wn < WN; ++wn)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int s = 0; s < In::kPieces; ++s)
            mma16816<DT>(acc[kChains == 1 ? 0 : h % kChains][wn][mt], &af[wn][4 * h], b[s][h][0],
                         b[s][h][1]);
    }
  };
  auto process_chunk = [&](const int4 (&a)[kU][WN], int kb) {
    if constexpr (kPre) {
      In xi[2][MT][4];
      load_x(xi[0], kb);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kb + u >= kb_end) break;
        if (u + 1 < kU && kb + u + 1 < kb_end) load_x(xi[(u + 1) & 1], kb + u + 1);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          In xw[MT];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) xw[mt] = xi[u & 1][mt][i];
          compute_word(a[u], i, xw);
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kb + u >= kb_end) break;
        const int kblk = (kb + u) * kBlockK;
        if (x_vec && (kblk + kBlockK <= K)) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            In xw[MT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) xw[mt].template load<true>(xrow[mt], kblk + c * 32 + 8 * i, K);
            compute_word(a[u], i, xw);
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            In xw[MT];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) xw[mt].template load<false>(xrow[mt], kblk + c * 32 + 8 * i, K);
            compute_word(a[u], i, xw);
          }
        }
      }
    }
  };

  int4 a0[kU][WN], a1[kU][WN];
  load_chunk<WN, kU>(a0, wtile, kb_begin, kb_end);
  for (int kb = kb_begin; kb < kb_end; kb += 2 * kU) {
    load_chunk<WN, kU>(a1, wtile, kb + kU, kb_end);
    process_chunk(a0, kb);
    if (kb + kU >= kb_end) break;
    load_chunk<WN, kU>(a0, wtile, kb + 2 * kU, kb_end);
    process_chunk(a1, kb + kU);
  }

  tile_epilogue<T, false, WN, MT, kChains>(acc, red, m0, M, N, n_tiles, scale, bias, y, nullptr, nullptr);
}

// Programmatic dependent launch (Hopper): a kernel launched with programmatic stream
// serialization (launch_ex, pdl = true) may start while its predecessor in the stream is still
// running. It may read only what no earlier kernel writes (the packed weights, scales, bias)
// before pdl_wait(), which returns once every predecessor grid has finished and its memory is
// visible. Without the launch attribute pdl_wait() returns at once. pdl_trigger() lets this
// kernel's own dependents start launching (they still pdl_wait() for its completion).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---------------------------------------------------------------- W1.58A8
// Activation quantizer, exactly BitNet's: xs = 127 / max(|x_row|).clamp(min=1e-5),
// xq = rint(x * xs).clamp(-128, 127) in fp32. Also the row sum of xq, because the GEMM
// multiplies by the raw codes q = w + 1 (unsigned) and subtracts sum(xq) at the end.
template <typename T>
__global__ void __launch_bounds__(256) quant_rows_kernel(const T* __restrict__ x,
                                                         int8_t* __restrict__ xq,
                                                         float* __restrict__ xs_out,
                                                         int32_t* __restrict__ rowsum, int K,
                                                         int Kp) {
  __shared__ float sh_f[8];
  __shared__ int sh_i[8];
  const int m = blockIdx.x;
  const T* row = x + (size_t)m * K;
  float amax = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(to_f32<T>(row[k])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) sh_f[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = sh_f[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w) amax = fmaxf(amax, sh_f[w]);
  // torch evaluates `127 / t` as reciprocal(t) * 127: do the same, bit for bit
  const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;
  int sum = 0;
  for (int k = threadIdx.x; k < Kp; k += blockDim.x) {
    int q = 0;
    if (k < K) q = (int)fminf(fmaxf(rintf(to_f32<T>(row[k]) * xs), -128.f), 127.f);
    xq[(size_t)m * Kp + k] = (int8_t)q;
    sum += q;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) sh_i[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += sh_i[w];
    rowsum[m] = s;
    xs_out[m] = xs;
  }
}

// Word i of a lane as mma.m16n8k32 A: quad j = bits {2j, 8+2j, 16+2j, 24+2j} = register j.
// Register j covers row g + 8*(j & 1), inputs k0 + {0,4,1,5} (j < 2) or k0 + {2,6,3,7}: B
// (int8 x, natural order in memory) is permuted to match with two byte permutes.
// Same grid/block/pipeline as tmm_kernel; x here is the quantized xq [M, KB*128] (padded).
template <typename T, int MT, int WN>
__global__ void __launch_bounds__(Shape<MT>::kMaxThreads)
    a8_kernel(const int8_t* __restrict__ xq, const float* __restrict__ xs, const int32_t* __restrict__ rowsum,
              const int4* __restrict__ wp, const float* __restrict__ scale, const T* __restrict__ bias,
              T* __restrict__ y, int M, int N, int KB, int n_tiles) {
  constexpr int kU = Shape<MT>::kU;
  extern __shared__ int redi[];
  const int lane = threadIdx.x & 31, kw = threadIdx.x >> 5, KS = blockDim.x >> 5;
  const int nw = threadIdx.y, NW = blockDim.y;
  const int g = lane >> 2, c = lane & 3;
  const int t0 = (blockIdx.x * NW + nw) * WN;
  const int m0 = blockIdx.y * (8 * MT);
  const int kb_begin = (KB * kw) / KS, kb_end = (KB * (kw + 1)) / KS;
  const int Kp = KB * kBlockK;

  constexpr int kChains = 1;  // independent mma chains knob, as in tmm_kernel
  int acc[kChains][WN][MT][4];
#pragma unroll
  for (int q = 0; q < kChains; ++q)
#pragma unroll
    for (int a = 0; a < WN; ++a)
#pragma unroll
      for (int b = 0; b < MT; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[q][a][b][r] = 0;

  const int8_t* xrow[MT];  // rows past M read row M-1: their output columns are dropped
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xrow[mt] = xq + (size_t)min(m0 + mt * 8 + g, M - 1) * Kp;
  const int4* wtile[WN];
#pragma unroll
  for (int wn = 0; wn < WN; ++wn) wtile[wn] = wp + (size_t)min(t0 + wn, n_tiles - 1) * KB * 32 + lane;

  auto load_x = [&](uint4 (&xv)[MT][2], int kb) {
    const int kbase = kb * kBlockK + c * 32;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      xv[mt][0] = __ldg(reinterpret_cast<const uint4*>(xrow[mt] + kbase));
      xv[mt][1] = __ldg(reinterpret_cast<const uint4*>(xrow[mt] + kbase + 16));
    }
  };
  auto compute_block = [&](const int4 (&a)[WN], const uint4 (&xv)[MT][2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t af[WN][4];
#pragma unroll
      for (int wn = 0; wn < WN; ++wn) {
        const uint32_t w = i == 0 ? word_of<0>(a[wn]) : i == 1 ? word_of<1>(a[wn]) : i == 2 ? word_of<2>(a[wn])
                                                                                              : word_of<3>(a[wn]);
        a8_frag(w, af[wn]);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4& v = xv[mt][i >> 1];
        const uint32_t lo = (i & 1) ? v.z : v.x, hi = (i & 1) ? v.w : v.y;
        const uint32_t b0 = __byte_perm(lo, hi, 0x5140), b1 = __byte_perm(lo, hi, 0x7362);
#pragma unroll
        for (int wn = 0; wn < WN; ++wn) mma16832_u8s8(acc[(i & 1) % kChains][wn][mt], af[wn], b0, b1);
      }
    }
  };
  auto process_chunk = [&](const int4 (&a)[kU][WN], int kb) {
    if constexpr (MT <= 2) {  // x of k-block u+1 in flight while u computes
      uint4 xv[2][MT][2];
      load_x(xv[0], kb);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kb + u >= kb_end) break;
        if (u + 1 < kU && kb + u + 1 < kb_end) load_x(xv[(u + 1) & 1], kb + u + 1);
        compute_block(a[u], xv[u & 1]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (kb + u >= kb_end) break;
        uint4 xv[MT][2];
        load_x(xv, kb + u);
        compute_block(a[u], xv);
      }
    }
  };

  int4 a0[kU][WN], a1[kU][WN];
  load_chunk<WN, kU>(a0, wtile, kb_begin, kb_end);
  pdl_wait();  // launched with PDL (TRIT_A8_V4Q): the first weights are in flight, xq comes from the quantizer
  for (int kb = kb_begin; kb < kb_end; kb += 2 * kU) {
    load_chunk<WN, kU>(a1, wtile, kb + kU, kb_end);
    process_chunk(a0, kb);
    if (kb + kU >= kb_end) break;
    load_chunk<WN, kU>(a0, wtile, kb + 2 * kU, kb_end);
    process_chunk(a1, kb + kU);
  }

  tile_epilogue<T, true, WN, MT, kChains>(acc, redi, m0, M, N, n_tiles, scale, bias, y, xs, rowsum);
}

// ---------------------------------------------------------------- v5: small M (M <= 32 / 64)
// One 16-row weight tile per warp (WN = 1) against MT 8-row tiles of x: bf16/fp16 x with MT = 1
// (M <= 8), W1.58A8 with MT = 1, 2, 4, 8 (M <= 8, 16, 32, 64).
// Differences from the v4 kernels above (which stay, selectable with TRIT_KERNEL=v4, and serve
// fp32 x, misaligned x and larger M):
//   - the hot loop runs over whole chunks of kV5U k-blocks only: no per-k-block bounds or
//     vector-path predicates, one uniform predicate per chunk for the next chunk's loads;
//     the remaining < kV5U full k-blocks and the partial last k-block (K % 128 != 0) are handled
//     once, after the loop;
//   - x and weight addresses are two pointers bumped once per k-block (immediate offsets inside
//     a chunk): no 64-bit multiply per load;
//   - bf16/fp16 decode: the magic constant lives in a register so each pair is one LOP3
//     ((w & field) | magic) + one HFMA2 (ptxas split the C expression into two LOP3s in v4);
//   - a8: xq is written by the quantizer pre-permuted within each group of 8 inputs, so the mma
//     B registers are two plain 32-bit words (no PRMT);
//   - __launch_bounds__(256, 3) at MT = 1: <= 80 registers, so >= 24 warps per SM (128 at MT >= 2);
//   - MT >= 2: NW tiles per CTA (warps along N) read the same x at the same time, so x comes
//     from L2 once per NW tiles and from L1 otherwise.
// Requires (checked by the dispatcher): bf16/fp16 x with K % 8 == 0 and 16-byte aligned rows.
constexpr int kV5U = 4;          // k-blocks per chunk: 4 x 16 B of weights per lane per chunk
constexpr int kV5Threads = 256;  // split-K warps per CTA <= 8
constexpr int kV5MinCtas = 3;    // 65536 / (256 * 3) -> register cap 80

// (a & b) | c with b an immediate and c a register: one LOP3 (0xEA = (F0 & CC) | AA)
template <uint32_t B>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(B), "r"(c));
  return d;
}

template <typename DT> struct DecodeV5;
template <> struct DecodeV5<__nv_bfloat16> {
  // same arithmetic as Decode<__nv_bfloat16> (bit-identical results); magic = 0x43004300
  static __device__ __forceinline__ void run(uint32_t w, uint32_t magic, uint32_t (&o)[8]) {
    const uint32_t src[3] = {w, w >> 6, w >> 12};
    const uint32_t mul[3] = {0x3F803F80u, 0x3E803E80u, 0x3D803D80u};  // 1, 1/4, 1/16
    const uint32_t add[3] = {0xC301C301u, 0xC204C204u, 0xC110C110u};  // -129, -33, -9
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int j = p % 3;
      const uint32_t s = src[p / 3];
      const uint32_t h = j == 0 ? and_or<0x00030003u>(s, magic)
                                : j == 1 ? and_or<0x000C000Cu>(s, magic) : and_or<0x00300030u>(s, magic);
      o[p] = fma_bf16x2(h, mul[j], add[j]);
    }
  }
};
template <> struct DecodeV5<__half> {  // magic = 0x64006400
  static __device__ __forceinline__ void run(uint32_t w, uint32_t magic, uint32_t (&o)[8]) {
    const uint32_t src[2] = {w, w >> 10};
    const uint32_t mul[5] = {0x3C003C00u, 0x34003400u, 0x2C002C00u, 0x24002400u, 0x1C001C00u};
    const uint32_t add[5] = {0xE401E401u, 0xDC04DC04u, 0xD410D410u, 0xCC40CC40u, 0xC500C500u};
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int j = p < 5 ? p : p - 5;
      const uint32_t s = src[p < 5 ? 0 : 1];
      uint32_t h;
      switch (j) {
        case 0: h = and_or<0x00030003u>(s, magic); break;
        case 1: h = and_or<0x000C000Cu>(s, magic); break;
        case 2: h = and_or<0x00300030u>(s, magic); break;
        case 3: h = and_or<0x00C000C0u>(s, magic); break;
        default: h = and_or<0x03000300u>(s, magic); break;
      }
      o[p] = fma_f16x2(h, mul[j], add[j]);
    }
  }
};
template <typename DT> struct Magic;
template <> struct Magic<__nv_bfloat16> { static constexpr uint32_t value = 0x43004300u; };
template <> struct Magic<__half> { static constexpr uint32_t value = 0x64006400u; };

// A constant the compiler cannot fold into an instruction immediate (keeps it in a register).
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
  uint32_t r;
  asm volatile("mov.b32 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

// One instruction asks the memory system to stream a contiguous range into L2 (Hopper bulk
// prefetch; a hint: no register or smem cost, no effect on results). bytes % 16 == 0, p 16-aligned.
__device__ __forceinline__ void l2_prefetch(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
constexpr int kFlagL2Prefetch = 1;  // small-M kernels: prefetch the warp's weight range to L2 first
// flags >> kFlagL2HeadShift = h > 0: prefetch only the first h k-blocks of the range (TRIT_L2PF=3): what DRAM
// can stream while the quantizer before the GEMV runs, without pushing a large layer's range through L2
constexpr int kFlagL2HeadShift = 8;

// word i (a compile-time constant after unrolling) of a lane's 16-byte weight load
__device__ __forceinline__ uint32_t word_of_rt(const int4& v, int i) {
  return static_cast<uint32_t>(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
}
// Word i of a lane's 16-byte weight load -> the A fragment, from either layout: kBP = false the 2-bit
// codes (a8_frag_r4: rows g + 8 at 4x, the kernel divides its accumulators), kBP = true the bitplane layout
// (csrc/ternary.h: the load is P0, N0, P1, N1; word i's 16 weights are bits 4 (i & 1) + s of each byte of
// P_(i/2) / N_(i/2)): code = 1 + p - n per byte, one 32-bit add and subtract for four bytes (each byte stays
// in 0..2: no carry or borrow between bytes).
template <bool kBP>
__device__ __forceinline__ void a8_frag_w(const int4& v, int i, uint32_t (&af)[4]) {
  if constexpr (!kBP) {
    a8_frag_r4(word_of_rt(v, i), af);  // rows g + 8 at 4x: the kernel applies a8_rows4_fix before its epilogue
  } else {
    const uint32_t p = word_of_rt(v, i & 2), n = word_of_rt(v, (i & 2) + 1);
    const int sh = 4 * (i & 1);
#pragma unroll
    for (int j = 0; j < 4; ++j) af[j] = 0x01010101u + ((p >> (sh + j)) & 0x01010101u) - ((n >> (sh + j)) & 0x01010101u);
  }
}

// Split-K partial sums of a warp's WN x MT 16 x 8 tiles (acc[wn * MT + mt]: weight tile
// tile + wn, x rows 8 mt ..), reduced over the KS warps (threadIdx.x / 32) of its CTA row
// threadIdx.y in a fixed order (deterministic), scaled and written. red: [NW][KS][WN*MT][4][32].
// A warp whose tile is past the last one (the grid does not divide the tile count) computed a
// clamped copy of the last tile: its outputs have n >= N and are dropped.
template <typename T, bool kA8, int MT, int WN = 1, typename Acc>
__device__ __forceinline__ void small_epilogue(Acc (&acc)[WN * MT][4], Acc* red, int tile, int M, int N,
                                               const float* __restrict__ scale, const T* __restrict__ bias,
                                               T* __restrict__ y, const float* xs, const int32_t* rowsum) {
  constexpr int kT = WN * MT;
  const int lane = threadIdx.x & 31, kw = threadIdx.x >> 5, KS = blockDim.x >> 5;
  Acc* r = red + threadIdx.y * KS * kT * 128;
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) r[(kw * kT + t) * 128 + q * 32 + lane] = acc[t][q];
  __syncthreads();
  for (int s = threadIdx.x; s < kT * 128; s += blockDim.x) {
    const unsigned t = (unsigned)s >> 7;
    const int ln = s & 31, q = (s >> 5) & 3;
    const int n = (tile + t / MT) * kTileN + (ln >> 2) + 8 * (q >> 1);
    const int m = 8 * (t % MT) + 2 * (ln & 3) + (q & 1);
    if (n < N && m < M) {
      Acc v = 0;
      for (int w = 0; w < KS; ++w) v += r[(w * kT + t) * 128 + (s & 127)];
      store_out<T, kA8>(v, m, n, N, scale, bias, y, xs, rowsum);
    }
  }
}

// k-block range of split-K warp kw (same split as v4: contiguous, sizes differ by <= 1)
__device__ __forceinline__ void kb_range(int KB, int& kb0, int& kb1) {
  const int kw = threadIdx.x >> 5, KS = blockDim.x >> 5;
  kb0 = (KB * kw) / KS;
  kb1 = (KB * (kw + 1)) / KS;
}

// The main loop of the v5 kernels over a warp's nch whole chunks (nk k-blocks in its range):
// the optional L2 prefetch of the range (flags), weight chunks double-buffered in registers, and
// pdl_wait() between the first weight loads and the first read of x.
// load_chunk(buf, p) loads one chunk at p; run_chunk(buf) computes it and advances wq (and x).
// (Measured and dropped: a rolling L2 prefetch window and a 3-4 chunk register ring, runs 6-7 in
// bench/results/NOTES.md; neither beat double buffering.)
// A chunk is U k-blocks of each of the warp's tiles: NA = U * WN 16-byte loads per lane.
// after_wait() runs once, right after pdl_wait() (the fused-quantizer kernel quantizes x there).
struct NoOp {
  __device__ void operator()() const {}
};
template <int U, int NA, typename LoadChunk, typename RunChunk, typename AfterWait = NoOp>
__device__ __forceinline__ void chunk_loop(const int4*& wq, int lane, int nk, int nch, int flags,
                                           LoadChunk&& load_chunk, RunChunk&& run_chunk,
                                           AfterWait&& after_wait = AfterWait{}) {
  if ((flags & kFlagL2Prefetch) && lane == 0 && nk > 0) {
    const int head = flags >> kFlagL2HeadShift;
    l2_prefetch(wq - lane, (uint32_t)(head > 0 ? min(nk, head) : nk) * 512u);
  }
  int4 a0[NA], a1[NA];
  if (nch > 0) load_chunk(a0, wq);
  pdl_wait();
  after_wait();
  for (int j = 0; j < nch; j += 2) {
    if (j + 1 < nch) load_chunk(a1, wq + U * 32);  // uniform: predicated loads, no branch
    run_chunk(a0);                                     // advances wq and x by one chunk
    if (j + 1 >= nch) break;
    if (j + 2 < nch) load_chunk(a0, wq + U * 32);
    run_chunk(a1);
  }
}

// Register cap of the v5 kernels: MT = 1 keeps <= 80 registers (3 CTAs of 256 threads, >= 24 warps
// per SM); MT >= 2 holds MT accumulator tiles and MT x fragments and gets 128 (2 CTAs).
template <int MT> struct V5MinCtas { static constexpr int value = MT == 1 ? kV5MinCtas : 2; };
// a8_small_kernel: MT = 4 with two weight tiles per warp needs 154 registers (at the 128 of two
// CTAs per SM it spilled): one 256-thread CTA per SM
template <int MT, int WN> struct A8MinCtas {
  static constexpr int value = (MT >= 4 && WN == 2) ? 1 : V5MinCtas<MT * WN>::value;
};
// k-blocks per weight chunk: kV5U, halved from MT = 4 on (MT x fragments per k-block leave no
// registers for two 4-block chunks without spilling; each k-block there is 4 * MT mma of work)
template <int MT> struct V5Chunk { static constexpr int value = MT >= 4 ? kV5U / 2 : kV5U; };

// bf16/fp16 x, M <= 8 (one 8-row x tile; an x-tile template like a8_small_kernel's was measured
// slower than v4 for this path - run 8, bench/results/NOTES.md - and removed).
// Grid: x = groups of NW packed row tiles, block: (32 * KS, NW): warp (kw, nw) owns tile
// blockIdx.x * NW + nw (clamped to the last tile) and the kw-th of KS slices of the k-blocks.
template <typename T>
__global__ void __launch_bounds__(kV5Threads, kV5MinCtas)
    tmm_small_kernel(const T* __restrict__ x, const int4* __restrict__ wp, const float* __restrict__ scale,
                     const T* __restrict__ bias, T* __restrict__ y, int M, int N, int K, int KB, int n_tiles,
                     int flags) {
  extern __shared__ float red[];  // [NW][KS][4][32]
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int tile = blockIdx.x * blockDim.y + threadIdx.y;
  const int tl = min(tile, n_tiles - 1);
  int kb0, kb1;
  kb_range(KB, kb0, kb1);
  const int kb_full = K / kBlockK;                      // k-blocks whose 128 inputs are all < K
  const int nfull = max(0, min(kb1, kb_full) - kb0);    // full k-blocks of this warp
  const uint32_t magic = opaque(Magic<T>::value);

  // rows past M read row M-1: their output columns are dropped by the epilogue
  const uint4* xp = reinterpret_cast<const uint4*>(x + (size_t)min(g, M - 1) * K + (size_t)kb0 * kBlockK + c * 32);
  const int4* wq = wp + ((size_t)tl * KB + kb0) * 32 + lane;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};

  // one k-block: w = this lane's 4 words, xb = this lane's 32 inputs (4 x 8, natural order)
  auto block = [&](const int4& w, const uint4 (&xb)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t o[8];
      DecodeV5<T>::run(word_of_rt(w, i), magic, o);
      mma16816<T>(acc[0], &o[0], xb[i].x, xb[i].y);
      mma16816<T>(acc[0], &o[4], xb[i].z, xb[i].w);
    }
  };
  auto block_at = [&](const int4& w, const uint4* xk) {
    uint4 xb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) xb[i] = __ldg(xk + i);
    block(w, xb);
  };
  auto load_chunk = [&](int4 (&a)[kV5U], const int4* p) {
#pragma unroll
    for (int u = 0; u < kV5U; ++u) a[u] = ld_weights(p + u * 32);
  };
  auto run_chunk = [&](const int4 (&a)[kV5U]) {
#pragma unroll
    for (int u = 0; u < kV5U; ++u) block_at(a[u], xp + u * 16);  // 16 uint4 = 128 inputs
    xp += kV5U * 16;
    wq += kV5U * 32;
  };

  // chunk_loop loads weights only before pdl_wait (x may still be being written)
  const int nch = nfull / kV5U;
  chunk_loop<kV5U, kV5U>(wq, lane, kb1 - kb0, nch, flags, load_chunk, run_chunk);
  // < kV5U remaining full k-blocks: all weight loads first, then compute
  const int nrem = nfull - nch * kV5U;
  if (nrem > 0) {
    int4 ar[kV5U - 1];
#pragma unroll
    for (int u = 0; u < kV5U - 1; ++u)
      if (u < nrem) ar[u] = ld_weights(wq + u * 32);
#pragma unroll
    for (int u = 0; u < kV5U - 1; ++u)
      if (u < nrem) block_at(ar[u], xp + u * 16);
    xp += nrem * 16;
    wq += nrem * 32;
  }
  // the partial last k-block (K % 128 != 0), owned by the warp whose range contains it;
  // K % 8 == 0, so each 8-input group is wholly inside or outside [0, K): zero the outside ones
  if (kb_full < KB && kb0 <= kb_full && kb_full < kb1) {
    const int4 w = ld_weights(wq);
    const int k0 = kb_full * kBlockK + c * 32;
    uint4 xb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) xb[i] = (k0 + 8 * i < K) ? __ldg(xp + i) : make_uint4(0, 0, 0, 0);
    block(w, xb);
  }
  small_epilogue<T, false, 1>(acc, red, tile, M, N, scale, bias, y, nullptr, nullptr);
}

// 8 consecutive inputs of one x row as fp32: one 16-byte load (vec: K % 8 == 0 and 16-byte aligned
// x), else element by element with zeros past K.
template <typename T>
__device__ __forceinline__ void load8(const T* row, int k, int K, bool vec, float (&e)[8]) {
  if (vec && k + 8 <= K) {
    if constexpr (sizeof(T) == 2) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + k));
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(h[i]);
    } else {
      const float4 a = __ldg(reinterpret_cast<const float4*>(row + k));
      const float4 b = __ldg(reinterpret_cast<const float4*>(row + k + 4));
      e[0] = a.x; e[1] = a.y; e[2] = a.z; e[3] = a.w; e[4] = b.x; e[5] = b.y; e[6] = b.z; e[7] = b.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = (k + i < K) ? to_f32<T>(row[k + i]) : 0.f;
  }
}

template <typename T>
__device__ __forceinline__ void store8(T* row, int k, int K, bool vec, const float (&e)[8]) {
  if (vec && k + 8 <= K) {
    if constexpr (sizeof(T) == 2) {
      uint4 v;
      T* h = reinterpret_cast<T*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) h[i] = from_f32<T>(e[i]);
      *reinterpret_cast<uint4*>(row + k) = v;
    } else {
      *reinterpret_cast<float4*>(row + k) = make_float4(e[0], e[1], e[2], e[3]);
      *reinterpret_cast<float4*>(row + k + 4) = make_float4(e[4], e[5], e[6], e[7]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (k + i < K) row[k + i] = from_f32<T>(e[i]);
  }
}
// act(gate) * up as torch computes it in T (A8Pro's pass 1, the act_mul_kernel, and
// quant_rows_cluster_kernel kAct): relu(g)^2 (1) or silu(g) (2) rounded to T, times
// up, rounded to T; returned as fp32 (exactly a T value)
template <typename T>
__device__ __forceinline__ float chain_act(int act, float g, float u) {
  const float v = act == 1 ? fmaxf(g, 0.f) * fmaxf(g, 0.f) : g / (1.f + expf(-g));
  return to_f32<T>(from_f32<T>(to_f32<T>(from_f32<T>(v)) * u));
}
// One row of BitNet's activation quantizer, computed by the whole CTA: xs = 127 / max|x| (as
// torch: reciprocal(t) * 127), q = rint(x * xs) clamped to [-128, 127], stored by store(k, v) as
// groups of 8 in the order {0,4,1,5,2,6,3,7} (zeros past K, up to Kp). Returns xs; thread 0 gets
// the row sum of q in sum. scr_f / scr_i: one float / int of shared memory per warp; successive
// calls may reuse them (each ends with a barrier after its last read of scr_f).
// One 16-byte load per thread per loop trip: ncu on H200 run 15 timed the quantizer kernel at 4.7 us
// for K = 2560 and 8.3 us for K = 14336 (64 rows). A variant with 4 loads in flight per thread
// (TRIT_QUANT_ILP, H200 run 17) measured slower and was removed.
// A group of 8 inputs quantized with scale xs (their q added to part), packed {0,4,1,5,2,6,3,7}.
__device__ __forceinline__ uint2 quant_group8(const float (&e)[8], float xs, int& part) {
  int q[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    q[i] = (int)fminf(fmaxf(rintf(e[i] * xs), -128.f), 127.f);
    part += q[i];
  }
  const uint32_t lo = (q[0] & 0xFF) | ((q[4] & 0xFF) << 8) | ((q[1] & 0xFF) << 16) | ((uint32_t)(q[5] & 0xFF) << 24);
  const uint32_t hi = (q[2] & 0xFF) | ((q[6] & 0xFF) << 8) | ((q[3] & 0xFF) << 16) | ((uint32_t)(q[7] & 0xFF) << 24);
  return make_uint2(lo, hi);
}
template <typename T, typename Store>
__device__ __forceinline__ float quantize_row_perm(const T* __restrict__ row, int K, int Kp, bool vec, float* scr_f,
                                                   int* scr_i, Store&& store, int& sum) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float amax = 0.f;
  for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {
    float e[8];
    load8<T>(row, k, K, vec, e);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(e[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) scr_f[warp] = amax;
  __syncthreads();
  amax = scr_f[0];
  for (int w = 1; w < nwarps; ++w) amax = fmaxf(amax, scr_f[w]);
  const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;  // as torch: reciprocal(t) * 127
  int part = 0;
  for (int k = threadIdx.x * 8; k < Kp; k += blockDim.x * 8) {
    float e[8];
    load8<T>(row, k, K, vec, e);  // zeros past K
    store(k, quant_group8(e, xs, part));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) scr_i[warp] = part;
  __syncthreads();
  sum = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < nwarps; ++w) sum += scr_i[w];
  return xs;
}

// The layer input in front of the fused quantizer (trit::ternary_mm_a8_prologue; A8Pro): what vLLM's
// model computes between the previous layer and this one, folded into every CTA of the GEMV so that no
// norm / activation kernel runs in between at M = 1.
//   act 1 / 2: x is the row [gate | up] (2K wide): a = T(T(relu(gate)^2) * up) / T(T(silu(gate)) * up)
//              (torch's ops in T: each rounds)
//   else       a = x, or T(x + residual) with a residual (then stored in res_out: the new residual stream)
//   norm (nw):  h = T(a * rsqrt(mean(a^2) + eps) * nw)  (rms_norm_a8q's arithmetic), else h = a
// and h is quantized as quantize_row_perm does. The CTA stages its inputs in shared memory by cp.async:
// the norm weight before the PDL wait (it is a parameter), the row (and the residual) right after it,
// every 16-byte piece in flight at once - one L2 round trip - and the passes read shared memory
// (H200, first version reloading from global per pass: 2560x2560 7.8 us against 4.7 with the plain
// fused quantizer). The CTA is ks x nw warps (pro_cfg: 256 threads where the tiles allow), all of them
// on the prologue (linear thread index), then each on its own tile.
template <typename T> struct A8Pro {
  const T* residual;  // [M, K] or null
  const T* nw;        // norm weight [K] or null (no norm)
  T* res_out;         // [M, K] (with residual): written by CTA 0
  float eps;
  int act;            // 0 none, 1 relu^2 * up, 2 silu * up (x is [M, 2K])
};
// the prologue's staging area: the x row (two of these with act), the residual row, the norm weight, in
// that order, each this many bytes (K elements of elem bytes, rounded up to 16)
__host__ __device__ inline size_t pro_row_bytes(int K, size_t elem) { return ((size_t)K * elem + 15) / 16 * 16; }
// n16 16-byte pieces from global src to shared dst by the CTA's nthr threads (tid), cp.async
__device__ __forceinline__ void stage16(void* dst, const void* src, int n16, int tid, int nthr) {
  for (int i = tid; i < n16; i += nthr)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(
                     reinterpret_cast<uint8_t*>(dst) + 16 * (size_t)i))),
                 "l"(reinterpret_cast<const uint8_t*>(src) + 16 * (size_t)i)
                 : "memory");
}
template <typename T>
__device__ __forceinline__ void sload8(const T* row, int k, float (&e)[8]) {  // shared, 16-byte aligned, k % 8 == 0
  if constexpr (sizeof(T) == 2) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + k);
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(h[i]);
  } else {
    const float4 a = *reinterpret_cast<const float4*>(row + k), b = *reinterpret_cast<const float4*>(row + k + 4);
    e[0] = a.x; e[1] = a.y; e[2] = a.z; e[3] = a.w; e[4] = b.x; e[5] = b.y; e[6] = b.z; e[7] = b.w;
  }
}
template <typename T>
__device__ __forceinline__ void sstore8(T* row, int k, const float (&e)[8]) {
  if constexpr (sizeof(T) == 2) {
    uint4 v;
    T* h = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = from_f32<T>(e[i]);
    *reinterpret_cast<uint4*>(row + k) = v;
  } else {
    *reinterpret_cast<float4*>(row + k) = make_float4(e[0], e[1], e[2], e[3]);
    *reinterpret_cast<float4*>(row + k + 4) = make_float4(e[4], e[5], e[6], e[7]);
  }
}
// One row (x, r, res_out at the row; K % 8 == 0, 16-byte aligned rows: the dispatcher checks). stage: the
// CTA's staging area (pro_row_bytes), its norm weight part already requested (cp.async, before the PDL
// wait). Same contract as quantize_row_perm (returns xs; thread 0 gets the row sum); tid / nthr: the
// CTA's linear thread index and size, a multiple of 32 up to 256 (scr_f / scr_i hold 8 words).
template <typename T, typename Store>
__device__ __forceinline__ float pro_quantize_row(const T* __restrict__ x, const T* __restrict__ r, bool norm,
                                                  T* __restrict__ res_out, float eps, int act, int K, int Kp,
                                                  uint8_t* stage, int tid, int nthr, float* scr_f, int* scr_i,
                                                  Store&& store, int& sum) {
  const int lane = tid & 31, warp = tid >> 5, nwarps = nthr >> 5;
  const size_t rowb = pro_row_bytes(K, sizeof(T));
  T* sxr = reinterpret_cast<T*>(stage);                              // x row ([gate | up] with act)
  T* srr = reinterpret_cast<T*>(stage + rowb * (act ? 2 : 1));       // residual row
  const T* swr = reinterpret_cast<const T*>(stage + rowb * ((act ? 2 : 1) + (r != nullptr ? 1 : 0)));  // norm weight
  stage16(sxr, x, (int)((act ? 2 : 1) * (size_t)K * sizeof(T) / 16), tid, nthr);
  if (r != nullptr) stage16(srr, r, (int)((size_t)K * sizeof(T) / 16), tid, nthr);
  asm volatile("cp.async.commit_group;" ::: "memory");
  asm volatile("cp.async.wait_group 0;" ::: "memory");  // this row, and the norm weight requested earlier
  __syncthreads();
  // pass 1: a (into sxr[0, K)), the residual stream, the sum of squares
  float ss = 0.f;
  for (int k = tid * 8; k < K; k += nthr * 8) {
    float e[8];
    if (act != 0) {
      float u[8];
      sload8<T>(sxr, k, e);
      sload8<T>(sxr + K, k, u);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float a = act == 1 ? fmaxf(e[i], 0.f) * fmaxf(e[i], 0.f) : e[i] / (1.f + expf(-e[i]));
        e[i] = to_f32<T>(from_f32<T>(to_f32<T>(from_f32<T>(a)) * u[i]));
      }
    } else {
      sload8<T>(sxr, k, e);
      if (r != nullptr) {
        float rr[8];
        sload8<T>(srr, k, rr);
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(from_f32<T>(e[i] + rr[i]));
        if (res_out != nullptr) store8<T>(res_out, k, K, true, e);
      }
    }
    if (act != 0 || r != nullptr) sstore8<T>(sxr, k, e);  // act: reads [k, k+8) of gate and up only (a thread's own)
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += e[i] * e[i];
  }
  float inv = 1.f;
  if (norm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) scr_f[warp] = ss;
  }
  __syncthreads();  // pass 1's writes of sxr, and scr_f
  if (norm) {
    ss = 0.f;
    for (int w = 0; w < nwarps; ++w) ss += scr_f[w];
    inv = rsqrtf(ss / (float)K + eps);
    __syncthreads();  // scr_f is reused below
  }
  auto h8 = [&](int k, float (&e)[8]) {
    sload8<T>(sxr, k, e);
    if (norm) {
      float wf[8];
      sload8<T>(swr, k, wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(from_f32<T>(e[i] * inv * wf[i]));
    }
  };
  float amax = 0.f;
  for (int k = tid * 8; k < K; k += nthr * 8) {
    float e[8];
    h8(k, e);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(e[i]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) scr_f[warp] = amax;
  __syncthreads();
  amax = scr_f[0];
  for (int w = 1; w < nwarps; ++w) amax = fmaxf(amax, scr_f[w]);
  const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;  // as torch: reciprocal(t) * 127
  int part = 0;
  for (int k = tid * 8; k < Kp; k += nthr * 8) {
    float e[8];
    if (k < K) {
      h8(k, e);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = 0.f;  // zeros past K
    }
    store(k, quant_group8(e, xs, part));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) scr_i[warp] = part;
  __syncthreads();  // also: every read of this row's staging is done before the next row's copies
  sum = 0;
  if (tid == 0)
    for (int w = 0; w < nwarps; ++w) sum += scr_i[w];
  return xs;
}

// W1.58A8, M <= 8 * MT. xq: int8, zero-padded past K, each group of 8 inputs stored in the order
// {0,4,1,5,2,6,3,7} (quant_rows_perm_kernel), so that the first 4 bytes of a group are the mma B
// register b0 and the last 4 are b1 (v4 builds them with two PRMT). MT = 1: row-major [M, KB*128]
// (rows past M read row M-1). MT >= 2: k-block-major [KB][Mp][128] with Mp = 8 * MT rows (zero
// rows past M), so a warp's MT row tiles sit at fixed offsets from one pointer
// (immediate offsets, no per-row pointer registers). Grid and block as tmm_small_kernel.
// WN = 2 (TRIT_WN; default by shape, see wn_auto): each warp owns two consecutive weight tiles
// and feeds every x fragment to both, halving x loads per weight byte; a chunk then holds kU
// k-blocks of each tile (kU halved, see V5Chunk).
// kFuseQ (TRIT_A8_FUSEQ; default at M = 1 on small layers, see fuseq_auto; MT = WN = NW = 1): the activation
// quantizer runs inside this kernel - one launch per layer instead of two. After the PDL wait
// the CTA quantizes all M rows of x (raw activations, K % 8 == 0, 16-byte aligned) into shared
// memory with quantize_row_perm (bit-identical to quant_rows_perm_kernel), then the loop reads xq
// from there; xq / xs / rowsum are unused. Every CTA reads all of x (M * K elements, from L2).
// Shared memory after red: xq [M][Kp + 16] (the 16-byte row pad puts rows on different banks),
// xs / rowsum [8] each, 2 x 8 words of reduction scratch; the dispatcher checks it fits in 48 KB.
// kRM (MT = 2 / 4, trit_mm_a8_pre at 8 < M <= TRIT_A8_PRE_MAXM): xq in the MT = 1 row-major layout [M, KB*128]
// that trit::rms_norm_a8q and trit.ops.a8_quantize write (the same bytes per row as the k-block-major layout),
// each row tile at its own offset from xp, rows past M reading row M-1 (their outputs are never stored).
// kXI (MT = 2 / 4 / 8 behind their own quantizer; the default, TRIT_A8_XI=0 turns it off): the k-block-major layout
// with each row tile's 1 KB interleaved for the loads (quant_rows_perm_kernel kXI; MT = 8: 8-byte words, see
// xi_offset): lane l's uint4 h (inputs
// 32c + 16h .. of row g, l = 4g + c) at byte 512h + 16l, so a warp's 16-byte load of x reads 512 contiguous bytes
// (16 sectors) where the plain order reads 8 rows x 4 half-used sectors (32). H200 run 39 (ncu, 14336x4096 at
// M = 32): 26 sectors per global load request, the L1 at 68% of its peak, lg_throttle stalls; with kXI (run 40)
// 14 sectors, 47%, no lg_throttle, 16.9 -> 13.5 us. Run 41: equal or faster at M = 12 - 32 on all 13 shapes
// (28672x4096 M = 32 29.9 -> 21.6 us, 14336x4096 17.3 -> 13.6, 4096x14336 17.0 -> 14.2).
template <typename T, int MT, int WN, bool kFuseQ = false, bool kBP = false, bool kRM = false, bool kXI = false>
__global__ void __launch_bounds__(kV5Threads, A8MinCtas<MT, WN>::value)
    a8_small_kernel(const int8_t* __restrict__ xq, const float* __restrict__ xs, const int32_t* __restrict__ rowsum,
                    const int4* __restrict__ wp, const float* __restrict__ scale, const T* __restrict__ bias,
                    T* __restrict__ y, int M, int N, int KB, int n_tiles, int Mp, int flags,
                    const T* __restrict__ x, int K, A8Pro<T> pro) {
  static_assert(!kFuseQ || (MT == 1 && WN == 1), "the fused quantizer is the M <= 8 single-tile kernel");
  static_assert(!kRM || (MT >= 2 && MT <= 4 && !kFuseQ), "row-major xq past M = 8: the MT = 2 / 4 kernels");
  static_assert(!kXI || (MT >= 2 && !kRM && !kFuseQ), "interleaved xq: the k-block-major MT = 2 / 4 / 8 kernels");
  extern __shared__ __align__(16) int redi[];  // [NW][KS][WN*MT][4][32] (+ the kFuseQ area)
  constexpr int kU = V5Chunk<MT * WN>::value;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int tile = (blockIdx.x * blockDim.y + threadIdx.y) * WN;  // first of the warp's WN tiles
  const int tl = min(tile, n_tiles - 1);
  int kb0, kb1;
  kb_range(KB, kb0, kb1);
  const int nk = kb1 - kb0;  // every k-block is "full": xq is padded

  // kFuseQ: shared xq rows of ld bytes, then xs, rowsum and the quantizer's scratch, then (prologue) the
  // staging area, 16-byte aligned
  const int ld = KB * kBlockK + 16;
  int8_t* sx = reinterpret_cast<int8_t*>(redi + (blockDim.x >> 5) * blockDim.y * 128);
  float* sxs = reinterpret_cast<float*>(sx + M * ld);
  int* srs = reinterpret_cast<int*>(sxs + 8);
  float* scr_f = reinterpret_cast<float*>(srs + 8);
  int* scr_i = reinterpret_cast<int*>(scr_f + 8);
  uint8_t* stage = reinterpret_cast<uint8_t*>(scr_i + 8);
  stage += (16 - (reinterpret_cast<uintptr_t>(stage) & 15)) & 15;
  const bool prologue = kFuseQ && (pro.nw != nullptr || pro.act != 0 || pro.residual != nullptr);
  const int ptid = threadIdx.y * blockDim.x + threadIdx.x, pnthr = blockDim.x * blockDim.y;
  if (prologue && pro.nw != nullptr) {  // the norm weight is a parameter: requested before the PDL wait
    stage16(stage + pro_row_bytes(K, sizeof(T)) * ((pro.act != 0 ? 2 : 1) + (pro.residual != nullptr ? 1 : 0)), pro.nw,
            (int)((size_t)K * sizeof(T) / 16), ptid, pnthr);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }

  // xp: this lane's 32 inputs of row g in k-block kb0; row tile mt at + 64 * mt (MT >= 2);
  // the next k-block at + kbs (uint4 units); kXI: the lane's first uint4 at 16 * lane, its second 512 bytes on
  const uint4* xp = reinterpret_cast<const uint4*>(
      kFuseQ    ? sx + min(g, M - 1) * ld + kb0 * kBlockK + c * 32
      : (MT == 1 || kRM) ? xq + (size_t)min(g, M - 1) * KB * kBlockK + (size_t)kb0 * kBlockK + c * 32
      : kXI              ? xq + (size_t)kb0 * Mp * kBlockK + (MT == 8 ? 0 : lane * 16)
                         : xq + ((size_t)kb0 * Mp + g) * kBlockK + c * 32);
  constexpr int kHalf = kXI ? 32 : 1;  // uint4 h of a lane's 32 inputs at + kHalf * h
  const int kbs = (MT == 1 || kRM) ? 8 : Mp * 8;
  // MT = 8 over more than 64 rows (a8_v5's 64 < M <= 128: Mp = 128, grid.y = 2): CTA row blockIdx.y owns rows r0 ..
  // r0 + 63, 64 rows of every k-block further on; its outputs, xs and row sums from row r0 (a grid of one CTA row
  // everywhere else: r0 = 0)
  const int r0 = MT == 8 ? (int)blockIdx.y * 64 : 0;  // (MT = 8 is never kFuseQ / kRM: static_asserts above)
  xp += r0 * (kBlockK / 16);
  // row tile mt of this lane as a uint4 offset from xp: 64 mt (k-block-major), or (kRM) row 8 mt + g clamped to
  // M - 1; kRM's offsets exist only in its own kernels (the others compile to the same code as without them)
  int toff[kRM ? MT : 1] = {};
  if constexpr (kRM) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) toff[mt] = (min(8 * mt + g, M - 1) - min(g, M - 1)) * KB * 8;
  }
  auto xoff = [&](int mt) {
    if constexpr (kRM) return toff[mt];
    else return 64 * mt;
  };
  auto ldx = [](const auto* p) {  // x: shared memory (kFuseQ) or read-only global
    if constexpr (kFuseQ) return *p;
    else return __ldg(p);
  };
  const int4* wq = wp + ((size_t)tl * KB + kb0) * 32 + lane;
  // the warp's second tile (clamped like the first), as an offset from wq
  const ptrdiff_t wstep = WN == 1 ? 0 : (ptrdiff_t)(min(tile + 1, n_tiles - 1) - tl) * KB * 32;
  int acc[WN * MT][4];
#pragma unroll
  for (int t = 0; t < WN * MT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0;

  // one k-block: 32 inputs per lane and row tile = two uint4 (words i = 0,1 | 2,3), w[wn] the
  // k-block's weights of tile wn. MT <= 2: both halves loaded first (as MT = 1 always did);
  // MT = 4: one half (uint4) at a time; MT = 8: one word's 8 inputs (uint2) at a time, so x holds
  // <= 16 registers next to 32 accumulators.
  auto mma_word = [&](const int4 (&w)[WN], int i, int mt, uint32_t b0, uint32_t b1) {
#pragma unroll
    for (int wn = 0; wn < WN; ++wn) {
      uint32_t af[4];
      a8_frag_w<kBP>(w[wn], i, af);
      mma16832_u8s8(acc[wn * MT + mt], af, b0, b1);
    }
  };
  auto block_at = [&](const int4 (&w)[WN], const uint4* xk) {
    if constexpr (MT <= 4) {
      constexpr int kH = MT <= 2 ? 2 : 1;
      uint4 xv[kH][MT];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 0 || kH == 1) {
#pragma unroll
          for (int hh = 0; hh < kH; ++hh)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) xv[hh][mt] = ldx(xk + xoff(mt) + kHalf * (h + hh));
        }
#pragma unroll
        for (int i = 2 * h; i < 2 * h + 2; ++i)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const uint4& v = xv[kH == 2 ? h : 0][mt];
            mma_word(w, i, mt, (i & 1) ? v.z : v.x, (i & 1) ? v.w : v.y);
          }
      }
    } else {
      // word i of row tile mt: plain at + 8i bytes of the lane's 32; kXI (8-byte interleave) at 256i + 8 * lane
      const uint2* x2 = reinterpret_cast<const uint2*>(xk) + (kXI ? lane : 0);
      constexpr int kWord = kXI ? 32 : 1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint2 xv[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) xv[mt] = ldx(x2 + 128 * mt + kWord * i);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma_word(w, i, mt, xv[mt].x, xv[mt].y);
      }
    }
  };
  // chunk registers: a[wn * kU + u] = k-block u of tile wn
  auto load_chunk = [&](int4 (&a)[kU * WN], const int4* p) {
#pragma unroll
    for (int wn = 0; wn < WN; ++wn)
#pragma unroll
      for (int u = 0; u < kU; ++u) a[wn * kU + u] = ld_weights(p + wn * wstep + u * 32);
  };
  auto block_u = [&](const int4* a, int u, const uint4* xk) {  // a: a chunk, u: its k-block
    int4 w[WN];
#pragma unroll
    for (int wn = 0; wn < WN; ++wn) w[wn] = a[wn * kU + u];
    block_at(w, xk);
  };
  auto run_chunk = [&](const int4 (&a)[kU * WN]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) block_u(a, u, xp + u * kbs);
    xp += kU * kbs;
    wq += kU * 32;
  };

  // kFuseQ: after the PDL wait, all M rows of x -> shared xq, xs, rowsum
  // with a prologue (pro: trit::ternary_mm_a8_prologue) x is the input before the norm / activation
  auto quantize = [&]() {
    const int Kp = KB * kBlockK;
    for (int m = 0; m < M; ++m) {
      int sum;
      auto st = [&](int k, uint2 v) { *reinterpret_cast<uint2*>(sx + m * ld + k) = v; };
      const float s =
          prologue ? pro_quantize_row<T>(x + (size_t)m * (pro.act != 0 ? 2 * K : K),
                                         pro.residual != nullptr ? pro.residual + (size_t)m * K : nullptr,
                                         pro.nw != nullptr,
                                         blockIdx.x == 0 && pro.res_out != nullptr ? pro.res_out + (size_t)m * K : nullptr,
                                         pro.eps, pro.act, K, Kp, stage, ptid, pnthr, scr_f, scr_i, st, sum)
                   : quantize_row_perm<T>(x + (size_t)m * K, K, Kp, true, scr_f, scr_i, st, sum);
      if (ptid == 0) {
        srs[m] = sum;
        sxs[m] = s;
      }
    }
    __syncthreads();  // xq, xs and rowsum of every row are in shared memory
  };

  // chunk_loop loads weights only before pdl_wait (xq, or x, is written by the kernel launched before)
  const int nch = nk / kU;
  if constexpr (kFuseQ) {
    chunk_loop<kU, kU * WN>(wq, lane, nk, nch, flags, load_chunk, run_chunk, quantize);
  } else {
    chunk_loop<kU, kU * WN>(wq, lane, nk, nch, flags, load_chunk, run_chunk);
  }
  const int nrem = nk - nch * kU;
  if (nrem > 0) {
    int4 ar[kU * WN];
#pragma unroll
    for (int wn = 0; wn < WN; ++wn)
#pragma unroll
      for (int u = 0; u < kU - 1; ++u)
        if (u < nrem) ar[wn * kU + u] = ld_weights(wq + wn * wstep + u * 32);
#pragma unroll
    for (int u = 0; u < kU - 1; ++u)
      if (u < nrem) block_u(ar, u, xp + u * kbs);
  }
  if constexpr (!kBP) {  // a8_frag_w's code-layout fragments put rows g + 8 at 4x
#pragma unroll
    for (int t = 0; t < WN * MT; ++t) a8_rows4_fix(acc[t]);
  }
  small_epilogue<T, true, MT, WN>(acc, redi, tile, M - r0, N, scale, bias, y + (size_t)r0 * N,
                                  kFuseQ ? sxs : xs + r0, kFuseQ ? srs : rowsum + r0);
}


// ---------------------------------------------------------------- a8 GEMM-shaped kernel (M 17-256)
// The default at 32 < M <= 256 on large layers (bindings.cpp a8_gemm_on, from H200 run 12;
// TRIT_A8_GEMM=1 forces it from M = 17). The v5 / v4 a8 kernels are GEMV-shaped: every
// warp fetches its own x fragments from L1/L2 for each weight tile, about 8 bytes of x per weight
// byte at M = 64, and latency-bound (H200 run 11: 28672x8192 M = 64 at 100 us, 1.3x bf16, where
// humming's GEMM took 62 us in run 2). Here a CTA owns 128 output channels (8 tiles) x BM = 32 * WM
// rows of x; 4 * WM warps as 4 (N) x WM (M), each warp 2 tiles x 4 row tiles (32 int accumulators):
// WM = 2 (64 rows, 256 threads) above M = 32, WM = 1 (32 rows, 128 threads) up to it. Each k-block
// of W (8 tiles x 512 B, the packed layout as is) and of xq (BM rows x 128 B, from the k-block-major
// layout of quant_rows_perm_kernel with Mp = M rounded up to BM) is copied to shared
// memory by cp.async in a kGemmStages-deep ring: x leaves L2 once per CTA and is read by 4 warps
// from shared memory (rows padded to 144 B: the 8 lanes of an LDS.128 phase hit distinct banks),
// and later k-blocks are in flight while one computes. Split-K over CTAs (gridDim.z, see
// gemm_shape) when the tiles alone fill less than a wave. Same arithmetic as the other a8 kernels (exact int32 sums, store_out): bit-identical output.
// Warp tiles other than the default 2 x 4 (TRIT_A8_GEMM_CFG; run 14: they lost on small and mid
// layers, won only on the largest at M >= 128, see bench/results/NOTES.md): ncu on H200 run 13
// found this kernel issue-latency bound (one instruction per ~9-10 cycles per warp, shared-memory
// load waits on top, 2 CTAs per SM by registers) with ~4 instructions per mma: each decoded weight
// word feeds 4 row tiles, and x crosses L2 twice per weight byte (8 tiles x 64 rows per CTA).
// GemmCfg<WT, RT, WNW, WMW>: a warp owns WT weight tiles x RT row tiles of 8; WNW x WMW warps per
// CTA. The measured configuration is <2, 4, 4, WM>; the alternatives double the mma per decoded
// word (RT = 8) or per x fragment (WT = 4), and/or halve x traffic per weight byte (16 tiles per CTA).
constexpr int kGemmStages = 3, kGemmXRow = kBlockK + 16;
template <int WT, int RT, int WNW, int WMW, int WG = 0, int DIST = kGemmStages - 1> struct GemmCfg {
  static constexpr int kWT = WT, kRT = RT, kWNW = WNW;
  // WG: 0 the mma.sync loop, 1 the wgmma loop (each k-block's wgmma waited for before the next is
  // fetched), 2 the wgmma loop with the next k-block's barrier, copies and weight loads issued
  // while the wgmma run (one stage more than the distance: the stage being read by the running
  // wgmma is not the one requested). DIST: k-blocks requested ahead (2; the deep rings of the
  // overlapped loop, TRIT_A8_GEMM_WG_DEEP: more bytes in flight per SM at 2 CTAs per SM)
  static constexpr bool kWG = WG != 0, kWGOverlap = WG == 2;
  static constexpr int kDist = DIST, kStages = WG == 2 ? DIST + 2 : DIST + 1;
  static constexpr int kTiles = WT * WNW, kBM = 8 * RT * WMW, kThreads = 32 * WNW * WMW;
  // a stage: W (kTiles x 512 B) then x (kBM rows of kXRow B); WG (the wgmma main loop): x first,
  // 128-byte rows in the 128-byte swizzle, every stage 1024-byte aligned (the ring is aligned up)
  static constexpr int kXRow = WG ? kBlockK : kGemmXRow;
  static constexpr int kWOff = WG ? kBM * kBlockK : 0, kXOff = WG ? 0 : kTiles * 512;
  static constexpr int kStageBytes = kTiles * 512 + kBM * kXRow;  // <2,4,4,2>: 13312 B (39936 in all)
  static constexpr int kWPieces = kTiles * 32 / kThreads, kXPieces = 8 * kBM / kThreads;  // 16-byte copies per thread
  // CTAs per SM the registers must allow: 128 per thread for the default tiles, more (fewer CTAs)
  // where the warp tile needs them without spilling (RT = 8: 64 accumulators + fragments; WT = 4 at
  // 128 threads: 4 weight-copy pointers per thread)
  static constexpr int kMinBlocks = WG ? 2 : kThreads == 128 ? ((RT == 8 || WT == 4) ? 3 : 4) : (RT == 8 ? 1 : 2);
  // the epilogue reuses the ring: the CTA's int32 sums [kBM][kCh + 4] (+4: the fragment writes of
  // a warp hit 32 distinct banks), then the channel and row factors
  static constexpr int kCh = kTiles * 16, kAccLd = kCh + 4;
  static constexpr int kEpiBytes = kBM * kAccLd * 4 + (2 * kCh + 2 * kBM) * 4;
  static constexpr int kRingBytes = kStages * kStageBytes > kEpiBytes ? kStages * kStageBytes : kEpiBytes;
  static constexpr int kSmemBytes = kRingBytes + (WG ? 1024 : 0);  // WG: slack to align the ring to 1024 B
  static_assert(kWPieces * kThreads == kTiles * 32 && kXPieces * kThreads == 8 * kBM, "whole copies per thread");
  static_assert(!WG || (WT == 1 && WNW == 8 && WMW == 1 && (kBM == 64 || kBM == 128) && kStageBytes % 1024 == 0),
                "the wgmma loop: 8 warps (2 warpgroups) of one weight tile each, 64 or 128 x rows");
};
template <int WM> using Gemm = GemmCfg<2, 4, 4, WM>;  // the measured default: 128 channels x 32 * WM rows
// TRIT_A8_GEMM_WG=1 (H200 run 19: bit-identical to the mma.sync loop; the default loop per shape is
// csrc/a8_route.h's): the same CTA tile (128 channels x 64 rows, 256 threads)
// with a wgmma main loop. Each warp decodes its weight tile's 4 k-steps into m16n8k32-layout A
// fragments (as now), and each warpgroup issues 4 wgmma m64n64k32 per k-block (64 channels x 64 rows
// x 128 inputs) against x in swizzled shared memory: 4 instructions per warp where the mma.sync loop
// issues 32 mma + 10 LDS.128, and the tensor cores' Hopper rate instead of mma.sync's. The x rows
// come from the quantizer in the wgmma byte order (quant_rows_perm_kernel kWG), which makes the
// hardware's natural k order within a k-step meet the lane order of the decoded weights.
// TRIT_A8_GEMM_WG=2: the same with 128 x rows per CTA (two m64n64k32 per k-step on the two 64-row
// halves, 64 accumulators per thread):
// each weight k-block decoded and loaded once per 128 rows instead of 64.
// TRIT_A8_GEMM_WG_OVERLAP=1: either with the next k-block's barrier, copies and weight loads under
// the running wgmma (the decode into A registers stays after the wait: ptxas serialises wgmma
// whose input registers are written while a wgmma group is open, C7513).
template <int BM, bool OV = false, int DIST = kGemmStages - 1> using GemmWG = GemmCfg<1, BM / 8, 8, 1, OV ? 2 : 1, DIST>;
// TRIT_A8_GEMM_WG_DEEP=1: the overlapped loop with a deeper ring, as deep as 2 CTAs per SM allow
// (<= 113 KB each): 6 k-blocks ahead at 64 rows (8 stages of 12 KB), 3 at 128 rows (5 of 20 KB),
// against 2 (H200 run 19: the loop takes ~1 us per k-block at any M, as if waiting on memory).
template <int BM> using GemmWGDeep = GemmWG<BM, true, BM == 64 ? 6 : 3>;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Split-K partial sums go by plain stores into per-split slices. Until H200 run 14 the default
// was integer atomics into a [Mp][N] buffer zeroed by a memset node in front (TRIT_A8_GEMM_SPLIT=1
// chose stores); run 14 timed both with the first, serialised epilogue (see below): stores 42-47
// us, atomics 20-24 us on 2560x2560 M = 32-128 at ks = 2. With the epilogue through shared memory
// both end in the same coalesced loads of the tile, and the stores need neither atomics nor a
// memset (the quantizer zeroes the tile counters): the atomics are gone.
template <typename T, typename G>
__global__ void __launch_bounds__(G::kThreads, G::kMinBlocks)
    a8_gemm_kernel(const int8_t* __restrict__ xq, const float* __restrict__ xs, const int32_t* __restrict__ rowsum,
                   const int4* __restrict__ wp, const float* __restrict__ scale, const T* __restrict__ bias,
                   T* __restrict__ y, int M, int N, int KB, int n_tiles, int Mp, int32_t* __restrict__ ws,
                   int early) {
  constexpr int WT = G::kWT, RT = G::kRT;
  constexpr bool kOverlap = G::kWGOverlap;
  static_assert(G::kStages == G::kDist + (kOverlap ? 2 : 1) && (G::kWG || G::kStages == kGemmStages), "ring depth");
  extern __shared__ __align__(16) uint8_t gsm_raw[];
  uint8_t* gsm = gsm_raw;
  if constexpr (G::kWG) {  // the swizzled x tiles need 1024-byte alignment (kSmemBytes has the slack)
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(gsm_raw));
    gsm = gsm_raw + ((1024u - (a & 1023u)) & 1023u);
  }
  __shared__ int s_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // split-K (gridDim.z > 1): CTA z runs k-blocks [kb_lo, kb_lo + nkb)
  const int ks = gridDim.z, kb_lo = (KB * (int)blockIdx.z) / ks, nkb = (KB * ((int)blockIdx.z + 1)) / ks - kb_lo;
  static_assert(G::kWNW == 4 || G::kWNW == 8, "warps along N: 4 or 8");
  constexpr int kLogWNW = G::kWNW == 8 ? 3 : 2;
  const int wcol = warp & (G::kWNW - 1), wrow = warp >> kLogWNW;  // the warp's tiles WT * wcol ..; rows 8 * RT * wrow ..
  const int g = lane >> 2, c = lane & 3;
  const int t0 = blockIdx.x * G::kTiles, m0 = blockIdx.y * G::kBM;
  // stage s, k-block kb: the kTiles * 32 16-byte pieces of W (piece j: lane j & 31 of tile j >> 5,
  // clamped to the last tile: its outputs are dropped) and the 8 * BM pieces of x
  const int4* wsrc[G::kWPieces];
#pragma unroll
  for (int q = 0; q < G::kWPieces; ++q) {
    const int j = tid + q * G::kThreads;
    wsrc[q] = wp + (size_t)min(t0 + (j >> 5), n_tiles - 1) * KB * 32 + (j & 31);
  }
  auto load_w = [&](int s, int kbi) {  // the weights of this CTA's kbi-th k-block into stage s
    const int kb = kb_lo + kbi;
    uint8_t* base = gsm + s * G::kStageBytes;
#pragma unroll
    for (int q = 0; q < G::kWPieces; ++q) cp_async16(base + G::kWOff + (tid + q * G::kThreads) * 16, wsrc[q] + (size_t)kb * 32);
  };
  auto load_stage = [&](int s, int kbi, bool with_w = true) {  // kbi: this CTA's kbi-th k-block
    const int kb = kb_lo + kbi;
    uint8_t* base = gsm + s * G::kStageBytes;
    if (with_w) load_w(s, kbi);
#pragma unroll
    for (int q = 0; q < G::kXPieces; ++q) {
      const int j = tid + q * G::kThreads, r = j >> 3, ch = j & 7;
      // WG: 16-byte chunk ch of row r at chunk ch ^ (r % 8) (the 128-byte swizzle of the descriptor)
      cp_async16(base + G::kXOff + (G::kWG ? r * kBlockK + ((ch ^ (r & 7)) << 4) : r * kGemmXRow + ch * 16),
                 xq + ((size_t)kb * Mp + m0 + r) * kBlockK + ch * 16);
    }
  };
  int acc[WT][RT][4];
#pragma unroll
  for (int a = 0; a < WT; ++a)
#pragma unroll
    for (int b = 0; b < RT; ++b) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0;
  constexpr int kAccW = G::kWG ? G::kBM / 2 : 1;
  int accw[kAccW];  // WG: the warpgroup's 64 x kBM wgmma accumulators (see wgmma_m64n64k32_u8s8)
#pragma unroll
  for (int r = 0; r < kAccW; ++r) accw[r] = 0;

  // early (TRIT_A8_GEMM_EARLY, default 1 since H200 run 17): the weights of the first kDist
  // k-blocks are requested before the PDL wait, while the quantizer still runs (the weights do
  // not depend on it; they join the first cp.async group, which the loop waits for at k-block 0)
  if (early)
#pragma unroll
    for (int s = 0; s < G::kDist; ++s)
      if (s < nkb) load_w(s, s);
  pdl_wait();  // xq comes from the quantizer launched just before
#pragma unroll
  for (int s = 0; s < G::kDist; ++s) {
    if (s < nkb) load_stage(s, s, !early);
    cp_async_commit();
  }
  // the head of k-block kb in every loop: wait until it has landed (this thread's copies), make it
  // visible to wgmma's async proxy (WG), barrier (everyone's copies; the stage requested next is no
  // longer read: in the overlap loop, head(kb) runs under k-block kb - 1's wgmma and fills stage
  // (kb + kDist) % (kDist + 2) = (kb - 2)'s, whose wgmma every warpgroup waited for before this
  // barrier; elsewhere (kb - 1)'s), request k-block kb + kDist; returns kb's stage
  auto head = [&](int kb) -> const uint8_t* {
    cp_async_wait<G::kDist - 1>();
    if constexpr (G::kWG) fence_proxy_async_smem();
    __syncthreads();
    if (kb + G::kDist < nkb) load_stage((kb + G::kDist) % G::kStages, kb + G::kDist);
    cp_async_commit();
    return gsm + (kb % G::kStages) * G::kStageBytes;
  };
  // wgmma loops: the warp's weight tile (tile = warp: warp w % 4 of warpgroup w / 4 holds wgmma
  // rows 16 (w % 4) ..), its 4 k-steps decoded into A fragments and 4 wgmma per warpgroup issued
  // against the stage's x (k-step i at +32 B), committed
  auto wg_weights = [&](const uint8_t* base) {
    return *reinterpret_cast<const int4*>(base + G::kWOff + (warp * 32 + lane) * 16);
  };
  auto wg_issue = [&](const uint8_t* base, const int4& wv) {
    if constexpr (G::kWG) {
      uint32_t af[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a8_frag(word_of_rt(wv, i), af[i]);
      const uint64_t d0 = wgmma_desc_sw128(static_cast<uint32_t>(__cvta_generic_to_shared(base + G::kXOff)));
      // the fragments complete before the fence (else NVVM sinks the decode past it and ptxas
      // injects an arrive per wgmma, C7519: the 4 wgmma no longer issue as one batch)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(af[i][j])::"memory");
      wgmma_pin(accw);
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i) wgmma_u8s8<G::kBM>(accw, af[i], d0 + 2 * i);
      wgmma_commit();
    }
  };
  if constexpr (kOverlap) {
    const uint8_t* base = head(0);
    int4 wv = wg_weights(base);
    for (int kb = 0; kb < nkb; ++kb) {
      wg_issue(base, wv);
      if (kb + 1 < nkb) {  // under the running wgmma: the next head and its raw weight words
        base = head(kb + 1);
        wv = wg_weights(base);
      }
      wgmma_wait<0>();
      wgmma_pin(accw);
    }
  } else
  for (int kb = 0; kb < nkb; ++kb) {
    const uint8_t* base = head(kb);
    if constexpr (G::kWG) {  // waited for at once: the next k-block reuses the ring stage
      wg_issue(base, wg_weights(base));
      wgmma_wait<0>();
      wgmma_pin(accw);
    } else {
      int4 w[WT];
#pragma unroll
      for (int wn = 0; wn < WT; ++wn) w[wn] = *reinterpret_cast<const int4*>(base + ((WT * wcol + wn) * 32 + lane) * 16);
      const uint8_t* xb = base + G::kTiles * 512 + (8 * RT * wrow + g) * kGemmXRow + c * 32;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // inputs c*32 + 16h .. + 15 of the lane's rows: k-steps i = 2h, 2h+1
        if constexpr (RT <= 4) {  // all RT x fragments of the half k-block live, one decoded word at a time
          uint4 xv[RT];
#pragma unroll
          for (int mt = 0; mt < RT; ++mt) xv[mt] = *reinterpret_cast<const uint4*>(xb + mt * 8 * kGemmXRow + h * 16);
#pragma unroll
          for (int i = 2 * h; i < 2 * h + 2; ++i)
#pragma unroll
            for (int wn = 0; wn < WT; ++wn) {
              uint32_t af[4];
              a8_frag(word_of_rt(w[wn], i), af);
#pragma unroll
              for (int mt = 0; mt < RT; ++mt)
                mma16832_u8s8(acc[wn][mt], af, (i & 1) ? xv[mt].z : xv[mt].x, (i & 1) ? xv[mt].w : xv[mt].y);
            }
        } else {  // RT = 8: the 2 x WT decoded words of the half k-block live, one x fragment at a time
          uint32_t af[2][WT][4];  // (32 x fragments would not fit beside 64 accumulators in 128 registers)
#pragma unroll
          for (int ii = 0; ii < 2; ++ii)
#pragma unroll
            for (int wn = 0; wn < WT; ++wn) a8_frag(word_of_rt(w[wn], 2 * h + ii), af[ii][wn]);
#pragma unroll
          for (int mt = 0; mt < RT; ++mt) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xb + mt * 8 * kGemmXRow + h * 16);
#pragma unroll
            for (int wn = 0; wn < WT; ++wn) {
              mma16832_u8s8(acc[wn][mt], af[0][wn], xv.x, xv.y);
              mma16832_u8s8(acc[wn][mt], af[1][wn], xv.z, xv.w);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  // The epilogue, through shared memory: the warps' fragments go to the CTA's sums tile s_acc
  // [kBM][kAccLd], and everything after works on that tile cooperatively, coalesced along N: the
  // split-K slices (16-byte stores / loads, tile-major so no bounds checks), the factors, the
  // outputs. (The first version went output by output from registers: per thread 32 load -> store
  // chains the compiler cannot reorder (they may alias), ~10 us of the "~18 us floor" that H200
  // runs 12 - 14 measured on small layers with split-K; its stores touched 4 rows x 16 B per warp.)
  constexpr int kCh = G::kCh, kLd = G::kAccLd, kTileInts = G::kBM * kCh, kVecs = kTileInts / 4;
  static_assert(kVecs % G::kThreads == 0, "whole vectors (and outputs) per thread");
  int32_t* s_acc = reinterpret_cast<int32_t*>(gsm);
  float* s_sc = reinterpret_cast<float*>(s_acc + G::kBM * kLd);
  float* s_bi = s_sc + kCh;
  float* s_xs = s_bi + kCh;
  int* s_rs = reinterpret_cast<int*>(s_xs + G::kBM);
  __syncthreads();  // every warp is past its last read of the ring
  if constexpr (G::kWG) {  // d[4j + q]: x row 8j + 2c + (q & 1), channel 16 warp + g + 8 (q >> 1)
#pragma unroll
    for (int j = 0; j < G::kBM / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        s_acc[(8 * j + 2 * c + (q & 1)) * kLd + warp * kTileN + g + 8 * (q >> 1)] = accw[4 * j + q];
  } else {
#pragma unroll
    for (int wn = 0; wn < WT; ++wn)
#pragma unroll
      for (int mt = 0; mt < RT; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          s_acc[(8 * RT * wrow + 8 * mt + 2 * c + (q & 1)) * kLd + (WT * wcol + wn) * kTileN + g + 8 * (q >> 1)] =
              acc[wn][mt][q];
  }
  __syncthreads();
  // vector v of the tile: row v / (kCh / 4), channels 4 * (v % (kCh / 4)) ..
  auto tile_vec = [&](int v) -> int4* {
    return reinterpret_cast<int4*>(s_acc + (v / (kCh / 4)) * kLd + 4 * (v % (kCh / 4)));
  };
  if (ks > 1) {
    // n_cnt: tile counters; the slices after them start at a multiple of 4 ints (16-byte vectors)
    const size_t n_cnt = (size_t)gridDim.x * gridDim.y, tile = blockIdx.y * gridDim.x + blockIdx.x,
                 sl0 = (n_cnt + 3) & ~(size_t)3;
    // ws = one counter per (x, y) tile (zeroed by the quantizer launched just before), then from
    // sl0 ks slices, each the [kBM][kCh] int32 tiles of the grid in tile order. CTA z stores its
    // tile to slice z; the CTA that arrives last at its tile's counter adds the other slices
    // (exact integer sums: bit-identical in any order) (threadFenceReduction pattern).
    int4* mine = reinterpret_cast<int4*>(ws + sl0 + ((size_t)blockIdx.z * n_cnt + tile) * kTileInts);
#pragma unroll
    for (int j = 0; j < kVecs / G::kThreads; ++j) __stcg(mine + tid + j * G::kThreads, *tile_vec(tid + j * G::kThreads));
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(ws + tile, 1) == ks - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // slice by slice, each thread's kVecs / kThreads vectors of a slice loaded together (unrolled:
    // one L2 round trip per slice, not per vector); early: two slices per round trip
    auto add_slice = [&](const int4 (&o)[kVecs / G::kThreads]) {
#pragma unroll
      for (int j = 0; j < kVecs / G::kThreads; ++j) {
        int4* t = tile_vec(tid + j * G::kThreads);
        t->x += o[j].x;
        t->y += o[j].y;
        t->z += o[j].z;
        t->w += o[j].w;
      }
    };
    auto slice = [&](int z) {
      return reinterpret_cast<const int4*>(ws + sl0 + ((size_t)z * n_cnt + tile) * kTileInts);
    };
    const int bz = blockIdx.z;
    for (int z = 0; z < ks; ++z) {
      if (z == bz) continue;
      int4 o[kVecs / G::kThreads];
#pragma unroll
      for (int j = 0; j < kVecs / G::kThreads; ++j) o[j] = __ldcg(slice(z) + tid + j * G::kThreads);
      int z2 = z + 1 + (z + 1 == bz);  // the next slice that is not this CTA's
      if (early && z2 < ks) {
        int4 o2[kVecs / G::kThreads];
#pragma unroll
        for (int j = 0; j < kVecs / G::kThreads; ++j) o2[j] = __ldcg(slice(z2) + tid + j * G::kThreads);
        add_slice(o);
        add_slice(o2);
        z = z2;
      } else {
        add_slice(o);
      }
    }
  }
  // the factors of the CTA's channels and rows, then each output with store_out's arithmetic
  // (bit-identical to the other a8 kernels), consecutive threads on consecutive channels
  for (int i = tid; i < kCh; i += G::kThreads) {
    const int n = t0 * kTileN + i;
    s_sc[i] = n < N ? scale[n] : 0.f;
    s_bi[i] = (n < N && bias != nullptr) ? to_f32<T>(bias[n]) : 0.f;
  }
  for (int i = tid; i < G::kBM; i += G::kThreads) {
    const int m = m0 + i;
    s_xs[i] = m < M ? xs[m] : 1.f;
    s_rs[i] = m < M ? rowsum[m] : 0;
  }
  __syncthreads();
  const int rows = min(G::kBM, M - m0), cols = min(kCh, N - t0 * kTileN);
#pragma unroll 8
  for (int j = 0; j < G::kBM * kCh / G::kThreads; ++j) {  // unrolled: loads of 8 outputs in flight
    const int i = tid + j * G::kThreads, r = i / kCh, col = i % kCh;
    if (r >= rows || col >= cols) continue;
    float o = a8_value(s_acc[r * kLd + col] - s_rs[r], s_xs[r], s_sc[col]);
    if (bias != nullptr) o = __fadd_rn(o, s_bi[col]);
    y[(size_t)(m0 + r) * N + t0 * kTileN + col] = from_f32<T>(o);
  }
}

// The a8 quantizer for a8_small_kernel: the same values as quant_rows_kernel (bit for bit), xq
// stored permuted within each group of 8 inputs ({0,4,1,5,2,6,3,7}, see a8_small_kernel), with
// 16-byte loads (vec: K % 8 == 0 and 16-byte aligned x) and one 8-byte store per group.
// kWG (the wgmma GEMM loop, GemmWG; k-block-major only): within each 128-byte k-block row, group
// G = 4c + i (inputs 8G ..) goes as two 4-byte halves to bytes 32i + 4c and 32i + 16 + 4c. wgmma
// reads input k of k-step i at byte 32i + k, and lane c's A fragment (the same decoded weight
// words as the mma.sync loop) holds inputs 4c .. 4c + 3 and 16 + 4c ..: this puts there the x
// bytes the mma.sync loop's lane c multiplies them with (bytes 32c + 8i .. + 7 of the plain order).
// kXI (a8_small_kernel kXI, MT = 2 / 4 / 8; k-block-major only): each k-block's 8-row tile (1 KB) interleaved so
// that a warp's 16-byte loads read 512 contiguous bytes: the 8 bytes of row g at plain offset kk = 32c + 16h +
// 8q of the k-block go to byte 512h + 64g + 16c + 8q of the tile (Mp = 64, MT = 8: 8-byte loads, 256 contiguous
// bytes, see xi_offset).
// MT = 8 (Mp = 64 rows, 32 < M <= 64; a8_small_kernel kXI loads one 8-byte word i of each row tile at a time):
// the 8 bytes of row g at plain offset kk = 32c + 8i go to byte 256i + 32g + 8c of the tile, i.e. lane l = 4g + c's
// word i at 256i + 8l, so that each warp load reads 256 contiguous bytes (8 sectors) where the plain order reads
// 8 rows x 4 quarter-used sectors (32) and the 16-byte interleave above 16 half-used ones.
// The interleaved layout's byte of row m at row-major offset k (k % 8 == 0) in a k-block-major xq of Mp rows:
// quant_rows_perm_kernel kXI, quant_rows_cluster_kernel kXI and rms_norm_quant_kernel (layout 1, Mp 16 / 32
// only) write it, a8_small_kernel kXI reads it. The piece size follows Mp: 8 bytes at Mp >= 64 (the MT = 8 tiles: 64
// rows, or 128 = two row tiles of 64, TRIT_A8_MT8_ROWS2), else 16.
__device__ __forceinline__ size_t xi_offset(int m, int k, int Mp) {
  const int kk = k & (kBlockK - 1);
  const size_t tile = ((size_t)(k >> 7) * Mp + (m & ~7)) * kBlockK;
  if (Mp >= 64) return tile + 256 * ((kk >> 3) & 3) + 32 * (m & 7) + 8 * (kk >> 5);
  return tile + 512 * ((kk >> 4) & 1) + 64 * (m & 7) + 16 * (kk >> 5) + 8 * ((kk >> 3) & 1);
}
// kNat: the v4 a8_kernel's layout (row-major [M, Kp], Mp = 0) in natural byte order - quant_rows_kernel's bytes, with
// 16-byte loads and the PDL trigger / wait (TRIT_A8_V4Q, default 1; the v4 route's and a8_dense's quantizer).
template <typename T, bool kWG = false, bool kXI = false, bool kNat = false>
__global__ void __launch_bounds__(256) quant_rows_perm_kernel(const T* __restrict__ x, int8_t* __restrict__ xq,
                                                              float* __restrict__ xs_out,
                                                              int32_t* __restrict__ rowsum, int M, int K, int Kp,
                                                              int Mp, bool vec, int32_t* __restrict__ zero,
                                                              int n_zero) {
  __shared__ float sh_f[8];
  __shared__ int sh_i[8];
  pdl_trigger();  // the GEMV may launch now and stream its weights; it waits for this grid
  pdl_wait();     // x comes from the kernel before
  const int m = blockIdx.x;
  // the split-K tile counters of the a8_gemm_kernel launched next (split by stores): zeroed here
  // instead of by a memset node in front; that kernel reads them only after its pdl_wait
  if (m == 0)
    for (int i = threadIdx.x; i < n_zero; i += blockDim.x) zero[i] = 0;
  // Mp == 0: row-major [M, Kp]; else k-block-major [Kp/128][Mp][128] (a8_small_kernel, MT >= 2)
  static_assert(!(kWG && kXI) && !(kNat && (kWG || kXI)), "one k-block order");
  auto dst = [&](int k) {
    if constexpr (kXI) return reinterpret_cast<uint2*>(xq + xi_offset(m, k, Mp));
    return reinterpret_cast<uint2*>(Mp > 0 ? xq + ((size_t)(k >> 7) * Mp + m) * kBlockK + (k & (kBlockK - 1))
                                           : xq + (size_t)m * Kp + k);
  };
  if (m >= M) {  // padding row of the k-block-major layout: zeros (its outputs are never stored)
    for (int k = threadIdx.x * 8; k < Kp; k += blockDim.x * 8) *dst(k) = make_uint2(0u, 0u);
    return;
  }
  const T* row = x + (size_t)m * K;
  int sum;
  const float xs = quantize_row_perm<T>(row, K, Kp, vec, sh_f, sh_i, [&](int k, uint2 v) {
    if constexpr (kWG) {
      int8_t* rb = xq + ((size_t)(k >> 7) * Mp + m) * kBlockK;
      const int grp = (k & (kBlockK - 1)) >> 3, cc = grp >> 2, ii = grp & 3;
      *reinterpret_cast<uint32_t*>(rb + 32 * ii + 4 * cc) = v.x;
      *reinterpret_cast<uint32_t*>(rb + 32 * ii + 16 + 4 * cc) = v.y;
    } else if constexpr (kNat) {  // quant_group8's {0,4,1,5 | 2,6,3,7} back to 0..7
      *dst(k) = make_uint2(__byte_perm(v.x, v.y, 0x6420), __byte_perm(v.x, v.y, 0x7531));
    } else {
      *dst(k) = v;
    }
  }, sum);
  if (threadIdx.x == 0) {
    rowsum[m] = sum;
    xs_out[m] = xs;
  }
}

// Thread-block clusters (sm_90): the CTA's rank, the cluster barrier (arrive / wait halves) and
// stores into another CTA's shared memory (distributed shared memory).
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_sync() {  // release my stores, acquire the others'
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
template <typename V>
__device__ __forceinline__ void st_cluster(V* local, unsigned rank, V v) {  // *local in CTA `rank` = v
  static_assert(sizeof(V) == 4, "32-bit values");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  uint32_t bits;
  memcpy(&bits, &v, 4);
  asm volatile("st.shared::cluster.b32 [%0], %1;" ::"r"(r), "r"(bits) : "memory");
#endif
}

// The a8 quantizer of the M <= 8 GEMV (row-major [M, Kp] layout, quant_rows_perm_kernel's values and
// byte order bit for bit) with one row split over a cluster of S CTAs (grid (S, M), cluster (S, 1, 1);
// TRIT_QUANT_CLUSTER, see quant_cluster_size). H200 run 22: the loop kernel's cost in front of the
// M = 1 GEMV grows with K (0.7 us at K = 2560 to 7.4 us at K = 28672: one CTA walks the row twice, a
// memory round trip per 2048 inputs and pass). Here every thread loads its <= kQcVecs groups of 8 at
// once (all loads issued before the first use) and keeps them in registers: one round trip per CTA,
// no second pass. The CTAs exchange their
// |x| maxima through distributed shared memory (each writes its maximum into every CTA's s_amax),
// quantize their groups with the same xs, and send their partial row sums to rank 0, which writes
// xs and rowsum. Three cluster barriers: the first (arrive at entry, wait before the first remote
// store) only makes sure every CTA of the cluster runs before its shared memory is written.
// kXI (MT = 2 / 4 behind the interleaved-xq GEMV; TRIT_QUANT_CLUSTER_XI=0 keeps the loop kernel there): quant_rows_perm_kernel kXI's layout
// (xi_offset, Mp rows), grid (S, Mp): the clusters of rows M .. Mp - 1 write their zeros and use no barrier (a
// cluster is one row, so the branch is uniform across it).
// kAct (trit_mm_a8_act, TRIT_ACT_QUANT): x holds rows [gate | up] of 2K and the row quantized is
// act(gate) * up in T (chain_act: torch's ops and roundings, act 1 relu^2, 2 silu) - the values the act kernel in
// front would have written, so the quantization is bit for bit that of ternary_mm_a8(act(gate) * up), with one
// kernel fewer and no round trip of the product through memory.
// kKbm (a8_gemm_kernel's quantizer, TRIT_A8_GEMM_QCL; not with kXI / kAct): quant_rows_perm_kernel's k-block-major
// layouts of Mp rows - 1 plain ([Kp/128][Mp][128]), 2 the wgmma byte order (kWG) - grid (S, Mp), the clusters of
// rows M .. Mp - 1 writing zeros; rank 0 of row 0's cluster zeroes the n_zero split-K tile counters at zero after the
// PDL wait, as quant_rows_perm_kernel's CTA 0 does.
constexpr int kQcVecs = 4;  // groups of 8 per thread: S = 8 CTAs x 256 threads x 4 x 8 = K <= 65536
template <typename T, bool kXI = false, bool kAct = false, int kKbm = 0>
__global__ void __launch_bounds__(256) quant_rows_cluster_kernel(const T* __restrict__ x, int8_t* __restrict__ xq,
                                                                 float* __restrict__ xs_out,
                                                                 int32_t* __restrict__ rowsum, int K, int Kp,
                                                                 int S, bool vec, int M, int Mp, int act,
                                                                 int32_t* __restrict__ zero, int n_zero) {
  static_assert(kKbm == 0 || (!kXI && !kAct), "one xq layout");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float sh_f[8];
  __shared__ int sh_i[8];
  __shared__ float s_amax[8];  // [rank]: every CTA's maximum, written by that CTA
  __shared__ int s_part[8];    // rank 0's copy: every CTA's partial row sum
  const unsigned rank = cluster_ctarank();
  const int m = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = Kp >> 3, per = (G + S - 1) / S, g0 = (int)rank * per, g1 = min(G, g0 + per);
  auto put = [&](int g, uint2 v) {  // row m's 8 bytes of group g
    if constexpr (kKbm == 2) {  // quant_rows_perm_kernel kWG: two 4-byte halves within the row's k-block
      int8_t* rb = xq + ((size_t)(g >> 4) * Mp + m) * kBlockK;
      const int grp = g & 15, cc = grp >> 2, ii = grp & 3;
      *reinterpret_cast<uint32_t*>(rb + 32 * ii + 4 * cc) = v.x;
      *reinterpret_cast<uint32_t*>(rb + 32 * ii + 16 + 4 * cc) = v.y;
    } else if constexpr (kKbm == 1) {
      *reinterpret_cast<uint2*>(xq + ((size_t)(g >> 4) * Mp + m) * kBlockK + (size_t)(g & 15) * 8) = v;
    } else {
      *reinterpret_cast<uint2*>(xq + (kXI ? xi_offset(m, g * 8, Mp) : (size_t)m * Kp + (size_t)g * 8)) = v;
    }
  };
  if (m >= M) {  // a zero row of the interleaved / k-block-major tiles (every CTA of this cluster is here: no barrier)
    pdl_trigger();
    pdl_wait();  // the kernel before may still read xq
    for (int g = g0 + tid; g < g1; g += 256) put(g, make_uint2(0u, 0u));
    return;
  }
  cluster_arrive_relaxed();
  pdl_trigger();  // the GEMV may launch now and stream its weights; it waits for this grid
  pdl_wait();     // x comes from the kernel before
  if constexpr (kKbm != 0) {  // the split-K tile counters of the a8_gemm_kernel launched next (it reads them only
    if (m == 0 && rank == 0)  // after its own PDL wait, i.e. once this grid has finished)
      for (int i = tid; i < n_zero; i += 256) zero[i] = 0;
  }
  const T* row = x + (size_t)m * (kAct ? 2 * K : K);
  const T* up = row + K;  // kAct: the up half of the row
  float e[kQcVecs][8];
  if (vec) {  // K % 8 == 0, aligned rows: every load issued before any is used (one round trip)
    constexpr int kW = sizeof(T) == 2 ? 1 : 2;  // 16-byte words per group of 8
    constexpr int kR = kAct ? 2 : 1;             // rows read: x, or gate and up
    uint4 raw[kQcVecs][kR][kW];
#pragma unroll
    for (int v = 0; v < kQcVecs; ++v) {
      const int g = g0 + tid + v * 256;
      const bool in = g < g1 && g * 8 < K;  // groups past K (up to Kp): zeros
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int w = 0; w < kW; ++w)
          raw[v][r][w] = in ? __ldg(reinterpret_cast<const uint4*>((r == 0 ? row : up) + (size_t)g * 8) + w)
                            : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int v = 0; v < kQcVecs; ++v) {
      const T* h = reinterpret_cast<const T*>(&raw[v][0][0]);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[v][i] = to_f32<T>(h[i]);
      if constexpr (kAct) {
        // the activation only on groups of the row (act(0) * 0 = +0 past it, as loaded): by inference most of
        // kAct's instructions (H100 run 93, a8_act_cluster_size)
        const int g = g0 + tid + v * 256;
        if (g < g1 && g * 8 < K) {
          const T* hu = reinterpret_cast<const T*>(&raw[v][kR - 1][0]);
#pragma unroll
          for (int i = 0; i < 8; ++i) e[v][i] = chain_act<T>(act, e[v][i], to_f32<T>(hu[i]));
        }
      }
    }
  } else {
#pragma unroll
    for (int v = 0; v < kQcVecs; ++v) {
      const int g = g0 + tid + v * 256;
      if (g < g1) {
        load8<T>(row, g * 8, K, false, e[v]);  // scalar loads, zeros past K
        if constexpr (kAct) {
          float u[8];
          load8<T>(up, g * 8, K, false, u);
#pragma unroll
          for (int i = 0; i < 8; ++i) e[v][i] = g * 8 + i < K ? chain_act<T>(act, e[v][i], u[i]) : 0.f;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) e[v][i] = 0.f;
      }
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int v = 0; v < kQcVecs; ++v)
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(e[v][i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) sh_f[warp] = amax;
  __syncthreads();
  cluster_wait();  // every CTA of the cluster has started: its shared memory may be written
  if (tid < S) {
    float a = sh_f[0];
    for (int w = 1; w < 8; ++w) a = fmaxf(a, sh_f[w]);
    st_cluster(&s_amax[rank], (unsigned)tid, a);
  }
  cluster_sync();
  amax = s_amax[0];
  for (int r = 1; r < S; ++r) amax = fmaxf(amax, s_amax[r]);
  const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;  // as torch: reciprocal(t) * 127
  int part = 0;
#pragma unroll
  for (int v = 0; v < kQcVecs; ++v) {
    const int g = g0 + tid + v * 256;
    if (g < g1) put(g, quant_group8(e[v], xs, part));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) sh_i[warp] = part;
  __syncthreads();
  if (tid == 0) {
    int sum = 0;
    for (int w = 0; w < 8; ++w) sum += sh_i[w];
    st_cluster(&s_part[rank], 0u, sum);
  }
  cluster_sync();  // after it rank 0 reads only its own shared memory: the others may exit
  if (rank == 0 && tid == 0) {
    int sum = 0;
    for (int r = 0; r < S; ++r) sum += s_part[r];
    rowsum[m] = sum;
    xs_out[m] = xs;
  }
#else
  __trap();
#endif
}

// ---------------------------------------------------------------- naive + decode
__device__ __forceinline__ int code_at(const int32_t* __restrict__ wp, int KB, int n, int k) {
  const int t = n >> 4, rr = n & 15, g = rr & 7, rs = rr >> 3;
  const int kb = k >> 7, kq = k & 127, c = kq >> 5, i = (kq >> 3) & 3, kk = k & 7;
  const int word = wp[((size_t)t * KB + kb) * 128 + (g * 4 + c) * 4 + i];
  const int bit = 16 * (kk & 1) + 2 * (4 * (kk >> 2) + 2 * ((kk >> 1) & 1) + rs);
  return (word >> bit) & 3;
}

template <typename T>
__global__ void naive_kernel(const T* __restrict__ x, const int32_t* __restrict__ wp,
                             const float* __restrict__ scale, const T* __restrict__ bias,
                             T* __restrict__ y, int M, int N, int K, int KB) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y;
  if (n >= N || m >= M) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += to_f32<T>(x[(size_t)m * K + k]) * (float)(code_at(wp, KB, n, k) - 1);
  float o = acc * scale[n];
  if (bias != nullptr) o += to_f32<T>(bias[n]);
  y[(size_t)m * N + n] = from_f32<T>(o);
}

template <typename T> struct OutVal {
  static __device__ __forceinline__ T make(int w, float s) { return from_f32<T>((float)w * s); }
};
template <> struct OutVal<int8_t> {
  static __device__ __forceinline__ int8_t make(int w, float) { return (int8_t)w; }
};

// Grid (words-per-row / 256, packed rows): one thread per packed word = 2 rows x 8 consecutive
// inputs. Consecutive threads write consecutive 8-element runs of the same rows: 16 threads
// cover 128 contiguous inputs of two rows, so stores coalesce into 256-byte runs.
template <typename T>
__global__ void __launch_bounds__(256) decode_kernel(const int32_t* __restrict__ wp,
                                                     const float* __restrict__ scale, T* __restrict__ out,
                                                     int N, int K, int words_per_row) {
  const int widx = blockIdx.x * blockDim.x + threadIdx.x;
  if (widx >= words_per_row) return;
  const int t = blockIdx.y;
  const uint32_t w = (uint32_t)__ldg(wp + (size_t)t * words_per_row + widx);
  const int kb = widx >> 7, lane = (widx & 127) >> 2, i = widx & 3;
  const int g = lane >> 2, c = lane & 3;
  const int k0 = kb * kBlockK + c * 32 + 8 * i;
  const bool full = (k0 + 8 <= K) && (K % 8 == 0);
#pragma unroll
  for (int rs = 0; rs < 2; ++rs) {
    const int n = t * kTileN + g + 8 * rs;
    if (n >= N) continue;
    const float s = scale != nullptr ? __ldg(scale + n) : 1.f;
    alignas(16) T v[8];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const int bit = 16 * (kk & 1) + 2 * (4 * (kk >> 2) + 2 * ((kk >> 1) & 1) + rs);
      v[kk] = OutVal<T>::make((int)((w >> bit) & 3u) - 1, s);
    }
    T* dst = out + (size_t)n * K + k0;
    if (full) {  // 8 elements: 8 (int8), 16 (half) or 32 (float) bytes, aligned as K % 8 == 0
      if constexpr (sizeof(T) == 1) {
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(v);
      } else if constexpr (sizeof(T) == 2) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      } else {
        reinterpret_cast<uint4*>(dst)[0] = reinterpret_cast<const uint4*>(v)[0];
        reinterpret_cast<uint4*>(dst)[1] = reinterpret_cast<const uint4*>(v)[1];
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        if (k0 + kk < K) dst[kk] = v[kk];
    }
  }
}

// ---------------------------------------------------------------- launch configuration
struct Cfg {
  int mt, wn, nw, ks;
};

int max_threads(int mt) { return mt == 1 ? Shape<1>::kMaxThreads : Shape<2>::kMaxThreads; }

// Chosen from shapes only (never values). M = 1..8: one 16-row tile per warp and split-K
// (up to 16 warps per CTA) until ~4096 warps are in flight (about 31 per SM on an H200).
// M > 8: NW = 4 warps per CTA along N share x through L1; split-K grows (NW shrinking when
// the thread limit binds) until there are >= 2 CTAs per SM. Every warp keeps >= 2 k-blocks.
Cfg choose_cfg(int M, int N, int K, int max_mt = 8, int max_thr = 0) {
  Cfg c;
  c.mt = min(max_mt, M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8);
  c.wn = c.mt == 1 ? 1 : 2;
  c.nw = c.mt == 1 ? 1 : 4;
  c.ks = 1;
  const int n_tiles = (N + kTileN - 1) / kTileN;
  const long gy = (M + 8 * c.mt - 1) / (8 * c.mt);
  const int KB = (K + kBlockK - 1) / kBlockK;
  const int maxw = (max_thr > 0 ? max_thr : max_threads(c.mt)) / 32;
  for (;;) {
    const long ctas = (long)((n_tiles + c.wn * c.nw - 1) / (c.wn * c.nw)) * gy;
    const bool enough = c.mt == 1 ? ctas * c.ks >= 4096 : (ctas >= 264 && ctas * c.nw * c.ks >= 2048);
    if (enough || KB / (2 * c.ks) < 2) break;
    // split-K buffer (nw*ks*wn*mt*512 bytes) stays within 32 KB: no opt-in to > 48 KB needed;
    // trading nw for ks keeps nw*ks, hence the buffer, constant
    const bool smem_ok = 2L * c.nw * c.ks * c.wn * c.mt * 512 <= 32768;
    if (c.nw * c.ks * 2 <= maxw && smem_ok) {
      c.ks *= 2;
    } else if (c.nw > 1) {
      c.nw /= 2;
      c.ks *= 2;
    } else {
      break;
    }
  }
  return c;
}

template <typename T, int MT, int WN>
cudaError_t launch_tmm(const Cfg& cfg, const T* x, const int32_t* wp, const float* scale,
                       const T* bias, T* y, int M, int N, int K, cudaStream_t st) {
  const int n_tiles = (N + kTileN - 1) / kTileN, KB = (K + kBlockK - 1) / kBlockK;
  const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
  dim3 grid((n_tiles + WN * cfg.nw - 1) / (WN * cfg.nw), (M + 8 * MT - 1) / (8 * MT));
  dim3 block(cfg.ks * 32, cfg.nw);
  const size_t smem = (size_t)cfg.nw * cfg.ks * WN * MT * 128 * sizeof(float);
  tmm_kernel<T, MT, WN><<<grid, block, smem, st>>>(x, reinterpret_cast<const int4*>(wp), scale, bias, y, M, N,
                                                   K, KB, n_tiles, vec);
  return cudaGetLastError();
}

// Small-M (v5) knobs, read from the environment on every call (host only, no sync), so one
// process can time the variants side by side; a CUDA graph keeps what was chosen at capture.
//   TRIT_KERNEL = v5 (default) | v4   kernel generation for M <= 32 / 64 (v4: tmm_kernel / a8_kernel)
//   TRIT_PDL    = 1 (default) | 0     programmatic dependent launch of the v5 kernels (sm_90+):
//                                     weights stream in while the kernel before still runs
//   TRIT_L2PF   = 1 (default) | 0 | 2 | 3   v5 kernels bulk-prefetch each warp's weight range into L2
//                                     (1: where it measured faster, see l2pf_flags; 2: always; 3: only
//                                     the first TRIT_L2PF_HEAD k-blocks (default 8) of each warp's range)
//   TRIT_KS     = n                   split-K warps per CTA for v5 (default: small_cfg), 1..8
//   TRIT_NW     = n                   v5 warps along N per CTA (default: small_cfg), 1..8
//   TRIT_WN     = 0 (default: auto) | 1 | 2   a8 v5 weight tiles per warp at M <= 32 (2: x
//                                     fragments shared by two tiles); auto: see wn_auto
//   TRIT_A8_FUSEQ = -1 (default: auto) | 0 | 1   a8 at M <= 8: the quantizer fused into the GEMV
//                                     (a8_small_kernel kFuseQ); auto: at M = 1 on small layers (fuseq_auto)
//   TRIT_QUANT_CLUSTER = -1 (default: auto) | 0 | n   a8 at M <= 8 (separate quantizer): the row split
//                                     over a cluster of <= n CTAs (quant_rows_cluster_kernel), 0 the
//                                     one-CTA loop kernel; auto: quant_cluster_auto
//   TRIT_A8_GEMM = auto (default) | 0 | 1   a8 at M > 16: a8_gemm_kernel (above 256 only its wgmma loop) (read in bindings.cpp,
//                                     a8_gemm_on: auto by shape; it gives the kernel its split-K workspace)
//   TRIT_A8_GEMM_KS = n               its split-K CTAs (default: gemm_shape)
//   TRIT_A8_GEMM_QCL = -1 (default: auto) | 0 | n   its quantizer: 0 the one-CTA loop kernel (quant_rows_perm_kernel,
//                                     two passes over the row), n > 0 (sm_90) the cluster kernel of <= n CTAs per
//                                     row (quant_rows_cluster_kernel kKbm, quant_cluster_size: the row in registers,
//                                     one pass); bit for bit the same xq; auto: gemm_qcl_auto (n = 1 at K > 8192)
//   TRIT_A8_GEMM_EARLY = 1 (default) | 0   its first weight stages requested before the PDL wait, and
//                                     the split-K slices added two per round trip (H200 run 17: 0.2-1.5 us
//                                     faster than 0 on 30 of 39 shapes x M, never slower by more than 0.6)
//   TRIT_A8_GEMM_WG = auto (default) | 0 | 1 | 2   its main loop: 0 mma.sync, 1 / 2 wgmma with 64 /
//                                     128 x rows per CTA (GemmWG, compute capability 9.0 with an sm_90a
//                                     build); auto: a8_route.h (measured per shape), mma.sync elsewhere
//   TRIT_A8_GEMM_WG_OVERLAP = 0 | 1   the wgmma loop with the next k-block fetched under the running
//                                     wgmma (default 1: every loop the auto route picks, and forced ones)
//   TRIT_A8_GEMM_WG_DEEP = 0 | 1      the overlapped loop with a deeper ring (GemmWGDeep; default: as
//                                     a8_route.h picks, 0 when forced)
//   TRIT_A8_GEMM_CFG = 0 (default) | 1-4   its warp tile (gemm_cfg_id; 1-4 lost on most shapes in run 14)
// The defaults are the measured best on the H200 (bench/results/NOTES.md).
struct Knobs {
  bool v5, pdl;
  int l2pf, ks, nw, wn, fuseq;  // wn 0 and fuseq -1: auto
  int l2pf_head = 0;            // TRIT_L2PF=3: k-blocks prefetched per warp
  bool xi = true;               // TRIT_A8_XI (default 1): the interleaved k-block-major xq at MT = 2 / 4 / 8 (a8_small_kernel kXI)
  bool narrow_nw1 = true;       // TRIT_A8_NARROW_NW1 (default 1): a8_mt4_narrow_nw in small_cfg
};
int env_int(const char* name, int dflt) {
  const char* e = getenv(name);
  return (e != nullptr && *e != '\0') ? atoi(e) : dflt;
}
// TRIT_A8_V4Q (read per call, default 1): the v4 a8 route's and a8_dense's quantizer with 16-byte loads, the v4
// route under PDL (dispatch_a8); 0: quant_rows_kernel and plain launches
bool a8_v4q_on() { return env_int("TRIT_A8_V4Q", 1) != 0; }
Knobs knobs() {
  const char* k = getenv("TRIT_KERNEL");
  Knobs n;
  n.v5 = !(k != nullptr && strcmp(k, "v4") == 0);
  n.pdl = env_int("TRIT_PDL", 1) != 0;
  n.l2pf = env_int("TRIT_L2PF", 1);
  n.l2pf_head = max(1, min(env_int("TRIT_L2PF_HEAD", 8), 1 << 20));
  n.ks = env_int("TRIT_KS", 0);
  n.nw = env_int("TRIT_NW", 0);
  n.wn = env_int("TRIT_WN", 0);
  n.fuseq = env_int("TRIT_A8_FUSEQ", -1);
  n.xi = env_int("TRIT_A8_XI", 1) != 0;
  n.narrow_nw1 = env_int("TRIT_A8_NARROW_NW1", 1) != 0;
  return n;
}
bool pdl_supported() {  // griddepcontrol needs sm_90+; ask once per device
  static int cached[64] = {0};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cached[dev] = major >= 9 ? 1 : 2;
  }
  return cached[dev] == 1;
}

// cudaLaunchKernelEx with (pdl) or without programmatic stream serialization, and (cluster > 0) in thread-block
// clusters of (cluster, 1, 1) (clusters need sm_90: the caller checks, pdl_supported).
template <typename... KArgs, typename... Args>
cudaError_t launch_attrs(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                         int cluster, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}
template <typename... KArgs, typename... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl,
                      Args... args) {
  return launch_attrs(kernel, grid, block, smem, st, pdl, 0, args...);
}
// 256-thread CTAs on grid in clusters of (S, 1, 1)
template <typename... KArgs, typename... Args>
cudaError_t launch_cluster_ex(void (*kernel)(KArgs...), dim3 grid, int S, cudaStream_t st, bool pdl, Args... args) {
  return launch_attrs(kernel, grid, dim3(256), 0, st, pdl, S, args...);
}

// TRIT_QUANT_CLUSTER = n > 0: the cluster quantizer's CTAs per row - the fewest that give each thread
// <= 2 groups of 8 (one 16-byte load each), at most n, but at least the fewest that hold the row in
// registers (kQcVecs groups per thread); 0 (the loop kernel) where that takes more than 8 CTAs (the
// portable cluster size limit: K > 65536). n = 1: one CTA per row while K <= 8192.
// The default (TRIT_QUANT_CLUSTER unset or -1): n = 8 on rows longer than 4096, the loop kernel up to
// 4096. H200 run 23 (M = 1 / 8, a8 with the loop kernel -> with the cluster kernel, us): K = 28672
// 24.8 -> 20.3 / 25.3 -> 20.5 (8192x28672), 14336 10.9 -> 9.0 / 11.4 -> 10.1, 8192 10.1 -> 9.3 and
// 22.0 -> 21.2 (8192x8192, 28672x8192), 6912 6.9 -> 6.7 / 7.5 -> 7.0; at K = 4096 within +-0.3 either
// way (5.6 -> 5.9 on 4096x4096, 13.8 -> 14.0 on 28672x4096), at 2560 equal (the fused quantizer wins
// there at M = 1 anyway, fuseq_auto).
int quant_cluster_auto(int Kp) { return Kp > 4096 ? 8 : 0; }
// vecs: the groups of 8 per thread the CTA count aims at (2 here; the act quantizer asks for 1, a8_act_cluster_size).
int quant_cluster_size(int Kp, int n, int vecs = 2) {
  if (n < 0) n = quant_cluster_auto(Kp);
  if (n <= 0) return 0;
  const int G = Kp / 8;
  const int need = (G + 256 * kQcVecs - 1) / (256 * kQcVecs), want = (G + 256 * vecs - 1) / (256 * vecs);
  const int S = max(need, min(want, min(n, 8)));  // n > 8: 8 (the portable limit), not the loop kernel
  return S <= 8 ? S : 0;
}
// quant_rows_cluster_kernel on grid (S, M) in clusters of (S, 1, 1), with (pdl) or without
// programmatic stream serialization. Clusters need sm_90: the caller checks (pdl_supported).
// Mp > 0: the interleaved layout of Mp rows (kXI; rows M .. Mp - 1 zeros), grid (S, Mp). act != 0: x holds rows
// [gate | up] of 2K and the kernel quantizes act(gate) * up (kAct).
template <typename T>
cudaError_t launch_quant_cluster(int S, const T* x, int8_t* xq, float* xs, int32_t* rowsum, int M, int K, int Kp,
                                 bool vec, cudaStream_t st, bool pdl, int Mp = 0, int act = 0) {
  const dim3 grid(S, Mp > 0 ? Mp : M);
  int32_t* const nz = nullptr;
  if (act != 0)
    return Mp > 0 ? launch_cluster_ex(quant_rows_cluster_kernel<T, true, true>, grid, S, st, pdl, x, xq, xs, rowsum, K,
                                      Kp, S, vec, M, Mp, act, nz, 0)
                  : launch_cluster_ex(quant_rows_cluster_kernel<T, false, true>, grid, S, st, pdl, x, xq, xs, rowsum, K,
                                      Kp, S, vec, M, 0, act, nz, 0);
  return Mp > 0 ? launch_cluster_ex(quant_rows_cluster_kernel<T, true>, grid, S, st, pdl, x, xq, xs, rowsum, K, Kp, S,
                                    vec, M, Mp, 0, nz, 0)
                : launch_cluster_ex(quant_rows_cluster_kernel<T>, grid, S, st, pdl, x, xq, xs, rowsum, K, Kp, S, vec, M,
                                    0, 0, nz, 0);
}
// The a8 GEMM kernel's quantizer as the cluster kernel (kKbm: wg, the wgmma byte order, else the plain k-block-major
// layout) on grid (S, Mp), zeroing the n_zero split-K tile counters at zero.
template <typename T>
cudaError_t launch_quant_cluster_kbm(int S, bool wg, const T* x, int8_t* xq, float* xs, int32_t* rowsum, int M, int K,
                                     int Kp, int Mp, bool vec, cudaStream_t st, bool pdl, int32_t* zero, int n_zero) {
  const dim3 grid(S, Mp);
  return wg ? launch_cluster_ex(quant_rows_cluster_kernel<T, false, false, 2>, grid, S, st, pdl, x, xq, xs, rowsum, K,
                                Kp, S, vec, M, Mp, 0, zero, n_zero)
            : launch_cluster_ex(quant_rows_cluster_kernel<T, false, false, 1>, grid, S, st, pdl, x, xq, xs, rowsum, K,
                                Kp, S, vec, M, Mp, 0, zero, n_zero);
}

// Rows of x per v5 warp: MT 8-row tiles. Where v5 runs, from the H200 table (bench/results,
// 2026-11-30 run 8, v5 against v4 in the same run):
//   fp (tmm_small_kernel): M <= 8 only. MT = 2 / 4 lost to v4 on most shapes (M = 32:
//     28672x8192 160.7 vs 106.9 us, 8192x8192 41.5 vs 29.1): the bf16 decode (LOP3 + HFMA2 per
//     pair) is amortised over MT tiles, but the 4x larger x fragments per k-block are not.
//   a8 (a8_small_kernel): M <= 32 on every shape (MT = 2: 28672x8192 M=16 32.0 vs 50.4 us;
//     MT = 4: M=32 54.0 vs 76.0); MT = 8 (M <= 64) then only on layers with N*K <= 16M (2560x2560
//     12.1 vs 16.0, 4096x4096 15.9 vs 20.0) - on larger ones it lost (28672x8192 171 vs 100).
// Elsewhere (and for fp32 or misaligned x) the v4 kernels.
constexpr int kV5MaxMFp = 8, kV5MaxMA8 = 64;
constexpr int kA8BpMaxM = 32;  // the bitplane layout's GEMV (trit_mm_a8_bp): the MT <= 4 kernels
int v5_mt(int M) { return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8; }
// layout 1 (trit.ops.a8_tile): xq holds a8_tile_rows(M) = 32 * ceil(M / 32) rows, interleaved tiles of Mp rows at
// 8 < M <= 32 (the GEMV's 8 * v5_mt(M)), else row-major; layout 0: M row-major rows.
int a8_tile_rows(int M) { return (M + 31) / 32 * 32; }
int a8_tile_mp(int M) { return M > 8 && M <= 32 ? 8 * v5_mt(M) : 0; }
// 32 < M <= 64 (MT = 8): the v5 GEMV on layers of <= TRIT_A8_MT8_MAXW Mi weights (default 64 = 64 << 20, read per
// call), the GEMM kernel above (bindings.cpp a8_gemm_on); bench.kernels `a8_mt8` forces the GEMV everywhere.
// H200 run 49 (5107b1d, M = 40 / 64, us): once the MT = 8 GEMV read the 8-byte interleaved xq (plain -> interleaved:
// 2560x2560 12.3 -> 8.5, 4096x4096 16.2 -> 10.0, 8192x8192 47.6 -> 22.4 at M = 64) it beat the GEMM kernel up to
// 64 Mi weights: M = 64 6912x2560 12.0 vs 16.2, 2560x6912 12.8 vs 20.0, 6144x4096 14.7 vs 17.7, 13824x2560 18.0 vs
// 18.8, 4096x14336 21.0 vs 26.8, 8192x8192 22.4 vs 23.7 (14336x4096 the exception: 23.5 vs 22.5, M = 40 22.3 vs
// 21.3), and lost above (28672x4096 44.3 vs 27.9, 28672x8192 76.2 vs 48.0, 8192x28672 64.8 vs 54.2).
long a8_mt8_maxw() { return (long)max(0, min(env_int("TRIT_A8_MT8_MAXW", 64), 1 << 20)) << 20; }
// 64 < M <= 128: the MT = 8 GEMV over two CTA rows of 64 x rows each, one quantizer's xq of 128 rows (one launch of
// each; the a8_split64 experiment of H200 run 71 ran two quantizers, two GEMVs and a cat), in place of the GEMM
// kernel / v4, on layers of <= 16 Mi weights (TRIT_A8_MT8_ROWS2 unset or -1; read per call). H100 run 84 (94ef372,
// bench.kernels `a8_rows2` vs `a8`, us, bit for bit): it won on every layer up to 16 Mi weights - 640x2560 M = 72 /
// 96 / 128 8.0 / 8.6 / 8.7 vs 14.2 / 14.3 / 15.1, 2560x2560 10.9 / 12.1 / 13.3 vs 14.8 / 14.8 / 15.2 (humming 13.1
// at 128), 4096x4096 16.0 / 17.3 / 17.2 vs 18.3 / 19.0 / 19.6 (humming 16.5) - and was level to losing above
// (6912x2560 18.5 / 19.1 / 20.3 vs 18.7 / 18.8 / 19.0, 2560x6912 20.1 / 20.8 / 22.2 vs 21.0 / 20.8 / 21.6, 6144x4096
// 23.3 - 25.3 vs 21.5 - 21.7, 14336x4096 39.4 - 42.6 vs 27.4 - 27.6). =1: on every layer the GEMV takes at M = 64
// (<= TRIT_A8_MT8_MAXW Mi weights); =0: never (the GEMM kernel / v4 at every 64 < M <= 128, before 94ef372).
constexpr int kV5MaxMA8Rows2 = 128;
constexpr long kRows2AutoMaxW = 16L << 20;
bool a8_v5(int M, int N, int K) {
  if (M <= 32) return true;
  const long nk = (long)N * K;
  if (nk > a8_mt8_maxw()) return false;
  if (M <= kV5MaxMA8) return true;
  if (M > kV5MaxMA8Rows2) return false;
  const int rows2 = env_int("TRIT_A8_MT8_ROWS2", -1);
  return rows2 == 1 || (rows2 < 0 && nk <= kRows2AutoMaxW);
}

// Split-K for the v5 kernels (ks warps along K per 16-row tile). Measured on the H200
// (bench.kernels --ks-sweep, M = 1, ten shapes): the best ks makes n_tiles * ks reach ~1536-2048
// warps (about one resident wave at 24 warps/SM), e.g. 28672x8192 (1792 tiles) ks = 1,
// 14336x4096 ks = 2, 8192x8192 and 8192x28672 ks = 4, 2560-wide shapes ks = 8; more warps only
// add split-K reductions and a second wave. Every warp keeps >= 2 k-blocks.
// nw tiles per CTA (warps along N reading the same x): 1 at M <= 8 (x is one 8-row tile),
// else up to 4 within the 256-thread CTA, so x is fetched from L2 once per 4 tiles.
// wn weight tiles per warp: 1, or 2 for a8 at MT <= 4 (wn_auto, or TRIT_WN=2); the rules count
// warps (n_tiles / wn of them per split) rather than tiles.
//
// wn_auto, from H200 run 10 (bench/results/NOTES.md, WN=2 column against the default in the same
// run): two tiles per warp won at M = 16 on every layer with N >= 6144 (28672x8192 31.8 -> 24.5 us,
// 8192x28672 33.2 -> 26.5, 14336x4096 12.3 -> 10.2, 8192x8192 13.2 -> 11.1, 6912x2560 7.7 -> 7.2)
// and at M <= 8 matched or won there (6912x2560 M=8 6.4 -> 5.8, 28672x8192 M=8 23.7 -> 22.0); with
// N <= 4096 it lost (2560x2560 M=16 5.6 -> 6.2, 4096x14336 13.1 -> 13.7): half as many warps
// leave the GPU underfilled when there are few tiles.
// At M = 17-32 (the MT = 4 kernel, one CTA per SM) H200 run 12 measured it winning only on the
// 235M-weight layers (28672x8192 54.7 -> 46.7 us, 8192x28672 50.6 -> 45.1) and mixed to losing on
// 58-67M (4096x14336 16.7 -> 16.0, 14336x4096 17.6 -> 18.4, 8192x8192 17.9 -> 18.9, 6912x2560
// 9.4 -> 12.0): auto there only from 128M weights.
bool wn_auto(int mt, int N, int K) {
  return mt <= 2 ? N >= 6144 : (mt == 4 && (long)N * K >= (128L << 20));
}
int sm_count();  // below, with the GEMM kernel's launch
Cfg small_cfg(const Knobs& kn, int M, int N, int K, bool a8) {
  Cfg cfg{v5_mt(M), 1, 1, 1};
  // forced (TRIT_WN=2) or auto (wn_auto) up to MT = 4, M <= 32
  cfg.wn = (a8 && cfg.mt <= 4 && (kn.wn == 2 || (kn.wn == 0 && wn_auto(cfg.mt, N, K)))) ? 2 : 1;
  const int maxw = kV5Threads / 32;
  const int n_tiles = (N + kTileN - 1) / kTileN, KB = (K + kBlockK - 1) / kBlockK;
  const int n_warps = (n_tiles + cfg.wn - 1) / cfg.wn;
  cfg.ks = trit_route::v5_split_ks(n_warps, KB, maxw);
  if (kn.ks > 0) cfg.ks = max(1, min(min(kn.ks, maxw), KB));
  cfg.nw = cfg.mt == 1 ? 1 : trit_route::v5_tiles_per_cta(cfg.ks, maxw);
  // M = 17-32 with two tiles per warp (the largest layers): one wave of CTAs (csrc/a8_route.h)
  static_assert(kV5Threads / 32 == 8, "a8_mt4_wide_nw splits 8 warps per CTA into nw x ks");
  if (a8 && cfg.mt == 4 && cfg.wn == 2 && kn.ks == 0 && kn.nw == 0) {
    const int nw = trit_route::a8_mt4_wide_nw(n_warps, KB, sm_count());
    if (nw > 0) cfg.nw = nw, cfg.ks = maxw / nw;
  }
  // M = 17-32 with one tile per warp and >= 4 split-K warps: one tile per CTA (csrc/a8_route.h; TRIT_A8_NARROW_NW1=0
  // keeps nw = 8 / ks)
  if (a8 && cfg.mt == 4 && cfg.wn == 1 && kn.ks == 0 && kn.nw == 0 && kn.narrow_nw1) {
    const int nw = trit_route::a8_mt4_narrow_nw(cfg.ks);
    if (nw > 0) cfg.nw = nw;
  }
  if (kn.nw > 0) cfg.nw = max(1, min(kn.nw, maxw / cfg.ks));
  return cfg;
}

// L2 bulk prefetch: measured to help only the a8 path on small layers (<= 4 MiB packed), where
// the weights stream into L2 while the quantizer runs (2560x2560: 4.6 vs 4.9 us); on large
// layers it cost up to 10% (28672x8192: 26.3 vs 23.7 us) and the fp path never gained.
// TRIT_L2PF=0 turns it off everywhere, TRIT_L2PF=2 forces it on, TRIT_L2PF=3 prefetches the head of each
// warp's range only (head k-blocks; the a8 GEMV at M = 1 waits ~2 us for its quantizer with only its first
// chunk in flight).
int l2pf_flags(int l2pf, bool a8, int N, int K, int head = 0) {
  if (l2pf == 2) return kFlagL2Prefetch;
  if (l2pf == 3) return kFlagL2Prefetch | (head << kFlagL2HeadShift);
  return (l2pf == 1 && a8 && (long)N * K <= (16L << 20)) ? kFlagL2Prefetch : 0;
}

template <typename T>
cudaError_t launch_small(const Knobs& kn, const T* x, const int32_t* wp, const float* scale, const T* bias, T* y,
                         int M, int N, int K, cudaStream_t st) {
  const Cfg cfg = small_cfg(kn, M, N, K, false);  // M <= kV5MaxMFp = 8: mt = 1
  const int n_tiles = (N + kTileN - 1) / kTileN, KB = (K + kBlockK - 1) / kBlockK;
  const size_t smem = (size_t)cfg.nw * cfg.ks * 128 * sizeof(float);
  return launch_ex(tmm_small_kernel<T>, dim3((n_tiles + cfg.nw - 1) / cfg.nw), dim3(cfg.ks * 32, cfg.nw), smem, st,
                   kn.pdl && pdl_supported(), x, reinterpret_cast<const int4*>(wp), scale, bias, y, M, N, K, KB,
                   n_tiles, l2pf_flags(kn.l2pf, false, N, K, kn.l2pf_head));
}

template <typename T>
cudaError_t dispatch_tmm(const T* x, const int32_t* wp, const float* scale, const T* bias, T* y,
                         int M, int N, int K, cudaStream_t st) {
  if constexpr (sizeof(T) == 2) {
    const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
    if (M <= kV5MaxMFp && vec) {
      const Knobs kn = knobs();
      if (kn.v5) return launch_small<T>(kn, x, wp, scale, bias, y, M, N, K, st);
    }
  }
  // MT stops at 4 (32 rows per grid row): MT = 8 spills registers
  const Cfg cfg = choose_cfg(M, N, K, 4);
  switch (cfg.mt) {
    case 1: return launch_tmm<T, 1, 1>(cfg, x, wp, scale, bias, y, M, N, K, st);
    case 2: return launch_tmm<T, 2, 2>(cfg, x, wp, scale, bias, y, M, N, K, st);
    default: return launch_tmm<T, 4, 2>(cfg, x, wp, scale, bias, y, M, N, K, st);
  }
}

template <typename T, int MT, int WN>
cudaError_t launch_a8(const Cfg& cfg, const int8_t* xq, const float* xs, const int32_t* rowsum,
                      const int32_t* wp, const float* scale, const T* bias, T* y, int M, int N,
                      int K, cudaStream_t st, bool pdl = false) {
  const int n_tiles = (N + kTileN - 1) / kTileN, KB = (K + kBlockK - 1) / kBlockK;
  dim3 grid((n_tiles + WN * cfg.nw - 1) / (WN * cfg.nw), (M + 8 * MT - 1) / (8 * MT));
  dim3 block(cfg.ks * 32, cfg.nw);
  const size_t smem = (size_t)cfg.nw * cfg.ks * WN * MT * 128 * sizeof(int);
  return launch_ex(a8_kernel<T, MT, WN>, grid, block, smem, st, pdl, xq, xs, rowsum,
                   reinterpret_cast<const int4*>(wp), scale, bias, y, M, N, KB, n_tiles);
}

// Shared memory of the fused-quantizer a8 kernel beyond its split-K buffer (see a8_small_kernel).
size_t fuseq_smem(int M, int KB) { return (size_t)M * (KB * kBlockK + 16) + 32 * sizeof(int); }

// fuseq_auto, from H200 run 10 (fused-quantizer column against the default in the same run): at
// M = 1 one launch instead of two won on every layer up to 17.7M weights (640x2560 4.7 -> 3.7 us,
// 2560x2560 4.5 -> 4.3, 2560x6912 7.2 -> 6.9, 4096x4096 5.8 -> 5.6) and lost from 58.7M on
// (14336x4096 9.2 -> 11.3, 28672x8192 21.6 -> 37.7): every CTA quantizes the whole row of x, and
// with many CTAs that redundant work outweighs the saved launch. At M = 4 / 8 it lost everywhere
// (2560x2560 M=8 4.8 -> 14.9).
bool fuseq_auto(int M, int N, int K) { return M == 1 && (long)N * K <= (32L << 20); }

// The a8 v5 launch for MT row tiles. The kernel variant follows cfg.wn and fuseq; the fused
// quantizer (x is quantized inside, no xq) exists for MT = 1, one tile per warp, one warp along N.
// (An L2::256B prefetch-size hint on the weight loads, TRIT_L2_256, measured no faster in H200
// run 10 - equal or up to 0.6 us slower at M <= 8 on all ten shapes - and was removed.)
// kRM: xq row-major (trit_mm_a8_pre past M = 8, MT = 2 / 4), see a8_small_kernel.
template <typename T, int MT, bool kBP = false, bool kRM = false, bool kXI = false>
cudaError_t launch_a8_small_mt(const Cfg& cfg, bool pdl, bool fuseq, int flags, const T* x, int K,
                               const int8_t* xq, const float* xs, const int32_t* rowsum, const int32_t* wp,
                               const float* scale, const T* bias, T* y, int M, int N, int KB, cudaStream_t st) {
  static_assert(!kRM || (MT >= 2 && MT <= 4 && !kBP), "row-major xq: the MT = 2 / 4 code-layout kernels");
  const int n_tiles = (N + kTileN - 1) / kTileN, n_warps = (n_tiles + cfg.wn - 1) / cfg.wn;
  size_t smem = (size_t)cfg.nw * cfg.ks * cfg.wn * MT * 128 * sizeof(int);
  auto kernel = a8_small_kernel<T, MT, 1, false, kBP, kRM, kXI>;
  if constexpr (MT <= 4) {  // MT = 8 with two tiles: no registers left
    if (cfg.wn == 2) kernel = a8_small_kernel<T, MT, 2, false, kBP, kRM, kXI>;
  }
  if constexpr (MT == 1) {
    if (fuseq) {
      kernel = a8_small_kernel<T, 1, 1, true, kBP>;
      smem += fuseq_smem(M, KB);
    }
  }
  // MT = 8 past 64 rows (a8_v5, TRIT_A8_MT8_ROWS2): one CTA row per 64 rows of x, xq of Mp = 64 * row tiles rows
  const int rows = MT == 8 ? (M + 63) / 64 : 1;
  // a warp with two tiles has its weights in two streams: the single-range L2 prefetch is off
  return launch_ex(kernel, dim3((n_warps + cfg.nw - 1) / cfg.nw, rows), dim3(cfg.ks * 32, cfg.nw), smem, st, pdl, xq,
                   xs, rowsum, reinterpret_cast<const int4*>(wp), scale, bias, y, M, N, KB, n_tiles,
                   kRM ? 0 : 8 * MT * rows, cfg.wn == 1 ? flags : 0, x, K,
                   A8Pro<T>{nullptr, nullptr, nullptr, 0.f, 0});  // no prologue
}

// The GEMM kernel's quantizer by default (TRIT_A8_GEMM_QCL unset): the cluster kernel with one CTA per row
// (quant_cluster_size: 2 CTAs at 14336, 4 at 28672) on rows longer than 8192, the loop kernel below. H100 run 73
// (bench.kernels `gqcl1` vs `a8`, us): K = 14336 / 28672 won at every M it runs - 4096x14336 M = 128 33.1 -> 31.6,
// M = 192 47.0 -> 45.4 (n = 8: 48.3); 8192x28672 M = 64 54.9 -> 49.8, 128 85.0 -> 79.3, 192 138.5 -> 136.0. At K =
// 8192 it was +-1 us (28672x8192 -0.7..-1.1, 8192x8192 +0.2..-0.1), at K <= 6912 0.2 - 1.0 us slower (2560x2560 M
// = 192 18.1 -> 19.1, 4096x4096 M = 128 19.4 -> 20.1): the loop kernel's two passes cost less than the cluster
// launch on short rows.
int gemm_qcl_auto(int K) { return K > 8192 ? 1 : 0; }

// a8_gemm_kernel's launch (bindings.cpp a8_gemm_on picks the route): a8 at 16 < M <= 256
// through a8_gemm_kernel, fed by the quantizer's k-block-major xq with Mp = M rounded up to BM rows
// (the op's workspace has them). Split-K (ks CTAs along K) when the (N, M) tiles alone fill less
// than one wave of resident CTAs: up to one wave while each CTA keeps >= 4 k-blocks (gemm_shape);
// TRIT_A8_GEMM_KS overrides. ws (ks > 1 only): the tile counters (zeroed by the quantizer) and ks
// slices of per-CTA int32 tiles (not zeroed); trit_mm_a8_gemm_ws_ints gives its size.
constexpr int kA8GemmMaxM = 256;
int sm_count() {
  static int cached[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (cached[dev] == 0) cudaDeviceGetAttribute(&cached[dev], cudaDevAttrMultiProcessorCount, dev);
  return cached[dev] > 0 ? cached[dev] : 132;
}
// The warp-tile configuration: TRIT_A8_GEMM_CFG = 0 (default: the measured <2, 4, 4, WM>, WM = 1 at
// M <= 32) | 1 <2, 8, 4, 1> (128 channels x 64 rows, 8 row tiles per warp) | 2 <2, 8, 8, 1> (256
// channels x 64 rows) | 3 <4, 4, 4, 2> (256 channels x 64 rows, 4 weight tiles per warp) | 4 <4, 4, 4, 1>
// (256 channels x 32 rows: M <= 32 with half the x traffic per weight byte of the default); 1-4 lost
// to the default on most shapes in H200 run 14. Ids: 0 / 1 the default at M <= 32 / above, 2-5 the
// alternatives, 6 / 7 the wgmma main loop with 64 / 128 x rows per CTA (TRIT_A8_GEMM_WG=1 / 2,
// GemmWG; only on compute capability 9.0, where the extension is built for sm_90a: other devices
// keep the default).
// 8 / 9: either with the next k-block fetched under the running wgmma (TRIT_A8_GEMM_WG_OVERLAP=1).
// 10 / 11: the overlapped loops with the deep ring (TRIT_A8_GEMM_WG_DEEP=1, GemmWGDeep).
constexpr int kGemmCfgWG = 6, kGemmCfgWG128 = 7, kGemmCfgWGOv = 8, kGemmCfgWG128Ov = 9, kGemmCfgWGDeep = 10,
              kGemmCfgWG128Deep = 11;
bool gemm_cfg_wg(int id) { return id >= kGemmCfgWG && id <= kGemmCfgWG128Deep; }
bool wgmma_supported() {
#ifdef TRIT_HOST_SM90A
  static int cached[64] = {0};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cached[dev] = (major == 9 && minor == 0) ? 1 : 2;
  }
  return cached[dev] == 1;
#else
  return false;  // not built for sm_90a: the wgmma kernels would trap
#endif
}
// The GEMM kernel's main loop at (M, N, K): wg 0 = mma.sync, 1 / 2 = wgmma with 64 / 128 x rows per
// CTA; ov: the next k-block fetched under the running wgmma; deep: its deeper ring. By default (no
// TRIT_A8_GEMM_WG) a8_route.h's measured choice on compute capability 9.0 with an sm_90a build
// (wgmma_supported), the mma.sync loop elsewhere; TRIT_A8_GEMM_WG = 0 | 1 | 2 forces the loop
// (overlapped), TRIT_A8_GEMM_WG_OVERLAP / _DEEP = 0 | 1 override ov / deep of either; an mma.sync
// warp tile named by TRIT_A8_GEMM_CFG = 1-4 (with TRIT_A8_GEMM_WG unset) runs that tile.
struct GemmLoop {
  int wg;
  bool ov, deep;
};
GemmLoop gemm_loop(int M, int N, int K) {
  GemmLoop l{0, false, false};
  if (!wgmma_supported()) return l;
  const int e = env_int("TRIT_A8_GEMM_WG", -1);
  if (e >= 0) {
    l.wg = (e == 1 || e == 2) ? e : 0;
    l.ov = true;
  } else if (const int c = env_int("TRIT_A8_GEMM_CFG", 0); c >= 1 && c <= 4) {
    return l;  // an mma.sync warp tile asked for by name: that loop
  } else {
    switch (trit_route::a8_gemm_auto_loop(M, N, K, sm_count())) {
      case trit_route::kA8LoopWg: l = {1, true, false}; break;
      case trit_route::kA8LoopWgDeep: l = {1, true, true}; break;
      case trit_route::kA8LoopWg2: l = {2, true, false}; break;
      default: break;  // mma.sync (or, above M = 256, not this kernel)
    }
  }
  l.ov = env_int("TRIT_A8_GEMM_WG_OVERLAP", l.ov ? 1 : 0) == 1;
  l.deep = l.ov && env_int("TRIT_A8_GEMM_WG_DEEP", l.deep ? 1 : 0) == 1;
  return l;
}
int gemm_cfg_id(int M, int N, int K) {
  const GemmLoop l = gemm_loop(M, N, K);
  if (l.wg != 0) {
    if (l.deep) return l.wg == 1 ? kGemmCfgWGDeep : kGemmCfgWG128Deep;
    return l.wg == 1 ? (l.ov ? kGemmCfgWGOv : kGemmCfgWG) : (l.ov ? kGemmCfgWG128Ov : kGemmCfgWG128);
  }
  const int c = env_int("TRIT_A8_GEMM_CFG", 0);
  return (c >= 1 && c <= 4) ? c + 1 : (M <= 32 ? 0 : 1);
}
template <typename F>
decltype(auto) visit_gemm_cfg(int id, F&& f) {
  switch (id) {
    case 0: return f(Gemm<1>{});
    case 2: return f(GemmCfg<2, 8, 4, 1>{});
    case 3: return f(GemmCfg<2, 8, 8, 1>{});
    case 4: return f(GemmCfg<4, 4, 4, 2>{});
    case 5: return f(GemmCfg<4, 4, 4, 1>{});
    case kGemmCfgWG: return f(GemmWG<64>{});
    case kGemmCfgWG128: return f(GemmWG<128>{});
    case kGemmCfgWGOv: return f(GemmWG<64, true>{});
    case kGemmCfgWG128Ov: return f(GemmWG<128, true>{});
    case kGemmCfgWGDeep: return f(GemmWGDeep<64>{});
    case kGemmCfgWG128Deep: return f(GemmWGDeep<128>{});
    default: return f(Gemm<2>{});
  }
}
// The launch shape of a8_gemm_kernel for (M, N, K); the workspace the split-K needs follows from it.
constexpr int kGemmMinKbPerSplit = 4, kGemmMaxSplit = 8;  // run 15: 2560x6912 M = 64 ks 13 27.3 us, ks 8 24.1
struct GemmShape {
  int cfg, BM, Mp, KB, n_tiles, gx, gy, ks, tile_ints;  // tile_ints: int32 sums of one CTA tile
};
GemmShape gemm_shape(int M, int N, int K) {
  GemmShape g;
  g.cfg = gemm_cfg_id(M, N, K);
  int tiles = 0, per_sm = 0;
  visit_gemm_cfg(g.cfg, [&](auto cfg) {
    using G = decltype(cfg);
    g.BM = G::kBM;
    g.tile_ints = G::kBM * G::kCh;
    tiles = G::kTiles;
    per_sm = G::kMinBlocks;
    return 0;
  });
  g.Mp = (M + g.BM - 1) / g.BM * g.BM;
  g.KB = (K + kBlockK - 1) / kBlockK;
  g.n_tiles = (N + kTileN - 1) / kTileN;
  g.gx = (g.n_tiles + tiles - 1) / tiles;
  g.gy = g.Mp / g.BM;
  const int forced = env_int("TRIT_A8_GEMM_KS", 0);
  if (forced > 0) {
    g.ks = max(1, min(forced, g.KB));
  } else {
    // split K until the CTAs fill one wave of resident CTAs, each keeping >= kGemmMinKbPerSplit
    // k-blocks, at most kGemmMaxSplit slices (any count: CTA z runs k-blocks KB*z/ks ..)
    const int wave = sm_count() * per_sm, tiles_xy = g.gx * g.gy;
    g.ks = max(1, min(min(wave / max(tiles_xy, 1), g.KB / kGemmMinKbPerSplit), kGemmMaxSplit));
  }
  return g;
}
template <typename T>
cudaError_t launch_a8_gemm(const T* x, const int32_t* wp, const float* scale, const T* bias, T* y, int M, int N,
                           int K, int8_t* xq, float* xs, int32_t* rowsum, int32_t* ws, cudaStream_t st) {
  const GemmShape g = gemm_shape(M, N, K);
  if (g.ks > 1 && ws == nullptr) return cudaErrorInvalidValue;
  const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
  const bool pdl = env_int("TRIT_PDL", 1) != 0 && pdl_supported();
  // split-K: the quantizer zeroes the tile counters at the head of ws
  const int n_cnt = g.ks > 1 ? g.gx * g.gy : 0;
  const bool wg = gemm_cfg_wg(g.cfg);  // x in the wgmma byte order
  // the quantizer: the one-CTA loop kernel (two passes over the row), or with TRIT_A8_GEMM_QCL=n > 0 (sm_90) the
  // cluster kernel of <= n CTAs per row (quant_cluster_size: the row in registers, one pass); its grid's y (rows) is
  // limited to 65535: the loop kernel past that
  // cluster kernel; default (-1): n = 1 on rows longer than 8192 (gemm_qcl_auto)
  int qcl = env_int("TRIT_A8_GEMM_QCL", -1);
  if (qcl < 0) qcl = gemm_qcl_auto(K);
  if (!pdl_supported() || g.Mp > 65535) qcl = 0;
  const int S = qcl > 0 ? quant_cluster_size(g.KB * kBlockK, qcl) : 0;
  cudaError_t e = S > 0 ? launch_quant_cluster_kbm<T>(S, wg, x, xq, xs, rowsum, M, K, g.KB * kBlockK, g.Mp, vec, st,
                                                      pdl, n_cnt > 0 ? ws : nullptr, n_cnt)
                        : launch_ex(wg ? quant_rows_perm_kernel<T, true> : quant_rows_perm_kernel<T>,
                                    dim3(g.Mp), dim3(256), 0, st, pdl, x, xq, xs, rowsum, M, K,
                                    g.KB * kBlockK, g.Mp, vec, n_cnt > 0 ? ws : nullptr, n_cnt);
  if (e != cudaSuccess) return e;
  const dim3 grid(g.gx, g.gy, g.ks);
  const int4* w4 = reinterpret_cast<const int4*>(wp);
  return visit_gemm_cfg(g.cfg, [&](auto cfg) -> cudaError_t {
    using G = decltype(cfg);
    constexpr size_t smem = (size_t)G::kSmemBytes;
    const auto kernel = a8_gemm_kernel<T, G>;
    if constexpr (smem > 48 * 1024) {  // past the default limit: opt in, once per device (and kernel)
      static int opted[64] = {0};
      int dev = 0;
      if (cudaGetDevice(&dev) != cudaSuccess) return cudaErrorInvalidDevice;
      if (dev < 0 || dev >= 64 || !opted[dev]) {
        const cudaError_t a = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (a != cudaSuccess) return a;
        if (dev >= 0 && dev < 64) opted[dev] = 1;
      }
    }
    return launch_ex(kernel, grid, dim3(G::kThreads), smem, st, pdl, xq, xs, rowsum, w4, scale, bias, y, M, N,
                     g.KB, g.n_tiles, g.Mp, ws, env_int("TRIT_A8_GEMM_EARLY", 1) == 0 ? 0 : 1);
  });
}

// pre (trit_mm_a8_pre): xq / xs / rowsum already hold x quantized in the MT = 1 layout (row-major
// [M, Kp], groups of 8 in quant_rows_perm_kernel's order; trit.ops.a8_quantize, which the model's
// compiler fuses into the norm or activation kernel that produces x): no quantizer launch, no fused
// quantizer, x unused. Where the v5 kernels run at M <= TRIT_A8_PRE_MAXM (a8_pre_ok): M <= 8 the MT = 1
// kernel; 8 < M <= 32 (TRIT_A8_PRE_MAXM, read per call: default 32; 8 or 16 quantize again above it) the
// MT = 2 / 4 kernels reading the row-major xq (kRM), so that a batch of up to 32 decode tokens behind
// rms_norm_a8q / a fused quantizer runs without a quantizer launch too. H200 run 38: bit-identical to
// ternary_mm_a8 in the GPU tests, and faster than quantizing again at every 8B / 70B shape at M = 16 / 32
// (e.g. 4096x14336 M = 32 12.6 vs 16.8 us, 8192x28672 31.2 vs 41.5).
int a8_pre_maxm() { return max(8, min(32, env_int("TRIT_A8_PRE_MAXM", 32))); }
bool a8_pre_ok(int M) { return M >= 1 && M <= a8_pre_maxm() && knobs().v5; }

// act (trit_mm_a8_act, TRIT_ACT_QUANT in trit::ternary_mm_a8_prologue): x = [gate | up] rows of 2K and the layer
// runs on act(gate) * up (chain_act: 1 relu^2, 2 silu), computed by the cluster quantizer (kAct) in front of the
// GEMV the plain op runs at this M: one kernel where the model ran the act kernel and the quantizer. Where it runs
// (a8_act_ok): the v5 GEMV route (M <= 64 within a8_v5), sm_90 (clusters), the interleaved xq at MT >= 2
// (TRIT_A8_XI) and a cluster size for the row: TRIT_QUANT_CLUSTER's n, 8 when unset (so at every K, where the
// plain op keeps the loop kernel up to K = 4096), 0 = none. The CTAs per row aim at one group of 8 per thread
// (TRIT_ACT_QUANT_VECS, default 1; 2 = the plain quantizer's sizing): H100 run 93's ncu put kAct at 2x the plain
// quantizer's time on the same grid (11.3 vs 5.8 us, M = 1, K = 6912, S = 2) issuing ~4.4x its instructions (issue
// rate x active cycles; 8x the branches) in 2 warps per scheduler - by inference the element-wise SiLU (expf, an
// IEEE division with its slow-path branch, four roundings) on every group a thread holds - so the activation is
// spread over more CTAs (K = 6912: 4, 14336: 7) and computed only on the groups in the row (before: on all
// kQcVecs, zeros past it included). H100 run 94: 6.4 / 7.6 us against the plain quantizer's 5.9 / 6.1 (M = 1 /
// 32, K = 6912), ~2.9x its instructions over twice its CTAs; op times plain / actq 0.99x (M = 1) - 1.10x (M = 32),
// end to end level (NOTES session 53): the route stays off by default.
int a8_act_cluster_size(int Kp) {
  const int n = env_int("TRIT_QUANT_CLUSTER", -1);
  return quant_cluster_size(Kp, n < 0 ? 8 : n, max(1, min(kQcVecs, env_int("TRIT_ACT_QUANT_VECS", 1))));
}
bool a8_act_ok(int M, int N, int K) {
  const int Kp = (K + kBlockK - 1) / kBlockK * kBlockK;
  return M >= 1 && M <= kV5MaxMA8 && a8_v5(M, N, K) && knobs().v5 && pdl_supported() &&
         (v5_mt(M) == 1 || knobs().xi) && a8_act_cluster_size(Kp) > 0;
}

template <typename T>
cudaError_t dispatch_a8(const T* x, const int32_t* wp, const float* scale, const T* bias, T* y,
                        int M, int N, int K, int8_t* xq, float* xs, int32_t* rowsum,
                        cudaStream_t st, bool pre = false, bool bp = false, int pre_layout = 0, int act = 0) {
  const int KB = (K + kBlockK - 1) / kBlockK;
  const bool v5 = a8_v5(M, N, K);
  const Knobs kn = v5 ? knobs() : Knobs{false, false, 0, 0, 0, 1, 0};
  if (act != 0 && (pre || bp || act < 1 || act > 2 || !a8_act_ok(M, N, K))) return cudaErrorInvalidValue;
  if (pre && !(v5 && kn.v5 && M <= a8_pre_maxm())) return cudaErrorInvalidValue;
  // the bitplane layout (bp) has the v5 kernels with MT <= 4 only: the route ternary_mm_a8 takes at M <= 32
  if (bp && (pre || !(v5 && kn.v5 && M <= kA8BpMaxM))) return cudaErrorInvalidValue;
  if (v5 && kn.v5) {
    const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
    const bool pdl = kn.pdl && pdl_supported();
    Cfg cfg = small_cfg(kn, M, N, K, true);  // M <= 8: mt = 1, the layout pre's xq has (above: kRM)
    // the fused quantizer: M <= 8, vector loads of x, its shared memory within the default 48 KB
    const bool want_fuseq = !pre && act == 0 && (kn.fuseq == 1 || (kn.fuseq < 0 && cfg.wn == 1 && fuseq_auto(M, N, K)));
    // the fused kernel: one tile per warp, ks as for a WN = 1 launch, one warp along N unless TRIT_NW asks for
    // more (every CTA quantizes the whole row: nw tiles per CTA divide that redundant work by nw)
    Cfg fcfg = cfg;
    if (want_fuseq && cfg.wn != 1) {
      Knobs k1 = kn;
      k1.wn = 1;
      fcfg = small_cfg(k1, M, N, K, true);
    }
    fcfg.nw = kn.nw > 0 ? max(1, min(kn.nw, (kV5Threads / 32) / fcfg.ks)) : 1;
    const bool fuseq = want_fuseq && fcfg.mt == 1 && vec &&
                       (size_t)fcfg.nw * fcfg.ks * 512 + fuseq_smem(M, KB) <= 48 * 1024;
    // the interleaved xq (TRIT_A8_XI, default on): the code-layout MT = 2 / 4 / 8 kernels behind their own quantizer
    const bool xi = kn.xi && !pre && !bp && cfg.mt >= 2;
    if (fuseq) {
      cfg = fcfg;
    } else if (!pre) {
      // k-block-major xq for MT >= 2, zero rows to 8 * MT (MT = 8: to a multiple of 64, TRIT_A8_MT8_ROWS2)
      const int Mp = cfg.mt == 1 ? 0 : cfg.mt == 8 ? (M + 63) / 64 * 64 : 8 * cfg.mt;
      // the row-major layout (M <= 8): the cluster quantizer on long rows (or as TRIT_QUANT_CLUSTER asks)
      // and the interleaved xq's, Mp rows (TRIT_QUANT_CLUSTER_XI, default 1 since H200 run 45: 0.5-6.5 us a layer
      // less on rows longer than 4096, 8B e2e at B = 32 +1.5% over three engines; 0 keeps the loop kernel there)
      // (act: always the cluster kernel, a8_act_ok holds: MT = 1 or xi, and a8_act_cluster_size > 0)
      const bool cl = pdl_supported() && (cfg.mt == 1 || (xi && env_int("TRIT_QUANT_CLUSTER_XI", 1) == 1));
      const int S = act != 0 ? a8_act_cluster_size(KB * kBlockK)
                             : cl ? quant_cluster_size(KB * kBlockK, env_int("TRIT_QUANT_CLUSTER", -1)) : 0;
      if (act != 0 && (S <= 0 || (cfg.mt > 1 && !xi))) return cudaErrorInvalidValue;
      cudaError_t e = S > 0 ? launch_quant_cluster<T>(S, x, xq, xs, rowsum, M, K, KB * kBlockK, vec, st, pdl,
                                                      cfg.mt == 1 ? 0 : Mp, act)
                            : launch_ex(xi ? quant_rows_perm_kernel<T, false, true> : quant_rows_perm_kernel<T>,
                                        dim3(cfg.mt == 1 ? M : Mp), dim3(256), 0, st, pdl,
                                        x, xq, xs, rowsum, M, K, KB * kBlockK, Mp, vec, (int32_t*)nullptr, 0);
      if (e != cudaSuccess) return e;
    }
    const int flags = l2pf_flags(kn.l2pf, true, N, K, kn.l2pf_head);
    const int8_t* q = xq;
    if (bp) {
      switch (cfg.mt) {
        case 1: return launch_a8_small_mt<T, 1, true>(cfg, pdl, fuseq, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        case 2: return launch_a8_small_mt<T, 2, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        case 4: return launch_a8_small_mt<T, 4, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        default: return cudaErrorInvalidValue;
      }
    }
    if (pre && cfg.mt > 1 && pre_layout == 1) {  // 8 < M <= 32: the tiles of rms_norm_a8q's layout 1 (a8_tile)
      if (!kn.xi || 8 * cfg.mt != a8_tile_mp(M)) return cudaErrorInvalidValue;
      if (cfg.mt == 2)
        return launch_a8_small_mt<T, 2, false, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
      return launch_a8_small_mt<T, 4, false, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
    }
    if (pre && cfg.mt > 1) {  // 8 < M <= 32: the row-major xq of rms_norm_a8q / a8_quantize
      switch (cfg.mt) {
        case 2: return launch_a8_small_mt<T, 2, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        case 4: return launch_a8_small_mt<T, 4, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        default: return cudaErrorInvalidValue;
      }
    }
    if (xi) {
      switch (cfg.mt) {
        case 2: return launch_a8_small_mt<T, 2, false, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        case 4: return launch_a8_small_mt<T, 4, false, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
        default: return launch_a8_small_mt<T, 8, false, false, true>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
      }
    }
    switch (cfg.mt) {
      case 1: return launch_a8_small_mt<T, 1>(cfg, pdl, fuseq, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
      case 2: return launch_a8_small_mt<T, 2>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
      case 4: return launch_a8_small_mt<T, 4>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
      default: return launch_a8_small_mt<T, 8>(cfg, pdl, false, flags, x, K, q, xs, rowsum, wp, scale, bias, y, M, N, KB, st);
    }
  }
  // the v4 route (M > 64 where neither the GEMM kernel nor the MT = 8 GEMV runs, or TRIT_KERNEL=v4): quantizer +
  // a8_kernel. TRIT_A8_V4Q (default 1): the quantizer with 16-byte loads (quant_rows_perm_kernel kNat:
  // quant_rows_kernel's bytes) and both launched with PDL (a8_kernel streams its first weights before its wait); 0:
  // quant_rows_kernel (one element per thread and load) and plain launches, the route before session 47. The same
  // values either way (tests).
  const bool v4q = a8_v4q_on();
  const bool pdl = v4q && env_int("TRIT_PDL", 1) != 0 && pdl_supported();
  const int Kp = KB * kBlockK;
  cudaError_t e;
  if (v4q) {
    const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
    e = launch_ex(quant_rows_perm_kernel<T, false, false, true>, dim3(M), dim3(256), 0, st, pdl, x, xq, xs, rowsum,
                  M, K, Kp, 0, vec, (int32_t*)nullptr, 0);
  } else {
    quant_rows_kernel<T><<<M, 256, 0, st>>>(x, xq, xs, rowsum, K, Kp);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) return e;
  const Cfg cfg = choose_cfg(M, N, K);
  switch (cfg.mt) {
    case 1: return launch_a8<T, 1, 1>(cfg, xq, xs, rowsum, wp, scale, bias, y, M, N, K, st, pdl);
    case 2: return launch_a8<T, 2, 2>(cfg, xq, xs, rowsum, wp, scale, bias, y, M, N, K, st, pdl);
    case 4: return launch_a8<T, 4, 2>(cfg, xq, xs, rowsum, wp, scale, bias, y, M, N, K, st, pdl);
    default: return launch_a8<T, 8, 2>(cfg, xq, xs, rowsum, wp, scale, bias, y, M, N, K, st, pdl);
  }
}

// Large-M a8 epilogue: 4 consecutive outputs per thread (N % 4 == 0), grid-stride. acc holds
// the exact int32 sums from int8 cuBLAS.
template <typename T>
__global__ void __launch_bounds__(256) a8_epilogue_kernel(const int32_t* __restrict__ acc, const float* __restrict__ xs,
                                                          const float* __restrict__ scale, const T* __restrict__ bias,
                                                          T* __restrict__ y, int M, int N) {
  const int n4 = N / 4;
  const size_t total = (size_t)M * n4;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const int m = (int)(i / n4), n = (int)(i % n4) * 4;
    const int4 a = __ldg(reinterpret_cast<const int4*>(acc) + i);
    const int32_t v[4] = {a.x, a.y, a.z, a.w};
    const float xm = xs[m];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float o = a8_value(v[j], xm, scale[n + j]);
      if (bias != nullptr) o = __fadd_rn(o, to_f32<T>(bias[n + j]));
      y[(size_t)m * N + n + j] = from_f32<T>(o);
    }
  }
}

template <typename T>
cudaError_t launch_naive(const T* x, const int32_t* wp, const float* scale, const T* bias, T* y,
                         int M, int N, int K, cudaStream_t st) {
  dim3 grid((N + 127) / 128, M);
  naive_kernel<T><<<grid, 128, 0, st>>>(x, wp, scale, bias, y, M, N, K, (K + kBlockK - 1) / kBlockK);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_decode(const int32_t* wp, const float* scale, T* out, int N, int K,
                          cudaStream_t st) {
  const int n_tiles = (N + kTileN - 1) / kTileN, words = (K + kBlockK - 1) / kBlockK * kBlockK;
  dim3 grid((words + 255) / 256, n_tiles);
  decode_kernel<T><<<grid, 256, 0, st>>>(wp, scale, out, N, K, words);
  return cudaGetLastError();
}


// trit::ternary_mm_a8_prologue's one-kernel route: the fused-quantizer GEMV (one tile per warp) with the
// norm / activation prologue (A8Pro) in front of its quantizer. Where it runs (a8_prologue_ok): M <=
// TRIT_A8_PROLOGUE_MAXM (default 1: the fused quantizer lost at M = 4 / 8 in H200 run 10, every CTA
// quantizing every row), the v5 kernels on, its shared memory (the staged row, residual and norm weight:
// pro_smem) within 113 KB (two CTAs per SM); rows 16-byte aligned and K % 8 == 0.
// pro_cfg: ks split-K warps as for a WN = 1 launch, and nw tiles per CTA so that a CTA has 8 warps
// (256 threads) where the tiles allow: the prologue is computed once per CTA, by all its threads
// (13824x2560: ks = 1, so the plain fused quantizer runs 864 one-warp CTAs; here 108 of 8 warps).
constexpr size_t kProMaxSmem = 113 * 1024;
int a8_prologue_maxm() { return max(0, min(8, env_int("TRIT_A8_PROLOGUE_MAXM", 1))); }  // read per call, as knobs()
Cfg pro_cfg(int M, int N, int K) {
  Knobs k1 = knobs();
  k1.wn = 1;
  Cfg cfg = small_cfg(k1, M, N, K, true);
  const int n_tiles = (N + kTileN - 1) / kTileN;
  cfg.nw = max(1, min(kV5Threads / 32 / cfg.ks, n_tiles));
  return cfg;
}
size_t pro_smem(const Cfg& cfg, int M, int K, size_t elem, bool act, bool res, bool norm) {
  const int KB = (K + kBlockK - 1) / kBlockK;
  return (size_t)cfg.nw * cfg.ks * 128 * sizeof(int) + fuseq_smem(M, KB) + 16 +
         pro_row_bytes(K, elem) * ((act ? 2 : 1) + (res ? 1 : 0) + (norm ? 1 : 0));
}
bool a8_prologue_ok(int M, int N, int K) {
  if (M < 1 || M > a8_prologue_maxm() || K % 8 != 0 || !knobs().v5) return false;
  const Cfg cfg = pro_cfg(M, N, K);
  return cfg.mt == 1 && pro_smem(cfg, M, K, 4, true, false, true) <= kProMaxSmem;  // the largest case: fp32, act + norm
}
template <typename T>
cudaError_t dispatch_a8_prologue(const T* x, const A8Pro<T>& pro, const int32_t* wp, const float* scale,
                                 const T* bias, T* y, int M, int N, int K, cudaStream_t st) {
  if (!a8_prologue_ok(M, N, K)) return cudaErrorInvalidValue;
  auto al = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!al(x) || !al(pro.residual) || !al(pro.nw) || !al(pro.res_out) || (pro.act != 0 && pro.residual != nullptr) ||
      (pro.residual != nullptr) != (pro.res_out != nullptr) || pro.act < 0 || pro.act > 2)
    return cudaErrorInvalidValue;
  const int KB = (K + kBlockK - 1) / kBlockK, n_tiles = (N + kTileN - 1) / kTileN;
  const Cfg cfg = pro_cfg(M, N, K);
  const size_t smem = pro_smem(cfg, M, K, sizeof(T), pro.act != 0, pro.residual != nullptr, pro.nw != nullptr);
  const auto kernel = a8_small_kernel<T, 1, 1, true>;
  if (smem > 48 * 1024) {  // past the default limit: opt in (to the most the route takes), once per device
    static int opted[64] = {0};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return cudaErrorInvalidDevice;
    if (dev < 0 || dev >= 64 || !opted[dev]) {
      const cudaError_t a = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kProMaxSmem);
      if (a != cudaSuccess) return a;
      if (dev >= 0 && dev < 64) opted[dev] = 1;
    }
  }
  const Knobs kn = knobs();
  const bool pdl = kn.pdl && pdl_supported();
  const int flags = l2pf_flags(kn.l2pf, true, N, K, kn.l2pf_head);
  return launch_ex(kernel, dim3((n_tiles + cfg.nw - 1) / cfg.nw), dim3(cfg.ks * 32, cfg.nw), smem, st, pdl,
                   (const int8_t*)nullptr, (const float*)nullptr, (const int32_t*)nullptr,
                   reinterpret_cast<const int4*>(wp), scale, bias, y, M, N, KB, n_tiles, 8, flags, x, K, pro);
}

// ---------------------------------------------------------------- RMSNorm + a8 quantizer
// trit::rms_norm_a8q: the RMSNorm in front of a W1.58A8 layer and that layer's activation quantizer in
// one kernel, so that the M <= 32 GEMV behind it (trit_mm_a8_pre) runs without a quantizer launch and,
// unlike an Inductor-generated norm, this kernel triggers the GEMV's programmatic launch at its start
// (H200 8B run 7: Triton kernels do not, and the GEMVs behind them started cold).
//   z   = x (+ residual, rounded to T: the new residual stream, stored in res_out)
//   out = T(z * rsqrt(mean(z^2) + eps) * w)        (fp32 arithmetic, one rounding to T)
//   xq / xs / rowsum = the a8 quantizer of out (quant_rows_perm_kernel's values and byte order: what
//                      trit.ops.a8_quantize(out) gives, bit for bit, for the out this kernel wrote)
// Mp > 0 (trit.ops.a8_tile's layout 1 at 8 < M <= 32, Mp = 16 / 32 rows: what the interleaved-xq GEMV kXI reads):
// row m's 8 bytes at row-major offset k go where quant_rows_perm_kernel kXI puts them; the grid has R >= M CTAs and
// those past M write zeros: rows M .. Mp - 1 of the tiles, then (m >= Mp) the row-major row m, past the tiles'
// Mp x Kp bytes (layout 1's zero tail; with Mp = 0 the zero rows after the M row-major ones).
// One CTA of 256 threads per row, the row in registers (V <= kRnqVecs groups of 8 per thread, V = 2 / 5 / 8
// by K: K <= 4096 / 10240 / 16384 at 48 / 101 / 155 registers; 4 spilled 8 bytes at 80 registers),
// every load issued before the first use. vec: K % 8 == 0 and every row pointer 16-byte aligned.
constexpr int kRnqThreads = 256, kRnqVecs = 8, kRnqMaxK = kRnqThreads * kRnqVecs * 8;
template <typename T, int V>
__global__ void __launch_bounds__(kRnqThreads) rms_norm_quant_kernel(const T* __restrict__ x,
                                                                     const T* __restrict__ residual,
                                                                     const T* __restrict__ w, T* __restrict__ out,
                                                                     T* __restrict__ res_out, int8_t* __restrict__ xq,
                                                                     float* __restrict__ xs_out,
                                                                     int32_t* __restrict__ rowsum, int K, int Kp,
                                                                     float eps, bool vec, int M, int Mp) {
  __shared__ float sh_f[kRnqThreads / 32];
  __shared__ int sh_i[kRnqThreads / 32];
  pdl_trigger();  // the GEMV behind may launch now and stream its weights; it waits for this grid
#if defined(__CUDA_ARCH__)
  // w is a parameter, not the kernel before's output: on its way into L2 before the wait
  for (int k = threadIdx.x * 64; k < K; k += kRnqThreads * 64)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(w + k));
#endif
  pdl_wait();     // x / residual come from the kernel before (and xq's memory may have been read by it)
  const int m = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto dst = [&](int k) {  // the 8 bytes of row m at row-major offset k (k % 8 == 0)
    return reinterpret_cast<uint2*>(xq + (m < Mp ? xi_offset(m, k, Mp) : (size_t)m * Kp + k));
  };
  if (m >= M) {  // a zero row of the layout (its GEMV outputs are never stored)
    for (int k = threadIdx.x * 8; k < Kp; k += kRnqThreads * 8) *dst(k) = make_uint2(0u, 0u);
    return;
  }
  const size_t off = (size_t)m * K;
  float v[V][8], r[V][8];
#pragma unroll
  for (int j = 0; j < V; ++j) {  // every load first
    const int k = (j * kRnqThreads + threadIdx.x) * 8;
    if (k < K) {
      load8<T>(x + off, k, K, vec, v[j]);
      if (residual != nullptr) load8<T>(residual + off, k, K, vec, r[j]);
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int k = (j * kRnqThreads + threadIdx.x) * 8;
    if (k < K) {
      if (residual != nullptr) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[j][i] = to_f32<T>(from_f32<T>(v[j][i] + r[j][i]));
        store8<T>(res_out + off, k, K, vec, v[j]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (k + i < K) ss = __fmaf_rn(v[j][i], v[j][i], ss);  // explicit: the cluster kernel at S = 1 does the same
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) sh_f[warp] = ss;
  __syncthreads();
  ss = 0.f;
#pragma unroll
  for (int i = 0; i < kRnqThreads / 32; ++i) ss += sh_f[i];
  const float inv = rsqrtf(ss / (float)K + eps);
  __syncthreads();  // sh_f is reused below
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int k = (j * kRnqThreads + threadIdx.x) * 8;
    if (k < K) {
      float wf[8];
      load8<T>(w, k, K, vec, wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[j][i] = (k + i < K) ? to_f32<T>(from_f32<T>(v[j][i] * inv * wf[i])) : 0.f;
        amax = fmaxf(amax, fabsf(v[j][i]));
      }
      store8<T>(out + off, k, K, vec, v[j]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[j][i] = 0.f;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) sh_f[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int i = 0; i < kRnqThreads / 32; ++i) amax = fmaxf(amax, sh_f[i]);
  const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;  // as torch: reciprocal(t) * 127
  int part = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int k = (j * kRnqThreads + threadIdx.x) * 8;
    if (k < Kp) *dst(k) = quant_group8(v[j], xs, part);  // zeros past K
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) sh_i[warp] = part;
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < kRnqThreads / 32; ++i) sum += sh_i[i];
    rowsum[m] = sum;
    xs_out[m] = xs;
  }
}

// rms_norm_quant_kernel's arithmetic with one row split over a thread-block cluster of S CTAs (grid (S, rows),
// cluster (S, 1, 1); TRIT_RNQ_CLUSTER, rnq_cluster_size), for the decode batch sizes where a handful of one-CTA
// rows leave the GPU idle and each CTA walks its row alone (H200 run 63, CUPTI with PDL off: 3.6-3.8 us at
// M = 32, K = 2560 / 4096; 6.4 us at M = 16, K = 8192 - against ~2.5 us for Inductor's add + RMSNorm and
// 2.4-2.9 us for the quantizer it replaces). Two differences besides the split:
//   - the norm weight w (a parameter, not the kernel before's output) is loaded into registers before the PDL
//     wait, so under PDL its round trip overlaps the kernel before (the one-CTA kernel only asked it into L2);
//   - every load of x and residual is issued before the first use (one round trip), as in the cluster quantizer.
// The CTAs exchange their partial sums of squares, then their |out| maxima, through distributed shared memory
// (each CTA writes its value into every CTA's slot [rank]; every CTA adds the S slots in rank order, so all agree
// on the same rsqrt and xs), and send their partial row sums of xq to rank 0. With S = 1 the sums and maxima are
// taken in the one-CTA kernel's order (thread t holds groups t, t + 256, ...; warps added 0..7): the results are
// that kernel's bit for bit; with S > 1 the sum of squares is added in another order (out within one rounding).
// Needs vec (K % 8 == 0, 16-byte aligned rows; else the one-CTA kernel runs) and sm_90 (clusters).
constexpr int kRncVecs = 4;  // groups of 8 per thread: S <= 8 CTAs x 256 x 4 x 8 = 65536 >= kRnqMaxK
template <typename T>
__global__ void __launch_bounds__(256) rms_norm_quant_cluster_kernel(const T* __restrict__ x,
                                                                     const T* __restrict__ residual,
                                                                     const T* __restrict__ w, T* __restrict__ out,
                                                                     T* __restrict__ res_out,
                                                                     int8_t* __restrict__ xq,
                                                                     float* __restrict__ xs_out,
                                                                     int32_t* __restrict__ rowsum, int K, int Kp,
                                                                     float eps, int S, int M, int Mp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ float sh_ss[8], sh_am[8];
  __shared__ int sh_i[8];
  __shared__ float s_ss[8], s_am[8];  // [rank]: every CTA's partial sum of squares / maximum, written by that CTA
  __shared__ int s_part[8];           // rank 0's copy: every CTA's partial row sum
  const unsigned rank = S > 1 ? cluster_ctarank() : 0u;
  const int m = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = Kp >> 3, per = (G + S - 1) / S, g0 = (int)rank * per, g1 = min(G, g0 + per);
  auto dst = [&](int g) {  // row m's 8 bytes of group g (layout 1's tiles for m < Mp, else row-major)
    return reinterpret_cast<uint2*>(xq + (m < Mp ? xi_offset(m, g * 8, Mp) : (size_t)m * Kp + (size_t)g * 8));
  };
  if (m >= M) {  // a zero row of the layout (every CTA of this cluster is here: no cluster barrier)
    pdl_trigger();
    pdl_wait();  // the kernel before may still read xq
    for (int g = g0 + tid; g < g1; g += 256) *dst(g) = make_uint2(0u, 0u);
    return;
  }
  if (S > 1) cluster_arrive_relaxed();
  pdl_trigger();  // the GEMV behind may launch now and stream its weights; it waits for this grid
  constexpr int kW = sizeof(T) == 2 ? 1 : 2;  // 16-byte words per group of 8
  auto in_row = [&](int v) { const int g = g0 + tid + v * 256; return g < g1 && g * 8 < K; };
  uint4 rw[kRncVecs][kW], rx[kRncVecs][kW], rr[kRncVecs][kW];
#pragma unroll
  for (int v = 0; v < kRncVecs; ++v)  // w first: a parameter, on its way before the wait
#pragma unroll
    for (int i = 0; i < kW; ++i)
      rw[v][i] = in_row(v) ? __ldg(reinterpret_cast<const uint4*>(w + (size_t)(g0 + tid + v * 256) * 8) + i)
                           : make_uint4(0u, 0u, 0u, 0u);
  pdl_wait();  // x / residual come from the kernel before (and xq's memory may have been read by it)
  const size_t off = (size_t)m * K;
#pragma unroll
  for (int v = 0; v < kRncVecs; ++v)
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const size_t e = off + (size_t)(g0 + tid + v * 256) * 8;
      rx[v][i] = in_row(v) ? __ldg(reinterpret_cast<const uint4*>(x + e) + i) : make_uint4(0u, 0u, 0u, 0u);
      rr[v][i] = (in_row(v) && residual != nullptr) ? __ldg(reinterpret_cast<const uint4*>(residual + e) + i)
                                                    : make_uint4(0u, 0u, 0u, 0u);
    }
  float z[kRncVecs][8];
  float ss = 0.f;
#pragma unroll
  for (int v = 0; v < kRncVecs; ++v) {
    const T* hx = reinterpret_cast<const T*>(&rx[v][0]);
    const T* hr = reinterpret_cast<const T*>(&rr[v][0]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      z[v][i] = residual != nullptr ? to_f32<T>(from_f32<T>(to_f32<T>(hx[i]) + to_f32<T>(hr[i]))) : to_f32<T>(hx[i]);
    if (in_row(v)) {
      if (residual != nullptr) store8<T>(res_out + off, (g0 + tid + v * 256) * 8, K, true, z[v]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss = __fmaf_rn(z[v][i], z[v][i], ss);  // as the one-CTA kernel, explicitly
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) sh_ss[warp] = ss;
  __syncthreads();
  ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += sh_ss[i];
  if (S > 1) {
    cluster_wait();  // every CTA of the cluster has started: its shared memory may be written
    if (tid < S) st_cluster(&s_ss[rank], (unsigned)tid, ss);
    cluster_sync();
    ss = s_ss[0];
    for (int r = 1; r < S; ++r) ss += s_ss[r];
  }
  const float inv = rsqrtf(ss / (float)K + eps);
  float amax = 0.f;
#pragma unroll
  for (int v = 0; v < kRncVecs; ++v) {
    const T* hw = reinterpret_cast<const T*>(&rw[v][0]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      z[v][i] = in_row(v) ? to_f32<T>(from_f32<T>(z[v][i] * inv * to_f32<T>(hw[i]))) : 0.f;
      amax = fmaxf(amax, fabsf(z[v][i]));
    }
    if (in_row(v)) store8<T>(out + off, (g0 + tid + v * 256) * 8, K, true, z[v]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) sh_am[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, sh_am[i]);
  if (S > 1) {
    if (tid < S) st_cluster(&s_am[rank], (unsigned)tid, amax);
    cluster_sync();
    amax = s_am[0];
    for (int r = 1; r < S; ++r) amax = fmaxf(amax, s_am[r]);
  }
  const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;  // as torch: reciprocal(t) * 127
  int part = 0;
#pragma unroll
  for (int v = 0; v < kRncVecs; ++v) {
    const int g = g0 + tid + v * 256;
    if (g < g1) *dst(g) = quant_group8(z[v], xs, part);  // zeros past K
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (lane == 0) sh_i[warp] = part;
  __syncthreads();
  if (tid == 0) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += sh_i[i];
    if (S > 1) st_cluster(&s_part[rank], 0u, sum);
    else s_part[0] = sum;
  }
  if (S > 1) cluster_sync();  // after it rank 0 reads only its own shared memory: the others may exit
  if (rank == 0 && tid == 0) {
    int sum = 0;
    for (int r = 0; r < S; ++r) sum += s_part[r];
    rowsum[m] = sum;
    xs_out[m] = xs;
  }
#else
  __trap();
#endif
}

// TRIT_RNQ_CLUSTER = n > 0: rms_norm_quant_cluster_kernel with the row over S CTAs - at most n, at most one
// CTA per 256 groups of 8 (no CTA with idle threads only), at least the fewest that hold the row in registers
// (kRncVecs groups a thread), at most 8; n = 1: one CTA (the one-CTA kernel's sums, w before the PDL wait).
// 0: the one-CTA kernel rms_norm_quant_kernel.  Unset (-1): rnq_cluster_auto, n = 1 - measured (H100 run 66,
// bench.norm_quant, CUPTI medians) at or below the one-CTA kernel on every case: 3.60-3.81 vs 3.74-3.90 us at
// K = 2560 / 4096 (M = 1-64), 4.42-4.58 vs 6.30-6.56 us at K = 6912 / 8192, where the one-CTA kernel's dependent
// norm-weight read follows the first reduction; n = 2 / 4 / 8 were slower than n = 1 everywhere (4.96-6.05 us),
// cluster launch and DSMEM exchange costing more than the split saves at these K.  Rows longer than one CTA holds
// in registers take the fewest CTAs that do (need above).
int rnq_cluster_auto(int /*Kp*/) { return 1; }
int rnq_cluster_size(int Kp, int n) {
  if (n < 0) n = rnq_cluster_auto(Kp);
  if (n <= 0) return 0;
  const int G = Kp / 8;
  const int need = (G + 256 * kRncVecs - 1) / (256 * kRncVecs), want = min(min(n, 8), (G + 255) / 256);
  const int S = max(need, want);
  return S <= 8 ? S : 0;
}

template <typename T>
cudaError_t launch_rms_norm_quant(const T* x, const T* residual, const T* w, T* out, T* res_out, int8_t* xq,
                                  float* xs, int32_t* rowsum, int M, int K, float eps, int layout, cudaStream_t st) {
  if (K < 1 || K > kRnqMaxK || M < 1 || (residual == nullptr) != (res_out == nullptr) ||
      reinterpret_cast<uintptr_t>(xq) % 8 != 0 || (layout != 0 && layout != 1))
    return cudaErrorInvalidValue;
  const int rows = layout == 1 ? a8_tile_rows(M) : M, Mp = layout == 1 ? a8_tile_mp(M) : 0;
  const int Kp = (K + kBlockK - 1) / kBlockK * kBlockK;
  auto al = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = K % 8 == 0 && al(x) && al(residual) && al(w) && al(out) && al(res_out);
  const bool pdl = knobs().pdl && pdl_supported();
  const int S = (vec && pdl_supported()) ? rnq_cluster_size(Kp, env_int("TRIT_RNQ_CLUSTER", -1)) : 0;
  if (S == 1)
    return launch_ex(rms_norm_quant_cluster_kernel<T>, dim3(1, rows), dim3(256), 0, st, pdl, x, residual, w, out,
                     res_out, xq, xs, rowsum, K, Kp, eps, 1, M, Mp);
  if (S > 1)
    return launch_cluster_ex(rms_norm_quant_cluster_kernel<T>, dim3(S, rows), S, st, pdl, x, residual, w, out, res_out,
                             xq, xs, rowsum, K, Kp, eps, S, M, Mp);
  const int groups = (K + kRnqThreads * 8 - 1) / (kRnqThreads * 8);  // groups of 8 per thread
  auto go = [&](auto kern) {
    return launch_ex(kern, dim3(rows), dim3(kRnqThreads), 0, st, pdl, x, residual, w, out, res_out, xq, xs, rowsum, K,
                     Kp, eps, vec, M, Mp);
  };
  return groups <= 2 ? go(rms_norm_quant_kernel<T, 2>)
                     : groups <= 5 ? go(rms_norm_quant_kernel<T, 5>) : go(rms_norm_quant_kernel<T, kRnqVecs>);
}


// ---------------------------------------------------------------- layer chains at M = 1 (trit::ternary_chain)
// S <= kChainMaxStages W1.58A8 layers in a row, each on the previous one's output, with the layer input
// that the model computes in front of each (A8Pro's arithmetic: act(gate) * up, or x + residual, then
// RMSNorm) - BitNet's layer tail attn_sub_norm -> o_proj, + residual -> post_attention_layernorm ->
// gate_up_proj, relu^2(gate) * up -> ffn_sub_norm -> down_proj - as ONE persistent kernel at M = 1:
// one CTA of kChainThreads per SM, a grid-wide barrier between the stages. Why: at M = 1 a 2-8 MB layer
// takes 3-9 us where its bytes need 0.4-2 us (H200 runs 23-25: launch, ramp and tail, not bandwidth),
// and each norm / quantizer in between is another such kernel (the 2B decode step ran 10-13 kernels per
// layer, 1.53 ms for a 0.28 ms weight floor). Here each CTA prefetches its weight slices of the coming
// stages into L2 (one bulk prefetch per stage) at the start, so HBM streams while the CTAs compute the
// prologues and wait at the barriers, and the GEMVs read L2; every stage's norm weight and the CTA's
// scales come into shared memory (cp.async) at the start too (H200 run 26c: -1 us on stage 0's prologue,
// the epilogues 0.5 -> 0.26 us).
// Per stage s, every CTA:
//   1. loads its first weight chunk into registers (before the barrier: weights are constant) and waits
//      at the grid barrier (stage 0: the PDL wait);
//   2. computes the whole input row from the previous stage's output (L2, ld.global.cg: written by other
//      SMs in this kernel) - pass 1 a (+ residual: CTA 0 stores the new residual stream) and the sum of
//      squares, pass 2 h = T(a * inv * nw) and max|h|, pass 3 the int8 quantization into shared memory
//      (quant_group8: the {0,4,1,5,2,6,3,7} order of the a8 kernels); 512 threads, so ~5-30 elements each
//      (TRIT_CHAIN_TMA=1: the rows by one bulk copy per CTA; measured slower, off);
//   3. runs its contiguous range of 16-channel tiles: the CTA's (tile, k-block) units split evenly over
//      its 16 warps (a warp may span two tiles), mma.m16n8k32 u8 x s8 as a8_small_kernel, the warp's
//      int32 partial sums added into the tile's shared accumulators (integer: exact in any order), then
//      the a8 epilogue (store_out's arithmetic) writes the stage's output (TRIT_CHAIN_PAIR, default on since
//      H200 run 27: a stage whose output feeds an activation takes gate tiles and the matching up tiles and
//      writes act(gate) * up, ChainArgs::pair).
// Results: every stage equals trit::ternary_mm_a8_prologue on the previous output, bit for bit wherever
// the norm's sum of squares is exact in any order (it sums in another order than that kernel).
// The grid barrier is a counter in device memory (g_chain_bar) that cooperative groups' scheme flips per
// barrier (CTA 0 adds 2^31 - (G - 1), the others 1: the top bit flips when the last arrives, the low bits
// return to 0), so it needs no reset between launches or inside a CUDA graph. All G CTAs must be resident
// at once: G <= the SM count and one CTA per SM fits (chain_ok checks the shared memory; the launch bounds
// cap registers at 128); other kernels in flight only delay residency (PDL predecessors finish on their
// own). One chain kernel in flight per device: two chains on two streams at once would share the counter
// and, each needing every SM (two 512-thread CTAs at 86+ registers do not fit one SM), could each hold
// SMs the other waits for; then a barrier that waits 20 s traps (the launch reports an error, no hang).
constexpr int kChainMaxStages = TRIT_CHAIN_MAX_STAGES;
constexpr int kChainThreads = 512;
constexpr int kChainWarps = kChainThreads / 32;
constexpr int kChainCU = 4;  // k-blocks per register chunk of weights (two chunks in flight); TRIT_CHAIN_CU=8

__device__ unsigned g_chain_bar = 0;

template <typename T> struct ChainStage {
  const int4* wp;
  const float* scale;
  const T* nw;  // norm weight [K] or null
  T* y;         // output [N]
  int N, K, KB, n_tiles, act;
};
template <typename T> struct ChainArgs {
  ChainStage<T> st[kChainMaxStages];
  const T* x;         // stage 0's input: [K0], or [2 K0] = [gate | up] with act
  const T* residual;  // [K of res_stage] or null
  T* res_out;
  float eps;
  int S, res_stage;
  int pf_stages;      // stages whose weights each CTA bulk-prefetches to L2 at the start (the rest: two ahead)
  // TRIT_CHAIN_EARLY (default 1): every stage's norm weight and scales requested at the kernel start (run 26c);
  // 0: each stage's at the top of its stage, before its barrier (run 26b's timing)
  int early;
  // shared memory: the a / h row at 0, xq, the tile accumulators, the raw input rows (tma), and per stage
  // its norm weight and this CTA's scales (all requested at the start: they are parameters)
  int off_x, off_acc, off_in;
  int off_nw[kChainMaxStages], off_sc[kChainMaxStages];
  // pair[s] (TRIT_CHAIN_PAIR, default on, where stage s + 1 has an activation and the gate / up halves of stage s's
  // output split on a tile boundary): each CTA takes gate tiles [t0, t1) AND the up tiles of the same
  // features, and its epilogue writes act(gate) * up (the arithmetic pass 1 would do) - [N / 2] values -
  // so that stage s + 1 reads half the row and computes no activation
  int pair[kChainMaxStages];
  // TRIT_CHAIN_PROF (a device address, for bench.chain --prof): thread 0 of each CTA stores globaltimer and
  // clock64 at kChainStamps points of every stage - start, after the barrier, after pass 1 and the norm's
  // sum, after pass 2 and the max, after pass 3 and the row sum, after the GEMV, after the epilogue - at
  // prof[((cta * kChainMaxStages + s) * kChainStamps + point) * 2 + {0, 1}]
  unsigned long long* prof;
};
constexpr int kChainStamps = 7;

__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void chain_grid_sync(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    __threadfence();  // this CTA's writes (ordered before by the CTA barrier) before the arrival
    const unsigned old = atomicAdd(bar, add);
    const unsigned long long t0 = globaltimer_ns();
    while (((old ^ *reinterpret_cast<volatile unsigned*>(bar)) & 0x80000000u) == 0) {
      if (globaltimer_ns() - t0 > 20000000000ull) __trap();
    }
    __threadfence();
  }
  __syncthreads();
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_wait(uint32_t mbar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(mbar), "r"(parity)
      : "memory");
}
// bytes (% 16 == 0) from global src to shared dst (16-byte aligned) by the bulk-copy engine, completing on mbar
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(mbar)
               : "memory");
}
// 8 elements of a row written in this kernel by other SMs (or by the kernel before): L2, not L1
template <typename T>
__device__ __forceinline__ void ldcg8(const T* row, int k, float (&e)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(row + k));
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(h[i]);
  } else {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(row + k)), b = __ldcg(reinterpret_cast<const float4*>(row + k + 4));
    e[0] = a.x; e[1] = a.y; e[2] = a.z; e[3] = a.w; e[4] = b.x; e[5] = b.y; e[6] = b.z; e[7] = b.w;
  }
}
// CTA-wide reduction (op: sum or max) of one value per thread, in a fixed order (deterministic); scr:
// kChainWarps words used by this call only (each reduction of a stage has its own)
template <typename V, typename Op>
__device__ __forceinline__ V chain_reduce(V v, V* scr, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) scr[threadIdx.x >> 5] = v;
  __syncthreads();
  v = scr[0];
#pragma unroll
  for (int w = 1; w < kChainWarps; ++w) v = op(v, scr[w]);
  return v;
}
__device__ __forceinline__ float chain_sum(float v, float* scr) {
  return chain_reduce(v, scr, [](float p, float q) { return p + q; });
}
__device__ __forceinline__ float chain_max(float v, float* scr) {
  return chain_reduce(v, scr, [](float p, float q) { return fmaxf(p, q); });
}
__device__ __forceinline__ int chain_isum(int v, int* scr) {
  return chain_reduce(v, scr, [](int p, int q) { return p + q; });
}
// the CTA's tiles of a stage: [t0, t1), contiguous, counts differ by <= 1
// (32-bit division where (blockIdx.x + 1) * n_tiles fits: the 64-bit one is a ~70-instruction software
// routine every thread ran several times per stage - H200 ncu, 8B tail: 0.68M instructions of 13.4M)
__device__ __forceinline__ void chain_tiles(int n_tiles, int& t0, int& t1) {
  const unsigned b = blockIdx.x, g = gridDim.x, n = (unsigned)n_tiles;
  if ((unsigned long long)g * n <= 0xffffffffull) {
    t0 = (int)((b * n) / g);
    t1 = (int)(((b + 1) * n) / g);
  } else {
    t0 = (int)(((unsigned long long)b * n) / g);
    t1 = (int)(((unsigned long long)(b + 1) * n) / g);
  }
}
// the CTA's weight slice of a stage into L2: tiles [t0, t1), or paired (ChainArgs::pair) its gate tiles and
// the up tiles of the same features
__device__ __forceinline__ void chain_prefetch_stage(const int4* wp, int KB, int n_tiles, bool pair) {
  int t0, t1;
  chain_tiles(pair ? n_tiles / 2 : n_tiles, t0, t1);
  if (t1 <= t0) return;
  const uint32_t bytes = (uint32_t)((size_t)(t1 - t0) * KB * 512);
  l2_prefetch(wp + (size_t)t0 * KB * 32, bytes);
  if (pair) l2_prefetch(wp + (size_t)(n_tiles / 2 + t0) * KB * 32, bytes);
}

// act(gate) * up of rows x = [gate | up] ([M, 2K]) into out [M, K], chain_act's arithmetic (torch's ops in T,
// each rounding): one kernel where torch runs relu, square and mul (or silu and mul) - the activation of
// trit::ternary_mm_a8_prologue's composed route above M = 1 (and so of trit::ternary_chain there). vec: K %
// 8 == 0 and 16-byte aligned rows (one 16-byte load per 8 inputs), else element by element.
template <typename T>
__global__ void __launch_bounds__(256) act_mul_kernel(const T* __restrict__ x, T* __restrict__ out, int M, int K,
                                                      int act, bool vec) {
  pdl_trigger();  // the norm kernel behind may launch; it waits for this grid
  pdl_wait();
  const int groups = (K + 7) / 8;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)M * groups;
       i += (long long)gridDim.x * blockDim.x) {
    const int m = (int)(i / groups), k = (int)(i - (long long)m * groups) * 8;
    float g[8], u[8];
    load8<T>(x + (size_t)m * 2 * K, k, K, vec, g);
    load8<T>(x + (size_t)m * 2 * K + K, k, K, vec, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = chain_act<T>(act, g[j], u[j]);
    store8<T>(out + (size_t)m * K, k, K, vec, g);
  }
}
template <typename T>
cudaError_t launch_act_mul(const T* x, T* out, int M, int K, int act, cudaStream_t st) {
  if (M < 1 || K < 1 || (act != 1 && act != 2)) return cudaErrorInvalidValue;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = K % 8 == 0 && al(x) && al(out);
  const long long work = (long long)M * ((K + 7) / 8);
  const int blocks = (int)std::min<long long>((work + 255) / 256, 132LL * 8);
  return launch_ex(act_mul_kernel<T>, dim3(blocks), dim3(256), 0, st, knobs().pdl && pdl_supported(), x, out, M, K,
                   act, vec);
}

// PROF: the phase stamps compiled in (TRIT_CHAIN_PROF set, bench.chain --prof); without it the kernel holds no
// stamp code at all (H200 run 29 left the stamps' per-point runtime test as a suspect of the 26b -> 27 slowdown).
// TMA: the input rows by bulk copy (TRIT_CHAIN_TMA=1) compiled in; without it the kernel holds no mbarrier. Its mere
// presence made ptxas put a MEMBAR.ALL.CTA in front of both __threadfence()s of every grid barrier (checked with a
// minimal kernel: the mbarrier.init alone does it; the bulk copy alone does not), whether or not the TMA path ran -
// the change that H200 run 32b's bisect put the 26b -> 27 slowdown on (3429893: +0.7 / +4.1 us per 2B / 8B tail).
template <typename T, int CU, bool PROF, bool TMA>
__global__ void __launch_bounds__(kChainThreads, 1) chain_kernel(const __grid_constant__ ChainArgs<T> a) {
  extern __shared__ __align__(16) uint8_t csm[];
  __shared__ float s_ss[kChainMaxStages][kChainWarps], s_am[kChainMaxStages][kChainWarps];
  __shared__ int s_p[kChainMaxStages][kChainWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, c = lane & 3, g = lane >> 2;
  __shared__ __align__(8) unsigned long long s_mbar;
  T* sa = reinterpret_cast<T*>(csm);
  T* sin = reinterpret_cast<T*>(csm + a.off_in);
  int8_t* sx = reinterpret_cast<int8_t*>(csm + a.off_x);
  int* sacc = reinterpret_cast<int*>(csm + a.off_acc);
  unsigned* bar = &g_chain_bar;
  const uint32_t mbar = smem_u32(&s_mbar);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kChainMaxStages; ++s)
      if (s < a.S && s < a.pf_stages) chain_prefetch_stage(a.st[s].wp, a.st[s].KB, a.st[s].n_tiles, a.pair[s] != 0);
    if constexpr (TMA) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mbar) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  // stage s's norm weight and this CTA's scales into their own shared regions (cp.async; waited for after
  // pass 1): every stage's at the start (early), else stage 0's here and each later one at its stage's top
  auto request_params = [&](int s) {
    const ChainStage<T>& st = a.st[s];
    if (st.nw != nullptr) stage16(csm + a.off_nw[s], st.nw, (int)((size_t)st.K * sizeof(T) / 16), tid, kChainThreads);
    int t0, t1;
    chain_tiles(a.pair[s] ? st.n_tiles / 2 : st.n_tiles, t0, t1);
    const int n0 = t0 * kTileN, cnt = min(t1 * kTileN, st.N) - n0;
    for (int h = 0; h < (a.pair[s] ? 2 : 1); ++h)  // paired: the gate scales, then the up scales
      for (int i = tid; i < cnt; i += kChainThreads)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(csm + a.off_sc[s] + 4 * (h * cnt + i))),
                     "l"(st.scale + h * (st.N / 2) + n0 + i)
                     : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int s = 0; s < kChainMaxStages; ++s) {
    if (s >= a.S || (s > 0 && !a.early)) break;
    request_params(s);
  }
  __syncthreads();  // the mbarrier's initialization

#pragma unroll
  for (int s = 0; s < kChainMaxStages; ++s) {
    if (s >= a.S) break;
    const ChainStage<T>& st = a.st[s];
    const int K = st.K, KB = st.KB, Kp = KB * kBlockK;
    const bool pr = a.pair[s] != 0;
    // the input arrives activated where the previous stage's epilogue paired gate and up
    const int act = (s > 0 && a.pair[s > 0 ? s - 1 : 0]) ? 0 : st.act;
    int t0, t1;
    chain_tiles(pr ? st.n_tiles / 2 : st.n_tiles, t0, t1);
    const int nt = t1 - t0, ntl = pr ? 2 * nt : nt, U = ntl * KB;  // ntl: local tiles (paired: gate, then up)
    const int u0 = (warp * U) / kChainWarps, u1 = ((warp + 1) * U) / kChainWarps;
    const int4* wbase = st.wp + (size_t)t0 * KB * 32 + lane;  // unit u (tile-major) at + u * 32
    // paired: units from nt * KB on are the up tiles, (n_tiles / 2 - nt) tiles further on (a select, no branch)
    const int split = pr ? nt * KB : INT_MAX;
    const size_t dup = pr ? (size_t)(st.n_tiles / 2 - nt) * KB * 32 : 0;
    auto waddr = [&](int u) { return wbase + (size_t)u * 32 + (u >= split ? dup : 0); };
    auto stamp = [&](int point) {
      if constexpr (PROF) {
        if (a.prof != nullptr && tid == 0) {
          unsigned long long* q = a.prof + ((size_t)(blockIdx.x * kChainMaxStages + s) * kChainStamps + point) * 2;
          q[0] = globaltimer_ns();
          q[1] = (unsigned long long)clock64();
        }
      }
    };
    stamp(0);
    int4 wa[CU], wb[CU];
    // a chunk wholly inside [u0, u1) and on one side of the paired split (all but <= 2 per warp and stage)
    // loads from one base address with constant offsets; a per-unit select and bounds test cost ~1.6M of
    // the 8B tail's 13.4M executed instructions (H200 ncu: 11.5M at 07242cf, which had no pairing)
    auto load_chunk = [&](int4 (&w)[CU], int u) {
      if (u + CU <= u1 && (u + CU <= split || u >= split)) {  // warp-uniform
        const int4* p = waddr(u);
#pragma unroll
        for (int j = 0; j < CU; ++j) w[j] = ld_weights(p + j * 32);
      } else {
#pragma unroll
        for (int j = 0; j < CU; ++j) w[j] = u + j < u1 ? ld_weights(waddr(u + j)) : make_int4(0, 0, 0, 0);
      }
    };
    if (s > 0 && !a.early) request_params(s);
    load_chunk(wa, u0);  // weights are constant: in flight across the barrier
    const T* snw = reinterpret_cast<const T*>(csm + a.off_nw[s]);
    const float* ssc = reinterpret_cast<const float*>(csm + a.off_sc[s]);
    if (s == 0) {
      pdl_wait();  // x and the residual come from the kernels before
    } else {
      chain_grid_sync(bar);  // the previous stage's output is complete
      if (tid == 0 && s + a.pf_stages - 1 < a.S && s + a.pf_stages - 1 >= a.pf_stages) {
        const ChainStage<T>& nx = a.st[s + a.pf_stages - 1];
        chain_prefetch_stage(nx.wp, nx.KB, nx.n_tiles, a.pair[s + a.pf_stages - 1 < kChainMaxStages ? s + a.pf_stages - 1 : 0] != 0);
      }
    }
    if (s == a.S - 1) pdl_trigger();  // the next kernel may start launching (every CTA is resident)
    stamp(1);

    // ---- the input row (every CTA): pass 1 a (+ residual) and sum(a^2) into sa
    for (int i = tid; i < ntl * kTileN; i += kChainThreads) sacc[i] = 0;
    const T* src = s == 0 ? a.x : a.st[s > 0 ? s - 1 : 0].y;
    const bool res = s == a.res_stage, norm = st.nw != nullptr;
    const uint32_t rowb = (uint32_t)((size_t)K * sizeof(T));
    if constexpr (TMA) {  // the input row(s) in one bulk copy each: one request per CTA instead of one per thread
      if (tid == 0) {
        asm volatile("fence.proxy.async.global;" ::: "memory");      // other SMs' stores, acquired above
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads of sin in the last stage
        const uint32_t bytes = rowb * (act != 0 ? 2u : 1u) + (res ? rowb : 0u);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mbar), "r"(bytes) : "memory");
        bulk_g2s(smem_u32(sin), src, rowb * (act != 0 ? 2u : 1u), mbar);
        if (res) bulk_g2s(smem_u32(sin) + rowb * (act != 0 ? 2u : 1u), a.residual, rowb, mbar);
      }
      mbar_wait(mbar, (uint32_t)(s & 1));
    }
    const T* rin = sin + (act != 0 ? 2 * K : K);
    float ss = 0.f;
    for (int k = tid * 8; k < K; k += kChainThreads * 8) {
      float e[8];
      if constexpr (TMA) sload8<T>(sin, k, e);
      else ldcg8<T>(src, k, e);
      if (act != 0) {
        float u[8];
        if constexpr (TMA) sload8<T>(sin + K, k, u);
        else ldcg8<T>(src + K, k, u);
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = chain_act<T>(act, e[i], u[i]);
      } else if (res) {
        float r[8];
        if constexpr (TMA) sload8<T>(rin, k, r);
        else ldcg8<T>(a.residual, k, r);
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(from_f32<T>(e[i] + r[i]));
        if (blockIdx.x == 0) store8<T>(a.res_out, k, K, true, e);
      }
      sstore8<T>(sa, k, e);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += e[i] * e[i];
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");  // this thread's part of the norm weights and scales
    float inv = 1.f;
    if (norm) inv = rsqrtf(chain_sum(ss, s_ss[s]) / (float)K + a.eps);  // its barrier publishes snw / ssc too
    stamp(2);
    // pass 2: h (in place) and max|h|; a thread reads back only the groups it wrote
    float amax = 0.f;
    for (int k = tid * 8; k < K; k += kChainThreads * 8) {
      float e[8];
      sload8<T>(sa, k, e);
      if (norm) {
        float wf[8];
        sload8<T>(snw, k, wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = to_f32<T>(from_f32<T>(e[i] * inv * wf[i]));
        sstore8<T>(sa, k, e);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(e[i]));
    }
    amax = chain_max(amax, s_am[s]);
    stamp(3);
    const float xs = (1.f / fmaxf(amax, 1e-5f)) * 127.f;  // as torch: reciprocal(t) * 127
    // pass 3: the int8 row (zeros past K) into sx
    int part = 0;
    for (int k = tid * 8; k < Kp; k += kChainThreads * 8) {
      float e[8];
      if (k < K) {
        sload8<T>(sa, k, e);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = 0.f;
      }
      *reinterpret_cast<uint2*>(sx + k) = quant_group8(e, xs, part);
    }
    const int rowsum = chain_isum(part, s_p[s]);  // its barrier publishes sx and the zeroed accumulators
    stamp(4);

    // ---- the CTA's tiles: warp units [u0, u1) of (tile, k-block), tile-major
    int acc[4] = {0, 0, 0, 0};
    int tl = u0 / KB, kb = u0 - tl * KB;
    auto flush = [&]() {
      if (c == 0) {
        a8_rows4_fix(acc);                              // a8_frag_r4's rows g + 8 at 4x -> the true sums
        atomicAdd(&sacc[tl * kTileN + g], acc[0]);      // (row g, x column 0)
        atomicAdd(&sacc[tl * kTileN + g + 8], acc[2]);  // (row g + 8, x column 0)
      }
      acc[0] = acc[1] = acc[2] = acc[3] = 0;
    };
    auto unit = [&](const int4& w) {
      if (kb == KB) {
        flush();
        ++tl;
        kb = 0;
      }
      const uint4* xk = reinterpret_cast<const uint4*>(sx + kb * kBlockK + c * 32);
      const uint4 x0 = xk[0], x1 = xk[1];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t af[4];
        a8_frag_r4(word_of_rt(w, i), af);  // rows g + 8 at 4x (flush divides)
        const uint4& v = i < 2 ? x0 : x1;
        mma16832_u8s8(acc, af, (i & 1) ? v.z : v.x, (i & 1) ? v.w : v.y);
      }
      ++kb;
    };
    auto run_chunk = [&](const int4 (&w)[CU], int u) {
#pragma unroll
      for (int j = 0; j < CU; ++j)
        if (u + j < u1) unit(w[j]);
    };
    for (int u = u0; u < u1; u += 2 * CU) {
      load_chunk(wb, u + CU);
      run_chunk(wa, u);
      if (u + CU >= u1) break;
      load_chunk(wa, u + 2 * CU);
      run_chunk(wb, u + CU);
    }
    if (u1 > u0) flush();
    __syncthreads();
    stamp(5);
    // epilogue: store_out's arithmetic for x row 0; paired: act(gate) * up of the two (as pass 1 would)
    for (int i = tid; i < nt * kTileN; i += kChainThreads) {
      const int n = t0 * kTileN + i;
      if (pr) {
        const float gv = to_f32<T>(from_f32<T>(a8_value(sacc[i] - rowsum, xs, ssc[i])));
        const float uv = to_f32<T>(from_f32<T>(a8_value(sacc[nt * kTileN + i] - rowsum, xs, ssc[nt * kTileN + i])));
        st.y[n] = from_f32<T>(chain_act<T>(a.st[s + 1 < kChainMaxStages ? s + 1 : s].act, gv, uv));
      } else if (n < st.N) {
        st.y[n] = from_f32<T>(a8_value(sacc[i] - rowsum, xs, ssc[i]));
      }
    }
    stamp(6);
  }
}

struct ChainLayout {
  int off_x, off_acc, off_in;
  int off_nw[kChainMaxStages], off_sc[kChainMaxStages];
  size_t bytes;
};
// shared memory of a chain on G CTAs (elem: sizeof(T)), every piece 16-byte aligned: the a / h row at the
// widest K, xq at the widest k-block count (+ 16), the accumulators of the most tiles a CTA gets, the raw
// input rows (tma: two rows at the widest K - [gate | up], or x and the residual), then per stage its norm
// weight (K_s) and scales (the most outputs a CTA gets)
// TRIT_CHAIN_PAIR (default 1; 0 turns it off): stage s pairs gate and up (ChainArgs::pair) where stage s + 1
// has an activation and N_s / 2 is a multiple of 16. H200 run 27: bit for bit the unpaired results (the
// stage-by-stage tests), and the tails 0.6 us (2B), 1.8 us (8B), 3.1 us (Llama-style 8B) faster
bool chain_pair_on() { return env_int("TRIT_CHAIN_PAIR", 1) != 0; }
inline bool chain_pairs(int s, int S, const int* Ns, const int* acts, bool on) {
  return on && s + 1 < S && acts[s + 1] != 0 && Ns[s] % (2 * kTileN) == 0;
}
// local tiles of the CTA that gets the most in stage s (paired: its gate tiles and as many up tiles)
inline int chain_tmax(int N, int G, bool pr) {
  const int nt = (N + kTileN - 1) / kTileN;
  return pr ? 2 * ((nt / 2 + G - 1) / G) : (nt + G - 1) / G;
}
inline ChainLayout chain_layout(int S, const int* Ns, const int* Ks, const int* acts, int G, size_t elem, bool tma,
                                bool pair) {
  int kmax = 8, kbmax = 1, tmax = 1;
  for (int s = 0; s < S; ++s) {
    kmax = max(kmax, Ks[s]);
    kbmax = max(kbmax, (Ks[s] + kBlockK - 1) / kBlockK);
    tmax = max(tmax, chain_tmax(Ns[s], G, chain_pairs(s, S, Ns, acts, pair)));
  }
  auto up16 = [](size_t b) { return (b + 15) / 16 * 16; };
  ChainLayout l = {};
  const size_t row = pro_row_bytes(kmax, elem);
  size_t off = row;
  l.off_x = (int)off;
  off += up16((size_t)kbmax * kBlockK + 16);
  l.off_acc = (int)off;
  off += up16((size_t)tmax * kTileN * sizeof(int));
  l.off_in = (int)off;
  off += tma ? 2 * row : 0;
  for (int s = 0; s < S; ++s) {
    l.off_nw[s] = (int)off;
    off += pro_row_bytes(Ks[s], elem);
    l.off_sc[s] = (int)off;
    off += up16((size_t)chain_tmax(Ns[s], G, chain_pairs(s, S, Ns, acts, pair)) * kTileN * sizeof(float));
  }
  l.bytes = off;
  return l;
}
size_t chain_smem_max();
// TRIT_CHAIN_TMA=1: the input rows by one bulk copy per CTA (where the two staged rows fit in shared memory)
// instead of every thread's 16-byte loads. Off by default: H200 run 26c timed it 1-2 us slower per 2B tail
// (the stage-2 prologue 4.35 vs 3.84 us: the rows' L2 round trip was not what the prologue waits on)
bool chain_tma(int S, const int* Ns, const int* Ks, const int* acts, int G, size_t elem) {
  return env_int("TRIT_CHAIN_TMA", 0) != 0 &&
         chain_layout(S, Ns, Ks, acts, G, elem, true, chain_pair_on()).bytes <= chain_smem_max();
}
int chain_grid() {  // one CTA per SM
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return sms;
}
size_t chain_smem_max() {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return 0;
  return (size_t)v - 3 * kChainMaxStages * kChainWarps * 4 - 16;  // the static reduction scratch, the mbarrier
}
// TRIT_CHAIN_KERNEL=0 turns the kernel off (the op composes ternary_mm_a8_prologue); TRIT_CHAIN_L2PF=n
// the stages prefetched at the start (default: all, up to 32 MB of weights; then the rest two stages ahead)
bool chain_ok(int M, int S, const int* Ns, const int* Ks, const int* acts, size_t elem) {
  if (M != 1 || S < 1 || S > kChainMaxStages || env_int("TRIT_CHAIN_KERNEL", 1) == 0) return false;
  for (int s = 0; s < S; ++s) {
    if (Ks[s] < 8 || Ks[s] % 8 != 0 || Ns[s] < 1 || acts[s] < 0 || acts[s] > 2) return false;
    if (s > 0 && Ns[s - 1] != (acts[s] != 0 ? 2 : 1) * Ks[s]) return false;
  }
  const int G = chain_grid();
  return G > 0 && chain_layout(S, Ns, Ks, acts, G, elem, chain_tma(S, Ns, Ks, acts, G, elem), chain_pair_on()).bytes <=
                    chain_smem_max();
}
template <typename T>
cudaError_t launch_chain(const T* x, const T* residual, T* res_out, int res_stage, float eps, int S,
                         const TritChainStage* in, cudaStream_t st) {
  int Ns[kChainMaxStages], Ks[kChainMaxStages], acts[kChainMaxStages];
  for (int s = 0; s < S && s < kChainMaxStages; ++s) {
    Ns[s] = in[s].N;
    Ks[s] = in[s].K;
    acts[s] = in[s].act;
  }
  if (!chain_ok(1, S, Ns, Ks, acts, sizeof(T))) return cudaErrorInvalidValue;
  if ((residual == nullptr) != (res_stage < 0) || (residual != nullptr && (res_stage >= S || acts[res_stage] != 0)) ||
      (residual == nullptr) != (res_out == nullptr))
    return cudaErrorInvalidValue;
  auto al = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!al(x) || !al(residual) || !al(res_out)) return cudaErrorInvalidValue;
  const int G = chain_grid();
  const bool tma = chain_tma(S, Ns, Ks, acts, G, sizeof(T)), pair = chain_pair_on();
  const ChainLayout l = chain_layout(S, Ns, Ks, acts, G, sizeof(T), tma, pair);
  ChainArgs<T> a = {};
  long long total = 0;
  for (int s = 0; s < S; ++s) {
    if (!al(in[s].nw) || !al(in[s].y) || in[s].packed == nullptr || in[s].scale == nullptr || in[s].y == nullptr)
      return cudaErrorInvalidValue;
    ChainStage<T>& c = a.st[s];
    c.wp = reinterpret_cast<const int4*>(in[s].packed);
    c.scale = in[s].scale;
    c.nw = static_cast<const T*>(in[s].nw);
    c.y = static_cast<T*>(in[s].y);
    c.N = Ns[s];
    c.K = Ks[s];
    c.KB = (Ks[s] + kBlockK - 1) / kBlockK;
    c.n_tiles = (Ns[s] + kTileN - 1) / kTileN;
    c.act = acts[s];
  }
  a.x = x;
  a.residual = residual;
  a.res_out = res_out;
  a.eps = eps;
  a.S = S;
  a.res_stage = residual != nullptr ? res_stage : -1;
  int pf = env_int("TRIT_CHAIN_L2PF", -1);
  if (pf < 0) {  // every stage up to 32 MB of weights, at least two
    pf = 0;
    for (int s = 0; s < S; ++s) {
      total += (long long)a.st[s].n_tiles * a.st[s].KB * 512;
      if (s >= 2 && total > (32ll << 20)) break;
      pf = s + 1;
    }
  }
  a.pf_stages = max(1, pf);
  a.early = env_int("TRIT_CHAIN_EARLY", 1) != 0 ? 1 : 0;
  a.off_x = l.off_x;
  a.off_acc = l.off_acc;
  a.off_in = l.off_in;
  for (int s = 0; s < kChainMaxStages; ++s) {
    a.off_nw[s] = s < S ? l.off_nw[s] : 0;
    a.off_sc[s] = s < S ? l.off_sc[s] : 0;
    a.pair[s] = s < S && chain_pairs(s, S, Ns, acts, pair) ? 1 : 0;
  }
  a.prof = nullptr;
  const char* pe = getenv("TRIT_CHAIN_PROF");
  const bool prof = pe != nullptr && *pe != '\0';  // the stamping kernel (TRIT_CHAIN_PROF=0: it, stamping nothing)
  if (prof) a.prof = reinterpret_cast<unsigned long long*>(strtoull(pe, nullptr, 0));
  const bool cu8 = env_int("TRIT_CHAIN_CU", kChainCU) == 8;
  using KernelFn = void (*)(ChainArgs<T>);
  // [cu8][prof][tma]: every combination of the three compile-time choices
  static constexpr KernelFn kernels[2][2][2] = {
      {{chain_kernel<T, kChainCU, false, false>, chain_kernel<T, kChainCU, false, true>},
       {chain_kernel<T, kChainCU, true, false>, chain_kernel<T, kChainCU, true, true>}},
      {{chain_kernel<T, 8, false, false>, chain_kernel<T, 8, false, true>},
       {chain_kernel<T, 8, true, false>, chain_kernel<T, 8, true, true>}}};
  const KernelFn kernel = kernels[cu8][prof][tma];
  if (l.bytes > 48 * 1024) {
    static int opted[64][8] = {};
    const int which = (cu8 ? 1 : 0) + (prof ? 2 : 0) + (tma ? 4 : 0);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return cudaErrorInvalidDevice;
    if (dev < 0 || dev >= 64 || !opted[dev][which]) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)chain_smem_max());
      if (e != cudaSuccess) return e;
      if (dev >= 0 && dev < 64) opted[dev][which] = 1;
    }
  }
  const bool pdl = knobs().pdl && pdl_supported();
  return launch_ex(kernel, dim3(G), dim3(kChainThreads), l.bytes, st, pdl, a);
}

}  // namespace

// ---------------------------------------------------------------- extern "C" API
namespace {
// The activation dtype code -> f(Tag<T>{}) with T the element type.
template <typename T> struct Tag { using type = T; };
template <typename F>
int visit_float_dtype(int dtype, F&& f) {
  switch (dtype) {
    case TRIT_F32: return f(Tag<float>{});
    case TRIT_F16: return f(Tag<__half>{});
    case TRIT_BF16: return f(Tag<__nv_bfloat16>{});
    default: return cudaErrorInvalidValue;
  }
}
}  // namespace

extern "C" int trit_mm(int dtype, const void* x, const int32_t* packed, const float* scale,
                       const void* bias, void* y, int M, int N, int K, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)dispatch_tmm<T>((const T*)x, packed, scale, (const T*)bias, (T*)y, M, N, K, (cudaStream_t)stream);
  });
}

extern "C" int trit_mm_naive(int dtype, const void* x, const int32_t* packed, const float* scale,
                             const void* bias, void* y, int M, int N, int K, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)launch_naive<T>((const T*)x, packed, scale, (const T*)bias, (T*)y, M, N, K, (cudaStream_t)stream);
  });
}

extern "C" int trit_mm_a8(int dtype, const void* x, const int32_t* packed, const float* scale,
                          const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs,
                          int32_t* rowsum, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)dispatch_a8<T>((const T*)x, packed, scale, (const T*)bias, (T*)y, M, N, K, xq, xs, rowsum,
                               (cudaStream_t)stream);
  });
}

// trit_mm_a8 of act(gate) * up (x = [gate | up], [M, 2K]) with the act inside the quantizer; where a8_act_ok
// holds, else cudaErrorInvalidValue before any launch (trit_mm_a8_act_ok says which)
extern "C" int trit_mm_a8_act_ok(int M, int N, int K) { return a8_act_ok(M, N, K) ? 1 : 0; }
extern "C" int trit_mm_a8_act(int dtype, const void* x, int act, const int32_t* packed, const float* scale,
                              const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs, int32_t* rowsum,
                              void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)dispatch_a8<T>((const T*)x, packed, scale, (const T*)bias, (T*)y, M, N, K, xq, xs, rowsum,
                               (cudaStream_t)stream, false, false, 0, act);
  });
}

// layout 1 past M = 8: the interleaved tiles, read by the kXI kernels only (TRIT_A8_XI=0: quantize again)
extern "C" int trit_mm_a8_pre_ok(int M, int N, int K, int layout) {
  return a8_pre_ok(M) && (layout == 0 || (layout == 1 && (a8_tile_mp(M) == 0 || knobs().xi))) ? 1 : 0;
}

// the layer-size half of the v5 route (a8_v5), for bindings.cpp a8_gemm_on at 32 < M <= 64
extern "C" int trit_a8_v5_on(int M, int N, int K) { return a8_v5(M, N, K) ? 1 : 0; }

// trit_mm_a8 on the bitplane layout: the same route and results where it runs (the v5 GEMV, M <= kA8BpMaxM),
// else cudaErrorInvalidValue; trit_mm_a8_bp_ok says which (dispatch_a8's condition)
extern "C" int trit_mm_a8_bp_ok(int M, int N, int K) {
  return M >= 1 && M <= kA8BpMaxM && a8_v5(M, N, K) && knobs().v5 ? 1 : 0;
}
extern "C" int trit_mm_a8_bp(int dtype, const void* x, const int32_t* packed_bp, const float* scale,
                             const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs,
                             int32_t* rowsum, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)dispatch_a8<T>((const T*)x, packed_bp, scale, (const T*)bias, (T*)y, M, N, K, xq, xs, rowsum,
                               (cudaStream_t)stream, false, true);
  });
}

// dispatch_a8 refuses (cudaErrorInvalidValue) where a8_pre_ok does not hold
extern "C" int trit_mm_a8_pre(int dtype, const int32_t* packed, const float* scale, const void* bias, void* y, int M,
                              int N, int K, const int8_t* xq, const float* xs, const int32_t* rowsum, int layout,
                              void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)dispatch_a8<T>(nullptr, packed, scale, (const T*)bias, (T*)y, M, N, K, const_cast<int8_t*>(xq),
                               const_cast<float*>(xs), const_cast<int32_t*>(rowsum), (cudaStream_t)stream, true, false,
                               layout);
  });
}

extern "C" int trit_mm_a8_gemm(int dtype, const void* x, const int32_t* packed, const float* scale,
                               const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs,
                               int32_t* rowsum, int32_t* ws, void* stream) {
  if (M <= 16 || (M > kA8GemmMaxM && trit_mm_a8_gemm_wg(M, N, K) != 2)) return (int)cudaErrorInvalidValue;
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)launch_a8_gemm<T>((const T*)x, packed, scale, (const T*)bias, (T*)y, M, N, K, xq, xs, rowsum, ws,
                                  (cudaStream_t)stream);
  });
}

extern "C" int trit_mm_a8_gemm_xq_rows(int M, int N, int K) { return gemm_shape(M, N, K).Mp; }

// The main loop a8_gemm_kernel runs at (M, N, K) (gemm_loop): 0 mma.sync, 1 / 2 wgmma with 64 / 128 x
// rows per CTA. Above M = 256 the kernel runs only with 2 (a8_route.h's choice, or TRIT_A8_GEMM_WG=2)
// and only within a8_wg2_fits; elsewhere this returns 0 there (int8 cuBLAS).
extern "C" int trit_mm_a8_gemm_wg(int M, int N, int K) {
  const GemmLoop l = gemm_loop(M, N, K);
  if (M > kA8GemmMaxM && (l.wg != 2 || !trit_route::a8_wg2_fits(M, N, K))) return 0;
  return l.wg;
}

extern "C" long long trit_mm_a8_gemm_ws_ints(int M, int N, int K) {
  // split-K only, none at ks = 1: one counter per (N, M) tile (the quantizer zeroes them), then from
  // a multiple of 4 ints ks slices of the grid's [BM][channels per CTA] int32 tiles (not zeroed)
  const GemmShape g = gemm_shape(M, N, K);
  const long long cnt = (long long)g.gx * g.gy;
  return g.ks > 1 ? ((cnt + 3) & ~3LL) + cnt * g.tile_ints * g.ks : 0;
}

extern "C" int trit_mm_a8_prologue_ok(int M, int N, int K) { return a8_prologue_ok(M, N, K) ? 1 : 0; }

extern "C" int trit_mm_a8_prologue(int dtype, const void* x, const void* residual, const void* nw, float eps, int act,
                                   void* res_out, const int32_t* packed, const float* scale, const void* bias, void* y,
                                   int M, int N, int K, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const A8Pro<T> pro{(const T*)residual, (const T*)nw, (T*)res_out, eps, act};
    return (int)dispatch_a8_prologue<T>((const T*)x, pro, packed, scale, (const T*)bias, (T*)y, M, N, K,
                                        (cudaStream_t)stream);
  });
}

extern "C" int trit_rms_norm_a8q_max_k() { return kRnqMaxK; }

extern "C" int trit_rms_norm_a8q(int dtype, const void* x, const void* residual, const void* w, void* out,
                                 void* res_out, int8_t* xq, float* xs, int32_t* rowsum, int M, int K, float eps,
                                 int layout, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)launch_rms_norm_quant<T>((const T*)x, (const T*)residual, (const T*)w, (T*)out, (T*)res_out, xq, xs,
                                         rowsum, M, K, eps, layout, (cudaStream_t)stream);
  });
}

extern "C" int trit_a8_quant(int dtype, const void* x, int8_t* xq, float* xs, int32_t* rowsum, int M, int K,
                             void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int Kp = (K + kBlockK - 1) / kBlockK * kBlockK;
    if (a8_v4q_on()) {  // the 16-byte-load quantizer (TRIT_A8_V4Q), same bytes; no PDL: decode / cuBLAS follow
      const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
      return (int)launch_ex(quant_rows_perm_kernel<T, false, false, true>, dim3(M), dim3(256), 0,
                            (cudaStream_t)stream, false, (const T*)x, xq, xs, rowsum, M, K, Kp, 0, vec,
                            (int32_t*)nullptr, 0);
    }
    quant_rows_kernel<T><<<M, 256, 0, (cudaStream_t)stream>>>((const T*)x, xq, xs, rowsum, K, Kp);
    return (int)cudaGetLastError();
  });
}

int a8_epilogue(int dtype, const int32_t* acc, const float* xs, const float* scale, const void* bias, void* y, int M,
                int N, void* stream) {
  if (N % 4 != 0) return (int)cudaErrorInvalidValue;
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t total = (size_t)M * (N / 4);
    const int blocks = (int)std::min<size_t>((total + 255) / 256, 132 * 16);
    a8_epilogue_kernel<T><<<blocks, 256, 0, (cudaStream_t)stream>>>(acc, xs, scale, (const T*)bias, (T*)y, M, N);
    return (int)cudaGetLastError();
  });
}

extern "C" int trit_a8_epilogue(int dtype, const int32_t* acc, const float* xs, const float* scale,
                                const void* bias, void* y, int M, int N, void* stream) {
  return a8_epilogue(dtype, acc, xs, scale, bias, y, M, N, stream);
}


extern "C" int trit_decode(int out_dtype, const int32_t* packed, const float* scale, void* out,
                           int N, int K, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (out_dtype == TRIT_I8) return launch_decode<int8_t>(packed, nullptr, (int8_t*)out, N, K, st);
  return visit_float_dtype(out_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)launch_decode<T>(packed, scale, (T*)out, N, K, st);
  });
}

extern "C" int trit_act_mul(int dtype, const void* x, void* out, int M, int K, int act, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)launch_act_mul<T>((const T*)x, (T*)out, M, K, act, (cudaStream_t)stream);
  });
}
extern "C" int trit_chain_ok(int dtype, int M, int S, const int* Ns, const int* Ks, const int* acts) {
  const size_t elem = dtype == TRIT_F32 ? 4 : 2;
  return (dtype == TRIT_F32 || dtype == TRIT_F16 || dtype == TRIT_BF16) && chain_ok(M, S, Ns, Ks, acts, elem) ? 1 : 0;
}
extern "C" int trit_chain(int dtype, const void* x, const void* residual, void* res_out, int res_stage, float eps,
                          int S, const TritChainStage* stages, void* stream) {
  return visit_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return (int)launch_chain<T>((const T*)x, (const T*)residual, (T*)res_out, res_stage, eps, S, stages,
                                (cudaStream_t)stream);
  });
}

extern "C" const char* trit_error_string(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}
