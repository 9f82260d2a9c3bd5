// Softmax cross-entropy: a hand-computed case, the reference gradient against finite differences,
// the fast CPU version and the CUDA kernel against the reference (class counts below and above a
// warp, large logits), optional outputs, bad labels (CPU throws naming the sample, CUDA sets the
// flag), determinism, and argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/softmax.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

std::vector<int> labels_for(Rng& rng, int n, int k) {
  std::vector<int> labels(static_cast<size_t>(n));
  for (int& l : labels) l = rng.integer(0, k - 1);
  return labels;
}

struct Run {
  float loss = NAN;
  std::vector<float> grad, prob;
};

struct Case {
  int n, k;
  float scale;  // logits uniform in [-scale, scale]
};
// Class counts under, at and over a warp; one with logits large enough to overflow a naive exp.
const Case kCases[] = {{37, 10, 3.0f}, {5, 70, 2.0f}, {1, 1, 1.0f}, {64, 32, 4.0f}, {9, 13, 200.0f}, {0, 10, 1.0f}};

template <typename Op>
void compare_with_reference(Rng& rng, const Op& op) {
  for (const Case& c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.k);
    CAPTURE(c.scale);
    std::vector<float> logits = rng.floats(size_t(c.n) * c.k, -c.scale, c.scale);
    std::vector<int> labels = labels_for(rng, c.n, c.k);
    std::vector<double> logits_d = to_double(logits), grad(logits.size()), prob(logits.size());
    double loss = 0;
    softmax_cross_entropy_reference<double>(logits_d.data(), labels.data(), c.n, c.k, &loss, grad.data(), prob.data());
    Run run = op(logits, labels, c.n, c.k);
    CHECK(close(run.loss, loss, 1e-5 * (1 + c.n), 1e-4));
    CHECK_CLOSE(run.grad, grad, 1e-6, 1e-4);
    CHECK_CLOSE(run.prob, prob, 1e-6, 1e-4);
  }
}

}  // namespace

TEST_CASE("softmax: a hand-computed case") {
  std::vector<double> logits = {0, 0, std::log(2.0), 5, 5, 5};  // two samples, three classes
  std::vector<int> labels = {2, 0};
  std::vector<double> grad(6), prob(6);
  double loss = -1;
  softmax_cross_entropy_reference<double>(logits.data(), labels.data(), 2, 3, &loss, grad.data(), prob.data());
  CHECK(loss == doctest::Approx(-std::log(0.5) - std::log(1.0 / 3)));
  CHECK(prob[0] == doctest::Approx(0.25));
  CHECK(prob[2] == doctest::Approx(0.5));
  CHECK(grad[2] == doctest::Approx(-0.5));
  CHECK(grad[3] == doctest::Approx(1.0 / 3 - 1));
  CHECK(grad[5] == doctest::Approx(1.0 / 3));
}

TEST_CASE("softmax: reference gradient matches finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  for (auto [n, k] : {std::pair{3, 5}, {4, 1}, {2, 40}}) {
    CAPTURE(n);
    CAPTURE(k);
    std::vector<double> logits = to_double(rng.floats(size_t(n) * k, -3.0f, 3.0f));
    std::vector<int> labels = labels_for(rng, n, k);
    auto loss = [&](const std::vector<double>& x) {
      double l = 0;
      softmax_cross_entropy_reference<double>(x.data(), labels.data(), n, k, &l, nullptr, nullptr);
      return l;
    };
    std::vector<double> grad(logits.size());
    softmax_cross_entropy_reference<double>(logits.data(), labels.data(), n, k, nullptr, grad.data(), nullptr);
    CHECK_CLOSE(grad, numeric_gradient(logits, loss), 1e-7, 1e-6);
  }
}

TEST_CASE("softmax: cpu matches the reference") {
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(rng, [](const std::vector<float>& logits, const std::vector<int>& labels, int n, int k) {
    Run run{NAN, std::vector<float>(logits.size(), NAN), std::vector<float>(logits.size(), NAN)};
    softmax_cross_entropy_cpu(logits.data(), labels.data(), n, k, &run.loss, run.grad.data(), run.prob.data());
    float loss_only = NAN;  // the optional outputs change nothing else
    softmax_cross_entropy_cpu(logits.data(), labels.data(), n, k, &loss_only, nullptr, nullptr);
    CHECK(std::memcmp(&loss_only, &run.loss, sizeof(float)) == 0);
    return run;
  });
}

