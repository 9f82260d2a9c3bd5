// Shortcut (darknet's [shortcut] with activation=linear, the residual add of YOLOv3):
//   forward   out = a + b                       (a, b and out of the same shape; out may alias a or b)
//   backward  grad_a (+)= grad_out, grad_b (+)= grad_out
// accumulate_a / accumulate_b choose += (the input's gradient already holds another consumer's
// part) or = (this is its first writer). A gradient view with a null data pointer is not
// written (the graph aliases it with grad_out, or the input needs no gradient). grad_a or
// grad_b may alias grad_out when its accumulate flag is false.
// Views may be channel slices (stride > c). Bad shapes or arguments throw yolo::Error.
#pragma once
#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

template <typename T>
void shortcut_forward_reference(NhwcView<const T> a, NhwcView<const T> b, NhwcView<T> out);
void shortcut_forward_cpu(ConstAct a, ConstAct b, Act out);
// T: float, or the 16-bit storage types Bf16/Fp16 (sums in FP32, rounded once to T).
template <typename T>
void shortcut_forward_cuda(NhwcView<const T> a, NhwcView<const T> b, NhwcView<T> out, cudaStream_t stream);

template <typename T>
void shortcut_backward_reference(NhwcView<const T> grad_out, NhwcView<T> grad_a, NhwcView<T> grad_b, bool accumulate_a,
                                 bool accumulate_b);
void shortcut_backward_cpu(ConstAct grad_out, Act grad_a, Act grad_b, bool accumulate_a, bool accumulate_b);
template <typename T>
void shortcut_backward_cuda(NhwcView<const T> grad_out, NhwcView<T> grad_a, NhwcView<T> grad_b, bool accumulate_a,
                            bool accumulate_b, cudaStream_t stream);

}  // namespace yolo
