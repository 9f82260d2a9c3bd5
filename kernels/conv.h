// 2-D convolution, NHWC activations (views: channel slices allowed), KRSC weights
// [c_out][k][k][c_in], odd square kernels with padding k/2 ("same" at stride 1), any stride,
// optional bias. Forward, backward to the input (data) and backward to the weights (and bias).
// The CUDA versions are implicit GEMMs on the shared tiled main loop of gemm_tiles.cuh (no
// im2col buffer); every pass may split its reduction when that fills the GPU better, which
// needs a workspace (sizes below; partial sums reduced by a fixed-order second pass).
#pragma once
#include <cstddef>

#include "kernels/activation.h"
#include "kernels/precision.h"
#include "kernels/tc_plan.h"
#include "kernels/tensor.h"

namespace yolo {

struct Conv2dShape {
  int n = 0, h = 0, w = 0;       // batch and input height, width
  int c_in = 0, c_out = 0;
  int k = 1, stride = 1;         // kernel size (odd), stride

  int pad() const { return k / 2; }
  int out_h() const { return (h + 2 * pad() - k) / stride + 1; }
  int out_w() const { return (w + 2 * pad() - k) / stride + 1; }
  size_t weight_count() const { return size_t(c_out) * k * k * c_in; }
  // Throws yolo::Error for nonsense: n < 0, h, w, c_in, c_out, stride < 1, an even or
  // non-positive k, or sizes whose indices overflow 32 bits.
  void validate() const;
};

// BatchNorm's statistics from the CUDA forwards' epilogue (issue 15): with `partials` set, the
// forward also writes, per block b of output pixels and channel ch, the (mean, M2) of the stored
// output (bias included, after rounding to T) at partials[(b * c_out + ch) * 2 + {0, 1}] and the
// block's pixel count at counts[b]: what batchnorm's ..._from_moments op reads, so that the
// training forward reads its input once. Blocks: a tile of output pixels, or with split-K a row
// block of the reduction pass (conv2d_forward_moment_blocks / conv2d_forward_tc_moment_blocks:
// they follow the plan, hence the device). The output's bits are those without moments.
struct ConvMoments {
  float* partials = nullptr;  // [blocks][c_out][2], device memory
  float* counts = nullptr;    // [blocks]
};
int conv2d_forward_moment_blocks(const Conv2dShape& shape);

// BatchNorm's normalise-and-activate applied where a tensor-core convolution loads its input
// (issue 37: the BatchNorm's output is then never written, nor read back). The view handed to
// the forward and the weight gradient is the BatchNorm's input x; the convolution reads, per
// channel ch,  act(fma(x - table[4 ch], table[4 ch + 1], table[4 ch + 2]))  rounded to T, as
// batchnorm.h's apply computes it (the table from batchnorm_input_table_cuda: mean, scale and
// shift): the bits the apply would have stored. The image's zero padding stays zero. A null
// table: the input as it is. Device pointers; the table 16-byte aligned.
struct NormalizedInput {
  const float* table = nullptr;  // [c_in][4]
  Activation act = Activation::Linear;
  YOLO_HOST_DEVICE explicit operator bool() const { return table != nullptr; }
};

// out[b, y, x, o] = bias[o] + sum_{r, s, i} in[b, y*stride - pad + r, x*stride - pad + s, i] *
// weights[o, r, s, i] (zero outside the image). in is n x h x w x c_in, out n x out_h x out_w x
// c_out; bias may be null (none). The CUDA version needs conv2d_forward_workspace_bytes(shape)
// bytes of device workspace, 16-byte aligned (0 for many shapes; then workspace may be null);
// the others ignore it.
size_t conv2d_forward_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_forward_reference(const Conv2dShape& shape, NhwcView<const T> in, const T* weights, const T* bias,
                              NhwcView<T> out, void* workspace, size_t workspace_bytes);
void conv2d_forward_cpu(const Conv2dShape& shape, ConstAct in, const float* weights, const float* bias, Act out,
                        void* workspace, size_t workspace_bytes);
void conv2d_forward_cuda(const Conv2dShape& shape, ConstAct in, const float* weights, const float* bias, Act out,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream, ConvMoments moments = {});

// grad_in (=, or += when accumulate) d loss / d in for the forward above, given grad_out.
// The CUDA version needs conv2d_backward_data_workspace_bytes(shape) bytes of device
// workspace, 16-byte aligned (0 for many shapes; then workspace may be null); the others
// ignore it. Workspace sizes are for the current device (they depend on its SM count).
size_t conv2d_backward_data_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_backward_data_reference(const Conv2dShape& shape, NhwcView<const T> grad_out, const T* weights,
                                    NhwcView<T> grad_in, bool accumulate, void* workspace, size_t workspace_bytes);
void conv2d_backward_data_cpu(const Conv2dShape& shape, ConstAct grad_out, const float* weights, Act grad_in,
                              bool accumulate, void* workspace, size_t workspace_bytes);
void conv2d_backward_data_cuda(const Conv2dShape& shape, ConstAct grad_out, const float* weights, Act grad_in,
                               bool accumulate, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// grad_weights (=) d loss / d weights, summed over the batch and every pixel; grad_bias (=) the
// sum of grad_out per channel, skipped when null. The CUDA version splits the pixel sum into
// chunks (partials in the workspace, then a fixed-order second pass: deterministic) and needs
// conv2d_backward_weights_workspace_bytes(shape) bytes; the others ignore it.
size_t conv2d_backward_weights_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_backward_weights_reference(const Conv2dShape& shape, NhwcView<const T> in, NhwcView<const T> grad_out,
                                       T* grad_weights, T* grad_bias, void* workspace, size_t workspace_bytes);
void conv2d_backward_weights_cpu(const Conv2dShape& shape, ConstAct in, ConstAct grad_out, float* grad_weights,
                                 float* grad_bias, void* workspace, size_t workspace_bytes);
void conv2d_backward_weights_cuda(const Conv2dShape& shape, ConstAct in, ConstAct grad_out, float* grad_weights,
                                  float* grad_bias, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- tensor cores (kernels/conv_tc.cu) ---------------------------------------------------------
// The same three passes as implicit GEMMs on mma.sync, in the precision of T (precision.h):
// T = float runs TF32, Bf16 BF16, Fp16 FP16; activations, weights and activation gradients are
// T, bias, weight and bias gradients FP32; every sum accumulates in FP32 and split reductions
// finish in a fixed order (deterministic). Device pointers only (no CPU twin: the FP32 _cpu and
// _reference versions above are the oracle). They throw yolo::Error when the current device
// cannot run the precision (require_precision). Workspace rules as for the FP32 versions.
template <typename T>
size_t conv2d_forward_tc_workspace_bytes(const Conv2dShape& shape);
template <typename T>
int conv2d_forward_tc_moment_blocks(const Conv2dShape& shape);
template <typename T>
void conv2d_forward_tc(const Conv2dShape& shape, NhwcView<const T> in, const T* weights, const float* bias,
                       NhwcView<T> out, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       ConvMoments moments = {}, NormalizedInput norm = {});
template <typename T>
size_t conv2d_backward_data_tc_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_backward_data_tc(const Conv2dShape& shape, NhwcView<const T> grad_out, const T* weights,
                             NhwcView<T> grad_in, bool accumulate, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream);
template <typename T>
size_t conv2d_backward_weights_tc_workspace_bytes(const Conv2dShape& shape);
template <typename T>
void conv2d_backward_weights_tc(const Conv2dShape& shape, NhwcView<const T> in, NhwcView<const T> grad_out,
                                float* grad_weights, float* grad_bias, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream, NormalizedInput norm = {});
// A pass as the tensor-core planner sees it (kernels/tc_plan.h: choose_plan, predict), for a
// precision that runs on tensor cores (tf32, bf16, fp16); for printing plans and predictions.
tc::TcProblem conv2d_tc_problem(const Conv2dShape& shape, tc::TcPass pass, Precision precision);
// Whether conv2d_forward_tc and conv2d_backward_weights_tc run this shape on CUDA cores instead
// (kernels/conv_small_c.h: inputs of up to 4 channels, such as the image; FP32 sums, the same
// contract); its backward data stays on tensor cores.
// The forward and the weight gradient take a NormalizedInput (above) except on those: there they
// throw. Without cp.async (the loaders transform in registers) on mma.sync; on wgmma the producer
// transforms its own rows in shared memory before it announces them.
bool conv2d_tc_small_channels(const Conv2dShape& shape);

}  // namespace yolo
