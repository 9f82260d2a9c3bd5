// Shared pieces of the batchnorm tests (fused ops and --sync-bn phases): inputs, parameters and
// the double reference training forward and backward they are checked against.
#pragma once
#include <cmath>
#include <vector>

#include "kernels/batchnorm.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

namespace yolo::testing {

inline constexpr Activation kAllKinds[] = {Activation::Linear, Activation::Leaky, Activation::Relu,
                                           Activation::Logistic};

// Inputs with per-channel offsets and spreads (means far from 0 test the stable statistics).
inline std::vector<float> channel_data(Rng& rng, const Slice& l) {
  std::vector<float> offset(size_t(l.stride)), spread(size_t(l.stride));
  for (int ch = 0; ch < l.stride; ++ch)
    offset[size_t(ch)] = rng.uniform(-3.0f, 3.0f), spread[size_t(ch)] = rng.uniform(0.2f, 2.0f);
  std::vector<float> x(l.size());
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = offset[i % size_t(l.stride)] + spread[i % size_t(l.stride)] * rng.uniform(-1.0f, 1.0f);
  return x;
}

// The values rounded to bf16, those below fp16's normal range made 0: exact in both formats, so
// a 16-bit op reads what the FP32 op reads.
inline std::vector<float> exact_in_16_bits(const std::vector<float>& v) {
  std::vector<float> out = widened(stored<Bf16>(v));
  for (float& e : out)
    if (std::fabs(e) < 0x1p-14f) e = 0.0f;
  return out;
}

// gamma (a quarter of it negative), beta and running statistics.
struct Params {
  std::vector<float> gamma, beta, running_mean, running_var;
};
inline Params random_params(Rng& rng, int c) {
  Params p;
  p.gamma = rng.floats(size_t(c), 0.5f, 1.5f);
  for (float& g : p.gamma)
    if (rng.integer(0, 3) == 0) g = -g;
  p.beta = rng.floats(size_t(c), -0.5f, 0.5f);
  p.running_mean = rng.floats(size_t(c), -1.0f, 1.0f);
  p.running_var = rng.floats(size_t(c), 0.5f, 1.5f);
  return p;
}

// The reference training forward in double on a contiguous copy x of the whole batch.
struct ForwardRef {
  std::vector<double> y, mean, var, running_mean, running_var;
};
inline ForwardRef reference_training(Activation act, const std::vector<double>& x, const Slice& l, const Params& p) {
  ForwardRef r;
  const size_t c = size_t(l.c);
  r.y.resize(x.size());
  r.mean.resize(c), r.var.resize(c);
  r.running_mean = to_double(p.running_mean), r.running_var = to_double(p.running_var);
  std::vector<double> gamma = to_double(p.gamma), beta = to_double(p.beta);
  batchnorm_activation_forward_training_reference<double>(
      act, nhwc<const double>(x.data(), l.n, l.h, l.w, l.c), gamma.data(), beta.data(),
      nhwc(r.y.data(), l.n, l.h, l.w, l.c), r.mean.data(), r.var.data(), r.running_mean.data(), r.running_var.data());
  return r;
}

// The reference training forward's outputs as a backward gets them, in float: y in x's wide
// layout (x outside the slice) and the saved statistics.
struct SavedForward {
  std::vector<float> y, mean, var;
};
inline SavedForward saved_forward(Activation act, const std::vector<float>& x, const Slice& l, const Params& p) {
  ForwardRef fwd = reference_training(act, gather<double>(x, l), l, p);
  SavedForward s{x, std::vector<float>(fwd.mean.begin(), fwd.mean.end()),
                 std::vector<float>(fwd.var.begin(), fwd.var.end())};
  scatter(s.y, l, fwd.y);
  return s;
}

// The reference backward in double over images [first, first + images) of the batch (x, grad_y
// and fwd.y wide buffers of slice l).
struct BackwardRef {
  std::vector<double> grad_x, grad_gamma, grad_beta;
};
inline BackwardRef reference_backward(Activation act, const Slice& l, const std::vector<float>& x,
                                      const std::vector<float>& grad_y, const SavedForward& fwd,
                                      const std::vector<float>& gamma, int first, int images) {
  const size_t c = size_t(l.c), begin = size_t(first) * size_t(l.h) * size_t(l.w) * c;
  std::vector<double> xd = gather<double>(x, l), yd = gather<double>(fwd.y, l), gyd = gather<double>(grad_y, l),
                      gammad = to_double(gamma), meand = to_double(fwd.mean), vard = to_double(fwd.var);
  BackwardRef r{std::vector<double>(size_t(images) * size_t(l.h) * size_t(l.w) * c), std::vector<double>(c),
                std::vector<double>(c)};
  auto view = [&](const std::vector<double>& v) { return nhwc<const double>(v.data() + begin, images, l.h, l.w, l.c); };
  batchnorm_activation_backward_reference<double>(act, view(yd), view(gyd), view(xd), gammad.data(), meand.data(),
                                                  vard.data(), nhwc(r.grad_x.data(), images, l.h, l.w, l.c),
                                                  r.grad_gamma.data(), r.grad_beta.data());
  return r;
}

}  // namespace yolo::testing
