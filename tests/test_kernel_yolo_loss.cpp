// YOLO layer loss (kernels/yolo_loss.h): the reference gradient against finite differences of its
// loss, hand-built cases with known targets (run on every implementation available here), and
// the CPU and CUDA versions against the reference on random inputs, statistics included.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/yolo_loss.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

const std::vector<float> kYolov3Anchors = {10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326};

// One op call's inputs: an input buffer of n*h*w*stride floats whose view starts at `offset`.
struct Case {
  YoloLossConfig config;
  int n = 1, h = 1, w = 1, c = 0, stride = 0, offset = 0;
  std::vector<float> input;
  std::vector<YoloTruth> truths;  // n rows of truth_stride
  int truth_stride = 0;
  std::vector<int> counts;

  size_t buffer_size() const { return size_t(n) * h * w * stride; }
  size_t index(int b, int j, int i, int a, int e) const {
    return ((size_t(b) * h + j) * w + i) * stride + offset + size_t(a) * (5 + config.classes) + e;
  }
  float& at(int b, int j, int i, int a, int e) { return input[index(b, j, i, a, e)]; }
  void set_truth(int b, int t, YoloTruth truth) { truths[size_t(b) * truth_stride + t] = truth; }
};

Case make_case(const YoloLossConfig& config, int n, int h, int w, int truth_stride, int pad = 0, int offset = 0) {
  Case k;
  k.config = config;
  k.n = n, k.h = h, k.w = w, k.c = yolo_loss_channels(config), k.stride = k.c + pad, k.offset = offset;
  k.input.assign(k.buffer_size(), 0.0f);
  k.truth_stride = truth_stride;
  k.truths.assign(size_t(n) * truth_stride, YoloTruth{});
  k.counts.assign(size_t(n), 0);
  return k;
}

using yolo::testing::Impl;
using yolo::testing::impl_name;
using yolo::testing::impls_here;

struct Outcome {
  std::vector<float> buffer;  // the whole grad buffer (outside the view: still poisoned)
  std::vector<float> grad;    // the view's elements in (b, j, i, ch) order
  YoloLossStats stats;
};

// device_scale > 0 (Impl::Cuda): the loss scale read from device memory (config.grad_scale_at).
Outcome run(const Case& k, Impl impl, float device_scale = 0) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Outcome o;
  o.buffer.assign(k.buffer_size(), nan);
  auto in_view = [&](const float* base) { return nhwc(base + k.offset, k.n, k.h, k.w, k.c, k.stride); };
  auto out_view = [&](float* base) { return nhwc(base + k.offset, k.n, k.h, k.w, k.c, k.stride); };
  if (impl == Impl::Reference) {
    yolo_loss_reference<float>(in_view(k.input.data()), k.config, k.truths.data(), k.counts.data(), k.truth_stride,
                               out_view(o.buffer.data()), &o.stats);
  } else if (impl == Impl::Cpu) {
    yolo_loss_cpu(in_view(k.input.data()), k.config, k.truths.data(), k.counts.data(), k.truth_stride,
                  out_view(o.buffer.data()), &o.stats);
  } else {
    std::string why;
    Device device = *kernel_device(&why);
    DeviceArray<float> d_input(device, k.input), d_grad(device, k.buffer_size());
    std::vector<YoloTruth> truths = k.truths;
    if (truths.empty()) truths.resize(1);  // no zero-sized allocation
    DeviceArray<YoloTruth> d_truths(device, truths);
    DeviceArray<int> d_counts(device, k.counts);
    DeviceArray<YoloLossStats> d_stats(device, 1);
    size_t bytes = yolo_loss_workspace_bytes(k.n, k.h, k.w, k.config);
    DeviceArray<unsigned char> d_workspace(device, bytes);
    d_grad.poison();
    d_stats.poison();
    d_workspace.poison();
    DeviceArray<float> d_scale(device, std::vector<float>{device_scale});
    YoloLossConfig config = k.config;
    if (device_scale > 0) config.grad_scale_at = d_scale.data();
    yolo_loss_cuda(in_view(d_input.data()), config, d_truths.data(), d_counts.data(), k.truth_stride,
                   out_view(d_grad.data()), d_stats.data(), d_workspace.data(), bytes, nullptr);
    o.buffer = d_grad.download();
    o.stats = d_stats.download()[0];
  }
  for (int b = 0; b < k.n; ++b)
    for (int j = 0; j < k.h; ++j)
      for (int i = 0; i < k.w; ++i)
        for (int ch = 0; ch < k.c; ++ch) o.grad.push_back(o.buffer[k.index(b, j, i, 0, ch)]);
  return o;
}

double logistic(double z) { return 1 / (1 + std::exp(-z)); }
double logit(double p) { return std::log(p / (1 - p)); }
double softplus(double z) { return std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))); }
double bce(double z, double t) { return softplus(z) - t * z; }

