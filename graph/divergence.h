// Where a diverged run's non-finite values came from, for the message that stops it. Looked for
// on one step that fails (it reads every layer back, eagerly): before that step's last backward,
// while every output of the forward pass is still held (the memory plan reuses an output's bytes
// after its backward), each layer's parameters and then its output, in forward order (the step's
// last micro-batch); when all of that is finite, after the step, the parameter gradients in
// backward order (the deepest layer whose gradients are non-finite: where backward made one).
#pragma once
#include <cstdint>
#include <string>

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

// Whether what a checkpoint holds (parameters, momentum, BatchNorm running statistics) is finite.
bool state_finite(Executor& executor);

}  // namespace yolo::graph
