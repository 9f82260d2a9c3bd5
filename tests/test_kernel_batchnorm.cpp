// Batchnorm and batchnorm + activation: the reference backward against finite differences (in
// double), hand-computed statistics (the running-statistics convention), and the fast CPU
// version and the CUDA kernels against the reference: training and inference forward and the
// backward, on channel slices, in place, with many pixel blocks, repeated for identical bits.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/batchnorm.h"
#include "runtime/check.h"
#include "tests/batchnorm_fixtures.h"
#include "tests/cpu_isa_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

template <typename T>
NhwcView<T> dense(T* data, const Slice& l) {
  return nhwc(data, l.n, l.h, l.w, l.c);
}
template <typename T>
NhwcView<const T> cdense(const T* data, const Slice& l) {
  return nhwc(data, l.n, l.h, l.w, l.c);
}

// The cases each implementation runs: odd sizes and slices (scalar path), a 16-byte-aligned slice
// and dense tensors (float4 path), tiny batches (m = 3, m = 1), and one with 130 pixel blocks.
const Slice kSlices[] = {{3, 7, 5, 13, 16, 1}, {2, 9, 11, 24, 32, 8}, {3, 37, 41, 16, 16, 0},
                           {1, 1, 3, 5, 7, 2},   {1, 1, 1, 4, 4, 0},    {2, 91, 91, 64, 64, 0}};
bool is_large(const Slice& l) { return l.elements() > 200000; }

struct Impl {
  Device device;
  bool cuda;
};

// f(l, act) for every case and activation kind, both captured. The large case (slow emulated)
// runs only with linear and leaky, and only where `large` is set.
template <typename F>
void for_each_case(bool large, F&& f) {
  for (const Slice& l : kSlices)
    for (Activation act : kAllKinds) {
      if (is_large(l) && (!large || (act != Activation::Linear && act != Activation::Leaky))) continue;
      const std::string act_name = activation_name(act);
      CAPTURE(act_name);
      CAPTURE(l);
      f(l, act);
    }
}

void check_forward_training(const Impl& impl) {
  Rng rng;
  CAPTURE(rng.seed());
  for_each_case(true, [&](const Slice& l, Activation act) {
    std::vector<float> x = channel_data(rng, l);
    Params p = random_params(rng, l.c);
    ForwardRef ref = reference_training(act, gather<double>(x, l), l, p);

    const size_t c = size_t(l.c);
    size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
    DeviceArray<unsigned char> workspace(impl.device, workspace_bytes);  // exact size: overruns are caught
    DeviceArray<float> d_x(impl.device, x), d_y(impl.device, l.size()), d_gamma(impl.device, p.gamma),
        d_beta(impl.device, p.beta), d_mean(impl.device, c), d_var(impl.device, c),
        d_running_mean(impl.device, p.running_mean), d_running_var(impl.device, p.running_var);
    auto run = [&](ConstAct in, Act out) {
      d_running_mean.upload(p.running_mean), d_running_var.upload(p.running_var);
      d_mean.poison(), d_var.poison();
      if (impl.cuda)
        batchnorm_activation_forward_training_cuda(act, in, d_gamma.data(), d_beta.data(), out, d_mean.data(),
                                                   d_var.data(), d_running_mean.data(), d_running_var.data(),
                                                   workspace.data(), workspace_bytes, nullptr);
      else
        batchnorm_activation_forward_training_cpu(act, in, d_gamma.data(), d_beta.data(), out, d_mean.data(),
                                                  d_var.data(), d_running_mean.data(), d_running_var.data(), nullptr,
                                                  0);
    };
    d_y.poison();
    run(l.on<const float>(d_x.data()), l.on(d_y.data()));
    std::vector<float> y = d_y.download(), mean = d_mean.download(), var = d_var.download(),
                       running_mean = d_running_mean.download(), running_var = d_running_var.download();
    CHECK_CLOSE(gather<float>(y, l), ref.y, 1e-5, 1e-4);
    CHECK(written_outside(y, l) == 0);
    CHECK_CLOSE(mean, ref.mean, 1e-5, 1e-5);
    CHECK_CLOSE(var, ref.var, 1e-6, 1e-4);
    CHECK_CLOSE(running_mean, ref.running_mean, 1e-6, 1e-5);
    CHECK_CLOSE(running_var, ref.running_var, 1e-6, 1e-5);

    if (impl.cuda) {  // again: the same bits everywhere
      d_y.poison();
      run(l.on<const float>(d_x.data()), l.on(d_y.data()));
      CHECK(same_bits(d_y.download(), y));
      CHECK(same_bits(d_mean.download(), mean));
      CHECK(same_bits(d_var.download(), var));
      CHECK(same_bits(d_running_mean.download(), running_mean));
      CHECK(same_bits(d_running_var.download(), running_var));
    }
    if (act == Activation::Leaky) {  // in place: y over x
      DeviceArray<float> d_inplace(impl.device, x);
      run(l.on<const float>(d_inplace.data()), l.on(d_inplace.data()));
      CHECK_CLOSE(gather<float>(d_inplace.download(), l), ref.y, 1e-5, 1e-4);
    }
  });
}

