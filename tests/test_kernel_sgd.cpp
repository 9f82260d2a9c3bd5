// The optimizer step and gradient helpers: a hand-computed step, several steps of the fast CPU
// version and the CUDA kernel against a double-precision reference (segments with and without
// decay, empty segments, a bucket inside a larger buffer), determinism, segment-table checks,
// the non-finite flag (one NaN or Inf anywhere, including unaligned heads and tails), and the
// in-place scale.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/sgd.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// Random back-to-back segments covering [begin, end), some empty, decay flags mixed.
std::vector<SgdSegment> random_segments(Rng& rng, size_t begin, size_t end) {
  std::vector<SgdSegment> segments;
  for (size_t next = begin; next < end;) {
    size_t count = std::min(end - next, size_t(rng.integer(0, 2) == 0 ? rng.integer(0, 3) : rng.integer(1, 900)));
    segments.push_back({next, count, rng.integer(0, 1) == 1});
    next += count;
  }
  return segments;
}

const SgdHyper kHyper{0.01f, 0.9f, 0.0005f, 1.0f / 64};

// `steps` updates of [begin, end) inside buffers of `total` elements through `update`, which
// gets (w, g, u) and returns them; compared with the double reference after every step.
template <typename Update>
void compare_with_reference(Rng& rng, const Update& update) {
  for (auto [total, begin, end] : {std::tuple<size_t, size_t, size_t>{5003, 17, 4999}, {70, 0, 70}, {9, 3, 4}}) {
    CAPTURE(total);
    CAPTURE(begin);
    CAPTURE(end);
    std::vector<SgdSegment> segments = random_segments(rng, begin, end);
    std::vector<float> w = rng.floats(total), u = rng.floats(total, -0.1f, 0.1f);
    std::vector<double> w_ref = to_double(w), u_ref = to_double(u);
    for (int step = 0; step < 4; ++step) {
      CAPTURE(step);
      std::vector<float> g = rng.floats(total, -20.0f, 20.0f);
      std::vector<double> g_ref = to_double(g);
      sgd_update_reference<double>(w_ref.data(), g_ref.data(), u_ref.data(), segments.data(), int(segments.size()),
                                   begin, end, kHyper);
      update(w, g, u, segments, begin, end);
      CHECK_CLOSE(w, w_ref, 1e-6, 1e-4);
      CHECK_CLOSE(u, u_ref, 1e-6, 1e-4);
    }
  }
}

}  // namespace

TEST_CASE("sgd: a hand-computed step") {
  std::vector<double> w = {1.0, 2.0}, g = {4.0, 8.0}, u = {0.5, 0.5};
  std::vector<SgdSegment> segments = {{0, 1, true}, {1, 1, false}};
  sgd_update_reference<double>(w.data(), g.data(), u.data(), segments.data(), 2, 0, 2, SgdHyper{0.1f, 0.5f, 0.25f, 0.5f});
  // u0 = 0.5*0.5 + 4*0.5 + 0.25*1 = 2.5, w0 = 1 - 0.1*2.5; u1 = 0.25 + 4 = 4.25, w1 = 2 - 0.425
  CHECK(u[0] == doctest::Approx(2.5));
  CHECK(w[0] == doctest::Approx(0.75));
  CHECK(u[1] == doctest::Approx(4.25));
  CHECK(w[1] == doctest::Approx(1.575));
}

TEST_CASE("sgd: cpu matches the double reference over several steps") {
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(rng, [](std::vector<float>& w, const std::vector<float>& g, std::vector<float>& u,
                                 const std::vector<SgdSegment>& segments, size_t begin, size_t end) {
    std::vector<float> w0 = w, u0 = u;
    sgd_update_cpu(w.data(), g.data(), u.data(), segments.data(), int(segments.size()), begin, end, kHyper);
    for (size_t i = 0; i < w.size(); ++i)
      if (i < begin || i >= end) CHECK((w[i] == w0[i] && u[i] == u0[i]));  // outside the bucket: untouched
  });
}

TEST_CASE("sgd: cuda matches the double reference over several steps, bit for bit on repeat") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  compare_with_reference(rng, [&](std::vector<float>& w, const std::vector<float>& g, std::vector<float>& u,
                                  const std::vector<SgdSegment>& segments, size_t begin, size_t end) {
    DeviceArray<float> d_w(device, w), d_g(device, g), d_u(device, u);
    DeviceArray<SgdSegment> d_segments(device, segments);
    auto run = [&] {
      sgd_update_cuda(d_w.data(), d_g.data(), d_u.data(), d_segments.data(), int(segments.size()), begin, end, kHyper,
                      nullptr);
    };
    run();
    std::vector<float> w1 = d_w.download(), u1 = d_u.download();
    d_w.upload(w);
    d_u.upload(u);
    run();
    CHECK(same_bits(w1, d_w.download()));
    CHECK(same_bits(u1, d_u.download()));
    for (size_t i = 0; i < w.size(); ++i)
      if (i < begin || i >= end) CHECK((w1[i] == w[i] && u1[i] == u[i]));  // outside the bucket: untouched
    w = w1;
    u = u1;
  });
}

