// Batchnorm (+ activation), the CUDA kernels and their launchers (the references and the CPU
// version: batchnorm_cpu.cpp; the shared checks: batchnorm_shared.h).
//
// Training forward: (1) stats: each block owns a contiguous range of pixels and up to 32
// channel units (a unit = 4 channels as one float4 where c, stride and alignment allow, else 1
// channel); its threads run Welford over their pixels, Chan-merge within the block in a fixed
// tree and write (mean, M2) per channel to workspace. About one wave of blocks, each thread
// taking >= 24 pixels (measured on an H200: many small blocks cost up to 2x); (2) finalize:
// combines the blocks' partials per channel in a fixed order, writes the saved statistics and
// updates the running ones; (3) apply: elementwise, ~8 pixels per thread, each thread keeping
// its channels' scale and shift in registers. The backward has the same three steps with plain
// sums. The synchronized (--sync-bn) phases reuse these steps: plain per-channel sums (stats +
// a fixed-order sum of the blocks) for the forward's sums and centered squares, a per-channel
// finalize + apply from all-reduced sums, and the backward's steps split between the all-reduce.
// No atomics anywhere: same inputs, same bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/batchnorm.h"
#include "kernels/batchnorm_shared.h"
#include "kernels/common.cuh"
#include "kernels/exact_math.cuh"
#include "kernels/storage.cuh"

namespace yolo {

using namespace batchnorm_detail;

namespace {

constexpr int kThreads = 256;         // per stats/apply block: lanes (channels) x rows (pixels)
constexpr int kStatsBlocks = 640;     // stats blocks aimed at: about one wave on an H100/H200
constexpr int kStatsPixelsPerThread = 24;
constexpr int kApplyPixelsPerThread = 8;
// Finalize blocks: 8 channels x 128 rows, so even c = 32 spreads over 4 SMs with few partials per thread.
constexpr int kFinalizeChannels = 8, kFinalizeRows = 128;

// Block shape for stats/apply kernels: lanes (channel units, a power of two <= 32) x rows.
struct Tiling {
  int vec, units, lanes, rows, channel_blocks;
};
Tiling tiling_for(int c, bool vec4) {
  Tiling t;
  t.vec = vec4 ? 4 : 1;
  t.units = c / t.vec;
  t.lanes = 1;
  while (t.lanes < t.units && t.lanes < 32) t.lanes *= 2;
  t.rows = kThreads / t.lanes;
  t.channel_blocks = (t.units + t.lanes - 1) / t.lanes;
  return t;
}

// Pixel blocks of the stats passes (a function of the shape only: the workspace holds them, and
// the summation order, hence the bits, is the same on every device): about kStatsBlocks blocks
// in all, but each thread at least kStatsPixelsPerThread pixels.
int stats_pixel_blocks(size_t pixels, const Tiling& t) {
  size_t by_blocks = (size_t(kStatsBlocks) + size_t(t.channel_blocks) - 1) / size_t(t.channel_blocks);
  size_t per_block = size_t(t.rows) * kStatsPixelsPerThread, by_work = (pixels + per_block - 1) / per_block;
  size_t blocks = by_blocks < by_work ? by_blocks : by_work;
  return blocks < 1 ? 1 : int(blocks);
}

// The most stats pixel blocks any launch for this shape uses (float4 path or not).
int max_stats_pixel_blocks(size_t pixels, int c) {
  int blocks = stats_pixel_blocks(pixels, tiling_for(c, false));
  if (c % 4 == 0) {
    int vec = stats_pixel_blocks(pixels, tiling_for(c, true));
    blocks = vec > blocks ? vec : blocks;
  }
  return blocks;
}

// Apply passes: about kApplyPixelsPerThread pixels per thread.
int apply_pixel_blocks(size_t pixels, const Tiling& t) {
  size_t per_block = size_t(t.rows) * kApplyPixelsPerThread;
  return int((pixels + per_block - 1) / per_block);
}

// Block b of `blocks` covers pixels [pixels*b/blocks, pixels*(b+1)/blocks).
__host__ __device__ inline size_t range_begin(size_t pixels, int blocks, int b) {
  return pixels * size_t(b) / size_t(blocks);
}

// ---- CUDA -----------------------------------------------------------------------------------

constexpr int kUnroll = 4;  // loads in flight per thread

// This thread's pixels p of [begin, end) (begin + ty, then every rows-th; i counts them from 0):
// load(p, i, item), then use(p, item), with the loads of kUnroll pixels issued before their uses.
// Item: what load reads for one pixel (an array or a struct, kept in registers).
template <typename Item, typename Load, typename Use>
__device__ __forceinline__ void for_each_thread_pixel(size_t begin, size_t end, unsigned ty, unsigned rows,
                                                      Load&& load, Use&& use) {
  const size_t count = begin + ty < end ? (end - begin - ty - 1) / rows + 1 : 0, first = begin + ty;
  size_t i = 0;
  for (; i + kUnroll <= count; i += kUnroll) {
    Item items[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) load(first + (i + k) * rows, i + k, items[k]);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) use(first + (i + k) * rows, items[k]);
  }
  for (; i < count; ++i) {
    Item item;
    load(first + i * rows, i, item);
    use(first + i * rows, item);
  }
}

// Pass 1 of the training forward: per-block (mean, M2) of each channel -> partials[b][ch][2],
// and the block's pixel count -> counts[b].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_stats_kernel(NhwcView<const T> x, int pixel_blocks, float* partials, float* counts) {
  __shared__ float s_mean[kThreads * 4], s_m2[kThreads * 4], s_count[kThreads];
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  const bool active = unit * V < x.c;
  const size_t pixels = x.pixels(), begin = range_begin(pixels, pixel_blocks, int(blockIdx.x)),
               end = range_begin(pixels, pixel_blocks, int(blockIdx.x) + 1);
  float n = 0, mean[V], m2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) mean[j] = 0, m2[j] = 0;
  auto step = [&](const float (&v)[V]) {  // Welford, its roundings fixed (exact_math.cuh)
    n += 1.0f;
    float inv = 1.0f / n;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = __fsub_rn(v[j], mean[j]);
      mean[j] = __fmaf_rn(d, inv, mean[j]);
      m2[j] = __fmaf_rn(d, __fsub_rn(v[j], mean[j]), m2[j]);
    }
  };
  if (active) {
    const T* base = x.data + size_t(unit) * V + (begin + ty) * size_t(x.stride);
    const size_t step_elems = size_t(rows) * x.stride;
    auto load = [&](size_t, size_t i, float (&v)[V]) { load_values<T, V>(base + i * step_elems, v); };
    for_each_thread_pixel<float[V]>(begin, end, ty, rows, load, [&](size_t, const float (&v)[V]) { step(v); });
  }
  // Tree over rows, fixed pairing: row r absorbs row r + s for s = rows/2, rows/4, ..., 1.
  const unsigned cols = lanes * V;