struct TestBox {
  double x, y, w, h;
};
double iou(const TestBox& a, const TestBox& b) {
  double w = std::min(a.x + a.w / 2, b.x + b.w / 2) - std::max(a.x - a.w / 2, b.x - b.w / 2);
  double h = std::min(a.y + a.h / 2, b.y + b.h / 2) - std::max(a.y - a.h / 2, b.y - b.h / 2);
  double inter = w < 0 || h < 0 ? 0 : w * h;
  return inter / (a.w * a.h + b.w * b.h - inter);
}
TestBox decoded(const Case& k, const std::vector<double>& x, int b, int j, int i, int a) {
  size_t p = k.index(b, j, i, a, 0);
  int n = k.config.mask[a];
  return {(i + logistic(x[p])) / k.w, (j + logistic(x[p + 1])) / k.h,
          std::exp(x[p + 2]) * k.config.anchors[2 * n] / k.config.net_w,
          std::exp(x[p + 3]) * k.config.anchors[2 * n + 1] / k.config.net_h};
}
TestBox truth_box(const YoloTruth& t) { return {t.x, t.y, t.w, t.h}; }

// Distance of every prediction's best IoU from the thresholds (and, where the best truth gives
// targets, from the runner-up): the loss is smooth only away from these switches.
double threshold_margin(const Case& k, const std::vector<double>& x, int* ignored, int* over_truth_thresh) {
  double margin = 1;
  for (int b = 0; b < k.n; ++b)
    for (int j = 0; j < k.h; ++j)
      for (int i = 0; i < k.w; ++i)
        for (int a = 0; a < k.config.mask_count; ++a) {
          TestBox box = decoded(k, x, b, j, i, a);
          double best = 0, second = 0;
          for (int t = 0; t < k.counts[b]; ++t) {
            double v = iou(box, truth_box(k.truths[size_t(b) * k.truth_stride + t]));
            if (v > best) second = best, best = v;
            else second = std::max(second, v);
          }
          margin = std::min({margin, std::abs(best - k.config.ignore_thresh), std::abs(best - k.config.truth_thresh)});
          if (best > k.config.truth_thresh) margin = std::min(margin, best - second), ++*over_truth_thresh;
          if (best > k.config.ignore_thresh) ++*ignored;
        }
  return margin;
}

// Random truths away from cell borders and from ties between anchors; some predictions planted
// near a truth (random mask anchor of its cell) so that IoUs above the thresholds occur.
void random_truths_and_input(Case& k, Rng& rng, int max_truths, bool border_margins, bool exact_count = false) {
  for (float& v : k.input) v = rng.uniform(-1.0f, 1.0f);
  for (int b = 0; b < k.n; ++b) {
    k.counts[b] = exact_count ? max_truths : rng.integer(0, max_truths);
    for (int t = 0; t < k.counts[b]; ++t) {
      YoloTruth truth;
      float lo = border_margins ? 0.1f : 0.0f, hi = border_margins ? 0.9f : 1.0f;
      truth.x = (rng.integer(0, k.w - 1) + rng.uniform(lo, hi)) / k.w;
      truth.y = (rng.integer(0, k.h - 1) + rng.uniform(lo, hi)) / k.h;
      // Size: a model anchor (half the time one of this layer's) scaled a little: a clear best anchor.
      int n = rng.integer(0, 1) ? k.config.mask[rng.integer(0, k.config.mask_count - 1)]
                                : rng.integer(0, k.config.num_anchors - 1);
      truth.w = std::min(0.95f, k.config.anchors[2 * n] / k.config.net_w * rng.uniform(0.9f, 1.1f));
      truth.h = std::min(0.95f, k.config.anchors[2 * n + 1] / k.config.net_h * rng.uniform(0.9f, 1.1f));
      truth.class_id = rng.integer(0, k.config.classes - 1);
      k.set_truth(b, t, truth);
      if (rng.integer(0, 3) != 0) {
        int i = std::min(int(truth.x * k.w), k.w - 1), j = std::min(int(truth.y * k.h), k.h - 1);
        int a = rng.integer(0, k.config.mask_count - 1), m = k.config.mask[a];
        auto frac = [](double v) { return std::clamp(v - std::floor(v), 0.05, 0.95); };
        k.at(b, j, i, a, 0) = float(logit(frac(truth.x * k.w)) + rng.uniform(-0.3f, 0.3f));
        k.at(b, j, i, a, 1) = float(logit(frac(truth.y * k.h)) + rng.uniform(-0.3f, 0.3f));
        k.at(b, j, i, a, 2) = float(std::log(truth.w * k.config.net_w / k.config.anchors[2 * m]) + rng.uniform(-0.3f, 0.3f));
        k.at(b, j, i, a, 3) = float(std::log(truth.h * k.config.net_h / k.config.anchors[2 * m + 1]) + rng.uniform(-0.3f, 0.3f));
      }
    }
  }
}

// The small net of the hand-built cases: 128x128 input, 4x4 grid, 9 anchors, mask {2,3,4}, 3 classes.
YoloLossConfig hand_config(std::vector<int> mask = {2, 3, 4}, float ignore_thresh = 0.7f, float truth_thresh = 1.0f) {
  return make_yolo_loss_config({8, 8, 16, 16, 32, 64, 64, 32, 48, 48, 64, 64, 96, 96, 128, 64, 64, 128}, mask, 3,
                               128, 128, ignore_thresh, truth_thresh);
}

