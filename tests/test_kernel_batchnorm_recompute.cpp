// Batchnorm's backward without a stored y (batchnorm.h, "store or recompute"): the CUDA backwards
// (fused, and --sync-bn's phases 4 and 5) recompute act's output from x, gamma, beta and the saved
// statistics with the forward's own operations. The oracle is the same backward reading the y the
// FP32 forward wrote: in FP32 the recompute gives its bits exactly (grad_x, grad_gamma, grad_beta,
// sums2), and with 16-bit tensors the FP32 op's results rounded once (the recompute sees y before
// its rounding, as the FP32 op does), for every activation, on channel slices at vector and odd
// offsets, dense tensors and a 1-pixel batch, separate and in place.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/ops.h"
#include "runtime/stream.h"
#include "tests/batchnorm_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

const Slice kSlices[] = {{2, 5, 7, 12, 16, 4}, {3, 7, 5, 13, 16, 1}, {2, 9, 11, 24, 24, 0}, {1, 1, 1, 5, 7, 2}};

// The view's elements of a wide buffer, as floats.
template <typename T>
std::vector<float> view_values(const std::vector<T>& wide, const Slice& l) {
  std::vector<float> out;
  for (size_t i = 0; i < wide.size(); ++i) {
    const int ch = int(i % size_t(l.stride));
    if (ch < l.offset || ch >= l.offset + l.c) continue;
    if constexpr (std::is_same_v<T, float>) out.push_back(wide[i]);
    else out.push_back(to_float(wide[i]));
  }
  return out;
}

// One backward's outputs: grad_x (wide, widened to float) and the per-channel gradients, with
// sums2 from the --sync-bn phases.
struct Grads {
  std::vector<float> grad_x, grad_gamma, grad_beta, sums2;
};

// The forward's results the backwards read (FP32, from the widened x), and what they share.
struct Case {
  Slice l;
  Activation act;
  std::vector<float> x, grad_y, gamma, beta, mean, var, y;  // x, grad_y and y wide
};

Case make_case(Device device, Rng& rng, const Slice& l, Activation act, bool round16) {
  Case k{l, act, channel_data(rng, l), rng.floats(l.size(), -1.0f, 1.0f), {}, {}, {}, {}, {}};
  if (round16) k.x = exact_in_16_bits(k.x), k.grad_y = exact_in_16_bits(k.grad_y);
  const Params p = random_params(rng, l.c);
  k.gamma = p.gamma, k.beta = p.beta;
  const size_t c = size_t(l.c), workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> d_x(device, k.x), d_y(device, l.size()), d_gamma(device, k.gamma), d_beta(device, k.beta),
      d_mean(device, c), d_var(device, c);
  d_y.poison();
  batchnorm_activation_forward_training_cuda(act, l.on<const float>(d_x.data()), d_gamma.data(), d_beta.data(),
                                             l.on(d_y.data()), d_mean.data(), d_var.data(), nullptr, nullptr,
                                             workspace.data(), workspace_bytes, nullptr);
  k.y = d_y.download(), k.mean = d_mean.download(), k.var = d_var.download();
  return k;
}

// The fused backward and the two --sync-bn phases (one replica: total = its pixels) on tensors of
// type T, reading the stored y or (recompute) none. in_place: grad_x written over grad_y.
template <typename T>
Grads run_backward(Device device, const Case& k, bool recompute, bool in_place) {
  const Slice& l = k.l;
  const size_t c = size_t(l.c), workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  auto as_t = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return stored<T>(v);
  };
  DeviceArray<T> d_x(device, as_t(k.x)), d_y(device, as_t(k.y)), d_gy(device, as_t(k.grad_y)), d_gx(device, l.size());
  DeviceArray<float> d_gamma(device, k.gamma), d_beta(device, k.beta), d_mean(device, k.mean), d_var(device, k.var),
      grad_gamma(device, c), grad_beta(device, c), sums2(device, 2 * c);
  d_gx.poison(), grad_gamma.poison(), grad_beta.poison(), sums2.poison();
  const NhwcView<const T> x = l.on<const T>(d_x.data()), y = l.on<const T>(recompute ? nullptr : d_y.data());
  const BatchNormAffine<float> affine = recompute ? BatchNormAffine<float>{d_gamma.data(), d_beta.data()}
                                                  : BatchNormAffine<float>{};
  T* grad_out = in_place ? d_gy.data() : d_gx.data();
  batchnorm_activation_backward_cuda<T>(k.act, y, l.on<const T>(d_gy.data()), x, d_gamma.data(), d_mean.data(),
                                        d_var.data(), l.on<T>(grad_out), grad_gamma.data(), grad_beta.data(),
                                        workspace.data(), workspace_bytes, nullptr, affine);
  Grads g{view_values(in_place ? d_gy.download() : d_gx.download(), l), grad_gamma.download(), grad_beta.download(),
          {}};
  if (in_place) return g;
  // --sync-bn's phases 4 and 5 into a fresh grad_x.
  DeviceArray<float> phase_gamma(device, c), phase_beta(device, c);
  d_gx.poison();
  batchnorm_activation_backward_sums_cuda<T>(k.act, y, l.on<const T>(d_gy.data()), x, d_mean.data(), d_var.data(),
                                             phase_gamma.data(), phase_beta.data(), sums2.data(), workspace.data(),
                                             workspace_bytes, nullptr, affine);
  batchnorm_activation_backward_apply_cuda<T>(k.act, y, l.on<const T>(d_gy.data()), x, d_gamma.data(), d_mean.data(),
                                              d_var.data(), sums2.data(), double(l.pixels()), l.on<T>(d_gx.data()),
                                              nullptr, affine);
  g.sums2 = sums2.download();
  const std::vector<float> phased = view_values(d_gx.download(), l);
  CHECK(same_bits(phased, g.grad_x));  // one replica's phases are the fused backward
  return g;
}

