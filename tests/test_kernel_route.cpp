// Route (channel concatenation): the reference against finite differences, the fast CPU version
// and the CUDA kernel against the reference (1 to 4 inputs, channel slices on both sides, both
// vector widths, accumulate, an input already in place), determinism, and argument checks.
#include <doctest/doctest.h>

#include <vector>

#include "kernels/route.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// One configuration: the inputs' channel counts and the padding around each slice.
struct Case {
  int n, h, w;
  std::vector<int> channels;
  int input_pad, input_offset;  // each input: stride = c + input_pad, at input_offset
  int out_pad, out_offset;      // out: stride = sum(c) + out_pad, at out_offset
};

const Case kCases[] = {
    {3, 7, 5, {3}, 0, 0, 2, 1},
    {3, 7, 5, {3, 13}, 2, 1, 5, 3},
    {2, 5, 3, {13, 3, 5, 1}, 1, 0, 0, 0},
    {3, 5, 7, {8, 4, 12}, 4, 4, 4, 8},  // every access 16-byte aligned: the 4-wide kernel
    {1, 1, 1, {1, 2}, 0, 0, 0, 0},
};

struct Layout {
  std::vector<Slice> inputs;
  Slice out;
};

Layout layout_of(const Case& k) {
  Layout l;
  int total = 0;
  for (int c : k.channels) {
    l.inputs.push_back({k.n, k.h, k.w, c, c + k.input_pad, k.input_offset});
    total += c;
  }
  l.out = {k.n, k.h, k.w, total, total + k.out_pad + k.out_offset, k.out_offset};
  return l;
}

// Views of each wide buffer.
template <typename T, typename Buffers>
std::vector<NhwcView<T>> views(const std::vector<Slice>& slices, Buffers& buffers) {
  std::vector<NhwcView<T>> v;
  for (size_t i = 0; i < slices.size(); ++i) v.push_back(slices[i].on<T>(buffers[i].data()));
  return v;
}

}  // namespace

TEST_CASE("route: reference backward matches finite differences") {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 2, h = 2, w = 3;
  const std::vector<int> channels = {2, 3, 1};
  const int total = 6;
  std::vector<double> r = to_double(rng.floats(size_t(n) * h * w * total));  // dL/dout
  for (size_t which = 0; which < channels.size(); ++which) {
    CAPTURE(which);
    std::vector<std::vector<double>> ins;
    for (int c : channels) ins.push_back(to_double(rng.floats(size_t(n) * h * w * c)));
    auto loss = [&](const std::vector<double>& x) {
      std::vector<std::vector<double>> current = ins;
      current[which] = x;
      std::vector<NhwcView<const double>> in_views;
      for (size_t i = 0; i < current.size(); ++i) in_views.push_back(nhwc<const double>(current[i].data(), n, h, w, channels[i]));
      std::vector<double> out(r.size());
      route_forward_reference<double>(in_views, nhwc(out.data(), n, h, w, total));
      double sum = 0;
      for (size_t i = 0; i < out.size(); ++i) sum += out[i] * r[i];
      return sum;
    };
    std::vector<double> numeric = numeric_gradient(ins[which], loss);
    std::vector<std::vector<double>> grads;
    std::vector<NhwcView<double>> grad_views;
    for (int c : channels) grads.emplace_back(size_t(n) * h * w * c, 7.0);
    for (size_t i = 0; i < grads.size(); ++i) grad_views.push_back(nhwc(grads[i].data(), n, h, w, channels[i]));
    route_backward_reference<double>(nhwc<const double>(r.data(), n, h, w, total), grad_views, false);
    CHECK_CLOSE(grads[which], numeric, 1e-7, 1e-6);
  }
}

namespace {

// Forward, then backward (plain and accumulating), through the op under test; whole wide
// buffers compared with the reference (slices written, everything else untouched).
template <typename Forward, typename Backward>
void compare_with_reference(Rng& rng, const Forward& forward, const Backward& backward) {
  for (const Case& k : kCases) {
    Layout l = layout_of(k);
    CAPTURE(k.channels.size());
    CAPTURE(l.inputs[0]);
    CAPTURE(l.out);
    std::vector<std::vector<float>> ins;
    for (const Slice& s : l.inputs) ins.push_back(rng.floats(s.size()));
    std::vector<float> out_before = output_buffer(rng, l.out);

    std::vector<std::vector<double>> ins_d;
    for (auto& v : ins) ins_d.push_back(to_double(v));
    std::vector<double> ref_out = to_double(out_before);
    route_forward_reference<double>(views<const double>(l.inputs, ins_d), l.out.on(ref_out.data()));
    CHECK_CLOSE(forward(ins, out_before, l), ref_out, 0.0, 0.0);

    for (bool accumulate : {false, true}) {
      CAPTURE(accumulate);
      std::vector<float> grad_out = rng.floats(l.out.size());
      std::vector<std::vector<float>> grads_before;
      for (const Slice& s : l.inputs) grads_before.push_back(output_buffer(rng, s, accumulate));
      std::vector<double> go_d = to_double(grad_out);
      std::vector<std::vector<double>> ref_grads;
      for (auto& g : grads_before) ref_grads.push_back(to_double(g));
      route_backward_reference<double>(l.out.on<const double>(go_d.data()), views<double>(l.inputs, ref_grads),
                                       accumulate);
      std::vector<std::vector<float>> grads = backward(grad_out, grads_before, l, accumulate);
      for (size_t i = 0; i < grads.size(); ++i) {
        CAPTURE(i);
        CHECK_CLOSE(grads[i], ref_grads[i], 1e-6, 1e-4);
      }
    }
  }
}

}  // namespace