#pragma unroll
  for (int j = 0; j < V; ++j) s_mean[ty * cols + tx * V + j] = mean[j], s_m2[ty * cols + tx * V + j] = m2[j];
  if (tx == 0) s_count[ty] = n;
  __syncthreads();
  for (unsigned s = rows / 2; s > 0; s /= 2) {
    if (ty < s) {
      float nb = s_count[ty + s], n_merged = 0;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        n_merged = n;
        chan_merge(n_merged, mean[j], m2[j], nb, s_mean[(ty + s) * cols + tx * V + j], s_m2[(ty + s) * cols + tx * V + j]);
        s_mean[ty * cols + tx * V + j] = mean[j], s_m2[ty * cols + tx * V + j] = m2[j];
      }
      n = n_merged;
      if (tx == 0) s_count[ty] = n;
    }
    __syncthreads();
  }
  if (ty == 0 && active) {
    float* out = partials + (size_t(blockIdx.x) * x.c + size_t(unit) * V) * 2;
#pragma unroll
    for (int j = 0; j < V; ++j) out[2 * j] = mean[j], out[2 * j + 1] = m2[j];
    if (blockIdx.y == 0 && tx == 0) counts[blockIdx.x] = float(end - begin);
  }
}

// Sum of v over the finalize block's rows in a fixed tree; the total ends in row 0.
__device__ inline float sum_over_rows(float v, float (&scratch)[kFinalizeRows][kFinalizeChannels]) {
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  scratch[ty][tx] = v;
  __syncthreads();
  for (unsigned s = kFinalizeRows / 2; s > 0; s /= 2) {
    if (ty < s) scratch[ty][tx] = v = v + scratch[ty + s][tx];
    __syncthreads();
  }
  return v;
}

// Pass 2 of the training forward: combines the blocks' (count, mean, M2) per channel, writes the
// saved statistics and updates the running ones. Each row of a finalize block takes every
// kFinalizeRows-th pixel block; rows are added in a fixed tree. Two passes over the (L2-resident)
// partials and no divisions: mean = sum n_b mean_b / m, then M2 = sum M2_b + n_b (mean_b - mean)^2.
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeRows)
    forward_finalize_kernel(int c, size_t pixels, int pixel_blocks, const float* partials, const float* counts,
                            float* saved_mean, float* saved_var, float* running_mean, float* running_var) {
  __shared__ float scratch[kFinalizeRows][kFinalizeChannels];
  __shared__ float s_mean[kFinalizeChannels];
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  const int ch = int(blockIdx.x * kFinalizeChannels + tx);
  const bool active = ch < c;
  const float m = float(pixels);
  float sum = 0;
  if (active) {
#pragma unroll 8
    for (int b = int(ty); b < pixel_blocks; b += kFinalizeRows) sum += counts[b] * partials[(size_t(b) * c + ch) * 2];
  }
  sum = sum_over_rows(sum, scratch);
  if (ty == 0) s_mean[tx] = sum / m;
  __syncthreads();
  const float mean = s_mean[tx];
  float m2 = 0;
  if (active) {
#pragma unroll 8
    for (int b = int(ty); b < pixel_blocks; b += kFinalizeRows) {
      const float* part = partials + (size_t(b) * c + ch) * 2;
      float d = part[0] - mean;
      m2 += part[1] + counts[b] * d * d;
    }
  }
  m2 = sum_over_rows(m2, scratch);
  if (ty == 0 && active) {
    float var = m2 / m;
    saved_mean[ch] = mean;
    saved_var[ch] = var;
    if (running_mean) {
      float unbiased = pixels > 1 ? var * (m / (m - 1.0f)) : var;
      running_mean[ch] = (1.0f - kBatchNormMomentum) * running_mean[ch] + kBatchNormMomentum * mean;
      running_var[ch] = (1.0f - kBatchNormMomentum) * running_var[ch] + kBatchNormMomentum * unbiased;
    }
  }
}

// Statistics from a convolution's epilogue (conv.h, ConvMoments): when there are more blocks than
// this, groups of consecutive blocks are Chan-merged first, so that the finalize (a few blocks of
// threads per 8 channels) reads at most this many per channel.
constexpr int kMaxFinalizeBlocks = 1024;

struct MomentGroups {
  int group = 1, out_blocks = 0;  // blocks per merged block, merged blocks (0: no merge)
};
MomentGroups moment_groups(int blocks) {
  MomentGroups m;
  if (blocks <= kMaxFinalizeBlocks) return m;
  m.group = (blocks + kMaxFinalizeBlocks - 1) / kMaxFinalizeBlocks;
  m.out_blocks = (blocks + m.group - 1) / m.group;
  return m;
}

// Merged block o = the Chan merge, in order, of blocks [o * group, (o + 1) * group) (fewer in the
// last): (mean, M2) per channel and the pixel count. A thread per (merged block, channel).
__global__ void merge_moments_kernel(int c, int blocks, int group, int out_blocks, const float* partials,
                                     const float* counts, float* out_partials, float* out_counts) {
  const size_t total = size_t(out_blocks) * size_t(c);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const int o = int(i / size_t(c)), ch = int(i % size_t(c));
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    const int end = min(blocks, (o + 1) * group);
    for (int b = o * group; b < end; ++b) {
      const float* part = partials + (size_t(b) * c + ch) * 2;
      chan_merge(n, mean, m2, counts[b], part[0], part[1]);
    }
    out_partials[i * 2] = mean;
    out_partials[i * 2 + 1] = m2;
    if (ch == 0) out_counts[o] = n;
  }
}

