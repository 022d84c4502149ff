// Read-bandwidth probe: the fastest a kernel can stream B bytes from HBM on this GPU, launched and timed
// exactly like the ternary GEMVs (bench/read_floor.py: a CUDA graph over weight copies that L2 cannot hold).
//
// Why: the issue's floor for a layer is bytes / 4.18 TB/s (the H200's measured copy bandwidth, reached by
// copies of GBs). A GEMV that reads 58.7 MB once per call also pays a launch, the ramp until enough loads
// are in flight, and the tail of the last wave; this probe pays the same and does nothing else, so
// "GEMV time / probe time" is the share of what is reachable at that size, and "probe / (bytes / 4.18 TB/s)"
// the part of the gap that no kernel of this shape can close.
//
// The kernel: every thread XORs 16-byte words of a grid-stride loop, U loads in flight per thread before
// the first XOR (ld.global.nc.L1::no_allocate: read once, do not pollute L1), a warp XOR-reduce, one
// atomicXor per warp into *out. The XOR of every 32-bit word of the buffer is the result (checked against
// the host by bench/read_floor.py), so nothing can be elided. Plain CUDA, no torch headers: bench/read_floor.py
// builds it with nvcc into a shared library and calls trit_read_probe through ctypes on torch's stream.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int U>
__global__ void read_probe_kernel(const uint4* __restrict__ p, long long n16, unsigned* __restrict__ out) {
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_stream(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = ld_stream(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
}

// The same read through the Hopper bulk-copy engine (TMA, cp.async.bulk): one thread per CTA asks for whole
// chunks (chunk bytes each, a multiple of 16) into a ring of `stages` shared-memory buffers, each completing
// an mbarrier with its byte count; every thread XORs a chunk once it has landed, and the CTA's __syncthreads
// frees its buffer for the chunk `stages` later. The copy engine keeps stages x chunk bytes in flight per
// CTA without one register per 16 bytes, which is what the load loop above cannot: whether that moves the
// floor at 0.4-59 MB is what bench/read_floor.py measures. CTA c reads chunks c, c + grid, c + 2 grid, ...;
// the last chunk may be short (a multiple of 16 bytes).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

__device__ __forceinline__ void tma_chunk(uint32_t dst, const char* src, uint32_t bytes, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__global__ void read_probe_tma_kernel(const char* __restrict__ p, long long nbytes, int chunk, int stages,
                                      unsigned* __restrict__ out) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // cp.async.bulk and mbarrier tx counts: sm_90 and later
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bars[16];
  const long long nchunks = (nbytes + chunk - 1) / chunk;
  const long long mine = blockIdx.x < nchunks ? (nchunks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  auto bytes_of = [&](long long j) {  // local chunk j -> its byte count
    const long long off = (blockIdx.x + j * gridDim.x) * (long long)chunk;
    return static_cast<uint32_t>(nbytes - off < chunk ? nbytes - off : chunk);
  };
  auto issue = [&](long long j) {
    const int s = static_cast<int>(j % stages);
    tma_chunk(smem_u32(smem + (size_t)s * chunk), p + (blockIdx.x + j * gridDim.x) * (long long)chunk, bytes_of(j),
              smem_u32(&bars[s]));
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bars[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (long long j = 0; j < mine && j < stages; ++j) issue(j);
  unsigned acc = 0;
  for (long long j = 0; j < mine; ++j) {
    const int s = static_cast<int>(j % stages);
    const uint32_t parity = static_cast<uint32_t>((j / stages) & 1);
    while (!mbar_try_wait(smem_u32(&bars[s]), parity)) {
    }
    const uint4* q = reinterpret_cast<const uint4*>(smem + (size_t)s * chunk);
    const int n16 = static_cast<int>(bytes_of(j) / 16);
    for (int i = threadIdx.x; i < n16; i += blockDim.x) {
      const uint4 v = q[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();  // every thread is done with buffer s
    if (threadIdx.x == 0 && j + stages < mine) issue(j + stages);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
#else
  __trap();  // bench/read_floor.py launches it only on compute capability 9.0 and later
#endif
}

}  // namespace

// Launch one bulk-copy probe on `stream`. Returns 0, or a cudaError_t, or -1 for bad arguments: p and nbytes
// 16-byte multiples, blocks >= 1, threads a multiple of 32 in [32, 1024], chunk a multiple of 16 in
// [16, 65536], stages in [1, 16], stages x chunk <= 200 KiB of shared memory.
extern "C" int trit_read_probe_tma(const void* p, long long nbytes, unsigned* out, int blocks, int threads, int chunk,
                                   int stages, void* stream) {
  if (p == nullptr || out == nullptr || nbytes <= 0 || (nbytes & 15) != 0 || (reinterpret_cast<uintptr_t>(p) & 15) != 0 ||
      blocks < 1 || threads < 32 || threads > 1024 || (threads & 31) != 0 || chunk < 16 || chunk > 65536 ||
      (chunk & 15) != 0 || stages < 1 || stages > 16 || (long long)stages * chunk > 200 * 1024)
    return -1;
  const int smem = stages * chunk;
  static const cudaError_t attr =  // once, before any capture: the largest ring this entry point accepts
      cudaFuncSetAttribute(read_probe_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  if (attr != cudaSuccess) return static_cast<int>(attr);
  read_probe_tma_kernel<<<blocks, threads, smem, static_cast<cudaStream_t>(stream)>>>(static_cast<const char*>(p),
                                                                                     nbytes, chunk, stages, out);
  return static_cast<int>(cudaGetLastError());
}

// Launch one probe on `stream` (a cudaStream_t; 0 = legacy default). Returns 0, or a cudaError_t, or -1 for
// bad arguments: p and nbytes must be 16-byte multiples, blocks >= 1, threads a multiple of 32 in
// [32, 1024], unroll one of 1, 2, 4, 8.
extern "C" int trit_read_probe(const void* p, long long nbytes, unsigned* out, int blocks, int threads, int unroll,
                               void* stream) {
  if (p == nullptr || out == nullptr || nbytes <= 0 || (nbytes & 15) != 0 || (reinterpret_cast<uintptr_t>(p) & 15) != 0 ||
      blocks < 1 || threads < 32 || threads > 1024 || (threads & 31) != 0)
    return -1;
  const uint4* q = static_cast<const uint4*>(p);
  const long long n16 = nbytes / 16;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (unroll) {
    case 1: read_probe_kernel<1><<<blocks, threads, 0, s>>>(q, n16, out); break;
    case 2: read_probe_kernel<2><<<blocks, threads, 0, s>>>(q, n16, out); break;
    case 4: read_probe_kernel<4><<<blocks, threads, 0, s>>>(q, n16, out); break;
    case 8: read_probe_kernel<8><<<blocks, threads, 0, s>>>(q, n16, out); break;
    default: return -1;
  }
  return static_cast<int>(cudaGetLastError());
}
