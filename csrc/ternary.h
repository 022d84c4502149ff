// Plain-C interface between the CUDA kernels (ternary_gemm.cu, compiled by nvcc alone)
// and the torch binding (bindings.cpp, compiled by the host compiler against torch headers).
// Keeping this boundary free of torch types lets CI compile-gate both halves on a machine
// whose torch wheel has no CUDA headers.
//
// Packed weight layout ("tile16x128", int32 words), for logical W int8 [N, K] in {-1, 0, +1}:
//   packed: int32 [ceil(N/16), ceil(K/128) * 128]; row t holds output channels 16t .. 16t+15.
//   Within row t, k-block kb (128 inputs) occupies words [kb*128, kb*128 + 128), and word
//   kb*128 + lane*4 + i (lane = 8-row group g * 4 + c, g in 0..7, c in 0..3, i in 0..3) holds
//   the 16 weights of rows {16t+g, 16t+g+8} x inputs {kb*128 + c*32 + 8i + kk, kk in 0..7}.
//   Element (row 16t + g + 8*rs, kk) sits in bits [b, b+1] with
//       b = 16*(kk & 1) + 2*(4*(kk >> 2) + 2*((kk >> 1) & 1) + rs),
//   as the 2-bit code w + 1 (0 -> -1, 1 -> 0, 2 -> +1; 3 is never written). Padding rows and
//   columns hold code 1 (zero weight). trit/ops.py: repack / unpack implement this in torch.
//   Why: one 16-byte load per lane gives a warp a 16 x 128 tile whose words decode, with one
//   LOP3 + one HFMA2 per pair, straight into mma.m16n8k16 A fragments (and with one LOP3
//   into mma.m16n8k32 u8 fragments), with x read in natural order.
//
// Bitplane layout ("tile16x128-bp", trit_mm_a8_bp; trit/ops.py repack_bitplane / unpack_bitplane), the
// +1/-1 bitmask form of the same weights: same shape, same 16-byte load per lane and k-block, but the
// lane's four words are P0, N0, P1, N1 - one bit per weight for "is +1" (P) and "is -1" (N) - where the
// layout above has the 2-bit codes C0..C3: for j, h in {0, 1}, byte b and s in 0..3, bit 8b + 4h + s of
// P_j / N_j is (code at bits [8b + 2s, 8b + 2s + 1] of C_(2j+h)) == 2 / == 0. A weight is +1, -1 or 0
// (neither bit); both bits set is not a weight (the kernel would read it as 0; unpack_bitplane refuses it).
// Why: it is the "+1/-1 bitmask" format of the seed's next steps, measured beside the code layout at the
// same 2 bits per weight: the kernel rebuilds each u8 A fragment as 0x01010101 + p - n per four weights
// (two shifts, two ANDs, one add) where the codes take one shift and one AND.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// dtype codes shared by both sides
enum { TRIT_F32 = 0, TRIT_F16 = 1, TRIT_BF16 = 2, TRIT_I8 = 3 };

// Returns a cudaError_t as int (0 = success). `stream` is a cudaStream_t.
// y[M,N] = scale[n] * sum_k x[m,k] W[n,k] (+ bias[n]); x, bias, y of `dtype`.
int trit_mm(int dtype, const void* x, const int32_t* packed, const float* scale,
            const void* bias, void* y, int M, int N, int K, void* stream);

// Same output, one thread per output, decode inside the k loop: the correctness anchor.
int trit_mm_naive(int dtype, const void* x, const int32_t* packed, const float* scale,
                  const void* bias, void* y, int M, int N, int K, void* stream);

// W1.58A8: per-row absmax int8 activations, int32 accumulation.
// Workspace: xq int8 [ceil(M/64)*64 (at least 64), ceil(K/128)*128] (layout chosen by the kernel),
// xs float [M], rowsum int32 [M].
int trit_mm_a8(int dtype, const void* x, const int32_t* packed, const float* scale,
               const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs,
               int32_t* rowsum, void* stream);
