// Views of the buffers ops read and write, shared by every op family, plus the stream type
// launchers take (cudaStream_t; an opaque stand-in in builds without CUDA, where launchers run
// the kernels emulated). Activations are NHWC; a view may be a channel slice of a wider buffer
// (a route's concatenation), which is why it carries its own pixel stride.
#pragma once
#include <cstddef>

#if YOLO_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif


namespace yolo {

// Element (b, y, x, ch) is at data[((b*h + y)*w + x)*stride + ch]; stride >= c. A channel slice
// of a wider buffer: data points at the slice's first channel, stride is the wider count.
template <typename T>
struct NhwcView {
  T* data = nullptr;
  int n = 0, h = 0, w = 0, c = 0;
  int stride = 0;

  size_t pixels() const { return size_t(n) * h * w; }
  size_t elements() const { return pixels() * c; }
  // Index of element (b, y, x, ch) in data; usable on host and device.
#if defined(__CUDACC__)
  __host__ __device__
#endif
  size_t at(int b, int y, int x, int ch) const {
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

}  // namespace yolo