TEST_CASE("softmax: cuda matches the reference and repeats bit for bit") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(rng, [&](const std::vector<float>& logits, const std::vector<int>& labels, int n, int k) {
    DeviceArray<float> d_logits(device, logits), d_grad(device, logits.size()), d_prob(device, logits.size()),
        d_loss(device, 1);
    DeviceArray<int> d_labels(device, labels), d_flag(device, std::vector<int>{0});
    auto run = [&] {
      d_grad.poison();
      d_prob.poison();
      d_loss.poison();
      softmax_cross_entropy_cuda(d_logits.data(), d_labels.data(), n, k, d_loss.data(), d_grad.data(), d_prob.data(),
                                 d_flag.data(), nullptr);
      return Run{d_loss.download()[0], d_grad.download(), d_prob.download()};
    };
    Run first = run(), second = run();
    CHECK(std::memcmp(&first.loss, &second.loss, sizeof(float)) == 0);
    CHECK(same_bits(first.grad, second.grad));
    CHECK(d_flag.download()[0] == 0);
    return first;
  });
}

TEST_CASE("softmax: cuda's loss scale multiplies the gradient only, by value or read from device memory") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 13, k = 37;
  const std::vector<float> logits = rng.floats(size_t(n) * k, -4.0f, 4.0f);
  std::vector<int> labels = labels_for(rng, n, k);
  DeviceArray<float> d_logits(device, logits), d_grad(device, logits.size()), d_loss(device, 1), d_scale(device, 1);
  DeviceArray<int> d_labels(device, labels), d_flag(device, std::vector<int>{0});
  auto run = [&](float scale, bool from_memory) {
    d_grad.poison();
    d_loss.poison();
    d_scale.upload(std::vector<float>{scale});
    softmax_cross_entropy_cuda(d_logits.data(), d_labels.data(), n, k, d_loss.data(), d_grad.data(), nullptr,
                               d_flag.data(), nullptr, from_memory ? 1.0f : scale,
                               from_memory ? d_scale.data() : nullptr);
    return Run{d_loss.download()[0], d_grad.download(), {}};
  };
  const Run unscaled = run(1.0f, false);
  for (float scale : {16.0f, 0.5f}) {  // powers of two: scaling is exact
    CAPTURE(scale);
    std::vector<float> want = unscaled.grad;
    for (float& x : want) x *= scale;
    for (bool from_memory : {false, true}) {
      CAPTURE(from_memory);
      const Run r = run(scale, from_memory);
      CHECK(same_bits(r.grad, want));
      CHECK(std::memcmp(&r.loss, &unscaled.loss, sizeof(float)) == 0);
    }
  }
}

TEST_CASE("softmax: a label outside [0, k) is reported") {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 40, k = 10;
  std::vector<float> logits = rng.floats(size_t(n) * k);
  for (int bad : {-1, 10, 1000}) {
    CAPTURE(bad);
    std::vector<int> labels = labels_for(rng, n, k);
    labels[17] = bad;
    std::vector<float> grad(logits.size(), 42.0f);
    float loss = 42.0f;
    CHECK_THROWS_WITH_AS(softmax_cross_entropy_cpu(logits.data(), labels.data(), n, k, &loss, grad.data(), nullptr),
                         doctest::Contains(("sample 17 has label " + std::to_string(bad)).c_str()), Error);
    CHECK(loss == 42.0f);  // nothing written
    std::vector<double> logits_d = to_double(logits);
    CHECK_THROWS_WITH_AS(softmax_cross_entropy_reference<double>(logits_d.data(), labels.data(), n, k, nullptr,
                                                                 nullptr, nullptr),
                         doctest::Contains("sample 17"), Error);
  }
  KERNEL_TEST_DEVICE(device);  // the CPU part above runs in every build
  std::vector<int> labels = labels_for(rng, n, k);
  labels[5] = -3;
  labels[23] = k;
  DeviceArray<float> d_logits(device, logits), d_loss(device, 1);
  DeviceArray<int> d_labels(device, labels), d_flag(device, std::vector<int>{0});
  softmax_cross_entropy_cuda(d_logits.data(), d_labels.data(), n, k, d_loss.data(), nullptr, nullptr, d_flag.data(),
                             nullptr);
  CHECK(d_flag.download()[0] == 24);  // 1 + the last bad sample
  // The loss leaves the bad samples out.
  labels[5] = labels[23] = 0;
  std::vector<double> logits_d = to_double(logits), per_sample(1);
  double expected = 0;
  for (int i = 0; i < n; ++i)
    if (i != 5 && i != 23) {
      softmax_cross_entropy_reference<double>(logits_d.data() + size_t(i) * k, labels.data() + i, 1, k,
                                              per_sample.data(), nullptr, nullptr);
      expected += per_sample[0];
    }
  CHECK(close(d_loss.download()[0], expected, 1e-4, 1e-4));
  // The flag is never cleared by a clean batch.
  d_labels.upload(labels);
  softmax_cross_entropy_cuda(d_logits.data(), d_labels.data(), n, k, d_loss.data(), nullptr, nullptr, d_flag.data(),
                             nullptr);
  CHECK(d_flag.download()[0] == 24);
}

