// What every kernel file includes: the CUDA runtime under nvcc, or the CPU emulation
// (runtime/emu) under the host compiler, plus the launch helper and small block-level helpers
// that work the same in both builds.
#pragma once
#include <cstddef>
#include <utility>

#include "runtime/check.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#else
#include "runtime/emu/emu.h"
#endif

namespace yolo {

#if defined(__CUDACC__)
// Launches and checks the launch (configuration and launch errors, with file and line). Model
// code never writes <<<...>>>: it calls an op's launcher, which uses LAUNCH.
template <typename... Params, typename... Args>
void launch_kernel(const char* what, const char* file, int line, void (*kernel)(Params...), dim3 grid,
                   dim3 block, size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  check_result(cudaGetLastError(), what, file, line);
}
#define LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                  \
  ::yolo::launch_kernel("launch of " #kernel, __FILE__, __LINE__, kernel, grid, block, shared_bytes, \
                        stream __VA_OPT__(, ) __VA_ARGS__)
// Dynamic shared memory as an array of T (one untyped extern array, so kernels that view it
// as different types do not clash).
#define DYNAMIC_SHARED(T, name)                                  \
  extern __shared__ __align__(16) unsigned char yolo_dynamic_shared_[]; \
  T* name = reinterpret_cast<T*>(yolo_dynamic_shared_)
#else
#define LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                        \
  ::yolo::emu::launch(::yolo::emu::LaunchSite{#kernel, __FILE__, __LINE__}, kernel, grid, block, \
                      shared_bytes, stream __VA_OPT__(, ) __VA_ARGS__)
#define DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::yolo::emu::dynamic_shared_memory())
#endif

__host__ __device__ inline unsigned ceil_div(size_t a, size_t b) { return unsigned((a + b - 1) / b); }

// Linear index of the calling thread in its block.
__device__ __forceinline__ unsigned block_thread_index() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Sum over a full warp by butterfly exchange: every lane ends with the same bits (each step
// adds the same two values, in either order).
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread. The block's thread count must be a multiple of
// 32 (no partial warp). The warps' partial sums are added in a fixed order: deterministic.
__device__ inline float block_sum(float v) {
  __shared__ float partial[32];
  unsigned tid = block_thread_index();
  unsigned warps = blockDim.x * blockDim.y * blockDim.z / 32;
  v = warp_sum(v);
  if (tid % 32 == 0) partial[tid / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (unsigned w = 0; w < warps; ++w) total += partial[w];
  __syncthreads();  // partial[] may be reused by the next call
  return total;
}

}  // namespace yolo