// Random tx, ty, to, classes; tiny boxes (tw = th = -4) so that no prediction overlaps a truth
// unless a test places it there.
Case hand_case(Rng& rng, YoloLossConfig config = hand_config(), int truth_stride = 4) {
  Case k = make_case(config, 1, 4, 4, truth_stride);
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i)
      for (int a = 0; a < config.mask_count; ++a)
        for (int e = 0; e < 5 + config.classes; ++e) k.at(0, j, i, a, e) = e == 2 || e == 3 ? -4.0f : rng.uniform(-1, 1);
  return k;
}

// The truth of the hand-built cases: exactly model anchor 2 (32x64 px), centre in cell (1, 2)
// at offsets (0.25, 0.5); all values exact in binary.
const YoloTruth kOnAnchor{0.3125f, 0.625f, 0.25f, 0.5f, 1};

// Every gradient element not at (j, i, a) in `except` must be: box/class 0, objectness s(to).
void check_background(const Case& k, const Outcome& o, std::vector<std::array<int, 3>> except) {
  int wrong = 0;
  for (int j = 0; j < k.h; ++j)
    for (int i = 0; i < k.w; ++i)
      for (int a = 0; a < k.config.mask_count; ++a) {
        if (std::find(except.begin(), except.end(), std::array<int, 3>{j, i, a}) != except.end()) continue;
        for (int e = 0; e < 5 + k.config.classes; ++e) {
          float g = o.buffer[k.index(0, j, i, a, e)];
          double want = e == 4 ? logistic(k.input[k.index(0, j, i, a, 4)]) : 0.0;
          if (!close(g, want, 1e-6, 1e-5)) ++wrong;
        }
      }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("yolo_loss: reference gradient matches finite differences of its loss") {
  Rng rng;
  CAPTURE(rng.seed());
  struct Variant {
    float ignore_thresh, truth_thresh;
  };
  // Default thresholds, then low ones so that ignored and truth_thresh-positive predictions occur.
  for (Variant v : {Variant{0.7f, 1.0f}, Variant{0.3f, 0.6f}}) {
    CAPTURE(v.ignore_thresh);
    YoloLossConfig config = make_yolo_loss_config(kYolov3Anchors, {3, 4, 5}, 4, 160, 96, v.ignore_thresh, v.truth_thresh);
    Case k = make_case(config, 2, 3, 5, 3);
    std::vector<double> x;
    int ignored = 0, over = 0;
    const bool low = v.ignore_thresh < 0.5f;
    double margin = 0;
    for (int attempt = 0; attempt < 100; ++attempt) {
      random_truths_and_input(k, rng, 3, true, true);
      x.assign(k.input.begin(), k.input.end());
      ignored = over = 0;
      margin = threshold_margin(k, x, &ignored, &over);
      if (margin > 1e-3 && (!low || (ignored > 0 && over > 0))) break;
    }
    REQUIRE(margin > 1e-3);
    if (low) CHECK(ignored > 0);  // the low thresholds reach the other branches
    if (low) CHECK(over > 0);
    auto loss = [&](const std::vector<double>& values, std::vector<double>* grad) {
      std::vector<double> g(values.size(), std::nan(""));
      YoloLossStatsT<double> stats;
      yolo_loss_reference<double>(nhwc(values.data(), k.n, k.h, k.w, k.c), k.config, k.truths.data(), k.counts.data(),
                                  k.truth_stride, nhwc(g.data(), k.n, k.h, k.w, k.c), &stats);
      if (grad) *grad = g;
      return stats.total();
    };
    std::vector<double> analytic;
    loss(x, &analytic);
    std::vector<double> numeric = numeric_gradient(x, [&](const std::vector<double>& values) { return loss(values, nullptr); });
    CHECK_CLOSE(analytic, numeric, 1e-6, 1e-5);
  }
}

TEST_CASE("yolo_loss: a box exactly on an anchor gets exactly the stated targets") {
  Rng rng;
  CAPTURE(rng.seed());
  Case k = hand_case(rng);
  k.set_truth(0, 0, kOnAnchor);
  k.counts[0] = 1;
  // The assigned prediction: cell (i=1, j=2), mask index 0 (model anchor 2).
  for (int e = 0; e < 4; ++e) k.at(0, 2, 1, 0, e) = rng.uniform(-1, 1);
  const double kw = 2 - 0.25 * 0.5;
  auto at = [&](int e) { return double(k.at(0, 2, 1, 0, e)); };
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    Outcome o = run(k, impl);
    auto g = [&](int e) { return double(o.buffer[k.index(0, 2, 1, 0, e)]); };
    CHECK(g(0) == doctest::Approx(kw * (logistic(at(0)) - 0.25)).epsilon(1e-5));  // tx* = 0.25
    CHECK(g(1) == doctest::Approx(kw * (logistic(at(1)) - 0.5)).epsilon(1e-5));   // ty* = 0.5
    CHECK(g(2) == doctest::Approx(kw * at(2)).epsilon(1e-5));                        // tw* = ln(1) = 0
    CHECK(g(3) == doctest::Approx(kw * at(3)).epsilon(1e-5));                        // th* = 0
    CHECK(g(4) == doctest::Approx(logistic(at(4)) - 1).epsilon(1e-5));
    for (int c = 0; c < 3; ++c) CHECK(g(5 + c) == doctest::Approx(logistic(at(5 + c)) - (c == 1)).epsilon(1e-5));
    check_background(k, o, {{2, 1, 0}});
    std::vector<double> x(k.input.begin(), k.input.end());
    double want_iou = iou(decoded(k, x, 0, 2, 1, 0), truth_box(kOnAnchor));
    double want_box = kw * (bce(at(0), 0.25) + bce(at(1), 0.5) + at(2) * at(2) / 2 + at(3) * at(3) / 2);
    double want_class = bce(at(5), 0) + bce(at(6), 1) + bce(at(7), 0);
    CHECK(o.stats.assigned == 1);
    CHECK(o.stats.recall50 == int(want_iou > 0.5));
    CHECK(o.stats.iou_sum == doctest::Approx(want_iou).epsilon(1e-5));
    CHECK(o.stats.box_loss == doctest::Approx(want_box).epsilon(1e-5));
    CHECK(o.stats.obj_loss == doctest::Approx(softplus(-at(4))).epsilon(1e-5));
    CHECK(o.stats.class_loss == doctest::Approx(want_class).epsilon(1e-5));
    CHECK(o.stats.truths_dropped == 0);
    CHECK(o.stats.truths_invalid == 0);
  }
}

