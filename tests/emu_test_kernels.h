// Kernels that exercise the CUDA emulation (and, natively, the GPU): each launcher runs one
// kernel on device pointers and returns when it is queued on the default stream.
#pragma once
#include <cstdint>

namespace yolo::testing {

// out[c][r] = in[r][c] through a 32x33 shared-memory tile (blocks of 32x8 threads).
void launch_transpose_tiled(const float* in, float* out, int rows, int cols);
// partial[b] = sum of in[i] over block b's grid-stride share, via warp shuffles + block_sum.
void launch_block_sums(const float* in, int n, float* partial, int blocks, int threads);
// Threads >= active return at once; the rest rotate values through shared memory in three
// barrier-separated phases: out[t] = in[(t + 3) % active] * 2 + 1.
void launch_barrier_phases(const float* in, float* out, int threads, int active);
// Every element: histogram[in[i] % bins] += 1 (atomicAdd int), total += in[i] (float atomicAdd of
// small integers, exact), max/min (atomicMax/Min), and a CAS-built increment of *cas_count.
void launch_atomics(const int* in, int n, int* histogram, int bins, float* total, int* max_value,
                    int* min_value, int* cas_count, int blocks);
// Warp votes and shuffles within width-wide segments; see the kernel for the outputs.
void launch_warp_ops(const int* in, int* out, int threads);
// out[linear] = encoded (block, thread) coordinates, for a 3D grid of 3D blocks.
void launch_index_3d(int* out, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz);
// out[i] = in[n - 1 - i] within each block, through dynamic shared memory.
void launch_reverse_dynamic_shared(const float* in, float* out, int n, int threads);
// Launches with a block of `threads` threads (an invalid count must be reported).
void launch_with_block_size(float* out, int threads);
// Writes out[i] for i in [0, n + overrun): a deliberate out-of-bounds write when overrun > 0.
void launch_write_range(float* out, int n, int overrun);
// Half a warp at __syncthreads, the other half at __syncwarp: a hang the emulation must report.
void launch_divergent_barrier(float* out);

}  // namespace yolo::testing
