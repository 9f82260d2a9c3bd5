// Kernels that exercise the CUDA emulation and, in the native build, the GPU (see the header).
#include "tests/emu_test_kernels.h"

#include <stdexcept>

#include "kernels/common.cuh"

namespace yolo::testing {

namespace {

constexpr int kTile = 32;

__global__ void transpose_tiled(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the column read
  int x = blockIdx.x * kTile + threadIdx.x;
  int y0 = blockIdx.y * kTile;
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y)
    if (x < cols && y0 + dy < rows) tile[dy][threadIdx.x] = in[size_t(y0 + dy) * cols + x];
  __syncthreads();
  int ox = blockIdx.y * kTile + threadIdx.x;  // output column = input row
  int oy0 = blockIdx.x * kTile;
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y)
    if (ox < rows && oy0 + dy < cols) out[size_t(oy0 + dy) * rows + ox] = tile[threadIdx.x][dy];
}

__global__ void block_sums(const float* in, int n, float* partial) {
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += in[i];
  float total = block_sum(v);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void barrier_phases(const float* in, float* out, int active) {
  __shared__ float a[1024], b[1024];
  int t = threadIdx.x;
  if (t >= active) return;  // leaves every later barrier, as on the GPU
  a[t] = in[t];
  __syncthreads();
  b[t] = a[(t + 1) % active] * 2.0f;
  __syncthreads();
  a[t] = b[(t + 2) % active] + 1.0f;
  __syncthreads();
  out[t] = a[t];
}

__global__ void atomics(const int* in, int n, int* histogram, int bins, float* total, int* max_value,
                        int* min_value, int* cas_count) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int v = in[i];
    atomicAdd(&histogram[v % bins], 1);
    atomicAdd(total, float(v));
    atomicMax(max_value, v);
    atomicMin(min_value, v);
    int seen = *cas_count, before;
    do {  // increment through compare-and-swap, as a lock-free update is written
      before = seen;
      seen = atomicCAS(cas_count, before, before + 1);
    } while (seen != before);
  }
}

// Per thread t (lane l, segment of 8 lanes starting at s): out[6t + ...] =
//   0: ballot of (in[t] odd) over the warp        1: any(in[t] > 90)   2: all(in[t] >= 0)
//   3: in[s + (l + 3) % 8]  (shfl, width 8)       4: shfl_up by 2 (own value below s + 2)
//   5: shfl_down by 3 within 16-lane segments (own value past the segment), xor-8 added
__global__ void warp_ops(const int* in, int* out) {
  int t = threadIdx.x, lane = t % 32;
  int v = in[t];
  out[6 * t + 0] = int(__ballot_sync(0xffffffffu, v & 1));
  out[6 * t + 1] = __any_sync(0xffffffffu, v > 90);
  out[6 * t + 2] = __all_sync(0xffffffffu, v >= 0);
  out[6 * t + 3] = __shfl_sync(0xffffffffu, v, (lane % 8 + 3) % 8, 8);
  out[6 * t + 4] = __shfl_up_sync(0xffffffffu, v, 2, 8);
  out[6 * t + 5] = __shfl_down_sync(0xffffffffu, v, 3, 16) + __shfl_xor_sync(0xffffffffu, v, 8);
}

__global__ void index_3d(int* out) {
  unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = int(((blockIdx.z * 16 + blockIdx.y) * 16 + blockIdx.x) * 4096 +
                                        (threadIdx.z * 16 + threadIdx.y) * 16 + threadIdx.x);
}

__global__ void reverse_dynamic_shared(const float* in, float* out, int n) {
  DYNAMIC_SHARED(float, buffer);
  int base = blockIdx.x * blockDim.x, t = threadIdx.x;
  int count = min(int(blockDim.x), n - base);
  if (t < count) buffer[t] = in[base + t];
  __syncthreads();
  if (t < count) out[base + t] = buffer[count - 1 - t];
}

__global__ void write_index(float* out, int limit) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < limit) out[i] = float(i);
}

__global__ void divergent_barrier(float* out) {
  if (threadIdx.x < 16) __syncthreads();  // waits for lanes 16..31, which wait for it at a warp barrier
  else __syncwarp();
  out[threadIdx.x] = 1.0f;
}

// Two groups of 64 threads (warps 0-1 and 2-3), each rotating its values by one place a round
// through shared memory, meeting at its own named barrier (1, 2); group 2 takes one round more.
__global__ void named_barrier_groups(const float* in, float* out, int rounds) {
  __shared__ float buffer[128];
  const int t = int(threadIdx.x), group = t / 64, base = 64 * group;
  const unsigned id = 1 + unsigned(group);
  float v = in[t];
  for (int r = 0; r < rounds + group; ++r) {
    buffer[t] = v;
    named_barrier_sync(id, 64);
    v = buffer[base + (t - base + 1) % 64];
    named_barrier_sync(id, 64);  // every read done before the next round's writes
  }
  out[t] = v;
}

__global__ void mixed_masks(const int* in, int* out) {
  int lane = threadIdx.x, v = in[lane];
  if (lane < 16)
    for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(0x0000ffffu, v, offset);
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  out[lane] = v;
}

