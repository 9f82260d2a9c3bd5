// Nearest-neighbour upsampling by an integer factor (darknet's [upsample], stride 2 in YOLOv3):
//   forward   out(b, y, x, ch) = in(b, y / s, x / s, ch)        out is (n, h*s, w*s, c)
//   backward  grad_in(b, y, x, ch) (+)= sum over dy, dx in [0, s) of grad_out(b, y*s+dy, x*s+dx, ch)
// The backward sum is a gather in a fixed order (dy, then dx), so it is deterministic; with
// accumulate the sum is added to grad_in, otherwise it overwrites grad_in.
// Views may be channel slices (stride > c). Bad shapes or arguments throw yolo::Error.
#pragma once
#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

template <typename T>
void upsample_forward_reference(NhwcView<const T> in, NhwcView<T> out, int factor);
void upsample_forward_cpu(ConstAct in, Act out, int factor);
// T: float, or the 16-bit storage types Bf16/Fp16 (sums in FP32, rounded once to T).
template <typename T>
void upsample_forward_cuda(NhwcView<const T> in, NhwcView<T> out, int factor, cudaStream_t stream);

template <typename T>
void upsample_backward_reference(NhwcView<const T> grad_out, NhwcView<T> grad_in, int factor, bool accumulate);
void upsample_backward_cpu(ConstAct grad_out, Act grad_in, int factor, bool accumulate);
template <typename T>
void upsample_backward_cuda(NhwcView<const T> grad_out, NhwcView<T> grad_in, int factor, bool accumulate,
                            cudaStream_t stream);

}  // namespace yolo
