// Softmax cross-entropy over class logits (the MNIST MLP's loss), numerically stable (each row's
// maximum is subtracted before exp):
//   logits [n][k] row-major, labels int32[n] in [0, k)
//   *loss              = sum over samples of -log softmax(logits_i)[label_i]   (a sum, not a mean)
//   grad_logits[i][j]  = softmax(logits_i)[j] - (j == label_i)                 (per sample, summed
//                        semantics: the optimizer divides by the global batch)
//   probabilities[i][j]= softmax(logits_i)[j]
// loss, grad_logits and probabilities may each be null (not written). A label outside [0, k):
// the reference and CPU versions throw yolo::Error naming the sample, before writing anything;
// the CUDA version cannot throw, so it sets *bad_label = max(*bad_label, 1 + sample index)
// (never clears it; the caller zeroes it and reads it back), leaves that sample out of the loss
// and writes its gradient as its softmax. The CUDA version runs as a single block: meant for
// classifier heads (n up to a few thousand).
#pragma once
#include <type_traits>

#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

template <typename T>
void softmax_cross_entropy_reference(const T* logits, const int* labels, int n, int k, T* loss, T* grad_logits,
                                     T* probabilities);
void softmax_cross_entropy_cpu(const float* logits, const int* labels, int n, int k, float* loss, float* grad_logits,
                               float* probabilities);
// T: float, or the 16-bit storage types Bf16/Fp16 of logits and grad_logits (FP32 math, the
// gradient rounded once; loss and probabilities FP32). grad_scale multiplies the gradient (not the
// loss) before it is stored: --precision fp16's loss scale; grad_scale_at (device memory), when
// set, is read when the kernel runs instead (a replayed CUDA Graph applies the current scale).
template <typename T>
void softmax_cross_entropy_cuda(const T* logits, const int* labels, int n, int k, float* loss,
                                std::type_identity_t<T>* grad_logits, float* probabilities, int* bad_label,
                                cudaStream_t stream, float grad_scale = 1.0f, const float* grad_scale_at = nullptr);

}  // namespace yolo
