// Checkpoints written while training goes on, so that saving by default costs the step almost
// nothing. After the step a save is due, the training state is copied to host memory in stream
// order (Executor::queue_state_copy: on a GPU a device-to-host copy into pinned memory, which the
// next step's work follows on the compute stream; on the CPU a memcpy on the compute stream's
// thread). Once that step has been read and kept (its update applied, nothing diverging), a
// thread of the saver's own packs the copy and writes last.weights and last.ckpt (prev.ckpt kept:
// checkpoint_files.h) while the next steps run. One save at a time: queuing a copy while the
// previous write goes on waits for that write first (at the default interval, never).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "graph/executor.h"
#include "graph/weights.h"

namespace yolo::graph {

class CheckpointSaver {
 public:
  CheckpointSaver(Executor& executor, std::string out_dir);
  ~CheckpointSaver();  // waits for the write under way (its failure is printed, not lost)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Queues the state's copy after the work queued so far on the executor's compute stream.
  void queue_copy();
  bool copy_queued() const { return copy_queued_; }
  // The step after which the copy was queued has been read and is kept: `checkpoint` (its
  // tensors besides params, momentum and stats, such as the loss scale's) is written with the
  // copy's tensors, and last.weights with `seen`, on the saver's thread.
  void write(Checkpoint checkpoint, uint64_t seen);
  // The copy is not written (its step was skipped).
  void discard() { copy_queued_ = false; }
  // Waits for the write under way; returns its failure ("" if none, or none under way).
  std::string wait();
  // A finished write's failure, once, without waiting ("" if none).
  std::string take_failure();
  // Writes finished, and the seconds they took on the saver's thread (after its copy), in all.
  int64_t written() const;
  double write_seconds() const;

 private:
  void write_now(Checkpoint checkpoint, std::vector<LayerParams> layers, uint64_t seen);

  Executor& executor_;
  const std::string out_dir_;
  Executor::StateCopy copy_;
  bool copy_queued_ = false;
  std::thread writer_;
  mutable std::mutex mutex_;  // guards failure_, written_, write_seconds_
  std::string failure_;
  int64_t written_ = 0;
  double write_seconds_ = 0;
};

}  // namespace yolo::graph
