// Softmax cross-entropy: reference, fast CPU version and CUDA kernel (see softmax.h).
#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

namespace yolo {
namespace {

void check_arguments(const void* logits, const int* labels, int n, int k) {
  if (n < 0 || k < 1)
    throw Error("softmax_cross_entropy: batch " + std::to_string(n) + " and classes " + std::to_string(k) +
                " must be >= 0 and >= 1");
  if (n > 0 && (!logits || !labels)) throw Error("softmax_cross_entropy: logits or labels is a null pointer");
}

// Host-side label check (reference and CPU): throws naming the first bad sample.
void check_labels(const int* labels, int n, int k) {
  for (int i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= k)
      throw Error("softmax_cross_entropy: sample " + std::to_string(i) + " has label " + std::to_string(labels[i]) +
                  ", outside [0, " + std::to_string(k) + ")");
}

// One sample in float: writes its gradient and probabilities (where asked), returns its loss.
float one_sample(const float* x, int label, int k, float* grad, float* prob) {
  float row_max = x[0];
  for (int j = 1; j < k; ++j) row_max = x[j] > row_max ? x[j] : row_max;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += std::exp(x[j] - row_max);
  float inv = 1.0f / sum;
  for (int j = 0; j < k; ++j) {
    float p = std::exp(x[j] - row_max) * inv;
    if (prob) prob[j] = p;
    if (grad) grad[j] = p - (j == label ? 1.0f : 0.0f);
  }
  return std::log(sum) - (x[label] - row_max);
}

// ---- CUDA: one block; warp w takes samples w, w + warps, ...; lanes split the classes -----
constexpr int kThreads = 1024;

// T: the logits' and their gradient's storage type (float, Bf16, Fp16); the math is FP32.
template <typename T>
__global__ void softmax_cross_entropy_kernel(const T* logits, const int* labels, int n, int k, float* loss,
                                             T* grad_logits, float* probabilities, int* bad_label, float grad_scale,
                                             const float* grad_scale_at) {
  if (grad_scale_at) grad_scale = *grad_scale_at;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float warp_loss = 0.0f;  // lane 0's running sum, samples in order
  for (int i = warp; i < n; i += warps) {
    const T* x = logits + size_t(i) * k;
    int label = labels[i];
    bool good = label >= 0 && label < k;
    float row_max = -INFINITY;
    for (int j = lane; j < k; j += 32) row_max = fmaxf(row_max, to_float(x[j]));
    for (int offset = 16; offset > 0; offset /= 2) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, offset));
    float part = 0.0f;
    for (int j = lane; j < k; j += 32) part += expf(to_float(x[j]) - row_max);
    float sum = warp_sum(part);
    float inv = 1.0f / sum;
    for (int j = lane; j < k; j += 32) {
      float p = expf(to_float(x[j]) - row_max) * inv;
      if (probabilities) probabilities[size_t(i) * k + j] = p;
      if (grad_logits) grad_logits[size_t(i) * k + j] = from_float<T>((p - (j == label ? 1.0f : 0.0f)) * grad_scale);
    }
    if (lane == 0) {
      if (good) warp_loss += logf(sum) - (to_float(x[label]) - row_max);
      else atomicMax(bad_label, i + 1);
    }
  }
  float total = block_sum(lane == 0 ? warp_loss : 0.0f);  // warps added in a fixed order
  if (threadIdx.x == 0 && loss) *loss = total;
}

}  // namespace

// ---- reference --------------------------------------------------------------------------
template <typename T>
void softmax_cross_entropy_reference(const T* logits, const int* labels, int n, int k, T* loss, T* grad_logits,
                                     T* probabilities) {
  check_arguments(logits, labels, n, k);
  check_labels(labels, n, k);
  T total = 0;
  for (int i = 0; i < n; ++i) {
    const T* x = logits + size_t(i) * k;
    T row_max = x[0];
    for (int j = 1; j < k; ++j) row_max = std::max(row_max, x[j]);
    T sum = 0;
    for (int j = 0; j < k; ++j) sum += std::exp(x[j] - row_max);
    for (int j = 0; j < k; ++j) {
      T p = std::exp(x[j] - row_max) / sum;
      if (probabilities) probabilities[size_t(i) * k + j] = p;
      if (grad_logits) grad_logits[size_t(i) * k + j] = p - (j == labels[i] ? T(1) : T(0));
    }
    total += std::log(sum) - (x[labels[i]] - row_max);
  }
  if (loss) *loss = total;
}

template void softmax_cross_entropy_reference<float>(const float*, const int*, int, int, float*, float*, float*);
template void softmax_cross_entropy_reference<double>(const double*, const int*, int, int, double*, double*, double*);

// ---- fast CPU: fixed chunks of samples, their losses added in chunk order ----------------
void softmax_cross_entropy_cpu(const float* logits, const int* labels, int n, int k, float* loss, float* grad_logits,
                               float* probabilities) {
  check_arguments(logits, labels, n, k);
  check_labels(labels, n, k);
  const size_t chunk = 64, chunks = (size_t(n) + chunk - 1) / chunk;
  std::vector<float> chunk_loss(chunks, 0.0f);
  parallel_for(chunks, [&](size_t c) {
    size_t end = std::min(size_t(n), (c + 1) * chunk);
    float sum = 0.0f;
    for (size_t i = c * chunk; i < end; ++i)
      sum += one_sample(logits + i * k, labels[i], k, grad_logits ? grad_logits + i * k : nullptr,
                        probabilities ? probabilities + i * k : nullptr);
    chunk_loss[c] = sum;
  });
  float total = 0.0f;
  for (float l : chunk_loss) total += l;
  if (loss) *loss = total;
}

// ---- CUDA launcher ----------------------------------------------------------------------
template <typename T>
void softmax_cross_entropy_cuda(const T* logits, const int* labels, int n, int k, float* loss,
                                std::type_identity_t<T>* grad_logits, float* probabilities, int* bad_label,
                                cudaStream_t stream, float grad_scale, const float* grad_scale_at) {
  check_arguments(logits, labels, n, k);
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale))
    throw Error("softmax_cross_entropy_cuda: grad_scale " + std::to_string(grad_scale) +
                " is not a positive finite number");
  if (!bad_label) throw Error("softmax_cross_entropy_cuda: bad_label (the error flag) is a null pointer");
  if (n == 0 && !loss) return;
  LAUNCH(softmax_cross_entropy_kernel<T>, dim3(1), dim3(kThreads), 0, stream, logits, labels, n, k, loss, grad_logits,
         probabilities, bad_label, grad_scale, grad_scale_at);
}

#define YOLO_SOFTMAX_CUDA(T)                                                                                          \
  template void softmax_cross_entropy_cuda<T>(const T*, const int*, int, int, float*, T*, float*, int*, cudaStream_t, \
                                              float, const float*);
YOLO_SOFTMAX_CUDA(float)
YOLO_SOFTMAX_CUDA(Bf16)
YOLO_SOFTMAX_CUDA(Fp16)
#undef YOLO_SOFTMAX_CUDA

}  // namespace yolo
