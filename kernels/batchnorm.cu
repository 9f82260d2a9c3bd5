// Batchnorm (+ activation): reference loops, the fast CPU version and the CUDA kernels.
//
// CUDA, training forward: (1) stats: each block owns a contiguous range of pixels and up to 32
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
#include "kernels/batchnorm.h"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

namespace yolo {

namespace {

// ---- shared pieces --------------------------------------------------------------------------

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

// Chan's merge of (n, mean, m2) with (nb, mean_b, m2_b).
template <typename T>
__host__ __device__ inline void chan_merge(T& n, T& mean, T& m2, T nb, T mean_b, T m2_b) {
  if (nb == T(0)) return;
  if (n == T(0)) {
    n = nb, mean = mean_b, m2 = m2_b;
    return;
  }
  T total = n + nb, delta = mean_b - mean, frac = nb / total;
  mean += delta * frac;
  m2 += m2_b + delta * delta * n * frac;
  n = total;
}

void check_array(const char* op, const char* name, const void* p, int c) {
  if (c > 0 && p == nullptr) throw Error(std::string(op) + ": " + name + " is null");
}

// The synchronized phases' mean: the all-reduced sum over the total pixel count, one formula
// on host and device so every phase and implementation agrees on it.
__host__ __device__ inline float mean_of(float sum, double total_pixels) {
  return float(double(sum) / total_pixels);
}

template <typename T>
void check_training_input(const char* op, const NhwcView<const T>& x) {
  check_view_arg(x, op, "x");
  if (x.c > 0 && x.pixels() == 0)
    throw Error(std::string(op) + ": batch statistics need at least one pixel (x is " + std::to_string(x.n) + "x" +
                std::to_string(x.h) + "x" + std::to_string(x.w) + ")");
}

template <typename T>
void check_forward_training(const char* op, NhwcView<const T> x, const T* gamma, const T* beta, NhwcView<T> y,
                            const T* saved_mean, const T* saved_var, const T* running_mean, const T* running_var) {
  check_training_input(op, x);
  check_view_arg(y, op, "y");
  check_same_view_shape(y, x, op, "y", "x");
  check_array(op, "gamma", gamma, x.c);
  check_array(op, "beta", beta, x.c);
  check_array(op, "saved_mean", saved_mean, x.c);
  check_array(op, "saved_var", saved_var, x.c);
  if ((running_mean == nullptr) != (running_var == nullptr))
    throw Error(std::string(op) + ": running_mean and running_var must both be set or both be null");
}

template <typename T>
void check_forward_inference(const char* op, NhwcView<const T> x, const T* gamma, const T* beta,
                             const T* running_mean, const T* running_var, NhwcView<T> y) {
  check_view_arg(x, op, "x");
  check_view_arg(y, op, "y");
  check_same_view_shape(y, x, op, "y", "x");
  check_array(op, "gamma", gamma, x.c);
  check_array(op, "beta", beta, x.c);
  check_array(op, "running_mean", running_mean, x.c);
  check_array(op, "running_var", running_var, x.c);
}

template <typename T>
void check_backward(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                    NhwcView<const T> x, const T* gamma, const T* saved_mean, const T* saved_var, NhwcView<T> grad_x,
                    const T* grad_gamma, const T* grad_beta) {
  check_training_input(op, x);
  check_view_arg(grad_y, op, "grad_y");
  check_view_arg(grad_x, op, "grad_x");
  check_same_view_shape(grad_y, x, op, "grad_y", "x");
  check_same_view_shape(grad_x, x, op, "grad_x", "x");
  if (act != Activation::Linear) {
    check_view_arg(y, op, "y");
    check_same_view_shape(y, x, op, "y", "x");
  }
  check_array(op, "gamma", gamma, x.c);
  check_array(op, "saved_mean", saved_mean, x.c);
  check_array(op, "saved_var", saved_var, x.c);
  check_array(op, "grad_gamma", grad_gamma, x.c);
  check_array(op, "grad_beta", grad_beta, x.c);
}

// ---- the synchronized phases' checks ----

void check_total_pixels(const char* op, double total_pixels, size_t pixels) {
  if (std::isfinite(total_pixels) && total_pixels >= double(pixels) && total_pixels == std::floor(total_pixels))
    return;
  std::ostringstream text;
  text.precision(17);
  text << op << ": total_pixels is " << total_pixels << "; it must be the pixel count n*h*w summed over all "
       << "replicas, a whole number at least this replica's " << pixels;
  throw Error(text.str());
}

template <typename T>
void check_sums(const char* op, NhwcView<const T> x, const T* sums) {
  check_training_input(op, x);
  check_array(op, "sums", sums, x.c);
}

template <typename T>
void check_centered_squares(const char* op, NhwcView<const T> x, const T* sums, double total_pixels,
                            const T* squares) {
  check_sums(op, x, sums);
  check_total_pixels(op, total_pixels, x.pixels());
  check_array(op, "squares", squares, x.c);
}

template <typename T>
void check_forward_from_sums(const char* op, NhwcView<const T> x, const T* gamma, const T* beta, NhwcView<T> y,
                             const T* sums, const T* squares, double total_pixels, const T* saved_mean,
                             const T* saved_var, const T* running_mean, const T* running_var) {
  check_forward_training(op, x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var);
  check_array(op, "sums", sums, x.c);
  check_array(op, "squares", squares, x.c);
  check_total_pixels(op, total_pixels, x.pixels());
}

// What both backward phases read: x, grad_y, y (unless linear), the saved statistics and sums2.
template <typename T>
void check_sync_backward_inputs(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                NhwcView<const T> x, const T* saved_mean, const T* saved_var, const T* sums2) {
  check_training_input(op, x);
  check_view_arg(grad_y, op, "grad_y");
  check_same_view_shape(grad_y, x, op, "grad_y", "x");
  if (act != Activation::Linear) {
    check_view_arg(y, op, "y");
    check_same_view_shape(y, x, op, "y", "x");
  }
  check_array(op, "saved_mean", saved_mean, x.c);
  check_array(op, "saved_var", saved_var, x.c);
  check_array(op, "sums2", sums2, x.c);
}

template <typename T>
void check_backward_sums(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                         NhwcView<const T> x, const T* saved_mean, const T* saved_var, const T* grad_gamma,
                         const T* grad_beta, const T* sums2) {
  check_sync_backward_inputs(op, act, y, grad_y, x, saved_mean, saved_var, sums2);
  check_array(op, "grad_gamma", grad_gamma, x.c);
  check_array(op, "grad_beta", grad_beta, x.c);
}

template <typename T>
void check_backward_apply(const char* op, Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                          NhwcView<const T> x, const T* gamma, const T* saved_mean, const T* saved_var,
                          const T* sums2, double total_pixels, NhwcView<T> grad_x) {
  check_sync_backward_inputs(op, act, y, grad_y, x, saved_mean, saved_var, sums2);
  check_view_arg(grad_x, op, "grad_x");
  check_same_view_shape(grad_x, x, op, "grad_x", "x");
  check_array(op, "gamma", gamma, x.c);
  check_total_pixels(op, total_pixels, x.pixels());
}

void check_workspace(const char* op, const ConstAct& x, const void* workspace, size_t workspace_bytes) {
  size_t need = batchnorm_workspace_bytes(x.n, x.h, x.w, x.c);
  if (workspace_bytes < need)
    throw Error(std::string(op) + ": workspace of " + std::to_string(workspace_bytes) + " bytes, needs " +
                std::to_string(need) + " (batchnorm_workspace_bytes)");
  if (need > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % alignof(float) != 0))
    throw Error(std::string(op) + ": workspace is null or not float-aligned");
}

// The reference forward's last steps for channel ch, from its batch mean and biased variance in
// double over m pixels: y (with the statistics rounded to T), the saved statistics and the running
// ones. The statistics come from x before this writes y: y may alias x.
template <typename T>
void finish_channel_reference(Activation act, int ch, double mean, double var, double m, NhwcView<const T> x,
                              const T* gamma, const T* beta, NhwcView<T> y, T* saved_mean, T* saved_var,
                              T* running_mean, T* running_var) {
  T mean_t = T(mean), var_t = T(var);
  T inv_std = T(1) / std::sqrt(var_t + T(kBatchNormEpsilon));
  for (int b = 0; b < x.n; ++b)
    for (int i = 0; i < x.h; ++i)
      for (int j = 0; j < x.w; ++j)
        y.data[y.at(b, i, j, ch)] =
            activate(act, gamma[ch] * (x.data[x.at(b, i, j, ch)] - mean_t) * inv_std + beta[ch]);
  saved_mean[ch] = mean_t;
  saved_var[ch] = var_t;
  if (running_mean) {
    T unbiased = m > 1 ? T(var * m / (m - 1)) : var_t;
    running_mean[ch] = T(1 - kBatchNormMomentum) * running_mean[ch] + T(kBatchNormMomentum) * mean_t;
    running_var[ch] = T(1 - kBatchNormMomentum) * running_var[ch] + T(kBatchNormMomentum) * unbiased;
  }
}

// The reference backward's gradient at batchnorm's output: grad_y through the activation (whose
// derivative comes from its output y).
template <typename T>
double reference_g(Activation act, const NhwcView<const T>& y, const NhwcView<const T>& grad_y, int b, int i, int j,
                   int ch) {
  double g = double(grad_y.data[grad_y.at(b, i, j, ch)]);
  if (act != Activation::Linear) g *= double(activation_gradient_from_output(act, y.data[y.at(b, i, j, ch)]));
  return g;
}

// The reference backward's sums over x's pixels for channel ch: of g (grad_beta) and of g * xhat
// (grad_gamma).
struct ChannelGradSums {
  double g, g_xhat;
};
template <typename T>
ChannelGradSums backward_channel_sums_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                                NhwcView<const T> x, const T* saved_mean, const T* saved_var, int ch) {
  double inv_std = 1.0 / std::sqrt(double(saved_var[ch]) + double(kBatchNormEpsilon)), mean = double(saved_mean[ch]);
  ChannelGradSums s{0, 0};
  for (int b = 0; b < x.n; ++b)
    for (int i = 0; i < x.h; ++i)
      for (int j = 0; j < x.w; ++j) {
        double g = reference_g(act, y, grad_y, b, i, j, ch);
        s.g += g;
        s.g_xhat += g * (double(x.data[x.at(b, i, j, ch)]) - mean) * inv_std;
      }
  return s;
}