TEST_CASE(
    "yolo_loss: a truth on a cell boundary in float lands in the same cell everywhere, double reference included") {
  // 0.9f * 10 is 8.99999976 in double (cell 8) and rounds to 9.0 in float (cell 9): darknet, the CPU
  // loss and the kernel compute it in float, so the double reference must too.
  Rng rng;
  CAPTURE(rng.seed());
  YoloLossConfig config = make_yolo_loss_config(
      {8, 8, 16, 16, 32, 64, 64, 32, 48, 48, 64, 64, 96, 96, 128, 64, 64, 128}, {2, 3, 4}, 3, 320, 128, 0.7f, 1.0f);
  Case k = make_case(config, 1, 4, 10, 1);
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 10; ++i)
      for (int a = 0; a < 3; ++a)
        for (int e = 0; e < 8; ++e) k.at(0, j, i, a, e) = e == 2 || e == 3 ? -4.0f : rng.uniform(-1, 1);
  k.set_truth(0, 0, YoloTruth{0.9f, 0.625f, 0.1f, 0.5f, 1});  // anchor 2 (32x64 of 320x128) exactly
  k.counts[0] = 1;
  REQUIRE(int(std::floor(double(0.9f) * 10)) == 8);
  REQUIRE(0.9f * 10.0f == 9.0f);
  auto assigned_cell = [&](const std::vector<float>& buffer) {
    int cell = -1;
    for (int i = 0; i < 10; ++i)
      if (buffer[k.index(0, 2, i, 0, 5 + 1)] < 0) cell = i;  // the class target 1 makes it negative
    return cell;
  };
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    CHECK(assigned_cell(run(k, impl).buffer) == 9);
  }
  std::vector<double> x(k.input.begin(), k.input.end()), g(x.size(), std::nan(""));
  YoloLossStatsT<double> stats;
  yolo_loss_reference<double>(nhwc(static_cast<const double*>(x.data()), k.n, k.h, k.w, k.c), k.config, k.truths.data(),
                              k.counts.data(), k.truth_stride, nhwc(g.data(), k.n, k.h, k.w, k.c), &stats);
  CHECK(stats.assigned == 1);
  CHECK(assigned_cell(std::vector<float>(g.begin(), g.end())) == 9);
}

TEST_CASE("yolo_loss: a prediction overlapping a truth above ignore_thresh has no objectness term") {
  Rng rng;
  CAPTURE(rng.seed());
  for (float ignore_thresh : {0.7f, 1.0f}) {  // 1.0: never ignored (IoU > 1 is impossible)
    CAPTURE(ignore_thresh);
    Case k = hand_case(rng, hand_config({2, 3, 4}, ignore_thresh));
    k.set_truth(0, 0, kOnAnchor);
    k.counts[0] = 1;
    // Mask index 2 (model anchor 4, 48x48 px) at the truth's cell, decoding to 30x64 px on the
    // truth's centre: IoU 30/32.
    k.at(0, 2, 1, 2, 0) = float(logit(0.25));
    k.at(0, 2, 1, 2, 1) = float(logit(0.5));
    k.at(0, 2, 1, 2, 2) = std::log(30.0f / 48.0f);
    k.at(0, 2, 1, 2, 3) = std::log(64.0f / 48.0f);
    // Mask index 1 (64x32 px) decoding to the truth's size shifted right by 8 px: IoU 0.6, so it
    // keeps its objectness term.
    k.at(0, 2, 1, 1, 0) = 0.0f;
    k.at(0, 2, 1, 1, 1) = float(logit(0.5));
    k.at(0, 2, 1, 1, 2) = std::log(32.0f / 64.0f);
    k.at(0, 2, 1, 1, 3) = std::log(64.0f / 32.0f);
    double to = k.at(0, 2, 1, 2, 4);
    double noobj = 0;  // every prediction but the assigned one (and the ignored one)
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 4; ++i)
        for (int a = 0; a < 3; ++a)
          if (!(j == 2 && i == 1 && a == 0)) noobj += softplus(k.at(0, j, i, a, 4));
    if (ignore_thresh < 1) noobj -= softplus(to);
    for (Impl impl : impls_here()) {
      CAPTURE(impl_name(impl));
      Outcome o = run(k, impl);
      float g = o.buffer[k.index(0, 2, 1, 2, 4)];
      if (ignore_thresh < 1) CHECK(g == 0.0f);
      else CHECK(g == doctest::Approx(logistic(to)).epsilon(1e-5));
      CHECK(o.stats.noobj_loss == doctest::Approx(noobj).epsilon(1e-5));
      check_background(k, o, {{2, 1, 0}, {2, 1, 2}});  // mask index 1 included: objectness s(to)
      for (int e = 0; e < 8; ++e)
        if (e != 4) CHECK(o.buffer[k.index(0, 2, 1, 2, e)] == 0.0f);
    }
  }
}

