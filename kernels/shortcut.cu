// Shortcut (residual add): reference, fast CPU version and CUDA kernels (see shortcut.h).
#include "kernels/shortcut.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"
#include "kernels/storage.cuh"

namespace yolo {
namespace {

template <typename T>
void check_forward(const NhwcView<const T>& a, const NhwcView<const T>& b, const NhwcView<T>& out) {
  check_row_view_arg(a, "shortcut_forward", "a");
  check_row_view_arg(b, "shortcut_forward", "b");
  check_row_view_arg(out, "shortcut_forward", "out");
  check_same_view_shape(a, out, "shortcut_forward", "a", "out");
  check_same_view_shape(b, out, "shortcut_forward", "b", "out");
}

// Gradients with null data are skipped; the others must match grad_out.
template <typename T>
void check_backward(const NhwcView<const T>& grad_out, const NhwcView<T>& grad_a, const NhwcView<T>& grad_b) {
  check_row_view_arg(grad_out, "shortcut_backward", "grad_out");
  if (grad_a.data) {
    check_row_view_arg(grad_a, "shortcut_backward", "grad_a");
    check_same_view_shape(grad_a, grad_out, "shortcut_backward", "grad_a", "grad_out");
  }
  if (grad_b.data) {
    check_row_view_arg(grad_b, "shortcut_backward", "grad_b");
    check_same_view_shape(grad_b, grad_out, "shortcut_backward", "grad_b", "grad_out");
  }
}

// ---- CUDA (on the row grid of common.cuh) ------------------------------------------------
// No __restrict__: out may alias a or b (each element is read before it is written, by the
// same thread).
// T: the storage type (float, Bf16, Fp16); sums in FP32, rounded once on the store.
template <typename T, int V>
__global__ void shortcut_forward_kernel(NhwcView<const T> a, NhwcView<const T> b, NhwcView<T> out) {
  for_each_row_pack<V>(out.n * out.h, out.w, out.c, [&](int row, int x, int ch) {
    size_t pixel = size_t(row) * out.w + x;
    Pack<T, V> sum = add_packs(load_pack_of<T, V>(a.data + pixel * a.stride + ch),
                               load_pack_of<T, V>(b.data + pixel * b.stride + ch));
    store_pack_of<T, V>(out.data + pixel * out.stride + ch, sum);
  });
}

template <typename T, int V>
__global__ void shortcut_backward_kernel(NhwcView<const T> grad_out, NhwcView<T> grad_a, NhwcView<T> grad_b,
                                         bool accumulate_a, bool accumulate_b) {
  for_each_row_pack<V>(grad_out.n * grad_out.h, grad_out.w, grad_out.c, [&](int row, int x, int ch) {
    size_t pixel = size_t(row) * grad_out.w + x;
    Pack<T, V> g = load_pack_of<T, V>(grad_out.data + pixel * grad_out.stride + ch);
    if (grad_a.data) {
      T* target = grad_a.data + pixel * grad_a.stride + ch;
      store_pack_of<T, V>(target, accumulate_a ? add_packs(load_pack_of<T, V>(target), g) : g);
    }
    if (grad_b.data) {
      T* target = grad_b.data + pixel * grad_b.stride + ch;
      store_pack_of<T, V>(target, accumulate_b ? add_packs(load_pack_of<T, V>(target), g) : g);
    }
  });
}

// A skipped gradient (null data) does not decide the access width.
template <typename T>
bool vector_or_skipped(const NhwcView<T>& grad) { return grad.data == nullptr || vector_view(grad); }

}  // namespace

// ---- reference --------------------------------------------------------------------------
template <typename T>
void shortcut_forward_reference(NhwcView<const T> a, NhwcView<const T> b, NhwcView<T> out) {
  check_forward(a, b, out);
  for (int n = 0; n < out.n; ++n)
    for (int y = 0; y < out.h; ++y)
      for (int x = 0; x < out.w; ++x)
        for (int ch = 0; ch < out.c; ++ch)
          out.data[out.at(n, y, x, ch)] = a.data[a.at(n, y, x, ch)] + b.data[b.at(n, y, x, ch)];
}

template <typename T>
void shortcut_backward_reference(NhwcView<const T> grad_out, NhwcView<T> grad_a, NhwcView<T> grad_b, bool accumulate_a,
                                 bool accumulate_b) {
  check_backward(grad_out, grad_a, grad_b);
  for (int n = 0; n < grad_out.n; ++n)
    for (int y = 0; y < grad_out.h; ++y)
      for (int x = 0; x < grad_out.w; ++x)
        for (int ch = 0; ch < grad_out.c; ++ch) {
          T g = grad_out.data[grad_out.at(n, y, x, ch)];
          if (grad_a.data) {
            T& t = grad_a.data[grad_a.at(n, y, x, ch)];
            t = accumulate_a ? t + g : g;
          }
          if (grad_b.data) {
            T& t = grad_b.data[grad_b.at(n, y, x, ch)];
            t = accumulate_b ? t + g : g;
          }
        }
}

template void shortcut_forward_reference<float>(NhwcView<const float>, NhwcView<const float>, NhwcView<float>);
template void shortcut_forward_reference<double>(NhwcView<const double>, NhwcView<const double>, NhwcView<double>);
template void shortcut_backward_reference<float>(NhwcView<const float>, NhwcView<float>, NhwcView<float>, bool, bool);
template void shortcut_backward_reference<double>(NhwcView<const double>, NhwcView<double>, NhwcView<double>, bool,
                                                  bool);

// ---- fast CPU: one work item per row ----------------------------------------------------
void shortcut_forward_cpu(ConstAct a, ConstAct b, Act out) {
  check_forward(a, b, out);
  parallel_for(size_t(out.n) * out.h, [&](size_t row) {
    int n = int(row / out.h), y = int(row % out.h);
    for (int x = 0; x < out.w; ++x) {
      const float* pa = a.data + a.at(n, y, x, 0);
      const float* pb = b.data + b.at(n, y, x, 0);
      float* po = out.data + out.at(n, y, x, 0);
      for (int ch = 0; ch < out.c; ++ch) po[ch] = pa[ch] + pb[ch];
    }
  });
}

void shortcut_backward_cpu(ConstAct grad_out, Act grad_a, Act grad_b, bool accumulate_a, bool accumulate_b) {
  check_backward(grad_out, grad_a, grad_b);
  // One pass over grad_out, pixel by pixel. A target aliasing grad_out (accumulate false) is
  // left as it is, so the other target still reads grad_out unchanged.
  parallel_for(size_t(grad_out.n) * grad_out.h, [&](size_t row) {
    int n = int(row / grad_out.h), y = int(row % grad_out.h);
    for (int x = 0; x < grad_out.w; ++x) {
      const float* g = grad_out.data + grad_out.at(n, y, x, 0);
      for (auto [view, accumulate] : {std::pair{grad_a, accumulate_a}, std::pair{grad_b, accumulate_b}}) {
        if (!view.data) continue;
        float* t = view.data + view.at(n, y, x, 0);
        if (accumulate)
          for (int ch = 0; ch < grad_out.c; ++ch) t[ch] += g[ch];
        else if (t != g)  // a target aliasing grad_out already holds it
          for (int ch = 0; ch < grad_out.c; ++ch) t[ch] = g[ch];
      }
    }
  });
}

// ---- CUDA launchers ---------------------------------------------------------------------
template <typename T>
void shortcut_forward_cuda(NhwcView<const T> a, NhwcView<const T> b, NhwcView<T> out, cudaStream_t stream) {
  check_forward(a, b, out);
  if (out.elements() == 0) return;
  constexpr int V = kVector<T>;
  bool vec = vector_view(a) && vector_view(b) && vector_view(out);
  RowLaunch shape = row_launch(size_t(out.n) * out.h, size_t(out.w) * (vec ? out.c / V : out.c));
  if (vec)
    LAUNCH((shortcut_forward_kernel<T, V>), shape.grid, shape.block, 0, stream, a, b, out);
  else
    LAUNCH((shortcut_forward_kernel<T, 1>), shape.grid, shape.block, 0, stream, a, b, out);
}

template <typename T>
void shortcut_backward_cuda(NhwcView<const T> grad_out, NhwcView<T> grad_a, NhwcView<T> grad_b, bool accumulate_a,
                            bool accumulate_b, cudaStream_t stream) {
  check_backward(grad_out, grad_a, grad_b);
  if (grad_out.elements() == 0 || (!grad_a.data && !grad_b.data)) return;
  constexpr int V = kVector<T>;
  bool vec = vector_view(grad_out) && vector_or_skipped(grad_a) && vector_or_skipped(grad_b);
  RowLaunch shape = row_launch(size_t(grad_out.n) * grad_out.h, size_t(grad_out.w) * (vec ? grad_out.c / V : grad_out.c));
  if (vec)
    LAUNCH((shortcut_backward_kernel<T, V>), shape.grid, shape.block, 0, stream, grad_out, grad_a, grad_b,
           accumulate_a, accumulate_b);
  else
    LAUNCH((shortcut_backward_kernel<T, 1>), shape.grid, shape.block, 0, stream, grad_out, grad_a, grad_b,
           accumulate_a, accumulate_b);
}

#define YOLO_SHORTCUT_CUDA(T)                                                                                     \
  template void shortcut_forward_cuda<T>(NhwcView<const T>, NhwcView<const T>, NhwcView<T>, cudaStream_t);        \
  template void shortcut_backward_cuda<T>(NhwcView<const T>, NhwcView<T>, NhwcView<T>, bool, bool, cudaStream_t);
YOLO_SHORTCUT_CUDA(float)
YOLO_SHORTCUT_CUDA(Bf16)
YOLO_SHORTCUT_CUDA(Fp16)
#undef YOLO_SHORTCUT_CUDA

}  // namespace yolo