// The reference backward's grad_x for channel ch from those sums over m pixels. Each grad_x
// element is written after its grad_y element is read (they may alias).
template <typename T>
void backward_channel_apply_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                      NhwcView<const T> x, const T* gamma, const T* saved_mean, const T* saved_var,
                                      int ch, double m, ChannelGradSums sums, NhwcView<T> grad_x) {
  double inv_std = 1.0 / std::sqrt(double(saved_var[ch]) + double(kBatchNormEpsilon)), mean = double(saved_mean[ch]);
  double scale = double(gamma[ch]) * inv_std / m;
  for (int b = 0; b < x.n; ++b)
    for (int i = 0; i < x.h; ++i)
      for (int j = 0; j < x.w; ++j) {
        double g = reference_g(act, y, grad_y, b, i, j, ch);
        double xhat = (double(x.data[x.at(b, i, j, ch)]) - mean) * inv_std;
        grad_x.data[grad_x.at(b, i, j, ch)] = T(scale * (m * g - sums.g - xhat * sums.g_xhat));
      }
}

// ---- CPU ------------------------------------------------------------------------------------
// Fixed pixel chunks (a function of the shape, not of the thread count), double accumulators
// per chunk, chunks combined in order.

struct CpuChunks {
  size_t pixels;
  size_t count;
  size_t begin(size_t k) const { return pixels * k / count; }
  size_t end(size_t k) const { return pixels * (k + 1) / count; }
};

CpuChunks cpu_chunks(size_t pixels, int c) {
  size_t count = (pixels * size_t(c) + 32767) / 32768;
  if (count > 256) count = 256;
  if (count > pixels) count = pixels;
  return {pixels, count < 1 ? 1 : count};
}

// y = act((x - mean) * scale + beta) over the chunks.
template <Activation A>
void apply_cpu(ConstAct x, Act y, const float* mean, const float* scale, const float* beta) {
  CpuChunks chunks = cpu_chunks(x.pixels(), x.c);
  parallel_for(chunks.count, [&](size_t k) {
    for (size_t p = chunks.begin(k); p < chunks.end(k); ++p) {
      const float* in = x.data + p * size_t(x.stride);
      float* out = y.data + p * size_t(y.stride);
      map_channels(in, out, x.c,
                   [&](int ch, float v) { return activate<A>((v - mean[ch]) * scale[ch] + beta[ch]); });
    }
  });
}