TEST_CASE("yolo_loss: truth_thresh makes a well-overlapping prediction a positive") {
  Rng rng;
  CAPTURE(rng.seed());
  Case k = hand_case(rng, hand_config({2, 3, 4}, 0.7f, 0.9f));
  k.set_truth(0, 0, kOnAnchor);
  k.counts[0] = 1;
  float tw = std::log(30.0f / 48.0f), th = std::log(66.0f / 48.0f);  // IoU ~ 0.91 with the truth
  k.at(0, 2, 1, 2, 0) = float(logit(0.25));
  k.at(0, 2, 1, 2, 1) = float(logit(0.5));
  k.at(0, 2, 1, 2, 2) = tw;
  k.at(0, 2, 1, 2, 3) = th;
  const double kw = 2 - 0.125;
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    Outcome o = run(k, impl);
    auto g = [&](int e) { return double(o.buffer[k.index(0, 2, 1, 2, e)]); };
    CHECK(std::abs(g(0)) < 1e-6);  // s(tx) = tx* = 0.25
    CHECK(std::abs(g(1)) < 1e-6);
    CHECK(g(2) == doctest::Approx(kw * (tw - std::log(32.0 / 48.0))).epsilon(1e-5));  // anchor 4's targets
    CHECK(g(3) == doctest::Approx(kw * (th - std::log(64.0 / 48.0))).epsilon(1e-5));
    CHECK(g(4) == doctest::Approx(logistic(k.at(0, 2, 1, 2, 4)) - 1).epsilon(1e-5));
    for (int c = 0; c < 3; ++c)
      CHECK(g(5 + c) == doctest::Approx(logistic(k.at(0, 2, 1, 2, 5 + c)) - (c == 1)).epsilon(1e-5));
    check_background(k, o, {{2, 1, 0}, {2, 1, 2}});
    CHECK(o.stats.assigned == 1);  // statistics count assigned truths only
  }
}

TEST_CASE("yolo_loss: two truths in one cell and anchor: the later one's targets win") {
  Rng rng;
  CAPTURE(rng.seed());
  const YoloTruth first{0.3125f, 0.625f, 0.25f, 0.5f, 0}, second{0.34375f, 0.6f, 0.26f, 0.48f, 2};
  for (bool swapped : {false, true}) {
    CAPTURE(swapped);
    Case k = hand_case(rng);
    const YoloTruth& winner = swapped ? first : second;
    k.set_truth(0, 0, swapped ? second : first);
    k.set_truth(0, 1, winner);
    k.counts[0] = 2;
    for (int e = 0; e < 4; ++e) k.at(0, 2, 1, 0, e) = rng.uniform(-1, 1);
    auto at = [&](int e) { return double(k.at(0, 2, 1, 0, e)); };
    double kw = 2 - double(winner.w) * winner.h;
    double target[4] = {winner.x * 4.0 - 1, winner.y * 4.0 - 2, std::log(winner.w * 128.0 / 32),
                        std::log(winner.h * 128.0 / 64)};
    std::vector<double> x(k.input.begin(), k.input.end());
    TestBox pred = decoded(k, x, 0, 2, 1, 0);
    for (Impl impl : impls_here()) {
      CAPTURE(impl_name(impl));
      Outcome o = run(k, impl);
      auto g = [&](int e) { return double(o.buffer[k.index(0, 2, 1, 0, e)]); };
      CHECK(g(0) == doctest::Approx(kw * (logistic(at(0)) - target[0])).epsilon(1e-5));
      CHECK(g(1) == doctest::Approx(kw * (logistic(at(1)) - target[1])).epsilon(1e-5));
      CHECK(g(2) == doctest::Approx(kw * (at(2) - target[2])).epsilon(1e-5));
      CHECK(g(3) == doctest::Approx(kw * (at(3) - target[3])).epsilon(1e-5));
      for (int c = 0; c < 3; ++c)  // only the winner's class is a positive class
        CHECK(g(5 + c) == doctest::Approx(logistic(at(5 + c)) - (c == winner.class_id)).epsilon(1e-5));
      double box = kw * (bce(at(0), target[0]) + bce(at(1), target[1]) + (at(2) - target[2]) * (at(2) - target[2]) / 2 +
                         (at(3) - target[3]) * (at(3) - target[3]) / 2);
      CHECK(o.stats.box_loss == doctest::Approx(box).epsilon(1e-5));  // one box term, not two
      CHECK(o.stats.assigned == 2);                                   // statistics: both truths (darknet)
      CHECK(o.stats.iou_sum == doctest::Approx(iou(pred, truth_box(first)) + iou(pred, truth_box(second))).epsilon(1e-5));
      check_background(k, o, {{2, 1, 0}});
    }
  }
}

