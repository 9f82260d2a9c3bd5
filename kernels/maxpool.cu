// Max pooling with darknet's padding: reference and CUDA kernels (see maxpool.h); the fast CPU
// version is maxpool_cpu.cpp, and both share the window arithmetic of maxpool_shared.h.
#include "kernels/maxpool.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/maxpool_shared.h"

namespace yolo {
namespace {

using namespace maxpool_detail;


// Dense argmax index of output element (b, oy, ox, ch).
template <typename V>
__host__ __device__ inline size_t argmax_at(const V& out_shape, int b, int oy, int ox, int ch) {
  return ((size_t(b) * out_shape.h + oy) * out_shape.w + ox) * out_shape.c + ch;
}

// The maximum of output element (b, oy, ox, ch)'s window; *index gets its pixel, iy * w + ix.
// T: the storage type (compared as FP32 values: exact for 16-bit storage too).
template <typename T>
__host__ __device__ inline float window_max(const NhwcView<const T>& in, int b, int oy, int ox, int ch, int size,
                                            int stride, int* index) {
  Span rows = window_rows(oy, size, stride, in.h), cols = window_rows(ox, size, stride, in.w);
  float best = 0.0f;
  int best_index = -1;
  for (int y = rows.first; y < rows.last; ++y)
    for (int x = cols.first; x < cols.last; ++x) {
      float v = to_float(in.data[in.at(b, y, x, ch)]);
      if (best_index < 0 || v > best) best = v, best_index = y * in.w + x;  // strict: first maximum wins
    }
  *index = best_index;
  return best;
}

// Sum of grad_out over the outputs (row-major) that chose input element (b, iy, ix, ch).
template <typename T>
__host__ __device__ inline float gathered_gradient(const NhwcView<const T>& grad_out, const int* argmax, int b, int iy,
                                                   int ix, int ch, int in_w, int size, int stride) {
  Span rows = covering_outputs(iy, size, stride, grad_out.h), cols = covering_outputs(ix, size, stride, grad_out.w);
  int self = iy * in_w + ix;
  float sum = 0.0f;
  for (int oy = rows.first; oy < rows.last; ++oy)
    for (int ox = cols.first; ox < cols.last; ++ox)
      if (argmax[argmax_at(grad_out, b, oy, ox, ch)] == self) sum += to_float(grad_out.data[grad_out.at(b, oy, ox, ch)]);
  return sum;
}

// ---- CUDA (on the row grid of common.cuh) ------------------------------------------------
// T: the storage type (float, Bf16, Fp16); the gradient's sums in FP32, rounded once.
template <typename T>
__global__ void maxpool_forward_kernel(NhwcView<const T> in, NhwcView<T> out, int* argmax, int size, int stride) {
  const ConstAct out_shape{nullptr, out.n, out.h, out.w, out.c, out.c};
  for_each_row_pack<1>(out.n * out.h, out.w, out.c, [&](int row, int ox, int ch) {
    int b = row / out.h, oy = row % out.h;
    int index;
    out.data[out.at(b, oy, ox, ch)] = from_float<T>(window_max(in, b, oy, ox, ch, size, stride, &index));
    if (argmax) argmax[argmax_at(out_shape, b, oy, ox, ch)] = index;
  });
}

template <typename T>
__global__ void maxpool_backward_kernel(NhwcView<const T> grad_out, const int* argmax, NhwcView<T> grad_in, int size,
                                        int stride, bool accumulate) {
  for_each_row_pack<1>(grad_in.n * grad_in.h, grad_in.w, grad_in.c, [&](int row, int ix, int ch) {
    int b = row / grad_in.h, iy = row % grad_in.h;
    float sum = gathered_gradient(grad_out, argmax, b, iy, ix, ch, grad_in.w, size, stride);
    T& target = grad_in.data[grad_in.at(b, iy, ix, ch)];
    target = from_float<T>(accumulate ? to_float(target) + sum : sum);
  });
}

}  // namespace

int maxpool_output_size(int input, int size, int stride) {
  if (size < 1 || stride < 1 || input < 0)
    throw Error("maxpool: size " + std::to_string(size) + " and stride " + std::to_string(stride) +
                " must be at least 1 and the input size " + std::to_string(input) + " not negative");
  if (input == 0) return 0;
  return (input + (size - 1) - size) / stride + 1;
}

// ---- reference: plain loops, scatter backward -------------------------------------------
template <typename T>
void maxpool_forward_reference(NhwcView<const T> in, NhwcView<T> out, int* argmax, int size, int stride) {
  check_shapes(in, out, size, stride, "maxpool_forward", "in", "out");
  int offset = -((size - 1) / 2);
  for (int b = 0; b < out.n; ++b)
    for (int oy = 0; oy < out.h; ++oy)
      for (int ox = 0; ox < out.w; ++ox)
        for (int ch = 0; ch < out.c; ++ch) {
          T best = 0;
          int best_index = -1;
          for (int dy = 0; dy < size; ++dy)
            for (int dx = 0; dx < size; ++dx) {
              int y = oy * stride + offset + dy, x = ox * stride + offset + dx;
              if (y < 0 || y >= in.h || x < 0 || x >= in.w) continue;
              T v = in.data[in.at(b, y, x, ch)];
              if (best_index < 0 || v > best) best = v, best_index = y * in.w + x;
            }
          out.data[out.at(b, oy, ox, ch)] = best;
          if (argmax) argmax[((size_t(b) * out.h + oy) * out.w + ox) * out.c + ch] = best_index;
        }
}

template <typename T>
void maxpool_backward_reference(NhwcView<const T> grad_out, const int* argmax, NhwcView<T> grad_in, int size, int stride,
                                bool accumulate) {
  check_shapes(grad_in, grad_out, size, stride, "maxpool_backward", "grad_in", "grad_out");
  if (!argmax && grad_out.elements() > 0) throw Error("maxpool_backward: argmax is a null pointer");
  int offset = -((size - 1) / 2);
  std::vector<T> sums(grad_in.elements(), T(0));  // dense [n][h][w][c]
  for (int b = 0; b < grad_out.n; ++b)
    for (int oy = 0; oy < grad_out.h; ++oy)
      for (int ox = 0; ox < grad_out.w; ++ox)
        for (int ch = 0; ch < grad_out.c; ++ch) {
          int index = argmax[((size_t(b) * grad_out.h + oy) * grad_out.w + ox) * grad_out.c + ch];
          int y = index < 0 ? -1 : index / grad_in.w, x = index < 0 ? -1 : index % grad_in.w;
          int dy = y - (oy * stride + offset), dx = x - (ox * stride + offset);
          if (index < 0 || y >= grad_in.h || dy < 0 || dy >= size || dx < 0 || dx >= size)
            throw Error("maxpool_backward: argmax " + std::to_string(index) + " of output (" + std::to_string(b) + ", " +
                        std::to_string(oy) + ", " + std::to_string(ox) + ", " + std::to_string(ch) +
                        ") is not in its window");
          sums[((size_t(b) * grad_in.h + y) * grad_in.w + x) * grad_in.c + ch] +=
              grad_out.data[grad_out.at(b, oy, ox, ch)];
        }
  for (int b = 0; b < grad_in.n; ++b)
    for (int y = 0; y < grad_in.h; ++y)
      for (int x = 0; x < grad_in.w; ++x)
        for (int ch = 0; ch < grad_in.c; ++ch) {
          T sum = sums[((size_t(b) * grad_in.h + y) * grad_in.w + x) * grad_in.c + ch];
          T& target = grad_in.data[grad_in.at(b, y, x, ch)];
          target = accumulate ? target + sum : sum;
        }
}

template void maxpool_forward_reference<float>(NhwcView<const float>, NhwcView<float>, int*, int, int);
template void maxpool_forward_reference<double>(NhwcView<const double>, NhwcView<double>, int*, int, int);
template void maxpool_backward_reference<float>(NhwcView<const float>, const int*, NhwcView<float>, int, int, bool);
template void maxpool_backward_reference<double>(NhwcView<const double>, const int*, NhwcView<double>, int, int, bool);

// ---- CUDA launchers ---------------------------------------------------------------------
template <typename T>
void maxpool_forward_cuda(NhwcView<const T> in, NhwcView<T> out, int* argmax, int size, int stride,
                          cudaStream_t stream) {
  check_shapes(in, out, size, stride, "maxpool_forward", "in", "out");
  if (out.elements() == 0) return;
  RowLaunch shape = row_launch(size_t(out.n) * out.h, size_t(out.w) * out.c);
  LAUNCH(maxpool_forward_kernel<T>, shape.grid, shape.block, 0, stream, in, out, argmax, size, stride);
}

template <typename T>
void maxpool_backward_cuda(NhwcView<const T> grad_out, const int* argmax, NhwcView<T> grad_in, int size, int stride,
                           bool accumulate, cudaStream_t stream) {
  check_shapes(grad_in, grad_out, size, stride, "maxpool_backward", "grad_in", "grad_out");
  if (!argmax && grad_out.elements() > 0) throw Error("maxpool_backward: argmax is a null pointer");
  if (grad_in.elements() == 0) return;
  RowLaunch shape = row_launch(size_t(grad_in.n) * grad_in.h, size_t(grad_in.w) * grad_in.c);
  LAUNCH(maxpool_backward_kernel<T>, shape.grid, shape.block, 0, stream, grad_out, argmax, grad_in, size, stride,
         accumulate);
}

#define YOLO_MAXPOOL_CUDA(T)                                                                                    \
  template void maxpool_forward_cuda<T>(NhwcView<const T>, NhwcView<T>, int*, int, int, cudaStream_t);          \
  template void maxpool_backward_cuda<T>(NhwcView<const T>, const int*, NhwcView<T>, int, int, bool, cudaStream_t);
YOLO_MAXPOOL_CUDA(float)
YOLO_MAXPOOL_CUDA(Bf16)
YOLO_MAXPOOL_CUDA(Fp16)
#undef YOLO_MAXPOOL_CUDA

}  // namespace yolo
