// Batchnorm (+ activation) on 16-bit tensors (--precision bf16/fp16): x, y and the gradients in
// Bf16/Fp16, the statistics, gamma/beta and their gradients in FP32. The oracle is the FP32 CUDA
// op (itself checked against the double reference in test_kernel_batchnorm.cpp) run on the
// widened inputs: the 16-bit op reads the same FP32 values, sums them in the same order and
// computes in the same exactly rounded steps (kernels/exact_math.cuh), so its statistics are the
// FP32 op's bits and its outputs the FP32 op's rounded once to T, exactly (a wrong rounding mode
// misses about half; an FMA fused in one instantiation only shows in the 1-pixel batch, where
// g - grad_beta/m cancels). Fused training forward and backward, inference, the --sync-bn
// phases, a 1-pixel batch's exact zero gradient, and Inf/NaN propagation (the FP16 loss scale
// relies on it).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "tests/batchnorm_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// A channel slice at an 8-byte-aligned offset (4 channels per access in 16 bits), one at an odd
// offset (one channel per access), a dense tensor, and a 1-pixel batch.
const Slice kStorageSlices[] = {{2, 5, 7, 12, 16, 4}, {3, 7, 5, 13, 16, 1}, {2, 9, 11, 24, 24, 0}, {1, 1, 1, 5, 7, 2}};

// The slice's elements of a wide buffer, in order; CHECKs that the rest still holds the poison.
template <typename T>
std::vector<T> slice_of(const std::vector<T>& wide, const Slice& l) {
  std::vector<T> out;
  for (size_t i = 0; i < wide.size(); ++i) {
    const int ch = int(i % size_t(l.stride));
    if (ch >= l.offset && ch < l.offset + l.c) out.push_back(wide[i]);
    else CHECK(wide[i].bits == 0xffff);
  }
  return out;
}
std::vector<float> slice_of_floats(const std::vector<float>& wide, const Slice& l) {
  std::vector<float> out;
  for (size_t i = 0; i < wide.size(); ++i) {
    const int ch = int(i % size_t(l.stride));
    if (ch >= l.offset && ch < l.offset + l.c) out.push_back(wide[i]);
  }
  return out;
}

// The per-channel arrays the forward writes (or the backward's gradients), poisoned first.
struct ChannelArrays {
  DeviceArray<float> a, b, running_mean, running_var;
};

constexpr double kStatTolerance = 0;  // the same FP32 sums in the same order and steps: the same bits

