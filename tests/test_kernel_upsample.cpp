// Nearest-neighbour upsampling: the reference against finite differences, the fast CPU version
// and the CUDA kernels against the reference (channel slices, both vector widths, accumulate),
// determinism, and argument checks.
#include <doctest/doctest.h>

#include <vector>

#include "kernels/upsample.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

struct Case {
  int n, h, w, c, factor;
  int small_stride, small_offset, big_stride, big_offset;  // channel slices of wider buffers
};

// Odd sizes; scalar path (c = 3, 13, misaligned slices) and the 4-wide path (c = 8, aligned).
const Case kCases[] = {
    {3, 7, 5, 3, 2, 3, 0, 3, 0},   {3, 7, 5, 13, 2, 17, 3, 20, 5}, {2, 3, 5, 13, 3, 13, 0, 16, 2},
    {3, 5, 7, 8, 2, 12, 4, 16, 8}, {1, 1, 1, 1, 1, 1, 0, 1, 0},
};

}  // namespace

TEST_CASE("upsample: reference backward matches finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  for (int factor : {1, 2, 3}) {
    CAPTURE(factor);
    const int n = 2, h = 3, w = 2, c = 3;
    const int oh = h * factor, ow = w * factor;
    std::vector<double> x = to_double(rng.floats(size_t(n) * h * w * c));
    std::vector<double> r = to_double(rng.floats(size_t(n) * oh * ow * c));  // dL/dout
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> out(r.size());
      upsample_forward_reference<double>(nhwc(in.data(), n, h, w, c), nhwc(out.data(), n, oh, ow, c), factor);
      double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += out[i] * r[i];
      return sum;
    };
    std::vector<double> numeric = numeric_gradient(x, loss);
    std::vector<double> grad(x.size(), 123.0);
    upsample_backward_reference<double>(nhwc<const double>(r.data(), n, oh, ow, c), nhwc(grad.data(), n, h, w, c),
                                        factor, false);
    CHECK_CLOSE(grad, numeric, 1e-7, 1e-6);
    // accumulate adds to what is there
    std::vector<double> base = to_double(rng.floats(x.size())), acc = base;
    upsample_backward_reference<double>(nhwc<const double>(r.data(), n, oh, ow, c), nhwc(acc.data(), n, h, w, c),
                                        factor, true);
    for (size_t i = 0; i < base.size(); ++i) base[i] += numeric[i];
    CHECK_CLOSE(acc, base, 1e-7, 1e-6);
  }
}