TEST_CASE("sgd: segment tables that do not cover the bucket are reported") {
  std::vector<float> w(100), g(100), u(100);
  auto update = [&](std::vector<SgdSegment> segments, size_t begin, size_t end) {
    sgd_update_cpu(w.data(), g.data(), u.data(), segments.data(), int(segments.size()), begin, end, kHyper);
  };
  CHECK_NOTHROW(update({{10, 5, true}, {15, 0, false}, {15, 5, false}}, 10, 20));
  CHECK_THROWS_WITH_AS(update({{10, 5, true}, {16, 4, false}}, 10, 20), doctest::Contains("segment 1 starts at 16"),
                       Error);
  CHECK_THROWS_WITH_AS(update({{10, 5, true}, {14, 6, false}}, 10, 20), doctest::Contains("expected 15"), Error);
  CHECK_THROWS_WITH_AS(update({{10, 5, true}}, 10, 20), doctest::Contains("end at 15"), Error);
  CHECK_THROWS_WITH_AS(update({{11, 9, true}}, 10, 20), doctest::Contains("segment 0"), Error);
  CHECK_THROWS_AS(update({}, 10, 20), Error);
  CHECK_THROWS_AS(update({{10, 5, true}}, 20, 10), Error);
  CHECK_NOTHROW(update({}, 30, 30));
  std::vector<SgdSegment> one = {{0, 5, true}};
  CHECK_THROWS_AS(sgd_update_cpu(nullptr, g.data(), u.data(), one.data(), 1, 0, 5, kHyper), Error);
  CHECK_THROWS_AS(sgd_update_cuda(w.data(), g.data(), u.data(), nullptr, 1, 0, 5, kHyper, nullptr), Error);
  CHECK_THROWS_AS(sgd_update_cuda(w.data(), nullptr, u.data(), one.data(), 1, 0, 5, kHyper, nullptr), Error);
}

namespace {

// Runs check(g, count, flag) on `count` floats starting `shift` into a buffer, with the value at
// `bad` (if any) replaced; returns the flag.
template <typename Check>
int flag_after(const Check& check, std::vector<float> data, size_t shift, size_t count, long bad, float value,
               int flag_before = 0) {
  if (bad >= 0) data[shift + size_t(bad)] = value;
  return check(data, shift, count, flag_before);
}

template <typename Check>
void nonfinite_cases(Rng& rng, const Check& check) {
  const float values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
  for (size_t shift : {0, 1, 2, 3})
    for (size_t count : {1, 3, 5, 8, 11, 4099}) {
      CAPTURE(shift);
      CAPTURE(count);
      std::vector<float> data = rng.floats(shift + count + 4, -1e30f, 1e30f);  // big, but finite
      CHECK(flag_after(check, data, shift, count, -1, 0) == 0);
      CHECK(flag_after(check, data, shift, count, -1, 0, 1) == 1);  // never cleared
      // Every position for short spans (heads and tails), random ones for long.
      for (int trial = 0; trial < 6; ++trial) {
        long position = count <= 11 ? long(trial) % long(count) : rng.integer(0, int(count) - 1);
        if (trial == 4) position = 0;
        if (trial == 5) position = long(count) - 1;
        float value = values[size_t(trial) % 4];
        CAPTURE(position);
        CAPTURE(value);
        CHECK(flag_after(check, data, shift, count, position, value) == 1);
      }
      // Bad values just outside the span are not looked at.
      std::vector<float> outside = data;
      outside[shift + count] = values[0];
      if (shift > 0) outside[shift - 1] = values[1];
      CHECK(check(outside, shift, count, 0) == 0);
    }
}

}  // namespace

TEST_CASE("sgd: the non-finite check (cpu and reference)") {
  Rng rng;
  CAPTURE(rng.seed());
  nonfinite_cases(rng, [](const std::vector<float>& data, size_t shift, size_t count, int flag) {
    int reference_flag = flag;
    grad_nonfinite_check_reference<float>(data.data() + shift, count, &reference_flag);
    grad_nonfinite_check_cpu(data.data() + shift, count, &flag);
    CHECK(flag == reference_flag);
    return flag;
  });
  int flag = 0;
  CHECK_THROWS_AS(grad_nonfinite_check_cpu(nullptr, 4, &flag), Error);
  CHECK_THROWS_AS(grad_nonfinite_check_cuda(nullptr, 4, &flag, nullptr), Error);
  std::vector<float> g(4);
  CHECK_THROWS_AS(grad_nonfinite_check_cpu(g.data(), 4, nullptr), Error);
}

