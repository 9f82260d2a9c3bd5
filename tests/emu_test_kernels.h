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

// Two groups of 64 threads, each with its own named barrier (bar.sync 1 and 2, 64 threads),
// rotate their values through shared memory: out[t] = in[base + (t - base + r) % 64] with base
// 0 and r = rounds for threads 0..63, base 64 and r = rounds + 1 for threads 64..127.
void launch_named_barrier_groups(const float* in, float* out, int rounds);

// Lanes 0-15 reduce with a half-warp mask, then the whole warp reduces with a full mask:
// out[lane] = 16 * sum(in[0..15]) + sum(in[16..31]) for all 32 lanes.
void launch_mixed_masks(const int* in, int* out);
// Lanes >= active return at once; the rest vote with a full mask (exited lanes drop out):
// out[t] = ballot of (in[t] odd) over the live lanes, then all(1), then a __syncwarp.
void launch_votes_after_exit(const int* in, int* out, int threads, int active);

// Emulation only (they throw yolo::Error in a CUDA build):
// out[i] = in[2i] / in[2i+1], computed in the launching thread's floating-point environment.
void launch_divide_pairs(const float* in, float* out, int n);
// A deadlocked block whose 32 threads each hold a local object; returns how many of those
// objects were destroyed (the emulation must unwind suspended threads after an error).
int launch_deadlock_counting_destructors();
// Thread 5 of a 32-thread block throws std::runtime_error("boom from thread 5").
void launch_throwing_kernel();
// A named barrier used wrongly (see the kernel; mode 0-3): the emulation must say so.
void launch_named_barrier_misuse(int mode);

}  // namespace yolo::testing
