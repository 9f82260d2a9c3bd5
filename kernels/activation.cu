// Activations: reference loops, the fast CPU version (pixel chunks on the pool) and the CUDA
// kernels (elementwise, float4 where channel count, stride and alignment allow).
#include "kernels/activation.h"

#include <string>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

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
template <Activation A, int V>
__global__ void forward_kernel(ConstAct x, Act y, size_t total_units, unsigned units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_units; i += size_t(gridDim.x) * blockDim.x) {
    size_t p = i / units, ch = (i % units) * V;
    float v[V];
    load_floats<V>(x.data + p * x.stride + ch, v);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = activate<A>(v[j]);
    store_floats<V>(y.data + p * y.stride + ch, v);
  }
}

template <Activation A, int V>
__global__ void backward_kernel(ConstAct y, ConstAct grad_y, Act grad_x, size_t total_units, unsigned units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_units; i += size_t(gridDim.x) * blockDim.x) {
    size_t p = i / units, ch = (i % units) * V;
    float out[V], g[V];
    if constexpr (A != Activation::Linear) load_floats<V>(y.data + p * y.stride + ch, out);
    load_floats<V>(grad_y.data + p * grad_y.stride + ch, g);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (A != Activation::Linear) g[j] *= activation_gradient_from_output<A>(out[j]);
    }
    store_floats<V>(grad_x.data + p * grad_x.stride + ch, g);
  }
}

dim3 grid_for(size_t total_units) {
  size_t blocks = (total_units + kThreads - 1) / kThreads;
  return dim3(unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

template <Activation A>
void forward_cuda(ConstAct x, Act y, cudaStream_t stream) {
  if (x.elements() == 0) return;
  if (float4_view(x) && float4_view(y)) {
    size_t total = x.pixels() * size_t(x.c / 4);
    LAUNCH((forward_kernel<A, 4>), grid_for(total), dim3(kThreads), 0, stream, x, y, total, unsigned(x.c / 4));
  } else {
    size_t total = x.elements();
    LAUNCH((forward_kernel<A, 1>), grid_for(total), dim3(kThreads), 0, stream, x, y, total, unsigned(x.c));
  }
}

template <Activation A>
void backward_cuda(ConstAct y, ConstAct grad_y, Act grad_x, cudaStream_t stream) {
  if (y.elements() == 0) return;
  bool vec = float4_view(grad_y) && float4_view(grad_x) && (A == Activation::Linear || float4_view(y));
  if (vec) {
    size_t total = y.pixels() * size_t(y.c / 4);
    LAUNCH((backward_kernel<A, 4>), grid_for(total), dim3(kThreads), 0, stream, y, grad_y, grad_x, total,
           unsigned(y.c / 4));
  } else {
    size_t total = y.elements();
    LAUNCH((backward_kernel<A, 1>), grid_for(total), dim3(kThreads), 0, stream, y, grad_y, grad_x, total,
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

void activation_forward_cuda(Activation kind, ConstAct x, Act y, cudaStream_t stream) {
  check_forward("activation_forward_cuda", x, y);
  with_activation(kind, "activation", [&]<Activation A>() { forward_cuda<A>(x, y, stream); });
}

void activation_backward_cuda(Activation kind, ConstAct y, ConstAct grad_y, Act grad_x, cudaStream_t stream) {
  check_backward("activation_backward_cuda", y, grad_y, grad_x);
  with_activation(kind, "activation", [&]<Activation A>() { backward_cuda<A>(y, grad_y, grad_x, stream); });
}

template void activation_forward_reference<float>(Activation, NhwcView<const float>, NhwcView<float>);
template void activation_forward_reference<double>(Activation, NhwcView<const double>, NhwcView<double>);
template void activation_backward_reference<float>(Activation, NhwcView<const float>, NhwcView<const float>,
                                                   NhwcView<float>);
template void activation_backward_reference<double>(Activation, NhwcView<const double>, NhwcView<const double>,
                                                    NhwcView<double>);

}  // namespace yolo
