// Nearest-neighbour upsampling: reference, fast CPU version and CUDA kernels (see upsample.h).
#include "kernels/upsample.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"
#include "kernels/storage.cuh"

namespace yolo {
namespace {

// small: the (n, h, w, c) view; big: the upsampled one.
template <typename S, typename B>
void check_shapes(const NhwcView<S>& small, const NhwcView<B>& big, int factor, const char* op, const char* small_name,
                  const char* big_name) {
  if (factor < 1) throw Error(std::string(op) + ": factor " + std::to_string(factor) + " must be at least 1");
  check_row_view_arg(small, op, small_name);
  check_row_view_arg(big, op, big_name);
  if (big.n != small.n || big.c != small.c || big.h != small.h * factor || big.w != small.w * factor)
    throw Error(std::string(op) + ": " + big_name + " is " + view_dims(big) + " but " + small_name + " " +
                view_dims(small) + " upsampled by " + std::to_string(factor) + " is " + std::to_string(small.n) + "x" +
                std::to_string(small.h * factor) + "x" + std::to_string(small.w * factor) + "x" +
                std::to_string(small.c));
}

// ---- CUDA (on the row grid of common.cuh) ------------------------------------------------
// One thread per V channels of an output pixel. T: the storage type (a 16-bit copy is exact).
template <typename T, int V>
__global__ void upsample_forward_kernel(NhwcView<const T> in, NhwcView<T> out, int factor) {
  for_each_row_pack<V>(out.n * out.h, out.w, out.c, [&](int row, int x, int ch) {
    int b = row / out.h, y = row % out.h;
    store_pack_of<T, V>(out.data + out.at(b, y, x, ch), load_pack_of<T, V>(in.data + in.at(b, y / factor, x / factor, ch)));
  });
}

// One thread per V channels of a grad_in pixel: gathers its factor x factor block in order, in
// FP32, rounded once to T.
template <typename T, int V>
__global__ void upsample_backward_kernel(NhwcView<const T> grad_out, NhwcView<T> grad_in, int factor, bool accumulate) {
  for_each_row_pack<V>(grad_in.n * grad_in.h, grad_in.w, grad_in.c, [&](int row, int x, int ch) {
    int b = row / grad_in.h, y = row % grad_in.h;
    Pack<T, V> sum = load_pack_of<T, V>(grad_out.data + grad_out.at(b, y * factor, x * factor, ch));
    for (int dy = 0; dy < factor; ++dy)
      for (int dx = dy == 0 ? 1 : 0; dx < factor; ++dx)
        sum = add_packs(sum, load_pack_of<T, V>(grad_out.data + grad_out.at(b, y * factor + dy, x * factor + dx, ch)));
    T* target = grad_in.data + grad_in.at(b, y, x, ch);
    store_pack_of<T, V>(target, accumulate ? add_packs(load_pack_of<T, V>(target), sum) : sum);
  });
}

}  // namespace

// ---- reference --------------------------------------------------------------------------
template <typename T>
void upsample_forward_reference(NhwcView<const T> in, NhwcView<T> out, int factor) {
  check_shapes(in, out, factor, "upsample_forward", "in", "out");
  for (int b = 0; b < out.n; ++b)
    for (int y = 0; y < out.h; ++y)
      for (int x = 0; x < out.w; ++x)
        for (int ch = 0; ch < out.c; ++ch) out.data[out.at(b, y, x, ch)] = in.data[in.at(b, y / factor, x / factor, ch)];
}

template <typename T>
void upsample_backward_reference(NhwcView<const T> grad_out, NhwcView<T> grad_in, int factor, bool accumulate) {
  check_shapes(grad_in, grad_out, factor, "upsample_backward", "grad_in", "grad_out");
  for (int b = 0; b < grad_in.n; ++b)
    for (int y = 0; y < grad_in.h; ++y)
      for (int x = 0; x < grad_in.w; ++x)
        for (int ch = 0; ch < grad_in.c; ++ch) {
          T sum = 0;
          for (int dy = 0; dy < factor; ++dy)
            for (int dx = 0; dx < factor; ++dx) sum += grad_out.data[grad_out.at(b, y * factor + dy, x * factor + dx, ch)];
          T& target = grad_in.data[grad_in.at(b, y, x, ch)];
          target = accumulate ? target + sum : sum;
        }
}

template void upsample_forward_reference<float>(NhwcView<const float>, NhwcView<float>, int);
template void upsample_forward_reference<double>(NhwcView<const double>, NhwcView<double>, int);
template void upsample_backward_reference<float>(NhwcView<const float>, NhwcView<float>, int, bool);
template void upsample_backward_reference<double>(NhwcView<const double>, NhwcView<double>, int, bool);

// ---- fast CPU: one work item per output row ---------------------------------------------
void upsample_forward_cpu(ConstAct in, Act out, int factor) {
  check_shapes(in, out, factor, "upsample_forward", "in", "out");
  parallel_for(size_t(out.n) * out.h, [&](size_t row) {
    int b = int(row / out.h), y = int(row % out.h);
    for (int x = 0; x < out.w; ++x)
      std::memcpy(out.data + out.at(b, y, x, 0), in.data + in.at(b, y / factor, x / factor, 0), sizeof(float) * out.c);
  });
}

void upsample_backward_cpu(ConstAct grad_out, Act grad_in, int factor, bool accumulate) {
  check_shapes(grad_in, grad_out, factor, "upsample_backward", "grad_in", "grad_out");
  parallel_for(size_t(grad_in.n) * grad_in.h, [&](size_t row) {
    int b = int(row / grad_in.h), y = int(row % grad_in.h);
    std::vector<float> sums(size_t(grad_in.c));
    for (int x = 0; x < grad_in.w; ++x) {
      std::fill(sums.begin(), sums.end(), 0.0f);
      for (int dy = 0; dy < factor; ++dy)  // the reference's order per element: dy, then dx
        for (int dx = 0; dx < factor; ++dx) {
          const float* g = grad_out.data + grad_out.at(b, y * factor + dy, x * factor + dx, 0);
          for (int ch = 0; ch < grad_in.c; ++ch) sums[size_t(ch)] += g[ch];
        }
      float* target = grad_in.data + grad_in.at(b, y, x, 0);
      if (accumulate)
        for (int ch = 0; ch < grad_in.c; ++ch) target[ch] += sums[size_t(ch)];
      else
        std::memcpy(target, sums.data(), sizeof(float) * grad_in.c);
    }
  });
}

// ---- CUDA launchers ---------------------------------------------------------------------
template <typename T>
void upsample_forward_cuda(NhwcView<const T> in, NhwcView<T> out, int factor, cudaStream_t stream) {
  check_shapes(in, out, factor, "upsample_forward", "in", "out");
  if (out.elements() == 0) return;
  constexpr int V = kVector<T>;
  bool vec = vector_view(out) && vector_view(in);
  RowLaunch shape = row_launch(size_t(out.n) * out.h, size_t(out.w) * (vec ? out.c / V : out.c));
  if (vec)
    LAUNCH((upsample_forward_kernel<T, V>), shape.grid, shape.block, 0, stream, in, out, factor);
  else
    LAUNCH((upsample_forward_kernel<T, 1>), shape.grid, shape.block, 0, stream, in, out, factor);
}

template <typename T>
void upsample_backward_cuda(NhwcView<const T> grad_out, NhwcView<T> grad_in, int factor, bool accumulate,
                            cudaStream_t stream) {
  check_shapes(grad_in, grad_out, factor, "upsample_backward", "grad_in", "grad_out");
  if (grad_in.elements() == 0) return;
  constexpr int V = kVector<T>;
  bool vec = vector_view(grad_in) && vector_view(grad_out);
  RowLaunch shape = row_launch(size_t(grad_in.n) * grad_in.h, size_t(grad_in.w) * (vec ? grad_in.c / V : grad_in.c));
  if (vec)
    LAUNCH((upsample_backward_kernel<T, V>), shape.grid, shape.block, 0, stream, grad_out, grad_in, factor, accumulate);
  else
    LAUNCH((upsample_backward_kernel<T, 1>), shape.grid, shape.block, 0, stream, grad_out, grad_in, factor, accumulate);
}

#define YOLO_UPSAMPLE_CUDA(T)                                                                 \
  template void upsample_forward_cuda<T>(NhwcView<const T>, NhwcView<T>, int, cudaStream_t); \
  template void upsample_backward_cuda<T>(NhwcView<const T>, NhwcView<T>, int, bool, cudaStream_t);
YOLO_UPSAMPLE_CUDA(float)
YOLO_UPSAMPLE_CUDA(Bf16)
YOLO_UPSAMPLE_CUDA(Fp16)
#undef YOLO_UPSAMPLE_CUDA

}  // namespace yolo