TEST_CASE("yolo_loss: truths beyond 90 are dropped and counted") {
  Rng rng;
  CAPTURE(rng.seed());
  YoloLossConfig config = make_yolo_loss_config(kYolov3Anchors, {0, 1, 2}, 2, 416, 416);
  Case k = make_case(config, 1, 13, 13, 91);
  random_truths_and_input(k, rng, 0, false);
  for (int t = 0; t < 91; ++t) {
    int cell = t + (t == 90 ? 78 : 0);  // the 91st truth alone in cell 168
    k.set_truth(0, t, YoloTruth{(cell % 13 + 0.5f) / 13, (cell / 13 + 0.5f) / 13, 12.0f / 416, 15.0f / 416, t % 2});
  }
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    k.counts[0] = 90;
    Outcome kept = run(k, impl);
    CHECK(kept.stats.truths_dropped == 0);
    CHECK(kept.stats.assigned == 90);
    k.counts[0] = 91;
    Outcome dropped = run(k, impl);
    CHECK(dropped.stats.truths_dropped == 1);
    CHECK(dropped.stats.assigned == 90);
    CHECK(same_bits(dropped.grad, kept.grad));
    // A count beyond the row (truth_stride) is dropped too.
    Case narrow = k;
    narrow.truth_stride = 90;
    narrow.counts[0] = 95;
    narrow.truths.resize(90);
    Outcome beyond = run(narrow, impl);
    CHECK(beyond.stats.truths_dropped == 5);
    CHECK(same_bits(beyond.grad, kept.grad));
    // The dropped truth would have mattered: alone, it makes its cell's prediction positive.
    Case alone = k;
    alone.set_truth(0, 0, k.truths[90]);
    alone.counts[0] = 1;
    Outcome single = run(alone, impl);
    CHECK(single.stats.assigned == 1);
    CHECK(single.buffer[k.index(0, 12, 12, 0, 4)] != kept.buffer[k.index(0, 12, 12, 0, 4)]);
  }
}

TEST_CASE("yolo_loss: a truth whose best anchor is another layer's trains nothing here") {
  Rng rng;
  CAPTURE(rng.seed());
  const YoloTruth small{0.3125f, 0.625f, 8.0f / 128, 8.0f / 128, 2};  // exactly model anchor 0
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    Case k = hand_case(rng);  // mask {2, 3, 4}
    k.set_truth(0, 0, small);
    k.counts[0] = 1;
    Outcome o = run(k, impl);
    check_background(k, o, {});
    CHECK(o.stats.assigned == 0);
    CHECK(o.stats.box_loss == 0.0f);
    CHECK(o.stats.class_loss == 0.0f);
    CHECK(o.stats.obj_loss == 0.0f);
    // The layer that has anchor 0 trains it.
    Case own = hand_case(rng, hand_config({0, 1, 2}));
    own.set_truth(0, 0, small);
    own.counts[0] = 1;
    Outcome trained = run(own, impl);
    CHECK(trained.stats.assigned == 1);
    CHECK(trained.buffer[own.index(0, 2, 1, 0, 4)] == doctest::Approx(logistic(own.at(0, 2, 1, 0, 4)) - 1).epsilon(1e-5));
  }
}

TEST_CASE("yolo_loss: invalid truths are skipped and counted") {
  Rng rng;
  CAPTURE(rng.seed());
  Case k = hand_case(rng, hand_config(), 6);
  k.set_truth(0, 0, YoloTruth{0.5f, 0.5f, 0.25f, 0.5f, 3});  // class out of range
  k.set_truth(0, 1, YoloTruth{0.5f, 0.5f, 0.0f, 0.5f, 0});   // zero width
  k.set_truth(0, 2, YoloTruth{std::nanf(""), 0.5f, 0.25f, 0.5f, 0});
  k.set_truth(0, 3, kOnAnchor);
  k.set_truth(0, 4, YoloTruth{208.0f, 160.0f, 64.0f, 128.0f, 0});  // pixel coordinates by mistake
  k.set_truth(0, 5, YoloTruth{0.5f, 1.25f, 0.25f, 0.5f, 0});        // centre below the image
  k.counts[0] = 6;
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    Outcome o = run(k, impl);
    CHECK(o.stats.truths_invalid == 5);
    CHECK(o.stats.assigned == 1);
    check_background(k, o, {{2, 1, 0}});
  }
}

