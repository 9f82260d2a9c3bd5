// Batch normalisation over NHWC views (channel slices allowed), fused with an activation
// (every YOLOv3 conv but three is conv -> BN -> leaky): one op family, with the plain batchnorm
// as the Activation::Linear case.
//
// Training: per channel, mean and biased variance over the m = n*h*w pixels (Welford within a
// block of pixels, Chan merges of the blocks in a fixed order: stable and deterministic), then
//   y = act(gamma * (x - mean) / sqrt(var + eps) + beta),    eps = 1e-5.
// The batch mean and biased variance are saved for the backward, and the running statistics
// follow the cuDNN convention darknet's GPU training uses:
//   running_mean = 0.99 running_mean + 0.01 mean,   running_var = 0.99 running_var + 0.01 var m/(m-1)
// (m = 1: the variance itself). Inference uses the running statistics instead.
// Backward (training mode), from the activation's OUTPUT y (see activation.h):
//   g = grad_y * act'(y);  grad_beta = sum g;  grad_gamma = sum g xhat  (sums over n*h*w, written =);
//   grad_x = gamma / sqrt(var + eps) * (g - grad_beta/m - xhat grad_gamma/m)  (written =).
// Aliasing: y may alias x, grad_x may alias grad_y (the same view: in place). grad_y is only read.
// gamma, beta, the statistics and the gradients of gamma and beta are arrays of c floats.
// A folded shortcut: the CUDA forwards take an optional `residual` (a view of x's shape, or empty):
//   y = act(gamma * (x - mean) / sqrt(var + eps) + beta) + residual,
// the sum in FP32 rounded once to T. y is then the shortcut's output and act's own output is
// stored nowhere; its backward recomputes it (below). With FP32 storage y has the bits of the
// unfused apply followed by shortcut_forward; with 16-bit storage it skips their intermediate
// rounding.
// Statistics only: the CUDA training forwards take an empty y (and no residual) to compute the
// saved and running statistics alone, for a BatchNorm whose apply runs where the next
// convolutions load their input (conv.h, NormalizedInput; its table from
// batchnorm_input_table_cuda below). Nothing then stores y.
// Store or recompute: the CUDA backwards take y, or (y an empty view, `recompute` the forward's
// gamma and beta) recompute y from x with the forward's own operations, so that nothing needs to
// keep y for them: both backward passes read two tensors instead of three, and y's memory is free
// once its readers are done (graph/executor_plan.cpp).
#pragma once
#include <cstddef>

#include "kernels/activation.h"
#include "kernels/tensor.h"

namespace yolo {

constexpr float kBatchNormEpsilon = 1e-5f;
constexpr float kBatchNormMomentum = 0.01f;  // weight of the new batch in the running statistics

// The _cuda ops take x, y and the gradients in a storage type T: float, or Bf16/Fp16 for
// --precision bf16/fp16 (read as FP32, every statistic and reduction in FP32, y and grad_x
// rounded once to T); gamma, beta, the statistics and the gamma/beta gradients are float for
// every T. The _reference and _cpu versions take one type throughout.
//
// Bytes of device workspace the training _cuda launchers (forward and backward) need for an
// n x h x w x c input: per-block partial statistics. The _cpu versions ignore their workspace.
// Determinism: the reductions' order is fixed by the shape alone, so the same inputs give the
// same bits run to run (the CPU versions sum differently from the CUDA ones).
size_t batchnorm_workspace_bytes(int n, int h, int w, int c);

// The forward's gamma and beta, for a CUDA backward that recomputes y from x (both set) instead of
// reading it (both null, the default). The recomputed y is the forward's FP32 value before its
// rounding to T: with FP32 storage the gradients have the stored y's bits; with 16-bit storage
// act' sees y unrounded (logistic's y (1 - y) may differ in its last bits; leaky's and relu's
// only where y rounds to 0).
template <typename P>
struct BatchNormAffine {
  const P* gamma = nullptr;
  const P* beta = nullptr;
};

// ---- fused batchnorm + activation ------------------------------------------------------------

// NormalizedInput's table (conv.h): table[4 ch..] = {mean, gamma / sqrt(var + eps), beta, 0} with
// the apply's own expression for the scale (the same bits), from the saved statistics (training)
// or the running ones (inference). c floats each; table 4 c floats, 16-byte aligned.
void batchnorm_input_table_cuda(int c, const float* mean, const float* var, const float* gamma, const float* beta,
                                float* table, cudaStream_t stream);

// Training forward. running_mean/running_var: both null (no update) or both set.
template <typename T>
void batchnorm_activation_forward_training_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                     const T* beta, NhwcView<T> y, T* saved_mean, T* saved_var,
                                                     T* running_mean, T* running_var);
