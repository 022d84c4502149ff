// The default main loop of the W1.58A8 GEMM kernel (ternary_gemm.cu, a8_gemm_kernel) per problem
// shape on an sm_90a build: plain C++ (no CUDA), so that tests/test_a8_route.py can compile it with
// g++ and check it against the committed H200 measurements it was drawn from.
//
// The loops (GemmCfg ids in ternary_gemm.cu):
//   kA8LoopMma     mma.sync m16n8k32, 128 channels x 64 rows per CTA, 2 k-blocks ahead
//   kA8LoopWg      wgmma m64n64k32, 128 channels x 64 rows, the next k-block fetched under the
//                  running wgmma, 2 k-blocks ahead (4 ring stages of 12 KB)
//   kA8LoopWgDeep  the same with 6 k-blocks ahead (8 stages; 2 CTAs per SM still fit)
//   kA8LoopWg2     wgmma with 128 rows per CTA (two m64n64k32 per k-step), 2 ahead (4 stages of
//                  20 KB); each weight k-block decoded once per 128 rows
//
// Drawn from H200 runs 19 / 20c (bench/results/2026-12-01-h200-run19-wgmma.*, -run20c-deep.*), every
// loop timed in one run on the 14 BitNet-2B / Llama-8B / 70B shapes at M = 40 - 256 and 1024 / 4096:
// - The mma.sync and the shallow 64-row wgmma loops both take ~1 us per k-block whatever M (the
//   wgmma instructions are not the limit): waiting on memory. The deep ring is the fix wherever the
//   64-row tiles fit in one wave of 2 CTAs per SM: 28672x8192 M = 64 47.5 us vs 66.0 (humming 60.1
//   in run 20), 8192x8192 M = 128 31.5 vs 40.4, 4096x14336 M = 128 32.7 vs 39.9, 6912x2560 M = 256
//   20.4 vs 26.5; it lost (by 1 - 7%) only to the 128-row loop on 8192x28672 at M = 96 - 256.
// - Past one wave the 128-row loop, which halves the weight decode and traffic per row (28672x8192
//   M = 128 73.7 us vs 87.5 deep); but at M with a half-empty last 128-row tile (M = 192: 64 of 256
//   rows padding) the shallow 64-row loop (28672x8192 M = 192 122.0 vs 135.3, 14336x4096 37.3 vs 42.7).
// - Above M = 256 the 128-row loop wherever its tiles alone give >= 48 CTAs (28672x8192 M = 4096 1779
//   us vs int8 cuBLAS 2519, bf16 2357; it lost only on 640x2560 M = 1024, 5 x 8 CTAs: 29.1 vs 25.3
//   int8), else int8 cuBLAS. Problems of >= 2^31 bytes of quantized x or of outputs stay there too
//   (past anything measured; the grid's y extent, M / 128 <= 65535, ends the kernel's range later).
#pragma once

#include <stdint.h>

