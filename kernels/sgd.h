// The optimizer step, as darknet's update works out (SGD with momentum and weight decay), over
// one bucket of the flat parameter buffers w (weights), g (gradients, summed over the batch) and
// u (momentum), one launch per bucket:
//   u = momentum * u + g * grad_scale + decay * w     (segments with decay: conv/fc weights)
//   u = momentum * u + g * grad_scale                 (segments without: biases, BN scales/shifts)
//   w = w - learning_rate * u
// grad_scale is where 1 / global batch (and any loss scaling) is folded in. The bucket is a
// table of segments, in order and back to back, covering [begin, end) of the flat buffers;
// offsets are absolute indices into w, g and u. For _cuda the table is in device memory (it
// cannot be checked there: check the host copy once with sgd_check_segments).
// Helpers over a span of gradients: grad_nonfinite_check sets *flag = 1 when any element is NaN
// or infinite (never clears it), grad_scale_inplace multiplies every element by s.
#pragma once
#include <cstddef>

#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

struct SgdSegment {
  size_t offset = 0;  // first element, an index into the flat buffers
  size_t count = 0;
  bool decay = false;  // weight decay applies (weights), or not (biases, BN parameters)
  bool copy16 = false;  // with a 16-bit copy (sgd_update_cuda's `copy`): written for this segment
};

// The per-step values an update can read from memory when it runs (device memory for _cuda,
// host memory for _cpu and _reference), so that a captured step (a CUDA Graph) replays with new
// ones: the learning rate, the gradient scale, and the flag grad_nonfinite_check writes (pass
// &live->nonfinite to it): non-zero, the update leaves w, u and the 16-bit copy untouched.
struct SgdLive {
  float learning_rate = 0;
  float grad_scale = 1;
  int nonfinite = 0;
};

struct SgdHyper {
  float learning_rate = 0;
  float momentum = 0;
  float decay = 0;
  float grad_scale = 1;
  // When set: learning_rate and grad_scale above are not used; they and the skip come from here.
  const SgdLive* live = nullptr;
  // When set (fp16's loss scale kept on the device, LossScaleLive::scale): the gradient scale is
  // divided by it as the update runs (a power of two: exact).
  const float* loss_scale = nullptr;
};

// fp16 dynamic loss scaling kept on the device, so that a step queued before the previous one was
// read runs at the scale that step left (graph/loss_scale.h: the policy's why, and the host's
// mirror, which calls the same rule). loss_scale_step: after a step's non-finite check, an
// overflow halves the scale (not below kLossScaleMin) and zeroes the clean count; a clean step
// counts, and at growth_interval the scale doubles (not above kLossScaleMax) and the count restarts.
constexpr float kLossScaleMin = 0x1p-24f, kLossScaleMax = 0x1p24f;
struct LossScaleLive {
  float scale = 65536.0f;  // what the losses' gradients are multiplied by
  int clean = 0;           // clean steps since the scale last changed
};
YOLO_HOST_DEVICE inline void loss_scale_step(bool nonfinite, LossScaleLive& s, int growth_interval) {
  if (nonfinite) {
    s.clean = 0;
    s.scale = s.scale * 0.5f < kLossScaleMin ? kLossScaleMin : s.scale * 0.5f;
  } else if (++s.clean >= growth_interval) {
    s.clean = 0;
    s.scale = s.scale * 2.0f > kLossScaleMax ? kLossScaleMax : s.scale * 2.0f;
  }
}
// One thread on the stream: loss_scale_step(*nonfinite != 0, *s, growth_interval).
void loss_scale_update_cuda(const int* nonfinite, LossScaleLive* s, int growth_interval, cudaStream_t stream);

// Throws yolo::Error unless segments[0..count) are back to back and cover exactly [begin, end).
void sgd_check_segments(const SgdSegment* segments, int segment_count, size_t begin, size_t end);

template <typename T>
void sgd_update_reference(T* w, const T* g, T* u, const SgdSegment* segments, int segment_count, size_t begin,
                          size_t end, SgdHyper hyper);
void sgd_update_cpu(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                    size_t end, SgdHyper hyper);
void sgd_update_cuda(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                     size_t end, SgdHyper hyper, cudaStream_t stream);
// The same update, also writing copy[i] = w[i] (after the update) rounded to the 16-bit type, in
// the same pass, for the elements of segments marked copy16: the conv and connected weights
// that --precision bf16/fp16 multiplies in 16 bits (biases and BatchNorm parameters stay FP32).
// copy is indexed like w (a flat buffer of the same length); other elements are not written.
void sgd_update_cuda(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                     size_t end, SgdHyper hyper, Bf16* copy, cudaStream_t stream);
void sgd_update_cuda(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                     size_t end, SgdHyper hyper, Fp16* copy, cudaStream_t stream);

template <typename T>
void grad_nonfinite_check_reference(const T* g, size_t count, int* flag);
void grad_nonfinite_check_cpu(const float* g, size_t count, int* flag);
void grad_nonfinite_check_cuda(const float* g, size_t count, int* flag, cudaStream_t stream);

template <typename T>
void grad_scale_inplace_reference(T* g, size_t count, T s);
void grad_scale_inplace_cpu(float* g, size_t count, float s);
void grad_scale_inplace_cuda(float* g, size_t count, float s, cudaStream_t stream);

}  // namespace yolo
