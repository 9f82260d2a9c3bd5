// Activations: reference loops, the fast CPU version (pixel chunks on the pool) and the CUDA
// kernels (elementwise, float4 where channel count, stride and alignment allow).
#include "kernels/activation.h"

#include <string>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"
#include "kernels/exact_math.cuh"
#include "kernels/storage.cuh"

namespace yolo {

Activation activation_from_name(const std::string& name) {
  if (name == "linear") return Activation::Linear;
  if (name == "leaky") return Activation::Leaky;
  if (name == "relu") return Activation::Relu;
  if (name == "logistic") return Activation::Logistic;
  throw Error("unknown activation '" + name + "' (expected linear, leaky, relu or logistic)");
}

const char* activation_name(Activation kind) {
  switch (kind) {
    case Activation::Linear: return "linear";
    case Activation::Leaky: return "leaky";
    case Activation::Relu: return "relu";
    case Activation::Logistic: return "logistic";
  }
  return "?";
}

namespace {

template <typename T>
void check_forward(const char* op, NhwcView<const T> x, NhwcView<T> y) {
  check_view_arg(x, op, "x");
  check_view_arg(y, op, "y");
  check_same_view_shape(y, x, op, "y", "x");
}

template <typename T>
void check_backward(const char* op, NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<T> grad_x) {
  check_view_arg(y, op, "y");
  check_view_arg(grad_y, op, "grad_y");
  check_view_arg(grad_x, op, "grad_x");
  check_same_view_shape(grad_y, y, op, "grad_y", "y");
  check_same_view_shape(grad_x, y, op, "grad_x", "y");
}

// ---- CPU ------------------------------------------------------------------------------------

// Chunks of whole pixels, about 16K elements each.
size_t pixel_chunk(const ConstAct& v) {
  size_t per = 16384 / size_t(v.c > 0 ? v.c : 1);
  return per > 0 ? per : 1;
}

template <Activation A>
void forward_cpu(ConstAct x, Act y) {
  size_t pixels = x.pixels(), per = pixel_chunk(x);
  parallel_for((pixels + per - 1) / per, [&](size_t chunk) {
    size_t end = pixels < (chunk + 1) * per ? pixels : (chunk + 1) * per;
    for (size_t p = chunk * per; p < end; ++p) {
      const float* in = x.data + p * size_t(x.stride);
      float* out = y.data + p * size_t(y.stride);
      map_channels(in, out, x.c, [](int, float v) { return activate<A>(v); });
    }
  });
}

template <Activation A>
void backward_cpu(ConstAct y, ConstAct grad_y, Act grad_x) {
  size_t pixels = y.pixels(), per = pixel_chunk(y);
  parallel_for((pixels + per - 1) / per, [&](size_t chunk) {
    size_t end = pixels < (chunk + 1) * per ? pixels : (chunk + 1) * per;
    for (size_t p = chunk * per; p < end; ++p) {
      const float* yy = y.data + p * size_t(y.stride);
      const float* gy = grad_y.data + p * size_t(grad_y.stride);
      float* gx = grad_x.data + p * size_t(grad_x.stride);
      for (int ch = 0; ch < y.c; ++ch) gx[ch] = gy[ch] * activation_gradient_from_output<A>(yy[ch]);
    }
  });
}

// ---- CUDA -----------------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 8192;  // grid-stride beyond this

// Each thread handles V consecutive channels of one pixel per step; `units` = c / V per pixel.
// T: the storage type (float, Bf16, Fp16); the math is FP32 in exactly rounded steps, the same
// in every instantiation (exact_math.cuh), rounded once more on the store.
template <Activation A, typename T, int V>
__global__ void forward_kernel(NhwcView<const T> x, NhwcView<T> y, size_t total_units, unsigned units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_units; i += size_t(gridDim.x) * blockDim.x) {
    size_t p = i / units, ch = (i % units) * V;
    float v[V];
    load_values<T, V>(x.data + p * x.stride + ch, v);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = activate_rn<A>(v[j]);
    store_values<T, V>(y.data + p * y.stride + ch, v);
  }
}

template <Activation A, typename T, int V>
__global__ void backward_kernel(NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<T> grad_x, size_t total_units,
                                unsigned units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_units; i += size_t(gridDim.x) * blockDim.x) {
    size_t p = i / units, ch = (i % units) * V;
    float out[V], g[V];
    if constexpr (A != Activation::Linear) load_values<T, V>(y.data + p * y.stride + ch, out);
    load_values<T, V>(grad_y.data + p * grad_y.stride + ch, g);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (A != Activation::Linear) g[j] = __fmul_rn(g[j], activation_gradient_rn<A>(out[j]));
    }
    store_values<T, V>(grad_x.data + p * grad_x.stride + ch, g);
  }
}