TEST_CASE("upsample: a hand-computed case") {
  std::vector<double> in = {1, 2, 3, 4};  // 1x2x2x1
  std::vector<double> out(16);
  upsample_forward_reference<double>(nhwc<const double>(in.data(), 1, 2, 2, 1), nhwc(out.data(), 1, 4, 4, 1), 2);
  CHECK(out == std::vector<double>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  std::vector<double> grad(4);
  upsample_backward_reference<double>(nhwc<const double>(out.data(), 1, 4, 4, 1), nhwc(grad.data(), 1, 2, 2, 1), 2, false);
  CHECK(grad == std::vector<double>{4, 8, 12, 16});
}

namespace {

// Runs forward and backward (plain and accumulating) through `forward` and `backward` (the CPU
// version or the CUDA launchers on device copies) and compares whole wide buffers with the
// reference: view elements as computed, everything outside the views untouched.
template <typename Forward, typename Backward>
void compare_with_reference(Rng& rng, const Forward& forward, const Backward& backward) {
  for (const Case& k : kCases) {
    Slice small{k.n, k.h, k.w, k.c, k.small_stride, k.small_offset};
    Slice big{k.n, k.h * k.factor, k.w * k.factor, k.c, k.big_stride, k.big_offset};
    CAPTURE(small);
    CAPTURE(big);
    CAPTURE(k.factor);
    std::vector<float> in = rng.floats(small.size()), out_before = output_buffer(rng, big);

    std::vector<double> in_d = to_double(in), ref_out = to_double(out_before);
    upsample_forward_reference<double>(small.on<const double>(in_d.data()), big.on(ref_out.data()), k.factor);
    std::vector<float> out = forward(in, out_before, small, big, k.factor);
    CHECK_CLOSE(out, ref_out, 0.0, 0.0);  // a copy: exact

    for (bool accumulate : {false, true}) {
      CAPTURE(accumulate);
      std::vector<float> grad_out = rng.floats(big.size()), grad_in_before = output_buffer(rng, small, accumulate);
      std::vector<double> go_d = to_double(grad_out), ref_grad = to_double(grad_in_before);
      upsample_backward_reference<double>(big.on<const double>(go_d.data()), small.on(ref_grad.data()), k.factor,
                                          accumulate);
      std::vector<float> grad_in = backward(grad_out, grad_in_before, big, small, k.factor, accumulate);
      CHECK_CLOSE(grad_in, ref_grad, 1e-6, 1e-4);
    }
  }
}

}  // namespace

TEST_CASE("upsample: cpu matches the reference") {
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [](const std::vector<float>& in, std::vector<float> out, const Slice& small, const Slice& big, int factor) {
        upsample_forward_cpu(small.on(in.data()), big.on(out.data()), factor);
        return out;
      },
      [](const std::vector<float>& grad_out, std::vector<float> grad_in, const Slice& big, const Slice& small,
         int factor, bool accumulate) {
        upsample_backward_cpu(big.on(grad_out.data()), small.on(grad_in.data()), factor, accumulate);
        return grad_in;
      });
}

TEST_CASE("upsample: cuda matches the reference and repeats bit for bit") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [&](const std::vector<float>& in, const std::vector<float>& out_before, const Slice& small, const Slice& big,
          int factor) {
        DeviceArray<float> d_in(device, in), d_out(device, out_before);
        upsample_forward_cuda(small.on<const float>(d_in.data()), big.on(d_out.data()), factor, nullptr);
        return d_out.download();
      },
      [&](const std::vector<float>& grad_out, const std::vector<float>& grad_in_before, const Slice& big,
          const Slice& small, int factor, bool accumulate) {
        DeviceArray<float> d_go(device, grad_out), d_gi(device, grad_in_before);
        upsample_backward_cuda(big.on<const float>(d_go.data()), small.on(d_gi.data()), factor, accumulate, nullptr);
        std::vector<float> first = d_gi.download();
        d_gi.upload(grad_in_before);
        upsample_backward_cuda(big.on<const float>(d_go.data()), small.on(d_gi.data()), factor, accumulate, nullptr);
        std::vector<float> second = d_gi.download();
        CHECK(same_bits(first, second));
        return first;
      });
}

TEST_CASE("upsample: bad arguments are reported") {
  std::vector<float> a(64), b(256);
  ConstAct in = nhwc<const float>(a.data(), 1, 2, 2, 4);
  Act out = nhwc(b.data(), 1, 4, 4, 4);
  CHECK_NOTHROW(upsample_forward_cpu(in, out, 2));
  CHECK_THROWS_WITH_AS(upsample_forward_cpu(in, out, 0), doctest::Contains("factor"), Error);
  CHECK_THROWS_WITH_AS(upsample_forward_cpu(in, out, 3), doctest::Contains("upsampled by 3"), Error);
  CHECK_THROWS_WITH_AS(upsample_forward_cpu(nhwc<const float>(a.data(), 1, 2, 2, 4, 3), out, 2),
                       doctest::Contains("stride 3 < channels 4"), Error);
  CHECK_THROWS_WITH_AS(upsample_forward_cpu(nhwc<const float>(nullptr, 1, 2, 2, 4), out, 2),
                       doctest::Contains("null"), Error);
  CHECK_THROWS_WITH_AS(upsample_forward_cuda(nhwc<const float>(a.data(), 1, -2, 2, 4), out, 2, nullptr),
                       doctest::Contains("negative"), Error);
  CHECK_THROWS_AS(upsample_backward_cpu(as_const(out), nhwc(a.data(), 1, 2, 3, 4), 2, false), Error);
  CHECK_THROWS_AS(upsample_backward_cuda(as_const(out), nhwc(a.data(), 2, 2, 2, 4), 2, true, nullptr), Error);
  CHECK_THROWS_AS(upsample_backward_reference<float>(as_const(out), nhwc(a.data(), 1, 2, 2, 5, 5), 2, false), Error);
}