TEST_CASE("softmax: bad arguments are reported") {
  std::vector<float> logits(20), grad(20);
  std::vector<int> labels(4, 0), flag(1, 0);
  float loss = 0;
  CHECK_NOTHROW(softmax_cross_entropy_cpu(logits.data(), labels.data(), 4, 5, &loss, grad.data(), nullptr));
  CHECK(loss == doctest::Approx(4 * std::log(5.0)));
  CHECK_THROWS_AS(softmax_cross_entropy_cpu(logits.data(), labels.data(), -1, 5, &loss, nullptr, nullptr), Error);
  CHECK_THROWS_AS(softmax_cross_entropy_cpu(logits.data(), labels.data(), 4, 0, &loss, nullptr, nullptr), Error);
  CHECK_THROWS_AS(softmax_cross_entropy_cpu(nullptr, labels.data(), 4, 5, &loss, nullptr, nullptr), Error);
  CHECK_THROWS_AS(softmax_cross_entropy_cuda(logits.data(), nullptr, 4, 5, &loss, nullptr, nullptr, flag.data(), nullptr),
                  Error);
  CHECK_THROWS_WITH_AS(softmax_cross_entropy_cuda(logits.data(), labels.data(), 4, 5, &loss, nullptr, nullptr, nullptr,
                                                  nullptr),
                       doctest::Contains("bad_label"), Error);
}

namespace {

// 16-bit logits: against the float reference on their widened values, the gradient rounded once
// (expf may differ in the last FP32 bit: within 1 ulp of T, 99% bit for bit), loss and
// probabilities in FP32.
template <typename T>
void check_softmax_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 37, k = 13;
  const std::vector<T> logits = random_storage<T>(rng, size_t(n) * k, -4.0f, 4.0f, false);
  std::vector<int> labels(n);
  for (int& l : labels) l = rng.integer(0, k - 1);
  const std::vector<float> widened_logits = widened(logits);
  std::vector<float> ref_grad(size_t(n) * k), ref_prob(size_t(n) * k);
  float ref_loss = 0;
  softmax_cross_entropy_reference<float>(widened_logits.data(), labels.data(), n, k, &ref_loss, ref_grad.data(),
                                         ref_prob.data());
  DeviceArray<T> d_logits(device, logits), d_grad(device, size_t(n) * k);
  DeviceArray<int> d_labels(device, labels), d_flag(device, std::vector<int>{0});
  DeviceArray<float> d_loss(device, 1), d_prob(device, size_t(n) * k);
  d_grad.poison();
  softmax_cross_entropy_cuda<T>(d_logits.data(), d_labels.data(), n, k, d_loss.data(), d_grad.data(), d_prob.data(),
                                d_flag.data(), nullptr);
  check_rounded_once(d_grad.download(), ref_grad, 1, 0.99);
  CHECK_CLOSE(d_prob.download(), ref_prob, 1e-6, 1e-5);
  CHECK(close(d_loss.download()[0], ref_loss, 1e-5, 1e-5));
  CHECK(d_flag.download()[0] == 0);
}

}  // namespace

TEST_CASE("softmax: cuda on bf16 and fp16 logits: the FP32 gradient rounded once") {
  KERNEL_TEST_DEVICE(device);
  check_softmax_storage<Bf16>(device);
  check_softmax_storage<Fp16>(device);
}
