// conv2d: the reference against hand-computed values and finite differences (double); the fast
// CPU version and the CUDA kernels against the reference on fresh random inputs with odd sizes,
// strides 1 and 2, k = 1, 3, 5, channel-slice views, bias or none, accumulate; every tile shape
// and split count of the CUDA kernels; identical bits on a second launch; bad arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "runtime/check.h"
#include "tests/cpu_isa_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// An NHWC buffer holding one view: `stride` floats per pixel, the view's channels at `offset`.
struct Layout {
  int n = 0, h = 0, w = 0, c = 0, stride = 0, offset = 0;
  size_t size() const { return size_t(n) * h * w * stride; }
  template <typename T>
  NhwcView<T> view(T* base) const {
    return NhwcView<T>{base + offset, n, h, w, c, stride};
  }
  bool inside(size_t i) const {
    size_t ch = i % size_t(stride);
    return ch >= size_t(offset) && ch < size_t(offset + c);
  }
};

// The view's elements, in order.
template <typename T>
std::vector<T> elements(const std::vector<T>& buffer, const Layout& l) {
  std::vector<T> out;
  for (size_t i = 0; i < buffer.size(); ++i)
    if (l.inside(i)) out.push_back(buffer[i]);
  return out;
}

// Elements outside the view that are no longer NaN: an op wrote past its channel slice.
size_t gap_writes(const std::vector<float>& buffer, const Layout& l) {
  size_t bad = 0;
  for (size_t i = 0; i < buffer.size(); ++i) bad += !l.inside(i) && !std::isnan(buffer[i]);
  return bad;
}

// A poisoned output buffer; with `start`, the view's elements hold start's (for accumulate).
std::vector<float> output_buffer(const Layout& l, const std::vector<float>* start) {
  std::vector<float> buffer(l.size(), kNaN);
  if (start)
    for (size_t i = 0; i < buffer.size(); ++i)
      if (l.inside(i)) buffer[i] = (*start)[i];
  return buffer;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

struct ConvCase {
  Conv2dShape s;
  int in_extra = 0, in_offset = 0, out_extra = 0, out_offset = 0;  // channel slices when extra > 0
  bool bias = true, accumulate = false;

  Layout in_layout() const {
    REQUIRE(in_offset <= in_extra);
    return {s.n, s.h, s.w, s.c_in, s.c_in + in_extra, in_offset};
  }
  Layout out_layout() const {
    REQUIRE(out_offset <= out_extra);
    return {s.n, s.out_h(), s.out_w(), s.c_out, s.c_out + out_extra, out_offset};
  }
  std::string describe() const {
    return std::to_string(s.n) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w) + " " + std::to_string(s.c_in) +
           "->" + std::to_string(s.c_out) + " k" + std::to_string(s.k) + " s" + std::to_string(s.stride) +
           " in-slice +" + std::to_string(in_extra) + "@" + std::to_string(in_offset) + " out-slice +" +
           std::to_string(out_extra) + "@" + std::to_string(out_offset) + (bias ? " bias" : "") +
           (accumulate ? " accumulate" : "");
  }
};

