// Dynamic loss scaling for --precision fp16 (FP16 gradients overflow or flush to zero without
// it): the loss gradient is multiplied by scale() before backward and the optimizer divides it
// back out (its grad_scale). After each step's gradients are all-reduced, update() is told
// whether any of them is Inf/NaN; the same reduced gradients give every rank the same answer, so
// every rank's scaler stays in step. On GPUs the scale the steps run at lives on the device and
// each update adjusts it there (kernels/sgd.h, the same rule): this object mirrors it a step late,
// as the loop reads each step's flag, for messages, checkpoints and the divergence rules. The
// policy is the usual one (PyTorch's GradScaler):
//   start at 2^16; an Inf/NaN step is skipped and the scale halved (never below 2^-24);
//   after `growth_interval` clean steps in a row the scale doubles (at most 2^24).
// BF16 and TF32 have FP32's exponent range and run with the scaler disabled (scale 1, nothing
// ever skipped for overflow by it). Our losses are sums over the batch, so the first fp16 steps
// overflow and are skipped until the scale settles: those are scale adjustments, not divergence.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/sgd.h"

namespace yolo::graph {

class LossScaler {
 public:
  static constexpr float kInitial = 65536.0f, kMin = kLossScaleMin, kMax = kLossScaleMax;
  static constexpr int kGrowthInterval = 2000;

  explicit LossScaler(bool enabled, float initial = kInitial, int growth_interval = kGrowthInterval);

  bool enabled() const { return enabled_; }
  float scale() const { return enabled_ ? scale_ : 1.0f; }
  // After a step's reduced gradients were checked: true when the step is to be applied. With the
  // scaler enabled, nonfinite means an overflow: the step is skipped and the scale halved;
  // disabled, nonfinite steps are reported as not applied too (the trainer's divergence rules
  // decide what that means).
  bool update(bool nonfinite);

  int64_t clean_steps() const { return clean_; }  // since the last change of scale
  int growth_interval() const { return growth_interval_; }
  int64_t overflows() const { return overflows_; }  // steps skipped for overflow, in all

  // Checkpoint state (exact resume): the scale and the clean-step count.
  struct State {
    float scale = kInitial;
    int64_t clean = 0;
    int64_t overflows = 0;
  };
  State state() const { return {scale_, clean_, overflows_}; }
  // Throws yolo::Error (naming `where`) for a state no scaler can be in.
  void restore(const State& s, const std::string& where);

 private:
  bool enabled_;
  float scale_;
  int growth_interval_;
  int64_t clean_ = 0, overflows_ = 0;
};

}  // namespace yolo::graph
