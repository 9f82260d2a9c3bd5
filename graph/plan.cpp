// Liveness-based packing of a step's buffers (see plan.h).
#include "graph/plan.h"

#include <algorithm>
#include <numeric>

namespace yolo::graph {

namespace {

bool lives_overlap(const PlannedBuffer& a, const PlannedBuffer& b) { return a.first <= b.last && b.first <= a.last; }
bool bytes_overlap(const PlannedBuffer& a, const PlannedBuffer& b) {
  return a.bytes && b.bytes && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

}  // namespace

size_t plan_buffers(std::vector<PlannedBuffer>& buffers, size_t alignment) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  auto round_up = [&](size_t v) { return (v + alignment - 1) / alignment * alignment; };
  std::vector<size_t> placed;
  size_t total = 0;
  for (size_t index : order) {
    PlannedBuffer& buffer = buffers[index];
    // Busy ranges among placed buffers alive at the same time, by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t p : placed)
      if (lives_overlap(buffers[p], buffer)) busy.emplace_back(buffers[p].offset, buffers[p].offset + buffers[p].bytes);
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + buffer.bytes <= begin) break;
      offset = std::max(offset, round_up(end));
    }
    buffer.offset = offset;
    total = std::max(total, round_up(offset + buffer.bytes));
    placed.push_back(index);
  }
  return total;
}

bool find_plan_conflict(const std::vector<PlannedBuffer>& buffers, std::string* conflict) {
  for (size_t a = 0; a < buffers.size(); ++a)
    for (size_t b = a + 1; b < buffers.size(); ++b)
      if (lives_overlap(buffers[a], buffers[b]) && bytes_overlap(buffers[a], buffers[b])) {
        if (conflict) *conflict = buffers[a].tag + " and " + buffers[b].tag;
        return true;
      }
  return false;
}

}  // namespace yolo::graph