// Odd sizes, both strides, k = 1, 3, 5, 3 to 37 input channels, 1 to 36 output channels,
// slices with odd and with float4-friendly strides and offsets.
const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {{3, 7, 5, 3, 7, 3, 1}, 0, 0, 0, 0, true, false},
      {{3, 7, 5, 13, 17, 3, 2}, 3, 1, 2, 1, false, true},
      {{3, 7, 5, 13, 1, 1, 1}, 0, 0, 5, 3, true, true},
      {{2, 7, 5, 3, 17, 5, 2}, 2, 2, 0, 0, true, false},
      {{3, 5, 7, 16, 20, 3, 1}, 4, 4, 8, 4, true, true},
      {{3, 7, 5, 8, 12, 1, 2}, 0, 0, 0, 0, false, false},
      {{1, 9, 11, 12, 36, 3, 2}, 4, 0, 0, 0, true, true},
      {{3, 7, 5, 13, 7, 5, 1}, 0, 0, 1, 0, false, false},
      // Over 16 input channels with a partial block for every variant's nr (8, 16), 19 outputs
      // with a partial block for every mr (4, 6, 8).
      {{2, 6, 5, 37, 19, 3, 1}, 0, 0, 0, 0, true, true},
      // The CPU weight gradient's two paths at stride 1: whole images (output rows under 32 pixels;
      // here in 2 chunks of rows, the boundary inside image 1) and row by row (37 pixels).
      {{3, 23, 17, 5, 11, 3, 1}, 0, 0, 0, 0, true, false},
      {{1, 4, 37, 6, 10, 3, 1}, 0, 0, 0, 0, false, true},
      // Whole images with 4 or more output channel blocks for every nr (8, 16): the weight gradient
      // packs each tap block's fields once for them; 50 channels end in a partial block.
      {{2, 5, 6, 9, 50, 3, 1}, 0, 0, 0, 0, true, false},
      // k = 5 at stride 1, rows of 32 pixels or more (the CPU forward and backward data go row by
      // row; narrower layers go over whole images), wide enough for blocks of every mr whose 25
      // taps are all inside the row (the backward data's one-call path), and narrow blocks at both
      // edges.
      {{1, 6, 37, 7, 9, 5, 1}, 0, 0, 0, 0, true, true},
  };
  return cases;
}

// One case's random inputs and what the double reference makes of them (view elements).
struct ConvData {
  std::vector<float> in, weights, bias, grad_out, grad_in_start;
  std::vector<double> out, grad_in, grad_weights, grad_bias;
};

ConvData make_data(const ConvCase& c, Rng& rng) {
  const Layout il = c.in_layout(), ol = c.out_layout();
  ConvData d;
  d.in = rng.floats(il.size());
  d.weights = rng.floats(c.s.weight_count());
  if (c.bias) d.bias = rng.floats(size_t(c.s.c_out));
  d.grad_out = rng.floats(ol.size());
  d.grad_in_start = rng.floats(il.size());
  std::vector<double> in = to_double(d.in), w = to_double(d.weights), b = to_double(d.bias), go = to_double(d.grad_out);
  std::vector<double> out(ol.size(), 0.0), gi = to_double(d.grad_in_start);
  const double* bias = c.bias ? b.data() : nullptr;
  conv2d_forward_reference<double>(c.s, il.view<const double>(in.data()), w.data(), bias, ol.view(out.data()), nullptr,
                                   0);
  conv2d_backward_data_reference<double>(c.s, ol.view<const double>(go.data()), w.data(), il.view(gi.data()),
                                         c.accumulate, nullptr, 0);
  d.grad_weights.assign(c.s.weight_count(), 0.0);
  d.grad_bias.assign(size_t(c.s.c_out), 0.0);
  conv2d_backward_weights_reference<double>(c.s, il.view<const double>(in.data()), ol.view<const double>(go.data()),
                                            d.grad_weights.data(), c.bias ? d.grad_bias.data() : nullptr, nullptr, 0);
  d.out = elements(out, ol);
  d.grad_in = elements(gi, il);
  if (!c.bias) d.grad_bias.clear();
  return d;
}

constexpr double kAtol = 1e-4, kRtol = 1e-4;

// What one implementation produced for a case (whole buffers, gaps included).
struct ConvResult {
  std::vector<float> out, grad_in, grad_weights, grad_bias;
};

void check_result(const ConvCase& c, const ConvData& d, const ConvResult& r) {
  const Layout il = c.in_layout(), ol = c.out_layout();
  CHECK_CLOSE(elements(r.out, ol), d.out, kAtol, kRtol);
  CHECK(gap_writes(r.out, ol) == 0);
  CHECK_CLOSE(elements(r.grad_in, il), d.grad_in, kAtol, kRtol);
  CHECK(gap_writes(r.grad_in, il) == 0);
  CHECK_CLOSE(r.grad_weights, d.grad_weights, kAtol, kRtol);
  CHECK_CLOSE(r.grad_bias, d.grad_bias, kAtol, kRtol);
}