// The same on activations quantized by the caller (trit.ops.a8_quantize: xq int8 [M, ceil(K/128)*128]
// row-major, zeros past K, each group of 8 inputs in the order {0,4,1,5,2,6,3,7}; xs = 127 / absmax
// float [M]; rowsum = sum of xq int32 [M]): the M <= 32 GEMV without its quantizer. Only where
// trit_mm_a8_pre_ok(M, N, K, layout) (the v5 MT = 1 kernel, or MT = 2 / 4 reading the row-major rows past M = 8, up
// to TRIT_A8_PRE_MAXM), else cudaErrorInvalidValue. layout 1: xq in trit.ops.a8_tile's layout (32 * ceil(M / 32)
// rows; at 8 < M <= 32 the interleaved row tiles of the quantizer behind the MT = 2 / 4 GEMV, which reads them with
// its kXI loads: so only while TRIT_A8_XI is on), as trit_rms_norm_a8q writes it with layout 1.
int trit_mm_a8_pre_ok(int M, int N, int K, int layout);
// W1.58A8 on the bitplane layout (above): the route, arithmetic and results of trit_mm_a8 where its v5 GEMV
// runs with at most 4 row tiles (M <= 32, TRIT_KERNEL not v4), cudaErrorInvalidValue elsewhere; the same
// workspace as trit_mm_a8.
int trit_mm_a8_bp_ok(int M, int N, int K);
int trit_mm_a8_bp(int dtype, const void* x, const int32_t* packed_bp, const float* scale,
                  const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs,
                  int32_t* rowsum, void* stream);
int trit_mm_a8_pre(int dtype, const int32_t* packed, const float* scale, const void* bias, void* y, int M, int N,
                   int K, const int8_t* xq, const float* xs, const int32_t* rowsum, int layout, void* stream);
// The same through the GEMM-shaped kernel (M > 16; above 256 only with its 128-row wgmma loop,
// trit_mm_a8_gemm_wg(M, N, K) == 2; bindings.cpp a8_gemm_on picks it):
// xq must hold trit_mm_a8_gemm_xq_rows(M, N, K) rows (M rounded up to the CTA's rows: 32, 64 or
// 128) of ceil(K / 128) * 128 bytes; ws trit_mm_a8_gemm_ws_ints(M, N, K) int32 (split-K tile
// counters and partial sums; the kernels zero what needs it), or null when that is 0 (no split-K).
int trit_mm_a8_gemm(int dtype, const void* x, const int32_t* packed, const float* scale,
                    const void* bias, void* y, int M, int N, int K, int8_t* xq, float* xs,
                    int32_t* rowsum, int32_t* ws, void* stream);
long long trit_mm_a8_gemm_ws_ints(int M, int N, int K);
// 1 where trit_mm_a8's layer-size rule keeps an M-row call on its v5 GEMV (M <= 32; at 32 < M <= 64 the MT = 8
// kernel on layers of <= TRIT_A8_MT8_MAXW Mi weights, default 64), 0 where the GEMM routes take it (a8_gemm_on)
int trit_a8_v5_on(int M, int N, int K);
int trit_mm_a8_gemm_xq_rows(int M, int N, int K);
int trit_mm_a8_gemm_wg(int M, int N, int K);

// Large-M W1.58A8 pieces (the op runs int8 cuBLAS between them, see bindings.cpp):
// the activation quantizer alone, xq int8 [M, ceil(K/128)*128] row-major (zeros past K),
// xs float [M], rowsum int32 [M]; and the epilogue y[m,n] = acc[m,n] / xs[m] * scale[n]
// (+ bias[n]) from the exact int32 sums acc [M, N] (N % 4 == 0), the a8 kernels' arithmetic.
int trit_a8_quant(int dtype, const void* x, int8_t* xq, float* xs, int32_t* rowsum, int M, int K,
                  void* stream);
int trit_a8_epilogue(int dtype, const int32_t* acc, const float* xs, const float* scale,
                     const void* bias, void* y, int M, int N, void* stream);

// RMSNorm + the a8 quantizer (trit::rms_norm_a8q; x, residual, w, out, res_out of `dtype`; residual and
// res_out may be null together): z = x (+ residual, rounded to dtype, stored in res_out), out = dtype(z *
// rsqrt(mean(z^2) + eps) * w), and out's quantization as trit_mm_a8_pre reads it (xq int8 [M, ceil(K/128)
// *128], xs float [M], rowsum int32 [M]; layout 1: xq of 32 * ceil(M / 32) rows in trit.ops.a8_tile's layout).
// K <= trit_rms_norm_a8q_max_k(), else cudaErrorInvalidValue.
int trit_rms_norm_a8q_max_k(void);
int trit_rms_norm_a8q(int dtype, const void* x, const void* residual, const void* w, void* out, void* res_out,
                      int8_t* xq, float* xs, int32_t* rowsum, int M, int K, float eps, int layout, void* stream);