TEST_CASE("sgd: the non-finite check (cuda)") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  nonfinite_cases(rng, [&](const std::vector<float>& data, size_t shift, size_t count, int flag) {
    DeviceArray<float> d_data(device, data);
    DeviceArray<int> d_flag(device, std::vector<int>{flag});
    grad_nonfinite_check_cuda(d_data.data() + shift, count, d_flag.data(), nullptr);
    return d_flag.download()[0];
  });
}

TEST_CASE("sgd: scaling gradients in place") {
  Rng rng;
  CAPTURE(rng.seed());
  for (size_t shift : {0, 1, 2, 3})
    for (size_t count : {0, 1, 3, 6, 4097}) {
      CAPTURE(shift);
      CAPTURE(count);
      std::vector<float> data = rng.floats(shift + count + 3);
      std::vector<double> expected = to_double(data);
      grad_scale_inplace_reference<double>(expected.data() + shift, count, double(0.37f));
      std::vector<float> cpu = data;
      grad_scale_inplace_cpu(cpu.data() + shift, count, 0.37f);
      CHECK_CLOSE(cpu, expected, 0.0, 1e-6);  // outside the span: untouched
      std::string why;
      if (auto device = kernel_device(&why)) {
        DeviceArray<float> d_data(*device, data);
        grad_scale_inplace_cuda(d_data.data() + shift, count, 0.37f, nullptr);
        CHECK_CLOSE(d_data.download(), expected, 0.0, 1e-6);
      }
    }
  CHECK_THROWS_AS(grad_scale_inplace_cpu(nullptr, 3, 2.0f), Error);
  CHECK_NOTHROW(grad_scale_inplace_cuda(nullptr, 0, 2.0f, nullptr));
}