ConvResult run_cpu(const ConvCase& c, const ConvData& d) {
  const Layout il = c.in_layout(), ol = c.out_layout();
  ConvResult r;
  r.out = output_buffer(ol, nullptr);
  r.grad_in = output_buffer(il, c.accumulate ? &d.grad_in_start : nullptr);
  r.grad_weights.assign(c.s.weight_count(), kNaN);
  r.grad_bias.assign(c.bias ? size_t(c.s.c_out) : 0, kNaN);
  conv2d_forward_cpu(c.s, il.view<const float>(d.in.data()), d.weights.data(), c.bias ? d.bias.data() : nullptr,
                     ol.view(r.out.data()), nullptr, 0);
  conv2d_backward_data_cpu(c.s, ol.view<const float>(d.grad_out.data()), d.weights.data(), il.view(r.grad_in.data()),
                           c.accumulate, nullptr, 0);
  conv2d_backward_weights_cpu(c.s, il.view<const float>(d.in.data()), ol.view<const float>(d.grad_out.data()),
                              r.grad_weights.data(), c.bias ? r.grad_bias.data() : nullptr, nullptr, 0);
  return r;
}

// Forces the CUDA kernels' tiling for the test's scope.
struct ForcedTiling {
  ForcedTiling(int tile, int splits) { set_gemm_tiling_for_tests(tile, splits); }
  ~ForcedTiling() { set_gemm_tiling_for_tests(-1, 0); }
};

ConvResult run_cuda(Device device, const ConvCase& c, const ConvData& d) {
  const Layout il = c.in_layout(), ol = c.out_layout();
  DeviceArray<float> in(device, d.in), weights(device, d.weights), grad_out(device, d.grad_out);
  DeviceArray<float> bias(device, c.bias ? d.bias : std::vector<float>{0.0f});
  DeviceArray<float> out(device, output_buffer(ol, nullptr));
  DeviceArray<float> grad_in(device, output_buffer(il, c.accumulate ? &d.grad_in_start : nullptr));
  DeviceArray<float> grad_weights(device, c.s.weight_count()), grad_bias(device, size_t(c.s.c_out));
  grad_weights.poison();
  grad_bias.poison();
  const size_t forward_ws = conv2d_forward_workspace_bytes(c.s);
  const size_t data_ws = conv2d_backward_data_workspace_bytes(c.s);
  const size_t weight_ws = conv2d_backward_weights_workspace_bytes(c.s);
  DeviceArray<float> workspace(device, std::max({forward_ws, data_ws, weight_ws}) / sizeof(float) + 1);
  workspace.poison();  // every partial sum must be written before it is read

  conv2d_forward_cuda(c.s, il.view<const float>(in.data()), weights.data(), c.bias ? bias.data() : nullptr,
                      ol.view(out.data()), forward_ws ? workspace.data() : nullptr, forward_ws, nullptr);
  workspace.poison();
  conv2d_backward_data_cuda(c.s, ol.view<const float>(grad_out.data()), weights.data(), il.view(grad_in.data()),
                            c.accumulate, data_ws ? workspace.data() : nullptr, data_ws, nullptr);
  workspace.poison();
  conv2d_backward_weights_cuda(c.s, il.view<const float>(in.data()), ol.view<const float>(grad_out.data()),
                               grad_weights.data(), c.bias ? grad_bias.data() : nullptr, workspace.data(), weight_ws,
                               nullptr);
  ConvResult r{out.download(), grad_in.download(), grad_weights.download(), grad_bias.download()};
  if (!c.bias) r.grad_bias.clear();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_cuda_case(Device device, const ConvCase& c, Rng& rng) {
  const ConvData d = make_data(c, rng);
  const ConvResult first = run_cuda(device, c, d);
  check_result(c, d, first);
  const ConvResult again = run_cuda(device, c, d);
  CHECK(same_bits(first.out, again.out));
  CHECK(same_bits(first.grad_in, again.grad_in));
  CHECK(same_bits(first.grad_weights, again.grad_weights));
  CHECK(same_bits(first.grad_bias, again.grad_bias));
}

}  // namespace

