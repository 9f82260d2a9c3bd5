// Where a diverged run's non-finite values came from, for the message that stops it. Looked for
// on one step that fails (it reads every layer back, eagerly): before that step's last backward,
// while every output of the forward pass is still held (the memory plan reuses an output's bytes
// after its backward), each layer's parameters and then its output, in forward order (the step's
// last micro-batch); when all of that is finite, after the step, the parameter gradients in
// backward order (the deepest layer whose gradients are non-finite: where backward made one).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "graph/executor.h"

namespace yolo::graph {

struct NonFinite {
  enum Kind { Parameters = 0, Output = 1, Gradients = 2 };
  int layer = -1;  // -1: everything read back was finite
  Kind kind = Output;
  // Orders findings across ranks: forward findings first, by layer; then gradients.
  uint64_t code() const;
  static NonFinite from_code(uint64_t code);
  static constexpr uint64_t kNone = UINT64_MAX;
  // "layer 7 (conv)'s output", "layer 3 (conv)'s parameters", "the gradients of layer 12 (conv)".
  std::string text(const Graph& graph) const;
};

// Parameters and outputs, in forward order: call while the forward pass's outputs are held.
NonFinite find_non_finite_forward(const Graph& graph, Executor& executor);
// The parameter gradients (of the step just done), the deepest layer first.
NonFinite find_non_finite_gradients(const Graph& graph, Executor& executor);

// The training loop's count of steps skipped in a row, and the message that stops a diverged run.
class DivergenceWatch {
 public:
  explicit DivergenceWatch(int max_skipped) : max_skipped_(max_skipped) {}
  // Whether the coming step is the one to check layer by layer (the second skipped in a row).
  bool check_due() const { return in_a_row_ == 1; }
  bool skipping() const { return in_a_row_ > 0; }
  // After step `step` (1-based): whether it was skipped as divergence (not a loss-scale
  // adjustment), and for a checked step the finding of every rank (rank order; one entry
  // without data parallel).
  void step_done(int64_t step, bool skipped, const std::vector<uint64_t>& findings);
  bool diverged() const { return max_skipped_ > 0 && in_a_row_ >= max_skipped_; }
  // "training diverged: 3 steps in a row (3 to 5) ... remedies"; ranks: name the rank.
  std::string message(const Graph& graph, bool ranks) const;

 private:
  int max_skipped_;
  int64_t in_a_row_ = 0, first_ = 0, last_ = 0, located_step_ = 0;
  NonFinite found_;
  int found_rank_ = 0;
};

// Whether what a checkpoint holds (parameters, momentum, BatchNorm running statistics) is finite.
bool state_finite(Executor& executor);

}  // namespace yolo::graph
