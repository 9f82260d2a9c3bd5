// Batchnorm (+ activation): the naive references (double accumulation, any T) and the fast CPU
// version. CPU: fixed pixel chunks (a function of the shape, not of the thread count), double
// accumulators per chunk, chunks combined in order, so the bits do not depend on the threads.
// The CUDA kernels: batchnorm.cu; the checks both share: batchnorm_shared.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/batchnorm_shared.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"

namespace yolo {

using namespace batchnorm_detail;

namespace {

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

// The activations the per-ISA channel loops have (kernels/cpu_micro.h); the others run the generic
// loops below.
template <Activation A>
constexpr bool kHasChannelLoops = A == Activation::Linear || A == Activation::Leaky;

// y = act((x - mean) * scale + beta) over the chunks.
template <Activation A>
void apply_cpu(ConstAct x, Act y, const float* mean, const float* scale, const float* beta) {
  CpuChunks chunks = cpu_chunks(x.pixels(), x.c);
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  const cpu_micro::ChannelLoops& loops = tiles.channels;
  if (kHasChannelLoops<A>) count_cpu_kernel(CpuKernel::BatchnormForward, static_cast<CpuIsa>(tiles.variant));
  parallel_for(chunks.count, [&](size_t k) {
    const size_t p0 = chunks.begin(k), count = chunks.end(k) - p0;
    const float* in = x.data + p0 * size_t(x.stride);
    float* out = y.data + p0 * size_t(y.stride);
    if constexpr (kHasChannelLoops<A>) {
      loops.normalize(in, size_t(x.stride), out, size_t(y.stride), count, x.c, mean, scale, beta,
                      A == Activation::Leaky);
      return;
    }
    for (size_t p = 0; p < count; ++p, in += x.stride, out += y.stride)
      map_channels(in, out, x.c, [&](int ch, float v) { return activate<A>((v - mean[ch]) * scale[ch] + beta[ch]); });
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
  // Per chunk, the sums of x - shift and its squares (shift: the first pixel, near the mean, so
  // the squares lose little to cancellation), in double; then each chunk's mean and m2.
  const std::vector<float> shift = x.pixels() ? std::vector<float>(x.data, x.data + c) : std::vector<float>(size_t(c));
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  const cpu_micro::ChannelLoops& loops = tiles.channels;
  count_cpu_kernel(CpuKernel::BatchnormForward, static_cast<CpuIsa>(tiles.variant));
  std::vector<double> partial(chunks.count * size_t(c) * 2);  // per chunk: mean[c], m2[c] (relative to shift)
  parallel_for(chunks.count, [&](size_t k) {
    double* mean = &partial[k * size_t(c) * 2];
    double* m2 = mean + c;
    const size_t p0 = chunks.begin(k), n = chunks.end(k) - p0;
    loops.moments(x.data + p0 * size_t(x.stride), size_t(x.stride), n, c, shift.data(), mean, m2);
    for (int ch = 0; ch < c; ++ch) {
      const double sum = mean[ch];
      mean[ch] = sum / double(n);
      m2[ch] -= sum * mean[ch];
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
    finish_channel_cpu(ch, double(shift[size_t(ch)]) + mean, std::max(0.0, m2) / m, m, gamma, saved_mean, saved_var,
                       running_mean, running_var, mean_f, scale);
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
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  if (kHasChannelLoops<A>) count_cpu_kernel(CpuKernel::BatchnormBackward, static_cast<CpuIsa>(tiles.variant));
  parallel_for(chunks.count, [&](size_t k) {
    double* sum_g = &partial[k * size_t(c) * 2];
    double* sum_gx = sum_g + c;
    if constexpr (kHasChannelLoops<A>) {
      const size_t p0 = chunks.begin(k);
      // Linear reads no y (which may then be empty): grad_y stands in.
      const ConstAct& yv = A == Activation::Leaky ? y : grad_y;
      tiles.channels.grad_sums(yv.data + p0 * size_t(yv.stride), size_t(yv.stride),
                               grad_y.data + p0 * size_t(grad_y.stride), size_t(grad_y.stride),
                               x.data + p0 * size_t(x.stride), size_t(x.stride), chunks.end(k) - p0, c, saved_mean,
                               A == Activation::Leaky, sum_g, sum_gx);
      return;
    }
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
  const cpu_micro::ChannelLoops& loops = cpu_micro_tiles().channels;
  parallel_for(chunks.count, [&](size_t k) {
    if constexpr (kHasChannelLoops<A>) {
      const size_t p0 = chunks.begin(k);
      const ConstAct& yv = A == Activation::Leaky ? y : grad_y;  // as in backward_sums_cpu
      loops.grad_apply(yv.data + p0 * size_t(yv.stride), size_t(yv.stride), grad_y.data + p0 * size_t(grad_y.stride),
                       size_t(grad_y.stride), x.data + p0 * size_t(x.stride), size_t(x.stride),
                       grad_x.data + p0 * size_t(grad_x.stride), size_t(grad_x.stride), chunks.end(k) - p0, x.c,
                       saved_mean, a.data(), g_mean.data(), kx.data(), A == Activation::Leaky);
      return;
    }
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

}  // namespace

// ---- public entry points


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