__global__ void votes_after_exit(const int* in, int* out, int active) {
  int t = threadIdx.x;
  if (t >= active) return;
  unsigned ballot = __ballot_sync(0xffffffffu, in[t] & 1);
  int all = __all_sync(0xffffffffu, 1);
  __syncwarp();
  out[2 * t] = int(ballot);
  out[2 * t + 1] = all;
}

#if !defined(__CUDACC__)
__global__ void divide_pairs(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[2 * i] / in[2 * i + 1];
}

int g_destroyed = 0;
struct CountsDestruction {
  ~CountsDestruction() { ++g_destroyed; }
};

__global__ void deadlock_with_locals(float* out) {
  CountsDestruction local;
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
  out[threadIdx.x] = 1.0f;
}

// Named barriers used wrongly (a block of 64 threads): 0: id 0; 1: a count of 48 (not whole warps);
// 2: warp 0 with a count of 32, warp 1 with 64 at the same id; 3: only warp 0 at a count of 64.
__global__ void named_barrier_misuse(int mode) {
  const bool warp0 = threadIdx.x < 32;
  if (mode == 0) named_barrier_sync(0, 32);
  if (mode == 1) named_barrier_sync(1, 48);
  if (mode == 2) named_barrier_sync(1, warp0 ? 32 : 64);
  if (mode == 3 && warp0) named_barrier_sync(1, 64);
}

__global__ void throwing_kernel() {
  if (threadIdx.x == 5) throw std::runtime_error("boom from thread 5");
  __syncthreads();
}
#endif

}  // namespace

void launch_mixed_masks(const int* in, int* out) { LAUNCH(mixed_masks, dim3(1), dim3(32), 0, 0, in, out); }

void launch_votes_after_exit(const int* in, int* out, int threads, int active) {
  LAUNCH(votes_after_exit, dim3(1), dim3(threads), 0, 0, in, out, active);
}

#if defined(__CUDACC__)
void launch_divide_pairs(const float*, float*, int) { throw Error("launch_divide_pairs: emulation only"); }
int launch_deadlock_counting_destructors() { throw Error("launch_deadlock_counting_destructors: emulation only"); }
void launch_throwing_kernel() { throw Error("launch_throwing_kernel: emulation only"); }
void launch_named_barrier_misuse(int) { throw Error("launch_named_barrier_misuse: emulation only"); }
#else
void launch_divide_pairs(const float* in, float* out, int n) {
  LAUNCH(divide_pairs, dim3(ceil_div(n, 64)), dim3(64), 0, 0, in, out, n);
}

int launch_deadlock_counting_destructors() {
  float out[32];
  g_destroyed = 0;
  try {
    LAUNCH(deadlock_with_locals, dim3(1), dim3(32), 0, 0, out);
  } catch (const Error&) {
    return g_destroyed;
  }
  return -1;  // no deadlock reported
}

void launch_throwing_kernel() { LAUNCH(throwing_kernel, dim3(1), dim3(32), 0, 0); }
void launch_named_barrier_misuse(int mode) { LAUNCH(named_barrier_misuse, dim3(1), dim3(64), 0, 0, mode); }
#endif

void launch_named_barrier_groups(const float* in, float* out, int rounds) {
  LAUNCH(named_barrier_groups, dim3(1), dim3(128), 0, 0, in, out, rounds);
}

void launch_transpose_tiled(const float* in, float* out, int rows, int cols) {
  LAUNCH(transpose_tiled, dim3(ceil_div(cols, kTile), ceil_div(rows, kTile)), dim3(kTile, 8), 0, 0, in, out, rows, cols);
}

void launch_block_sums(const float* in, int n, float* partial, int blocks, int threads) {
  LAUNCH(block_sums, dim3(blocks), dim3(threads), 0, 0, in, n, partial);
}

void launch_barrier_phases(const float* in, float* out, int threads, int active) {
  LAUNCH(barrier_phases, dim3(1), dim3(threads), 0, 0, in, out, active);
}

void launch_atomics(const int* in, int n, int* histogram, int bins, float* total, int* max_value,
                    int* min_value, int* cas_count, int blocks) {
  LAUNCH(atomics, dim3(blocks), dim3(96), 0, 0, in, n, histogram, bins, total, max_value, min_value, cas_count);
}

void launch_warp_ops(const int* in, int* out, int threads) {
  LAUNCH(warp_ops, dim3(1), dim3(threads), 0, 0, in, out);
}

void launch_index_3d(int* out, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz) {
  LAUNCH(index_3d, dim3(gx, gy, gz), dim3(bx, by, bz), 0, 0, out);
}

void launch_reverse_dynamic_shared(const float* in, float* out, int n, int threads) {
  LAUNCH(reverse_dynamic_shared, dim3(ceil_div(n, threads)), dim3(threads), threads * sizeof(float), 0, in, out, n);
}

void launch_with_block_size(float* out, int threads) {
  LAUNCH(write_index, dim3(1), dim3(threads), 0, 0, out, threads);
}

void launch_write_range(float* out, int n, int overrun) {
  LAUNCH(write_index, dim3(ceil_div(n + overrun, 64)), dim3(64), 0, 0, out, n + overrun);
}

void launch_divergent_barrier(float* out) {
  LAUNCH(divergent_barrier, dim3(1), dim3(32), 0, 0, out);
}

}  // namespace yolo::testing
