// When a peer is lost (it died, hung past --comm-timeout or aborted), the ranks still running
// save the last step every replica completed before they stop (see train_loop_phases.h).
//
// Why their state is that step: each step's update waits for its all-reduces and is gated on
// them (gate_update, train_loop.cpp): a step whose collectives did not complete on this rank
// skips its update, so the parameters, momentum and loss scale are those every replica had
// after the last completed step. The loop knows which steps were in flight (queued, not read)
// and reads each one's gate once the queued work has ended: all of them dropped, the state is
// that of the steps read, and it is saved as such. One whose collectives did complete here but
// that was not read yet cannot be told from its successors' state without reading it: then
// nothing is saved and the checkpoint on disk stays (said so).
// Every survivor tries; a lock on the run folder lets one write, and the others find its
// checkpoint of the same step there. BatchNorm's running statistics (per replica, rank 0's
// otherwise saved) are this rank's, and include the dropped steps' batches.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "graph/checkpoint_files.h"
#include "graph/divergence.h"
#include "graph/train_loop_phases.h"
#include "runtime/check.h"

namespace yolo::graph {

namespace {

// An exclusive lock on a file of the run folder while it lives (flock: between processes and
// between threads alike, each opening the file itself).
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir) : fd_(open((dir + "/.save.lock").c_str(), O_CREAT | O_RDWR, 0644)) {
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~FolderLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_;
};

}  // namespace

// The steps this rank's state holds ("" and *steps set), or why it cannot tell.
std::string TrainLoop::survivor_state(int64_t* steps) const {
  const int* gates = static_cast<const int*>(dp_->gate_host.data());
  for (int64_t it = read_through_; it <= queued_through_; ++it) {
    const int slot = result_slot(look_ahead_, it, subdivisions_, subdivisions_ - 1);
    if (gates[slot] == 1) continue;  // dropped: its update left everything as it was
    return gates[slot] == 0 ? "step " + std::to_string(it + 1) + "'s all-reduces completed on this rank but it was not "
                                  "read, so this rank's state may be that of either step"
                            : "step " + std::to_string(it + 1) + "'s gate never ran";
  }
  *steps = read_through_;
  return "";
}

std::string TrainLoop::save_as_survivor() {
  const std::string who = "rank " + std::to_string(rank_);
  std::string note;
  try {
    if (const std::string failure = saver_->wait(); !failure.empty()) std::fprintf(stderr, "train_yolo: %s\n", failure.c_str());
    // The queued work ends (the failed collectives ended with the failure); its errors are the failure's own.
    for (Stream* stream : {&executor_.compute_stream(), dp_->stream}) {
      try {
        stream->synchronize();
      } catch (const std::exception&) {
      }
    }
    int64_t steps = -1;
    if (std::string why = survivor_state(&steps); !why.empty())
      return "; " + who + " did not save: " + why + " (the checkpoint on disk is kept)";
    if (steps == start_iteration_ && start_iteration_ == 0) return "; " + who + " had completed no step: nothing to save";
    if (divergence_.skipping() && !state_finite(executor_))
      return "; " + who + " did not save: its state is not finite (the checkpoint on disk is kept)";
    const std::string last = options_.out_dir + "/last.ckpt";
    const std::string dropped = queued_through_ >= steps ? " (step " + std::to_string(steps + 1) + ", under way, was "
                                                           "dropped: its update is gated on its all-reduces)"
                                                         : "";
    FolderLock lock(options_.out_dir);
    std::error_code error;
    const bool ours = std::filesystem::exists(last) && std::filesystem::last_write_time(last, error) >= run_began_;
    const std::optional<int64_t> there = ours ? peek_checkpoint_iteration(last) : std::nullopt;
    if (there && *there >= steps) {
      note = "; " + who + " found the state after step " + std::to_string(*there) + " saved already in " + last;
    } else {
      save(steps, /*check_mirror=*/false);  // the device's loss scale moved with the dropped steps
      note = "; " + who + " saved the state after step " + std::to_string(steps) +
             ", the last step every replica completed" + dropped + ", in " + last + " and last.weights";
    }
  } catch (const std::exception& e) {
    return "; " + who + " could not save: " + e.what();
  }
  const std::string resume = options_.resume_command.empty() ? "--resume" : options_.resume_command;
  note += "; to continue, on this or another number of replicas: " + resume;
  if (dp_->survivor_saved) dp_->survivor_saved(note.substr(2));
  return note;
}

}  // namespace yolo::graph