namespace {

// The update with a 16-bit weight copy: w and u bit for bit as without it; the copy holds the
// updated w rounded once to H on copy16 segments and is untouched (poisoned) elsewhere.
template <typename H>
void check_copy16(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  const size_t total = 3001, begin = 5, end = 2990;
  std::vector<SgdSegment> segments = random_segments(rng, begin, end);
  for (SgdSegment& s : segments) s.copy16 = rng.integer(0, 1) == 1;
  // At least one non-empty copy16 segment (a seed once drew none): the longest.
  std::max_element(segments.begin(), segments.end(), [](const SgdSegment& a, const SgdSegment& b) {
    return a.count < b.count;
  })->copy16 = true;
  const std::vector<float> w = rng.floats(total), u = rng.floats(total, -0.1f, 0.1f), g = rng.floats(total, -20.0f, 20.0f);
  DeviceArray<SgdSegment> d_segments(device, segments);
  DeviceArray<float> d_w(device, w), d_u(device, u), d_g(device, g), d_w2(device, w), d_u2(device, u);
  DeviceArray<H> d_copy(device, total);
  d_copy.poison();
  sgd_update_cuda(d_w.data(), d_g.data(), d_u.data(), d_segments.data(), int(segments.size()), begin, end, kHyper,
                  d_copy.data(), nullptr);
  sgd_update_cuda(d_w2.data(), d_g.data(), d_u2.data(), d_segments.data(), int(segments.size()), begin, end, kHyper,
                  nullptr);
  const std::vector<float> w_after = d_w.download();
  CHECK(w_after == d_w2.download());
  CHECK(d_u.download() == d_u2.download());
  const std::vector<H> copy = d_copy.download();
  size_t wrong = 0, copied = 0;
  for (size_t i = 0; i < total; ++i) {
    bool in_copy16 = false;
    for (const SgdSegment& s : segments) in_copy16 = in_copy16 || (s.copy16 && i >= s.offset && i < s.offset + s.count);
    const uint16_t want = in_copy16 ? from_float<H>(w_after[i]).bits : uint16_t(0xffff);
    wrong += copy[i].bits != want;
    copied += in_copy16;
  }
  CHECK(copied > 0);
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("sgd: cuda with a bf16 or fp16 weight copy writes it in the same pass, on copy16 segments only") {
  KERNEL_TEST_DEVICE(device);
  check_copy16<Bf16>(device);
  check_copy16<Fp16>(device);
  DeviceArray<float> w(device, 8), g(device, 8), u(device, 8);
  std::vector<SgdSegment> one = {{0, 8, true, true}};
  DeviceArray<SgdSegment> d_one(device, one);
  CHECK_THROWS_WITH_AS(sgd_update_cuda(w.data(), g.data(), u.data(), d_one.data(), 1, 0, 8, kHyper,
                                       static_cast<Bf16*>(nullptr), nullptr),
                       doctest::Contains("the bf16 weight copy is a null pointer"), Error);
}

// The per-step values read from memory (SgdLive): the update equals the one with the same values
// by value, bit for bit; with the non-finite flag set it changes nothing (w, u, the 16-bit copy).
namespace {

template <typename Run>
void check_live(Rng& rng, Device device, Run run) {
  const size_t n = 3001;
  std::vector<SgdSegment> segments = random_segments(rng, 0, n);
  for (SgdSegment& s : segments) s.copy16 = s.decay;
  const std::vector<float> w0 = rng.floats(n), u0 = rng.floats(n, -0.1f, 0.1f), g = rng.floats(n, -20.0f, 20.0f);
  DeviceArray<SgdSegment> d_segments(device, segments);
  DeviceArray<float> d_g(device, g);
  auto update = [&](SgdHyper hyper, const SgdLive* live) {
    DeviceArray<float> w(device, w0), u(device, u0);
    DeviceArray<Bf16> copy(device, n);
    copy.poison();
    hyper.live = live;
    run(w.data(), d_g.data(), u.data(), d_segments.data(), int(segments.size()), n, hyper, copy.data());
    return std::make_tuple(w.download(), u.download(), copy.download());
  };
  const SgdHyper by_value{0.02f, 0.9f, 0.0005f, 1.0f / 48};
  const auto [w_want, u_want, copy_want] = update(by_value, nullptr);
  DeviceArray<SgdLive> live(device, std::vector<SgdLive>{SgdLive{0.02f, 1.0f / 48, 0}});
  // Other values by value, which the live ones must override.
  const auto [w_live, u_live, copy_live] = update(SgdHyper{7.0f, 0.9f, 0.0005f, 3.0f}, live.data());
  CHECK(same_bits(w_live, w_want));
  CHECK(same_bits(u_live, u_want));
  size_t copy_differs = 0;
  for (size_t i = 0; i < n; ++i) copy_differs += copy_live[i].bits != copy_want[i].bits;
  CHECK(copy_differs == 0);
  CHECK(w_live != w0);
  // fp16's loss scale kept in memory (a power of two, drawn afresh): the update divides the live
  // gradient scale by it, the same bits as the quotient given by value.
  const float scale = std::ldexp(1.0f, rng.integer(1, 24) * (rng.integer(0, 1) ? 1 : -1));  // not 1
  CAPTURE(scale);
  DeviceArray<float> loss_scale(device, std::vector<float>{scale});
  SgdHyper scaled = by_value;
  scaled.loss_scale = loss_scale.data();
  const auto [w_scaled, u_scaled, copy_scaled] = update(scaled, live.data());
  SgdHyper divided = by_value;
  divided.grad_scale = (1.0f / 48) / scale;
  const auto [w_divided, u_divided, copy_divided] = update(divided, nullptr);
  CHECK(same_bits(w_scaled, w_divided));
  CHECK(same_bits(u_scaled, u_divided));
  CHECK_FALSE(same_bits(u_scaled, u_want));
  live.upload({SgdLive{0.02f, 1.0f / 48, 1}});
  const auto [w_skip, u_skip, copy_skip] = update(by_value, live.data());
  CHECK(same_bits(w_skip, w0));
  CHECK(same_bits(u_skip, u0));
  size_t copy_written = 0;
  for (const Bf16& c : copy_skip) copy_written += c.bits != 0xffff;
  CHECK(copy_written == 0);
}

}  // namespace

TEST_CASE("sgd: step values read from memory (SgdLive) equal them by value; the non-finite flag skips (cpu, cuda)") {
  Rng rng;
  CAPTURE(rng.seed());
  check_live(rng, Device::cpu(),
             [](float* w, const float* g, float* u, const SgdSegment* segments, int count, size_t n, SgdHyper hyper,
                Bf16*) { sgd_update_cpu(w, g, u, segments, count, 0, n, hyper); });
  std::string why;
  if (auto device = kernel_device(&why))
    check_live(rng, *device,
               [](float* w, const float* g, float* u, const SgdSegment* segments, int count, size_t n, SgdHyper hyper,
                  Bf16* copy) { sgd_update_cuda(w, g, u, segments, count, 0, n, hyper, copy, nullptr); });
}