// --sync-bn from a conv's moments: this replica's per-channel sum, sum n_b mean_b, or (Centered) its
// squares about the global mean sums / total, sum M2_b + n_b (mean_b - mean)^2; fixed order, as
// the finalize: rows take every kFinalizeRows-th block, added in a fixed tree.
template <bool Centered>
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeRows)
    moments_sums_kernel(int c, int blocks, const float* partials, const float* counts, const float* sums,
                        double total_pixels, float* out) {
  __shared__ float scratch[kFinalizeRows][kFinalizeChannels];
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  const int ch = int(blockIdx.x * kFinalizeChannels + tx);
  const bool active = ch < c;
  const float mean = Centered && active ? float(double(sums[ch]) / total_pixels) : 0.0f;
  float v = 0.0f;
  if (active)
    for (int b = int(ty); b < blocks; b += kFinalizeRows) {
      const float* part = partials + (size_t(b) * c + ch) * 2;
      if (Centered) {
        const float d = part[0] - mean;
        v += part[1] + counts[b] * d * d;
      } else {
        v += counts[b] * part[0];
      }
    }
  v = sum_over_rows(v, scratch);
  if (ty == 0 && active) out[ch] = v;
}

// gamma / sqrt(var + eps): the apply's scale, one expression wherever the forward's y is computed
// (the backward recomputes it from x: the same bits).
__device__ __forceinline__ float normalize_scale(float gamma, float var) {
  return gamma / sqrtf(var + kBatchNormEpsilon);
}

// y = act((x - mean) * gamma / sqrt(var + eps) + beta) (+ residual, Res: a shortcut folded in, its
// FP32 sum rounded once to T), mean/var being the batch's (training)
// or the running ones (inference), as one FMA after the subtraction in every instantiation
// (exact_math.cuh). Block b covers pixel range b of apply_pixel_blocks.
template <Activation A, bool Res, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    apply_kernel(NhwcView<const T> x, NhwcView<T> y, NhwcView<const T> residual, int pixel_blocks, const float* mean,
                 const float* var, const float* gamma, const float* beta) {
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  if (unit * V >= x.c) return;
  const int ch0 = unit * V;
  float mu[V], scale[V], shift[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mu[j] = mean[ch0 + j];
    scale[j] = normalize_scale(gamma[ch0 + j], var[ch0 + j]);
    shift[j] = beta[ch0 + j];
  }
  const int block = int(blockIdx.x);
  const size_t pixels = x.pixels(), begin = range_begin(pixels, pixel_blocks, block),
               end = range_begin(pixels, pixel_blocks, block + 1);
  auto load = [&](size_t p, size_t, float (&v)[V]) { load_values<T, V>(x.data + p * x.stride + ch0, v); };
  auto transform_and_store = [&](size_t p, float (&v)[V]) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = normalized_output<A>(v[j], mu[j], scale[j], shift[j]);
    if constexpr (Res) {
      float r[V];
      load_values<T, V>(residual.data + p * residual.stride + ch0, r);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = __fadd_rn(v[j], r[j]);
    }
    store_values<T, V>(y.data + p * y.stride + ch0, v);
  };
  for_each_thread_pixel<float[V]>(begin, end, ty, rows, load, transform_and_store);
}

// What the backward reads for V channels of one pixel: g = grad_y * act'(y) (rounded on its own:
// exact_math.cuh), and x. y is the stored output, or (R, Recompute) the forward's y recomputed
// from x with the forward's own operations: in FP32 the stored y's bits, in 16-bit its value
// before the rounding. R is a template argument, not a runtime branch: a branch in the pixel loop
// let nvcc version the loop differently in the FP32 and 16-bit twins (tools/sass_twins_check.sh).
template <int V>
struct GradAndInput {
  float g[V], x[V];
};
template <int V>
struct Recompute {
  float mean[V], scale[V], shift[V];
};
// The per-channel constants of a recomputing backward for channels ch0..ch0+V-1 (none when !R).
template <bool R, int V>
__device__ __forceinline__ Recompute<V> recompute_constants(BatchNormAffine<float> affine, const float* saved_mean,
                                                           const float* saved_var, int ch0) {
  Recompute<V> r{};
  if constexpr (R) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      r.mean[j] = saved_mean[ch0 + j];
      r.scale[j] = normalize_scale(affine.gamma[ch0 + j], saved_var[ch0 + j]);
      r.shift[j] = affine.beta[ch0 + j];
    }
  }
  return r;
}
template <Activation A, bool R, typename T, int V>
__device__ __forceinline__ void load_grad_and_input(const NhwcView<const T>& y, const NhwcView<const T>& grad_y,
                                                    const NhwcView<const T>& x, const Recompute<V>& recompute,
                                                    int ch0, size_t p, GradAndInput<V>& item) {
  load_values<T, V>(grad_y.data + p * grad_y.stride + ch0, item.g);
  load_values<T, V>(x.data + p * x.stride + ch0, item.x);
  if constexpr (A != Activation::Linear) {
    float out[V];
    if constexpr (R) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        out[j] = normalized_output<A>(item.x[j], recompute.mean[j], recompute.scale[j], recompute.shift[j]);
    } else {
      load_values<T, V>(y.data + p * y.stride + ch0, out);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) item.g[j] = __fmul_rn(item.g[j], activation_gradient_rn<A>(out[j]));
  }
}

// Pass 1 of the backward: per-block sum g and sum g (x - mean) -> partials[b][ch][2].
template <Activation A, bool R, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    backward_stats_kernel(NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<const T> x, const float* saved_mean,
                          const float* saved_var, BatchNormAffine<float> affine, int pixel_blocks, float* partials) {
  __shared__ float s_g[kThreads * 4], s_gx[kThreads * 4];
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  const bool active = unit * V < x.c;
  const int ch0 = active ? unit * V : 0;
  const size_t pixels = x.pixels(), begin = range_begin(pixels, pixel_blocks, int(blockIdx.x)),
               end = range_begin(pixels, pixel_blocks, int(blockIdx.x) + 1);
  float sum_g[V], sum_gx[V], mu[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum_g[j] = 0, sum_gx[j] = 0, mu[j] = active ? saved_mean[ch0 + j] : 0.0f;
  if (active) {
    const Recompute<V> recompute = recompute_constants<R, V>(affine, saved_mean, saved_var, ch0);
    auto load = [&](size_t p, size_t, GradAndInput<V>& item) {
      load_grad_and_input<A, R, T, V>(y, grad_y, x, recompute, ch0, p, item);
    };
    auto accumulate = [&](size_t, const GradAndInput<V>& item) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum_g[j] = __fadd_rn(sum_g[j], item.g[j]);
        sum_gx[j] = __fmaf_rn(item.g[j], __fsub_rn(item.x[j], mu[j]), sum_gx[j]);
      }
    };
    for_each_thread_pixel<GradAndInput<V>>(begin, end, ty, rows, load, accumulate);
  }
  const unsigned cols = lanes * V;