void batchnorm_activation_forward_training_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                               Act y, float* saved_mean, float* saved_var, float* running_mean,
                                               float* running_var, void* workspace, size_t workspace_bytes);
template <typename T>
void batchnorm_activation_forward_training_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                const float* beta, NhwcView<T> y, float* saved_mean, float* saved_var,
                                                float* running_mean, float* running_var, void* workspace,
                                                size_t workspace_bytes, cudaStream_t stream,
                                                NhwcView<const T> residual = {});

// Training forward from the statistics a convolution's epilogue wrote (conv.h, ConvMoments): `blocks`
// blocks of (mean, M2) per channel (partials[(b * c + ch) * 2 + {0, 1}]) with their pixel counts
// (counts[b], summing to x's pixels). They are combined in a fixed order (groups of them Chan-merged
// first when there are more than the finalize takes), then as the op above: the saved and running
// statistics, and y. x is read once (the op above reads it twice). The workspace:
// batchnorm_from_moments_workspace_bytes(blocks, c) bytes (0 for few blocks).
size_t batchnorm_from_moments_workspace_bytes(int blocks, int c);
template <typename T>
void batchnorm_activation_forward_from_moments_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                    const float* beta, NhwcView<T> y, const float* partials,
                                                    const float* counts, int blocks, float* saved_mean,
                                                    float* saved_var, float* running_mean, float* running_var,
                                                    void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                                    NhwcView<const T> residual = {});

// --sync-bn's phases 1 and 2 (below) from the same moments, without reading x: this replica's
// per-channel sums (sum n_b mean_b) and its squares about the global mean sums / total_pixels
// (sum M2_b + n_b (mean_b - mean)^2); the same workspace.
void batchnorm_sums_from_moments_cuda(int c, const float* partials, const float* counts, int blocks, float* sums,
                                      void* workspace, size_t workspace_bytes, cudaStream_t stream);
void batchnorm_centered_squares_from_moments_cuda(int c, const float* partials, const float* counts, int blocks,
                                                  const float* sums, double total_pixels, float* squares,
                                                  void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Inference forward: y = act(gamma * (x - running_mean) / sqrt(running_var + eps) + beta).
template <typename T>
void batchnorm_activation_forward_inference_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                      const T* beta, const T* running_mean, const T* running_var,
                                                      NhwcView<T> y);
void batchnorm_activation_forward_inference_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                const float* running_mean, const float* running_var, Act y);
template <typename T>
void batchnorm_activation_forward_inference_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                 const float* beta, const float* running_mean, const float* running_var,
                                                 NhwcView<T> y, cudaStream_t stream, NhwcView<const T> residual = {});

// Training backward. y: the forward's output (not read for Activation::Linear, where it may be
// an empty view); x: the batchnorm's input; saved_mean/saved_var: from the training forward.
template <typename T>
void batchnorm_activation_backward_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                             NhwcView<const T> x, const T* gamma, const T* saved_mean,
                                             const T* saved_var, NhwcView<T> grad_x, T* grad_gamma, T* grad_beta);
void batchnorm_activation_backward_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma,
                                       const float* saved_mean, const float* saved_var, Act grad_x,
                                       float* grad_gamma, float* grad_beta, void* workspace, size_t workspace_bytes);
template <typename T>
void batchnorm_activation_backward_cuda(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                        NhwcView<const T> x, const float* gamma, const float* saved_mean,
                                        const float* saved_var, NhwcView<T> grad_x, float* grad_gamma, float* grad_beta,
                                        void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                        BatchNormAffine<float> recompute = {});

// ---- plain batchnorm (the fused ops with Activation::Linear) ---------------------------------

template <typename T>
void batchnorm_forward_training_reference(NhwcView<const T> x, const T* gamma, const T* beta, NhwcView<T> y,
                                          T* saved_mean, T* saved_var, T* running_mean, T* running_var) {
  batchnorm_activation_forward_training_reference(Activation::Linear, x, gamma, beta, y, saved_mean, saved_var,
                                                  running_mean, running_var);
}
inline void batchnorm_forward_training_cpu(ConstAct x, const float* gamma, const float* beta, Act y,
                                           float* saved_mean, float* saved_var, float* running_mean,
                                           float* running_var, void* workspace, size_t workspace_bytes) {
  batchnorm_activation_forward_training_cpu(Activation::Linear, x, gamma, beta, y, saved_mean, saved_var,
                                            running_mean, running_var, workspace, workspace_bytes);
}
inline void batchnorm_forward_training_cuda(ConstAct x, const float* gamma, const float* beta, Act y,
                                            float* saved_mean, float* saved_var, float* running_mean,
                                            float* running_var, void* workspace, size_t workspace_bytes,
                                            cudaStream_t stream) {
  batchnorm_activation_forward_training_cuda(Activation::Linear, x, gamma, beta, y, saved_mean, saved_var,
                                             running_mean, running_var, workspace, workspace_bytes, stream);
}

