// Views of the buffers ops read and write, shared by every op family, the host-side checks of
// views that every op's entry points run, plus the stream type launchers take (cudaStream_t; an
// opaque stand-in in builds without CUDA, where launchers run the kernels emulated). Activations
// are NHWC; a view may be a channel slice of a wider buffer (a route's concatenation), which is
// why it carries its own pixel stride.
#pragma once
#include <climits>
#include <cstddef>
#include <string>

#include "runtime/check.h"

#if YOLO_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif

// Marks a function callable from host and device code: __host__ __device__ under nvcc, nothing
// for the host compiler (plain C++, and the emulation, where device code is host code).
#if defined(__CUDACC__)
#define YOLO_HOST_DEVICE __host__ __device__
#else
#define YOLO_HOST_DEVICE
#endif


namespace yolo {

// Element (b, y, x, ch) is at data[((b*h + y)*w + x)*stride + ch]; stride >= c. A channel slice
// of a wider buffer: data points at the slice's first channel, stride is the wider count.
template <typename T>
struct NhwcView {
  T* data = nullptr;
  int n = 0, h = 0, w = 0, c = 0;
  int stride = 0;

  // Usable on host and device, like at().
  YOLO_HOST_DEVICE size_t pixels() const { return size_t(n) * h * w; }
  YOLO_HOST_DEVICE size_t elements() const { return pixels() * c; }
  // Index of element (b, y, x, ch) in data.
  YOLO_HOST_DEVICE size_t at(int b, int y, int x, int ch) const {
    return ((size_t(b) * h + y) * w + x) * size_t(stride) + ch;
  }
};

using Act = NhwcView<float>;
using ConstAct = NhwcView<const float>;

template <typename T>
NhwcView<T> nhwc(T* data, int n, int h, int w, int c, int stride = 0) {
  return NhwcView<T>{data, n, h, w, c, stride ? stride : c};
}
template <typename T>
NhwcView<const T> as_const(NhwcView<T> v) {
  return NhwcView<const T>{v.data, v.n, v.h, v.w, v.c, v.stride};
}

// ---- argument checks (host side; every op's entry points run them before touching data) ----
// Each throws yolo::Error with a message starting "<op>: <name> ", so the user sees which
// argument of which op is wrong.

// "NxHxWxC", for error messages.
template <typename T>
std::string view_dims(const NhwcView<T>& v) {
  return std::to_string(v.n) + "x" + std::to_string(v.h) + "x" + std::to_string(v.w) + "x" + std::to_string(v.c);
}

// A usable view: no negative size, stride >= c, and data set unless the view is empty.
template <typename T>
void check_view_arg(const NhwcView<T>& v, const std::string& op, const std::string& name) {
  std::string prefix = op + ": " + name + " ";
  if (v.n < 0 || v.h < 0 || v.w < 0 || v.c < 0) throw Error(prefix + "has a negative size (" + view_dims(v) + ")");
  if (v.stride < v.c)
    throw Error(prefix + "has pixel stride " + std::to_string(v.stride) + " < channels " + std::to_string(v.c));
  if (v.data == nullptr && v.elements() > 0) throw Error(prefix + "is a null pointer");
}

// check_view_arg, and small enough for kernels on the row grid (common.cuh, row_launch), which
// index rows (n*h of them) and a row's items (w*stride at most) with int.
template <typename T>
void check_row_view_arg(const NhwcView<T>& v, const std::string& op, const std::string& name) {
  check_view_arg(v, op, name);
  if (size_t(v.n) * v.h > INT_MAX || size_t(v.w) * v.stride > INT_MAX)
    throw Error(op + ": " + name + " is too large (" + view_dims(v) + ", kernels index rows with int)");
}

// The same n, h, w and c (strides may differ).
template <typename A, typename B>
void check_same_view_shape(const NhwcView<A>& a, const NhwcView<B>& b, const std::string& op, const std::string& a_name,
                           const std::string& b_name) {
  if (a.n != b.n || a.h != b.h || a.w != b.w || a.c != b.c)
    throw Error(op + ": " + a_name + " is " + view_dims(a) + " but " + b_name + " is " + view_dims(b) +
                " (same shape required)");
}

}  // namespace yolo
