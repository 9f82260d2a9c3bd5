// Convolutions over inputs of a few channels (the image's 3), for the tensor-core passes
// (kernels/conv_tc.cu) whose reduction, k * k * c_in (27 for YOLOv3's first layer), is too short
// and too oddly sized for their tiles: every 16-byte chunk would be gathered element by element,
// and most of each MMA wasted. Direct convolution on CUDA cores instead, summing in FP32 from the
// stored T and rounding once: the forward (with BatchNorm's moments from what it wrote, as the
// tensor-core forward does) and the weight gradient (slices of the pixels, then a fixed-order sum:
// deterministic). Backward data is not needed there: nothing takes the image's gradient.
// Internal to conv_tc.cu, whose entry points send these shapes here.
#pragma once
#include <cstddef>

#include "kernels/common.cuh"
#include "kernels/conv.h"

namespace yolo::small_c {

// Whether these kernels take the shape: c_in <= 4, k * k * c_in <= 36 (the receptive field lives
// in registers), and c_out small enough for one block's 256 threads to own all the weight
// gradient's (8 output channel x 4 tap) blocks.
bool takes(const Conv2dShape& s);

// The forward: one block per kPixels output pixels (its moments block).
constexpr int kPixels = 256;
int forward_moment_blocks(const Conv2dShape& s);
template <typename T>
void forward(const Conv2dShape& s, NhwcView<const T> in, const T* weights, const float* bias, NhwcView<T> out,
             ConvMoments moments, cudaStream_t stream);

// The weight gradient into FP32 dW [c_out][k][k][c_in]; `workspace` holds one partial sum per
// slice of pixels (weights_workspace_bytes; the slice count depends on the current device's SMs).
size_t weights_workspace_bytes(const Conv2dShape& s);
template <typename T>
void backward_weights(const Conv2dShape& s, NhwcView<const T> in, NhwcView<const T> grad_out, float* grad_weights,
                      void* workspace, cudaStream_t stream);

}  // namespace yolo::small_c
