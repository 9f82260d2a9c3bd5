// Shortcut (residual add): the reference against finite differences, the fast CPU version and the
// CUDA kernels against the reference (channel slices, both vector widths, accumulate flags,
// skipped gradients, out aliasing a, grad_a aliasing grad_out), determinism, argument checks.
#include <doctest/doctest.h>

#include <vector>

#include "kernels/shortcut.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

struct Case {
  Slice a, b, out;
};
Slice shape(int n, int h, int w, int c, int stride, int offset) { return {n, h, w, c, stride, offset}; }

const Case kCases[] = {
    {shape(3, 7, 5, 3, 3, 0), shape(3, 7, 5, 3, 3, 0), shape(3, 7, 5, 3, 3, 0)},
    {shape(3, 7, 5, 13, 17, 1), shape(3, 7, 5, 13, 13, 0), shape(3, 7, 5, 13, 20, 7)},
    {shape(2, 5, 3, 8, 12, 4), shape(2, 5, 3, 8, 16, 8), shape(2, 5, 3, 8, 8, 0)},  // 4-wide kernel
    {shape(1, 1, 1, 1, 2, 1), shape(1, 1, 1, 1, 1, 0), shape(1, 1, 1, 1, 3, 2)},
};

}  // namespace

TEST_CASE("shortcut: reference backward matches finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 2, h = 3, w = 2, c = 3;
  size_t count = size_t(n) * h * w * c;
  std::vector<double> a = to_double(rng.floats(count)), b = to_double(rng.floats(count)), r = to_double(rng.floats(count));
  auto loss_with = [&](bool vary_a) {
    return [&, vary_a](const std::vector<double>& x) {
      std::vector<double> out(count);
      shortcut_forward_reference<double>(nhwc<const double>(vary_a ? x.data() : a.data(), n, h, w, c),
                                         nhwc<const double>(vary_a ? b.data() : x.data(), n, h, w, c),
                                         nhwc(out.data(), n, h, w, c));
      double sum = 0;
      for (size_t i = 0; i < count; ++i) sum += out[i] * r[i];
      return sum;
    };
  };
  std::vector<double> numeric_a = numeric_gradient(a, loss_with(true)), numeric_b = numeric_gradient(b, loss_with(false));
  std::vector<double> grad_a(count, 5.0), grad_b = to_double(rng.floats(count)), expected_b = grad_b;
  for (size_t i = 0; i < count; ++i) expected_b[i] += numeric_b[i];
  shortcut_backward_reference<double>(nhwc<const double>(r.data(), n, h, w, c), nhwc(grad_a.data(), n, h, w, c),
                                      nhwc(grad_b.data(), n, h, w, c), false, true);
  CHECK_CLOSE(grad_a, numeric_a, 1e-7, 1e-6);
  CHECK_CLOSE(grad_b, expected_b, 1e-7, 1e-6);
}

namespace {

struct BackwardRun {
  std::vector<float> grad_a, grad_b;
};

// Forward, then backward for each combination of accumulate flags and skipped gradients;
// whole wide buffers compared with the reference.
template <typename Forward, typename Backward>
void compare_with_reference(Rng& rng, const Forward& forward, const Backward& backward) {
  for (const Case& k : kCases) {
    CAPTURE(k.a);
    CAPTURE(k.b);
    CAPTURE(k.out);
    std::vector<float> a = rng.floats(k.a.size()), b = rng.floats(k.b.size()), out_before = output_buffer(rng, k.out);
    std::vector<double> a_d = to_double(a), b_d = to_double(b), ref_out = to_double(out_before);
    shortcut_forward_reference<double>(k.a.on<const double>(a_d.data()), k.b.on<const double>(b_d.data()),
                                       k.out.on(ref_out.data()));
    CHECK_CLOSE(forward(a, b, out_before, k), ref_out, 1e-6, 1e-4);

    // grad_out takes out's layout, grad_a a's, grad_b b's.
    for (int mode = 0; mode < 6; ++mode) {
      bool accumulate_a = mode & 1, accumulate_b = mode & 2, skip_a = mode == 4, skip_b = mode == 5;
      CAPTURE(mode);
      std::vector<float> grad_out = rng.floats(k.out.size());
      std::vector<float> ga_before = output_buffer(rng, k.a, accumulate_a),
                         gb_before = output_buffer(rng, k.b, accumulate_b);
      std::vector<double> go_d = to_double(grad_out), ref_a = to_double(ga_before), ref_b = to_double(gb_before);
      shortcut_backward_reference<double>(k.out.on<const double>(go_d.data()), k.a.on(skip_a ? nullptr : ref_a.data()),
                                          k.b.on(skip_b ? nullptr : ref_b.data()), accumulate_a, accumulate_b);
      BackwardRun run = backward(grad_out, ga_before, gb_before, k, skip_a, skip_b, accumulate_a, accumulate_b);
      // A skipped gradient stays as it was, bit for bit (NaN included).
      if (skip_a) CHECK(same_bits(run.grad_a, ga_before));
      else CHECK_CLOSE(run.grad_a, ref_a, 1e-6, 1e-4);
      if (skip_b) CHECK(same_bits(run.grad_b, gb_before));
      else CHECK_CLOSE(run.grad_b, ref_b, 1e-6, 1e-4);
    }
  }
}

}  // namespace