// One channel's saved statistics, running-statistics update (over m pixels) and the apply's mean
// and scale, from the batch mean and biased variance.
void finish_channel_cpu(int ch, double mean, double var, double m, const float* gamma, float* saved_mean,
                        float* saved_var, float* running_mean, float* running_var, std::vector<float>& mean_f,
                        std::vector<float>& scale) {
  saved_mean[ch] = float(mean);
  saved_var[ch] = float(var);
  mean_f[size_t(ch)] = float(mean);
  scale[size_t(ch)] = float(gamma[ch] / std::sqrt(var + kBatchNormEpsilon));
  if (running_mean) {
    double unbiased = m > 1 ? var * m / (m - 1) : var;
    running_mean[ch] = (1.0f - kBatchNormMomentum) * running_mean[ch] + kBatchNormMomentum * float(mean);
    running_var[ch] = (1.0f - kBatchNormMomentum) * running_var[ch] + kBatchNormMomentum * float(unbiased);
  }
}

template <Activation A>
void forward_training_cpu(ConstAct x, const float* gamma, const float* beta, Act y, float* saved_mean,
                          float* saved_var, float* running_mean, float* running_var) {
  const int c = x.c;
  CpuChunks chunks = cpu_chunks(x.pixels(), c);
  std::vector<double> partial(chunks.count * size_t(c) * 2);  // per chunk: mean[c], m2[c]
  parallel_for(chunks.count, [&](size_t k) {
    double* mean = &partial[k * size_t(c) * 2];
    double* m2 = mean + c;
    double n = 0;
    for (size_t p = chunks.begin(k); p < chunks.end(k); ++p) {
      const float* in = x.data + p * size_t(x.stride);
      n += 1;
      double inv = 1.0 / n;
      for (int ch = 0; ch < c; ++ch) {
        double v = in[ch], d = v - mean[ch];
        mean[ch] += d * inv;
        m2[ch] += d * (v - mean[ch]);
      }
    }
  });
  std::vector<float> mean_f(static_cast<size_t>(c)), scale(static_cast<size_t>(c));
  const double m = double(x.pixels());
  for (int ch = 0; ch < c; ++ch) {
    double n = 0, mean = 0, m2 = 0;
    for (size_t k = 0; k < chunks.count; ++k) {
      const double* part = &partial[k * size_t(c) * 2];
      chan_merge(n, mean, m2, double(chunks.end(k) - chunks.begin(k)), part[ch], part[c + ch]);
    }
    finish_channel_cpu(ch, mean, m2 / m, m, gamma, saved_mean, saved_var, running_mean, running_var, mean_f, scale);
  }
  apply_cpu<A>(x, y, mean_f.data(), scale.data(), beta);
}

// Per channel, the sum over x's pixels of term(ch, x) in double: fixed chunks, added in order.
template <typename Term>
std::vector<double> channel_sums_cpu(ConstAct x, Term term) {
  const int c = x.c;
  CpuChunks chunks = cpu_chunks(x.pixels(), c);
  std::vector<double> partial(chunks.count * size_t(c));
  parallel_for(chunks.count, [&](size_t k) {
    double* sum = &partial[k * size_t(c)];
    for (size_t p = chunks.begin(k); p < chunks.end(k); ++p) {
      const float* in = x.data + p * size_t(x.stride);
      for (int ch = 0; ch < c; ++ch) sum[ch] += term(ch, in[ch]);
    }
  });
  std::vector<double> total(static_cast<size_t>(c));
  for (size_t k = 0; k < chunks.count; ++k)
    for (int ch = 0; ch < c; ++ch) total[size_t(ch)] += partial[k * size_t(c) + size_t(ch)];
  return total;
}

template <Activation A>
void forward_from_sums_cpu(ConstAct x, const float* gamma, const float* beta, Act y, const float* sums,
                           const float* squares, double total_pixels, float* saved_mean, float* saved_var,
                           float* running_mean, float* running_var) {
  std::vector<float> mean_f(static_cast<size_t>(x.c)), scale(static_cast<size_t>(x.c));
  for (int ch = 0; ch < x.c; ++ch)
    finish_channel_cpu(ch, double(sums[ch]) / total_pixels, double(squares[ch]) / total_pixels, total_pixels, gamma,
                       saved_mean, saved_var, running_mean, running_var, mean_f, scale);
  apply_cpu<A>(x, y, mean_f.data(), scale.data(), beta);
}

// g = grad_y * act'(y) at pixel p, channel ch.
template <Activation A>
float grad_at(const ConstAct& y, const ConstAct& grad_y, size_t p, int ch) {
  float g = grad_y.data[p * size_t(grad_y.stride) + ch];
  if constexpr (A != Activation::Linear) g *= activation_gradient_from_output<A>(y.data[p * size_t(y.stride) + ch]);
  return g;
}

// Per channel, sum g ([0, c)) and sum g (x - mean) ([c, 2c)) in double: fixed chunks, added in order.
template <Activation A>
std::vector<double> backward_sums_cpu(ConstAct y, ConstAct grad_y, ConstAct x, const float* saved_mean) {
  const int c = x.c;
  CpuChunks chunks = cpu_chunks(x.pixels(), c);
  std::vector<double> partial(chunks.count * size_t(c) * 2);  // per chunk: sum g[c], sum g (x - mean)[c]
  parallel_for(chunks.count, [&](size_t k) {
    double* sum_g = &partial[k * size_t(c) * 2];
    double* sum_gx = sum_g + c;
    for (size_t p = chunks.begin(k); p < chunks.end(k); ++p) {
      const float* in = x.data + p * size_t(x.stride);
      for (int ch = 0; ch < c; ++ch) {
        double g = grad_at<A>(y, grad_y, p, ch);
        sum_g[ch] += g;
        sum_gx[ch] += g * (double(in[ch]) - saved_mean[ch]);
      }
    }
  });
  std::vector<double> total(size_t(c) * 2);
  for (int ch = 0; ch < c; ++ch)
    for (size_t k = 0; k < chunks.count; ++k) {
      total[size_t(ch)] += partial[k * size_t(c) * 2 + size_t(ch)];
      total[size_t(c + ch)] += partial[k * size_t(c) * 2 + size_t(c + ch)];
    }
  return total;
}

// grad_x = a (g - g_mean - kx (x - mean)), per channel (a applied last: g - g_mean cancels exactly
// where it should, e.g. m = 1).
template <Activation A>
void backward_apply_cpu(ConstAct y, ConstAct grad_y, ConstAct x, const float* saved_mean, Act grad_x,
                        const std::vector<float>& a, const std::vector<float>& g_mean, const std::vector<float>& kx) {
  CpuChunks chunks = cpu_chunks(x.pixels(), x.c);
  parallel_for(chunks.count, [&](size_t k) {
    for (size_t p = chunks.begin(k); p < chunks.end(k); ++p) {
      const float* in = x.data + p * size_t(x.stride);
      float* out = grad_x.data + p * size_t(grad_x.stride);
      for (int ch = 0; ch < x.c; ++ch)
        out[ch] = a[size_t(ch)] *
                  (grad_at<A>(y, grad_y, p, ch) - g_mean[size_t(ch)] - kx[size_t(ch)] * (in[ch] - saved_mean[ch]));
    }
  });
}

