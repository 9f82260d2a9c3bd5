// Storage conversions: the CUDA kernel against the reference (half_types.h's roundings, tested
// against hand-computed cases in test_kernel_mma.cpp) bit for bit, on odd counts with Inf, NaN,
// zeros, subnormals and values beyond FP16's range; outputs poisoned first.
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "kernels/convert.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

std::vector<float> values_to_convert(Rng& rng, size_t n) {
  std::vector<float> v = rng.floats(n, -70000.0f, 70000.0f);  // beyond FP16's 65504: Inf there
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            0.0f,
                            -0.0f,
                            3e-6f,
                            -1e-39f,
                            1.0f + 0x1p-9f};
  for (size_t i = 0; i < n; i += 7) v[i] = specials[(i / 7) % 8];
  for (size_t i = 3; i < n; i += 5) v[i] = rng.uniform(-2.0f, 2.0f);
  return v;
}

template <typename T>
void check_round_trip(Device device) {
  Rng rng;
  CAPTURE(rng.seed());
  for (size_t n : {size_t(1), size_t(1001), size_t(70001)}) {
    CAPTURE(n);
    const std::vector<float> values = values_to_convert(rng, n);
    std::vector<T> want(n);
    convert_reference<float, T>(values.data(), want.data(), n);
    DeviceArray<float> d_values(device, values), d_back(device, n);
    DeviceArray<T> d_narrow(device, n);
    d_narrow.poison(), d_back.poison();
    convert_cuda<float, T>(d_values.data(), d_narrow.data(), n, nullptr);
    const std::vector<T> narrow = d_narrow.download();
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += narrow[i].bits != want[i].bits;
    CHECK(differ == 0);
    convert_cuda<T, float>(d_narrow.data(), d_back.data(), n, nullptr);
    std::vector<float> back_want(n);
    convert_reference<T, float>(want.data(), back_want.data(), n);
    CHECK(same_bits(d_back.download(), back_want));
    // The reference is the rounding of half_types.h, element by element.
    for (size_t i = 0; i < n; ++i)
      if (ulp_distance(want[i], from_float<T>(values[i])) != 0) {
        CHECK(ulp_distance(want[i], from_float<T>(values[i])) == 0);
        break;
      }
  }
}

}  // namespace

TEST_CASE("convert: cuda float <-> bf16/fp16 matches the reference bit for bit") {
  KERNEL_TEST_DEVICE(device);
  check_round_trip<Bf16>(device);
  check_round_trip<Fp16>(device);
}

TEST_CASE("convert: null arrays are reported") {
  auto convert_null = [] { convert_reference<float, Bf16>(nullptr, nullptr, 3); };
  CHECK_THROWS_WITH_AS(convert_null(), doctest::Contains("null array"), yolo::Error);
}