void check_forward_inference(const Impl& impl) {
  Rng rng;
  CAPTURE(rng.seed());
  for_each_case(false, [&](const Slice& l, Activation act) {
    std::vector<float> x = channel_data(rng, l);
    Params p = random_params(rng, l.c);
    for (float& m : p.running_mean) m *= 3.0f;  // like the data's channel offsets
    std::vector<double> xd = gather<double>(x, l), y_ref(l.elements()), gamma = to_double(p.gamma),
                        beta = to_double(p.beta), rm = to_double(p.running_mean), rv = to_double(p.running_var);
    batchnorm_activation_forward_inference_reference<double>(act, cdense(xd.data(), l), gamma.data(), beta.data(),
                                                             rm.data(), rv.data(), dense(y_ref.data(), l));
    DeviceArray<float> d_x(impl.device, x), d_y(impl.device, l.size()), d_gamma(impl.device, p.gamma),
        d_beta(impl.device, p.beta), d_rm(impl.device, p.running_mean), d_rv(impl.device, p.running_var);
    auto run = [&](ConstAct in, Act out) {
      if (impl.cuda)
        batchnorm_activation_forward_inference_cuda(act, in, d_gamma.data(), d_beta.data(), d_rm.data(),
                                                    d_rv.data(), out, nullptr);
      else
        batchnorm_activation_forward_inference_cpu(act, in, d_gamma.data(), d_beta.data(), d_rm.data(),
                                                   d_rv.data(), out);
    };
    d_y.poison();
    run(l.on<const float>(d_x.data()), l.on(d_y.data()));
    std::vector<float> y = d_y.download();
    CHECK_CLOSE(gather<float>(y, l), y_ref, 1e-5, 1e-4);
    CHECK(written_outside(y, l) == 0);
    if (impl.cuda) {
      d_y.poison();
      run(l.on<const float>(d_x.data()), l.on(d_y.data()));
      CHECK(same_bits(d_y.download(), y));
    }
    DeviceArray<float> d_inplace(impl.device, x);
    run(l.on<const float>(d_inplace.data()), l.on(d_inplace.data()));
    CHECK_CLOSE(gather<float>(d_inplace.download(), l), y_ref, 1e-5, 1e-4);
  });
}

