// The convolution's three passes on Hopper's wgmma (issue 36, stage 2):
// conv2d_forward_tc's product (kernels/conv.h) for 16-bit T, on the main loop of kernels/wgmma_tiles.cuh. The im2col
// rows of A are gathered by the producer warpgroup with 16-byte cp.async in the 128-byte swizzle
// (8 channels of one pixel and tap per copy; zeros where the tap falls outside the image: TMA's
// tiled boxes cannot describe the gather), the weights arrive by TMA as the [c_out][k*k*c_in]
// matrix they are. Not called by the trainer yet: timed first beside conv2d_forward_tc and
// cuBLAS (tools/bench_wgmma.cu).
//   Needs current_device_runs_wgmma() (kernels/hopper.h), c_in a multiple of 8, `in`'s pixel
//   stride a multiple of 8 and its data and the weights 16-byte aligned; throws yolo::Error
//   otherwise. out may be a channel slice (any stride). bias: FP32 per output channel, or null.
#pragma once
#include "kernels/conv.h"
#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

template <typename T>
void conv2d_forward_wgmma(const Conv2dShape& shape, NhwcView<const T> in, const T* weights, const float* bias,
                          NhwcView<T> out, cudaStream_t stream);

// The backward data pass (grad_in = the gradient of conv2d_forward_wgmma's input, overwritten)
// for stride 1: an implicit GEMM over the input's pixels, n = c_in, k = (tap, c_out). A is
// grad_out gathered at the mirrored taps (cp.async, zeros outside the image), B the weights of
// one tap and 64 output channels a k-tile, read MN-major (their c_in rows as they lie) from two
// TMA boxes; one tensor map a tap. Needs stride 1, c_out a multiple of 64 (a k-tile stays in one
// tap), c_in a multiple of 8, grad_out's pixel stride a multiple of 8 and its data 16-byte aligned.
template <typename T>
void conv2d_backward_data_wgmma(const Conv2dShape& shape, NhwcView<const T> grad_out, const T* weights,
                                NhwcView<T> grad_in, cudaStream_t stream);

// The weight gradient (grad_weights = the sum over the batch's pixels, FP32, overwritten;
// kernels/conv_wgmma_weights.cu): the product grad_out^T (c_out x pixels) times the im2col of
// `in` (pixels x taps * c_in), both read MN-major: grad_out's pixel rows by TMA, the im2col rows
// gathered by cp.async. The pixels are split among blocks (partial sums in the workspace, then
// summed in a fixed order: deterministic; the workspace's size depends on the current device's
// SMs). Needs c_in and c_out multiples of 8, grad_out dense
// (stride c_out) and `in`'s pixel stride a multiple of 8, 16-byte aligned data. No bias gradient.
size_t conv2d_backward_weights_wgmma_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_backward_weights_wgmma(const Conv2dShape& shape, NhwcView<const T> in, NhwcView<const T> grad_out,
                                   float* grad_weights, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace yolo