dim3 grid_for(size_t total_units) {
  size_t blocks = (total_units + kThreads - 1) / kThreads;
  return dim3(unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

template <Activation A, typename T>
void forward_cuda(NhwcView<const T> x, NhwcView<T> y, cudaStream_t stream) {
  if (x.elements() == 0) return;
  constexpr int V = kVector<T>;
  if (vector_view(x) && vector_view(y)) {
    size_t total = x.pixels() * size_t(x.c / V);
    LAUNCH((forward_kernel<A, T, V>), grid_for(total), dim3(kThreads), 0, stream, x, y, total, unsigned(x.c / V));
  } else {
    size_t total = x.elements();
    LAUNCH((forward_kernel<A, T, 1>), grid_for(total), dim3(kThreads), 0, stream, x, y, total, unsigned(x.c));
  }
}

template <Activation A, typename T>
void backward_cuda(NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<T> grad_x, cudaStream_t stream) {
  if (y.elements() == 0) return;
  constexpr int V = kVector<T>;
  bool vec = vector_view(grad_y) && vector_view(grad_x) && (A == Activation::Linear || vector_view(y));
  if (vec) {
    size_t total = y.pixels() * size_t(y.c / V);
    LAUNCH((backward_kernel<A, T, V>), grid_for(total), dim3(kThreads), 0, stream, y, grad_y, grad_x, total,
           unsigned(y.c / V));
  } else {
    size_t total = y.elements();
    LAUNCH((backward_kernel<A, T, 1>), grid_for(total), dim3(kThreads), 0, stream, y, grad_y, grad_x, total,
           unsigned(y.c));
  }
}

}  // namespace

// ---- public entry points --------------------------------------------------------------------

template <typename T>
void activation_forward_reference(Activation kind, NhwcView<const T> x, NhwcView<T> y) {
  check_forward("activation_forward_reference", x, y);
  for (int b = 0; b < x.n; ++b)
    for (int i = 0; i < x.h; ++i)
      for (int j = 0; j < x.w; ++j)
        for (int ch = 0; ch < x.c; ++ch) y.data[y.at(b, i, j, ch)] = activate(kind, x.data[x.at(b, i, j, ch)]);
}

template <typename T>
void activation_backward_reference(Activation kind, NhwcView<const T> y, NhwcView<const T> grad_y,
                                   NhwcView<T> grad_x) {
  check_backward("activation_backward_reference", y, grad_y, grad_x);
  for (int b = 0; b < y.n; ++b)
    for (int i = 0; i < y.h; ++i)
      for (int j = 0; j < y.w; ++j)
        for (int ch = 0; ch < y.c; ++ch)
          grad_x.data[grad_x.at(b, i, j, ch)] =
              grad_y.data[grad_y.at(b, i, j, ch)] * activation_gradient_from_output(kind, y.data[y.at(b, i, j, ch)]);
}

void activation_forward_cpu(Activation kind, ConstAct x, Act y) {
  check_forward("activation_forward_cpu", x, y);
  with_activation(kind, "activation", [&]<Activation A>() { forward_cpu<A>(x, y); });
}

void activation_backward_cpu(Activation kind, ConstAct y, ConstAct grad_y, Act grad_x) {
  check_backward("activation_backward_cpu", y, grad_y, grad_x);
  with_activation(kind, "activation", [&]<Activation A>() { backward_cpu<A>(y, grad_y, grad_x); });
}

template <typename T>
void activation_forward_cuda(Activation kind, NhwcView<const T> x, NhwcView<T> y, cudaStream_t stream) {
  check_forward("activation_forward_cuda", x, y);
  with_activation(kind, "activation", [&]<Activation A>() { forward_cuda<A, T>(x, y, stream); });
}

template <typename T>
void activation_backward_cuda(Activation kind, NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<T> grad_x,
                              cudaStream_t stream) {
  check_backward("activation_backward_cuda", y, grad_y, grad_x);
  with_activation(kind, "activation", [&]<Activation A>() { backward_cuda<A, T>(y, grad_y, grad_x, stream); });
}

#define YOLO_ACTIVATION_CUDA(T)                                                                                   \
  template void activation_forward_cuda<T>(Activation, NhwcView<const T>, NhwcView<T>, cudaStream_t);             \
  template void activation_backward_cuda<T>(Activation, NhwcView<const T>, NhwcView<const T>, NhwcView<T>,        \
                                            cudaStream_t);
YOLO_ACTIVATION_CUDA(float)
YOLO_ACTIVATION_CUDA(Bf16)
YOLO_ACTIVATION_CUDA(Fp16)
#undef YOLO_ACTIVATION_CUDA

template void activation_forward_reference<float>(Activation, NhwcView<const float>, NhwcView<float>);
template void activation_forward_reference<double>(Activation, NhwcView<const double>, NhwcView<double>);
template void activation_backward_reference<float>(Activation, NhwcView<const float>, NhwcView<const float>,
                                                   NhwcView<float>);
template void activation_backward_reference<double>(Activation, NhwcView<const double>, NhwcView<const double>,
                                                    NhwcView<double>);

}  // namespace yolo
