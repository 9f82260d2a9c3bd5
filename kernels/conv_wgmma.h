// The convolution's three passes on Hopper's wgmma (issue 36, stage 2):
// conv2d_forward_tc's product (kernels/conv.h) for T = Bf16, Fp16 or float (TF32), on the main
// loop of kernels/wgmma_tiles.cuh. The im2col rows of A arrive by TMA's im2col mode where it can
// describe them (`input`, below: one box a k-tile, 128 output pixels of one tap), or are gathered
// by the producer warpgroup with 16-byte cp.async in the 128-byte swizzle (8 channels of one
// pixel and tap per copy, 4 in TF32; zeros where the tap falls outside the image); the weights
// arrive by TMA as the [c_out][k*k*c_in] matrix they are. TF32 reads the
// FP32 operands truncated (kernels/wgmma.cuh: the low 13 bits ignored; mma.sync's TF32 rounds to
// nearest), so the two families' TF32 results differ in their last bits. The convolutions of
// kernels/conv.h run it where the planner chooses it (kernels/tc_plan.h); tools/bench_wgmma.cu
// times it beside conv2d_forward_tc and cuBLAS.
//   Needs current_device_runs_wgmma() (kernels/hopper.h), c_in a multiple of 8, `in`'s pixel
//   stride a multiple of 16 bytes and its data 16-byte aligned, the weights 128-byte aligned (a
//   swizzled tensor map's base: tma::swizzled_base_fits), at most 65535 * 128 output pixels;
//   throws yolo::Error otherwise. out may be a channel slice (any stride). bias:
//   FP32 per output channel, or null. moments: BatchNorm's statistics of the stored output, per
//   block of 128 output pixels, as conv2d_forward_tc writes them (kernels/conv.h, ConvMoments).
//   norm (kernels/conv.h, NormalizedInput): BatchNorm's apply on the input, done by each producer
//   thread on its own row in shared memory once its copies (or TMA's box) landed, before the
//   stage is announced (the weight gradient's producers do the same).
//   input: how A reaches shared memory. Auto: TMA's im2col mode where
//   conv2d_forward_wgmma_im2col_takes says it can and the device passed its self-check
//   (kernels/wgmma_check.h), the gather otherwise; Gather and Im2col force one (Im2col throws
//   where it cannot).
#pragma once
#include "kernels/conv.h"
#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

enum class WgmmaInput { Auto, Gather, Im2col };
// The environment variable YOLO_TMA_IM2COL=off (or 0) makes Auto gather in every pass (an A/B
// switch, or a workaround); on, 1, auto or unset leave Auto's choice; anything else throws
// yolo::Error naming it.
bool tma_im2col_allowed_by_environment();
// The blocks the three passes launch for `tiles` tiles of 128x128 outputs: one an
// SM of the current device (persistent blocks, each walking its share of the tiles), at most one
// a tile. YOLO_WGMMA_PERSISTENT=off (or 0) gives a block a tile, as before (an A/B switch for the
// GPU: the same kernels, each block then walking one tile), parsed as YOLO_WGMMA is.
unsigned wgmma_conv_blocks(long long tiles);
// While one lives, wgmma_conv_blocks gives at most `blocks` on this thread: a small problem's
// few blocks then walk several tiles each (the self-check, kernels/wgmma_check.h; tests).
class WgmmaBlockCap {
 public:
  explicit WgmmaBlockCap(unsigned blocks);
  ~WgmmaBlockCap();
  WgmmaBlockCap(const WgmmaBlockCap&) = delete;
  WgmmaBlockCap& operator=(const WgmmaBlockCap&) = delete;

 private:
  unsigned previous_;
};

template <typename T>
void conv2d_forward_wgmma(const Conv2dShape& shape, NhwcView<const T> in, const T* weights, const float* bias,
                          NhwcView<T> out, cudaStream_t stream, ConvMoments moments = {}, NormalizedInput norm = {},
                          WgmmaInput input = WgmmaInput::Auto);
