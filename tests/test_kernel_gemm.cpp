// gemm: the reference against a hand-computed product and, through the [connected] layer's
// backward identities, finite differences (double); the fast CPU version and the CUDA kernels
// against the reference on fresh random inputs: every transpose combination, odd sizes, row
// pitches longer than the rows, bias or none, accumulate, every tile shape, split K (empty
// chunks included); identical bits on a second launch; bad arguments and a missing workspace.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/gemm.h"
#include "runtime/check.h"
#include "tests/cpu_isa_fixtures.h"
#include "tests/gemm_case.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }


// C's elements (the gaps past n in each row excluded).
template <typename T>
std::vector<T> c_elements(const GemmCase& c, const std::vector<T>& buffer) {
  std::vector<T> out;
  for (size_t i = 0; i < buffer.size(); ++i)
    if (c.in_c(i)) out.push_back(buffer[i]);
  return out;
}

size_t gap_writes(const GemmCase& c, const std::vector<float>& buffer) {
  size_t bad = 0;
  for (size_t i = 0; i < buffer.size(); ++i) bad += !c.in_c(i) && !std::isnan(buffer[i]);
  return bad;
}

struct GemmData {
  std::vector<float> a, b, bias, c_start;  // c_start: C's initial values (NaN in the gaps; NaN everywhere unless accumulate)
  std::vector<double> expected;           // C's elements
};

GemmData make_data(const GemmCase& c, Rng& rng) {
  GemmData d;
  d.a = rng.floats(c.a_size());
  d.b = rng.floats(c.b_size());
  if (c.bias) d.bias = rng.floats(size_t(c.s.n));
  d.c_start = rng.floats(c.c_size());
  for (size_t i = 0; i < d.c_start.size(); ++i)
    if (!c.accumulate || !c.in_c(i)) d.c_start[i] = kNaN;
  std::vector<double> a = to_double(d.a), b = to_double(d.b), bias = to_double(d.bias), out = to_double(d.c_start);
  gemm_reference<double>(c.s, a.data(), b.data(), c.bias ? bias.data() : nullptr, out.data(), c.accumulate, nullptr, 0);
  d.expected = c_elements(c, out);
  return d;
}

// Transpose combinations x odd sizes x pitches (packed, or a few floats longer), bias, accumulate.
std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  int index = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::tuple{37, 53, 29}, {1, 70, 13}, {65, 3, 1}, {24, 36, 20}}) {
        GemmCase c;
        c.s = GemmShape{m, n, k, ta, tb, 0, 0, 0};
        if (index % 2 == 1) {  // padded rows
          c.s.lda = (ta ? m : k) + 3;
          c.s.ldb = (tb ? k : n) + 1;
          c.s.ldc = n + 5;
        } else if (index % 4 == 2) {  // padded by 4: float4 paths with pitches
          c.s.lda = (ta ? m : k) + 4;
          c.s.ldb = (tb ? k : n) + 4;
          c.s.ldc = n + 4;
        }
        c.bias = index % 3 != 1;
        c.accumulate = index % 2 == 0;
        cases.push_back(c);
        ++index;
      }
  return cases;
}

constexpr double kAtol = 1e-4, kRtol = 1e-4;

std::vector<float> run_cpu(const GemmCase& c, const GemmData& d) {
  std::vector<float> out = d.c_start;
  gemm_cpu(c.s, d.a.data(), d.b.data(), c.bias ? d.bias.data() : nullptr, out.data(), c.accumulate, nullptr, 0);
  return out;
}

std::vector<float> run_cuda(Device device, const GemmCase& c, const GemmData& d) {
  DeviceArray<float> a(device, d.a), b(device, d.b), out(device, d.c_start);
  DeviceArray<float> bias(device, c.bias ? d.bias : std::vector<float>{0.0f});
  const size_t ws = gemm_workspace_bytes(c.s);
  DeviceArray<float> workspace(device, ws / sizeof(float) + 1);
  workspace.poison();  // every partial sum must be written before it is read
  gemm_cuda(c.s, a.data(), b.data(), c.bias ? bias.data() : nullptr, out.data(), c.accumulate,
            ws ? workspace.data() : nullptr, ws, nullptr);
  return out.download();
}

struct ForcedTiling {
  ForcedTiling(int tile, int splits) { set_gemm_tiling_for_tests(tile, splits); }
  ~ForcedTiling() { set_gemm_tiling_for_tests(-1, 0); }
};

}  // namespace

