// The memory plan: every activation-sized buffer of a training step (outputs, BatchNorm inputs,
// maxpool argmax, gradients) with the interval of step positions in which it holds live data,
// packed into one block so that buffers whose intervals overlap never share bytes. Positions:
// forward of node i is i, backward of node i is 2L-1-i (L nodes).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace yolo::graph {

struct PlannedBuffer {
  std::string tag;     // e.g. "out 12", "grad 12"
  size_t bytes = 0;
  int first = 0, last = 0;  // live positions, inclusive
  size_t offset = 0;        // assigned by plan_buffers
};

// Assigns offsets (aligned to `alignment`) so that no two buffers with overlapping live
// intervals overlap in memory; returns the block size needed. Greedy: largest first, each at
// the lowest offset that fits.
size_t plan_buffers(std::vector<PlannedBuffer>& buffers, size_t alignment = 256);

// True when the plan is valid (for tests and a self-check): returns the first conflict found.
bool find_plan_conflict(const std::vector<PlannedBuffer>& buffers, std::string* conflict = nullptr);

}  // namespace yolo::graph