void check_backward(const Impl& impl) {
  Rng rng;
  CAPTURE(rng.seed());
  for_each_case(true, [&](const Slice& l, Activation act) {
    const size_t c = size_t(l.c);
    std::vector<float> x = channel_data(rng, l), grad_y = rng.floats(l.size());
    Params p = random_params(rng, l.c);
    // The forward's outputs, as float, as the backward gets them: y in x's layout, saved stats.
    SavedForward fwd = saved_forward(act, x, l, p);
    BackwardRef ref = reference_backward(act, l, x, grad_y, fwd, p.gamma, 0, l.n);

    size_t workspace_bytes = batchnorm_workspace_bytes(l.n, l.h, l.w, l.c);
    DeviceArray<unsigned char> workspace(impl.device, workspace_bytes);
    DeviceArray<float> d_x(impl.device, x), d_y(impl.device, fwd.y), d_grad_y(impl.device, grad_y),
        d_grad_x(impl.device, l.size()), d_gamma(impl.device, p.gamma), d_mean(impl.device, fwd.mean),
        d_var(impl.device, fwd.var), d_grad_gamma(impl.device, c), d_grad_beta(impl.device, c);
    // Linear goes through the plain batchnorm API, which has no y.
    auto run = [&](ConstAct gy, Act gx) {
      d_grad_gamma.poison(), d_grad_beta.poison();
      if (act == Activation::Linear && impl.cuda)
        batchnorm_backward_cuda(gy, l.on<const float>(d_x.data()), d_gamma.data(), d_mean.data(), d_var.data(), gx,
                                d_grad_gamma.data(), d_grad_beta.data(), workspace.data(), workspace_bytes, nullptr);
      else if (act == Activation::Linear)
        batchnorm_backward_cpu(gy, l.on<const float>(d_x.data()), d_gamma.data(), d_mean.data(), d_var.data(), gx,
                               d_grad_gamma.data(), d_grad_beta.data(), nullptr, 0);
      else if (impl.cuda)
        batchnorm_activation_backward_cuda(act, l.on<const float>(d_y.data()), gy, l.on<const float>(d_x.data()),
                                           d_gamma.data(), d_mean.data(), d_var.data(), gx, d_grad_gamma.data(),
                                           d_grad_beta.data(), workspace.data(), workspace_bytes, nullptr);
      else
        batchnorm_activation_backward_cpu(act, l.on<const float>(d_y.data()), gy, l.on<const float>(d_x.data()),
                                          d_gamma.data(), d_mean.data(), d_var.data(), gx, d_grad_gamma.data(),
                                          d_grad_beta.data(), nullptr, 0);
    };
    d_grad_x.poison();
    run(l.on<const float>(d_grad_y.data()), l.on(d_grad_x.data()));
    std::vector<float> grad_x = d_grad_x.download(), grad_gamma = d_grad_gamma.download(),
                       grad_beta = d_grad_beta.download();
    CHECK_CLOSE(gather<float>(grad_x, l), ref.grad_x, 1e-5, 1e-4);
    CHECK(written_outside(grad_x, l) == 0);
    CHECK_CLOSE(grad_gamma, ref.grad_gamma, 1e-4, 1e-4);
    CHECK_CLOSE(grad_beta, ref.grad_beta, 1e-4, 1e-4);

    if (impl.cuda) {
      d_grad_x.poison();
      run(l.on<const float>(d_grad_y.data()), l.on(d_grad_x.data()));
      CHECK(same_bits(d_grad_x.download(), grad_x));
      CHECK(same_bits(d_grad_gamma.download(), grad_gamma));
      CHECK(same_bits(d_grad_beta.download(), grad_beta));
    }
    if (act == Activation::Leaky || act == Activation::Linear) {  // in place: grad_x over grad_y
      DeviceArray<float> d_inplace(impl.device, grad_y);
      run(l.on<const float>(d_inplace.data()), l.on(d_inplace.data()));
      CHECK_CLOSE(gather<float>(d_inplace.download(), l), ref.grad_x, 1e-5, 1e-4);
    }
  });
}