template <typename T>
void check_training_forward_storage(Device device, Rng& rng, const Slice& l, Activation act) {
  const size_t c = size_t(l.c);
  const std::vector<T> x16 = stored<T>(channel_data(rng, l));
  const std::vector<float> x32 = widened(x16);
  const Params p = random_params(rng, l.c);
  const size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> d_gamma(device, p.gamma), d_beta(device, p.beta);
  // FP32 oracle on the widened x, then the op in T.
  DeviceArray<float> d_x32(device, x32), d_y32(device, l.size());
  ChannelArrays want{DeviceArray<float>(device, c), DeviceArray<float>(device, c),
                     DeviceArray<float>(device, p.running_mean), DeviceArray<float>(device, p.running_var)};
  batchnorm_activation_forward_training_cuda(act, l.on<const float>(d_x32.data()), d_gamma.data(), d_beta.data(),
                                             l.on(d_y32.data()), want.a.data(), want.b.data(),
                                             want.running_mean.data(), want.running_var.data(), workspace.data(),
                                             workspace_bytes, nullptr);
  DeviceArray<T> d_x(device, x16), d_y(device, l.size());
  ChannelArrays got{DeviceArray<float>(device, c), DeviceArray<float>(device, c),
                    DeviceArray<float>(device, p.running_mean), DeviceArray<float>(device, p.running_var)};
  d_y.poison(), got.a.poison(), got.b.poison();
  batchnorm_activation_forward_training_cuda<T>(act, l.on<const T>(d_x.data()), d_gamma.data(), d_beta.data(),
                                                l.on<T>(d_y.data()), got.a.data(), got.b.data(),
                                                got.running_mean.data(), got.running_var.data(), workspace.data(),
                                                workspace_bytes, nullptr);
  const std::vector<T> y = d_y.download();
  check_rounded_once(slice_of(y, l), slice_of_floats(d_y32.download(), l), 0, 1.0);
  CHECK_CLOSE(got.a.download(), to_double(want.a.download()), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.b.download(), to_double(want.b.download()), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.running_mean.download(), to_double(want.running_mean.download()), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.running_var.download(), to_double(want.running_var.download()), kStatTolerance, kStatTolerance);

  // Inference from the running statistics the forward left, against the FP32 op.
  d_y.poison(), d_y32.poison();
  batchnorm_activation_forward_inference_cuda(act, l.on<const float>(d_x32.data()), d_gamma.data(), d_beta.data(),
                                              want.running_mean.data(), want.running_var.data(), l.on(d_y32.data()),
                                              nullptr);
  batchnorm_activation_forward_inference_cuda<T>(act, l.on<const T>(d_x.data()), d_gamma.data(), d_beta.data(),
                                                 want.running_mean.data(), want.running_var.data(),
                                                 l.on<T>(d_y.data()), nullptr);
  check_rounded_once(slice_of(d_y.download(), l), slice_of_floats(d_y32.download(), l), 0, 1.0);
  // The same bits again.
  d_y.poison();
  batchnorm_activation_forward_training_cuda<T>(act, l.on<const T>(d_x.data()), d_gamma.data(), d_beta.data(),
                                                l.on<T>(d_y.data()), got.a.data(), got.b.data(), nullptr, nullptr,
                                                workspace.data(), workspace_bytes, nullptr);
  CHECK(same_bits(d_y.download(), y));
}

template <typename T>
void check_backward_storage(Device device, Rng& rng, const Slice& l, Activation act) {
  const size_t c = size_t(l.c);
  const std::vector<float> x_draw = channel_data(rng, l);
  const Params p = random_params(rng, l.c);
  const SavedForward fwd = saved_forward(act, x_draw, l, p);  // y in x's wide layout, FP32 statistics
  const std::vector<T> x16 = stored<T>(x_draw), y16 = stored<T>(fwd.y),
                       gy16 = random_storage<T>(rng, l.size(), -1.0f, 1.0f, false);
  const size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> d_gamma(device, p.gamma), d_mean(device, fwd.mean), d_var(device, fwd.var);
  DeviceArray<float> d_x32(device, widened(x16)), d_y32(device, widened(y16)), d_gy32(device, widened(gy16)),
      d_gx32(device, l.size()), want_gamma(device, c), want_beta(device, c);
  batchnorm_activation_backward_cuda(act, l.on<const float>(d_y32.data()), l.on<const float>(d_gy32.data()),
                                     l.on<const float>(d_x32.data()), d_gamma.data(), d_mean.data(), d_var.data(),
                                     l.on(d_gx32.data()), want_gamma.data(), want_beta.data(), workspace.data(),
                                     workspace_bytes, nullptr);
  DeviceArray<T> d_x(device, x16), d_y(device, y16), d_gy(device, gy16), d_gx(device, l.size());
  DeviceArray<float> got_gamma(device, c), got_beta(device, c);
  d_gx.poison(), got_gamma.poison(), got_beta.poison();
  batchnorm_activation_backward_cuda<T>(act, l.on<const T>(d_y.data()), l.on<const T>(d_gy.data()),
                                        l.on<const T>(d_x.data()), d_gamma.data(), d_mean.data(), d_var.data(),
                                        l.on<T>(d_gx.data()), got_gamma.data(), got_beta.data(), workspace.data(),
                                        workspace_bytes, nullptr);
  check_rounded_once(slice_of(d_gx.download(), l), slice_of_floats(d_gx32.download(), l), 0, 1.0);
  CHECK_CLOSE(got_gamma.download(), to_double(want_gamma.download()), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got_beta.download(), to_double(want_beta.download()), kStatTolerance, kStatTolerance);
  // In place: grad_x over grad_y.
  DeviceArray<T> d_inplace(device, gy16);
  batchnorm_activation_backward_cuda<T>(act, l.on<const T>(d_y.data()), l.on<const T>(d_inplace.data()),
                                        l.on<const T>(d_x.data()), d_gamma.data(), d_mean.data(), d_var.data(),
                                        l.on<T>(d_inplace.data()), got_gamma.data(), got_beta.data(),
                                        workspace.data(), workspace_bytes, nullptr);
  const std::vector<T> inplace = d_inplace.download(), separate = d_gx.download();
  for (size_t i = 0; i < l.size(); ++i) {
    const int ch = int(i % size_t(l.stride));
    if (ch >= l.offset && ch < l.offset + l.c && inplace[i].bits != separate[i].bits) {
      CHECK(inplace[i].bits == separate[i].bits);
      break;
    }
  }
}