// The W1.58A8 GEMV with the layer's input computed in front of its quantizer, in every CTA (trit::
// ternary_mm_a8_prologue): act 1 / 2: x is [M, 2K] = [gate | up] and the input is T(T(relu(gate)^2) * up) /
// T(T(silu(gate)) * up); act 0: x [M, K], plus residual (rounded to T; the sum stored in res_out) when
// residual is given; then, with nw, RMSNorm T(a * rsqrt(mean(a^2) + eps) * nw). One kernel; only where
// trit_mm_a8_prologue_ok(M, N, K) (M <= TRIT_A8_PROLOGUE_MAXM, default 1) with 16-byte aligned rows and
// K % 8 == 0, else cudaErrorInvalidValue (the op then runs the same arithmetic in several kernels).
int trit_mm_a8_prologue_ok(int M, int N, int K);
int trit_mm_a8_prologue(int dtype, const void* x, const void* residual, const void* nw, float eps, int act,
                        void* res_out, const int32_t* packed, const float* scale, const void* bias, void* y,
                        int M, int N, int K, void* stream);

// trit_mm_a8 of act(gate) * up (x [M, 2K] = [gate | up], act 1 relu^2 / 2 silu, torch's roundings as in
// trit_mm_a8_prologue) with the act computed by the layer's activation quantizer (one kernel where the model ran
// the act kernel and the quantizer), then the GEMV trit_mm_a8 runs at this M; the workspace of trit_mm_a8 (xq
// [64 * ceil(M / 64), Kp]). Bit for bit trit_mm_a8 on the act's output. Only where trit_mm_a8_act_ok(M, N, K)
// (the v5 GEMV route up to M = 64, sm_90, TRIT_QUANT_CLUSTER not 0), else cudaErrorInvalidValue before any launch.
int trit_mm_a8_act_ok(int M, int N, int K);
int trit_mm_a8_act(int dtype, const void* x, int act, const int32_t* packed, const float* scale, const void* bias,
                   void* y, int M, int N, int K, int8_t* xq, float* xs, int32_t* rowsum, void* stream);

// act(gate) * up (act 1 relu^2, 2 silu) of x [M, 2K] = [gate | up] into out [M, K], in the dtype as torch's
// ops round (relu, square / silu, mul): the composed prologue route's activation in one kernel.
int trit_act_mul(int dtype, const void* x, void* out, int M, int K, int act, void* stream);

// trit::ternary_chain at M = 1: S <= TRIT_CHAIN_MAX_STAGES W1.58A8 layers in a row in ONE persistent kernel
// (grid barrier between them). Stage s is trit_mm_a8_prologue(h_s, residual if s == res_stage, nw, eps, act, ...)
// without bias, h_0 = x ([K_0], or [2 K_0] with act) and h_{s+1} = stage s's y [N_s] (so N_s = K_{s+1}, or
// 2 K_{s+1} with act); residual / res_out [K_res_stage] together or null (res_stage -1). Only where
// trit_chain_ok (M = 1, K % 8 == 0, the shared memory fits; TRIT_CHAIN_KERNEL=0 says no), 16-byte aligned
// rows, else cudaErrorInvalidValue (the op then composes trit_mm_a8_prologue).
#define TRIT_CHAIN_MAX_STAGES 4
typedef struct {
  const int32_t* packed;
  const float* scale;
  const void* nw;  // norm weight [K] or null
  void* y;         // [N]
  int N, K, act;
} TritChainStage;
int trit_chain_ok(int dtype, int M, int S, const int* Ns, const int* Ks, const int* acts);
int trit_chain(int dtype, const void* x, const void* residual, void* res_out, int res_stage, float eps, int S,
               const TritChainStage* stages, void* stream);

// Dense decode: out[N,K] (out_dtype) = W[n,k] * scale[n] (scale may be null -> 1).
int trit_decode(int out_dtype, const int32_t* packed, const float* scale, void* out, int N,
                int K, void* stream);

const char* trit_error_string(int err);

#ifdef __cplusplus
}
#endif