TEST_CASE("conv: reference forward on a hand-computed case") {
  // 3x3 image 1..9, 3x3 kernel of ones, bias 0.5: each output is the sum of its (padded) window.
  std::vector<double> in = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w(9, 1.0), bias = {0.5};
  Conv2dShape s{1, 3, 3, 1, 1, 3, 1};
  std::vector<double> out(9, 0.0);
  conv2d_forward_reference<double>(s, nhwc<const double>(in.data(), 1, 3, 3, 1), w.data(), bias.data(),
                                   nhwc(out.data(), 1, 3, 3, 1), nullptr, 0);
  CHECK(out == std::vector<double>{12.5, 21.5, 16.5, 27.5, 45.5, 33.5, 24.5, 39.5, 28.5});
  s.stride = 2;
  std::vector<double> out2(4, 0.0);
  conv2d_forward_reference<double>(s, nhwc<const double>(in.data(), 1, 3, 3, 1), w.data(), nullptr,
                                   nhwc(out2.data(), 1, 2, 2, 1), nullptr, 0);
  CHECK(out2 == std::vector<double>{12, 16, 24, 28});
}

TEST_CASE("conv: reference gradients match finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  const std::vector<Conv2dShape> shapes = {
      {2, 5, 4, 3, 2, 3, 1}, {1, 5, 5, 2, 3, 3, 2}, {1, 6, 5, 2, 2, 5, 2}, {2, 3, 4, 3, 2, 1, 2}, {1, 4, 3, 2, 3, 1, 1}};
  for (const Conv2dShape& s : shapes) {
    CAPTURE(ConvCase{s}.describe());
    const int oh = s.out_h(), ow = s.out_w();
    std::vector<double> x = to_double(rng.floats(size_t(s.n) * s.h * s.w * s.c_in));
    std::vector<double> w = to_double(rng.floats(s.weight_count()));
    std::vector<double> b = to_double(rng.floats(size_t(s.c_out)));
    std::vector<double> probe = to_double(rng.floats(size_t(s.n) * oh * ow * s.c_out));  // loss = sum(out * probe)
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      std::vector<double> out(probe.size());
      conv2d_forward_reference<double>(s, nhwc<const double>(xv.data(), s.n, s.h, s.w, s.c_in), wv.data(), bv.data(),
                                       nhwc(out.data(), s.n, oh, ow, s.c_out), nullptr, 0);
      double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += out[i] * probe[i];
      return sum;
    };
    std::vector<double> num_x = numeric_gradient(x, [&](const std::vector<double>& v) { return loss(v, w, b); });
    std::vector<double> num_w = numeric_gradient(w, [&](const std::vector<double>& v) { return loss(x, v, b); });
    std::vector<double> num_b = numeric_gradient(b, [&](const std::vector<double>& v) { return loss(x, w, v); });

    std::vector<double> gx(x.size(), 0.0), gw(w.size(), 0.0), gb(b.size(), 0.0);
    conv2d_backward_data_reference<double>(s, nhwc<const double>(probe.data(), s.n, oh, ow, s.c_out), w.data(),
                                           nhwc(gx.data(), s.n, s.h, s.w, s.c_in), false, nullptr, 0);
    conv2d_backward_weights_reference<double>(s, nhwc<const double>(x.data(), s.n, s.h, s.w, s.c_in),
                                              nhwc<const double>(probe.data(), s.n, oh, ow, s.c_out), gw.data(),
                                              gb.data(), nullptr, 0);
    CHECK_CLOSE(gx, num_x, 1e-6, 1e-6);
    CHECK_CLOSE(gw, num_w, 1e-6, 1e-6);
    CHECK_CLOSE(gb, num_b, 1e-6, 1e-6);

    // accumulate adds the same gradient onto what is there.
    std::vector<double> start = to_double(rng.floats(x.size())), acc = start;
    conv2d_backward_data_reference<double>(s, nhwc<const double>(probe.data(), s.n, oh, ow, s.c_out), w.data(),
                                           nhwc(acc.data(), s.n, s.h, s.w, s.c_in), true, nullptr, 0);
    for (size_t i = 0; i < start.size(); ++i) start[i] += num_x[i];
    CHECK_CLOSE(acc, start, 1e-6, 1e-6);
  }
}

