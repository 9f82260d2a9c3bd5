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
  if (std::strcmp(cat, "device") == 0) return 4;
  return 0;  // forward, backward: the compute stream
}

// `text` as a JSON string's contents (kernel names may hold anything a C++ name can).
std::string json_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += code;
      continue;
    }
    out += c;
  }
  return out;
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
      const char* lanes[] = {"compute stream", "comm stream", "copy stream", "host thread",
                             "device (activity records)"};
      for (int lane = 0; lane < 5; ++lane)
        out << sep << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank.rank << ",\"tid\":" << lane
            << ",\"args\":{\"name\":\"" << lanes[lane] << "\"}}";
      // Each rank's timeline starts at its first event.
      double origin = 0;
      for (size_t k = 0; k < rank.events.size(); ++k)
        origin = k ? std::min(origin, rank.events[k].start_ms) : rank.events[k].start_ms;
      for (const TraceEvent& e : rank.events) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                      e.cat, rank.rank, trace_lane(e.cat), (e.start_ms - origin) * 1000, (e.end_ms - e.start_ms) * 1000);
        out << ",\n{\"name\":\"" << json_escaped(e.name) << buf;
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
