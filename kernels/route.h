// Route (darknet's [route]): channel concatenation of 1 to 4 inputs of the same n, h, w.
//   forward   out[..., offset_i : offset_i + c_i] = inputs[i]      (offset_i = c_0 + ... + c_{i-1})
//   backward  grad_inputs[i] (+)= grad_out[..., offset_i : offset_i + c_i]
// out.c must equal the sum of the inputs' channels. The graph avoids the forward copy when
// producers can write straight into their slice of out; these ops cover the other cases (an
// input whose data already is its slice of out, same pointer and stride, is not copied).
// With accumulate the slice is added to each grad_inputs[i], otherwise it overwrites it.
// Views may be channel slices (stride > c). Bad shapes or arguments throw yolo::Error.
#pragma once
#include <span>

#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

constexpr int kRouteMaxInputs = 4;

template <typename T>
void route_forward_reference(std::span<const NhwcView<const T>> inputs, NhwcView<T> out);
void route_forward_cpu(std::span<const ConstAct> inputs, Act out);
void route_forward_cuda(std::span<const ConstAct> inputs, Act out, cudaStream_t stream);
// The 16-bit storage types (--precision bf16/fp16): copies exact, accumulation in FP32 rounded once.
void route_forward_cuda(std::span<const NhwcView<const Bf16>> inputs, NhwcView<Bf16> out, cudaStream_t stream);
void route_forward_cuda(std::span<const NhwcView<const Fp16>> inputs, NhwcView<Fp16> out, cudaStream_t stream);

template <typename T>
void route_backward_reference(NhwcView<const T> grad_out, std::span<const NhwcView<T>> grad_inputs, bool accumulate);
void route_backward_cpu(ConstAct grad_out, std::span<const Act> grad_inputs, bool accumulate);
void route_backward_cuda(ConstAct grad_out, std::span<const Act> grad_inputs, bool accumulate, cudaStream_t stream);
void route_backward_cuda(NhwcView<const Bf16> grad_out, std::span<const NhwcView<Bf16>> grad_inputs, bool accumulate,
                         cudaStream_t stream);
void route_backward_cuda(NhwcView<const Fp16> grad_out, std::span<const NhwcView<Fp16>> grad_inputs, bool accumulate,
                         cudaStream_t stream);

}  // namespace yolo
