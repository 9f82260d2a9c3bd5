// Max pooling with darknet's padding: output sizes, a hand-computed case with ties, the reference
// against finite differences (distinct inputs, away from ties), the fast CPU version and the
// CUDA kernels against the reference (values, argmax with ties, gathered gradients, channel
// slices, accumulate), determinism, and argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/maxpool.h"
#include "runtime/check.h"
#include "tests/cpu_isa_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

struct Case {
  int n, h, w, c, size, stride;
  int in_pad, in_offset, out_pad, out_offset;  // slice strides: c + pad (offset inside the pad)
};

const Case kCases[] = {
    {3, 7, 5, 3, 2, 2, 0, 0, 0, 0},  {3, 7, 5, 13, 2, 2, 4, 1, 3, 2}, {2, 7, 5, 13, 2, 1, 0, 0, 5, 5},
    {2, 6, 7, 3, 3, 2, 2, 2, 0, 0},  {1, 5, 4, 5, 3, 1, 1, 0, 2, 1},  {2, 1, 1, 2, 2, 2, 0, 0, 0, 0},
    {1, 9, 8, 2, 4, 3, 0, 0, 0, 0},  {2, 5, 6, 37, 2, 2, 3, 1, 0, 0}, {1, 6, 5, 21, 3, 1, 0, 0, 2, 1},
};

Slice in_slice(const Case& k) { return {k.n, k.h, k.w, k.c, k.c + k.in_pad, k.in_offset}; }
Slice out_slice(const Case& k) {
  return {k.n, maxpool_output_size(k.h, k.size, k.stride), maxpool_output_size(k.w, k.size, k.stride), k.c,
          k.c + k.out_pad, k.out_offset};
}

// Inputs with many ties (a few integer levels) or without (uniform floats).
std::vector<float> inputs(Rng& rng, size_t count, bool ties) {
  std::vector<float> v = rng.floats(count);
  if (ties)
    for (float& x : v) x = float(rng.integer(0, 2));
  return v;
}

}  // namespace

TEST_CASE("maxpool: output sizes follow darknet") {
  CHECK(maxpool_output_size(416, 2, 2) == 208);
  CHECK(maxpool_output_size(13, 2, 1) == 13);
  CHECK(maxpool_output_size(7, 2, 2) == 4);
  CHECK(maxpool_output_size(13, 3, 2) == 7);
  CHECK(maxpool_output_size(0, 2, 2) == 0);
  CHECK_THROWS_AS(maxpool_output_size(13, 0, 1), Error);
  CHECK_THROWS_AS(maxpool_output_size(13, 2, 0), Error);
}

TEST_CASE("maxpool: a hand-computed case, ties going to the first maximum") {
  std::vector<double> in = {1, 5, 2, 7, 3, 9, 4, 8, 6};  // 1x3x3x1
  std::vector<double> out(4);
  std::vector<int> argmax(4, -7);
  maxpool_forward_reference<double>(nhwc<const double>(in.data(), 1, 3, 3, 1), nhwc(out.data(), 1, 2, 2, 1),
                                    argmax.data(), 2, 2);
  CHECK(out == std::vector<double>{7, 9, 8, 6});
  CHECK(argmax == std::vector<int>{3, 5, 7, 8});
  std::vector<double> grad_out = {1, 2, 3, 4}, grad_in(9, -1.0);
  maxpool_backward_reference<double>(nhwc<const double>(grad_out.data(), 1, 2, 2, 1), argmax.data(),
                                     nhwc(grad_in.data(), 1, 3, 3, 1), 2, 2, false);
  CHECK(grad_in == std::vector<double>{0, 0, 0, 1, 0, 2, 0, 3, 4});

  std::vector<double> flat(9, 1.0);
  maxpool_forward_reference<double>(nhwc<const double>(flat.data(), 1, 3, 3, 1), nhwc(out.data(), 1, 2, 2, 1),
                                    argmax.data(), 2, 2);
  CHECK(argmax == std::vector<int>{0, 2, 6, 8});
  // size 2 stride 1 (yolov3-tiny): 3x3 stays 3x3; the last row and column see clipped windows.
  std::vector<double> out3(9);
  std::vector<int> argmax3(9);
  maxpool_forward_reference<double>(nhwc<const double>(in.data(), 1, 3, 3, 1), nhwc(out3.data(), 1, 3, 3, 1),
                                    argmax3.data(), 2, 1);
  CHECK(out3 == std::vector<double>{7, 9, 9, 8, 9, 9, 8, 8, 6});
  CHECK(argmax3 == std::vector<int>{3, 5, 5, 7, 5, 5, 7, 7, 8});
}