// The five --sync-bn phases on one replica (total = its pixels, the all-reduces identities) in T
// against the same phases in FP32 on the widened tensors.
template <typename T>
void check_sync_phases_storage(Device device, Rng& rng, const Slice& l, Activation act) {
  const size_t c = size_t(l.c);
  const double total = double(l.pixels());
  const std::vector<T> x16 = stored<T>(channel_data(rng, l)),
                       gy16 = random_storage<T>(rng, l.size(), -1.0f, 1.0f, false);
  const Params p = random_params(rng, l.c);
  const size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> d_gamma(device, p.gamma), d_beta(device, p.beta);
  struct Outputs {
    std::vector<float> sums, squares, mean, var, grad_gamma, grad_beta, sums2, y, grad_x;
  };
  // Runs the phases with tensors of type S on the stored values; y and grad_x come back widened.
  auto run = [&]<typename S>(S) {
    DeviceArray<S> d_x(device, stored<S>(widened(x16))), d_gy(device, stored<S>(widened(gy16))),
        d_y(device, l.size()), d_gx(device, l.size());
    DeviceArray<float> sums(device, c), squares(device, c), mean(device, c), var(device, c), rm(device, p.running_mean),
        rv(device, p.running_var), grad_gamma(device, c), grad_beta(device, c), sums2(device, 2 * c);
    d_y.poison(), d_gx.poison();
    const NhwcView<const S> x = l.on<const S>(d_x.data()), gy = l.on<const S>(d_gy.data());
    batchnorm_sums_cuda<S>(x, sums.data(), workspace.data(), workspace_bytes, nullptr);
    batchnorm_centered_squares_cuda<S>(x, sums.data(), total, squares.data(), workspace.data(), workspace_bytes,
                                       nullptr);
    batchnorm_activation_forward_from_sums_cuda<S>(act, x, d_gamma.data(), d_beta.data(), l.on<S>(d_y.data()),
                                                   sums.data(), squares.data(), total, mean.data(), var.data(),
                                                   rm.data(), rv.data(), nullptr);
    batchnorm_activation_backward_sums_cuda<S>(act, l.on<const S>(d_y.data()), gy, x, mean.data(), var.data(),
                                               grad_gamma.data(), grad_beta.data(), sums2.data(), workspace.data(),
                                               workspace_bytes, nullptr);
    batchnorm_activation_backward_apply_cuda<S>(act, l.on<const S>(d_y.data()), gy, x, d_gamma.data(), mean.data(),
                                                var.data(), sums2.data(), total, l.on<S>(d_gx.data()), nullptr);
    auto widen_all = [](const std::vector<S>& v) {
      if constexpr (std::is_same_v<S, float>) return v;
      else return widened(v);
    };
    return Outputs{sums.download(),       squares.download(), mean.download(),  var.download(),
                   grad_gamma.download(), grad_beta.download(), sums2.download(), widen_all(d_y.download()),
                   widen_all(d_gx.download())};
  };
  const Outputs want = run(0.0f), got = run(T{});
  CHECK_CLOSE(got.sums, to_double(want.sums), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.squares, to_double(want.squares), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.mean, to_double(want.mean), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.var, to_double(want.var), kStatTolerance, kStatTolerance);
  check_rounded_once(stored<T>(slice_of_floats(got.y, l)), slice_of_floats(want.y, l), 0, 1.0);
  // The backward reads y in T, the FP32 phases their own y; leaky's derivative only sees y's sign,
  // which rounding keeps, so the gradients are the FP32 ones too.
  CHECK_CLOSE(got.grad_gamma, to_double(want.grad_gamma), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.grad_beta, to_double(want.grad_beta), kStatTolerance, kStatTolerance);
  CHECK_CLOSE(got.sums2, to_double(want.sums2), kStatTolerance, kStatTolerance);
  check_rounded_once(stored<T>(slice_of_floats(got.grad_x, l)), slice_of_floats(want.grad_x, l), 0, 1.0);
}