#pragma unroll
  for (int j = 0; j < V; ++j) s_g[ty * cols + tx * V + j] = sum_g[j], s_gx[ty * cols + tx * V + j] = sum_gx[j];
  __syncthreads();
  for (unsigned s = rows / 2; s > 0; s /= 2) {
    if (ty < s) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum_g[j] += s_g[(ty + s) * cols + tx * V + j];
        sum_gx[j] += s_gx[(ty + s) * cols + tx * V + j];
        s_g[ty * cols + tx * V + j] = sum_g[j], s_gx[ty * cols + tx * V + j] = sum_gx[j];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && active) {
    float* out = partials + (size_t(blockIdx.x) * x.c + size_t(ch0)) * 2;
#pragma unroll
    for (int j = 0; j < V; ++j) out[2 * j] = sum_g[j], out[2 * j + 1] = sum_gx[j];
  }
}

// Pass 2 of the backward: sums the partials per channel in a fixed order -> grad_beta, grad_gamma,
// and (sync phase 4, when sums2 is set) the same values again into sums2 = [grad_beta | grad_gamma].
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeRows)
    backward_finalize_kernel(int c, int pixel_blocks, const float* partials, const float* saved_var,
                             float* grad_gamma, float* grad_beta, float* sums2) {
  __shared__ float scratch[kFinalizeRows][kFinalizeChannels];
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  const int ch = int(blockIdx.x * kFinalizeChannels + tx);
  float sum_g = 0, sum_gx = 0;
  if (ch < c) {
#pragma unroll 8
    for (int b = int(ty); b < pixel_blocks; b += kFinalizeRows) {
      const float* part = partials + (size_t(b) * c + ch) * 2;
      sum_g += part[0], sum_gx += part[1];
    }
  }
  sum_g = sum_over_rows(sum_g, scratch);  // ends with a barrier: scratch is free again
  sum_gx = sum_over_rows(sum_gx, scratch);
  if (ty == 0 && ch < c) {
    const float dgamma = sum_gx / sqrtf(saved_var[ch] + kBatchNormEpsilon);
    grad_beta[ch] = sum_g;
    grad_gamma[ch] = dgamma;
    if (sums2) sums2[ch] = sum_g, sums2[c + ch] = dgamma;
  }
}

// Pass 3 of the backward: grad_x = a (g - grad_beta/m - xhat grad_gamma/m), a = gamma/sqrt(var+eps)
// (a applied last, so g - grad_beta/m cancels exactly where it should, e.g. m = 1: g and
// grad_beta/m each rounded before the subtraction, then one FMA, in every instantiation). inv_m =
// 1/m: m is x's pixel count, or the total over the replicas (sync phase 5, with all-reduced sums).
template <Activation A, bool R, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    backward_apply_kernel(NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<const T> x, NhwcView<T> grad_x,
                          int pixel_blocks, float inv_m, const float* gamma, const float* saved_mean,
                          const float* saved_var, const float* grad_gamma, const float* grad_beta,
                          BatchNormAffine<float> affine) {
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  if (unit * V >= x.c) return;
  const int ch0 = unit * V;
  const size_t pixels = x.pixels();
  float mu[V], a[V], g_mean[V], k_x[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float inv_std = 1.0f / sqrtf(saved_var[ch0 + j] + kBatchNormEpsilon);
    mu[j] = saved_mean[ch0 + j];
    a[j] = gamma[ch0 + j] * inv_std;
    g_mean[j] = grad_beta[ch0 + j] * inv_m;
    k_x[j] = inv_std * grad_gamma[ch0 + j] * inv_m;
  }
  const int block = int(blockIdx.x);
  const size_t begin = range_begin(pixels, pixel_blocks, block), end = range_begin(pixels, pixel_blocks, block + 1);
  const Recompute<V> recompute = recompute_constants<R, V>(affine, saved_mean, saved_var, ch0);
  auto load = [&](size_t p, size_t, GradAndInput<V>& item) {
    load_grad_and_input<A, R, T, V>(y, grad_y, x, recompute, ch0, p, item);
  };
  auto finish = [&](size_t p, GradAndInput<V>& item) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      item.g[j] = __fmul_rn(a[j], __fmaf_rn(-k_x[j], __fsub_rn(item.x[j], mu[j]), __fsub_rn(item.g[j], g_mean[j])));
    store_values<T, V>(grad_x.data + p * grad_x.stride + ch0, item.g);
  };
  for_each_thread_pixel<GradAndInput<V>>(begin, end, ty, rows, load, finish);
}

// Pass 1 of sync phases 1 and 2: per block and channel, the sum of x (Centered = false) or of
// (x - mean)^2 with mean = sums / total_pixels (Centered) -> partials[b][ch].
template <bool Centered, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    channel_sums_kernel(NhwcView<const T> x, const float* sums, double total_pixels, int pixel_blocks,
                        float* partials) {
  __shared__ float s_sum[kThreads * 4];
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  const bool active = unit * V < x.c;
  const int ch0 = active ? unit * V : 0;
  const size_t pixels = x.pixels(), begin = range_begin(pixels, pixel_blocks, int(blockIdx.x)),
               end = range_begin(pixels, pixel_blocks, int(blockIdx.x) + 1);
  float sum[V], mu[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum[j] = 0, mu[j] = Centered && active ? mean_of(sums[ch0 + j], total_pixels) : 0.0f;
  if (active) {
    auto load = [&](size_t p, size_t, float (&v)[V]) { load_values<T, V>(x.data + p * x.stride + ch0, v); };
    auto accumulate = [&](size_t, const float (&v)[V]) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if constexpr (Centered) {
          const float d = __fsub_rn(v[j], mu[j]);
          sum[j] = __fmaf_rn(d, d, sum[j]);
        } else {
          sum[j] += v[j];
        }
      }
    };
    for_each_thread_pixel<float[V]>(begin, end, ty, rows, load, accumulate);
  }
  const unsigned cols = lanes * V;