TEST_CASE("maxpool: reference backward matches finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  std::mt19937 shuffle_engine(unsigned(rng.seed()));
  for (auto [size, stride] : {std::pair{2, 2}, {2, 1}, {3, 2}, {3, 1}}) {
    CAPTURE(size);
    CAPTURE(stride);
    const int n = 2, h = 5, w = 3, c = 2;
    const int oh = maxpool_output_size(h, size, stride), ow = maxpool_output_size(w, size, stride);
    size_t count = size_t(n) * h * w * c;
    std::vector<double> x(count);  // distinct values 0.01 apart: no argmax changes under h = 1e-6
    std::iota(x.begin(), x.end(), 0.0);
    std::shuffle(x.begin(), x.end(), shuffle_engine);
    for (double& v : x) v *= 0.01;
    std::vector<double> r = to_double(rng.floats(size_t(n) * oh * ow * c));
    std::vector<int> argmax(r.size());
    auto loss = [&](const std::vector<double>& in) {
      std::vector<double> out(r.size());
      maxpool_forward_reference<double>(nhwc(in.data(), n, h, w, c), nhwc(out.data(), n, oh, ow, c), argmax.data(),
                                        size, stride);
      double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += out[i] * r[i];
      return sum;
    };
    std::vector<double> numeric = numeric_gradient(x, loss);
    loss(x);  // argmax of the unperturbed input
    std::vector<double> grad(count, 3.0);
    maxpool_backward_reference<double>(nhwc<const double>(r.data(), n, oh, ow, c), argmax.data(),
                                       nhwc(grad.data(), n, h, w, c), size, stride, false);
    CHECK_CLOSE(grad, numeric, 1e-7, 1e-6);
  }
}

namespace {

struct ForwardRun {
  std::vector<float> out;
  std::vector<int> argmax;
};

template <typename Forward, typename Backward>
void compare_with_reference(Rng& rng, const Forward& forward, const Backward& backward) {
  for (const Case& k : kCases)
    for (bool ties : {false, true}) {
      Slice is = in_slice(k), os = out_slice(k);
      CAPTURE(is);
      CAPTURE(os);
      CAPTURE(k.size);
      CAPTURE(k.stride);
      CAPTURE(ties);
      std::vector<float> in = inputs(rng, is.size(), ties), out_before = output_buffer(rng, os);
      std::vector<double> in_d = to_double(in), ref_out = to_double(out_before);
      std::vector<int> ref_argmax(os.elements(), -1);
      maxpool_forward_reference<double>(is.on<const double>(in_d.data()), os.on(ref_out.data()), ref_argmax.data(),
                                        k.size, k.stride);
      ForwardRun run = forward(in, out_before, k);
      CHECK_CLOSE(run.out, ref_out, 0.0, 0.0);  // a selection: exact
      CHECK(run.argmax == ref_argmax);

      for (bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        std::vector<float> grad_out = rng.floats(os.size()), gi_before = output_buffer(rng, is, accumulate);
        std::vector<double> go_d = to_double(grad_out), ref_grad = to_double(gi_before);
        maxpool_backward_reference<double>(os.on<const double>(go_d.data()), ref_argmax.data(), is.on(ref_grad.data()),
                                           k.size, k.stride, accumulate);
        CHECK_CLOSE(backward(grad_out, ref_argmax, gi_before, k, accumulate), ref_grad, 1e-6, 1e-4);
      }
    }
}

}  // namespace

