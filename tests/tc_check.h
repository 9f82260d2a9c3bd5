// Shared pieces of the tensor-core kernel tests (tests/test_kernel_conv_tc.cpp, _gemm_tc.cpp,
// _conv_normalized.cpp): NHWC buffers of 16-bit or FP32 elements holding one (possibly strided)
// view, inputs rounded to their storage type, the per-element and norm checks against an FP64
// reference, and which family (wgmma or mma.sync) an emulated pass ran on, and whether through
// TMA's im2col loads.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/half_types.h"
#include "kernels/precision.h"
#include "kernels/tma.h"
#include "kernels/tensor.h"
#include "runtime/device.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

namespace yolo::testing {

// Checks, under emulation, that a pass ran on wgmma exactly when the case says it must (counting
// the emulated threads' wgmma ops around it); elsewhere does nothing.
struct WgmmaRan {
#if YOLO_EMULATED_KERNELS
  unsigned long long before = emu::wgmma_ops_run();
  void check(bool expected) const { CHECK((emu::wgmma_ops_run() > before) == expected); }
#else
  void check(bool) const {}
#endif
};

// The same for TMA's im2col loads (kernels/tma.h): whether the scope's kernels ran any.
struct Im2colRan {
#if YOLO_EMULATED_KERNELS
  unsigned long long before = tma::emulated_im2col_loads();
  void check(bool expected) const { CHECK((tma::emulated_im2col_loads() > before) == expected); }
#else
  void check(bool) const {}
#endif
};

template <typename T>
double exact_value(T v) {
  return double(to_float(v));
}

template <typename T>
std::vector<double> exact(const std::vector<T>& values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = exact_value(values[i]);
  return out;
}
// FP32 values (held exactly in double) as TF32 wgmma reads them: the low 13 bits of each word
// dropped (kernels/wgmma.cuh). mma.sync's kernels round to nearest instead (cvt.rna).
inline std::vector<double> tf32_truncated(const std::vector<double>& values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = double(truncate_to_tf32(float(values[i])));
  return out;
}
inline std::vector<double> absolute(std::vector<double> v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// Every bit set: NaN in FP32, BF16 and FP16 (what DeviceArray::poison writes).
template <typename T>
bool poisoned(T v) {
  T p;
  std::memset(&p, 0xff, sizeof p);
  return std::memcmp(&v, &p, sizeof p) == 0;
}

// An NHWC buffer of n*h*w pixels of `stride` elements, the view's c channels at `offset`;
// elements outside the view are poison (a kernel reading them gets NaN; writing them shows).
template <typename T>
struct NhwcBuffer {
  int n = 0, h = 0, w = 0, c = 0, stride = 0, offset = 0;
  std::vector<T> data;

  bool inside(size_t i) const {
    const size_t ch = i % size_t(stride);
    return ch >= size_t(offset) && ch < size_t(offset + c);
  }
  // The view over a device copy of the buffer at `base`.
  NhwcView<T> view(T* base) const { return NhwcView<T>{base + offset, n, h, w, c, stride}; }
  NhwcView<const T> cview(const T* base) const { return NhwcView<const T>{base + offset, n, h, w, c, stride}; }
  size_t dense_count() const { return size_t(n) * h * w * c; }
  template <typename V>
  std::vector<V> elements_of(const std::vector<V>& buffer) const {
    std::vector<V> out;
    out.reserve(dense_count());
    for (size_t i = 0; i < buffer.size(); ++i)
      if (inside(i)) out.push_back(buffer[i]);
    return out;
  }
  std::vector<double> dense_values() const { return exact(elements_of(data)); }
  // Elements outside the view that no longer hold poison.
  size_t gap_writes(const std::vector<T>& buffer) const {
    size_t bad = 0;
    for (size_t i = 0; i < buffer.size(); ++i) bad += !inside(i) && !poisoned(buffer[i]);
    return bad;
  }
};

template <typename T>
NhwcBuffer<T> poisoned_buffer(int n, int h, int w, int c, int stride, int offset) {
  NhwcBuffer<T> b{n, h, w, c, stride ? stride : c, offset, {}};
  b.data.resize(size_t(n) * h * w * b.stride);
  std::memset(b.data.data(), 0xff, b.data.size() * sizeof(T));
  return b;
}
template <typename T>
NhwcBuffer<T> random_buffer(Rng& rng, int n, int h, int w, int c, int stride, int offset) {
  NhwcBuffer<T> b = poisoned_buffer<T>(n, h, w, c, stride, offset);
  for (size_t i = 0; i < b.data.size(); ++i)
    if (b.inside(i)) b.data[i] = from_float<T>(rng.uniform(-1.0f, 1.0f));
  return b;
}

// Unit roundoff of the tensor-core precision with inputs T: TF32 keeps 10 mantissa bits (as
// FP16), BF16 7.
template <typename T>
constexpr double unit_roundoff() {
  return std::is_same_v<T, Bf16> ? 0x1p-8 : 0x1p-11;
}
constexpr double kBoundFactor = 3.0;  // c in the per-element bound (c*u + K*2^-23) * (|A||B|)

// got (as stored in Out) against ref, element by element within the bound on `mag` = (|A||B|),
// and in relative norm. K: the reduction length. In: the inputs' type (the precision).
template <typename Out, typename In = Out>
void check_tc_output(const std::vector<Out>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                     long long k) {
  REQUIRE(got.size() == ref.size());
  const double u = unit_roundoff<In>(), factor = kBoundFactor * u + double(k) * 0x1p-23;
  double diff2 = 0, ref2 = 0;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = exact_value(got[i]), err = std::fabs(g - ref[i]);
    if (!(err <= factor * mag[i])) {
      if (bad++ == 0) first = i;
    }
    diff2 += (g - ref[i]) * (g - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  if (bad) {
    INFO("first bad element " << first << ": got " << exact_value(got[first]) << ", reference " << ref[first]
                              << ", bound " << factor * mag[first]);
    CHECK(bad == 0);
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  const double limit = std::is_same_v<In, float> ? 1e-3 : 1e-2;
  INFO("relative norm " << rel);
  CHECK(rel <= limit);
}

}  // namespace yolo::testing