namespace trit_route {

enum A8Loop { kA8LoopNone = -1, kA8LoopMma = 0, kA8LoopWg = 1, kA8LoopWgDeep = 2, kA8LoopWg2 = 3 };

inline long long cdiv(long long a, long long b) { return (a + b - 1) / b; }

// within the sizes the 128-row loop takes above M = 256 (forced or by default)
inline bool a8_wg2_fits(int M, int N, int K) {
  const long long Kp = cdiv(K, 128) * 128, Mp = cdiv(M, 128) * 128;
  return Mp * Kp < (1LL << 31) && Mp * (long long)N < (1LL << 31);
}

// M > 256: the 128-row wgmma loop, or kA8LoopNone (int8 cuBLAS)
inline bool a8_wg2_large_m(int M, int N, int K) {
  return a8_wg2_fits(M, N, K) && cdiv(N, 128) * cdiv(M, 128) >= 48;
}

// The loop for a problem the GEMM kernel takes (bindings.cpp a8_gemm_on), on an sm_90a build at
// compute capability 9.0; sm_count: the device's SMs. kA8LoopNone: above M = 256, not this kernel.
inline A8Loop a8_gemm_auto_loop(int M, int N, int K, int sm_count) {
  if (M > 256) return a8_wg2_large_m(M, N, K) ? kA8LoopWg2 : kA8LoopNone;
  if (M <= 32) return kA8LoopMma;  // the GEMM kernel runs here only when forced; not measured
  const long long tiles64 = cdiv(N, 128) * cdiv(M, 64);
  if (tiles64 <= 2LL * sm_count) return kA8LoopWgDeep;
  return cdiv(M, 128) * 128 - M < 64 ? kA8LoopWg2 : kA8LoopWg;
}

// The a8 GEMV's launch shape at 16 < M <= 32 (a8_small_kernel with MT = 4 row tiles) where each warp takes
// two weight tiles (wn = 2: layers of >= 128M weights, ternary_gemm.cu wn_auto): nw warps along N per CTA
// times ks split-K warps = 8 warps. The general rule (small_cfg: split K until ~1536 warps) gave these
// layers CTAs for 1.7 - 1.9 waves of one CTA per SM; the smallest nw whose CTAs fit in one wave won
// in two H200 runs (bench/results/2026-12-03-h200-run36.*, run 35's sweep in NOTES.md): 28672x8192
// M = 32 nw = 8 ks = 1 41.7 us vs 46.1 default (nw = 4 ks = 2, 224 CTAs), 8192x28672 nw = 2 ks = 4
// 41.1 vs 43.7 (nw = 1 ks = 8, 256 CTAs). With one tile per warp (wn = 1) the same rule lost badly
// (14336x4096 nw = 8 ks = 1 28.8 vs 17.4, 8192x8192 nw = 4 ks = 2 28.0 vs 17.0): not applied there.
// n_warps: weight-tile warps along N (tiles / wn), KB: k-blocks; returns nw (ks = 8 / nw), or 0 where no
// nw in 1..8 fits one wave with >= 2 k-blocks per split-K warp (the general rule stays).
inline int a8_mt4_wide_nw(int n_warps, int KB, int sm_count) {
  for (int nw = 1; nw <= 8; nw *= 2) {
    const int ks = 8 / nw;
    if (cdiv(n_warps, nw) <= sm_count) return KB / (2 * ks) >= 2 ? nw : 0;
  }
  return 0;
}

// The v5 GEMV's general launch shape (ternary_gemm.cu small_cfg), before the per-shape rules below: split K over
// ks warps per weight tile, doubling ks (up to max_warps) while the grid has < 1536 warps and every split keeps
// >= 2 chunks' worth of k-blocks; n_warps: weight-tile warps along N (tiles / wn), KB: k-blocks.
inline int v5_split_ks(int n_warps, int KB, int max_warps) {
  int ks = 1;
  while (ks < max_warps && n_warps * ks < 1536 && KB / (2 * ks) >= 2) ks *= 2;
  return ks;
}
// ... and the weight tiles per CTA beside it at MT >= 2 (MT = 1 keeps one): the rest of max_warps, at most 4.
inline int v5_tiles_per_cta(int ks, int max_warps) {
  const int nw = max_warps / ks;
  return nw < 1 ? 1 : (nw > 4 ? 4 : nw);
}

// The a8 GEMV's CTA shape at 16 < M <= 32 with one weight tile per warp (wn = 1, layers of < 128M weights): where
// the general split-K rule (ternary_gemm.cu small_cfg) gives every tile ks >= 4 warps along K, one tile per CTA
// (nw = 1, ks * 32 threads) instead of nw = 8 / ks tiles. H200 run 47 (bench/results/2026-12-04-h200-run47-cfg.*,
// the full (nw, ks) sweep at M = 16 / 24 / 32 on 13 shapes, one run): at ks = 4 nw = 1 won on every shape at
// M = 24 and 32 - 6144x4096 (the 8B qkv) 9.2 / 9.6 -> 9.0 / 8.7 us, 8192x8192 13.1 / 13.5 -> 13.0 / 13.2, 6912x2560
// 8.0 / 8.3 -> 7.8 / 8.1 - the 128-thread CTAs (up to 4 per SM at <= 128 registers) spreading 2 - 3 per SM where
// 256-thread ones left SMs with one CTA beside SMs with two. With ks <= 2 it was within noise either way (14336x4096
// M = 24 13.2 -> 13.4, 28672x4096 M = 24 21.7 -> 21.1): not applied there. ks = 8 is nw = 1 already.
// Returns the nw to launch with, or 0 to keep the general rule's.
inline int a8_mt4_narrow_nw(int ks) { return ks >= 4 ? 1 : 0; }

}  // namespace trit_route