namespace {

// 16-bit storage: the forward copies exactly; the backward sums each factor x factor block in
// FP32 (first element, then the rest in (dy, dx) order, then onto the old value when
// accumulating) and rounds once: bit for bit against the same sums on the host.
template <typename T>
void check_upsample_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  const int factor = 2;
  for (int c : {16, 5}) {
    for (bool accumulate : {false, true}) {
      CAPTURE(c);
      CAPTURE(accumulate);
      const int n = 2, h = 3, w = 4;
      const size_t small = size_t(n) * h * w * c, big = small * factor * factor;
      const std::vector<T> in = random_storage<T>(rng, small, -2.0f, 2.0f, true);
      const std::vector<T> grad_out = random_storage<T>(rng, big, -1.0f, 1.0f, true);
      const std::vector<T> start = random_storage<T>(rng, small, -1.0f, 1.0f, false);
      DeviceArray<T> d_in(device, in), d_out(device, big), d_go(device, grad_out), d_gi(device, start);
      d_out.poison();
      upsample_forward_cuda<T>(nhwc<const T>(d_in.data(), n, h, w, c), nhwc(d_out.data(), n, h * factor, w * factor, c),
                               factor, nullptr);
      upsample_backward_cuda<T>(nhwc<const T>(d_go.data(), n, h * factor, w * factor, c), nhwc(d_gi.data(), n, h, w, c),
                                factor, accumulate, nullptr);
      const std::vector<T> out = d_out.download(), gi = d_gi.download();
      std::vector<float> want_out(big), want_gi(small);
      const NhwcView<const T> go = nhwc<const T>(grad_out.data(), n, h * factor, w * factor, c);
      for (int b = 0; b < n; ++b)
        for (int y = 0; y < h * factor; ++y)
          for (int x = 0; x < w * factor; ++x)
            for (int ch = 0; ch < c; ++ch)
              want_out[((size_t(b) * h * factor + y) * w * factor + x) * c + ch] =
                  to_float(in[((size_t(b) * h + y / factor) * w + x / factor) * c + ch]);
      for (int b = 0; b < n; ++b)
        for (int y = 0; y < h; ++y)
          for (int x = 0; x < w; ++x)
            for (int ch = 0; ch < c; ++ch) {
              float sum = to_float(grad_out[go.at(b, y * factor, x * factor, ch)]);
              for (int dy = 0; dy < factor; ++dy)
                for (int dx = dy == 0 ? 1 : 0; dx < factor; ++dx)
                  sum += to_float(grad_out[go.at(b, y * factor + dy, x * factor + dx, ch)]);
              const size_t i = ((size_t(b) * h + y) * w + x) * c + ch;
              want_gi[i] = accumulate ? to_float(start[i]) + sum : sum;
            }
      check_rounded_once(out, want_out, 0, 1.0);
      check_rounded_once(gi, want_gi, 0, 1.0);
    }
  }
}

}  // namespace

TEST_CASE("upsample: cuda on bf16 and fp16 tensors: exact copies, FP32 block sums rounded once") {
  KERNEL_TEST_DEVICE(device);
  check_upsample_storage<Bf16>(device);
  check_upsample_storage<Fp16>(device);
}