template <typename T>
void check_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  for (const Slice& l : kStorageSlices)
    for (Activation act : kAllKinds) {
      const std::string act_name = activation_name(act);
      CAPTURE(act_name);
      CAPTURE(l);
      check_training_forward_storage<T>(device, rng, l, act);
      check_backward_storage<T>(device, rng, l, act);
      if (act == Activation::Leaky) check_sync_phases_storage<T>(device, rng, l, act);
    }
}

// A NaN in channel 0 of x makes channel 0's statistics and every y in it NaN; an Inf in channel 1
// of grad_y makes channel 1's grad_beta and every grad_x in it non-finite; the other channels stay
// finite.
template <typename T>
void check_non_finite(Device device) {
  const Slice l{2, 3, 3, 8, 8, 0};
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<T> x = stored<T>(channel_data(rng, l)), gy = random_storage<T>(rng, l.size(), -1.0f, 1.0f, false);
  x[4 * size_t(l.stride) + 0] = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  gy[7 * size_t(l.stride) + 1] = from_float<T>(std::numeric_limits<float>::infinity());
  const Params p = random_params(rng, l.c);
  const size_t c = size_t(l.c), workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<T> d_x(device, x), d_y(device, l.size()), d_gy(device, gy), d_gx(device, l.size());
  DeviceArray<float> d_gamma(device, p.gamma), d_beta(device, p.beta), mean(device, c), var(device, c),
      grad_gamma(device, c), grad_beta(device, c);
  batchnorm_activation_forward_training_cuda<T>(Activation::Leaky, l.on<const T>(d_x.data()), d_gamma.data(),
                                                d_beta.data(), l.on<T>(d_y.data()), mean.data(), var.data(), nullptr,
                                                nullptr, workspace.data(), workspace_bytes, nullptr);
  const std::vector<T> y = d_y.download();
  for (size_t i = 0; i < y.size(); ++i) {
    const bool channel0 = i % c == 0;
    if (std::isnan(to_float(y[i])) != channel0) {
      CHECK_MESSAGE(std::isnan(to_float(y[i])) == channel0, "y element " << i);
      break;
    }
  }
  // The backward with finite saved statistics and the Inf in channel 1 of grad_y (channel 0's y is
  // NaN from the forward, so its grad_x is non-finite too: not checked).
  std::vector<float> clean_mean(c, 0.5f), clean_var(c, 1.5f);
  mean.upload(clean_mean), var.upload(clean_var);
  DeviceArray<T> d_x_clean(device, stored<T>(channel_data(rng, l)));
  batchnorm_activation_backward_cuda<T>(Activation::Leaky, l.on<const T>(d_y.data()), l.on<const T>(d_gy.data()),
                                        l.on<const T>(d_x_clean.data()), d_gamma.data(), mean.data(), var.data(),
                                        l.on<T>(d_gx.data()), grad_gamma.data(), grad_beta.data(), workspace.data(),
                                        workspace_bytes, nullptr);
  const std::vector<float> gb = grad_beta.download();
  CHECK(!std::isfinite(gb[1]));
  const std::vector<T> gx = d_gx.download();
  size_t wrong = 0;
  for (size_t i = 0; i < gx.size(); ++i) {
    const size_t ch = i % c;
    if (ch == 0) continue;  // y (hence g) is NaN there: non-finite too, from the forward
    wrong += std::isfinite(to_float(gx[i])) == (ch == 1);
  }
  CHECK(wrong == 0);
}