// One channel: x = 1, 2, 3, 4 -> mean 2.5, biased var 1.25, unbiased 5/3; another: x = -2, 0, 2, 4
// -> mean 1, var 5, unbiased 20/3. Running statistics start at (0, 1) and (1, 2).
void check_hand_computed(const Impl& impl) {
  const std::vector<float> x = {1, -2, 2, 0, 3, 2, 4, 4};  // 1 x 2 x 2 pixels, 2 channels
  const std::vector<float> gamma = {1, 2}, beta = {0, 0.5f};
  DeviceArray<float> d_x(impl.device, x), d_y(impl.device, 8), d_gamma(impl.device, gamma), d_beta(impl.device, beta),
      d_mean(impl.device, 2), d_var(impl.device, 2), d_rm(impl.device, std::vector<float>{0, 1}),
      d_rv(impl.device, std::vector<float>{1, 2});
  size_t workspace_bytes = batchnorm_workspace_bytes(1, 2, 2, 2);
  DeviceArray<unsigned char> workspace(impl.device, workspace_bytes);
  ConstAct in = nhwc<const float>(d_x.data(), 1, 2, 2, 2);
  Act out = nhwc(d_y.data(), 1, 2, 2, 2);
  if (impl.cuda)
    batchnorm_forward_training_cuda(in, d_gamma.data(), d_beta.data(), out, d_mean.data(), d_var.data(), d_rm.data(),
                                    d_rv.data(), workspace.data(), workspace_bytes, nullptr);
  else
    batchnorm_forward_training_cpu(in, d_gamma.data(), d_beta.data(), out, d_mean.data(), d_var.data(), d_rm.data(),
                                   d_rv.data(), nullptr, 0);
  CHECK_CLOSE(d_mean.download(), (std::vector<double>{2.5, 1.0}), 1e-6, 1e-6);
  CHECK_CLOSE(d_var.download(), (std::vector<double>{1.25, 5.0}), 1e-6, 1e-6);
  CHECK_CLOSE(d_rm.download(), (std::vector<double>{0.025, 1.0}), 1e-7, 1e-6);
  CHECK_CLOSE(d_rv.download(), (std::vector<double>{0.99 + 0.01 * 5.0 / 3.0, 1.98 + 0.01 * 20.0 / 3.0}), 1e-7, 1e-6);
  std::vector<double> y_expected;
  for (int p = 0; p < 4; ++p) {
    y_expected.push_back((x[size_t(2 * p)] - 2.5) / std::sqrt(1.25 + 1e-5));
    y_expected.push_back(2.0 * (x[size_t(2 * p + 1)] - 1.0) / std::sqrt(5.0 + 1e-5) + 0.5);
  }
  CHECK_CLOSE(d_y.download(), y_expected, 1e-6, 1e-5);
  // Inference with those running statistics.
  std::vector<float> rm = d_rm.download(), rv = d_rv.download();
  d_y.poison();
  if (impl.cuda)
    batchnorm_forward_inference_cuda(in, d_gamma.data(), d_beta.data(), d_rm.data(), d_rv.data(), out, nullptr);
  else
    batchnorm_forward_inference_cpu(in, d_gamma.data(), d_beta.data(), d_rm.data(), d_rv.data(), out);
  std::vector<double> y_inference;
  for (int p = 0; p < 4; ++p)
    for (int ch = 0; ch < 2; ++ch)
      y_inference.push_back(gamma[size_t(ch)] * (x[size_t(2 * p + ch)] - rm[size_t(ch)]) /
                                std::sqrt(double(rv[size_t(ch)]) + 1e-5) +
                            beta[size_t(ch)]);
  CHECK_CLOSE(d_y.download(), y_inference, 1e-6, 1e-5);
}

}  // namespace

TEST_CASE("batchnorm: reference backward matches finite differences, plain and fused") {
  Rng rng;
  CAPTURE(rng.seed());
  const Slice l{2, 3, 2, 3, 3, 0};  // m = 12 pixels
  const size_t n = l.elements(), c = size_t(l.c);
  for (Activation act : kAllKinds) {
    const std::string act_name = activation_name(act);
      CAPTURE(act_name);
    // Inputs x, then gamma, then beta in one vector; resampled until every pre-activation is at
    // least 0.02 from the kink at 0.
    std::vector<double> params, w;
    for (int attempt = 0;; ++attempt) {
      REQUIRE(attempt < 1000);
      std::vector<float> x = channel_data(rng, l);
      Params p = random_params(rng, l.c);
      params = to_double(x);
      params.insert(params.end(), p.gamma.begin(), p.gamma.end());
      params.insert(params.end(), p.beta.begin(), p.beta.end());
      Params pre = p;
      std::vector<double> z = reference_training(Activation::Linear, to_double(x), l, pre).y;
      bool clear = true;
      for (double v : z) clear = clear && std::fabs(v) > 0.02;
      if (clear || act == Activation::Linear || act == Activation::Logistic) break;
    }
    w = to_double(rng.floats(n));
    auto forward = [&](const std::vector<double>& q, std::vector<double>& y, std::vector<double>& mean,
                       std::vector<double>& var) {
      y.assign(n, 0), mean.assign(c, 0), var.assign(c, 0);
      batchnorm_activation_forward_training_reference<double>(act, cdense(q.data(), l), q.data() + n, q.data() + n + c,
                                                              dense(y.data(), l), mean.data(), var.data(), nullptr,
                                                              nullptr);
    };
    auto loss = [&](const std::vector<double>& q) {
      std::vector<double> y, mean, var;
      forward(q, y, mean, var);
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += w[i] * y[i];
      return sum;
    };
    std::vector<double> numeric = numeric_gradient(params, loss);
    std::vector<double> y, mean, var, grad_x(n), grad_gamma(c), grad_beta(c);
    forward(params, y, mean, var);
    batchnorm_activation_backward_reference<double>(act, cdense(y.data(), l), cdense(w.data(), l),
                                                    cdense(params.data(), l), params.data() + n, mean.data(),
                                                    var.data(), dense(grad_x.data(), l), grad_gamma.data(),
                                                    grad_beta.data());
    std::vector<double> analytic = grad_x;
    analytic.insert(analytic.end(), grad_gamma.begin(), grad_gamma.end());
    analytic.insert(analytic.end(), grad_beta.begin(), grad_beta.end());
    CHECK_CLOSE(analytic, numeric, 1e-6, 1e-5);
  }
}

