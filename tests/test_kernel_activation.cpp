// Activations: darknet names, the reference backward against finite differences, and the fast
// CPU version and the CUDA kernels against the reference on channel slices, in place too; the
// CUDA kernels on 16-bit tensors (Bf16, Fp16): the FP32 result rounded once, Inf/NaN propagated.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

constexpr Activation kAllKinds[] = {Activation::Linear, Activation::Leaky, Activation::Relu, Activation::Logistic};

std::vector<double> reference_forward(Activation kind, const std::vector<double>& x, const Slice& l) {
  std::vector<double> y(x.size());
  activation_forward_reference<double>(kind, nhwc(x.data(), l.n, l.h, l.w, l.c), nhwc(y.data(), l.n, l.h, l.w, l.c));
  return y;
}

std::vector<double> reference_backward(Activation kind, const std::vector<double>& y, const std::vector<double>& grad_y,
                                       const Slice& l) {
  std::vector<double> grad_x(y.size());
  activation_backward_reference<double>(kind, nhwc(y.data(), l.n, l.h, l.w, l.c), nhwc(grad_y.data(), l.n, l.h, l.w, l.c),
                                        nhwc(grad_x.data(), l.n, l.h, l.w, l.c));
  return grad_x;
}

// Odd sizes; the second and fourth take the float4 path on the device, the first is a slice
// with a scalar path, the second a slice at a 16-byte offset.
const Slice kSlices[] = {{3, 7, 5, 13, 16, 1}, {2, 5, 3, 16, 24, 4}, {1, 3, 3, 3, 3, 0}, {3, 1, 1, 8, 8, 0}};