TEST_CASE("conv: cpu matches the reference, in every micro-kernel variant this CPU runs") {
  Rng rng;
  CAPTURE(rng.seed());
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, CpuKernel::ConvForward);
    const uint64_t data_before = cpu_kernel_runs(CpuKernel::ConvBackwardData, isa);
    const uint64_t weights_before = cpu_kernel_runs(CpuKernel::ConvBackwardWeights, isa);
    for (const ConvCase& c : conv_cases()) {
      CAPTURE(c.describe());
      const ConvData d = make_data(c, rng);
      const ConvResult r = run_cpu(c, d);
      check_result(c, d, r);
      const ConvResult again = run_cpu(c, d);
      CHECK(same_bits(r.out, again.out));
      CHECK(same_bits(r.grad_weights, again.grad_weights));
    }
    // The variant asked for is the one that ran, in all three passes.
    const uint64_t calls = 2 * conv_cases().size();
    CHECK(use.runs() == calls);
    CHECK(cpu_kernel_runs(CpuKernel::ConvBackwardData, isa) - data_before == calls);
    CHECK(cpu_kernel_runs(CpuKernel::ConvBackwardWeights, isa) - weights_before == calls);
  }
}

TEST_CASE("conv: cuda matches the reference (automatic tiling)") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (const ConvCase& c : conv_cases()) {
    CAPTURE(c.describe());
    check_cuda_case(device, c, rng);
  }
}

TEST_CASE("conv: cuda matches the reference with every tile shape and split count") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  // Several row and column tiles for every shape (up to 3 x 2 of 128), both float4 and scalar
  // paths, and split counts that leave empty chunks: 7 splits of forward K = 117 and 144 (15
  // and 18 stages, chunks of 3) leave 2 and 1 empty, of the 1-tap class's backward-data K = 132
  // (17 stages) 1, and 5 or 7 of backward-weights K = 84 pixels (11 stages) 1.
  const std::vector<ConvCase> cases = {
      {{3, 11, 9, 13, 70, 3, 1}, 3, 2, 1, 0, true, true},
      {{2, 13, 11, 16, 132, 3, 2}, 0, 0, 4, 4, false, false},
  };
  for (const ConvCase& c : cases)
    for (int tile = 0; tile < 4; ++tile)
      for (int splits : {1, 2, 5, 7}) {
        CAPTURE(c.describe());
        CAPTURE(tile);
        CAPTURE(splits);
        ForcedTiling forced(tile, splits);
        check_cuda_case(device, c, rng);
      }
}

