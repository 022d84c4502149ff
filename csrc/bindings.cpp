// CUDA implementations of the trit:: ops. The schemas, CPU kernels and fake (meta) kernels
// are defined in trit/ops.py (so the ops exist on machines without this extension); this
// file only adds the CUDA dispatch key. It checks shapes, allocates, and launches; it never
// reads tensor values on the host and never synchronizes, so the ops capture in CUDA graphs.
//
// Only device-agnostic torch headers are used (the stream comes through c10's virtual guard),
// so CI can compile this file against a CPU-only torch wheel (ci/compile_csrc.sh).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "ternary.h"
#include "trit_msg.h"

namespace {

void* current_stream(const at::Tensor& t) {
  const auto* impl = c10::impl::getDeviceGuardImpl(t.device().type());
  return impl->getStream(t.device()).native_handle();
}

int dtype_code(at::ScalarType s, const char* op) {
  switch (s) {
    case at::kFloat: return TRIT_F32;
    case at::kHalf: return TRIT_F16;
    case at::kBFloat16: return TRIT_BF16;
    case at::kChar: return TRIT_I8;
    default: TRIT_CHECK(false, op, ": unsupported dtype ", s, " (expected float32, float16 or bfloat16)");
  }
  return -1;
}

void check_packed(const at::Tensor& packed, int64_t N, int64_t K, const char* op) {
  TRIT_CHECK(N >= 1 && K >= 1, op, ": N and K must be >= 1, got N=", N, " K=", K);
  TRIT_CHECK(N < (1LL << 31) && K < (1LL << 31), op, ": N, K must fit in int32");
  TRIT_CHECK(packed.scalar_type() == at::kInt, op, ": packed must be int32 (from trit.ops.repack), got ",
              packed.scalar_type());
  const int64_t rows = (N + 15) / 16, cols = (K + 127) / 128 * 128;
  TRIT_CHECK(packed.dim() == 2 && packed.size(0) == rows && packed.size(1) == cols, op,
              ": packed has shape ", packed.sizes(), " but N=", N, ", K=", K, " needs (", rows, ", ", cols,
              "); was it made by trit.ops.repack for this weight?");
  TRIT_CHECK(packed.is_cuda() && packed.is_contiguous(), op, ": packed must be a contiguous CUDA tensor");
}

void check_scale(const at::Tensor& scale, int64_t N, const at::Tensor& like, const char* op) {
  TRIT_CHECK(scale.scalar_type() == at::kFloat, op, ": scale must be float32, got ", scale.scalar_type());
  TRIT_CHECK(scale.dim() == 1 && scale.size(0) == N, op, ": scale must be [N]=[", N, "], got ", scale.sizes(),
              " (broadcast per-tensor scales to [N] first)");
  TRIT_CHECK(scale.device() == like.device() && scale.is_contiguous(), op,
              ": scale must be contiguous and on ", like.device());
}

struct MmArgs {
  at::Tensor x, y, bias;
  int M = 0;
  int dtype = 0;
};

// need_x false: the caller passes its own pointer to the kernels, a.x is x as given (no contiguous copy)
MmArgs prepare(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t N, int64_t K,
               const std::optional<at::Tensor>& bias, const char* op, bool need_x = true) {
  TRIT_CHECK(x.is_cuda(), op, ": x must be a CUDA tensor");
  TRIT_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.sizes(),
              " (trit.ops.ternary_linear accepts any rank)");
  TRIT_CHECK(x.size(1) == K, op, ": x.size(1)=", x.size(1), " but K=", K);
  TRIT_CHECK(x.size(0) < (1LL << 31), op, ": M must fit in int32");
  TRIT_CHECK(packed.device() == x.device(), op, ": packed is on ", packed.device(), ", x on ", x.device());
  check_packed(packed, N, K, op);
  check_scale(scale, N, x, op);
  MmArgs a;
  a.dtype = dtype_code(x.scalar_type(), op);
  TRIT_CHECK(a.dtype != TRIT_I8, op, ": x must be floating point");
  a.x = need_x ? x.contiguous() : x;
  a.M = static_cast<int>(x.size(0));
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    TRIT_CHECK(b.dim() == 1 && b.size(0) == N, op, ": bias must be [N]=[", N, "], got ", b.sizes());
    TRIT_CHECK(b.scalar_type() == x.scalar_type(), op, ": bias dtype ", b.scalar_type(), " != x dtype ",
                x.scalar_type());
    TRIT_CHECK(b.device() == x.device(), op, ": bias is on ", b.device(), ", x on ", x.device());
    a.bias = b.contiguous();
  }
  a.y = at::empty({x.size(0), N}, x.options());
  return a;
}

void check_launch(int err, const char* op) {
  TRIT_CHECK(err == 0, op, ": kernel launch failed: ", trit_error_string(err));
}

// trit_mm and trit_mm_naive share one signature: one wrapper runs either.
using MmFn = int (*)(int, const void*, const int32_t*, const float*, const void*, void*, int, int, int, void*);