TEST_CASE("batchnorm: hand-computed statistics and the cuDNN running-statistics convention") {
  // The reference, in double.
  std::vector<double> x = {1, -2, 2, 0, 3, 2, 4, 4}, y(8), gamma = {1, 1}, beta = {0, 0}, mean(2), var(2),
                      rm = {0, 1}, rv = {1, 2};
  batchnorm_forward_training_reference<double>(nhwc<const double>(x.data(), 1, 2, 2, 2), gamma.data(), beta.data(),
                                               nhwc(y.data(), 1, 2, 2, 2), mean.data(), var.data(), rm.data(), rv.data());
  CHECK(mean[0] == doctest::Approx(2.5));
  CHECK(var[0] == doctest::Approx(1.25));
  CHECK(var[1] == doctest::Approx(5.0));
  CHECK(rm[0] == doctest::Approx(0.025));
  CHECK(rv[0] == doctest::Approx(0.99 + 0.01 * 5.0 / 3.0));
  CHECK(rv[1] == doctest::Approx(1.98 + 0.01 * 20.0 / 3.0));
  check_hand_computed({Device::cpu(), false});
}

TEST_CASE("batchnorm: cuda hand-computed statistics") {
  KERNEL_TEST_DEVICE(device);
  check_hand_computed({device, true});
}

// The CPU version once per micro-kernel variant this CPU runs (its channel loops: cpu_micro.h).
namespace {
void per_cpu_isa(CpuKernel kernel, void (*check)(const Impl&)) {
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, kernel);
    check({Device::cpu(), false});
    CHECK(use.runs() > 0);  // the variant asked for is the one that ran
  }
}
}  // namespace

TEST_CASE("batchnorm: cpu training forward matches the reference, in each micro-kernel variant") {
  per_cpu_isa(CpuKernel::BatchnormForward, check_forward_training);
}
TEST_CASE("batchnorm: cpu inference forward matches the reference, in each micro-kernel variant") {
  per_cpu_isa(CpuKernel::BatchnormForward, check_forward_inference);
}
TEST_CASE("batchnorm: cpu backward matches the reference, in each micro-kernel variant") {
  per_cpu_isa(CpuKernel::BatchnormBackward, check_backward);
}

// Means near 1000 with spread 1: sums of squares about zero would lose the variance to
// cancellation in float; the CPU version sums (x - shift) and its squares in double, shift being
// the first pixel, and keeps it to 1e-4 relative (as the synchronized phases: batchnorm_sync).
TEST_CASE("batchnorm: cpu means far from zero keep the variance accurate, in each micro-kernel variant") {
  Rng rng;
  CAPTURE(rng.seed());
  const Slice l{4, 33, 29, 21, 21, 0};
  std::vector<float> x(l.size());
  for (float& v : x) v = 1000.0f + rng.uniform(-1.0f, 1.0f);
  Params p = random_params(rng, l.c);
  ForwardRef ref = reference_training(Activation::Leaky, gather<double>(x, l), l, p);
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, CpuKernel::BatchnormForward);
    std::vector<float> y(l.size()), mean(size_t(l.c)), var(size_t(l.c)), running_mean = p.running_mean,
                                                                         running_var = p.running_var;
    batchnorm_activation_forward_training_cpu(Activation::Leaky, cdense(x.data(), l), p.gamma.data(), p.beta.data(),
                                              dense(y.data(), l), mean.data(), var.data(), running_mean.data(),
                                              running_var.data(), nullptr, 0);
    CHECK_CLOSE(var, ref.var, 0, 1e-4);
    CHECK_CLOSE(mean, ref.mean, 0, 1e-6);
    CHECK_CLOSE(running_var, ref.running_var, 0, 1e-5);
    CHECK_CLOSE(gather<float>(y, l), ref.y, 5e-4, 1e-4);
    CHECK(use.runs() == 2);  // the statistics and the normalisation, in this variant
  }
}

