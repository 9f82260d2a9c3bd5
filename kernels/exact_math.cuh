// FP32 arithmetic whose roundings the source fixes, for kernels whose FP32 and 16-bit
// instantiations must compute the same FP32 values (batchnorm, activations: the 16-bit op is
// the FP32 op's result rounded once). nvcc contracts a*b + c into one FFMA wherever its optimiser
// finds the pair, and what it finds depends on the code around it: in the batchnorm backward the
// FP32 instantiation fused grad_y*act' into "- grad_beta/m", the Fp16 one (whose branchy widening
// moved the product away) fused grad_beta*(1/m) instead (the H200's failure of 2026-12-04).
// __fmul_rn, __fadd_rn, __fsub_rn are never contracted, __fmaf_rn is always one fused operation,
// __fdiv_rn is IEEE division; the emulation's twins (runtime/emu/emu.h) keep all of that.
#pragma once
#include "kernels/activation.h"
#include "kernels/common.cuh"

namespace yolo {

// act(v) (activation.h) in exactly rounded steps: leaky's 0.1*v, logistic's 1 + e^-v and its
// division rounded on their own (not fused into expf's last multiply).
template <Activation A>
__device__ __forceinline__ float activate_rn(float v) {
  if constexpr (A == Activation::Leaky) {
    const float s = __fmul_rn(kLeakySlope, v);
    return v > s ? v : s;
  } else if constexpr (A == Activation::Relu) {
    return v > 0.0f ? v : 0.0f;
  } else if constexpr (A == Activation::Logistic) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
  } else {
    return v;
  }
}

// BatchNorm's apply for one element, before its rounding to the storage type: one subtraction, one
// FMA, the activation. The apply pass, its backward's recompute (batchnorm.cu) and the loads of a
// BatchNorm-normalized convolution input (normalized_input.cuh) all call this one expression.
template <Activation A>
__device__ __forceinline__ float normalized_output(float x, float mean, float scale, float shift) {
  return activate_rn<A>(__fmaf_rn(__fsub_rn(x, mean), scale, shift));
}

// d act / d v from the output y (activation.h): logistic's y (1 - y) as two rounded steps.
template <Activation A>
__device__ __forceinline__ float activation_gradient_rn(float y) {
  if constexpr (A == Activation::Logistic) return __fmul_rn(y, __fsub_rn(1.0f, y));
  else return activation_gradient_from_output<A>(y);  // constants: nothing to round
}

}  // namespace yolo