// Whether TMA's im2col mode can bring the forward's A: c_in a whole number of k-tiles (64 in 16
// bits, 32 in TF32: a k-tile then lies within one tap), a stride of at most 8 and a kernel of at
// most 16 (the map's traversal stride and tap offsets), `in`'s pixel stride a multiple of 16
// bytes and its data 128-byte aligned (tma::swizzled_base_fits: a channel slice may not be, and
// gathers). With BatchNorm applied in the loads (`norm`) the producer
// warpgroup applies it to the rows TMA landed (each thread its own), then announces the stage.
template <typename T>
bool conv2d_forward_wgmma_im2col_takes(const Conv2dShape& shape, NhwcView<const T> in);

// The backward data pass (kernels/conv_wgmma_data.cu; grad_in = the gradient of
// conv2d_forward_wgmma's input, overwritten, or added to what grad_in holds when accumulate: in
// FP32, rounded once): an implicit GEMM per parity class of the input's pixels (one class at
// stride 1; stride^2 classes, each reached by its own taps, otherwise), n = c_in, k = (the class's
// taps, c_out). A is grad_out at the mirrored taps (zeros outside the image; by im2col or
// gathered by cp.async, below), B the weights of one tap and a k-tile of
// output channels by TMA, one tensor map over every tap: 16-bit weights read MN-major (their c_in
// rows as they lie, two boxes); TF32 (T = float; wgmma cannot transpose it) from a copy transposed
// to [tap][c_in][c_out] in the workspace (conv2d_backward_data_wgmma_workspace_bytes: 0 in 16
// bits), read K-major and truncated as the forward's operands are. Needs a 1x1 or 3x3 kernel, a
// stride of at most 255, c_out a multiple of 64, c_in a multiple of 8, grad_out's pixel stride a
// multiple of 16 bytes and its data 16-byte aligned, the weights (16 bits) or the workspace (TF32)
// 128-byte aligned, at most 65535 * 128 input pixels a class.
template <typename T>
size_t conv2d_backward_data_wgmma_workspace_bytes(const Conv2dShape& shape);
// A by TMA's im2col mode, as `input` says (the forward's rule, with
// conv2d_backward_data_wgmma_im2col_takes: a stride of at most 2), one map of grad_out per class:
// a box is 128 class rows at one tap.
template <typename T>
void conv2d_backward_data_wgmma(const Conv2dShape& shape, NhwcView<const T> grad_out, const T* weights,
                                NhwcView<T> grad_in, bool accumulate, cudaStream_t stream, void* workspace = nullptr,
                                size_t workspace_bytes = 0, WgmmaInput input = WgmmaInput::Auto);
template <typename T>
bool conv2d_backward_data_wgmma_im2col_takes(const Conv2dShape& shape, NhwcView<const T> grad_out);
// Whether the wgmma kernels take this shape, per pass (what the views do not decide); the planner
// asks it through conv2d_tc_problem (kernels/conv.h).
bool conv2d_forward_wgmma_takes(const Conv2dShape& shape);
bool conv2d_backward_data_wgmma_takes(const Conv2dShape& shape);
bool conv2d_backward_weights_wgmma_takes(const Conv2dShape& shape);

// The weight gradient (grad_weights = the sum over the batch's pixels, FP32, overwritten;
// kernels/conv_wgmma_weights.cu): the product grad_out^T (c_out x pixels) times the im2col of
// `in` (pixels x taps * c_in), both read MN-major: grad_out's pixel rows by TMA, the im2col rows
// by TMA's im2col mode (two boxes a k-tile: 64 pixels by 64 channels of one tap) or gathered by
// cp.async, as `input` says (the forward's rule, with
// conv2d_backward_weights_wgmma_im2col_takes: c_in a multiple of 64; BatchNorm applied by the
// producers to the rows TMA landed, as in the forward). The pixels are split among blocks
// (partial sums in the workspace, then summed in a fixed order: deterministic; the workspace's
// size depends on the current device's SMs). Needs c_in and c_out multiples of 8, grad_out dense
// (stride c_out) and 128-byte aligned, `in`'s pixel stride a multiple of 8 and its data 16-byte
// aligned (128 for im2col). No bias gradient.
size_t conv2d_backward_weights_wgmma_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_backward_weights_wgmma(const Conv2dShape& shape, NhwcView<const T> in, NhwcView<const T> grad_out,
                                   float* grad_weights, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                   NormalizedInput norm = {}, WgmmaInput input = WgmmaInput::Auto);
template <typename T>
bool conv2d_backward_weights_wgmma_im2col_takes(const Conv2dShape& shape, NhwcView<const T> in);

}  // namespace yolo
