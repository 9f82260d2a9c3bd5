// Helpers for op tests (DESIGN.md, testing tiers 1 and 2): central finite differences in
// double, and comparisons that report the first bad element with its index, value and the
// reference.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace yolo::testing {

// d loss / d x[i] by central differences: (L(x + h e_i) - L(x - h e_i)) / 2h, in double.
inline std::vector<double> numeric_gradient(std::vector<double> x, const std::function<double(const std::vector<double>&)>& loss,
                                            double h = 1e-6) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double up = loss(x);
    x[i] = saved - h;
    double down = loss(x);
    x[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

// "" when every element satisfies |out - ref| <= atol + rtol*|ref| (NaN never does), else a
// description of the first that does not and how many fail.
template <typename Out, typename Ref>
std::string mismatch(const std::vector<Out>& out, const std::vector<Ref>& ref, double atol, double rtol) {
  if (out.size() != ref.size())
    return "size " + std::to_string(out.size()) + " != reference size " + std::to_string(ref.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < out.size(); ++i)
    if (!close(double(out[i]), double(ref[i]), atol, rtol)) {
      if (bad++ == 0) first = i;
    }
  if (bad == 0) return "";
  return std::to_string(bad) + " of " + std::to_string(out.size()) + " elements differ; first at [" +
         std::to_string(first) + "]: got " + std::to_string(double(out[first])) + ", reference " +
         std::to_string(double(ref[first]));
}

}  // namespace yolo::testing

// CHECK_CLOSE(out, ref, atol, rtol): vectors agree element-wise; prints the first mismatch.
#define CHECK_CLOSE(out, ref, atol, rtol)                                         \
  do {                                                                            \
    std::string mismatch_ = ::yolo::testing::mismatch((out), (ref), (atol), (rtol)); \
    INFO(mismatch_);                                                              \
    CHECK(mismatch_.empty());                                                     \
  } while (0)
