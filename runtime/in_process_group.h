// The shared state of an in-process group (communicator.h), for the communicators built on it:
// the CPU replicas' (communicator.cpp) and the emulated GPUs' (emu_communicator.cpp). A
// generation-counted barrier with abort and timeout, the host all-gather, and the rank-ordered
// sum every rank's result comes from.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/stream_queue.h"

namespace yolo {

// One stream-ordered collective of emulated GPUs (emu_communicator.cpp), shared by its ranks'
// stream items: what each rank contributed (read when its stream reached the collective), where
// each wants the result, and the completion its streams wait for. Guarded by the group's mutex.
struct EmulatedCollective {
  const char* op = "";   // "all-reduce" or "broadcast"
  int root = -1;         // broadcast
  size_t count = 0;
  std::vector<std::vector<float>> contributions;
  std::vector<float*> outputs;
  int arrived = 0;
  std::shared_ptr<HostEvent> done = make_host_event();
  uint64_t generation = issue_host_event(done);
};

struct InProcessGroup::Shared {
  int size = 0;
  double timeout = 300;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  uint64_t generation = 0;
  std::string aborted;              // why, once some rank aborted
  std::vector<float*> buffers;      // posted by each rank for the current collective
  std::vector<uint64_t> values;     // all_gather
  std::vector<float> scratch;       // the reduced values
  // Emulated GPUs: the stream-ordered collectives in flight, by issue number.
  std::map<uint64_t, std::shared_ptr<EmulatedCollective>> collectives;

  // All ranks meet; throws if the group is (or becomes) aborted or the wait times out.
  void barrier(int rank);
  // Every rank's value, in rank order (a barrier on each side).
  std::vector<uint64_t> all_gather(int rank, uint64_t value);
  // Makes every rank's pending and future collectives throw "rank R failed: why" (the first
  // abort wins). Returns the group's abort message.
  std::string abort(int rank, const std::string& why);
  // The message of a wait that ran out of time (--comm-timeout); aborts the group with it.
  std::string time_out(int rank);
  // Aborts the group with `message` unless it already is (the first wins), wakes every waiter
  // and ends every emulated collective in flight with the group's message. Returns that.
  std::string fail(const std::string& message);
  bool failed();  // aborted (by any rank, or a timeout)
};

// out[i] = parts[0][i] + parts[1][i] + ... in rank order, for i in [begin, end): the same bits
// on every rank whatever order the ranks arrive in.
inline void sum_in_rank_order(const std::vector<const float*>& parts, size_t begin, size_t end, float* out) {
  for (size_t i = begin; i < end; ++i) {
    float sum = parts[0][i];
    for (size_t k = 1; k < parts.size(); ++k) sum += parts[k][i];
    out[i] = sum;
  }
}

}  // namespace yolo
