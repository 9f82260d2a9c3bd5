// Max pooling as darknet's [maxpool] computes it (default padding = size - 1):
//   out_h = (h + pad - size) / stride + 1, the same for w      (size 2 stride 2: 416 -> 208;
//                                                                size 2 stride 1: 13 -> 13)
//   window of out(y, x): rows y*stride - pad/2 ... + size - 1, the same for columns; cells outside
//   the input are ignored (every window holds at least one cell).
// forward   out = the window's maximum, per channel; ties: the first maximum in row-major window
//           order. argmax (when not null) receives, per output element, the input pixel that won,
//           as iy * in.w + ix (index within the sample's h x w plane); it is a dense int32 array
//           laid out [n][out_h][out_w][c].
// backward  grad_in(b, iy, ix, ch) (+)= sum of grad_out over the outputs (in row-major order) whose
//           argmax is (iy, ix): a gather, deterministic. With accumulate the sum is added to
//           grad_in, otherwise it overwrites grad_in (zero where no output chose the cell).
// Views may be channel slices (stride > c). Bad shapes or arguments throw yolo::Error.
#pragma once
#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

// Output height (or width) for an input of `input` rows; throws for size or stride < 1.
int maxpool_output_size(int input, int size, int stride);

template <typename T>
void maxpool_forward_reference(NhwcView<const T> in, NhwcView<T> out, int* argmax, int size, int stride);
void maxpool_forward_cpu(ConstAct in, Act out, int* argmax, int size, int stride);
// T: float, or the 16-bit storage types Bf16/Fp16 (maxima exact; gradient sums in FP32, rounded
// once to T).
template <typename T>
void maxpool_forward_cuda(NhwcView<const T> in, NhwcView<T> out, int* argmax, int size, int stride,
                          cudaStream_t stream);

template <typename T>
void maxpool_backward_reference(NhwcView<const T> grad_out, const int* argmax, NhwcView<T> grad_in, int size, int stride,
                                bool accumulate);
void maxpool_backward_cpu(ConstAct grad_out, const int* argmax, Act grad_in, int size, int stride, bool accumulate);
template <typename T>
void maxpool_backward_cuda(NhwcView<const T> grad_out, const int* argmax, NhwcView<T> grad_in, int size, int stride,
                           bool accumulate, cudaStream_t stream);

}  // namespace yolo
