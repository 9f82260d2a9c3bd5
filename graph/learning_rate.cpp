// The learning-rate schedule (see learning_rate.h).
#include "graph/learning_rate.h"

#include <algorithm>
#include <cmath>

#include "data/rng.h"

namespace yolo::graph {

float learning_rate_at(const NetParams& net, int64_t iteration, uint64_t seed) {
  // darknet's arithmetic: the ratios in float, pow in double, the product rounded to float.
  const double lr = net.learning_rate, i = static_cast<double>(iteration);
  if (net.burn_in > 0 && iteration < net.burn_in)
    return static_cast<float>(
        lr * std::pow(static_cast<float>(iteration) / static_cast<float>(net.burn_in), static_cast<double>(net.power)));
  using Policy = NetParams::Policy;
  switch (net.policy) {
    case Policy::Constant:
      return net.learning_rate;
    case Policy::Steps: {
      float rate = net.learning_rate;
      for (size_t k = 0; k < net.steps.size() && k < net.scales.size(); ++k)
        if (iteration >= net.steps[k]) rate *= net.scales[k];
      return rate;
    }
    case Policy::Step:
      return static_cast<float>(lr *
                                std::pow(static_cast<double>(net.scale), static_cast<double>(iteration / net.step)));
    case Policy::Exp:
      return static_cast<float>(lr * std::pow(static_cast<double>(net.gamma), i));
    case Policy::Poly: {
      if (net.max_batches <= 0) return net.learning_rate;
      const float left = std::max(0.0f, 1 - static_cast<float>(iteration) / static_cast<float>(net.max_batches));
      return static_cast<float>(lr * std::pow(static_cast<double>(left), static_cast<double>(net.power)));
    }
    case Policy::Sigmoid:
      // (darknet subtracts in size_t, which wraps before `step`: docs/darknet-compat.md)
      return static_cast<float>(lr / (1.0 + std::exp(net.gamma * (i - net.step))));
    case Policy::Random: {
      data::KeyedRng rng(seed, static_cast<uint64_t>(iteration), 0x6C72ull);  // "lr"
      return static_cast<float>(lr * std::pow(static_cast<double>(rng.unit()), net.power));
    }
  }
  return net.learning_rate;
}

}  // namespace yolo::graph