// Once per micro-kernel variant this CPU runs (the channel loops: kernels/cpu_micro_pool.inc),
// from the same random inputs: each matches the reference, and all give baseline's bits.
TEST_CASE("maxpool: cpu matches the reference, in each micro-kernel variant, with the same bits") {
  std::vector<std::vector<float>> baseline;  // every output and gradient of the baseline run, in order
  const Rng start;
  CAPTURE(start.seed());
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa forward_runs(isa, CpuKernel::MaxpoolForward);
    const uint64_t backward_before = cpu_kernel_runs(CpuKernel::MaxpoolBackward, isa);
    Rng rng = start;  // the same inputs for every variant
    std::vector<std::vector<float>> results;
    compare_with_reference(
        rng,
        [&](const std::vector<float>& in, std::vector<float> out, const Case& k) {
          Slice os = out_slice(k);
          std::vector<int> argmax(os.elements(), -1);
          maxpool_forward_cpu(in_slice(k).on(in.data()), os.on(out.data()), argmax.data(), k.size, k.stride);
          std::vector<float> again = out;  // without argmax: the same values
          maxpool_forward_cpu(in_slice(k).on(in.data()), os.on(again.data()), nullptr, k.size, k.stride);
          CHECK(same_bits(again, out));
          results.push_back(out);
          return ForwardRun{out, argmax};
        },
        [&](const std::vector<float>& grad_out, const std::vector<int>& argmax, std::vector<float> grad_in,
            const Case& k, bool accumulate) {
          maxpool_backward_cpu(out_slice(k).on(grad_out.data()), argmax.data(), in_slice(k).on(grad_in.data()), k.size,
                               k.stride, accumulate);
          results.push_back(grad_in);
          return grad_in;
        });
    CHECK(forward_runs.runs() > 0);  // the variant asked for is the one that ran
    CHECK(cpu_kernel_runs(CpuKernel::MaxpoolBackward, isa) > backward_before);
    if (isa == CpuIsa::Baseline) {
      baseline = results;
      continue;
    }
    REQUIRE(results.size() == baseline.size());
    for (size_t i = 0; i < results.size(); ++i) CHECK(same_bits(results[i], baseline[i]));
  }
}

TEST_CASE("maxpool: cuda matches the reference and repeats bit for bit") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [&](const std::vector<float>& in, const std::vector<float>& out_before, const Case& k) {
        Slice os = out_slice(k);
        DeviceArray<float> d_in(device, in), d_out(device, out_before);
        DeviceArray<int> d_argmax(device, os.elements());
        d_argmax.poison();
        maxpool_forward_cuda(in_slice(k).on<const float>(d_in.data()), os.on(d_out.data()), d_argmax.data(), k.size,
                             k.stride, nullptr);
        return ForwardRun{d_out.download(), d_argmax.download()};
      },
      [&](const std::vector<float>& grad_out, const std::vector<int>& argmax, const std::vector<float>& gi_before,
          const Case& k, bool accumulate) {
        DeviceArray<float> d_go(device, grad_out), d_gi(device, gi_before);
        DeviceArray<int> d_argmax(device, argmax);
        auto run = [&] {
          maxpool_backward_cuda(out_slice(k).on<const float>(d_go.data()), d_argmax.data(), in_slice(k).on(d_gi.data()),
                                k.size, k.stride, accumulate, nullptr);
          return d_gi.download();
        };
        std::vector<float> first = run();
        d_gi.upload(gi_before);
        std::vector<float> second = run();
        CHECK(same_bits(first, second));
        return first;
      });
}