template <typename T>
void batchnorm_forward_inference_reference(NhwcView<const T> x, const T* gamma, const T* beta,
                                           const T* running_mean, const T* running_var, NhwcView<T> y) {
  batchnorm_activation_forward_inference_reference(Activation::Linear, x, gamma, beta, running_mean, running_var, y);
}
inline void batchnorm_forward_inference_cpu(ConstAct x, const float* gamma, const float* beta,
                                            const float* running_mean, const float* running_var, Act y) {
  batchnorm_activation_forward_inference_cpu(Activation::Linear, x, gamma, beta, running_mean, running_var, y);
}
inline void batchnorm_forward_inference_cuda(ConstAct x, const float* gamma, const float* beta,
                                             const float* running_mean, const float* running_var, Act y,
                                             cudaStream_t stream) {
  batchnorm_activation_forward_inference_cuda(Activation::Linear, x, gamma, beta, running_mean, running_var, y,
                                              stream);
}

template <typename T>
void batchnorm_backward_reference(NhwcView<const T> grad_y, NhwcView<const T> x, const T* gamma,
                                  const T* saved_mean, const T* saved_var, NhwcView<T> grad_x, T* grad_gamma,
                                  T* grad_beta) {
  batchnorm_activation_backward_reference(Activation::Linear, NhwcView<const T>{}, grad_y, x, gamma, saved_mean,
                                          saved_var, grad_x, grad_gamma, grad_beta);
}
inline void batchnorm_backward_cpu(ConstAct grad_y, ConstAct x, const float* gamma, const float* saved_mean,
                                   const float* saved_var, Act grad_x, float* grad_gamma, float* grad_beta,
                                   void* workspace, size_t workspace_bytes) {
  batchnorm_activation_backward_cpu(Activation::Linear, ConstAct{}, grad_y, x, gamma, saved_mean, saved_var, grad_x,
                                    grad_gamma, grad_beta, workspace, workspace_bytes);
}
inline void batchnorm_backward_cuda(ConstAct grad_y, ConstAct x, const float* gamma, const float* saved_mean,
                                    const float* saved_var, Act grad_x, float* grad_gamma, float* grad_beta,
                                    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  batchnorm_activation_backward_cuda(Activation::Linear, ConstAct{}, grad_y, x, gamma, saved_mean, saved_var, grad_x,
                                     grad_gamma, grad_beta, workspace, workspace_bytes, stream);
}

// ---- synchronized batchnorm (--sync-bn): the training ops in phases ---------------------------
// Batch statistics over the micro-batches of ALL data-parallel replicas. Every replica runs each
// phase on its own micro-batch; between phases the caller all-reduces (sums) small per-channel
// arrays over the replicas, in stream order. total_pixels = M: the pixel count n*h*w summed over
// the replicas (a whole number, at least this replica's n*h*w). Sums are over this replica's
// pixels, per channel, written =. Forward:
//   1. batchnorm_sums: sums = sum x.                                         [all-reduce sums]
//   2. batchnorm_centered_squares: squares = sum (x - sums/M)^2.             [all-reduce squares]
//      Two passes, so no sum-of-squares cancellation when the mean is far from 0.
//   3. batchnorm_activation_forward_from_sums: mean = sums/M, var = squares/M (biased), then as
//      the training forward with m = M: saved statistics, running statistics (unbiased var M/(M-1),
//      M = 1: var), y = act(gamma (x - mean) / sqrt(var + eps) + beta).
// Backward, with saved_mean/saved_var of phase 3 (the same on every replica):
//   4. batchnorm_activation_backward_sums: this replica's grad_beta = sum g and grad_gamma =
//      sum g xhat (what the fused backward writes for them run on this replica alone), and the
//      same values again as sums2 = [sum g (c floats) | sum g xhat (c floats)]: the copy the
//      caller all-reduces while grad_gamma/grad_beta stay this replica's gradients. [all-reduce sums2]
//   5. batchnorm_activation_backward_apply: with the all-reduced sums2,
//      grad_x = gamma / sqrt(var + eps) * (g - sums2[ch]/M - xhat sums2[c + ch]/M).
// One replica (M = n*h*w, all-reduce = identity) gives the fused ops' results up to float
// rounding (measured): forward statistics within 3e-7 relative and y within 3e-6 absolute (the
// statistics are formed differently); backward grad_gamma/grad_beta the same bits, grad_x the
// same bits on _cuda (the same kernels) and within 2e-6 absolute on _cpu (sums2 is rounded to
// float between the phases).
// Aliasing as the fused ops: y may alias x, grad_x may alias grad_y. sums, squares and sums2 are
// only read by the phases taking them as inputs. Every phase needs at least one pixel on this
// replica, like the fused training ops. Workspace: the _cuda phases 1, 2 and 4 need
// batchnorm_workspace_bytes(n, h, w, c) of this replica's x (the _cpu ones ignore theirs); phases
// 3 and 5 need none. Deterministic: each phase's reduction order is fixed by the shape, as in the
// fused ops.