namespace {

// CPU or CUDA against the reference on random cases: odd sizes, channel slices, several truth
// counts (some beyond the row, some invalid), and thresholds that reach every branch.
void compare_with_reference(Impl impl) {
  Rng rng;
  CAPTURE(rng.seed());
  struct Shape {
    int n, h, w;
    std::vector<int> mask;
    int classes, pad, offset;
    float ignore_thresh, truth_thresh;
  };
  const Shape shapes[] = {{3, 5, 7, {3, 4, 5}, 4, 0, 0, 0.7f, 1.0f},
                          {2, 7, 5, {0, 1, 2, 3}, 13, 5, 3, 0.3f, 0.6f},
                          {1, 3, 3, {4}, 1, 3, 2, 0.5f, 0.8f}};  // anchor 4 (62x45) fits a 96x96 net
  for (const Shape& s : shapes) {
    CAPTURE(s.classes);
    YoloLossConfig config = make_yolo_loss_config(kYolov3Anchors, s.mask, s.classes, 32 * s.w, 32 * s.h,
                                                  s.ignore_thresh, s.truth_thresh);
    Case k = make_case(config, s.n, s.h, s.w, 7, s.pad, s.offset);
    random_truths_and_input(k, rng, 7, false);
    // Image 0: a truth exactly on the first mask anchor (so one is assigned), and two beyond the row.
    int m = s.mask[0];
    k.set_truth(0, 0, YoloTruth{rng.uniform(0, 1), rng.uniform(0, 1), kYolov3Anchors[2 * m] / config.net_w,
                                kYolov3Anchors[2 * m + 1] / config.net_h, 0});
    k.counts[0] = 9;
    if (s.n > 1) k.set_truth(1, 0, YoloTruth{0.5f, 0.5f, 0.2f, 0.2f, s.classes}), k.counts[1] = std::max(k.counts[1], 1);
    Outcome ref = run(k, Impl::Reference), out = run(k, impl);
    CHECK_CLOSE(out.grad, ref.grad, 1e-5, 1e-4);
    int untouched = 0;  // outside the channel slice: still NaN
    for (size_t e = 0; e < out.buffer.size(); ++e) untouched += std::isnan(out.buffer[e]);
    CHECK(untouched == int(out.buffer.size() - out.grad.size()));
    std::vector<float> got = {out.stats.box_loss, out.stats.obj_loss, out.stats.noobj_loss, out.stats.class_loss,
                              out.stats.iou_sum};
    std::vector<float> want = {ref.stats.box_loss, ref.stats.obj_loss, ref.stats.noobj_loss, ref.stats.class_loss,
                               ref.stats.iou_sum};
    CHECK_CLOSE(got, want, 1e-5, 1e-4);
    CHECK(out.stats.assigned == ref.stats.assigned);
    CHECK(out.stats.recall50 == ref.stats.recall50);
    CHECK(out.stats.truths_dropped == ref.stats.truths_dropped);
    CHECK(out.stats.truths_dropped >= 2);
    CHECK(out.stats.truths_invalid == ref.stats.truths_invalid);
    CHECK(ref.stats.assigned > 0);
  }
}

}  // namespace

TEST_CASE("yolo_loss: cpu matches the reference on random inputs") { compare_with_reference(Impl::Cpu); }

TEST_CASE("yolo_loss: cuda matches the reference on random inputs") {
  KERNEL_TEST_DEVICE(device);
  (void)device;
  compare_with_reference(Impl::Cuda);
}

TEST_CASE("yolo_loss: cuda run twice gives identical bits") {
  KERNEL_TEST_DEVICE(device);
  (void)device;
  Rng rng;
  CAPTURE(rng.seed());
  YoloLossConfig config = make_yolo_loss_config(kYolov3Anchors, {6, 7, 8}, 5, 288, 224, 0.4f, 0.8f);
  Case k = make_case(config, 3, 7, 9, 12, 1, 1);
  random_truths_and_input(k, rng, 12, false);
  Outcome first = run(k, Impl::Cuda), second = run(k, Impl::Cuda);
  CHECK(same_bits(first.buffer, second.buffer));
  CHECK(std::memcmp(&first.stats, &second.stats, sizeof(YoloLossStats)) == 0);
}

TEST_CASE("yolo_loss: cuda's loss scale multiplies the gradient only, by value or read from device memory") {
  KERNEL_TEST_DEVICE(device);
  (void)device;
  Rng rng;
  CAPTURE(rng.seed());
  YoloLossConfig config = make_yolo_loss_config(kYolov3Anchors, {3, 4, 5}, 3, 160, 224, 0.5f, 1.0f);
  Case k = make_case(config, 2, 5, 7, 10, 3, 2);
  random_truths_and_input(k, rng, 10, false);
  const Outcome unscaled = run(k, Impl::Cuda);
  for (float scale : {8.0f, 0.25f}) {  // powers of two: scaling is exact
    CAPTURE(scale);
    Case by_value = k;
    by_value.config.grad_scale = scale;
    const Outcome v = run(by_value, Impl::Cuda), d = run(k, Impl::Cuda, scale);
    std::vector<float> want = unscaled.buffer;
    for (float& x : want)
      if (!std::isnan(x)) x *= scale;  // outside the view: still the poison
    CHECK(same_bits(v.buffer, want));
    CHECK(same_bits(d.buffer, want));
    CHECK(std::memcmp(&d.stats, &unscaled.stats, sizeof(YoloLossStats)) == 0);  // the loss is not scaled
  }
  Case on_cpu = k;
  on_cpu.config.grad_scale_at = on_cpu.input.data();
  CHECK_THROWS_AS(run(on_cpu, Impl::Cpu), Error);
}

