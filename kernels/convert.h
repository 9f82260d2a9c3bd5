// Element-wise conversion between storage types (float <-> Bf16/Fp16), rounded to nearest even
// (half_types.h): with --precision bf16/fp16 the input images become 16-bit activations, the
// 16-bit weight copy is made from the FP32 masters on load and resume, and 16-bit outputs are
// widened for readers that take FP32 (detection decode). Flat arrays of `count` elements; src
// and dst must not overlap. Throws yolo::Error for null pointers with count > 0.
#pragma once
#include <cstddef>

#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

// From/To: float -> Bf16, float -> Fp16, Bf16 -> float, Fp16 -> float.
template <typename From, typename To>
void convert_reference(const From* src, To* dst, size_t count);
template <typename From, typename To>
void convert_cuda(const From* src, To* dst, size_t count, cudaStream_t stream);

}  // namespace yolo