#pragma unroll
  for (int j = 0; j < V; ++j) s_sum[ty * cols + tx * V + j] = sum[j];
  __syncthreads();
  for (unsigned s = rows / 2; s > 0; s /= 2) {
    if (ty < s) {
#pragma unroll
      for (int j = 0; j < V; ++j) s_sum[ty * cols + tx * V + j] = sum[j] = sum[j] + s_sum[(ty + s) * cols + tx * V + j];
    }
    __syncthreads();
  }
  if (ty == 0 && active) {
    float* out = partials + size_t(blockIdx.x) * x.c + size_t(ch0);
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = sum[j];
  }
}

// Pass 2 of sync phases 1 and 2: out[ch] = the blocks' partials[b][ch] added in a fixed order.
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeRows)
    sum_partials_kernel(int c, int pixel_blocks, const float* partials, float* out) {
  __shared__ float scratch[kFinalizeRows][kFinalizeChannels];
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  const int ch = int(blockIdx.x * kFinalizeChannels + tx);
  float sum = 0;
  if (ch < c) {
#pragma unroll 8
    for (int b = int(ty); b < pixel_blocks; b += kFinalizeRows) sum += partials[size_t(b) * c + ch];
  }
  sum = sum_over_rows(sum, scratch);
  if (ty == 0 && ch < c) out[ch] = sum;
}

// Sync phase 3's statistics: mean and biased variance from the all-reduced sums over M pixels,
// saved, and the running statistics updated (unbiased variance squares/(M-1)). One thread a channel.
__global__ void from_sums_finalize_kernel(int c, double total_pixels, const float* sums, const float* squares,
                                          float* saved_mean, float* saved_var, float* running_mean,
                                          float* running_var) {
  const int ch = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (ch >= c) return;
  const float mean = mean_of(sums[ch], total_pixels), var = float(double(squares[ch]) / total_pixels);
  saved_mean[ch] = mean;
  saved_var[ch] = var;
  if (running_mean) {
    const float unbiased = total_pixels > 1 ? float(double(squares[ch]) / (total_pixels - 1)) : var;
    running_mean[ch] = (1.0f - kBatchNormMomentum) * running_mean[ch] + kBatchNormMomentum * mean;
    running_var[ch] = (1.0f - kBatchNormMomentum) * running_var[ch] + kBatchNormMomentum * unbiased;
  }
}

template <Activation A, bool Res, typename T>
void launch_apply_kernel(bool vec4, NhwcView<const T> x, NhwcView<T> y, NhwcView<const T> residual, const float* mean,
                         const float* var, const float* gamma, const float* beta, cudaStream_t stream) {
  const Tiling t = tiling_for(x.c, vec4);
  const int pixel_blocks = apply_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(pixel_blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  if (vec4)
    LAUNCH((apply_kernel<A, Res, T, 4>), grid, block, 0, stream, x, y, residual, pixel_blocks, mean, var, gamma, beta);
  else
    LAUNCH((apply_kernel<A, Res, T, 1>), grid, block, 0, stream, x, y, residual, pixel_blocks, mean, var, gamma, beta);
}

// The apply pass, with the residual added when it has data.
template <Activation A, typename T>
void launch_apply(bool vec4, NhwcView<const T> x, NhwcView<T> y, NhwcView<const T> residual, const float* mean,
                  const float* var, const float* gamma, const float* beta, cudaStream_t stream) {
  if (residual.data)
    launch_apply_kernel<A, true, T>(vec4 && quad_view(residual), x, y, residual, mean, var, gamma, beta, stream);
  else
    launch_apply_kernel<A, false, T>(vec4, x, y, residual, mean, var, gamma, beta, stream);
}

// The training forwards' y: a view of x's shape, or empty (statistics only: the apply runs where
// the next convolutions load it, conv.h's NormalizedInput), which leaves nothing to add a residual to.
template <typename T>
void check_statistics_only(const char* op, NhwcView<T> y, NhwcView<const T> residual) {
  if (!y.data && residual.data)
    throw Error(std::string(op) + ": a residual needs y (an empty y computes the statistics only)");
  if (y.data) check_residual(op, NhwcView<const T>{y.data, y.n, y.h, y.w, y.c, y.stride}, residual);
}

// NormalizedInput's table: the apply's mean, scale and shift of each channel.
__global__ void input_table_kernel(int c, const float* mean, const float* var, const float* gamma, const float* beta,
                                   float* table) {
  const int ch = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (ch >= c) return;
  table[4 * ch] = mean[ch];
  table[4 * ch + 1] = normalize_scale(gamma[ch], var[ch]);
  table[4 * ch + 2] = beta[ch];
  table[4 * ch + 3] = 0.0f;
}

template <Activation A, typename T>
void forward_training_cuda(NhwcView<const T> x, const float* gamma, const float* beta, NhwcView<T> y,
                           NhwcView<const T> residual, float* saved_mean, float* saved_var, float* running_mean,
                           float* running_var, float* partials, cudaStream_t stream) {
  const bool vec4 = quad_view(x) && (!y.data || quad_view(y));  // statistics only: x's alone
  const Tiling t = tiling_for(x.c, vec4);
  const int blocks = stats_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  float* counts = partials + size_t(blocks) * size_t(x.c) * 2;
  if (vec4)
    LAUNCH(forward_stats_kernel<T, 4>, grid, block, 0, stream, x, blocks, partials, counts);
  else
    LAUNCH(forward_stats_kernel<T, 1>, grid, block, 0, stream, x, blocks, partials, counts);
  LAUNCH(forward_finalize_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)),
         dim3(kFinalizeChannels, kFinalizeRows), 0, stream, x.c, x.pixels(), blocks,
         static_cast<const float*>(partials), static_cast<const float*>(counts), saved_mean, saved_var, running_mean,
         running_var);
  if (y.data) launch_apply<A, T>(vec4, x, y, residual, saved_mean, saved_var, gamma, beta, stream);
}

// Calls f.template operator()<R>() with R whether the backward recomputes y (never for linear,
// which reads no y).
template <Activation A, typename F>
void with_recompute(BatchNormAffine<float> recompute, F&& f) {
  if constexpr (A == Activation::Linear) f.template operator()<false>();
  else if (recompute.beta) f.template operator()<true>();
  else f.template operator()<false>();
}

