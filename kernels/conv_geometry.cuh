// Convolution geometry the CUDA implicit GEMMs share (kernels/conv.cu: FP32 on CUDA cores;
// kernels/conv_tc.cu: tensor cores): the shape as plain ints, stepping through (r, s, c)
// reduction indices, and the parity classes of the backward-data pass. Internal to those files.
#pragma once
#include <algorithm>
#include <cstddef>

#include "kernels/common.cuh"
#include "kernels/conv.h"
#include "kernels/half_types.h"

namespace yolo {

struct ConvGeom {
  int n, h, w, c_in, c_out, k, stride, pad, oh, ow;
};

inline ConvGeom geometry(const Conv2dShape& s) {
  return ConvGeom{s.n, s.h, s.w, s.c_in, s.c_out, s.k, s.stride, s.pad(), s.out_h(), s.out_w()};
}

// Steps a (major, middle, minor) position whose minor index counts to minor_size and middle to
// middle_size forward by `by` (minor_size may be below `by`).
__device__ __forceinline__ void advance3(int& major, int& middle, int& minor, int by, int middle_size, int minor_size) {
  minor += by;
  while (minor >= minor_size) {
    minor -= minor_size;
    if (++middle == middle_size) middle = 0, ++major;
  }
}

// A position along a reduction (or column) index split as (major, middle, minor), e.g. the
// (r, s, ci) of a convolution's K: index = (major * middle_size + middle) * minor_size + minor,
// inside the index's range exactly while major < major_size. The tensor-core loaders step one
// by a stage at a time.
struct Cursor3 {
  int major, middle, minor;
  __device__ __forceinline__ void start(int index, int middle_size, int minor_size) {
    minor = index % minor_size;
    const int t = index / minor_size;
    middle = t % middle_size, major = t / middle_size;
  }
  __device__ __forceinline__ void step(int by, int middle_size, int minor_size) {
    advance3(major, middle, minor, by, middle_size, minor_size);
  }
};

// Backward data: one parity class (py, px) of input pixels, qy = py + S*y', qx = px + S*x'.
// The taps reaching them are r = ry0 + S*jr (jr < nr), s = rx0 + S*js (js < ns), and the
// output pixel of tap (jr, js) is (y' + dy - jr, x' + dx - js).
struct ParityClass {
  int py, px, ry0, rx0, nr, ns, dy, dx, hc, wc;

  __host__ __device__ __forceinline__ ParityClass(const ConvGeom& g, int index) {
    const int S = g.stride;
    py = index / S, px = index % S;
    ry0 = (py + g.pad) % S, rx0 = (px + g.pad) % S;
    nr = (g.k - ry0 + S - 1) / S, ns = (g.k - rx0 + S - 1) / S;
    dy = (py + g.pad - ry0) / S, dx = (px + g.pad - rx0) / S;
    hc = g.h > py ? (g.h - py + S - 1) / S : 0, wc = g.w > px ? (g.w - px + S - 1) / S : 0;
  }
  __host__ __device__ __forceinline__ int rows(const ConvGeom& g) const { return g.n * hc * wc; }
  __device__ __forceinline__ int k_size(const ConvGeom& g) const { return nr * ns * g.c_out; }
  // Input pixel index (b*h + qy)*w + qx of class row m.
  __device__ __forceinline__ int input_pixel(const ConvGeom& g, int m) const {
    const int xq = m % wc, t = m / wc, yq = t % hc, b = t / hc;
    return (b * g.h + py + g.stride * yq) * g.w + px + g.stride * xq;
  }
};

// out[chunk][col] (FP32) = sum of data[row][col] (float, Bf16 or Fp16) (row pitch `pitch`) over the chunk's rows, in a fixed
// order. Block (32, 8): 32 columns, 8 row lanes added in order at the end.
template <typename T>
__global__ void column_sums_kernel(const T* data, int pitch, int rows, int cols, int rows_per_chunk, float* out) {
  __shared__ float lanes[8][33];
  const int col = int(blockIdx.x) * 32 + int(threadIdx.x), chunk = int(blockIdx.y);
  const int r_end = min(rows, (chunk + 1) * rows_per_chunk);
  float sum = 0.0f;
  if (col < cols)
    for (int r = chunk * rows_per_chunk + int(threadIdx.y); r < r_end; r += 8) sum += to_float(data[size_t(r) * pitch + col]);
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int y = 0; y < 8; ++y) total += lanes[y][threadIdx.x];
    out[size_t(chunk) * cols + col] = total;
  }
}

template <typename T>
void launch_column_sums(const T* data, int pitch, int rows, int cols, int rows_per_chunk, float* out,
                        cudaStream_t stream) {
  const unsigned chunks = std::max(1u, ceil_div(size_t(rows), size_t(rows_per_chunk)));  // rows == 0: zeros
  LAUNCH(column_sums_kernel<T>, dim3(ceil_div(size_t(cols), 32), chunks), dim3(32, 8), 0, stream, data, pitch, rows, cols,
         rows_per_chunk, out);
}

// Bias gradient: grad_bias[c] = the sum of grad_out over every pixel, in chunks of
// bias_rows_per_chunk pixels (at most 1024 chunks; partials in bias_partials_bytes of workspace),
// then the chunks in order: deterministic.
inline int bias_rows_per_chunk(long long pixels) { return int(std::max<long long>(256, (pixels + 1023) / 1024)); }
inline size_t bias_partials_bytes(const Conv2dShape& s) {
  const long long pixels = (long long)s.n * s.out_h() * s.out_w();
  const long long chunks = (pixels + bias_rows_per_chunk(pixels) - 1) / bias_rows_per_chunk(pixels);
  return (size_t(chunks) * s.c_out * sizeof(float) + 255) / 256 * 256;
}
template <typename T>
void launch_bias_gradient(const Conv2dShape& s, NhwcView<const T> grad_out, float* grad_bias, float* bias_partials,
                          cudaStream_t stream) {
  const int pixels = s.n * s.out_h() * s.out_w();
  if (pixels == 0) return launch_column_sums(grad_out.data, grad_out.stride, 0, s.c_out, 1, grad_bias, stream);
  const int per_chunk = bias_rows_per_chunk(pixels);
  const int chunks = (pixels + per_chunk - 1) / per_chunk;
  launch_column_sums(grad_out.data, grad_out.stride, pixels, s.c_out, per_chunk, bias_partials, stream);
  launch_column_sums(bias_partials, s.c_out, chunks, s.c_out, chunks, grad_bias, stream);
}

}  // namespace yolo
