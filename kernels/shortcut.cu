// Shortcut (residual add): reference, fast CPU version and CUDA kernels (see shortcut.h).
#include "kernels/shortcut.h"

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

namespace yolo {
namespace {

template <typename T>
std::string dims(const NhwcView<T>& v) {
  return std::to_string(v.n) + "x" + std::to_string(v.h) + "x" + std::to_string(v.w) + "x" + std::to_string(v.c);
}

template <typename T>
void check_view(const NhwcView<T>& v, const char* op, const char* name) {
  std::string prefix = std::string(op) + ": " + name + " ";
  if (v.n < 0 || v.h < 0 || v.w < 0 || v.c < 0) throw Error(prefix + "has a negative size (" + dims(v) + ")");
  if (v.stride < v.c)
    throw Error(prefix + "has pixel stride " + std::to_string(v.stride) + " < channels " + std::to_string(v.c));
  if (v.data == nullptr && v.elements() > 0) throw Error(prefix + "is a null pointer");
  if (size_t(v.n) * v.h > INT_MAX || size_t(v.w) * v.stride > INT_MAX)
    throw Error(prefix + "is too large (" + dims(v) + ", kernels index rows with int)");
}

template <typename A, typename B>
void check_same_shape(const NhwcView<A>& a, const NhwcView<B>& b, const char* op, const char* a_name,
                      const char* b_name) {
  if (a.n != b.n || a.h != b.h || a.w != b.w || a.c != b.c)
    throw Error(std::string(op) + ": " + a_name + " is " + dims(a) + " but " + b_name + " is " + dims(b) +
                " (same shape required)");
}

template <typename T>
void check_forward(const NhwcView<const T>& a, const NhwcView<const T>& b, const NhwcView<T>& out) {
  check_view(a, "shortcut_forward", "a");
  check_view(b, "shortcut_forward", "b");
  check_view(out, "shortcut_forward", "out");
  check_same_shape(a, out, "shortcut_forward", "a", "out");
  check_same_shape(b, out, "shortcut_forward", "b", "out");
}

// Gradients with null data are skipped; the others must match grad_out.
template <typename T>
void check_backward(const NhwcView<const T>& grad_out, const NhwcView<T>& grad_a, const NhwcView<T>& grad_b) {
  check_view(grad_out, "shortcut_backward", "grad_out");
  if (grad_a.data) {
    check_view(grad_a, "shortcut_backward", "grad_a");
    check_same_shape(grad_a, grad_out, "shortcut_backward", "grad_a", "grad_out");
  }
  if (grad_b.data) {
    check_view(grad_b, "shortcut_backward", "grad_b");
    check_same_shape(grad_b, grad_out, "shortcut_backward", "grad_b", "grad_out");
  }
}

// ---- CUDA -------------------------------------------------------------------------------
struct alignas(16) Vec4 {
  float x, y, z, w;
};
__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ Vec4 add(Vec4 a, Vec4 b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }
template <int V>
using Pack = std::conditional_t<V == 4, Vec4, float>;
template <int V>
__device__ __forceinline__ Pack<V> load(const float* p) { return *reinterpret_cast<const Pack<V>*>(p); }
template <int V>
__device__ __forceinline__ void store(float* p, Pack<V> v) { *reinterpret_cast<Pack<V>*>(p) = v; }

// Launch shape over NHWC rows: grid y strides over the n*h rows, x over a row's items; a
// thread's index arithmetic is then one 32-bit division per item (64-bit division is slow).
struct RowLaunch {
  dim3 grid, block;
};
RowLaunch row_launch(size_t rows, size_t per_row) {
  unsigned threads = per_row >= 256 ? 256u : unsigned((per_row + 31) / 32 * 32);
  size_t blocks = (per_row + threads - 1) / threads;
  return {dim3(unsigned(blocks < 1024 ? blocks : 1024), unsigned(rows < 65535 ? rows : 65535)), dim3(threads)};
}

// No __restrict__: out may alias a or b (each element is read before it is written, by the
// same thread).
template <int V>
__global__ void shortcut_forward_kernel(ConstAct a, ConstAct b, Act out) {
  int packs = out.c / V, rows = out.n * out.h, per_row = out.w * packs;
  for (int row = int(blockIdx.y); row < rows; row += int(gridDim.y))
    for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < per_row; i += int(gridDim.x * blockDim.x)) {
      int x = i / packs, ch = (i - x * packs) * V;
      size_t pixel = size_t(row) * out.w + x;
      Pack<V> sum = add(load<V>(a.data + pixel * a.stride + ch), load<V>(b.data + pixel * b.stride + ch));
      store<V>(out.data + pixel * out.stride + ch, sum);
    }
}

template <int V>
__global__ void shortcut_backward_kernel(ConstAct grad_out, Act grad_a, Act grad_b, bool accumulate_a,
                                         bool accumulate_b) {
  int packs = grad_out.c / V, rows = grad_out.n * grad_out.h, per_row = grad_out.w * packs;
  for (int row = int(blockIdx.y); row < rows; row += int(gridDim.y))
    for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < per_row; i += int(gridDim.x * blockDim.x)) {
      int x = i / packs, ch = (i - x * packs) * V;
      size_t pixel = size_t(row) * grad_out.w + x;
      Pack<V> g = load<V>(grad_out.data + pixel * grad_out.stride + ch);
      if (grad_a.data) {
        float* target = grad_a.data + pixel * grad_a.stride + ch;
        store<V>(target, accumulate_a ? add(load<V>(target), g) : g);
      }
      if (grad_b.data) {
        float* target = grad_b.data + pixel * grad_b.stride + ch;
        store<V>(target, accumulate_b ? add(load<V>(target), g) : g);
      }
    }
}

