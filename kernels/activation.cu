// Activations: reference loops, the fast CPU version (pixel chunks on the pool) and the CUDA
// kernels (elementwise, float4 where channel count, stride and alignment allow).
#include "kernels/activation.h"

#include <cstdint>
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
void check_view(const char* op, const char* name, const NhwcView<T>& v) {
  auto fail = [&](const std::string& why) { throw Error(std::string(op) + ": " + name + " " + why); };
  if (v.n < 0 || v.h < 0 || v.w < 0 || v.c < 0)
    fail("has a negative size (" + std::to_string(v.n) + "x" + std::to_string(v.h) + "x" + std::to_string(v.w) +
         "x" + std::to_string(v.c) + ")");
  if (v.stride < v.c) fail("stride " + std::to_string(v.stride) + " < channels " + std::to_string(v.c));
  if (v.elements() > 0 && v.data == nullptr) fail("is null");
}

template <typename A, typename B>
void check_same_shape(const char* op, const char* name_a, const A& a, const char* name_b, const B& b) {
  if (a.n != b.n || a.h != b.h || a.w != b.w || a.c != b.c)
    throw Error(std::string(op) + ": " + name_b + " is " + std::to_string(b.n) + "x" + std::to_string(b.h) + "x" +
                std::to_string(b.w) + "x" + std::to_string(b.c) + " but " + name_a + " is " + std::to_string(a.n) +
                "x" + std::to_string(a.h) + "x" + std::to_string(a.w) + "x" + std::to_string(a.c));
}

template <typename T>
void check_forward(const char* op, NhwcView<const T> x, NhwcView<T> y) {
  check_view(op, "x", x);
  check_view(op, "y", y);
  check_same_shape(op, "x", x, "y", y);
}

template <typename T>
void check_backward(const char* op, NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<T> grad_x) {
  check_view(op, "y", y);
  check_view(op, "grad_y", grad_y);
  check_view(op, "grad_x", grad_x);
  check_same_shape(op, "y", y, "grad_y", grad_y);
  check_same_shape(op, "y", y, "grad_x", grad_x);
}

// ---- CPU ------------------------------------------------------------------------------------

// One pixel's c channels, out[ch] = f(ch, in[ch]), in blocks of 8 through a local array: all
// loads before the stores (in place is safe) and fixed-size loops that g++ vectorizes at -O2.
template <typename F>
inline void map_channels(const float* in, float* out, int c, F f) {
  int ch = 0;
  for (; ch + 8 <= c; ch += 8) {
    float t[8];
    for (int j = 0; j < 8; ++j) t[j] = in[ch + j];
    for (int j = 0; j < 8; ++j) t[j] = f(ch + j, t[j]);
    for (int j = 0; j < 8; ++j) out[ch + j] = t[j];
  }
  for (; ch < c; ++ch) out[ch] = f(ch, in[ch]);
}

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

template <int V>
__device__ __forceinline__ void load(const float* p, float (&v)[V]) {
  if constexpr (V == 4) {
    float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    v[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store(float* p, const float (&v)[V]) {
  if constexpr (V == 4) {
    float4 t;
    t.x = v[0], t.y = v[1], t.z = v[2], t.w = v[3];
    *reinterpret_cast<float4*>(p) = t;
  } else {
    *p = v[0];
  }
}

// Each thread handles V consecutive channels of one pixel per step; `units` = c / V per pixel.
template <Activation A, int V>
__global__ void forward_kernel(ConstAct x, Act y, size_t total_units, unsigned units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_units; i += size_t(gridDim.x) * blockDim.x) {
    size_t p = i / units, ch = (i % units) * V;
    float v[V];
    load<V>(x.data + p * x.stride + ch, v);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = activate<A>(v[j]);
    store<V>(y.data + p * y.stride + ch, v);
  }
}

template <Activation A, int V>
__global__ void backward_kernel(ConstAct y, ConstAct grad_y, Act grad_x, size_t total_units, unsigned units) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total_units; i += size_t(gridDim.x) * blockDim.x) {
    size_t p = i / units, ch = (i % units) * V;
    float out[V], g[V];
    if constexpr (A != Activation::Linear) load<V>(y.data + p * y.stride + ch, out);
    load<V>(grad_y.data + p * grad_y.stride + ch, g);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (A != Activation::Linear) g[j] *= activation_gradient_from_output<A>(out[j]);
    }
    store<V>(grad_x.data + p * grad_x.stride + ch, g);
  }
}

template <typename T>
bool float4_ok(const NhwcView<T>& v) {
  return v.c % 4 == 0 && v.stride % 4 == 0 && reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
}

dim3 grid_for(size_t total_units) {
  size_t blocks = (total_units + kThreads - 1) / kThreads;
  return dim3(unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

template <Activation A>
void forward_cuda(ConstAct x, Act y, cudaStream_t stream) {
  if (x.elements() == 0) return;
  if (float4_ok(x) && float4_ok(y)) {
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
  bool vec = float4_ok(grad_y) && float4_ok(grad_x) && (A == Activation::Linear || float4_ok(y));
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

// Calls f.template operator()<A>() for the run-time kind.
template <typename F>
void dispatch(Activation kind, F&& f) {
  switch (kind) {
    case Activation::Linear: return f.template operator()<Activation::Linear>();
    case Activation::Leaky: return f.template operator()<Activation::Leaky>();
    case Activation::Relu: return f.template operator()<Activation::Relu>();
    case Activation::Logistic: return f.template operator()<Activation::Logistic>();
  }
  throw Error("activation: invalid kind " + std::to_string(int(kind)));
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
  dispatch(kind, [&]<Activation A>() { forward_cpu<A>(x, y); });
}

void activation_backward_cpu(Activation kind, ConstAct y, ConstAct grad_y, Act grad_x) {
  check_backward("activation_backward_cpu", y, grad_y, grad_x);
  dispatch(kind, [&]<Activation A>() { backward_cpu<A>(y, grad_y, grad_x); });
}

void activation_forward_cuda(Activation kind, ConstAct x, Act y, cudaStream_t stream) {
  check_forward("activation_forward_cuda", x, y);
  dispatch(kind, [&]<Activation A>() { forward_cuda<A>(x, y, stream); });
}

void activation_backward_cuda(Activation kind, ConstAct y, ConstAct grad_y, Act grad_x, cudaStream_t stream) {
  check_backward("activation_backward_cuda", y, grad_y, grad_x);
  dispatch(kind, [&]<Activation A>() { backward_cuda<A>(y, grad_y, grad_x, stream); });
}

template void activation_forward_reference<float>(Activation, NhwcView<const float>, NhwcView<float>);
template void activation_forward_reference<double>(Activation, NhwcView<const double>, NhwcView<double>);
template void activation_backward_reference<float>(Activation, NhwcView<const float>, NhwcView<const float>,
                                                   NhwcView<float>);
template void activation_backward_reference<double>(Activation, NhwcView<const double>, NhwcView<const double>,
                                                    NhwcView<double>);

}  // namespace yolo