template <Activation A>
void backward_cpu(ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma, const float* saved_mean,
                  const float* saved_var, Act grad_x, float* grad_gamma, float* grad_beta) {
  const int c = x.c;
  std::vector<double> sums = backward_sums_cpu<A>(y, grad_y, x, saved_mean);
  std::vector<float> a(static_cast<size_t>(c)), g_mean(static_cast<size_t>(c)), kx(static_cast<size_t>(c));
  const double m = double(x.pixels());
  for (int ch = 0; ch < c; ++ch) {
    double sum_g = sums[size_t(ch)], sum_gx = sums[size_t(c + ch)];
    double inv_std = 1.0 / std::sqrt(double(saved_var[ch]) + kBatchNormEpsilon);
    double dgamma = sum_gx * inv_std, scale = gamma[ch] * inv_std;
    grad_beta[ch] = float(sum_g);
    grad_gamma[ch] = float(dgamma);
    a[size_t(ch)] = float(scale);
    g_mean[size_t(ch)] = float(sum_g / m);
    kx[size_t(ch)] = float(inv_std * dgamma / m);
  }
  backward_apply_cpu<A>(y, grad_y, x, saved_mean, grad_x, a, g_mean, kx);
}

// Phase 4: as backward_cpu's sums, written as grad_gamma/grad_beta and again as sums2.
template <Activation A>
void backward_sums_phase_cpu(ConstAct y, ConstAct grad_y, ConstAct x, const float* saved_mean,
                             const float* saved_var, float* grad_gamma, float* grad_beta, float* sums2) {
  const int c = x.c;
  std::vector<double> sums = backward_sums_cpu<A>(y, grad_y, x, saved_mean);
  for (int ch = 0; ch < c; ++ch) {
    double inv_std = 1.0 / std::sqrt(double(saved_var[ch]) + kBatchNormEpsilon);
    grad_beta[ch] = sums2[ch] = float(sums[size_t(ch)]);
    grad_gamma[ch] = sums2[c + ch] = float(sums[size_t(c + ch)] * inv_std);
  }
}

// Phase 5: backward_cpu's apply with the all-reduced sums2 over total_pixels.
template <Activation A>
void backward_apply_phase_cpu(ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma, const float* saved_mean,
                              const float* saved_var, const float* sums2, double total_pixels, Act grad_x) {
  const int c = x.c;
  std::vector<float> a(static_cast<size_t>(c)), g_mean(static_cast<size_t>(c)), kx(static_cast<size_t>(c));
  for (int ch = 0; ch < c; ++ch) {
    double inv_std = 1.0 / std::sqrt(double(saved_var[ch]) + kBatchNormEpsilon);
    a[size_t(ch)] = float(gamma[ch] * inv_std);
    g_mean[size_t(ch)] = float(double(sums2[ch]) / total_pixels);
    kx[size_t(ch)] = float(inv_std * double(sums2[c + ch]) / total_pixels);
  }
  backward_apply_cpu<A>(y, grad_y, x, saved_mean, grad_x, a, g_mean, kx);
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
template <int V>
__global__ void __launch_bounds__(kThreads)
    forward_stats_kernel(ConstAct x, int pixel_blocks, float* partials, float* counts) {
  __shared__ float s_mean[kThreads * 4], s_m2[kThreads * 4], s_count[kThreads];
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  const bool active = unit * V < x.c;
  const size_t pixels = x.pixels(), begin = range_begin(pixels, pixel_blocks, int(blockIdx.x)),
               end = range_begin(pixels, pixel_blocks, int(blockIdx.x) + 1);
  float n = 0, mean[V], m2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) mean[j] = 0, m2[j] = 0;
  auto step = [&](const float (&v)[V]) {
    n += 1.0f;
    float inv = 1.0f / n;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float d = v[j] - mean[j];
      mean[j] += d * inv;
      m2[j] += d * (v[j] - mean[j]);
    }
  };
  if (active) {
    const float* base = x.data + size_t(unit) * V + (begin + ty) * size_t(x.stride);
    const size_t step_elems = size_t(rows) * x.stride;
    auto load = [&](size_t, size_t i, float (&v)[V]) { load_floats<V>(base + i * step_elems, v); };
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

// y = act((x - mean) * gamma / sqrt(var + eps) + beta), mean/var being the batch's (training)
// or the running ones (inference). Block b covers pixel range b of apply_pixel_blocks.
template <Activation A, int V>
__global__ void __launch_bounds__(kThreads) apply_kernel(ConstAct x, Act y, int pixel_blocks, const float* mean,
                                                         const float* var, const float* gamma, const float* beta) {
  const unsigned lanes = blockDim.x, rows = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int unit = int(blockIdx.y * lanes + tx);
  if (unit * V >= x.c) return;
  const int ch0 = unit * V;
  float mu[V], scale[V], shift[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mu[j] = mean[ch0 + j];
    scale[j] = gamma[ch0 + j] / sqrtf(var[ch0 + j] + kBatchNormEpsilon);
    shift[j] = beta[ch0 + j];
  }
  const int block = int(blockIdx.x);
  const size_t pixels = x.pixels(), begin = range_begin(pixels, pixel_blocks, block),
               end = range_begin(pixels, pixel_blocks, block + 1);
  auto load = [&](size_t p, size_t, float (&v)[V]) { load_floats<V>(x.data + p * x.stride + ch0, v); };
  auto transform_and_store = [&](size_t p, float (&v)[V]) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = activate<A>((v[j] - mu[j]) * scale[j] + shift[j]);
    store_floats<V>(y.data + p * y.stride + ch0, v);
  };
  for_each_thread_pixel<float[V]>(begin, end, ty, rows, load, transform_and_store);
}

// What the backward reads for V channels of one pixel: g = grad_y * act'(y), and x.
template <int V>
struct GradAndInput {
  float g[V], x[V];
};
template <Activation A, int V>
__device__ __forceinline__ void load_grad_and_input(const ConstAct& y, const ConstAct& grad_y, const ConstAct& x,
                                                    int ch0, size_t p, GradAndInput<V>& item) {
  load_floats<V>(grad_y.data + p * grad_y.stride + ch0, item.g);
  if constexpr (A != Activation::Linear) {
    float out[V];
    load_floats<V>(y.data + p * y.stride + ch0, out);
#pragma unroll
    for (int j = 0; j < V; ++j) item.g[j] *= activation_gradient_from_output<A>(out[j]);
  }
  load_floats<V>(x.data + p * x.stride + ch0, item.x);
}

