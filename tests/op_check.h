// Helpers for op tests (DESIGN.md, testing tiers 1 and 2): central finite differences in
// double, comparisons that report the first bad element with its index, value and the
// reference, and channel slices of wide NHWC buffers (the views ops must handle) with the
// buffers' setup and checks.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/tensor.h"
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

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Bit for bit the same (NaN included): what a repeated launch must give.
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// ---- channel slices ------------------------------------------------------------------------
// A view of channels [offset, offset + c) inside a wide NHWC buffer of `stride` channels per
// pixel (offset + c <= stride), like a route's concatenation; stride = c, offset = 0 is dense.
struct Slice {
  int n, h, w, c, stride, offset;
  size_t pixels() const { return size_t(n) * h * w; }
  size_t size() const { return pixels() * size_t(stride); }  // the wide buffer's elements
  size_t elements() const { return pixels() * size_t(c); }   // the view's elements
  // The view into a wide buffer at base; a null base gives a null view of the same shape.
  template <typename T>
  NhwcView<T> on(T* base) const {
    return nhwc(base ? base + offset : nullptr, n, h, w, c, stride);
  }
};

// For CAPTURE: "NxHxWxC (stride S, offset O)".
inline std::ostream& operator<<(std::ostream& out, const Slice& s) {
  return out << s.n << "x" << s.h << "x" << s.w << "x" << s.c << " (stride " << s.stride << ", offset " << s.offset
             << ")";
}

// `wide` with NaN in the slice's elements: what an op writing the slice must overwrite.
inline std::vector<float> poisoned(std::vector<float> wide, const Slice& s) {
  for (size_t p = 0; p < s.pixels(); ++p)
    for (int ch = 0; ch < s.c; ++ch) wide[p * size_t(s.stride) + size_t(s.offset + ch)] = NAN;
  return wide;
}

// A random wide buffer for an op's output slice: the slice poisoned, unless the op accumulates
// into it (then its random values are what the op adds to).
inline std::vector<float> output_buffer(Rng& rng, const Slice& s, bool accumulate = false) {
  std::vector<float> wide = rng.floats(s.size());
  return accumulate ? wide : poisoned(std::move(wide), s);
}

// The slice's elements of a wide buffer, contiguous (pixel by pixel), as T.
template <typename T>
std::vector<T> gather(const std::vector<float>& wide, const Slice& s) {
  std::vector<T> out;
  out.reserve(s.elements());
  for (size_t p = 0; p < s.pixels(); ++p)
    for (int ch = 0; ch < s.c; ++ch) out.push_back(T(wide[p * size_t(s.stride) + size_t(s.offset + ch)]));
  return out;
}

// The inverse of gather: contiguous values (pixel by pixel) into the slice's elements of wide.
template <typename T>
void scatter(std::vector<float>& wide, const Slice& s, const std::vector<T>& values) {
  for (size_t p = 0; p < s.pixels(); ++p)
    for (int ch = 0; ch < s.c; ++ch)
      wide[p * size_t(s.stride) + size_t(s.offset + ch)] = float(values[p * size_t(s.c) + size_t(ch)]);
}

// Elements of a wide buffer outside the slice that no longer hold the poison pattern of
// DeviceArray::poison (all bits set): what an op wrote where it must not.
inline size_t written_outside(const std::vector<float>& wide, const Slice& s) {
  size_t count = 0;
  for (size_t i = 0; i < wide.size(); ++i) {
    int ch = int(i % size_t(s.stride));
    uint32_t bits;
    std::memcpy(&bits, &wide[i], sizeof bits);
    if ((ch < s.offset || ch >= s.offset + s.c) && bits != 0xFFFFFFFFu) ++count;
  }
  return count;
}

}  // namespace yolo::testing

// CHECK_CLOSE(out, ref, atol, rtol): vectors agree element-wise; prints the first mismatch.
#define CHECK_CLOSE(out, ref, atol, rtol)                                         \
  do {                                                                            \
    std::string mismatch_ = ::yolo::testing::mismatch((out), (ref), (atol), (rtol)); \
    INFO(mismatch_);                                                              \
    CHECK(mismatch_.empty());                                                     \
  } while (0)
