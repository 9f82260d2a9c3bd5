// The op library, as the graph sees it: one entry point per op, taking an OpContext, with the
// semantics of its family header (kernels/<family>.h: the naive reference `*_reference`, the
// fast CPU version `*_cpu` and the CUDA launcher `*_cuda`; see kernels/README.md). The context
// says where the op runs, and the entry point dispatches there:
//   - a CPU stream: the fast CPU version, queued as host work on the stream;
//   - a GPU's stream: the CUDA launcher;
//   - an emulated GPU's stream: the same launcher, its kernels run by runtime/emu in the
//     stream's order.
// Every op is thus queued after the stream's earlier work, whatever the device: read results
// back with copy_bytes on the stream and synchronise it (runtime/memory.h). Pointers are device
// memory of the stream's device (host memory for the CPU). Views and small arguments are taken
// by value at the call.
#pragma once
#include <cstddef>

#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/convert.h"
#include "kernels/detect.h"
#include "kernels/gemm.h"
#include "kernels/maxpool.h"
#include "kernels/route.h"
#include "kernels/sgd.h"
#include "kernels/shortcut.h"
#include "kernels/softmax.h"
#include "kernels/tensor.h"
#include "kernels/upsample.h"
#include "kernels/yolo_loss.h"
#include "runtime/stream.h"