// Pass 1 of the backward: per-block sum g and sum g (x - mean) -> partials[b][ch][2].
template <Activation A, int V>
__global__ void __launch_bounds__(kThreads)
    backward_stats_kernel(ConstAct y, ConstAct grad_y, ConstAct x, const float* saved_mean, int pixel_blocks,
                          float* partials) {
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
    auto load = [&](size_t p, size_t, GradAndInput<V>& item) {
      load_grad_and_input<A, V>(y, grad_y, x, ch0, p, item);
    };
    auto accumulate = [&](size_t, const GradAndInput<V>& item) {
#pragma unroll
      for (int j = 0; j < V; ++j) sum_g[j] += item.g[j], sum_gx[j] += item.g[j] * (item.x[j] - mu[j]);
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
// (a applied last, so g - grad_beta/m cancels exactly where it should, e.g. m = 1). inv_m = 1/m:
// m is x's pixel count, or the total over the replicas (sync phase 5, with all-reduced sums).
template <Activation A, int V>
__global__ void __launch_bounds__(kThreads)
    backward_apply_kernel(ConstAct y, ConstAct grad_y, ConstAct x, Act grad_x, int pixel_blocks, float inv_m,
                          const float* gamma, const float* saved_mean, const float* saved_var,
                          const float* grad_gamma, const float* grad_beta) {
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
  auto load = [&](size_t p, size_t, GradAndInput<V>& item) {
    load_grad_and_input<A, V>(y, grad_y, x, ch0, p, item);
  };
  auto finish = [&](size_t p, GradAndInput<V>& item) {
#pragma unroll
    for (int j = 0; j < V; ++j) item.g[j] = a[j] * (item.g[j] - g_mean[j] - k_x[j] * (item.x[j] - mu[j]));
    store_floats<V>(grad_x.data + p * grad_x.stride + ch0, item.g);
  };
  for_each_thread_pixel<GradAndInput<V>>(begin, end, ty, rows, load, finish);
}

// Pass 1 of sync phases 1 and 2: per block and channel, the sum of x (Centered = false) or of
// (x - mean)^2 with mean = sums / total_pixels (Centered) -> partials[b][ch].
template <bool Centered, int V>
__global__ void __launch_bounds__(kThreads)
    channel_sums_kernel(ConstAct x, const float* sums, double total_pixels, int pixel_blocks, float* partials) {
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
    auto load = [&](size_t p, size_t, float (&v)[V]) { load_floats<V>(x.data + p * x.stride + ch0, v); };
    auto accumulate = [&](size_t, const float (&v)[V]) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if constexpr (Centered) {
          float d = v[j] - mu[j];
          sum[j] += d * d;
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

template <Activation A, int V>
void launch_apply(const Tiling& t, ConstAct x, Act y, const float* mean, const float* var, const float* gamma,
                  const float* beta, cudaStream_t stream) {
  const int pixel_blocks = apply_pixel_blocks(x.pixels(), t);
  LAUNCH((apply_kernel<A, V>), dim3(unsigned(pixel_blocks), unsigned(t.channel_blocks)),
         dim3(unsigned(t.lanes), unsigned(t.rows)), 0, stream, x, y, pixel_blocks, mean, var, gamma, beta);
}

template <Activation A>
void forward_training_cuda(ConstAct x, const float* gamma, const float* beta, Act y, float* saved_mean,
                           float* saved_var, float* running_mean, float* running_var, float* partials,
                           cudaStream_t stream) {
  const bool vec4 = float4_view(x) && float4_view(y);
  const Tiling t = tiling_for(x.c, vec4);
  const int blocks = stats_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  float* counts = partials + size_t(blocks) * size_t(x.c) * 2;
  if (vec4) LAUNCH(forward_stats_kernel<4>, grid, block, 0, stream, x, blocks, partials, counts);
  else LAUNCH(forward_stats_kernel<1>, grid, block, 0, stream, x, blocks, partials, counts);
  LAUNCH(forward_finalize_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)),
         dim3(kFinalizeChannels, kFinalizeRows), 0, stream, x.c, x.pixels(), blocks,
         static_cast<const float*>(partials), static_cast<const float*>(counts), saved_mean, saved_var, running_mean,
         running_var);
  if (vec4) launch_apply<A, 4>(t, x, y, saved_mean, saved_var, gamma, beta, stream);
  else launch_apply<A, 1>(t, x, y, saved_mean, saved_var, gamma, beta, stream);
}

bool backward_vec4(Activation act, const ConstAct& y, const ConstAct& grad_y, const ConstAct& x) {
  return float4_view(grad_y) && float4_view(x) && (act == Activation::Linear || float4_view(y));
}

// Backward passes 1 and 2: grad_gamma, grad_beta (and sums2 when set) of x's pixels.
template <Activation A>
void backward_sums_cuda(bool vec4, ConstAct y, ConstAct grad_y, ConstAct x, const float* saved_mean,
                        const float* saved_var, float* grad_gamma, float* grad_beta, float* sums2, float* partials,
                        cudaStream_t stream) {
  const Tiling t = tiling_for(x.c, vec4);
  const int blocks = stats_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  if (vec4) LAUNCH((backward_stats_kernel<A, 4>), grid, block, 0, stream, y, grad_y, x, saved_mean, blocks, partials);
  else LAUNCH((backward_stats_kernel<A, 1>), grid, block, 0, stream, y, grad_y, x, saved_mean, blocks, partials);
  LAUNCH(backward_finalize_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)),
         dim3(kFinalizeChannels, kFinalizeRows), 0, stream, x.c, blocks, static_cast<const float*>(partials),
         saved_var, grad_gamma, grad_beta, sums2);
}