TEST_CASE("gemm: reference on a hand-computed product") {
  // [1 2 3; 4 5 6] * [1 0; 0 1; 1 1] + [10 20] = [14 25; 20 31]
  std::vector<double> a = {1, 2, 3, 4, 5, 6}, b = {1, 0, 0, 1, 1, 1}, bias = {10, 20};
  std::vector<double> out(4, -1.0);
  gemm_reference<double>(GemmShape{2, 2, 3}, a.data(), b.data(), bias.data(), out.data(), false, nullptr, 0);
  CHECK(out == std::vector<double>{14, 25, 20, 31});
  // The same with A and B stored transposed, accumulated onto the result: doubles it.
  std::vector<double> at = {1, 4, 2, 5, 3, 6}, bt = {1, 0, 1, 0, 1, 1};
  gemm_reference<double>(GemmShape{2, 2, 3, true, true}, at.data(), bt.data(), bias.data(), out.data(), true, nullptr,
                         0);
  CHECK(out == std::vector<double>{28, 50, 40, 62});
}

TEST_CASE("gemm: connected-layer gradients from the reference match finite differences") {
  // out = in * W^T + b (in: batch x fan_in, W: fan_out x fan_in); loss = sum(out * probe).
  // d in = probe * W, dW = probe^T * in, db = column sums of probe.
  Rng rng;
  CAPTURE(rng.seed());
  const int batch = 3, fan_in = 5, fan_out = 4;
  std::vector<double> in = to_double(rng.floats(batch * fan_in)), w = to_double(rng.floats(fan_out * fan_in));
  std::vector<double> b = to_double(rng.floats(fan_out)), probe = to_double(rng.floats(batch * fan_out));
  auto loss = [&](const std::vector<double>& iv, const std::vector<double>& wv, const std::vector<double>& bv) {
    std::vector<double> out(batch * fan_out);
    gemm_reference<double>(GemmShape{batch, fan_out, fan_in, false, true}, iv.data(), wv.data(), bv.data(), out.data(),
                           false, nullptr, 0);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += out[i] * probe[i];
    return sum;
  };
  std::vector<double> num_in = numeric_gradient(in, [&](const std::vector<double>& v) { return loss(v, w, b); });
  std::vector<double> num_w = numeric_gradient(w, [&](const std::vector<double>& v) { return loss(in, v, b); });
  std::vector<double> num_b = numeric_gradient(b, [&](const std::vector<double>& v) { return loss(in, w, v); });

  std::vector<double> d_in(in.size()), d_w(w.size(), 0.0), ones(batch, 1.0), d_b(fan_out);
  gemm_reference<double>(GemmShape{batch, fan_in, fan_out}, probe.data(), w.data(), nullptr, d_in.data(), false,
                         nullptr, 0);
  gemm_reference<double>(GemmShape{fan_out, fan_in, batch, true, false}, probe.data(), in.data(), nullptr, d_w.data(),
                         false, nullptr, 0);
  gemm_reference<double>(GemmShape{1, fan_out, batch}, ones.data(), probe.data(), nullptr, d_b.data(), false, nullptr,
                         0);
  CHECK_CLOSE(d_in, num_in, 1e-6, 1e-6);
  CHECK_CLOSE(d_w, num_w, 1e-6, 1e-6);
  CHECK_CLOSE(d_b, num_b, 1e-6, 1e-6);
}

TEST_CASE("gemm: cpu matches the reference, in every micro-kernel variant this CPU runs") {
  Rng rng;
  CAPTURE(rng.seed());
  for (CpuIsa isa : cpu_isas_here()) {
    const std::string isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    UseCpuIsa use(isa, CpuKernel::Gemm);
    uint64_t calls = 0;
    for (const GemmCase& c : gemm_cases()) {
      CAPTURE(c.describe());
      const GemmData d = make_data(c, rng);
      const std::vector<float> out = run_cpu(c, d);
      CHECK_CLOSE(c_elements(c, out), d.expected, kAtol, kRtol);
      CHECK(gap_writes(c, out) == 0);
      calls += c.s.m > 0 && c.s.n > 0;  // empty products return before the kernels
    }
    // Cases big enough for the blocking: several row and column blocks of the pool; then groups
    // of at most 128 columns and about 128 rows with the depth in slices of at most 256, the sums
    // carried from slice to slice: k = 517 is 3 slices, m = 293 and n = 203 several groups ending
    // in partial blocks and panels, in each layout, with pitches.
    std::vector<GemmCase> blocked{GemmCase{GemmShape{67, 600, 40, true, true}, true, true}};
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        blocked.push_back(
            GemmCase{GemmShape{293, 203, 517, ta, tb, (ta ? 293 : 517) + 3, (tb ? 517 : 203) + 1, 203 + 5}, ta, !tb});
    for (const GemmCase& c : blocked) {
      CAPTURE(c.describe());
      const GemmData d = make_data(c, rng);
      const std::vector<float> out = run_cpu(c, d);
      CHECK_CLOSE(c_elements(c, out), d.expected, c.s.k > 256 ? kAtol * 10 : kAtol, kRtol);  // longer sums
      CHECK(gap_writes(c, out) == 0);
    }
    CHECK(use.runs() == calls + blocked.size());  // the variant asked for is the one that ran
  }
}