// Forward and backward of every kind on every layout, out of place and in place, against the
// reference; on a device each launch is repeated and must give the same bits.
void check_against_reference(Device device, bool cuda) {
  Rng rng;
  CAPTURE(rng.seed());
  auto forward = [&](Activation kind, ConstAct x, Act y) {
    if (cuda) activation_forward_cuda(kind, x, y, nullptr);
    else activation_forward_cpu(kind, x, y);
  };
  auto backward = [&](Activation kind, ConstAct y, ConstAct grad_y, Act grad_x) {
    if (cuda) activation_backward_cuda(kind, y, grad_y, grad_x, nullptr);
    else activation_backward_cpu(kind, y, grad_y, grad_x);
  };
  for (const Slice& l : kSlices) {
    for (Activation kind : kAllKinds) {
      const std::string kind_name = activation_name(kind);
      CAPTURE(kind_name);
      CAPTURE(l);
      std::vector<float> x = rng.floats(l.size(), -2.0f, 2.0f), grad_y = rng.floats(l.size());
      std::vector<double> y_ref = reference_forward(kind, gather<double>(x, l), l);
      // The backward's y: the forward's output (in float), written into a buffer of the same layout.
      std::vector<float> y_in = x;
      scatter(y_in, l, y_ref);
      std::vector<double> grad_x_ref = reference_backward(kind, gather<double>(y_in, l), gather<double>(grad_y, l), l);

      DeviceArray<float> d_x(device, x), d_y(device, l.size()), d_y_in(device, y_in), d_grad_y(device, grad_y),
          d_grad_x(device, l.size());
      d_y.poison();
      forward(kind, l.on<const float>(d_x.data()), l.on(d_y.data()));
      std::vector<float> y = d_y.download();
      CHECK_CLOSE(gather<float>(y, l), y_ref, 1e-6, 1e-5);
      CHECK(written_outside(y, l) == 0);

      d_grad_x.poison();
      backward(kind, l.on<const float>(d_y_in.data()), l.on<const float>(d_grad_y.data()), l.on(d_grad_x.data()));
      std::vector<float> grad_x = d_grad_x.download();
      CHECK_CLOSE(gather<float>(grad_x, l), grad_x_ref, 1e-6, 1e-5);
      CHECK(written_outside(grad_x, l) == 0);

      if (cuda) {  // the same launches again: the same bits
        d_y.poison();
        forward(kind, l.on<const float>(d_x.data()), l.on(d_y.data()));
        CHECK(same_bits(d_y.download(), y));
        d_grad_x.poison();
        backward(kind, l.on<const float>(d_y_in.data()), l.on<const float>(d_grad_y.data()), l.on(d_grad_x.data()));
        CHECK(same_bits(d_grad_x.download(), grad_x));
      }

      // In place: y over x, grad_x over grad_y.
      DeviceArray<float> d_inplace(device, x);
      forward(kind, l.on<const float>(d_inplace.data()), l.on(d_inplace.data()));
      CHECK_CLOSE(gather<float>(d_inplace.download(), l), y_ref, 1e-6, 1e-5);
      d_inplace.upload(grad_y);
      backward(kind, l.on<const float>(d_y_in.data()), l.on<const float>(d_inplace.data()), l.on(d_inplace.data()));
      CHECK_CLOSE(gather<float>(d_inplace.download(), l), grad_x_ref, 1e-6, 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("activation: darknet names parse, unknown names are reported") {
  CHECK(activation_from_name("linear") == Activation::Linear);
  CHECK(activation_from_name("leaky") == Activation::Leaky);
  CHECK(activation_from_name("relu") == Activation::Relu);
  CHECK(activation_from_name("logistic") == Activation::Logistic);
  for (Activation kind : kAllKinds) CHECK(activation_from_name(activation_name(kind)) == kind);
  CHECK_THROWS_WITH_AS(activation_from_name("mish"), doctest::Contains("'mish'"), Error);
  CHECK_THROWS_AS(activation_from_name("Leaky"), Error);
}

TEST_CASE("activation: hand-computed values, derivatives taken from the output") {
  CHECK(activate(Activation::Leaky, -2.0) == doctest::Approx(-0.2));
  CHECK(activate(Activation::Leaky, 3.0) == 3.0);
  CHECK(activate(Activation::Relu, -2.0) == 0.0);
  CHECK(activate(Activation::Logistic, 0.0) == 0.5);
  CHECK(activate(Activation::Linear, -7.5) == -7.5);
  CHECK(activation_gradient_from_output(Activation::Leaky, -0.2) == doctest::Approx(0.1));
  CHECK(activation_gradient_from_output(Activation::Leaky, 0.5) == 1.0);
  CHECK(activation_gradient_from_output(Activation::Relu, 0.0) == 0.0);
  CHECK(activation_gradient_from_output(Activation::Logistic, 0.5) == 0.25);
  CHECK(activation_gradient_from_output(Activation::Linear, -3.0) == 1.0);
}

TEST_CASE("activation: reference backward matches finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  const Slice l{2, 3, 2, 5, 5, 0};
  for (Activation kind : kAllKinds) {
    const std::string kind_name = activation_name(kind);
      CAPTURE(kind_name);
    // Inputs at least 0.05 away from the kink at 0, either sign.
    std::vector<double> x(l.pixels() * size_t(l.c)), w(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = (rng.integer(0, 1) ? 1.0 : -1.0) * rng.uniform(0.05f, 2.0f);
      w[i] = rng.uniform(-1.0f, 1.0f);
    }
    auto loss = [&](const std::vector<double>& input) {
      std::vector<double> y = reference_forward(kind, input, l);
      double sum = 0;
      for (size_t i = 0; i < y.size(); ++i) sum += w[i] * y[i];
      return sum;
    };
    std::vector<double> numeric = numeric_gradient(x, loss);
    std::vector<double> analytic = reference_backward(kind, reference_forward(kind, x, l), w, l);
    CHECK_CLOSE(analytic, numeric, 1e-7, 1e-6);
  }
}

TEST_CASE("activation: cpu matches the reference on slices and in place") { check_against_reference(Device::cpu(), false); }

TEST_CASE("activation: cuda matches the reference on slices and in place, bit-identical when repeated") {
  KERNEL_TEST_DEVICE(device);
  check_against_reference(device, true);
}

TEST_CASE("activation: bad arguments are reported") {
  std::vector<float> a(64), b(64);
  Act narrow = nhwc(a.data(), 1, 2, 2, 8, 4);  // stride < c
  CHECK_THROWS_WITH_AS(activation_forward_cpu(Activation::Leaky, as_const(narrow), nhwc(b.data(), 1, 2, 2, 8)),
                       doctest::Contains("stride"), Error);
  CHECK_THROWS_AS(activation_forward_cpu(Activation::Leaky, nhwc<const float>(a.data(), 1, 2, 2, 8),
                                         nhwc(b.data(), 1, 2, 4, 4)),
                  Error);  // same element count, other shape
  CHECK_THROWS_WITH_AS(activation_forward_cpu(Activation::Relu, nhwc<const float>(nullptr, 1, 2, 2, 8),
                                              nhwc(b.data(), 1, 2, 2, 8)),
                       doctest::Contains("null"), Error);
  CHECK_THROWS_AS(activation_backward_cpu(Activation::Relu, nhwc<const float>(a.data(), -1, 2, 2, 8),
                                          nhwc<const float>(a.data(), -1, 2, 2, 8), nhwc(b.data(), -1, 2, 2, 8)),
                  Error);
  CHECK_THROWS_AS(activation_forward_reference<float>(Activation::Leaky, as_const(narrow), nhwc(b.data(), 1, 2, 2, 8)),
                  Error);
  // Empty tensors are fine and touch nothing.
  activation_forward_cpu(Activation::Leaky, nhwc<const float>(nullptr, 0, 2, 2, 8), nhwc<float>(nullptr, 0, 2, 2, 8));
}

TEST_CASE("activation: cuda launchers check their arguments") {
  KERNEL_TEST_DEVICE(device);
  DeviceArray<float> a(device, 64), b(device, 64);
  CHECK_THROWS_WITH_AS(activation_forward_cuda(Activation::Leaky, nhwc<const float>(a.data(), 1, 2, 2, 8, 4),
                                               nhwc(b.data(), 1, 2, 2, 8), nullptr),
                       doctest::Contains("stride"), Error);
  CHECK_THROWS_AS(activation_backward_cuda(Activation::Leaky, nhwc<const float>(a.data(), 1, 2, 2, 8),
                                           nhwc<const float>(a.data(), 1, 2, 2, 7), nhwc(b.data(), 1, 2, 2, 8), nullptr),
                  Error);
}

namespace {

// 16-bit storage: every kind on slices of both access paths (16-byte vectors where c, stride
// and offset are multiples of 8), outputs poisoned and their gaps checked, against the FP32
// result of the same (widened) inputs rounded once to T.
template <typename T>
void check_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  const Slice slices[] = {{3, 7, 5, 13, 16, 1}, {2, 3, 5, 16, 24, 8}, {1, 3, 3, 3, 3, 0}, {2, 2, 2, 32, 32, 0}};
  for (const Slice& l : slices) {
    for (Activation kind : kAllKinds) {
      const std::string kind_name = activation_name(kind);
      CAPTURE(kind_name);
      CAPTURE(l);
      const std::vector<T> x = random_storage<T>(rng, l.size(), -3.0f, 3.0f, true);
      const std::vector<T> grad_y = random_storage<T>(rng, l.size(), -1.0f, 1.0f, true);
      const std::vector<float> xf = widened(x), gf = widened(grad_y);
      std::vector<T> poison(l.size());
      std::memset(poison.data(), 0xff, poison.size() * sizeof(T));
      DeviceArray<T> d_x(device, x), d_g(device, grad_y), d_y(device, poison), d_gx(device, poison);
      activation_forward_cuda<T>(kind, l.on<const T>(d_x.data()), l.on<T>(d_y.data()), nullptr);
      const std::vector<T> y = d_y.download();
      // The backward's y: what the forward stored.
      activation_backward_cuda<T>(kind, l.on<const T>(d_y.data()), l.on<const T>(d_g.data()), l.on<T>(d_gx.data()),
                                  nullptr);
      const std::vector<T> gx = d_gx.download();
      std::vector<T> y_in, gx_in;
      std::vector<float> y_fp32, gx_fp32;
      size_t gap_writes = 0;
      for (size_t i = 0; i < l.size(); ++i) {
        const size_t ch = i % size_t(l.stride);
        if (ch < size_t(l.offset) || ch >= size_t(l.offset + l.c)) {
          gap_writes += y[i].bits != 0xffff || gx[i].bits != 0xffff;
          continue;
        }
        y_in.push_back(y[i]), gx_in.push_back(gx[i]);
        y_fp32.push_back(activate(kind, xf[i]));
        gx_fp32.push_back(gf[i] * activation_gradient_from_output(kind, to_float(y[i])));
      }
      CHECK(gap_writes == 0);
      // Logistic uses expf, whose last FP32 bit may differ between host and device.
      const bool exact = kind != Activation::Logistic;
      check_rounded_once(y_in, y_fp32, exact ? 0 : 1, exact ? 1.0 : 0.99);
      check_rounded_once(gx_in, gx_fp32, exact ? 0 : 1, exact ? 1.0 : 0.99);
    }
  }
}

}  // namespace

TEST_CASE("activation: cuda kernels on bf16 and fp16 tensors give the FP32 result rounded once; Inf/NaN propagate") {
  KERNEL_TEST_DEVICE(device);
  check_storage<Bf16>(device);
  check_storage<Fp16>(device);
}