TEST_CASE("shortcut: cpu matches the reference") {
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [](const std::vector<float>& a, const std::vector<float>& b, std::vector<float> out, const Case& k) {
        shortcut_forward_cpu(k.a.on(a.data()), k.b.on(b.data()), k.out.on(out.data()));
        return out;
      },
      [](const std::vector<float>& grad_out, std::vector<float> ga, std::vector<float> gb, const Case& k, bool skip_a,
         bool skip_b, bool accumulate_a, bool accumulate_b) {
        shortcut_backward_cpu(k.out.on(grad_out.data()), k.a.on(skip_a ? nullptr : ga.data()),
                              k.b.on(skip_b ? nullptr : gb.data()), accumulate_a, accumulate_b);
        return BackwardRun{ga, gb};
      });
}

TEST_CASE("shortcut: cuda matches the reference and repeats bit for bit") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [&](const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& out_before,
          const Case& k) {
        DeviceArray<float> d_a(device, a), d_b(device, b), d_out(device, out_before);
        shortcut_forward_cuda(k.a.on<const float>(d_a.data()), k.b.on<const float>(d_b.data()), k.out.on(d_out.data()),
                              nullptr);
        return d_out.download();
      },
      [&](const std::vector<float>& grad_out, const std::vector<float>& ga, const std::vector<float>& gb, const Case& k,
          bool skip_a, bool skip_b, bool accumulate_a, bool accumulate_b) {
        DeviceArray<float> d_go(device, grad_out), d_ga(device, ga), d_gb(device, gb);
        auto run = [&] {
          shortcut_backward_cuda(k.out.on<const float>(d_go.data()), k.a.on(skip_a ? nullptr : d_ga.data()),
                                 k.b.on(skip_b ? nullptr : d_gb.data()), accumulate_a, accumulate_b, nullptr);
          return BackwardRun{d_ga.download(), d_gb.download()};
        };
        BackwardRun first = run();
        d_ga.upload(ga);
        d_gb.upload(gb);
        BackwardRun second = run();
        CHECK(same_bits(first.grad_a, second.grad_a));
        CHECK(same_bits(first.grad_b, second.grad_b));
        return first;
      });
}

TEST_CASE("shortcut: out may alias a, and grad_a may alias grad_out") {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 3, h = 5, w = 7, c = 12;
  size_t count = size_t(n) * h * w * c;
  std::vector<float> a = rng.floats(count), b = rng.floats(count), go = rng.floats(count), gb = rng.floats(count);
  std::vector<float> sum(count), gb_expected(count);
  for (size_t i = 0; i < count; ++i) sum[i] = a[i] + b[i], gb_expected[i] = gb[i] + go[i];

  std::vector<float> x = a, g = go, y = gb;
  shortcut_forward_cpu(nhwc<const float>(x.data(), n, h, w, c), nhwc<const float>(b.data(), n, h, w, c),
                       nhwc(x.data(), n, h, w, c));
  CHECK(x == sum);
  shortcut_backward_cpu(nhwc<const float>(g.data(), n, h, w, c), nhwc(g.data(), n, h, w, c), nhwc(y.data(), n, h, w, c),
                        false, true);
  CHECK(g == go);
  CHECK(y == gb_expected);

  KERNEL_TEST_DEVICE(device);  // the CPU part above runs in every build
  DeviceArray<float> d_x(device, a), d_b(device, b), d_g(device, go), d_y(device, gb);
  shortcut_forward_cuda(nhwc<const float>(d_x.data(), n, h, w, c), nhwc<const float>(d_b.data(), n, h, w, c),
                        nhwc(d_x.data(), n, h, w, c), nullptr);
  CHECK(d_x.download() == sum);
  shortcut_backward_cuda(nhwc<const float>(d_g.data(), n, h, w, c), nhwc(d_g.data(), n, h, w, c),
                         nhwc(d_y.data(), n, h, w, c), false, true, nullptr);
  CHECK(d_g.download() == go);
  CHECK(d_y.download() == gb_expected);
}