TEST_CASE("maxpool: bad arguments are reported") {
  std::vector<float> in(64), out(64), grad(64);
  std::vector<int> argmax(64);
  ConstAct vin = nhwc<const float>(in.data(), 1, 4, 4, 4);
  Act vout = nhwc(out.data(), 1, 2, 2, 4);
  CHECK_NOTHROW(maxpool_forward_cpu(vin, vout, argmax.data(), 2, 2));
  CHECK_THROWS_WITH_AS(maxpool_forward_cpu(vin, nhwc(out.data(), 1, 3, 3, 4), argmax.data(), 2, 2),
                       doctest::Contains("gives 1x2x2x4"), Error);
  CHECK_THROWS_AS(maxpool_forward_cpu(vin, vout, argmax.data(), 0, 2), Error);
  CHECK_THROWS_AS(maxpool_forward_cuda(vin, vout, argmax.data(), 2, -1, nullptr), Error);
  CHECK_THROWS_WITH_AS(maxpool_forward_cuda(nhwc<const float>(in.data(), 1, 4, 4, 4, 3), vout, nullptr, 2, 2, nullptr),
                       doctest::Contains("stride 3 < channels 4"), Error);
  CHECK_THROWS_WITH_AS(maxpool_forward_reference<float>(nhwc<const float>(nullptr, 1, 4, 4, 4), vout, nullptr, 2, 2),
                       doctest::Contains("null"), Error);
  CHECK_THROWS_WITH_AS(maxpool_backward_cpu(as_const(vout), nullptr, nhwc(grad.data(), 1, 4, 4, 4), 2, 2, false),
                       doctest::Contains("argmax is a null pointer"), Error);
  CHECK_THROWS_AS(maxpool_backward_cuda(as_const(vout), argmax.data(), nhwc(grad.data(), 1, 4, 4, 3), 2, 2, true, nullptr),
                  Error);
  // The reference checks that each argmax lies in its window.
  std::vector<int> wrong(16, 15);
  CHECK_THROWS_WITH_AS(maxpool_backward_reference<float>(as_const(vout), wrong.data(), nhwc(grad.data(), 1, 4, 4, 4), 2,
                                                         2, false),
                       doctest::Contains("not in its window"), Error);
}

namespace {

// 16-bit storage: size 2 stride 2 and size 2 stride 1 (darknet's padding), = and +=, against the
// FP32 reference on the widened inputs: maxima and argmax exact, gradient sums rounded once.
template <typename T>
void check_maxpool_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 2, h = 7, w = 6, c = 5;
  for (auto [size, stride] : {std::pair{2, 2}, std::pair{2, 1}, std::pair{3, 2}}) {
    for (bool accumulate : {false, true}) {
      CAPTURE(size);
      CAPTURE(stride);
      CAPTURE(accumulate);
      const int oh = maxpool_output_size(h, size, stride), ow = maxpool_output_size(w, size, stride);
      const size_t in_count = size_t(n) * h * w * c, out_count = size_t(n) * oh * ow * c;
      const std::vector<T> in = random_storage<T>(rng, in_count, -3.0f, 3.0f, false);
      const std::vector<T> grad_out = random_storage<T>(rng, out_count, -1.0f, 1.0f, false);
      const std::vector<T> start = random_storage<T>(rng, in_count, -1.0f, 1.0f, false);
      DeviceArray<T> d_in(device, in), d_out(device, out_count), d_go(device, grad_out), d_gi(device, start);
      DeviceArray<int> d_argmax(device, out_count);
      d_out.poison();
      d_argmax.poison();
      maxpool_forward_cuda<T>(nhwc<const T>(d_in.data(), n, h, w, c), nhwc(d_out.data(), n, oh, ow, c),
                              d_argmax.data(), size, stride, nullptr);
      maxpool_backward_cuda<T>(nhwc<const T>(d_go.data(), n, oh, ow, c), d_argmax.data(), nhwc(d_gi.data(), n, h, w, c),
                               size, stride, accumulate, nullptr);
      std::vector<float> in_f = widened(in), go_f = widened(grad_out), out_f(out_count), gi_f = widened(start);
      std::vector<int> argmax(out_count);
      maxpool_forward_reference<float>(nhwc<const float>(in_f.data(), n, h, w, c), nhwc(out_f.data(), n, oh, ow, c),
                                       argmax.data(), size, stride);
      maxpool_backward_reference<float>(nhwc<const float>(go_f.data(), n, oh, ow, c), argmax.data(),
                                        nhwc(gi_f.data(), n, h, w, c), size, stride, accumulate);
      CHECK(d_argmax.download() == argmax);
      check_rounded_once(d_out.download(), out_f, 0, 1.0);
      check_rounded_once(d_gi.download(), gi_f, 0, 1.0);
    }
  }
}

}  // namespace

TEST_CASE("maxpool: cuda on bf16 and fp16 tensors: exact maxima and argmax, FP32 gradient sums rounded once") {
  KERNEL_TEST_DEVICE(device);
  check_maxpool_storage<Bf16>(device);
  check_maxpool_storage<Fp16>(device);
}