template <typename T>
bool backward_vec4(Activation act, const NhwcView<const T>& y, const NhwcView<const T>& grad_y,
                   const NhwcView<const T>& x, BatchNormAffine<float> recompute) {
  return quad_view(grad_y) && quad_view(x) && (act == Activation::Linear || recompute.beta || quad_view(y));
}

// Backward passes 1 and 2: grad_gamma, grad_beta (and sums2 when set) of x's pixels.
template <Activation A, typename T>
void backward_sums_cuda(bool vec4, NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<const T> x,
                        const float* saved_mean, const float* saved_var, BatchNormAffine<float> recompute,
                        float* grad_gamma, float* grad_beta, float* sums2, float* partials, cudaStream_t stream) {
  const Tiling t = tiling_for(x.c, vec4);
  const int blocks = stats_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  with_recompute<A>(recompute, [&]<bool R>() {
    if (vec4)
      LAUNCH((backward_stats_kernel<A, R, T, 4>), grid, block, 0, stream, y, grad_y, x, saved_mean, saved_var,
             recompute, blocks, partials);
    else
      LAUNCH((backward_stats_kernel<A, R, T, 1>), grid, block, 0, stream, y, grad_y, x, saved_mean, saved_var,
             recompute, blocks, partials);
  });
  LAUNCH(backward_finalize_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)),
         dim3(kFinalizeChannels, kFinalizeRows), 0, stream, x.c, blocks, static_cast<const float*>(partials),
         saved_var, grad_gamma, grad_beta, sums2);
}

// Backward pass 3 over x's pixels, with sums of g and g xhat over 1/inv_m pixels.
template <Activation A, typename T>
void backward_apply_cuda(bool vec4, NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<const T> x,
                         NhwcView<T> grad_x, float inv_m, const float* gamma, const float* saved_mean,
                         const float* saved_var, const float* sum_g_xhat, const float* sum_g,
                         BatchNormAffine<float> recompute, cudaStream_t stream) {
  const Tiling t = tiling_for(x.c, vec4);
  const int apply_blocks = apply_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(apply_blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  with_recompute<A>(recompute, [&]<bool R>() {
    if (vec4)
      LAUNCH((backward_apply_kernel<A, R, T, 4>), grid, block, 0, stream, y, grad_y, x, grad_x, apply_blocks, inv_m,
             gamma, saved_mean, saved_var, sum_g_xhat, sum_g, recompute);
    else
      LAUNCH((backward_apply_kernel<A, R, T, 1>), grid, block, 0, stream, y, grad_y, x, grad_x, apply_blocks, inv_m,
             gamma, saved_mean, saved_var, sum_g_xhat, sum_g, recompute);
  });
}

template <Activation A, typename T>
void backward_cuda(NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<const T> x, const float* gamma,
                   const float* saved_mean, const float* saved_var, NhwcView<T> grad_x, float* grad_gamma,
                   float* grad_beta, BatchNormAffine<float> recompute, float* partials, cudaStream_t stream) {
  const bool vec4 = backward_vec4(A, y, grad_y, x, recompute) && quad_view(grad_x);
  backward_sums_cuda<A, T>(vec4, y, grad_y, x, saved_mean, saved_var, recompute, grad_gamma, grad_beta, nullptr,
                           partials, stream);
  backward_apply_cuda<A, T>(vec4, y, grad_y, x, grad_x, 1.0f / float(x.pixels()), gamma, saved_mean, saved_var,
                            grad_gamma, grad_beta, recompute, stream);
}

// Sync phases 1 and 2: per-channel sums of x, or of (x - sums/total_pixels)^2 (Centered).
template <bool Centered, typename T>
void channel_sums_cuda(NhwcView<const T> x, const float* sums, double total_pixels, float* out, float* partials,
                       cudaStream_t stream) {
  const bool vec4 = quad_view(x);
  const Tiling t = tiling_for(x.c, vec4);
  const int blocks = stats_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  if (vec4)
    LAUNCH((channel_sums_kernel<Centered, T, 4>), grid, block, 0, stream, x, sums, total_pixels, blocks, partials);
  else
    LAUNCH((channel_sums_kernel<Centered, T, 1>), grid, block, 0, stream, x, sums, total_pixels, blocks, partials);
  LAUNCH(sum_partials_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)), dim3(kFinalizeChannels, kFinalizeRows),
         0, stream, x.c, blocks, static_cast<const float*>(partials), out);
}

}  // namespace

// ---- public entry points


size_t batchnorm_workspace_bytes(int n, int h, int w, int c) {
  if (n < 0 || h < 0 || w < 0 || c < 0)
    throw Error("batchnorm_workspace_bytes: negative size " + std::to_string(n) + "x" + std::to_string(h) + "x" +
                std::to_string(w) + "x" + std::to_string(c));
  size_t pixels = size_t(n) * size_t(h) * size_t(w);
  if (pixels == 0 || c == 0) return 0;
  size_t blocks = size_t(max_stats_pixel_blocks(pixels, c));
  return (blocks * size_t(c) * 2 + blocks) * sizeof(float);  // partials [block][c][2], counts [block]
}

void batchnorm_input_table_cuda(int c, const float* mean, const float* var, const float* gamma, const float* beta,
                                float* table, cudaStream_t stream) {
  const char* op = "batchnorm_input_table_cuda";
  if (c < 0) throw Error(std::string(op) + ": negative channel count " + std::to_string(c));
  if (c == 0) return;
  if (!mean || !var || !gamma || !beta || !table) throw Error(std::string(op) + ": a per-channel array is null");
  if (reinterpret_cast<uintptr_t>(table) % 16 != 0) throw Error(std::string(op) + ": the table is not 16-byte aligned");
  LAUNCH(input_table_kernel, dim3(ceil_div(size_t(c), kThreads)), dim3(kThreads), 0, stream, c, mean, var, gamma, beta,
         table);
}

template <typename T>
void batchnorm_activation_forward_training_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                const float* beta, NhwcView<T> y, float* saved_mean, float* saved_var,
                                                float* running_mean, float* running_var, void* workspace,
                                                size_t workspace_bytes, cudaStream_t stream,
                                                NhwcView<const T> residual) {
  const char* op = "batchnorm_activation_forward_training_cuda";
  check_forward_training(op, x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var, true);
  check_statistics_only(op, y, residual);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    forward_training_cuda<A, T>(x, gamma, beta, y, residual, saved_mean, saved_var, running_mean, running_var,
                                static_cast<float*>(workspace), stream);
  });
}