at::Tensor run_mm(MmFn fn, const char* op, const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                  int64_t N, int64_t K, const std::optional<at::Tensor>& bias) {
  c10::DeviceGuard guard(x.device());
  MmArgs a = prepare(x, packed, scale, N, K, bias, op);
  if (a.M == 0) return a.y;
  check_launch(fn(a.dtype, a.x.data_ptr(), packed.data_ptr<int32_t>(), scale.data_ptr<float>(),
                  a.bias.defined() ? a.bias.data_ptr() : nullptr, a.y.data_ptr(), a.M, (int)N, (int)K,
                  current_stream(x)),
               op);
  return a.y;
}

at::Tensor ternary_mm_cuda(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t N,
                           int64_t K, const std::optional<at::Tensor>& bias) {
  return run_mm(&trit_mm, "trit::ternary_mm", x, packed, scale, N, K, bias);
}

at::Tensor ternary_mm_naive_cuda(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                                 int64_t N, int64_t K, const std::optional<at::Tensor>& bias) {
  return run_mm(&trit_mm_naive, "trit::ternary_mm_naive", x, packed, scale, N, K, bias);
}

// an on / off knob read per call (like the kernel knobs): unset or empty -> dflt, "0" -> off
bool env_flag(const char* name, bool dflt) {
  const char* e = getenv(name);
  return (e != nullptr && *e != '\0') ? strcmp(e, "0") != 0 : dflt;
}

// Smallest M at which ternary_mm_a8 runs as int8 weights decoded per call + cuBLAS int8 GEMM
// (torch._int_mm, exact int32 sums) + the a8 epilogue, instead of the fused kernels: the same
// arithmetic (bit-identical output), W decode amortised over M rows. TRIT_A8_DENSE_MIN_M
// overrides it (read per call, like the kernel knobs). H200 run 9 (bench/results/NOTES.md), both
// paths in one run: at M = 128 the fused v4 a8 kernel wins on 8 of 10 shapes (8192x8192 55.7 vs
// 87.4 us), at M = 256 int8 cuBLAS wins on 7 of 10 (28672x8192 270 vs 333 us), and above that
// the fused kernel falls far behind (run 2). torch._int_mm itself ran no faster than bf16 cuBLAS.
int64_t a8_dense_min_m() {
  const char* e = getenv("TRIT_A8_DENSE_MIN_M");
  return (e != nullptr && *e != '\0') ? atoll(e) : 256;
}

// (An exact bf16 route - xq and W as bf16, cuBLAS with fp32 output, TRIT_A8_DENSE=bf16 - lost to
// int8 cuBLAS on every shape in H200 run 10, e.g. 2560x2560 M=4096 165.0 vs 148.1 us, and was removed.)
// W1.58A8 at 32 < M <= 256 through the GEMM-shaped kernel (ternary_gemm.cu, a8_gemm_kernel), by
// shape and M, from H200 runs 15 and 16 (bench/results/NOTES.md: the `gemm kernel` column against
// the fused a8 kernel and int8 cuBLAS in the same run; run 16 = the epilogue through shared memory
// with its loops unrolled). M = 33-64: above 16M weights then (run 16: 2560x6912 22.1 vs 28.0 us,
// 6144x4096 19.9 vs 21.4, 13824x2560 22.1 vs 28.9, 14336x4096 26.9 vs 35.9, 8192x8192 28.7 vs
// 33.7, 28672x8192 65.7 vs 99.3; 6912x2560 17.6 vs 17.3 a tie; lost on 4096x4096 18.9 vs 15.9,
// 2560x2560 16.6 vs 12.0). M = 65-128: from 16M weights (4096x4096 21.0 vs 22.2, 6912x2560 21.7
// vs 28.6; lost on 3840x2560 18.6 vs 17.8, 2560x2560 18.1 vs 17.5). M = 129-256: above 4M weights,
// ahead of int8 cuBLAS (run 15: 2560x2560 22.5 vs 23.9, 4096x4096 28.9 vs 35.5; 640x2560 20.0 vs
// 16.5 lost). It lost at M = 32 on every shape (run 15, the v5 GEMVs: 2560x2560 7.1 vs 16.2,
// 28672x8192 46.5 vs 52.0). Its floor on small layers is ~15-17 us (ncu, run 15: one CTA per SM,
// ~1450 cycles per k-block, latency-bound). TRIT_A8_GEMM=1 forces it for 16 < M <= 256, =0 turns
// it off. On compute capability 9.0 (sm_90a build) the kernel's main loop is wgmma, chosen per shape
// (csrc/a8_route.h, H200 runs 19 / 20c), and its 128-row loop also takes every M > 256 it fills the
// GPU at.
bool a8_gemm_on(int64_t M, int64_t N, int64_t K) {
  const char* e = getenv("TRIT_A8_GEMM");
  const bool forced = e != nullptr && strcmp(e, "1") == 0;
  if (M <= 16 || (e != nullptr && strcmp(e, "0") == 0)) return false;
  // above M = 256 only the 128-row wgmma loop, where a8_route.h picks it (compute capability 9.0,
  // >= 48 CTAs; H200 run 19) or TRIT_A8_GEMM_WG=2 forces it; else int8 cuBLAS (a8_dense)
  if (M > 256) return trit_mm_a8_gemm_wg((int)M, (int)N, (int)K) == 2;
  if (forced) return true;
  const int64_t nk = N * K;
  if (M <= 32) return false;
  // 33-64: where the MT = 8 GEMV does not run: above 64 Mi weights since H200 run 49 (its interleaved xq), see
  // ternary_gemm.cu a8_mt8_maxw; TRIT_A8_MT8_MAXW moves the limit
  if (M <= 64) return trit_a8_v5_on((int)M, (int)N, (int)K) == 0;
  // 65-128: the MT = 8 GEMV over two row tiles where ternary_gemm.cu a8_v5 takes it (<= 16 Mi weights by default,
  // TRIT_A8_MT8_ROWS2=1 up to TRIT_A8_MT8_MAXW, =0 never)
  if (M <= 128 && trit_a8_v5_on((int)M, (int)N, (int)K) != 0) return false;
  if (M <= 128) return nk >= (int64_t(1) << 24);
  return nk > (int64_t(1) << 22);
}