// Phase 1: sums[ch] = sum over x's pixels of x.
template <typename T>
void batchnorm_sums_reference(NhwcView<const T> x, T* sums);
void batchnorm_sums_cpu(ConstAct x, float* sums, void* workspace, size_t workspace_bytes);
template <typename T>
void batchnorm_sums_cuda(NhwcView<const T> x, float* sums, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

// Phase 2: squares[ch] = sum over x's pixels of (x - sums[ch]/total_pixels)^2 (sums all-reduced).
template <typename T>
void batchnorm_centered_squares_reference(NhwcView<const T> x, const T* sums, double total_pixels, T* squares);
void batchnorm_centered_squares_cpu(ConstAct x, const float* sums, double total_pixels, float* squares,
                                    void* workspace, size_t workspace_bytes);
template <typename T>
void batchnorm_centered_squares_cuda(NhwcView<const T> x, const float* sums, double total_pixels, float* squares,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Phase 3: the training forward from all-reduced sums and squares. running_mean/running_var:
// both null (no update) or both set.
template <typename T>
void batchnorm_activation_forward_from_sums_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                      const T* beta, NhwcView<T> y, const T* sums, const T* squares,
                                                      double total_pixels, T* saved_mean, T* saved_var,
                                                      T* running_mean, T* running_var);
void batchnorm_activation_forward_from_sums_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                Act y, const float* sums, const float* squares, double total_pixels,
                                                float* saved_mean, float* saved_var, float* running_mean,
                                                float* running_var);
template <typename T>
void batchnorm_activation_forward_from_sums_cuda(Activation act, NhwcView<const T> x, const float* gamma,
                                                 const float* beta, NhwcView<T> y, const float* sums,
                                                 const float* squares, double total_pixels, float* saved_mean,
                                                 float* saved_var, float* running_mean, float* running_var,
                                                 cudaStream_t stream, NhwcView<const T> residual = {});

// Phase 4: this replica's grad_gamma and grad_beta (c floats each) and sums2 (2c floats). y as in
// the fused backward (not read for Activation::Linear, where it may be an empty view).
template <typename T>
void batchnorm_activation_backward_sums_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                                  NhwcView<const T> x, const T* saved_mean, const T* saved_var,
                                                  T* grad_gamma, T* grad_beta, T* sums2);
void batchnorm_activation_backward_sums_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                            const float* saved_mean, const float* saved_var, float* grad_gamma,
                                            float* grad_beta, float* sums2, void* workspace, size_t workspace_bytes);
template <typename T>
void batchnorm_activation_backward_sums_cuda(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                             NhwcView<const T> x, const float* saved_mean, const float* saved_var,
                                             float* grad_gamma, float* grad_beta, float* sums2, void* workspace,
                                             size_t workspace_bytes, cudaStream_t stream,
                                             BatchNormAffine<float> recompute = {});

// Phase 5: grad_x from the all-reduced sums2.
template <typename T>
void batchnorm_activation_backward_apply_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                                   NhwcView<const T> x, const T* gamma, const T* saved_mean,
                                                   const T* saved_var, const T* sums2, double total_pixels,
                                                   NhwcView<T> grad_x);
void batchnorm_activation_backward_apply_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                             const float* gamma, const float* saved_mean, const float* saved_var,
                                             const float* sums2, double total_pixels, Act grad_x);
template <typename T>
void batchnorm_activation_backward_apply_cuda(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                              NhwcView<const T> x, const float* gamma, const float* saved_mean,
                                              const float* saved_var, const float* sums2, double total_pixels,
                                              NhwcView<T> grad_x, cudaStream_t stream,
                                              BatchNormAffine<float> recompute = {});

}  // namespace yolo
