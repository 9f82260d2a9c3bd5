// The learning-rate schedule: darknet's policies as darknet computes them (network.c,
// get_current_rate), for iteration i = optimizer steps done so far and the base rate lr:
//   burn-in (i < burn_in): lr * (i / burn_in)^power, whatever the policy
//   constant  lr
//   steps     lr * scales[0] * ... * scales[k] for every steps[k] <= i
//   step      lr * scale^floor(i / step)
//   exp       lr * gamma^i
//   poly      lr * (1 - i / max_batches)^power (0 from max_batches on; the trainer passes the
//             run's max_batches: --max-batches when given)
//   sigmoid   lr / (1 + exp(gamma * (i - step)))  (darknet's size_t arithmetic wraps i - step
//             below `step`, giving 0 there for gamma > 0; here the sigmoid as written)
//   random    lr * u^power, u uniform in [0, 1): darknet draws u from rand(); here it is a pure
//             function of (seed, i), so every rank and a resumed run draw the same rates
#pragma once
#include <cstdint>

#include "graph/cfg.h"

namespace yolo::graph {

float learning_rate_at(const NetParams& net, int64_t iteration, uint64_t seed = 0);

}  // namespace yolo::graph