at::Tensor a8_dense(const MmArgs& a, const at::Tensor& packed, const at::Tensor& scale, int64_t N, int64_t K,
                    const char* op) {
  const int64_t Kp = (K + 127) / 128 * 128;
  void* st = current_stream(a.x);
  at::Tensor xq = at::empty({a.M, Kp}, a.x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({a.M}, a.x.options().dtype(at::kFloat));
  at::Tensor rowsum = at::empty({a.M}, a.x.options().dtype(at::kInt));
  check_launch(trit_a8_quant(a.dtype, a.x.data_ptr(), xq.data_ptr<int8_t>(), xs.data_ptr<float>(),
                             rowsum.data_ptr<int32_t>(), a.M, (int)K, st),
               op);
  // [N, Kp]: the padding columns of the packed layout decode to 0, matching xq's zero padding
  at::Tensor w = at::empty({N, Kp}, a.x.options().dtype(at::kChar));
  check_launch(trit_decode(TRIT_I8, packed.data_ptr<int32_t>(), nullptr, w.data_ptr(), (int)N, (int)Kp, st), op);
  const void* bias = a.bias.defined() ? a.bias.data_ptr() : nullptr;
  at::Tensor acc = at::_int_mm(xq, w.t());  // [M, N] int32, exact
  check_launch(trit_a8_epilogue(a.dtype, acc.data_ptr<int32_t>(), xs.data_ptr<float>(), scale.data_ptr<float>(),
                                bias, a.y.data_ptr(), a.M, (int)N, st),
               op);
  return a.y;
}

// The a8 kernels' workspace in one tensor: xq int8 [Mp, Kp] | xs f32 [M] | rowsum i32 [M] (Kp % 128 == 0 keeps
// the alignment)
struct A8Workspace {
  at::Tensor ws;
  int8_t* xq;
  float* xs;
  int32_t* rowsum;
};
A8Workspace a8_workspace(const at::Tensor& x, int64_t M, int64_t Mp, int64_t Kp) {
  A8Workspace w;
  w.ws = at::empty({Mp * Kp + 8 * M}, x.options().dtype(at::kChar));
  w.xq = w.ws.data_ptr<int8_t>();
  w.xs = reinterpret_cast<float*>(w.xq + Mp * Kp);
  w.rowsum = reinterpret_cast<int32_t*>(w.xs + M);
  return w;
}

at::Tensor ternary_mm_a8_cuda(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale, int64_t N,
                              int64_t K, const std::optional<at::Tensor>& bias) {
  const char* op = "trit::ternary_mm_a8";
  c10::DeviceGuard guard(x.device());
  MmArgs a = prepare(x, packed, scale, N, K, bias, op);
  if (a.M == 0) return a.y;
  const bool gemm = a8_gemm_on(a.M, N, K);
  // torch._int_mm needs M > 16 and N % 8 == 0 (K is padded to 128 here)
  if (!gemm && a.M >= a8_dense_min_m() && a.M > 16 && N % 8 == 0) return a8_dense(a, packed, scale, N, K, op);
  const int64_t Kp = (K + 127) / 128 * 128;
  // Mp = M rounded up to 64, at least 64: the k-block-major xq of the M <= 64 kernels has zero rows
  // up to 8 * MT, that of the a8 GEMM kernel (M <= 256, a8_gemm_on) up to its CTA's rows (64, or
  // 128 with TRIT_A8_GEMM_WG=2: trit_mm_a8_gemm_xq_rows)
  const int64_t Mp = std::max<int64_t>(std::max<int64_t>((a.M + 63) / 64 * 64, 64),
                                       gemm ? trit_mm_a8_gemm_xq_rows((int)a.M, (int)N, (int)K) : 0);
  const A8Workspace w = a8_workspace(x, a.M, Mp, Kp);
  int8_t* xq = w.xq;
  float* xs = w.xs;
  int32_t* rowsum = w.rowsum;
  const void* bias_p = a.bias.defined() ? a.bias.data_ptr() : nullptr;
  if (gemm) {
    // split-K workspace: tile counters + per-split slices, nothing to zero here (the quantizer
    // zeroes the counters: no memset node in a graph); none without split-K
    const int64_t n_ws = trit_mm_a8_gemm_ws_ints((int)a.M, (int)N, (int)K);
    at::Tensor gws = n_ws > 0 ? at::empty({n_ws}, x.options().dtype(at::kInt)) : at::Tensor();
    check_launch(trit_mm_a8_gemm(a.dtype, a.x.data_ptr(), packed.data_ptr<int32_t>(), scale.data_ptr<float>(), bias_p,
                                 a.y.data_ptr(), a.M, (int)N, (int)K, xq, xs, rowsum,
                                 n_ws > 0 ? gws.data_ptr<int32_t>() : nullptr, current_stream(x)),
                 op);
    return a.y;
  }
  check_launch(trit_mm_a8(a.dtype, a.x.data_ptr(), packed.data_ptr<int32_t>(), scale.data_ptr<float>(), bias_p,
                          a.y.data_ptr(), a.M, (int)N, (int)K, xq, xs, rowsum, current_stream(x)),
               op);
  return a.y;
}

// trit::ternary_mm_a8_bp: ternary_mm_a8 on the bitplane layout (trit.ops.repack_bitplane; csrc/ternary.h), the
// same route and results where the M <= 32 GEMV runs; an error elsewhere (larger M, TRIT_KERNEL=v4)
at::Tensor ternary_mm_a8_bp_cuda(const at::Tensor& x, const at::Tensor& packed_bp, const at::Tensor& scale, int64_t N,
                                 int64_t K, const std::optional<at::Tensor>& bias) {
  const char* op = "trit::ternary_mm_a8_bp";
  c10::DeviceGuard guard(x.device());
  MmArgs a = prepare(x, packed_bp, scale, N, K, bias, op);
  if (a.M == 0) return a.y;
  TRIT_CHECK(trit_mm_a8_bp_ok((int)a.M, (int)N, (int)K), op, ": the bitplane layout runs only where the W1.58A8 GEMV "
              "of M <= 32 does (M = ", a.M, ", N = ", N, ", K = ", K, "; TRIT_KERNEL=v4 has no bitplane kernel); use "
              "ternary_mm_a8 on the 2-bit code layout (trit.ops.bitplane_to_packed) there");
  // the workspace of ternary_mm_a8's M <= 32 route: Mp = 64 covers the k-block-major xq of up to 4 row tiles
  const A8Workspace w = a8_workspace(x, a.M, 64, (K + 127) / 128 * 128);
  check_launch(trit_mm_a8_bp(a.dtype, a.x.data_ptr(), packed_bp.data_ptr<int32_t>(), scale.data_ptr<float>(),
                             a.bias.defined() ? a.bias.data_ptr() : nullptr, a.y.data_ptr(), a.M, (int)N, (int)K, w.xq,
                             w.xs, w.rowsum, current_stream(x)),
               op);
  return a.y;
}

// ternary_mm_a8 with x's quantization given (trit.ops.a8_quantize(x) -> xq, xs, rowsum; under
// torch.compile the norm / activation kernel that produces x computes them too). Where the GEMV can read
// them (trit_mm_a8_pre_ok: M <= TRIT_A8_PRE_MAXM, default 32) it does and no quantizer runs; elsewhere (larger M, TRIT_KERNEL=v4,
// an xq not 16-byte aligned) x is quantized again by the kernels of ternary_mm_a8 - the same values
// where xq came from a8_quantize in eager mode.
// layout 1: xq in trit.ops.a8_tile's layout (rms_norm_a8q with layout 1), 32 * ceil(M / 32) rows.
at::Tensor ternary_mm_a8q_cuda(const at::Tensor& x, const at::Tensor& xq, const at::Tensor& xs,
                               const at::Tensor& rowsum, const at::Tensor& packed, const at::Tensor& scale, int64_t N,
                               int64_t K, const std::optional<at::Tensor>& bias, int64_t layout) {
  const char* op = "trit::ternary_mm_a8q";
  c10::DeviceGuard guard(x.device());
  TRIT_CHECK(x.dim() == 2, op, ": x must be 2-D [M, K], got ", x.sizes(),
              " (trit.ops.ternary_linear_a8_pre accepts any rank)");
  TRIT_CHECK(x.size(1) == K, op, ": x.size(1)=", x.size(1), " but K=", K);
  TRIT_CHECK(layout == 0 || layout == 1, op, ": layout=", layout, " not in (0, 1) (0 row-major, 1 tiled)");
  const int64_t M = x.size(0);
  const int64_t Kp = (K + 127) / 128 * 128;
  const int64_t rows = layout == 1 ? (M + 31) / 32 * 32 : M;
  TRIT_CHECK(xq.scalar_type() == at::kChar && xq.dim() == 2 && xq.size(0) == rows && xq.size(1) == Kp, op,
              ": xq must be int8 [", rows, ", ", Kp, "] (", layout == 1 ? "trit.ops.a8_tile" : "trit.ops.a8_quantize",
              " of x [", M, ", ", K, "], layout=", layout, "), got ", xq.scalar_type(), " ", xq.sizes());
  TRIT_CHECK(xs.scalar_type() == at::kFloat && xs.dim() == 1 && xs.size(0) == M, op, ": xs must be float32 [M]=[",
              M, "], got ", xs.scalar_type(), " ", xs.sizes());
  TRIT_CHECK(rowsum.scalar_type() == at::kInt && rowsum.dim() == 1 && rowsum.size(0) == M, op,
              ": rowsum must be int32 [M]=[", M, "], got ", rowsum.scalar_type(), " ", rowsum.sizes());
  for (const at::Tensor* t : {&xq, &xs, &rowsum})
    TRIT_CHECK(t->device() == x.device(), op, ": xq / xs / rowsum must be on ", x.device(), ", got ", t->device());
  const bool direct = M >= 1 && trit_mm_a8_pre_ok((int)M, (int)N, (int)K, (int)layout) && xq.is_contiguous() &&
                      xs.is_contiguous() && rowsum.is_contiguous() &&
                      reinterpret_cast<uintptr_t>(xq.data_ptr()) % 16 == 0;
  if (!direct) return ternary_mm_a8_cuda(x, packed, scale, N, K, bias);
  MmArgs a = prepare(x, packed, scale, N, K, bias, op);
  check_launch(trit_mm_a8_pre(a.dtype, packed.data_ptr<int32_t>(), scale.data_ptr<float>(),
                              a.bias.defined() ? a.bias.data_ptr() : nullptr, a.y.data_ptr(), a.M, (int)N, (int)K,
                              xq.data_ptr<int8_t>(), xs.data_ptr<float>(), rowsum.data_ptr<int32_t>(),
                              (int)layout, current_stream(x)),
               op);
  return a.y;
}

at::Tensor ternary_decode_cuda(const at::Tensor& packed, const std::optional<at::Tensor>& scale, int64_t N,
                               int64_t K, at::ScalarType dtype) {
  const char* op = "trit::ternary_decode";
  c10::DeviceGuard guard(packed.device());
  check_packed(packed, N, K, op);
  const int code = dtype_code(dtype, op);
  if (scale.has_value()) {
    check_scale(*scale, N, packed, op);
    TRIT_CHECK(code != TRIT_I8, op, ": int8 output takes no scale");
  }
  at::Tensor out = at::empty({N, K}, packed.options().dtype(dtype));
  check_launch(trit_decode(code, packed.data_ptr<int32_t>(), scale.has_value() ? scale->data_ptr<float>() : nullptr,
                           out.data_ptr(), (int)N, (int)K, current_stream(packed)),
               op);
  return out;
}

// trit::rms_norm_a8q: RMSNorm (with the residual add when residual is given) and the a8 quantizer of its
// output in one kernel (ternary.h trit_rms_norm_a8q); the outputs feed trit::ternary_mm_a8q.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rms_norm_a8q_cuda(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight, double eps,
    int64_t layout) {
  const char* op = "trit::rms_norm_a8q";
  c10::DeviceGuard guard(x.device());
  TRIT_CHECK(layout == 0 || layout == 1, op, ": layout=", layout, " not in (0, 1) (0 row-major, 1 tiled)");
  TRIT_CHECK(x.dim() == 2 && x.is_contiguous(), op, ": x must be a contiguous 2-D [M, K] tensor, got ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1);
  const int code = dtype_code(x.scalar_type(), op);
  TRIT_CHECK(code != TRIT_I8, op, ": x must be float32, float16 or bfloat16, got ", x.scalar_type());
  TRIT_CHECK(K >= 1 && K <= trit_rms_norm_a8q_max_k(), op, ": K=", K, " outside 1..", trit_rms_norm_a8q_max_k(),
              " (the row is held in one CTA's registers)");
  TRIT_CHECK(weight.dim() == 1 && weight.size(0) == K && weight.scalar_type() == x.scalar_type() &&
                  weight.is_contiguous() && weight.device() == x.device(),
              op, ": weight must be a contiguous ", x.scalar_type(), " [", K, "] on ", x.device(), ", got ",
              weight.scalar_type(), " ", weight.sizes(), " on ", weight.device());
  if (residual.has_value())
    TRIT_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type() &&
                    residual->is_contiguous() && residual->device() == x.device(),
                op, ": residual must be a contiguous ", x.scalar_type(), " ", x.sizes(), " on ", x.device(),
                ", got ", residual->scalar_type(), " ", residual->sizes(), " on ", residual->device());
  const int64_t Kp = (K + 127) / 128 * 128;
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out = residual.has_value() ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor xq = at::empty({layout == 1 ? (M + 31) / 32 * 32 : M, Kp}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({M}, x.options().dtype(at::kFloat));
  at::Tensor rowsum = at::empty({M}, x.options().dtype(at::kInt));
  if (M > 0)
    check_launch(trit_rms_norm_a8q(code, x.data_ptr(), residual.has_value() ? residual->data_ptr() : nullptr,
                                   weight.data_ptr(), out.data_ptr(), residual.has_value() ? res_out.data_ptr() : nullptr,
                                   xq.data_ptr<int8_t>(), xs.data_ptr<float>(), rowsum.data_ptr<int32_t>(), (int)M,
                                   (int)K, (float)eps, (int)layout, current_stream(x)),
                 op);
  return {out, res_out, xq, xs, rowsum};
}

// trit::ternary_mm_a8_prologue: ternary_mm_a8 of the layer input that the model computes in front of the
// layer - act(gate) * up (act 1 relu^2, 2 silu; x = [M, 2K] = [gate | up]) or x (+ residual, the sum
// returned as the new residual stream), then RMSNorm with norm_weight when given (rms_norm_a8q's
// arithmetic) - so that at M = 1 (trit_mm_a8_prologue_ok) one kernel replaces the norm / activation
// kernel and the layer. Elsewhere the same values in several launches: the activation and the residual
// add as torch ops, the norm by the rms_norm_a8q kernel (its quantization feeds ternary_mm_a8q), or
// torch ops past its K limit.
std::tuple<at::Tensor, at::Tensor> ternary_mm_a8_prologue_cuda(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& norm_weight,
    double eps, int64_t act, const at::Tensor& packed, const at::Tensor& scale, int64_t N, int64_t K,
    const std::optional<at::Tensor>& bias) {
  const char* op = "trit::ternary_mm_a8_prologue";
  c10::DeviceGuard guard(x.device());
  TRIT_CHECK(act >= 0 && act <= 2, op, ": act must be 0 (none), 1 (relu^2 * up) or 2 (silu * up), got ", act);
  TRIT_CHECK(x.is_cuda() && x.dim() == 2, op, ": x must be a 2-D CUDA tensor, got ", x.sizes());
  const int64_t width = act != 0 ? 2 * K : K;
  TRIT_CHECK(x.size(1) == width, op, ": x.size(1)=", x.size(1), " but ", act != 0 ? "2K=" : "K=", width,
              act != 0 ? " ([gate | up])" : "");
  TRIT_CHECK(!(act != 0 && residual.has_value()), op, ": a residual goes with act=0 only");
  const int64_t M = x.size(0);
  if (residual.has_value())
    TRIT_CHECK(residual->dim() == 2 && residual->size(0) == M && residual->size(1) == K &&
                    residual->scalar_type() == x.scalar_type() && residual->device() == x.device(),
                op, ": residual must be ", x.scalar_type(), " [", M, ", ", K, "] on ", x.device(), ", got ",
                residual->scalar_type(), " ", residual->sizes(), " on ", residual->device());
  if (norm_weight.has_value())
    TRIT_CHECK(norm_weight->dim() == 1 && norm_weight->size(0) == K && norm_weight->scalar_type() == x.scalar_type() &&
                    norm_weight->device() == x.device(),
                op, ": norm_weight must be ", x.scalar_type(), " [", K, "] on ", x.device(), ", got ",
                norm_weight->scalar_type(), " ", norm_weight->sizes(), " on ", norm_weight->device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor rc = residual.has_value() ? residual->contiguous() : at::Tensor();
  const at::Tensor wc = norm_weight.has_value() ? norm_weight->contiguous() : at::Tensor();
  at::Tensor res_out = residual.has_value() ? at::empty({M, K}, x.options()) : at::empty({0}, x.options());
  auto al = [](const at::Tensor& t) { return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  // TRIT_ACT_QUANT=1 (read per call; the vLLM plugin reads it at load to route Llama's SiLU-mul -> down_proj here):
  // act(gate) * up without a norm computed by the layer's activation quantizer (trit_mm_a8_act) in front of the GEMV
  // the plain op runs at this M - one kernel where the model runs the act kernel and the quantizer; at every M where
  // it runs (trit_mm_a8_act_ok, not the GEMM / int8 cuBLAS routes), ahead of the M = 1 prologue kernel. Off until
  // measured on a GPU.
  if (act != 0 && !residual.has_value() && !norm_weight.has_value() && M >= 1 && env_flag("TRIT_ACT_QUANT", false) &&
      !a8_gemm_on(M, N, K) && !(M >= a8_dense_min_m() && M > 16 && N % 8 == 0) &&
      trit_mm_a8_act_ok((int)M, (int)N, (int)K)) {
    MmArgs a = prepare(xc.narrow(1, 0, K), packed, scale, N, K, bias, op, false);  // checks, y and bias
    const int64_t Kp = (K + 127) / 128 * 128;
    const A8Workspace w = a8_workspace(x, M, std::max<int64_t>((M + 63) / 64 * 64, 64), Kp);
    check_launch(trit_mm_a8_act(a.dtype, xc.data_ptr(), (int)act, packed.data_ptr<int32_t>(), scale.data_ptr<float>(),
                                a.bias.defined() ? a.bias.data_ptr() : nullptr, a.y.data_ptr(), a.M, (int)N, (int)K,
                                w.xq, w.xs, w.rowsum, current_stream(x)),
                 op);
    return {a.y, res_out};
  }
  if (M >= 1 && trit_mm_a8_prologue_ok((int)M, (int)N, (int)K) && al(xc) && al(rc) && al(wc) && al(res_out)) {
    // prepare() checks packed / scale / bias against N and K on an x-shaped view
    MmArgs a = prepare(act != 0 ? xc.narrow(1, 0, K) : xc, packed, scale, N, K, bias, op, false);
    check_launch(trit_mm_a8_prologue(a.dtype, xc.data_ptr(), rc.defined() ? rc.data_ptr() : nullptr,
                                     wc.defined() ? wc.data_ptr() : nullptr, (float)eps, (int)act,
                                     residual.has_value() ? res_out.data_ptr() : nullptr, packed.data_ptr<int32_t>(),
                                     scale.data_ptr<float>(), a.bias.defined() ? a.bias.data_ptr() : nullptr,
                                     a.y.data_ptr(), a.M, (int)N, (int)K, current_stream(x)),
                 op);
    return {a.y, res_out};
  }
  // several launches: the activation as torch ops, then the norm (with the residual add) by the
  // rms_norm_a8q kernel, whose quantization ternary_mm_a8q reads at M <= 8
  at::Tensor h = act != 0 && M == 0 ? xc.narrow(1, 0, K) : xc;  // M = 0: no rows to activate, [0, K] for the GEMV
  if (act != 0 && M > 0) {
    // TRIT_ACT_MUL=1: one kernel with torch's roundings (csrc act_mul_kernel; H200 run 27: bit for bit torch's
    // three ops; off until measured end to end). TRIT_ACT_QUANT=1 takes it too where its own route does not run
    // (past M = 64, the GEMM routes): one kernel, as Inductor's SiLU-mul was, instead of two torch ops
    if (env_flag("TRIT_ACT_MUL", false) || env_flag("TRIT_ACT_QUANT", false)) {
      h = at::empty({M, K}, x.options());
      check_launch(trit_act_mul(dtype_code(x.scalar_type(), op), xc.data_ptr(), h.data_ptr(), (int)M, (int)K,
                                (int)act, current_stream(x)),
                   op);
    } else {
      const at::Tensor g = xc.narrow(1, 0, K), u = xc.narrow(1, K, K);
      h = (act == 1 ? at::relu(g).square() : at::silu(g)) * u;  // each op rounds to x's dtype, as torch
    }
  }
  if (norm_weight.has_value() && K <= trit_rms_norm_a8q_max_k() && M > 0) {
    auto [out, res, xq, xs, rowsum] =
        rms_norm_a8q_cuda(h.contiguous(), rc.defined() ? std::optional<at::Tensor>(rc) : std::nullopt, wc, eps, 0);
    return {ternary_mm_a8q_cuda(out, xq, xs, rowsum, packed, scale, N, K, bias, 0), rc.defined() ? res : res_out};
  }
  if (rc.defined()) {
    res_out.copy_(at::add(h, rc));  // one rounding to x's dtype
    h = res_out;
  }
  if (!norm_weight.has_value() || M == 0) return {ternary_mm_a8_cuda(h, packed, scale, N, K, bias), res_out};
  // past rms_norm_a8q's K: torch ops
  const at::Tensor hf = h.to(at::kFloat);
  const at::Tensor out = (hf * at::rsqrt(hf.square().mean(-1, true) + eps) * wc.to(at::kFloat)).to(x.scalar_type());
  return {ternary_mm_a8_cuda(out, packed, scale, N, K, bias), res_out};
}

// trit::ternary_chain: S ternary_mm_a8_prologue layers in a row (trit.ops.ternary_chain_ref). At M = 1 where
// trit_chain_ok, one persistent kernel runs them all; elsewhere the per-stage op (its own M = 1 kernel or
// composed launches).
std::tuple<at::Tensor, at::Tensor> ternary_chain_cuda(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                                                      int64_t residual_stage,
                                                      const c10::List<std::optional<at::Tensor>>& norm_weights,
                                                      at::IntArrayRef acts, at::TensorList packed,
                                                      at::TensorList scales, at::IntArrayRef Ns, at::IntArrayRef Ks,
                                                      double eps) {
  const char* op = "trit::ternary_chain";
  c10::DeviceGuard guard(x.device());
  const int64_t S = (int64_t)packed.size();
  TRIT_CHECK(S >= 1 && S <= TRIT_CHAIN_MAX_STAGES, op, ": 1 to ", TRIT_CHAIN_MAX_STAGES, " stages, got ", S);
  TRIT_CHECK((int64_t)norm_weights.size() == S && (int64_t)acts.size() == S && (int64_t)scales.size() == S &&
                  (int64_t)Ns.size() == S && (int64_t)Ks.size() == S,
              op, ": every per-stage list must have ", S, " entries (len(packed)), got norm_weights ",
              norm_weights.size(), ", acts ", acts.size(), ", scales ", scales.size(), ", Ns ", Ns.size(), ", Ks ",
              Ks.size());
  for (int64_t s = 1; s < S; ++s)
    TRIT_CHECK(Ns[s - 1] == (acts[s] != 0 ? 2 : 1) * Ks[s], op, ": stage ", s, " reads stage ", s - 1,
                "'s output of ", Ns[s - 1], " features, but its K=", Ks[s], " with act=", acts[s], " needs ",
                (acts[s] != 0 ? 2 : 1) * Ks[s]);
  TRIT_CHECK(residual.has_value() == (residual_stage >= 0), op, ": residual and residual_stage go together (",
              "residual_stage=", residual_stage, ")");
  TRIT_CHECK(!residual.has_value() || (residual_stage < S && acts[residual_stage] == 0), op, ": residual_stage=",
              residual_stage, " must name a stage without act (0..", S - 1, ")");
  TRIT_CHECK(x.is_cuda() && x.dim() == 2, op, ": x must be a 2-D CUDA tensor, got ", x.sizes());
  const int64_t M = x.size(0);
  auto stage_op = [&](const at::Tensor& h, int64_t s) {
    const auto nw = norm_weights.get(s);
    return ternary_mm_a8_prologue_cuda(h, s == residual_stage ? residual : std::nullopt, nw, eps, acts[s], packed[s],
                                       scales[s], Ns[s], Ks[s], std::nullopt);
  };
  int ns[TRIT_CHAIN_MAX_STAGES], ks[TRIT_CHAIN_MAX_STAGES], as[TRIT_CHAIN_MAX_STAGES];
  for (int64_t s = 0; s < S; ++s) {
    TRIT_CHECK(Ns[s] >= 1 && Ks[s] >= 1 && Ns[s] < (1LL << 31) && Ks[s] < (1LL << 31), op, ": stage ", s,
                " N and K must be in [1, 2^31), got N=", Ns[s], " K=", Ks[s]);
    ns[s] = (int)Ns[s];
    ks[s] = (int)Ks[s];
    as[s] = (int)acts[s];
  }
  const int code = dtype_code(x.scalar_type(), op);
  if (M == 1 && code != TRIT_I8 && trit_chain_ok(code, 1, (int)S, ns, ks, as)) {
    // the per-stage checks of the composed path, on this path too (shapes, dtypes, devices)
    const int64_t width0 = acts[0] != 0 ? 2 * Ks[0] : Ks[0];
    TRIT_CHECK(x.size(1) == width0, op, ": x.size(1)=", x.size(1), " but stage 0 needs ", width0);
    const at::Tensor xc = x.contiguous();
    at::Tensor rc, res_out = at::empty({0}, x.options());
    if (residual.has_value()) {
      const int64_t Kr = Ks[residual_stage];
      TRIT_CHECK(residual->dim() == 2 && residual->size(0) == M && residual->size(1) == Kr &&
                      residual->scalar_type() == x.scalar_type() && residual->device() == x.device(),
                  op, ": residual must be ", x.scalar_type(), " [", M, ", ", Kr, "] on ", x.device(), ", got ",
                  residual->scalar_type(), " ", residual->sizes(), " on ", residual->device());
      rc = residual->contiguous();
      res_out = at::empty({M, Kr}, x.options());
    }
    std::vector<at::Tensor> keep;  // contiguous norm weights and the outputs, alive until the launch
    TritChainStage st[TRIT_CHAIN_MAX_STAGES];
    at::Tensor y;
    for (int64_t s = 0; s < S; ++s) {
      TRIT_CHECK(packed[s].device() == x.device(), op, ": stage ", s, " packed is on ", packed[s].device(),
                  ", x on ", x.device());
      check_packed(packed[s], Ns[s], Ks[s], op);
      check_scale(scales[s], Ns[s], x, op);
      const auto nw = norm_weights.get(s);
      at::Tensor nwc;
      if (nw.has_value()) {
        TRIT_CHECK(nw->dim() == 1 && nw->size(0) == Ks[s] && nw->scalar_type() == x.scalar_type() &&
                        nw->device() == x.device(),
                    op, ": stage ", s, " norm weight must be ", x.scalar_type(), " [", Ks[s], "] on ", x.device(),
                    ", got ", nw->scalar_type(), " ", nw->sizes(), " on ", nw->device());
        nwc = nw->contiguous();
        keep.push_back(nwc);
      }
      y = at::empty({M, Ns[s]}, x.options());
      keep.push_back(y);
      st[s] = TritChainStage{packed[s].data_ptr<int32_t>(), scales[s].data_ptr<float>(),
                             nwc.defined() ? nwc.data_ptr() : nullptr, y.data_ptr(), ns[s], ks[s], as[s]};
    }
    auto al = [](const at::Tensor& t) { return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
    bool aligned = al(xc) && al(rc) && al(res_out);
    for (const auto& t : keep) aligned = aligned && al(t);
    if (aligned) {
      check_launch(trit_chain(code, xc.data_ptr(), rc.defined() ? rc.data_ptr() : nullptr,
                              residual.has_value() ? res_out.data_ptr() : nullptr, (int)residual_stage, (float)eps,
                              (int)S, st, current_stream(x)),
                   op);
      return {y, res_out};
    }
  }
  at::Tensor h = x, res_out = at::empty({0}, x.options());
  for (int64_t s = 0; s < S; ++s) {
    auto [y, r] = stage_op(h, s);
    if (s == residual_stage) res_out = r;
    h = y;
  }
  return {h, res_out};
}

}  // namespace

TORCH_LIBRARY_IMPL(trit, CUDA, m) {
  m.impl("ternary_mm", &ternary_mm_cuda);
  m.impl("ternary_mm_naive", &ternary_mm_naive_cuda);
  m.impl("ternary_mm_a8", &ternary_mm_a8_cuda);
  m.impl("ternary_mm_a8_bp", &ternary_mm_a8_bp_cuda);
  m.impl("ternary_mm_a8q", &ternary_mm_a8q_cuda);
  m.impl("ternary_decode", &ternary_decode_cuda);
  m.impl("rms_norm_a8q", &rms_norm_a8q_cuda);
  m.impl("ternary_mm_a8_prologue", &ternary_mm_a8_prologue_cuda);
  m.impl("ternary_chain", &ternary_chain_cuda);
}