TEST_CASE("gemm: k = 0 leaves bias (or C + bias)") {
  std::vector<float> bias = {1, 2, 3}, c = {5, 5, 5, 5, 5, 5};
  gemm_cpu(GemmShape{2, 3, 0}, nullptr, nullptr, bias.data(), c.data(), true, nullptr, 0);
  CHECK(c == std::vector<float>{6, 7, 8, 6, 7, 8});
  gemm_cpu(GemmShape{2, 3, 0}, nullptr, nullptr, nullptr, c.data(), false, nullptr, 0);
  CHECK(c == std::vector<float>(6, 0.0f));
}

TEST_CASE("gemm: cuda matches the reference with every tile shape and split, twice with the same bits") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<GemmCase> cases = gemm_cases();
  cases.push_back(GemmCase{GemmShape{130, 133, 21, false, true}, true, false});  // several tiles each way
  cases.push_back(GemmCase{GemmShape{132, 136, 24, true, false, 0, 0, 0}, false, true});
  cases.push_back(GemmCase{GemmShape{5, 7, 0}, true, true});  // k = 0
  // Automatic, then a forced tile, then that tile with K split 2 or 3 ways (with empty chunks
  // where K has fewer stages than that: k = 1, 13 and 29 have 1, 2 and 4).
  int index = 0;
  for (const GemmCase& c : cases) {
    for (auto [tile, splits] : {std::pair{-1, 0}, {index % 4, 1}, {index % 4, 2 + index % 2}}) {
      CAPTURE(c.describe());
      CAPTURE(tile);
      CAPTURE(splits);
      ForcedTiling forced(tile, splits);
      const GemmData d = make_data(c, rng);
      const std::vector<float> out = run_cuda(device, c, d);
      CHECK_CLOSE(c_elements(c, out), d.expected, kAtol, kRtol);
      CHECK(gap_writes(c, out) == 0);
      const std::vector<float> again = run_cuda(device, c, d);
      CHECK(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)) == 0);
    }
    ++index;
  }
}

TEST_CASE("gemm: bad arguments throw") {
  std::vector<float> a(12), b(12), c(12);
  CHECK_THROWS_AS(gemm_cpu(GemmShape{-1, 2, 2}, a.data(), b.data(), nullptr, c.data(), false, nullptr, 0), Error);
  CHECK_THROWS_AS(
      gemm_cpu(GemmShape{2, 3, 4, false, false, 3}, a.data(), b.data(), nullptr, c.data(), false, nullptr, 0), Error);
  CHECK_THROWS_AS(
      gemm_cpu(GemmShape{2, 3, 4, false, false, 0, 2}, a.data(), b.data(), nullptr, c.data(), false, nullptr, 0),
      Error);
  CHECK_THROWS_AS(
      gemm_cpu(GemmShape{2, 3, 4, false, false, 0, 0, 2}, a.data(), b.data(), nullptr, c.data(), false, nullptr, 0),
      Error);
  CHECK_THROWS_AS(gemm_cpu(GemmShape{2, 3, 4}, nullptr, b.data(), nullptr, c.data(), false, nullptr, 0), Error);
  CHECK_THROWS_AS(gemm_reference<float>(GemmShape{2, 3, 4}, a.data(), b.data(), nullptr, nullptr, false, nullptr, 0),
                  Error);
  CHECK_THROWS_AS(set_gemm_tiling_for_tests(4, 0), Error);
  std::string why;
  if (kernel_device(&why)) {
    CHECK_THROWS_AS(gemm_cuda(GemmShape{2, 3, 4, true, false, 1}, a.data(), b.data(), nullptr, c.data(), false,
                              nullptr, 0, nullptr),
                    Error);
    ForcedTiling forced(0, 2);  // a split needs a workspace
    REQUIRE(gemm_workspace_bytes(GemmShape{2, 3, 4}) > 0);
    CHECK_THROWS_WITH_AS(
        gemm_cuda(GemmShape{2, 3, 4}, a.data(), b.data(), nullptr, c.data(), false, nullptr, 0, nullptr),
        doctest::Contains("workspace"), Error);
  }
}