// Backward pass 3 over x's pixels, with sums of g and g xhat over 1/inv_m pixels.
template <Activation A>
void backward_apply_cuda(bool vec4, ConstAct y, ConstAct grad_y, ConstAct x, Act grad_x, float inv_m,
                         const float* gamma, const float* saved_mean, const float* saved_var,
                         const float* sum_g_xhat, const float* sum_g, cudaStream_t stream) {
  const Tiling t = tiling_for(x.c, vec4);
  const int apply_blocks = apply_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(apply_blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  if (vec4)
    LAUNCH((backward_apply_kernel<A, 4>), grid, block, 0, stream, y, grad_y, x, grad_x, apply_blocks, inv_m, gamma,
           saved_mean, saved_var, sum_g_xhat, sum_g);
  else
    LAUNCH((backward_apply_kernel<A, 1>), grid, block, 0, stream, y, grad_y, x, grad_x, apply_blocks, inv_m, gamma,
           saved_mean, saved_var, sum_g_xhat, sum_g);
}

template <Activation A>
void backward_cuda(ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma, const float* saved_mean,
                   const float* saved_var, Act grad_x, float* grad_gamma, float* grad_beta, float* partials,
                   cudaStream_t stream) {
  const bool vec4 = backward_vec4(A, y, grad_y, x) && float4_view(grad_x);
  backward_sums_cuda<A>(vec4, y, grad_y, x, saved_mean, saved_var, grad_gamma, grad_beta, nullptr, partials, stream);
  backward_apply_cuda<A>(vec4, y, grad_y, x, grad_x, 1.0f / float(x.pixels()), gamma, saved_mean, saved_var,
                         grad_gamma, grad_beta, stream);
}

// Sync phases 1 and 2: per-channel sums of x, or of (x - sums/total_pixels)^2 (Centered).
template <bool Centered>
void channel_sums_cuda(ConstAct x, const float* sums, double total_pixels, float* out, float* partials,
                       cudaStream_t stream) {
  const bool vec4 = float4_view(x);
  const Tiling t = tiling_for(x.c, vec4);
  const int blocks = stats_pixel_blocks(x.pixels(), t);
  const dim3 grid(unsigned(blocks), unsigned(t.channel_blocks)), block(unsigned(t.lanes), unsigned(t.rows));
  if (vec4) LAUNCH((channel_sums_kernel<Centered, 4>), grid, block, 0, stream, x, sums, total_pixels, blocks, partials);
  else LAUNCH((channel_sums_kernel<Centered, 1>), grid, block, 0, stream, x, sums, total_pixels, blocks, partials);
  LAUNCH(sum_partials_kernel, dim3(ceil_div(size_t(x.c), kFinalizeChannels)), dim3(kFinalizeChannels, kFinalizeRows),
         0, stream, x.c, blocks, static_cast<const float*>(partials), out);
}

}  // namespace

// ---- public entry points --------------------------------------------------------------------

size_t batchnorm_workspace_bytes(int n, int h, int w, int c) {
  if (n < 0 || h < 0 || w < 0 || c < 0)
    throw Error("batchnorm_workspace_bytes: negative size " + std::to_string(n) + "x" + std::to_string(h) + "x" +
                std::to_string(w) + "x" + std::to_string(c));
  size_t pixels = size_t(n) * size_t(h) * size_t(w);
  if (pixels == 0 || c == 0) return 0;
  size_t blocks = size_t(max_stats_pixel_blocks(pixels, c));
  return (blocks * size_t(c) * 2 + blocks) * sizeof(float);  // partials [block][c][2], counts [block]
}

template <typename T>
void batchnorm_activation_forward_training_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                     const T* beta, NhwcView<T> y, T* saved_mean, T* saved_var,
                                                     T* running_mean, T* running_var) {
  check_forward_training("batchnorm_activation_forward_training_reference", x, gamma, beta, y, saved_mean, saved_var,
                         running_mean, running_var);
  const double m = double(x.pixels());
  for (int ch = 0; ch < x.c; ++ch) {
    double sum = 0, squares = 0;
    for (int b = 0; b < x.n; ++b)
      for (int i = 0; i < x.h; ++i)
        for (int j = 0; j < x.w; ++j) sum += double(x.data[x.at(b, i, j, ch)]);
    double mean = sum / m;
    for (int b = 0; b < x.n; ++b)
      for (int i = 0; i < x.h; ++i)
        for (int j = 0; j < x.w; ++j) {
          double d = double(x.data[x.at(b, i, j, ch)]) - mean;
          squares += d * d;
        }
    finish_channel_reference(act, ch, mean, squares / m, m, x, gamma, beta, y, saved_mean, saved_var, running_mean,
                             running_var);
  }
}

template <typename T>
void batchnorm_activation_forward_inference_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                      const T* beta, const T* running_mean, const T* running_var,
                                                      NhwcView<T> y) {
  check_forward_inference("batchnorm_activation_forward_inference_reference", x, gamma, beta, running_mean,
                          running_var, y);
  for (int b = 0; b < x.n; ++b)
    for (int i = 0; i < x.h; ++i)
      for (int j = 0; j < x.w; ++j)
        for (int ch = 0; ch < x.c; ++ch) {
          T inv_std = T(1) / std::sqrt(running_var[ch] + T(kBatchNormEpsilon));
          y.data[y.at(b, i, j, ch)] =
              activate(act, gamma[ch] * (x.data[x.at(b, i, j, ch)] - running_mean[ch]) * inv_std + beta[ch]);
        }
}

template <typename T>
void batchnorm_activation_backward_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                             NhwcView<const T> x, const T* gamma, const T* saved_mean,
                                             const T* saved_var, NhwcView<T> grad_x, T* grad_gamma, T* grad_beta) {
  check_backward("batchnorm_activation_backward_reference", act, y, grad_y, x, gamma, saved_mean, saved_var, grad_x,
                 grad_gamma, grad_beta);
  for (int ch = 0; ch < x.c; ++ch) {
    ChannelGradSums sums = backward_channel_sums_reference(act, y, grad_y, x, saved_mean, saved_var, ch);
    backward_channel_apply_reference(act, y, grad_y, x, gamma, saved_mean, saved_var, ch, double(x.pixels()), sums,
                                     grad_x);
    grad_beta[ch] = T(sums.g);
    grad_gamma[ch] = T(sums.g_xhat);
  }
}

void batchnorm_activation_forward_training_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                               Act y, float* saved_mean, float* saved_var, float* running_mean,
                                               float* running_var, void* /*workspace*/, size_t /*workspace_bytes*/) {
  check_forward_training("batchnorm_activation_forward_training_cpu", x, gamma, beta, y, saved_mean, saved_var,
                         running_mean, running_var);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    forward_training_cpu<A>(x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var);
  });
}

void batchnorm_activation_forward_inference_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                const float* running_mean, const float* running_var, Act y) {
  check_forward_inference("batchnorm_activation_forward_inference_cpu", x, gamma, beta, running_mean, running_var, y);
  if (x.elements() == 0) return;
  std::vector<float> scale(static_cast<size_t>(x.c));
  for (int ch = 0; ch < x.c; ++ch)
    scale[size_t(ch)] = float(gamma[ch] / std::sqrt(double(running_var[ch]) + kBatchNormEpsilon));
  with_activation(act, "batchnorm", [&]<Activation A>() { apply_cpu<A>(x, y, running_mean, scale.data(), beta); });
}