template <typename T>
bool vec4_view(const NhwcView<T>& v) {
  return v.data == nullptr || (v.stride % 4 == 0 && reinterpret_cast<uintptr_t>(v.data) % 16 == 0);
}

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
void shortcut_forward_cuda(ConstAct a, ConstAct b, Act out, cudaStream_t stream) {
  check_forward(a, b, out);
  if (out.elements() == 0) return;
  bool vec4 = out.c % 4 == 0 && vec4_view(a) && vec4_view(b) && vec4_view(out);
  RowLaunch shape = row_launch(size_t(out.n) * out.h, size_t(out.w) * (vec4 ? out.c / 4 : out.c));
  if (vec4)
    LAUNCH(shortcut_forward_kernel<4>, shape.grid, shape.block, 0, stream, a, b, out);
  else
    LAUNCH(shortcut_forward_kernel<1>, shape.grid, shape.block, 0, stream, a, b, out);
}

void shortcut_backward_cuda(ConstAct grad_out, Act grad_a, Act grad_b, bool accumulate_a, bool accumulate_b,
                            cudaStream_t stream) {
  check_backward(grad_out, grad_a, grad_b);
  if (grad_out.elements() == 0 || (!grad_a.data && !grad_b.data)) return;
  bool vec4 = grad_out.c % 4 == 0 && vec4_view(grad_out) && vec4_view(grad_a) && vec4_view(grad_b);
  RowLaunch shape = row_launch(size_t(grad_out.n) * grad_out.h, size_t(grad_out.w) * (vec4 ? grad_out.c / 4 : grad_out.c));
  if (vec4)
    LAUNCH(shortcut_backward_kernel<4>, shape.grid, shape.block, 0, stream, grad_out, grad_a, grad_b, accumulate_a,
           accumulate_b);
  else
    LAUNCH(shortcut_backward_kernel<1>, shape.grid, shape.block, 0, stream, grad_out, grad_a, grad_b, accumulate_a,
           accumulate_b);
}

}  // namespace yolo