size_t batchnorm_from_moments_workspace_bytes(int blocks, int c) {
  if (blocks < 0 || c < 0)
    throw Error("batchnorm_from_moments_workspace_bytes: negative blocks " + std::to_string(blocks) + " or channels " +
                std::to_string(c));
  const MomentGroups m = moment_groups(blocks);
  return (size_t(m.out_blocks) * size_t(c) * 2 + size_t(m.out_blocks)) * sizeof(float);
}

namespace {

void check_moments(const char* op, int c, const float* partials, const float* counts, int blocks, const void* workspace,
                   size_t workspace_bytes) {
  if (!partials || !counts || blocks < 1)
    throw Error(std::string(op) + ": the moments (partials, counts, blocks = " + std::to_string(blocks) +
                ") are missing");
  const size_t need = batchnorm_from_moments_workspace_bytes(blocks, c);
  if (workspace_bytes < need || (need && !workspace))
    throw Error(std::string(op) + ": the workspace holds " + std::to_string(workspace_bytes) + " bytes, " +
                std::to_string(need) + " needed (batchnorm_from_moments_workspace_bytes)");
}

// More blocks than the finalize takes: Chan-merged in groups into the workspace, and the moments
// (partials, counts, blocks) then refer to the merged ones.
void merge_moment_groups(int c, const float*& partials, const float*& counts, int& blocks, void* workspace,
                         cudaStream_t stream) {
  const MomentGroups m = moment_groups(blocks);
  if (!m.out_blocks) return;
  float* merged = static_cast<float*>(workspace);
  float* merged_counts = merged + size_t(m.out_blocks) * size_t(c) * 2;
  const size_t threads = size_t(m.out_blocks) * size_t(c);
  LAUNCH(merge_moments_kernel, dim3(unsigned(std::min<size_t>(ceil_div(threads, kThreads), 4096))), dim3(kThreads), 0,
         stream, c, blocks, m.group, m.out_blocks, partials, counts, merged, merged_counts);
  partials = merged;
  counts = merged_counts;
  blocks = m.out_blocks;
}

template <bool Centered>
void moments_sums_cuda(const char* op, int c, const float* partials, const float* counts, int blocks, const float* sums,
                       double total_pixels, float* out, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (c < 0) throw Error(std::string(op) + ": negative channel count " + std::to_string(c));
  if (c == 0) return;
  check_moments(op, c, partials, counts, blocks, workspace, workspace_bytes);
  if (!out || (Centered && !sums)) throw Error(std::string(op) + ": a per-channel array is null");
  if (Centered && !(total_pixels >= 1)) throw Error(std::string(op) + ": total_pixels must be at least 1");
  merge_moment_groups(c, partials, counts, blocks, workspace, stream);
  LAUNCH(moments_sums_kernel<Centered>, dim3(ceil_div(size_t(c), kFinalizeChannels)),
         dim3(kFinalizeChannels, kFinalizeRows), 0, stream, c, blocks, partials, counts, sums, total_pixels, out);
}

}  // namespace

void batchnorm_sums_from_moments_cuda(int c, const float* partials, const float* counts, int blocks, float* sums,
                                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  moments_sums_cuda<false>("batchnorm_sums_from_moments_cuda", c, partials, counts, blocks, nullptr, 0.0, sums,
                           workspace, workspace_bytes, stream);
}

void batchnorm_centered_squares_from_moments_cuda(int c, const float* partials, const float* counts, int blocks,
                                                  const float* sums, double total_pixels, float* squares,
                                                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  moments_sums_cuda<true>("batchnorm_centered_squares_from_moments_cuda", c, partials, counts, blocks, sums,
                          total_pixels, squares, workspace, workspace_bytes, stream);
}

template <typename T>
void batchnorm_activation_forward_from_moments_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                    const float* beta, NhwcView<T> y, const float* partials,
                                                    const float* counts, int blocks, float* saved_mean,
                                                    float* saved_var, float* running_mean, float* running_var,
                                                    void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                                    NhwcView<const T> residual) {
  const char* op = "batchnorm_activation_forward_from_moments_cuda";
  check_forward_training(op, x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var, true);
  check_statistics_only(op, y, residual);
  if (x.c == 0 || x.pixels() == 0) return;
  check_moments(op, x.c, partials, counts, blocks, workspace, workspace_bytes);
  merge_moment_groups(x.c, partials, counts, blocks, workspace, stream);
  LAUNCH(forward_finalize_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)),
         dim3(kFinalizeChannels, kFinalizeRows), 0, stream, x.c, x.pixels(), blocks, partials, counts, saved_mean,
         saved_var, running_mean, running_var);
  if (!y.data) return;  // statistics only
  const bool vec4 = quad_view(x) && quad_view(y);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    launch_apply<A, T>(vec4, x, y, residual, saved_mean, saved_var, gamma, beta, stream);
  });
}

template <typename T>
void batchnorm_activation_forward_inference_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                 const float* beta, const float* running_mean, const float* running_var,
                                                 NhwcView<T> y, cudaStream_t stream, NhwcView<const T> residual) {
  const char* op = "batchnorm_activation_forward_inference_cuda";
  check_forward_inference(op, x, gamma, beta, running_mean, running_var, y);
  check_residual(op, x, residual);
  if (x.elements() == 0) return;
  const bool vec4 = quad_view(x) && quad_view(y);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    launch_apply<A, T>(vec4, x, y, residual, running_mean, running_var, gamma, beta, stream);
  });
}

template <typename T>
void batchnorm_activation_backward_cuda(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                        NhwcView<const T> x, const float* gamma, const float* saved_mean,
                                        const float* saved_var, NhwcView<T> grad_x, float* grad_gamma, float* grad_beta,
                                        void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                        BatchNormAffine<float> recompute) {
  const char* op = "batchnorm_activation_backward_cuda";
  check_backward(op, act, y, grad_y, x, gamma, saved_mean, saved_var, grad_x, grad_gamma, grad_beta, recompute);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_cuda<A, T>(y, grad_y, x, gamma, saved_mean, saved_var, grad_x, grad_gamma, grad_beta, recompute,
                        static_cast<float*>(workspace), stream);
  });
}