TEST_CASE("yolo_loss: bad arguments are reported") {
  YoloLossConfig config = hand_config();
  std::vector<float> in(size_t(4) * 4 * 24), grad(in.size());
  std::vector<YoloTruth> truths(4);
  int count = 1;
  YoloLossStats stats;
  auto call = [&](YoloLossConfig c, int channels, int stride, const int* counts, int truth_stride) {
    yolo_loss_cpu(nhwc<const float>(in.data(), 1, 4, 4, channels, stride), c, truths.data(), counts, truth_stride,
                  nhwc(grad.data(), 1, 4, 4, channels, stride), &stats);
  };
  CHECK_NOTHROW(call(config, 24, 24, &count, 4));
  CHECK_THROWS_AS(call(config, 23, 24, &count, 4), Error);  // not mask_count*(5+classes)
  CHECK_THROWS_AS(call(config, 24, 20, &count, 4), Error);  // stride < channels
  CHECK_THROWS_AS(call(config, 24, 24, nullptr, 4), Error);
  CHECK_THROWS_AS(call(config, 24, 24, &count, -1), Error);
  YoloLossConfig bad = config;
  bad.mask[1] = 9;
  CHECK_THROWS_AS(call(bad, 24, 24, &count, 4), Error);
  CHECK_THROWS_AS(make_yolo_loss_config({10, 13, 16}, {0}, 1, 416, 416), Error);  // odd anchor list
  CHECK_THROWS_AS(make_yolo_loss_config({10, -13}, {0}, 1, 416, 416), Error);
  CHECK_THROWS_AS(make_yolo_loss_config({10, 13}, {0}, 0, 416, 416), Error);
  CHECK_THROWS_AS(yolo_loss_cuda(nhwc<const float>(in.data(), 1, 4, 4, 24), config, truths.data(), &count, 4,
                                 nhwc(grad.data(), 1, 4, 4, 24), &stats, nullptr, 0, nullptr),
                  Error);  // no workspace
}

namespace {

// 16-bit storage: the input stored in T, the reference run on its exact (widened) values; the
// gradient is the reference's FP32 gradient rounded once (within 1 ulp of T where expf/logf
// differ in the last FP32 bit, and 99% bit for bit), the statistics as for FP32, the channel
// slice's gaps untouched.
template <typename T>
void check_yolo_loss_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  YoloLossConfig config = make_yolo_loss_config(kYolov3Anchors, {3, 4, 5}, 6, 224, 160, 0.5f, 0.8f);
  Case k = make_case(config, 2, 5, 7, 9, 3, 1);
  random_truths_and_input(k, rng, 9, false);
  // A truth exactly on the first mask anchor, so that one is assigned whatever the draw.
  const int m = config.mask[0];
  k.set_truth(0, 0, YoloTruth{rng.uniform(0, 1), rng.uniform(0, 1), kYolov3Anchors[2 * m] / config.net_w,
                              kYolov3Anchors[2 * m + 1] / config.net_h, 0});
  k.counts[0] = std::max(k.counts[0], 1);
  const std::vector<T> stored_input = stored<T>(k.input);
  k.input = widened(stored_input);
  const Outcome ref = run(k, Impl::Reference);

  DeviceArray<T> d_input(device, stored_input), d_grad(device, k.buffer_size());
  DeviceArray<YoloTruth> d_truths(device, k.truths);
  DeviceArray<int> d_counts(device, k.counts);
  DeviceArray<YoloLossStats> d_stats(device, 1);
  const size_t bytes = yolo_loss_workspace_bytes(k.n, k.h, k.w, k.config);
  DeviceArray<unsigned char> d_workspace(device, bytes);
  d_grad.poison();
  yolo_loss_cuda<T>(nhwc<const T>(d_input.data() + k.offset, k.n, k.h, k.w, k.c, k.stride), k.config,
                    d_truths.data(), d_counts.data(), k.truth_stride,
                    nhwc(d_grad.data() + k.offset, k.n, k.h, k.w, k.c, k.stride), d_stats.data(), d_workspace.data(),
                    bytes, nullptr);
  const std::vector<T> buffer = d_grad.download();
  std::vector<T> grad;
  size_t gap_writes = 0;
  for (size_t e = 0; e < buffer.size(); ++e) {
    const size_t ch = e % size_t(k.stride);
    if (ch >= size_t(k.offset) && ch < size_t(k.offset + k.c)) grad.push_back(buffer[e]);
    else gap_writes += buffer[e].bits != 0xffff;
  }
  CHECK(gap_writes == 0);
  check_rounded_once(grad, ref.grad, 1, 0.99);
  const YoloLossStats st = d_stats.download()[0];
  std::vector<float> got = {st.box_loss, st.obj_loss, st.noobj_loss, st.class_loss, st.iou_sum};
  std::vector<float> want = {ref.stats.box_loss, ref.stats.obj_loss, ref.stats.noobj_loss, ref.stats.class_loss,
                             ref.stats.iou_sum};
  CHECK_CLOSE(got, want, 1e-5, 1e-4);
  CHECK(st.assigned == ref.stats.assigned);
  CHECK(ref.stats.assigned > 0);
}

}  // namespace

TEST_CASE("yolo_loss: cuda on bf16 and fp16 inputs: the FP32 gradient rounded once, FP32 statistics") {
  KERNEL_TEST_DEVICE(device);
  check_yolo_loss_storage<Bf16>(device);
  check_yolo_loss_storage<Fp16>(device);
}
