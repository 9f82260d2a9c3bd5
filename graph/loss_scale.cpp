// Dynamic loss scaling (see loss_scale.h).
#include "graph/loss_scale.h"

#include <cmath>

#include "kernels/sgd.h"
#include "runtime/check.h"

namespace yolo::graph {

LossScaler::LossScaler(bool enabled, float initial, int growth_interval)
    : enabled_(enabled), scale_(initial), growth_interval_(growth_interval) {
  if (!(initial >= kMin && initial <= kMax))
    throw Error("loss scale: the initial scale " + std::to_string(initial) + " is outside [2^-24, 2^24]");
  if (growth_interval < 1) throw Error("loss scale: the growth interval must be at least 1 step");
}

bool LossScaler::update(bool nonfinite) {
  if (!enabled_) return !nonfinite;
  // The rule the device's copy follows (kernels/sgd.h), so that the two stay in step.
  LossScaleLive s{scale_, static_cast<int>(clean_)};
  loss_scale_step(nonfinite, s, growth_interval_);
  scale_ = s.scale, clean_ = s.clean;
  overflows_ += nonfinite;
  return !nonfinite;
}

void LossScaler::restore(const State& s, const std::string& where) {
  const bool power_of_two = s.scale > 0 && std::ldexp(1.0f, std::ilogb(s.scale)) == s.scale;
  if (!(s.scale >= kMin && s.scale <= kMax) || !power_of_two)
    throw Error(where + ": loss scale " + std::to_string(s.scale) + " is not a power of two in [2^-24, 2^24]");
  if (s.clean < 0 || s.clean >= growth_interval_ || s.overflows < 0)
    throw Error(where + ": loss-scale step counts " + std::to_string(s.clean) + "/" + std::to_string(s.overflows) +
                " are out of range");
  scale_ = s.scale, clean_ = s.clean, overflows_ = s.overflows;
}

}  // namespace yolo::graph