TEST_CASE("shortcut: bad arguments are reported") {
  std::vector<float> a(64), b(64), out(64);
  ConstAct va = nhwc<const float>(a.data(), 1, 2, 2, 4), vb = nhwc<const float>(b.data(), 1, 2, 2, 4);
  Act vo = nhwc(out.data(), 1, 2, 2, 4);
  CHECK_NOTHROW(shortcut_forward_cpu(va, vb, vo));
  CHECK_THROWS_WITH_AS(shortcut_forward_cpu(va, nhwc<const float>(b.data(), 1, 2, 2, 3), vo),
                       doctest::Contains("same shape"), Error);
  CHECK_THROWS_WITH_AS(shortcut_forward_cuda(va, vb, nhwc(out.data(), 1, 2, 2, 4, 2), nullptr),
                       doctest::Contains("stride 2 < channels 4"), Error);
  CHECK_THROWS_WITH_AS(shortcut_forward_cpu(nhwc<const float>(nullptr, 1, 2, 2, 4), vb, vo),
                       doctest::Contains("a is a null pointer"), Error);
  CHECK_THROWS_WITH_AS(shortcut_forward_reference<float>(va, vb, nhwc(out.data(), -1, 2, 2, 4)),
                       doctest::Contains("negative"), Error);
  CHECK_THROWS_AS(shortcut_backward_cpu(as_const(vo), nhwc(a.data(), 1, 2, 4, 2), Act{}, false, false), Error);
  CHECK_THROWS_AS(shortcut_backward_cuda(as_const(vo), Act{}, nhwc(b.data(), 1, 2, 2, 5, 4), true, true, nullptr),
                  Error);
  CHECK_NOTHROW(shortcut_backward_cuda(as_const(vo), Act{}, Act{}, true, true, nullptr));  // nothing to write
}

namespace {

// 16-bit storage: out = a + b and the gradients' (accumulated) copies, on a dense layout (16-byte
// vectors) and a slice at an odd offset (element by element), against the FP32 sums of the
// widened inputs rounded once: bit for bit (an FP32 add rounds the same on host and device).
template <typename T>
void check_shortcut_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  for (const Slice& l : {Slice{2, 3, 5, 16, 16, 0}, Slice{1, 4, 3, 13, 19, 3}}) {
    for (bool accumulate : {false, true}) {
      CAPTURE(l);
      CAPTURE(accumulate);
      const std::vector<T> a = random_storage<T>(rng, l.size(), -4.0f, 4.0f, true);
      const std::vector<T> b = random_storage<T>(rng, l.size(), -4.0f, 4.0f, true);
      const std::vector<T> start = random_storage<T>(rng, l.size(), -1.0f, 1.0f, false);
      DeviceArray<T> d_a(device, a), d_b(device, b), d_out(device, l.size()), d_ga(device, start), d_gb(device, start);
      d_out.poison();
      shortcut_forward_cuda<T>(l.on<const T>(d_a.data()), l.on<const T>(d_b.data()), l.on<T>(d_out.data()), nullptr);
      shortcut_backward_cuda<T>(l.on<const T>(d_a.data()), l.on<T>(d_ga.data()), l.on<T>(d_gb.data()), accumulate,
                                accumulate, nullptr);
      const std::vector<T> out = d_out.download(), ga = d_ga.download(), gb = d_gb.download();
      std::vector<T> got_out, got_ga, got_gb;
      std::vector<float> want_out, want_g;
      for (size_t i = 0; i < l.size(); ++i) {
        const int ch = int(i % size_t(l.stride));
        if (ch < l.offset || ch >= l.offset + l.c) {
          CHECK(out[i].bits == 0xffff);  // the gaps stay poisoned
          continue;
        }
        got_out.push_back(out[i]), got_ga.push_back(ga[i]), got_gb.push_back(gb[i]);
        want_out.push_back(to_float(a[i]) + to_float(b[i]));
        want_g.push_back(accumulate ? to_float(start[i]) + to_float(a[i]) : to_float(a[i]));
      }
      check_rounded_once(got_out, want_out, 0, 1.0);
      check_rounded_once(got_ga, want_g, 0, 1.0);
      check_rounded_once(got_gb, want_g, 0, 1.0);
    }
  }
}

}  // namespace

TEST_CASE("shortcut: cuda on bf16 and fp16 tensors: FP32 sums rounded once, Inf/NaN propagated") {
  KERNEL_TEST_DEVICE(device);
  check_shortcut_storage<Bf16>(device);
  check_shortcut_storage<Fp16>(device);
}
