// What every kernel file includes: the CUDA runtime under nvcc, or the CPU emulation
// (runtime/emu) under the host compiler, plus the launch helper and small block-level helpers
// that work the same in both builds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/tensor.h"
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

// bar.sync id, count: `count` threads of the block (whole warps) meet at barrier `id` (1..15; 0
// is __syncthreads's), a group of warps synchronising apart from the rest of the block (the wgmma
// kernels' math warpgroups while their producer runs ahead). Their writes before it are visible
// to the others after it, as with __syncthreads.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned count) {
#if defined(__CUDACC__)
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
#else
  ::yolo::emu::named_barrier(id, count);
#endif
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

// ---- V consecutive floats per access: V = 1, or 4 as one 16-byte float4 access --------------
// The address must be 16-byte aligned for V = 4 (quad_view says when a whole view is). Two
// forms: a pack (one float or float4 value) for kernels that only move or add whole packs (nvcc
// unrolls their grid-stride loops further than with arrays), and an array float[V] for
// per-element math.
template <int V>
using FloatPack = std::conditional_t<V == 4, float4, float>;
template <int V>
__device__ __forceinline__ FloatPack<V> load_pack(const float* p) {
  static_assert(V == 1 || V == 4, "1 or 4 floats per access");
  return *reinterpret_cast<const FloatPack<V>*>(p);
}
template <int V>
__device__ __forceinline__ void store_pack(float* p, FloatPack<V> v) {
  static_assert(V == 1 || V == 4, "1 or 4 floats per access");
  *reinterpret_cast<FloatPack<V>*>(p) = v;
}
__device__ __forceinline__ float add_packs(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add_packs(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

template <int V>
__device__ __forceinline__ void load_floats(const float* p, float (&v)[V]) {
  static_assert(V == 1 || V == 4, "1 or 4 floats per access");
  if constexpr (V == 4) {
    float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    v[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[V]) {
  static_assert(V == 1 || V == 4, "1 or 4 floats per access");
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *p = v[0];
  }
}

// Whether every 4 channels of the view, from channel 0, can be one access of 4 elements: c and
// stride multiples of 4 and data aligned to 4 elements (16 bytes of float, 8 of a 16-bit storage
// type). Host side, for launchers choosing V.
template <typename T>
bool quad_view(const NhwcView<T>& v) {
  using E = std::remove_const_t<T>;
  return v.c % 4 == 0 && v.stride % 4 == 0 && reinterpret_cast<uintptr_t>(v.data) % (4 * sizeof(E)) == 0;
}

// ---- the row grid: elementwise kernels over NHWC rows -------------------------------------
// Grid y strides over the rows (n*h of a view), grid x over a row's items (w*c, or w*c/4 with
// float4 packs), grid z (optional) picks one of several layers, e.g. (source, destination)
// pairs. A thread's index arithmetic is then one 32-bit division per item (64-bit division is
// slow). Views on the row grid must pass check_row_view_arg (tensor.h): rows and items fit int;
// rows and per_row must be positive (launchers return early on empty views).
struct RowLaunch {
  dim3 grid, block;
};
inline RowLaunch row_launch(size_t rows, size_t per_row, unsigned layers = 1) {
  unsigned threads = per_row >= 256 ? 256u : unsigned((per_row + 31) / 32 * 32);
  size_t blocks = (per_row + threads - 1) / threads;
  return {dim3(unsigned(blocks < 1024 ? blocks : 1024), unsigned(rows < 65535 ? rows : 65535), layers),
          dim3(threads)};
}

// In a kernel launched with row_launch(rows, w * (c / V)): f(row, x, ch) for every row in
// [0, rows), pixel x in [0, w) and pack of V channels [ch, ch + V) of c (a multiple of V) that
// this thread owns.
template <int V, typename F>
__device__ __forceinline__ void for_each_row_pack(int rows, int w, int c, F&& f) {
  const int packs = c / V, per_row = w * packs;
  for (int row = int(blockIdx.y); row < rows; row += int(gridDim.y))
    for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < per_row; i += int(gridDim.x * blockDim.x)) {
      int x = i / packs;
      f(row, x, (i - x * packs) * V);
    }
}

}  // namespace yolo
