// Shared pieces of the 16-bit storage tests of elementwise ops (--precision bf16/fp16 keeps
// activations in Bf16/Fp16 and computes in FP32): random tensors stored in T with special values
// among them, distances in units in the last place of T, and the "FP32 result rounded once"
// check.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/half_types.h"
#include "tests/test_support.h"

namespace yolo::testing {

// n values uniform in [lo, hi] stored in T; with `specials`, every 37th is one of +-Inf, NaN,
// +-0 or a tiny value (subnormal in FP16), so propagation is tested too.
template <typename T>
std::vector<T> random_storage(Rng& rng, size_t n, float lo, float hi, bool specials) {
  const float inf = std::numeric_limits<float>::infinity();
  const float special[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 3e-6f, -1e-39f};
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from_float<T>(specials && i % 37 == 5 ? special[(i / 37) % 7] : rng.uniform(lo, hi));
  return v;
}

// The floats as stored in T (rounded to nearest even for 16-bit types).
template <typename T>
std::vector<T> stored(const std::vector<float>& values) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = from_float<T>(values[i]);
  return out;
}

template <typename T>
std::vector<float> widened(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

// Distance of a and b in units in the last place of T: 0 when equal (both NaN counts as equal;
// +0 and -0 too), a large number when one is NaN and the other not.
template <typename T>
int64_t ulp_distance(T a, T b) {
  const float fa = to_float(a), fb = to_float(b);
  if (std::isnan(fa) || std::isnan(fb)) return std::isnan(fa) && std::isnan(fb) ? 0 : 1 << 30;
  auto ordered = [](T v) {
    const int64_t bits = v.bits & 0x7fff;
    return (v.bits & 0x8000) ? -bits : bits;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// got against the FP32 results rounded once to T: every element within max_ulp, and at least
// min_exact of them bit for bit (a wrong rounding mode misses about half).
template <typename T>
void check_rounded_once(const std::vector<T>& got, const std::vector<float>& fp32, int64_t max_ulp,
                        double min_exact) {
  REQUIRE(got.size() == fp32.size());
  size_t exact = 0, bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t d = ulp_distance(got[i], from_float<T>(fp32[i]));
    exact += d == 0;
    if (d > max_ulp && bad++ == 0) first = i;
  }
  if (bad) {
    INFO("first bad element " << first << ": got " << to_float(got[first]) << ", FP32 result " << fp32[first]
                              << " rounded " << to_float(from_float<T>(fp32[first])));
    CHECK(bad == 0);
  }
  // Below 100%, one element more may miss (small tensors on a GPU: one expf off by an ulp).
  const double allowed_misses = std::floor((1.0 - min_exact) * double(got.size())) + (min_exact < 1.0 ? 1.0 : 0.0);
  INFO("exact " << exact << " of " << got.size());
  CHECK(double(got.size() - exact) <= allowed_misses);
}

}  // namespace yolo::testing
