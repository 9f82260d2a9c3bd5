// The fast CPU ops give the same bits whatever the number of pool threads (DESIGN.md,
// deterministic training): each op runs with 1, 2, 3 and 5 threads on the same inputs.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>

#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/cpu_parallel.h"
#include "kernels/gemm.h"
#include "tests/cpu_isa_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// Runs `op` (which fills `out`) with each pool size and checks every run matches the first.
void check_thread_independent(const std::function<void(std::vector<float>&)>& op) {
  int saved = cpu_pool_threads();
  std::vector<float> first;
  for (int threads : {1, 2, 3, 5}) {
    CAPTURE(threads);
    set_cpu_pool_threads(threads);
    std::vector<float> out;
    op(out);
    if (first.empty()) first = out;
    REQUIRE(out.size() == first.size());
    CHECK(std::memcmp(out.data(), first.data(), out.size() * sizeof(float)) == 0);
  }
  set_cpu_pool_threads(saved);
}

}  // namespace

TEST_CASE("cpu ops: conv results do not depend on the number of threads, in each micro-kernel variant") {
  Rng rng;
  CAPTURE(rng.seed());
  Conv2dShape s{3, 23, 17, 13, 21, 3, 2};
  std::vector<float> in = rng.floats(size_t(s.n) * s.h * s.w * s.c_in);
  std::vector<float> weights = rng.floats(s.weight_count());
  std::vector<float> grad_out = rng.floats(size_t(s.n) * s.out_h() * s.out_w() * s.c_out);
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, CpuKernel::ConvForward);
    check_thread_independent([&](std::vector<float>& out) {
      out.assign(grad_out.size(), 0.0f);
      conv2d_forward_cpu(s, nhwc(static_cast<const float*>(in.data()), s.n, s.h, s.w, s.c_in), weights.data(), nullptr,
                         nhwc(out.data(), s.n, s.out_h(), s.out_w(), s.c_out), nullptr, 0);
      std::vector<float> grad_weights(weights.size()), grad_bias(size_t(s.c_out));
      conv2d_backward_weights_cpu(s, nhwc(static_cast<const float*>(in.data()), s.n, s.h, s.w, s.c_in),
                                  nhwc(static_cast<const float*>(grad_out.data()), s.n, s.out_h(), s.out_w(), s.c_out),
                                  grad_weights.data(), grad_bias.data(), nullptr, 0);
      out.insert(out.end(), grad_weights.begin(), grad_weights.end());
      out.insert(out.end(), grad_bias.begin(), grad_bias.end());
    });
    CHECK(use.runs() == 4);  // one forward per thread count, in this variant
  }
}

TEST_CASE("cpu ops: batchnorm statistics and gradients do not depend on the number of threads, in each variant") {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 3, h = 19, w = 13, c = 11;
  size_t count = size_t(n) * h * w * c;
  std::vector<float> x = rng.floats(count), grad_y = rng.floats(count);
  std::vector<float> gamma = rng.floats(size_t(c), 0.5f, 1.5f), beta = rng.floats(size_t(c));
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, CpuKernel::BatchnormBackward);
    check_thread_independent([&](std::vector<float>& out) {
      const size_t channels = size_t(c);
      std::vector<float> y(count), mean(channels), var(channels), grad_x(count), grad_gamma(channels),
          grad_beta(channels);
      std::vector<float> running_mean(channels, 0.0f), running_var(channels, 1.0f);
      auto xv = nhwc(static_cast<const float*>(x.data()), n, h, w, c);
      batchnorm_activation_forward_training_cpu(Activation::Leaky, xv, gamma.data(), beta.data(),
                                                nhwc(y.data(), n, h, w, c), mean.data(), var.data(),
                                                running_mean.data(), running_var.data(), nullptr, 0);
      batchnorm_activation_backward_cpu(Activation::Leaky, nhwc(static_cast<const float*>(y.data()), n, h, w, c),
                                        nhwc(static_cast<const float*>(grad_y.data()), n, h, w, c), xv, gamma.data(),
                                        mean.data(), var.data(), nhwc(grad_x.data(), n, h, w, c), grad_gamma.data(),
                                        grad_beta.data(), nullptr, 0);
      out = y;
      for (const auto* v : {&mean, &var, &running_mean, &running_var, &grad_x, &grad_gamma, &grad_beta})
        out.insert(out.end(), v->begin(), v->end());
    });
    CHECK(use.runs() == 4);  // one backward per thread count, in this variant
  }
}

TEST_CASE("cpu ops: gemm results do not depend on the number of threads, in each micro-kernel variant") {
  // gemm_cpu's work items follow the thread count (column and row groups); the sums must not.
  Rng rng;
  CAPTURE(rng.seed());
  const GemmShape shapes[] = {{141, 203, 517, false, true}, {203, 141, 300, true, false}};
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, CpuKernel::Gemm);
    for (const GemmShape& s : shapes) {
      const std::vector<float> a = rng.floats(size_t(s.m) * s.k), b = rng.floats(size_t(s.k) * s.n);
      const std::vector<float> bias = rng.floats(size_t(s.n));
      check_thread_independent([&](std::vector<float>& out) {
        out.assign(size_t(s.m) * s.n, 0.0f);
        gemm_cpu(s, a.data(), b.data(), bias.data(), out.data(), false, nullptr, 0);
      });
    }
    CHECK(use.runs() == 8);
  }
}