void batchnorm_activation_backward_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma,
                                       const float* saved_mean, const float* saved_var, Act grad_x,
                                       float* grad_gamma, float* grad_beta, void* /*workspace*/,
                                       size_t /*workspace_bytes*/) {
  check_backward("batchnorm_activation_backward_cpu", act, y, grad_y, x, gamma, saved_mean, saved_var, grad_x,
                 grad_gamma, grad_beta);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_cpu<A>(y, grad_y, x, gamma, saved_mean, saved_var, grad_x, grad_gamma, grad_beta);
  });
}

void batchnorm_activation_forward_training_cuda(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                Act y, float* saved_mean, float* saved_var, float* running_mean,
                                                float* running_var, void* workspace, size_t workspace_bytes,
                                                cudaStream_t stream) {
  const char* op = "batchnorm_activation_forward_training_cuda";
  check_forward_training(op, x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    forward_training_cuda<A>(x, gamma, beta, y, saved_mean, saved_var, running_mean, running_var,
                             static_cast<float*>(workspace), stream);
  });
}

void batchnorm_activation_forward_inference_cuda(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                 const float* running_mean, const float* running_var, Act y,
                                                 cudaStream_t stream) {
  check_forward_inference("batchnorm_activation_forward_inference_cuda", x, gamma, beta, running_mean, running_var,
                          y);
  if (x.elements() == 0) return;
  const bool vec4 = float4_view(x) && float4_view(y);
  const Tiling t = tiling_for(x.c, vec4);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    if (vec4) launch_apply<A, 4>(t, x, y, running_mean, running_var, gamma, beta, stream);
    else launch_apply<A, 1>(t, x, y, running_mean, running_var, gamma, beta, stream);
  });
}

void batchnorm_activation_backward_cuda(Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma,
                                        const float* saved_mean, const float* saved_var, Act grad_x,
                                        float* grad_gamma, float* grad_beta, void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream) {
  const char* op = "batchnorm_activation_backward_cuda";
  check_backward(op, act, y, grad_y, x, gamma, saved_mean, saved_var, grad_x, grad_gamma, grad_beta);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_cuda<A>(y, grad_y, x, gamma, saved_mean, saved_var, grad_x, grad_gamma, grad_beta,
                     static_cast<float*>(workspace), stream);
  });
}

// ---- synchronized batchnorm phases ----

template <typename T>
void batchnorm_sums_reference(NhwcView<const T> x, T* sums) {
  check_sums("batchnorm_sums_reference", x, sums);
  for (int ch = 0; ch < x.c; ++ch) {
    double sum = 0;
    for (int b = 0; b < x.n; ++b)
      for (int i = 0; i < x.h; ++i)
        for (int j = 0; j < x.w; ++j) sum += double(x.data[x.at(b, i, j, ch)]);
    sums[ch] = T(sum);
  }
}

template <typename T>
void batchnorm_centered_squares_reference(NhwcView<const T> x, const T* sums, double total_pixels, T* squares) {
  check_centered_squares("batchnorm_centered_squares_reference", x, sums, total_pixels, squares);
  for (int ch = 0; ch < x.c; ++ch) {
    double mean = double(sums[ch]) / total_pixels, sum = 0;
    for (int b = 0; b < x.n; ++b)
      for (int i = 0; i < x.h; ++i)
        for (int j = 0; j < x.w; ++j) {
          double d = double(x.data[x.at(b, i, j, ch)]) - mean;
          sum += d * d;
        }
    squares[ch] = T(sum);
  }
}

template <typename T>
void batchnorm_activation_forward_from_sums_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                      const T* beta, NhwcView<T> y, const T* sums, const T* squares,
                                                      double total_pixels, T* saved_mean, T* saved_var,
                                                      T* running_mean, T* running_var) {
  check_forward_from_sums("batchnorm_activation_forward_from_sums_reference", x, gamma, beta, y, sums, squares,
                          total_pixels, saved_mean, saved_var, running_mean, running_var);
  const double m = total_pixels;
  for (int ch = 0; ch < x.c; ++ch)
    finish_channel_reference(act, ch, double(sums[ch]) / m, double(squares[ch]) / m, m, x, gamma, beta, y, saved_mean,
                             saved_var, running_mean, running_var);
}

template <typename T>
void batchnorm_activation_backward_sums_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                                  NhwcView<const T> x, const T* saved_mean, const T* saved_var,
                                                  T* grad_gamma, T* grad_beta, T* sums2) {
  check_backward_sums("batchnorm_activation_backward_sums_reference", act, y, grad_y, x, saved_mean, saved_var,
                      grad_gamma, grad_beta, sums2);
  for (int ch = 0; ch < x.c; ++ch) {
    ChannelGradSums sums = backward_channel_sums_reference(act, y, grad_y, x, saved_mean, saved_var, ch);
    grad_beta[ch] = sums2[ch] = T(sums.g);
    grad_gamma[ch] = sums2[x.c + ch] = T(sums.g_xhat);
  }
}

template <typename T>
void batchnorm_activation_backward_apply_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                                   NhwcView<const T> x, const T* gamma, const T* saved_mean,
                                                   const T* saved_var, const T* sums2, double total_pixels,
                                                   NhwcView<T> grad_x) {
  check_backward_apply("batchnorm_activation_backward_apply_reference", act, y, grad_y, x, gamma, saved_mean,
                       saved_var, sums2, total_pixels, grad_x);
  for (int ch = 0; ch < x.c; ++ch)
    backward_channel_apply_reference(act, y, grad_y, x, gamma, saved_mean, saved_var, ch, total_pixels,
                                     ChannelGradSums{double(sums2[ch]), double(sums2[x.c + ch])}, grad_x);
}

void batchnorm_sums_cpu(ConstAct x, float* sums, void* /*workspace*/, size_t /*workspace_bytes*/) {
  check_sums("batchnorm_sums_cpu", x, sums);
  if (x.c == 0) return;
  std::vector<double> total = channel_sums_cpu(x, [](int, float v) { return double(v); });
  for (int ch = 0; ch < x.c; ++ch) sums[ch] = float(total[size_t(ch)]);
}

void batchnorm_centered_squares_cpu(ConstAct x, const float* sums, double total_pixels, float* squares,
                                    void* /*workspace*/, size_t /*workspace_bytes*/) {
  check_centered_squares("batchnorm_centered_squares_cpu", x, sums, total_pixels, squares);
  if (x.c == 0) return;
  std::vector<double> mean(static_cast<size_t>(x.c));
  for (int ch = 0; ch < x.c; ++ch) mean[size_t(ch)] = double(sums[ch]) / total_pixels;
  std::vector<double> total = channel_sums_cpu(x, [&](int ch, float v) {
    double d = double(v) - mean[size_t(ch)];
    return d * d;
  });
  for (int ch = 0; ch < x.c; ++ch) squares[ch] = float(total[size_t(ch)]);
}

