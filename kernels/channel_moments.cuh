// BatchNorm's per-channel statistics computed where a convolution writes its output (issue 15):
// per block of output pixels, each channel's (mean, M2) in the layout batchnorm's finalize reads
// (partials[(block * c + ch) * 2 + {0, 1}], the block's pixel count at counts[block]), so that the
// training forward reads its input once instead of twice. Sums of squares would cancel badly when
// |mean| >> std; Welford within a thread and Chan's merge in a fixed tree are stable and
// deterministic (no atomics: the same inputs give the same bits).
#pragma once
#include "kernels/batchnorm_shared.h"
#include "kernels/common.cuh"
#include "kernels/storage.cuh"

namespace yolo::moments {

// A block of 256 threads: 32 channels (lanes) x 8 groups of rows.
constexpr int kLanes = 32, kGroups = 8, kBlockThreads = kLanes * kGroups;
constexpr int kScratchFloats = 2 * kGroups * kLanes + kGroups;  // means, M2s, counts
// Rows per block of the split-K reduction below (a moments block).
constexpr int kSplitRows = 64;

// The (mean, M2) of channels [col0, col0 + cols) over rows [row0, row0 + rows) of `out` (row
// pitch `pitch`), written as block `block` of a [blocks][c_total][2] partials array; counts[block]
// = rows (by the block holding channel 0). 256 threads call it, 0..255 by `thread` (threadIdx.x
// unless given), after the tile's values are written and visible to them (a barrier, or each
// thread reading what it wrote). scratch: kScratchFloats floats of shared memory. `sync` is the
// barrier between its steps: __syncthreads in a block of 256 threads, or a named barrier where
// 256 threads of a larger block do this alone (NamedSync: the wgmma forward's math warpgroups).
struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};
template <unsigned Id>
struct NamedSync {
  __device__ void operator()() const { named_barrier_sync(Id, kBlockThreads); }
};
template <typename T, class Sync = BlockSync>
__device__ void tile_moments(const T* out, int pitch, int row0, int rows, int col0, int cols, int c_total, int block,
                             float* scratch, float* partials, float* counts, int thread = int(threadIdx.x),
                             Sync sync = {}) {
  const int t = thread, lane = t % kLanes, group = t / kLanes;
  float* s_mean = scratch;
  float* s_m2 = scratch + kGroups * kLanes;
  float* s_n = scratch + 2 * kGroups * kLanes;
  for (int c0 = col0; c0 < col0 + cols; c0 += kLanes) {
    const int ch = c0 + lane;
    const bool active = ch < col0 + cols;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    if (active)
      for (int r = group; r < rows; r += kGroups) {  // Welford, rows in order
        const float v = to_float(out[size_t(row0 + r) * size_t(pitch) + ch]);
        n += 1.0f;
        const float d = v - mean;
        mean += d * (1.0f / n);
        m2 += d * (v - mean);
      }
    s_mean[group * kLanes + lane] = mean;
    s_m2[group * kLanes + lane] = m2;
    if (lane == 0) s_n[group] = group < rows ? float((rows - group + kGroups - 1) / kGroups) : 0.0f;
    sync();
    // Fixed tree over the groups: group g absorbs group g + s for s = 4, 2, 1.
    for (int s = kGroups / 2; s > 0; s /= 2) {
      if (group < s) {
        float merged = s_n[group];
        batchnorm_detail::chan_merge(merged, mean, m2, s_n[group + s], s_mean[(group + s) * kLanes + lane],
                                     s_m2[(group + s) * kLanes + lane]);
        s_mean[group * kLanes + lane] = mean;
        s_m2[group * kLanes + lane] = m2;
      }
      sync();
      if (group < s && lane == 0) s_n[group] += s_n[group + s];
      sync();
    }
    if (group == 0 && active) {
      float* dst = partials + (size_t(block) * size_t(c_total) + size_t(ch)) * 2;
      dst[0] = mean;
      dst[1] = m2;
    }
    if (t == 0 && c0 == 0) counts[block] = float(rows);
  }
}

// out[row][col] (pitch out_pitch) = sum over s < splits, in order, of parts[s][row][col], plus
// bias[col] when set, as Out: the split reduction's sum and rounding, element for element (the
// same bits as without the moments); then the moments of each block of kSplitRows rows.
// grid (ceil(rows / kSplitRows), ceil(cols / kLanes)), kBlockThreads threads.
template <typename Out>
__global__ void __launch_bounds__(kBlockThreads)
    sum_splits_moments_kernel(const float* parts, int splits, int rows, int cols, Out* out, int out_pitch,
                              const float* bias, float* partials, float* counts) {
  __shared__ float scratch[kScratchFloats];
  const int row0 = int(blockIdx.x) * kSplitRows, col0 = int(blockIdx.y) * kLanes;
  const int block_rows = min(kSplitRows, rows - row0), block_cols = min(kLanes, cols - col0);
  const int lane = int(threadIdx.x) % kLanes, group = int(threadIdx.x) / kLanes, col = col0 + lane;
  const size_t total = size_t(rows) * size_t(cols);
  if (lane < block_cols)
    for (int r = group; r < block_rows; r += kGroups) {
      const size_t i = size_t(row0 + r) * size_t(cols) + size_t(col);
      float sum = 0.0f;
      for (int s = 0; s < splits; ++s) sum += parts[size_t(s) * total + i];
      if (bias) sum += bias[col];
      out[size_t(row0 + r) * size_t(out_pitch) + col] = from_float<Out>(sum);
    }
  // Each thread reads back only what it wrote (the same rows and channel): no barrier needed.
  tile_moments<Out>(out, out_pitch, row0, block_rows, col0, block_cols, cols, int(blockIdx.x), scratch, partials,
                    counts);
}

inline int split_moment_blocks(long long rows) { return int((rows + kSplitRows - 1) / kSplitRows); }

template <typename Out>
void launch_sum_splits_moments(const float* parts, int splits, int rows, int cols, Out* out, int out_pitch,
                               const float* bias, float* partials, float* counts, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(unsigned(split_moment_blocks(rows)), unsigned((cols + kLanes - 1) / kLanes));
  LAUNCH(sum_splits_moments_kernel<Out>, grid, dim3(kBlockThreads), 0, stream, parts, splits, rows, cols, out,
         out_pitch, bias, partials, counts);
}

}  // namespace yolo::moments