namespace yolo {

struct OpContext {
  Stream* stream = nullptr;       // where the op is queued; its device picks the implementation
  void* workspace = nullptr;      // device workspace for the ops that take one
  size_t workspace_bytes = 0;
  // What the ops run in on a GPU or an emulated GPU (kernels/precision.h): fp32 (CUDA cores), tf32
  // (tensor cores, FP32 tensors), or bf16/fp16: tensor cores, and every activation view, every
  // activation gradient and the conv/connected weights passed to conv2d_*/gemm hold Bf16/Fp16
  // elements. Their types here stay float (one op API for every precision): the views' counts and
  // strides are elements, and only the op library reads the data, as the storage type this says.
  // Statistics, gamma/beta, biases, parameter gradients, losses and softmax probabilities stay
  // FP32 in every precision; gemm's A^T B layout (a weight gradient) writes FP32. The CPU backend
  // runs fp32 only (the ops throw for the others there).
  Precision precision = Precision::Fp32;
};

// Workspace bytes conv2d_* (all three passes) and gemm need in `precision` on the current device.
size_t conv2d_workspace_bytes(Precision precision, const Conv2dShape& shape);
size_t gemm_workspace_bytes(Precision precision, const GemmShape& shape);
// Blocks of BatchNorm statistics conv2d_forward writes with `moments` set (conv.h, ConvMoments),
// in `precision` on the current device (GPUs and emulated GPUs only).
int conv2d_forward_moment_blocks(Precision precision, const Conv2dShape& shape);

// ---- activation.h ---------------------------------------------------------------------------
void activation_forward(const OpContext& c, Activation kind, ConstAct x, Act y);
void activation_backward(const OpContext& c, Activation kind, ConstAct y, ConstAct grad_y, Act grad_x);

// ---- batchnorm.h: fused with an activation, and the phases of synchronised BatchNorm --------
// The forwards' `residual` (GPUs only; batchnorm.h): a shortcut folded into the apply.
void batchnorm_activation_forward_training(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                           const float* beta, Act y, float* saved_mean, float* saved_var,
                                           float* running_mean, float* running_var, ConstAct residual = {});
// GPUs only: from the moments conv2d_forward wrote (batchnorm.h); the workspace must also hold
// batchnorm_from_moments_workspace_bytes(blocks, c).
void batchnorm_activation_forward_from_moments(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                               const float* beta, Act y, const float* partials, const float* counts,
                                               int blocks, float* saved_mean, float* saved_var, float* running_mean,
                                               float* running_var, ConstAct residual = {});
// GPUs only: --sync-bn's sums and centered squares from those moments (x not read).
void batchnorm_sums_from_moments(const OpContext& c, int channels, const float* partials, const float* counts,
                                 int blocks, float* sums);
void batchnorm_centered_squares_from_moments(const OpContext& c, int channels, const float* partials,
                                             const float* counts, int blocks, const float* sums, double total_pixels,
                                             float* squares);
// GPUs only: conv.h's NormalizedInput table from these statistics (batchnorm.h). The training
// forwards take an empty y there for the statistics alone.
void batchnorm_input_table(const OpContext& c, int channels, const float* mean, const float* var, const float* gamma,
                           const float* beta, float* table);
void batchnorm_activation_forward_inference(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                            const float* beta, const float* running_mean, const float* running_var,
                                            Act y, ConstAct residual = {});
// The backwards' `recompute` (GPUs only; batchnorm.h): y empty, recomputed from x.
void batchnorm_activation_backward(const OpContext& c, Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                   const float* gamma, const float* saved_mean, const float* saved_var, Act grad_x,
                                   float* grad_gamma, float* grad_beta, BatchNormAffine<float> recompute = {});
void batchnorm_sums(const OpContext& c, ConstAct x, float* sums);
void batchnorm_centered_squares(const OpContext& c, ConstAct x, const float* sums, double total_pixels, float* squares);
void batchnorm_activation_forward_from_sums(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                            const float* beta, Act y, const float* sums, const float* squares,
                                            double total_pixels, float* saved_mean, float* saved_var,
                                            float* running_mean, float* running_var, ConstAct residual = {});
void batchnorm_activation_backward_sums(const OpContext& c, Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                        const float* saved_mean, const float* saved_var, float* grad_gamma,
                                        float* grad_beta, float* sums2, BatchNormAffine<float> recompute = {});
void batchnorm_activation_backward_apply(const OpContext& c, Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                         const float* gamma, const float* saved_mean, const float* saved_var,
                                         const float* sums2, double total_pixels, Act grad_x,
                                         BatchNormAffine<float> recompute = {});

// ---- conv.h, gemm.h -------------------------------------------------------------------------
// moments (GPUs only): also BatchNorm's statistics of the output, from the epilogue (conv.h).
// norm: the input read through BatchNorm's apply (conv.h, NormalizedInput), where
// conv2d_takes_normalized_input says the kernels can (tensor cores on a GPU); they throw elsewhere.
bool conv2d_takes_normalized_input(const OpContext& c, const Conv2dShape& shape);
void conv2d_forward(const OpContext& c, const Conv2dShape& shape, ConstAct in, const float* weights, const float* bias,
                    Act out, ConvMoments moments = {}, NormalizedInput norm = {});
void conv2d_backward_data(const OpContext& c, const Conv2dShape& shape, ConstAct grad_out, const float* weights,
                          Act grad_in, bool accumulate);
void conv2d_backward_weights(const OpContext& c, const Conv2dShape& shape, ConstAct in, ConstAct grad_out,
                             float* grad_weights, float* grad_bias, NormalizedInput norm = {});
void gemm(const OpContext& c, const GemmShape& shape, const float* a, const float* b, const float* bias, float* out,
          bool accumulate);

// ---- shortcut.h, route.h, upsample.h, maxpool.h ----------------------------------------------
void shortcut_forward(const OpContext& c, ConstAct a, ConstAct b, Act out);
void shortcut_backward(const OpContext& c, ConstAct grad_out, Act grad_a, Act grad_b, bool accumulate_a,
                       bool accumulate_b);
void route_forward(const OpContext& c, std::span<const ConstAct> inputs, Act out);
void route_backward(const OpContext& c, ConstAct grad_out, std::span<const Act> grad_inputs, bool accumulate);
void upsample_forward(const OpContext& c, ConstAct in, Act out, int factor);
void upsample_backward(const OpContext& c, ConstAct grad_out, Act grad_in, int factor, bool accumulate);
void maxpool_forward(const OpContext& c, ConstAct in, Act out, int* argmax, int size, int stride);
void maxpool_backward(const OpContext& c, ConstAct grad_out, const int* argmax, Act grad_in, int size, int stride,
                      bool accumulate);

// ---- losses: yolo_loss.h, softmax.h -----------------------------------------------------------
void yolo_loss(const OpContext& c, ConstAct input, const YoloLossConfig& config, const YoloTruth* truths,
               const int* truth_counts, int truth_stride, Act grad, YoloLossStats* stats);
// bad_label (device memory): set as softmax_cross_entropy_cuda does; the CPU version throws for a
// label out of range instead (the error reaches the host at the stream's next synchronise).
// grad_scale: multiplies the stored gradient (fp16 loss scaling; GPUs only, 1 on the CPU), or the
// device float at grad_scale_at when set (read when the kernel runs: CUDA Graphs).
void softmax_cross_entropy(const OpContext& c, const float* logits, const int* labels, int n, int k, float* loss,
                           float* grad_logits, float* probabilities, int* bad_label, float grad_scale = 1.0f,
                           const float* grad_scale_at = nullptr);

// ---- sgd.h: segments and flag in device memory -----------------------------------------------
// copy16 (precision bf16/fp16 only): the 16-bit weight copy, written in the same pass (sgd.h).
void sgd_update(const OpContext& c, float* w, const float* g, float* u, const SgdSegment* segments, int segment_count,
                size_t begin, size_t end, SgdHyper hyper, void* copy16 = nullptr);
void grad_nonfinite_check(const OpContext& c, const float* g, size_t count, int* flag);
// fp16's loss scale on the device (sgd.h loss_scale_step); GPUs only (the CPU backend has no fp16).
void loss_scale_update(const OpContext& c, const int* nonfinite, LossScaleLive* s, int growth_interval);

// ---- convert.h: FP32 <-> the 16-bit storage type of c's precision (bf16/fp16 only) --------------
void to_storage(const OpContext& c, const float* src, void* dst, size_t count);
void from_storage(const OpContext& c, const void* src, float* dst, size_t count);

// ---- detect.h: decode into a device buffer (as yolo_decode_cuda), NMS ----------------------------
void yolo_decode(const OpContext& c, ConstAct input, const YoloLossConfig& config, float threshold, Detection* out,
                 int capacity, int* count);
void nms(const OpContext& c, const Detection* detections, int count, float iou_threshold, int* keep);

}  // namespace yolo