void batchnorm_activation_forward_from_sums_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                Act y, const float* sums, const float* squares, double total_pixels,
                                                float* saved_mean, float* saved_var, float* running_mean,
                                                float* running_var) {
  check_forward_from_sums("batchnorm_activation_forward_from_sums_cpu", x, gamma, beta, y, sums, squares,
                          total_pixels, saved_mean, saved_var, running_mean, running_var);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    forward_from_sums_cpu<A>(x, gamma, beta, y, sums, squares, total_pixels, saved_mean, saved_var, running_mean,
                             running_var);
  });
}

void batchnorm_activation_backward_sums_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                            const float* saved_mean, const float* saved_var, float* grad_gamma,
                                            float* grad_beta, float* sums2, void* /*workspace*/,
                                            size_t /*workspace_bytes*/) {
  check_backward_sums("batchnorm_activation_backward_sums_cpu", act, y, grad_y, x, saved_mean, saved_var, grad_gamma,
                      grad_beta, sums2);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_sums_phase_cpu<A>(y, grad_y, x, saved_mean, saved_var, grad_gamma, grad_beta, sums2);
  });
}

void batchnorm_activation_backward_apply_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                             const float* gamma, const float* saved_mean, const float* saved_var,
                                             const float* sums2, double total_pixels, Act grad_x) {
  check_backward_apply("batchnorm_activation_backward_apply_cpu", act, y, grad_y, x, gamma, saved_mean, saved_var,
                       sums2, total_pixels, grad_x);
  if (x.c == 0) return;
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_apply_phase_cpu<A>(y, grad_y, x, gamma, saved_mean, saved_var, sums2, total_pixels, grad_x);
  });
}

void batchnorm_sums_cuda(ConstAct x, float* sums, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "batchnorm_sums_cuda";
  check_sums(op, x, sums);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  channel_sums_cuda<false>(x, nullptr, 0.0, sums, static_cast<float*>(workspace), stream);
}

void batchnorm_centered_squares_cuda(ConstAct x, const float* sums, double total_pixels, float* squares,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "batchnorm_centered_squares_cuda";
  check_centered_squares(op, x, sums, total_pixels, squares);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  channel_sums_cuda<true>(x, sums, total_pixels, squares, static_cast<float*>(workspace), stream);
}

void batchnorm_activation_forward_from_sums_cuda(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                 Act y, const float* sums, const float* squares, double total_pixels,
                                                 float* saved_mean, float* saved_var, float* running_mean,
                                                 float* running_var, cudaStream_t stream) {
  check_forward_from_sums("batchnorm_activation_forward_from_sums_cuda", x, gamma, beta, y, sums, squares,
                          total_pixels, saved_mean, saved_var, running_mean, running_var);
  if (x.c == 0) return;
  LAUNCH(from_sums_finalize_kernel, dim3(ceil_div(size_t(x.c), kThreads)), dim3(kThreads), 0, stream, x.c,
         total_pixels, sums, squares, saved_mean, saved_var, running_mean, running_var);
  const bool vec4 = float4_view(x) && float4_view(y);
  const Tiling t = tiling_for(x.c, vec4);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    if (vec4) launch_apply<A, 4>(t, x, y, saved_mean, saved_var, gamma, beta, stream);
    else launch_apply<A, 1>(t, x, y, saved_mean, saved_var, gamma, beta, stream);
  });
}

void batchnorm_activation_backward_sums_cuda(Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                             const float* saved_mean, const float* saved_var, float* grad_gamma,
                                             float* grad_beta, float* sums2, void* workspace, size_t workspace_bytes,
                                             cudaStream_t stream) {
  const char* op = "batchnorm_activation_backward_sums_cuda";
  check_backward_sums(op, act, y, grad_y, x, saved_mean, saved_var, grad_gamma, grad_beta, sums2);
  check_workspace(op, x, workspace, workspace_bytes);
  if (x.c == 0) return;
  const bool vec4 = backward_vec4(act, y, grad_y, x);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_sums_cuda<A>(vec4, y, grad_y, x, saved_mean, saved_var, grad_gamma, grad_beta, sums2,
                          static_cast<float*>(workspace), stream);
  });
}

void batchnorm_activation_backward_apply_cuda(Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                              const float* gamma, const float* saved_mean, const float* saved_var,
                                              const float* sums2, double total_pixels, Act grad_x,
                                              cudaStream_t stream) {
  check_backward_apply("batchnorm_activation_backward_apply_cuda", act, y, grad_y, x, gamma, saved_mean, saved_var,
                       sums2, total_pixels, grad_x);
  if (x.c == 0) return;
  const bool vec4 = backward_vec4(act, y, grad_y, x) && float4_view(grad_x);
  with_activation(act, "batchnorm", [&]<Activation A>() {
    backward_apply_cuda<A>(vec4, y, grad_y, x, grad_x, float(1.0 / total_pixels), gamma, saved_mean, saved_var,
                           sums2 + x.c, sums2, stream);
  });
}

#define INSTANTIATE(T)                                                                                          \
  template void batchnorm_activation_forward_training_reference<T>(Activation, NhwcView<const T>, const T*,     \
                                                                   const T*, NhwcView<T>, T*, T*, T*, T*);      \
  template void batchnorm_activation_forward_inference_reference<T>(Activation, NhwcView<const T>, const T*,    \
                                                                    const T*, const T*, const T*, NhwcView<T>); \
  template void batchnorm_activation_backward_reference<T>(Activation, NhwcView<const T>, NhwcView<const T>,    \
                                                           NhwcView<const T>, const T*, const T*, const T*,     \
                                                           NhwcView<T>, T*, T*);                                \
  template void batchnorm_sums_reference<T>(NhwcView<const T>, T*);                                             \
  template void batchnorm_centered_squares_reference<T>(NhwcView<const T>, const T*, double, T*);               \
  template void batchnorm_activation_forward_from_sums_reference<T>(Activation, NhwcView<const T>, const T*,    \
                                                                    const T*, NhwcView<T>, const T*, const T*,  \
                                                                    double, T*, T*, T*, T*);                    \
  template void batchnorm_activation_backward_sums_reference<T>(Activation, NhwcView<const T>,                  \
                                                                NhwcView<const T>, NhwcView<const T>, const T*, \
                                                                const T*, T*, T*, T*);                          \
  template void batchnorm_activation_backward_apply_reference<T>(Activation, NhwcView<const T>,                 \
                                                                 NhwcView<const T>, NhwcView<const T>,          \
                                                                 const T*, const T*, const T*, const T*, double, \
                                                                 NhwcView<T>);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace yolo
