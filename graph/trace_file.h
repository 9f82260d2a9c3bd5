// The --trace file: Chrome's trace-event JSON (chrome://tracing, Perfetto), a process per rank
// and a lane per stream; and its per-rank names in multi-process runs.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "graph/executor.h"

namespace yolo::graph {

// One rank's events of the traced step (host-clock milliseconds on one timeline).
struct RankTrace {
  int rank = 0;
  std::string device;
  std::vector<TraceEvent> events;
};

// The in-process ranks' traces, written as one file (a process per rank) once all have run.
struct TraceBook {
  std::mutex mutex;
  std::vector<RankTrace> ranks;
};

// Writes the ranks' traced steps to `path` (through a temporary file, renamed when complete).
void write_trace(const std::string& path, const std::vector<RankTrace>& ranks);

// The trace file of rank `rank` in a multi-process run: rank 0 the given name, the others
// "name.rankR.json" beside it.
std::string rank_trace_path(const std::string& path, int rank);

}  // namespace yolo::graph
