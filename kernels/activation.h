// Activations (darknet's): linear, leaky (slope 0.1), relu, logistic. Elementwise on NHWC views
// (channel slices allowed). The backward takes the activation's OUTPUT y, not its input: the
// derivative is a function of y for every kind here (darknet's convention), so a layer need not
// keep its pre-activation. The scalar helpers below are shared with the fused batchnorm.
#pragma once
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

enum class Activation { Linear, Leaky, Relu, Logistic };

constexpr float kLeakySlope = 0.1f;

// "linear", "leaky", "relu", "logistic" (darknet's cfg names); anything else throws yolo::Error
// naming the value.
Activation activation_from_name(const std::string& name);
const char* activation_name(Activation kind);

// act(v) for a kind known at compile time (kernels are instantiated per kind).
template <Activation A, typename T>
YOLO_HOST_DEVICE inline T activate(T v) {
  // max(v, slope*v) for 0 < slope < 1, written as a select the host compiler turns into maxps.
  if constexpr (A == Activation::Leaky) {
    T s = T(kLeakySlope) * v;
    return v > s ? v : s;
  }
  else if constexpr (A == Activation::Relu) return v > T(0) ? v : T(0);
  else if constexpr (A == Activation::Logistic) {
    if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + expf(-v));
    else return T(1) / (T(1) + exp(-v));
  } else return v;
}

// d act / d v, written as a function of the output y = act(v).
template <Activation A, typename T>
YOLO_HOST_DEVICE inline T activation_gradient_from_output(T y) {
  if constexpr (A == Activation::Leaky) return y > T(0) ? T(1) : T(kLeakySlope);
  else if constexpr (A == Activation::Relu) return y > T(0) ? T(1) : T(0);
  else if constexpr (A == Activation::Logistic) return y * (T(1) - y);
  else return T(1);
}

// Run-time kind versions (for the references and host code).
template <typename T>
T activate(Activation kind, T v) {
  switch (kind) {
    case Activation::Leaky: return activate<Activation::Leaky>(v);
    case Activation::Relu: return activate<Activation::Relu>(v);
    case Activation::Logistic: return activate<Activation::Logistic>(v);
    default: return v;
  }
}
template <typename T>
T activation_gradient_from_output(Activation kind, T y) {
  switch (kind) {
    case Activation::Leaky: return activation_gradient_from_output<Activation::Leaky>(y);
    case Activation::Relu: return activation_gradient_from_output<Activation::Relu>(y);
    case Activation::Logistic: return activation_gradient_from_output<Activation::Logistic>(y);
    default: return T(1);
  }
}

// Calls f.template operator()<A>() for the run-time kind: the bridge from an op's entry point to
// code instantiated per kind. An invalid kind throws yolo::Error naming `op`.
template <typename F>
void with_activation(Activation kind, const char* op, F&& f) {
  switch (kind) {
    case Activation::Linear: return f.template operator()<Activation::Linear>();
    case Activation::Leaky: return f.template operator()<Activation::Leaky>();
    case Activation::Relu: return f.template operator()<Activation::Relu>();
    case Activation::Logistic: return f.template operator()<Activation::Logistic>();
  }
  throw Error(std::string(op) + ": invalid activation kind " + std::to_string(int(kind)));
}

// Forward: y = act(x). x and y have the same n, h, w, c (strides may differ); y may alias x
// (the same view: in place).
template <typename T>
void activation_forward_reference(Activation kind, NhwcView<const T> x, NhwcView<T> y);
void activation_forward_cpu(Activation kind, ConstAct x, Act y);
// T: float, or the 16-bit storage types Bf16 and Fp16 (--precision bf16/fp16): computed in FP32,
// rounded once to T (round to nearest even).
template <typename T>
void activation_forward_cuda(Activation kind, NhwcView<const T> x, NhwcView<T> y, cudaStream_t stream);

// Backward: grad_x = grad_y * act'(from y), y being the forward's output. grad_x may alias
// grad_y (in place).
template <typename T>
void activation_backward_reference(Activation kind, NhwcView<const T> y, NhwcView<const T> grad_y,
                                   NhwcView<T> grad_x);
void activation_backward_cpu(Activation kind, ConstAct y, ConstAct grad_y, Act grad_x);
template <typename T>
void activation_backward_cuda(Activation kind, NhwcView<const T> y, NhwcView<const T> grad_y, NhwcView<T> grad_x,
                              cudaStream_t stream);

}  // namespace yolo
