// Collective communication between the replicas of a data-parallel run. The in-process
// implementation serves the CPU backend (N replicas as threads of one process): a real,
// concurrent reduction in which every rank sums its own slice of the buffer, always adding
// the ranks in order 0..N-1 so every replica gets the same bits. NCCL serves GPUs
// (runtime/nccl_communicator.h); sockets serve CPU ranks in separate processes
// (runtime/socket_communicator.h); emulated GPUs have their own, over the in-process group
// (runtime/emu_communicator.h).
// Collectives are enqueued on a stream (the replica's communication stream) and run in its
// order; a rank that fails aborts the group, and every rank waiting in a collective then
// throws instead of hanging.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/stream.h"

namespace yolo {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0..count) = sum over ranks, in place, in `stream` order.
  virtual void all_reduce_sum(float* data, size_t count, Stream& stream) = 0;
  // data[0..count) = root's data, in `stream` order.
  virtual void broadcast(float* data, size_t count, int root, Stream& stream) = 0;
  // Host values of every rank, in rank order (blocking; for checks such as parameter hashes).
  virtual std::vector<uint64_t> all_gather(uint64_t value) = 0;
  // Makes every rank's pending and future collectives throw, naming this rank and `why`.
  virtual void abort(const std::string& why) = 0;
  // Whether this communicator has failed (aborted here or by a peer, a peer lost, a wait past
  // the timeout). Thread-safe and cheap: stream host functions ask it. A collective whose data
  // did not all arrive ends only through such a failure, which is set before the collective
  // ends, so work queued after a collective that asks false may trust its result (the
  // training loop's gate on the update: graph/train_loop.cpp).
  virtual bool failed() const = 0;
  // Blocks the host until the collectives enqueued on `stream` are done. Never forever: a
  // peer's failure or a wait past the communicator's timeout throws yolo::Error naming the
  // rank (and aborts the communicator, so the other ranks stop too).
  virtual void wait(Stream& stream) { stream.synchronize(); }
  // As wait, until `event` (recorded on one of this rank's streams) is reached: work queued on
  // that stream after it is not waited for (look-ahead reads a step while the next one runs).
  virtual void wait_until(const Event& event) { event.synchronize(); }
};

// The shared state of N in-process replicas; make one, then take communicator(r) per rank.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size, double timeout_seconds = 300);
  ~InProcessGroup();
  std::unique_ptr<Communicator> communicator(int rank);
  int size() const { return size_; }

  // Internals used by the communicators (in_process_group.h).
  struct Shared;
  const std::shared_ptr<Shared>& shared() const { return shared_; }

 private:
  int size_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace yolo