TEST_CASE("route: cpu matches the reference") {
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [](std::vector<std::vector<float>>& ins, std::vector<float> out, const Layout& l) {
        route_forward_cpu(views<const float>(l.inputs, ins), l.out.on(out.data()));
        return out;
      },
      [](const std::vector<float>& grad_out, std::vector<std::vector<float>> grads, const Layout& l, bool accumulate) {
        route_backward_cpu(l.out.on(grad_out.data()), views<float>(l.inputs, grads), accumulate);
        return grads;
      });
}

TEST_CASE("route: cuda matches the reference and repeats bit for bit") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(
      rng,
      [&](std::vector<std::vector<float>>& ins, const std::vector<float>& out_before, const Layout& l) {
        std::vector<DeviceArray<float>> d_ins;
        for (auto& v : ins) d_ins.emplace_back(device, v);
        DeviceArray<float> d_out(device, out_before);
        route_forward_cuda(views<const float>(l.inputs, d_ins), l.out.on(d_out.data()), nullptr);
        return d_out.download();
      },
      [&](const std::vector<float>& grad_out, const std::vector<std::vector<float>>& grads_before, const Layout& l,
          bool accumulate) {
        DeviceArray<float> d_go(device, grad_out);
        std::vector<DeviceArray<float>> d_grads;
        for (auto& g : grads_before) d_grads.emplace_back(device, g);
        std::vector<std::vector<float>> first, second;
        route_backward_cuda(l.out.on<const float>(d_go.data()), views<float>(l.inputs, d_grads), accumulate, nullptr);
        for (size_t i = 0; i < d_grads.size(); ++i) first.push_back(d_grads[i].download()), d_grads[i].upload(grads_before[i]);
        route_backward_cuda(l.out.on<const float>(d_go.data()), views<float>(l.inputs, d_grads), accumulate, nullptr);
        for (auto& d : d_grads) second.push_back(d.download());
        for (size_t i = 0; i < first.size(); ++i) CHECK(same_bits(first[i], second[i]));
        return first;
      });
}

TEST_CASE("route: an input already written into its slice is left as it is") {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 2, h = 3, w = 5, c0 = 5, c1 = 3;
  std::vector<float> wide = rng.floats(size_t(n) * h * w * (c0 + c1)), other = rng.floats(size_t(n) * h * w * c1);
  std::vector<float> expected = wide;
  for (size_t p = 0; p < size_t(n) * h * w; ++p)
    for (int ch = 0; ch < c1; ++ch) expected[p * (c0 + c1) + c0 + ch] = other[p * c1 + ch];
  // Input 0 is the first c0 channels of the output itself: its producer wrote there.
  std::vector<float> cpu = wide;
  route_forward_cpu(std::vector<ConstAct>{nhwc<const float>(cpu.data(), n, h, w, c0, c0 + c1),
                                          nhwc<const float>(other.data(), n, h, w, c1)},
                    nhwc(cpu.data(), n, h, w, c0 + c1));
  CHECK(cpu == expected);
  KERNEL_TEST_DEVICE(device);  // the CPU part above runs in every build
  DeviceArray<float> d_wide(device, wide), d_other(device, other);
  route_forward_cuda(std::vector<ConstAct>{nhwc<const float>(d_wide.data(), n, h, w, c0, c0 + c1),
                                           nhwc<const float>(d_other.data(), n, h, w, c1)},
                     nhwc(d_wide.data(), n, h, w, c0 + c1), nullptr);
  CHECK(d_wide.download() == expected);
}