void check_same(const Grads& got, const Grads& want) {
  CHECK(same_bits(got.grad_x, want.grad_x));
  CHECK(same_bits(got.grad_gamma, want.grad_gamma));
  CHECK(same_bits(got.grad_beta, want.grad_beta));
  CHECK(same_bits(got.sums2, want.sums2));
}

// 16-bit grad_x is the FP32 one rounded once; the per-channel sums are FP32's bits.
template <typename T>
void check_rounded(const Grads& got, const Grads& want) {
  check_rounded_once(stored<T>(got.grad_x), want.grad_x, 0, 1.0);
  check_same(Grads{{}, got.grad_gamma, got.grad_beta, got.sums2}, Grads{{}, want.grad_gamma, want.grad_beta, want.sums2});
}

}  // namespace

TEST_CASE("batchnorm: cuda backward recomputing y from x gives the stored y's gradients, bit for bit in FP32") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (const Slice& l : kSlices)
    for (Activation act : kAllKinds) {
      const std::string act_name = activation_name(act);
      CAPTURE(act_name);
      CAPTURE(l);
      const Case k = make_case(device, rng, l, act, false);
      const Grads stored_y = run_backward<float>(device, k, false, false);
      check_same(run_backward<float>(device, k, true, false), stored_y);
      const Grads in_place = run_backward<float>(device, k, true, true);
      CHECK(same_bits(in_place.grad_x, stored_y.grad_x));
    }
}

TEST_CASE("batchnorm: cuda backward recomputing y on bf16 and fp16 tensors: the FP32 op's results rounded once") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (const Slice& l : kSlices)
    for (Activation act : kAllKinds) {
      const std::string act_name = activation_name(act);
      CAPTURE(act_name);
      CAPTURE(l);
      const Case k = make_case(device, rng, l, act, true);  // x and grad_y exact in both formats
      const Grads want = run_backward<float>(device, k, false, false);
      check_rounded<Bf16>(run_backward<Bf16>(device, k, true, false), want);
      check_rounded<Fp16>(run_backward<Fp16>(device, k, true, false), want);
    }
}

TEST_CASE("batchnorm: a recomputing backward's arguments are checked; the CPU backend keeps y") {
  KERNEL_TEST_DEVICE(device);
  const Slice l{1, 2, 3, 4, 4, 0};
  const size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
  DeviceArray<unsigned char> workspace(device, workspace_bytes);
  DeviceArray<float> x(device, l.size()), y(device, l.size()), gy(device, l.size()), gx(device, l.size()),
      a(device, 4), b(device, 4), s(device, 8);
  auto backward = [&](const float* y_data, BatchNormAffine<float> affine) {
    batchnorm_activation_backward_cuda<float>(Activation::Leaky, l.on<const float>(y_data), l.on<const float>(gy.data()),
                                              l.on<const float>(x.data()), a.data(), a.data(), b.data(),
                                              l.on(gx.data()), a.data(), b.data(), workspace.data(), workspace_bytes,
                                              nullptr, affine);
  };
  CHECK_THROWS_WITH(backward(y.data(), {a.data(), b.data()}),
                    doctest::Contains("batchnorm_activation_backward_cuda: y and recompute are both given"));
  CHECK_THROWS_WITH(backward(nullptr, {a.data(), nullptr}),
                    doctest::Contains("batchnorm_activation_backward_cuda: recompute.beta is null"));
  CHECK_THROWS_WITH(backward(nullptr, {}), doctest::Contains("batchnorm_activation_backward_cuda: y"));
  CHECK_THROWS_WITH(
      batchnorm_activation_backward_sums_cuda<float>(Activation::Leaky, l.on<const float>(nullptr),
                                                     l.on<const float>(gy.data()), l.on<const float>(x.data()),
                                                     a.data(), b.data(), a.data(), b.data(), s.data(), workspace.data(),
                                                     workspace_bytes, nullptr, {nullptr, b.data()}),
      doctest::Contains("batchnorm_activation_backward_sums_cuda: recompute.gamma is null"));
  const std::vector<float> host(l.size(), 1.0f), params(4, 1.0f);
  std::vector<float> grad(l.size()), dg(4), db(4);
  Stream stream(Device::cpu(), StreamPriority::Normal, "cpu");
  const OpContext cpu{&stream};
  CHECK_THROWS_WITH(batchnorm_activation_backward(cpu, Activation::Leaky, ConstAct{}, l.on<const float>(host.data()),
                                                  l.on<const float>(host.data()), params.data(), params.data(),
                                                  params.data(), l.on(grad.data()), dg.data(), db.data(),
                                                  {params.data(), params.data()}),
                    doctest::Contains("the CPU backend reads the stored y"));
}
