// CUDA Graphs for the training step (issue 15). Each kind of micro-batch (its key: input size,
// first or accumulating, last with the all-reduces and the update) runs eagerly the first time it
// comes up, is captured into a graph the second time and launched, and is launched from then on:
// one launch instead of a thousand kernel launches per micro-batch. The work must read everything
// that changes between steps from fixed device memory (executor.h: stage_inputs, set_step_values,
// set_loss_scale) and must not wait for the host; the host reads the results after the launch.
// On CPU and emulated streams the graph is the capture of their queues (runtime/stream.h).
#pragma once
#include <functional>
#include <map>
#include <string>

#include "runtime/stream.h"

namespace yolo::graph {

class StepGraphs {
 public:
  // off_reason: why the steps run eagerly ("" = graphs on).
  StepGraphs(Stream& stream, std::string off_reason);
  // Runs `queue` (which queues work on the stream, and on streams it forks from it and joins
  // back, and nothing that waits for the host) as described above. A capture that fails turns
  // graphs off for good: notice() says why, and this and every later call run eagerly.
  // Returns whether it ran as a graph launch.
  bool run(const std::string& key, const std::function<void()>& queue);
  bool on() const { return off_reason_.empty(); }
  const std::string& off_reason() const { return off_reason_; }
  size_t captured() const;
  // A capture failure's message, once (empty otherwise).
  std::string take_notice();

 private:
  struct Entry {
    int eager_runs = 0;
    StreamGraph graph;
  };
  Stream& stream_;
  std::string off_reason_, notice_;
  std::map<std::string, Entry> entries_;
};

}  // namespace yolo::graph