template <typename T>
void batchnorm_sums_cuda(NhwcView<const T> x, float* sums, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  const char* op = "batchnorm_sums_cuda";
  check_sums(op, x, sums);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  channel_sums_cuda<false, T>(x, nullptr, 0.0, sums, static_cast<float*>(workspace), stream);
}

template <typename T>
void batchnorm_centered_squares_cuda(NhwcView<const T> x, const float* sums, double total_pixels, float* squares,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "batchnorm_centered_squares_cuda";
  check_centered_squares(op, x, sums, total_pixels, squares);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  channel_sums_cuda<true, T>(x, sums, total_pixels, squares, static_cast<float*>(workspace), stream);
}

template <typename T>
void batchnorm_activation_forward_from_sums_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                 const float* beta, NhwcView<T> y, const float* sums,
                                                 const float* squares, double total_pixels, float* saved_mean,
                                                 float* saved_var, float* running_mean, float* running_var,
                                                 cudaStream_t stream, NhwcView<const T> residual) {
  const char* op = "batchnorm_activation_forward_from_sums_cuda";
  check_forward_from_sums(op, x, gamma, beta, y, sums, squares, total_pixels, saved_mean, saved_var, running_mean,
                          running_var, true);
  check_statistics_only(op, y, residual);
  if (x.c == 0) return;
  LAUNCH(from_sums_finalize_kernel, dim3(ceil_div(size_t(x.c), kThreads)), dim3(kThreads), 0, stream, x.c,
         total_pixels, sums, squares, saved_mean, saved_var, running_mean, running_var);
  if (!y.data) return;  // statistics only
  const bool vec4 = quad_view(x) && quad_view(y);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    launch_apply<A, T>(vec4, x, y, residual, saved_mean, saved_var, gamma, beta, stream);
  });
}

template <typename T>
void batchnorm_activation_backward_sums_cuda(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                             NhwcView<const T> x, const float* saved_mean, const float* saved_var,
                                             float* grad_gamma, float* grad_beta, float* sums2, void* workspace,
                                             size_t workspace_bytes, cudaStream_t stream,
                                             BatchNormAffine<float> recompute) {
  const char* op = "batchnorm_activation_backward_sums_cuda";
  check_backward_sums(op, act, y, grad_y, x, saved_mean, saved_var, grad_gamma, grad_beta, sums2, recompute);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  const bool vec4 = backward_vec4(act, y, grad_y, x, recompute);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_sums_cuda<A, T>(vec4, y, grad_y, x, saved_mean, saved_var, recompute, grad_gamma, grad_beta, sums2,
                             static_cast<float*>(workspace), stream);
  });
}

template <typename T>
void batchnorm_activation_backward_apply_cuda(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                              NhwcView<const T> x, const float* gamma, const float* saved_mean,
                                              const float* saved_var, const float* sums2, double total_pixels,
                                              NhwcView<T> grad_x, cudaStream_t stream,
                                              BatchNormAffine<float> recompute) {
  check_backward_apply("batchnorm_activation_backward_apply_cuda", act, y, grad_y, x, gamma, saved_mean, saved_var,
                       sums2, total_pixels, grad_x, recompute);
  if (x.c == 0) return;
  const bool vec4 = backward_vec4(act, y, grad_y, x, recompute) && quad_view(grad_x);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_apply_cuda<A, T>(vec4, y, grad_y, x, grad_x, float(1.0 / total_pixels), gamma, saved_mean, saved_var,
                              sums2 + x.c, sums2, recompute, stream);
  });
}

// The storage types of x, y and the gradients (per-channel arrays are float for all three).
#define INSTANTIATE(T)                                                                                                 \
  template void batchnorm_activation_forward_training_cuda<T>(Activation, NhwcView<const T>, const float*,             \
                                                              const float*, NhwcView<T>, float*, float*, float*,       \
                                                              float*, void*, size_t, cudaStream_t, NhwcView<const T>); \
  template void batchnorm_activation_forward_from_moments_cuda<T>(                                                     \
      Activation, NhwcView<const T>, const float*, const float*, NhwcView<T>, const float*, const float*, int, float*, \
      float*, float*, float*, void*, size_t, cudaStream_t, NhwcView<const T>);                                         \
  template void batchnorm_activation_forward_inference_cuda<T>(Activation, NhwcView<const T>, const float*,            \
                                                               const float*, const float*, const float*, NhwcView<T>,  \
                                                               cudaStream_t, NhwcView<const T>);                       \
  template void batchnorm_activation_backward_cuda<T>(Activation, NhwcView<const T>, NhwcView<const T>,                \
                                                      NhwcView<const T>, const float*, const float*, const float*,     \
                                                      NhwcView<T>, float*, float*, void*, size_t, cudaStream_t,        \
                                                      BatchNormAffine<float>);                                         \
  template void batchnorm_sums_cuda<T>(NhwcView<const T>, float*, void*, size_t, cudaStream_t);                        \
  template void batchnorm_centered_squares_cuda<T>(NhwcView<const T>, const float*, double, float*, void*, size_t,     \
                                                   cudaStream_t);                                                      \
  template void batchnorm_activation_forward_from_sums_cuda<T>(Activation, NhwcView<const T>, const float*,            \
                                                               const float*, NhwcView<T>, const float*, const float*,  \
                                                               double, float*, float*, float*, float*, cudaStream_t,   \
                                                               NhwcView<const T>);                                     \
  template void batchnorm_activation_backward_sums_cuda<T>(Activation, NhwcView<const T>, NhwcView<const T>,           \
                                                           NhwcView<const T>, const float*, const float*, float*,      \
                                                           float*, float*, void*, size_t, cudaStream_t,                \
                                                           BatchNormAffine<float>);                                    \
  template void batchnorm_activation_backward_apply_cuda<T>(                                                           \
      Activation, NhwcView<const T>, NhwcView<const T>, NhwcView<const T>, const float*, const float*, const float*,   \
      const float*, double, NhwcView<T>, cudaStream_t, BatchNormAffine<float>);
INSTANTIATE(float)
INSTANTIATE(Bf16)
INSTANTIATE(Fp16)
#undef INSTANTIATE

}  // namespace yolo
