// The --trace file (see trace_file.h).
#include "graph/trace_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/check.h"

namespace yolo::graph {

namespace {

// Chrome-trace lanes (tid) by event category.
int trace_lane(const char* cat) {
  if (std::strcmp(cat, "comm") == 0) return 1;
  if (std::strcmp(cat, "copy") == 0) return 2;
  if (std::strcmp(cat, "host") == 0) return 3;
  return 0;  // forward, backward: the compute stream
}

}  // namespace

void write_trace(const std::string& path, const std::vector<RankTrace>& ranks) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"traceEvents\":[";
    const char* sep = "\n";
    for (const RankTrace& rank : ranks) {
      out << sep << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank.rank << ",\"args\":{\"name\":\"rank "
          << rank.rank << " (" << rank.device << ")\"}}";
      sep = ",\n";
      const char* lanes[] = {"compute stream", "comm stream", "copy stream", "host thread"};
      for (int lane = 0; lane < 4; ++lane)
        out << sep << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank.rank << ",\"tid\":" << lane
            << ",\"args\":{\"name\":\"" << lanes[lane] << "\"}}";
      // Each rank's timeline starts at its first event.
      double origin = 0;
      for (size_t k = 0; k < rank.events.size(); ++k)
        origin = k ? std::min(origin, rank.events[k].start_ms) : rank.events[k].start_ms;
      for (const TraceEvent& e : rank.events) {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                      e.name.c_str(), e.cat, rank.rank, trace_lane(e.cat), (e.start_ms - origin) * 1000,
                      (e.end_ms - e.start_ms) * 1000);
        out << buf;
      }
    }
    out << "\n]}\n";
    if (!out) throw Error("cannot write the trace file " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

std::string rank_trace_path(const std::string& path, int rank) {
  if (rank == 0) return path;
  std::filesystem::path p(path);
  std::string stem = p.extension() == ".json" ? p.stem().string() : p.filename().string();
  return (p.parent_path() / (stem + ".rank" + std::to_string(rank) + ".json")).string();
}

}  // namespace yolo::graph
