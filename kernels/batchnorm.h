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
#pragma once
#include <cstddef>

#include "kernels/activation.h"
#include "kernels/tensor.h"

namespace yolo {

constexpr float kBatchNormEpsilon = 1e-5f;
constexpr float kBatchNormMomentum = 0.01f;  // weight of the new batch in the running statistics

// Bytes of device workspace the training _cuda launchers (forward and backward) need for an
// n x h x w x c input: per-block partial statistics. The _cpu versions ignore their workspace.
// Determinism: the reductions' order is fixed by the shape alone, so the same inputs give the
// same bits run to run (the CPU versions sum differently from the CUDA ones).
size_t batchnorm_workspace_bytes(int n, int h, int w, int c);

// ---- fused batchnorm + activation ------------------------------------------------------------

// Training forward. running_mean/running_var: both null (no update) or both set.
template <typename T>
void batchnorm_activation_forward_training_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                     const T* beta, NhwcView<T> y, T* saved_mean, T* saved_var,
                                                     T* running_mean, T* running_var);
void batchnorm_activation_forward_training_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                               Act y, float* saved_mean, float* saved_var, float* running_mean,
                                               float* running_var, void* workspace, size_t workspace_bytes);
void batchnorm_activation_forward_training_cuda(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                Act y, float* saved_mean, float* saved_var, float* running_mean,
                                                float* running_var, void* workspace, size_t workspace_bytes,
                                                cudaStream_t stream);

// Inference forward: y = act(gamma * (x - running_mean) / sqrt(running_var + eps) + beta).
template <typename T>
void batchnorm_activation_forward_inference_reference(Activation act, NhwcView<const T> x, const T* gamma,
                                                      const T* beta, const T* running_mean, const T* running_var,
                                                      NhwcView<T> y);
void batchnorm_activation_forward_inference_cpu(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                const float* running_mean, const float* running_var, Act y);
void batchnorm_activation_forward_inference_cuda(Activation act, ConstAct x, const float* gamma, const float* beta,
                                                 const float* running_mean, const float* running_var, Act y,
                                                 cudaStream_t stream);

// Training backward. y: the forward's output (not read for Activation::Linear, where it may be
// an empty view); x: the batchnorm's input; saved_mean/saved_var: from the training forward.
template <typename T>
void batchnorm_activation_backward_reference(Activation act, NhwcView<const T> y, NhwcView<const T> grad_y,
                                             NhwcView<const T> x, const T* gamma, const T* saved_mean,
                                             const T* saved_var, NhwcView<T> grad_x, T* grad_gamma, T* grad_beta);
void batchnorm_activation_backward_cpu(Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma,
                                       const float* saved_mean, const float* saved_var, Act grad_x,
                                       float* grad_gamma, float* grad_beta, void* workspace, size_t workspace_bytes);
void batchnorm_activation_backward_cuda(Activation act, ConstAct y, ConstAct grad_y, ConstAct x, const float* gamma,
                                        const float* saved_mean, const float* saved_var, Act grad_x,
                                        float* grad_gamma, float* grad_beta, void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream);

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

}  // namespace yolo
