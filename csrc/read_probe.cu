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

}  // namespace

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