TEST_CASE("conv: bad arguments throw") {
  const Conv2dShape good{1, 4, 4, 3, 2, 3, 1};
  std::vector<float> in(48), w(good.weight_count()), out(32);
  ConstAct in_view = nhwc<const float>(in.data(), 1, 4, 4, 3);
  Act out_view = nhwc(out.data(), 1, 4, 4, 2);
  for (Conv2dShape bad : {Conv2dShape{-1, 4, 4, 3, 2, 3, 1}, Conv2dShape{1, 0, 4, 3, 2, 3, 1},
                          Conv2dShape{1, 4, 4, 0, 2, 3, 1}, Conv2dShape{1, 4, 4, 3, 2, 2, 1},
                          Conv2dShape{1, 4, 4, 3, 2, 3, 0}, Conv2dShape{1, 4, 4, 3, 2, -1, 1},
                          Conv2dShape{100000, 1000, 1000, 3, 2, 3, 1}})
    CHECK_THROWS_AS(bad.validate(), Error);
  CHECK_NOTHROW(good.validate());
  // Views that do not match the shape, a stride below the channel count, null weights.
  CHECK_THROWS_AS(
      conv2d_forward_cpu(good, nhwc<const float>(in.data(), 1, 4, 3, 3), w.data(), nullptr, out_view, nullptr, 0),
      Error);
  CHECK_THROWS_AS(conv2d_forward_cpu(good, in_view, w.data(), nullptr, nhwc(out.data(), 1, 4, 4, 3), nullptr, 0),
                  Error);
  CHECK_THROWS_AS(
      conv2d_forward_cpu(good, ConstAct{in.data(), 1, 4, 4, 3, 2}, w.data(), nullptr, out_view, nullptr, 0), Error);
  CHECK_THROWS_AS(conv2d_forward_cpu(good, in_view, nullptr, nullptr, out_view, nullptr, 0), Error);
  CHECK_THROWS_AS(conv2d_forward_reference<float>(good, ConstAct{nullptr, 1, 4, 4, 3, 3}, w.data(), nullptr, out_view,
                                                  nullptr, 0),
                  Error);
  CHECK_THROWS_AS(conv2d_backward_weights_cpu(good, in_view, as_const(out_view), nullptr, nullptr, nullptr, 0), Error);
  CHECK_THROWS_AS(conv2d_backward_data_cpu(good, in_view, w.data(), nhwc(in.data(), 1, 4, 4, 3), false, nullptr, 0),
                  Error);
}

TEST_CASE("conv: cuda launchers reject bad arguments and a short workspace") {
  KERNEL_TEST_DEVICE(device);
  const Conv2dShape s{1, 5, 5, 4, 4, 3, 1};
  DeviceArray<float> in(device, 100), w(device, s.weight_count()), out(device, 100), gw(device, s.weight_count());
  ConstAct in_view = nhwc<const float>(in.data(), 1, 5, 5, 4);
  CHECK_THROWS_AS(
      conv2d_forward_cuda(s, in_view, nullptr, nullptr, nhwc(out.data(), 1, 5, 5, 4), nullptr, 0, nullptr), Error);
  CHECK_THROWS_AS(
      conv2d_forward_cuda(s, in_view, w.data(), nullptr, nhwc(out.data(), 1, 5, 4, 4), nullptr, 0, nullptr), Error);
  ForcedTiling forced(3, 4);  // splits, so every pass needs a workspace
  REQUIRE(conv2d_forward_workspace_bytes(s) > 0);
  REQUIRE(conv2d_backward_data_workspace_bytes(s) > 0);
  CHECK_THROWS_WITH_AS(
      conv2d_forward_cuda(s, in_view, w.data(), nullptr, nhwc(out.data(), 1, 5, 5, 4), nullptr, 0, nullptr),
      doctest::Contains("workspace"), Error);
  CHECK_THROWS_WITH_AS(conv2d_forward_cuda(s, in_view, w.data(), nullptr, nhwc(out.data(), 1, 5, 5, 4), gw.data(),
                                           conv2d_forward_workspace_bytes(s) - 4, nullptr),
                       doctest::Contains("workspace"), Error);
  CHECK_THROWS_WITH_AS(conv2d_backward_data_cuda(s, nhwc<const float>(out.data(), 1, 5, 5, 4), w.data(),
                                                 nhwc(in.data(), 1, 5, 5, 4), false, nullptr, 0, nullptr),
                       doctest::Contains("workspace"), Error);
  CHECK_THROWS_WITH_AS(conv2d_backward_weights_cuda(s, in_view, nhwc<const float>(out.data(), 1, 5, 5, 4), gw.data(),
                                                    nullptr, out.data(), 16, nullptr),
                       doctest::Contains("workspace"), Error);
}