TEST_CASE("batchnorm: cuda training forward matches the reference, bit-identical when repeated") {
  KERNEL_TEST_DEVICE(device);
  check_forward_training({device, true});
}
TEST_CASE("batchnorm: cuda inference forward matches the reference, bit-identical when repeated") {
  KERNEL_TEST_DEVICE(device);
  check_forward_inference({device, true});
}
TEST_CASE("batchnorm: cuda backward matches the reference, bit-identical when repeated") {
  KERNEL_TEST_DEVICE(device);
  check_backward({device, true});
}

TEST_CASE("batchnorm: bad arguments are reported") {
  std::vector<float> a(64, 1.0f), b(64), s(8, 1.0f), t(8), u(8);
  ConstAct x = nhwc<const float>(a.data(), 1, 2, 2, 8);
  Act y = nhwc(b.data(), 1, 2, 2, 8);
  CHECK_THROWS_WITH_AS(batchnorm_forward_training_cpu(nhwc<const float>(a.data(), 1, 2, 2, 8, 4), s.data(), s.data(), y,
                                                      t.data(), u.data(), nullptr, nullptr, nullptr, 0),
                       doctest::Contains("stride"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_forward_training_cpu(x, nullptr, s.data(), y, t.data(), u.data(), nullptr, nullptr,
                                                      nullptr, 0),
                       doctest::Contains("gamma"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_forward_training_cpu(x, s.data(), s.data(), y, t.data(), u.data(), t.data(), nullptr,
                                                      nullptr, 0),
                       doctest::Contains("running"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_forward_training_cpu(nhwc<const float>(a.data(), 0, 2, 2, 8), s.data(), s.data(),
                                                      nhwc(b.data(), 0, 2, 2, 8), t.data(), u.data(), nullptr, nullptr,
                                                      nullptr, 0),
                       doctest::Contains("at least one pixel"), Error);
  CHECK_THROWS_AS(batchnorm_forward_inference_cpu(x, s.data(), s.data(), s.data(), s.data(), nhwc(b.data(), 1, 4, 1, 8)),
                  Error);
  CHECK_THROWS_AS(batchnorm_activation_backward_cpu(Activation::Leaky, ConstAct{}, x, x, s.data(), s.data(), s.data(), y,
                                                    t.data(), u.data(), nullptr, 0),
                  Error);  // the fused backward needs y
  CHECK_THROWS_AS(batchnorm_workspace_bytes(-1, 2, 2, 8), Error);
  CHECK_THROWS_AS(batchnorm_forward_training_reference<float>(x, s.data(), s.data(), nhwc(b.data(), 1, 2, 2, 7),
                                                              t.data(), u.data(), nullptr, nullptr),
                  Error);
}

TEST_CASE("batchnorm: cuda launchers check their arguments and workspace") {
  KERNEL_TEST_DEVICE(device);
  DeviceArray<float> a(device, 64), b(device, 64), s(device, 8), t(device, 8), u(device, 8);
  ConstAct x = nhwc<const float>(a.data(), 1, 2, 2, 8);
  Act y = nhwc(b.data(), 1, 2, 2, 8);
  size_t need = batchnorm_workspace_bytes(1, 2, 2, 8);
  REQUIRE(need > 0);
  DeviceArray<unsigned char> workspace(device, need);
  CHECK_THROWS_WITH_AS(batchnorm_forward_training_cuda(x, s.data(), s.data(), y, t.data(), u.data(), nullptr, nullptr,
                                                       workspace.data(), need - 1, nullptr),
                       doctest::Contains("workspace"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_backward_cuda(x, x, s.data(), s.data(), s.data(), y, t.data(), u.data(), nullptr, need,
                                               nullptr),
                       doctest::Contains("workspace"), Error);
  CHECK_THROWS_WITH_AS(batchnorm_forward_inference_cuda(nhwc<const float>(a.data(), 1, 2, 2, 8, 4), s.data(), s.data(),
                                                        s.data(), s.data(), y, nullptr),
                       doctest::Contains("stride"), Error);
}
