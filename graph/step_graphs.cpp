// CUDA Graphs for the training step (see step_graphs.h).
#include "graph/step_graphs.h"

#include <exception>
#include <utility>

#include "runtime/check.h"
#include "runtime/fault.h"

namespace yolo::graph {

StepGraphs::StepGraphs(Stream& stream, std::string off_reason) : stream_(stream), off_reason_(std::move(off_reason)) {}

size_t StepGraphs::captured() const {
  size_t n = 0;
  for (const auto& [key, entry] : entries_) n += entry.graph.valid();
  return n;
}

std::string StepGraphs::take_notice() { return std::exchange(notice_, {}); }

bool StepGraphs::run(const std::string& key, const std::function<void()>& queue) {
  if (!on()) {
    queue();
    return false;
  }
  Entry& entry = entries_[key];
  if (entry.graph.valid()) {
    entry.graph.launch(stream_);
    return true;
  }
  if (entry.eager_runs++ == 0) {  // the first of its kind runs eagerly (lazy initialisation happens outside a capture)
    queue();
    return false;
  }
  try {
    stream_.begin_capture();
    try {
      queue();
      // A planted fault (emulated build only): the capture fails as on a driver that cannot capture.
      if (fault_injected(Fault::CaptureFails))
        throw Error("cudaStreamEndCapture: operation not supported (cudaErrorStreamCaptureUnsupported; planted)");
    } catch (...) {
      try {
        stream_.end_capture();  // ends the capture; its graph is dropped
      } catch (const std::exception&) {
        // The first error is the one to report.
      }
      throw;
    }
    entry.graph = stream_.end_capture();
  } catch (const std::exception& e) {
    off_reason_ = std::string("capturing the step failed: ") + e.what();
    notice_ = off_reason_;
    entries_.clear();
    queue();  // this micro-batch, eagerly
    return false;
  }
  entry.graph.launch(stream_);
  return true;
}

}  // namespace yolo::graph