// A 1-pixel batch: the saved mean is x itself and the variance 0, so the backward's
// grad_x = a (g - grad_beta/1 - k_x (x - mean)) is exactly zero, g and grad_beta being the same
// rounded product grad_y * act'(y) (kernels/batchnorm.cu, backward pass 3). An FMA that fuses that
// product into the subtraction leaves a times its rounding error instead, as the FP32 op did on an
// H200 (2026-12-04). T: float too.
template <typename T>
void check_one_pixel_cancels(Device device, Rng& rng, Activation act) {
  const Slice l{1, 1, 1, 6, 8, 1};
  const size_t c = size_t(l.c);
  const std::vector<T> x = stored<T>(channel_data(rng, l)), gy = random_storage<T>(rng, l.size(), -1.0f, 1.0f, false);
  const Params p = random_params(rng, l.c);
  const size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> d_gamma(device, p.gamma), d_beta(device, p.beta), mean(device, c), var(device, c),
      grad_gamma(device, c), grad_beta(device, c);
  DeviceArray<T> d_x(device, x), d_y(device, l.size()), d_gy(device, gy), d_gx(device, l.size());
  d_gx.poison(), grad_gamma.poison();
  batchnorm_activation_forward_training_cuda<T>(act, l.on<const T>(d_x.data()), d_gamma.data(), d_beta.data(),
                                                l.on<T>(d_y.data()), mean.data(), var.data(), nullptr, nullptr,
                                                workspace.data(), workspace_bytes, nullptr);
  batchnorm_activation_backward_cuda<T>(act, l.on<const T>(d_y.data()), l.on<const T>(d_gy.data()),
                                        l.on<const T>(d_x.data()), d_gamma.data(), mean.data(), var.data(),
                                        l.on<T>(d_gx.data()), grad_gamma.data(), grad_beta.data(), workspace.data(),
                                        workspace_bytes, nullptr);
  const std::vector<T> gx = d_gx.download();
  const std::vector<float> gg = grad_gamma.download();
  for (size_t ch = 0; ch < c; ++ch) {
    CAPTURE(ch);
    CHECK(to_float(gx[size_t(l.offset) + ch]) == 0.0f);
    CHECK(gg[ch] == 0.0f);
  }
}

}  // namespace

TEST_CASE("batchnorm: cuda backward over one pixel gives grad_x = 0 exactly, in fp32, bf16 and fp16") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (Activation act : kAllKinds) {
    const std::string act_name = activation_name(act);
    CAPTURE(act_name);
    check_one_pixel_cancels<float>(device, rng, act);
    check_one_pixel_cancels<Bf16>(device, rng, act);
    check_one_pixel_cancels<Fp16>(device, rng, act);
  }
}

TEST_CASE("batchnorm: cuda on bf16 and fp16 tensors: the FP32 op's statistics, its outputs rounded once") {
  KERNEL_TEST_DEVICE(device);
  check_storage<Bf16>(device);
  check_storage<Fp16>(device);
}

TEST_CASE("batchnorm: cuda on bf16 and fp16 tensors propagates NaN and Inf per channel") {
  KERNEL_TEST_DEVICE(device);
  check_non_finite<Bf16>(device);
  check_non_finite<Fp16>(device);
}