TEST_CASE("route: bad arguments are reported") {
  std::vector<float> a(64), b(64), out(256);
  ConstAct in4 = nhwc<const float>(a.data(), 1, 2, 2, 4);
  ConstAct in2 = nhwc<const float>(b.data(), 1, 2, 2, 2);
  Act out6 = nhwc(out.data(), 1, 2, 2, 6);
  CHECK_NOTHROW(route_forward_cpu(std::vector<ConstAct>{in4, in2}, out6));
  CHECK_THROWS_WITH_AS(route_forward_cpu(std::vector<ConstAct>{}, out6), doctest::Contains("1 to 4 inputs"), Error);
  CHECK_THROWS_WITH_AS(route_forward_cpu(std::vector<ConstAct>(5, in2), out6), doctest::Contains("got 5"), Error);
  CHECK_THROWS_WITH_AS(route_forward_cpu(std::vector<ConstAct>{in4, in4}, out6), doctest::Contains("8 channels"),
                       Error);
  CHECK_THROWS_WITH_AS(route_forward_cuda(std::vector<ConstAct>{in4, nhwc<const float>(b.data(), 1, 2, 3, 2)}, out6,
                                          nullptr),
                       doctest::Contains("same batch and spatial size"), Error);
  CHECK_THROWS_WITH_AS(route_forward_cuda(std::vector<ConstAct>{in4, nhwc<const float>(nullptr, 1, 2, 2, 2)}, out6,
                                          nullptr),
                       doctest::Contains("inputs[1] is a null pointer"), Error);
  CHECK_THROWS_WITH_AS(route_forward_cpu(std::vector<ConstAct>{in4, in2}, nhwc(out.data(), 1, 2, 2, 6, 5)),
                       doctest::Contains("stride 5 < channels 6"), Error);
  CHECK_THROWS_AS(route_backward_cpu(as_const(out6), std::vector<Act>{nhwc(a.data(), 1, 2, 2, 4)}, false), Error);
  CHECK_THROWS_AS(route_backward_cuda(as_const(out6), std::vector<Act>{nhwc(a.data(), 1, 2, 2, -4), nhwc(b.data(), 1, 2, 2, 2)},
                                      true, nullptr),
                  Error);
  CHECK_THROWS_AS(route_backward_reference<float>(as_const(out6), std::vector<Act>{nhwc(a.data(), 1, 1, 2, 4), nhwc(b.data(), 1, 1, 2, 2)},
                                                  false),
                  Error);
}

namespace {

// 16-bit storage: two inputs (16 and 5 channels: vector and element paths in one call) into a
// wide view of 21 channels inside a buffer of 24, and back (= and +=), against the host's FP32
// results rounded once: bit for bit.
template <typename T>
void check_route_storage(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 2, h = 3, w = 5, c0 = 16, c1 = 5, stride = 24;
  const size_t pixels = size_t(n) * h * w;
  for (bool accumulate : {false, true}) {
    CAPTURE(accumulate);
    const std::vector<T> in0 = random_storage<T>(rng, pixels * c0, -3.0f, 3.0f, true);
    const std::vector<T> in1 = random_storage<T>(rng, pixels * c1, -3.0f, 3.0f, true);
    const std::vector<T> start0 = random_storage<T>(rng, pixels * c0, -1.0f, 1.0f, false);
    const std::vector<T> start1 = random_storage<T>(rng, pixels * c1, -1.0f, 1.0f, false);
    DeviceArray<T> d_in0(device, in0), d_in1(device, in1), d_wide(device, pixels * stride);
    DeviceArray<T> d_g0(device, start0), d_g1(device, start1);
    d_wide.poison();
    const std::vector<NhwcView<const T>> inputs = {nhwc<const T>(d_in0.data(), n, h, w, c0),
                                                   nhwc<const T>(d_in1.data(), n, h, w, c1)};
    const NhwcView<T> wide = nhwc(d_wide.data(), n, h, w, c0 + c1, stride);
    route_forward_cuda(std::span<const NhwcView<const T>>(inputs), wide, nullptr);
    const std::vector<NhwcView<T>> grads = {nhwc(d_g0.data(), n, h, w, c0), nhwc(d_g1.data(), n, h, w, c1)};
    route_backward_cuda(as_const(wide), std::span<const NhwcView<T>>(grads), accumulate, nullptr);
    const std::vector<T> out = d_wide.download(), g0 = d_g0.download(), g1 = d_g1.download();
    std::vector<T> got;
    std::vector<float> want, want0, want1;
    for (size_t p = 0; p < pixels; ++p)
      for (int ch = 0; ch < stride; ++ch) {
        const T v = out[p * stride + ch];
        if (ch >= c0 + c1) {
          CHECK(v.bits == 0xffff);  // past the view: untouched
          continue;
        }
        got.push_back(v);
        want.push_back(to_float(ch < c0 ? in0[p * c0 + ch] : in1[p * c1 + (ch - c0)]));
      }
    for (size_t i = 0; i < g0.size(); ++i) want0.push_back((accumulate ? to_float(start0[i]) : 0.0f) + to_float(in0[i]));
    for (size_t i = 0; i < g1.size(); ++i) want1.push_back((accumulate ? to_float(start1[i]) : 0.0f) + to_float(in1[i]));
    check_rounded_once(got, want, 0, 1.0);
    check_rounded_once(g0, want0, 0, 1.0);
    check_rounded_once(g1, want1, 0, 1.0);
  }
}

}  // namespace

TEST_CASE("route: cuda on bf16 and fp16 tensors: exact copies, FP32 accumulation rounded once") {
  KERNEL_TEST_DEVICE(device);
  check_route_storage<Bf16>(device);
  check_route_storage<Fp16>(device);
}
