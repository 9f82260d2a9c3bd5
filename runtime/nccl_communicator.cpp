// NCCL communicator (see nccl_communicator.h). Every NCCL call goes through the run-time
// loaded table and is checked; on a non-blocking communicator a call may answer ncclInProgress,
// after which the state is polled with ncclCommGetAsyncError (with a deadline) before the next.
#include "runtime/nccl_communicator.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/check.h"
#include "runtime/nccl_loader.h"
#include "runtime/stream.h"

namespace yolo {

#if YOLO_HAVE_NCCL
namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(Device device, int rank, int world, const ncclUniqueId& id, double timeout,
                   std::shared_ptr<NcclLocalGroup> local)
      : device_(device), rank_(rank), world_(world), timeout_(timeout), local_(std::move(local)), side_(device, StreamPriority::High, "nccl") {
    try {
      set_current_device(device);
      CHECKED(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      CHECKED(cudaMalloc(&gathered_, sizeof(uint64_t) * world));
      CHECKED(cudaMallocHost(&host_values_, sizeof(uint64_t) * world));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // every wait is ours to bound
      ncclResult_t status = nccl().CommInitRankConfig(&comm_, world, id, rank, &config);
      if (status != ncclSuccess && status != ncclInProgress) {
        comm_ = nullptr;
        CHECKED(status);
      }
      settle("joining the NCCL communicator of " + std::to_string(world) + " ranks");
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCommunicator() override {
    try {
      set_current_device(device_);
      if (comm_ && aborted_.empty()) {
        // A clean end: flush, then destroy; anything wrong there and it is aborted instead.
        ncclResult_t status = nccl().CommFinalize(comm_);
        if (status == ncclInProgress) settle("finalizing the NCCL communicator");
        else if (status != ncclSuccess) throw Error("ncclCommFinalize failed");
        nccl().CommDestroy(comm_);
        comm_ = nullptr;
      }
    } catch (...) {
      // Destructors never throw: abort below.
    }
    release();
  }

  int rank() const override { return rank_; }
  int size() const override { return world_; }

  void all_reduce_sum(float* data, size_t count, Stream& stream) override {
    usable();
    set_current_device(device_);
    enqueued(nccl().AllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream.native()), "all-reduce");
  }

  void broadcast(float* data, size_t count, int root, Stream& stream) override {
    usable();
    set_current_device(device_);
    enqueued(nccl().Broadcast(data, data, count, ncclFloat32, root, comm_, stream.native()), "broadcast");
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    usable();
    set_current_device(device_);
    host_values_[rank_] = value;
    cudaStream_t st = side_.native();
    CHECKED(cudaMemcpyAsync(gathered_ + rank_, host_values_ + rank_, sizeof(uint64_t), cudaMemcpyHostToDevice, st));
    // In place: this rank's value already sits in its slot of the result.
    enqueued(nccl().AllGather(gathered_ + rank_, gathered_, 1, ncclUint64, comm_, st), "all-gather");
    wait(side_);  // with the deadline; the copy back then cannot block on a stuck collective
    CHECKED(cudaMemcpyAsync(host_values_, gathered_, sizeof(uint64_t) * world_, cudaMemcpyDeviceToHost, st));
    CHECKED(cudaStreamSynchronize(st));
    return std::vector<uint64_t>(host_values_, host_values_ + world_);
  }

  void abort(const std::string& why) override {
    if (!aborted_.empty()) return;
    aborted_ = why.empty() ? "aborted" : why;
    failed_ = true;  // before the abort ends the pending collectives (Communicator::failed)
    if (local_) {
      int none = -1;
      local_->failed_rank.compare_exchange_strong(none, rank_);
    }
    if (comm_) nccl().CommAbort(comm_);  // the pending collectives end; nothing more to check
    comm_ = nullptr;
  }

  bool failed() const override { return failed_; }

  // Polls the stream's progress and NCCL's error state until done, a failure, or the deadline.
  void wait(Stream& stream) override {
    usable();
    set_current_device(device_);
    CHECKED(cudaEventRecord(done_, stream.native()));
    poll_until([&] {
      cudaError_t state = cudaEventQuery(done_);
      if (state == cudaErrorNotReady) return false;
      CHECKED(state);
      return true;
    }, "the collectives on stream " + stream.name());
  }

  void wait_until(const Event& event) override {
    usable();
    set_current_device(device_);
    poll_until([&] { return event.query(); }, "the collectives before an event");
  }

 private:
  // Throws when this communicator can no longer be used.
  void usable() const {
    if (!aborted_.empty()) throw Error("rank " + std::to_string(rank_) + ": the NCCL communicator was aborted: " + aborted_);
  }

  void enqueued(ncclResult_t status, const char* what) {
    if (status == ncclInProgress) settle(what);
    else if (status != ncclSuccess) fail(std::string(what) + " failed: " + nccl().GetErrorString(status));
  }

  // Waits until the communicator's state leaves ncclInProgress.
  void settle(const std::string& what) {
    poll_until([&] {
      ncclResult_t state = ncclSuccess;
      CHECKED(nccl().CommGetAsyncError(comm_, &state));
      return state != ncclInProgress;
    }, what);
  }

  template <typename Done>
  void poll_until(Done done, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    auto pause = std::chrono::microseconds(50);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      CHECKED(nccl().CommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress)
        fail(what + ": " + nccl().GetErrorString(state) + " (a peer rank failed or went away)");
      if (done()) return;
      if (local_ && local_->failed_rank.load() >= 0 && local_->failed_rank.load() != rank_)
        fail(what + ": rank " + std::to_string(local_->failed_rank.load()) + " failed");
      if (Clock::now() > deadline)
        fail("waited " + std::to_string(static_cast<int>(timeout_)) + " s for " + what +
             " (--comm-timeout): a peer rank stopped or is stuck");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    std::string message = "rank " + std::to_string(rank_) + " (" + device_.name() + "): " + why;
    abort(message);
    throw Error(message);
  }

  void release() {
    if (comm_) nccl().CommAbort(comm_);
    comm_ = nullptr;
    if (gathered_) cudaFree(gathered_);
    if (host_values_) cudaFreeHost(host_values_);
    if (done_) cudaEventDestroy(done_);
    gathered_ = nullptr;
    host_values_ = nullptr;
    done_ = nullptr;
  }

  Device device_;
  int rank_, world_;
  double timeout_;
  std::shared_ptr<NcclLocalGroup> local_;
  Stream side_;  // the all-gather of parameter hashes
  ncclComm_t comm_ = nullptr;
  cudaEvent_t done_ = nullptr;
  uint64_t* gathered_ = nullptr;
  uint64_t* host_values_ = nullptr;
  std::string aborted_;
  // Set before ncclCommAbort: NCCL's kernels on this rank wait for a lost peer's data until
  // then (NCCL reports such errors and leaves the abort to us), so a collective that ends early
  // ends after this is set.
  std::atomic<bool> failed_{false};
};

}  // namespace

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  CHECKED(nccl().GetUniqueId(&id));
  return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(id.internal),
                              reinterpret_cast<const uint8_t*>(id.internal) + sizeof id.internal);
}

std::unique_ptr<Communicator> nccl_communicator(Device device, int rank, int world, const std::vector<uint8_t>& id,
                                                double timeout_seconds, std::shared_ptr<NcclLocalGroup> local) {
  if (!device.is_cuda()) throw Error("an NCCL communicator needs a GPU, not " + device.name());
  if (rank < 0 || rank >= world) throw Error("rank " + std::to_string(rank) + " outside a job of " + std::to_string(world));
  ncclUniqueId nid;
  if (id.size() != sizeof nid.internal)
    throw Error("the NCCL id has " + std::to_string(id.size()) + " bytes, not " + std::to_string(sizeof nid.internal));
  std::memcpy(nid.internal, id.data(), sizeof nid.internal);
  return std::make_unique<NcclCommunicator>(device, rank, world, nid, timeout_seconds, std::move(local));
}

#else

std::vector<uint8_t> nccl_unique_id() {
  throw Error("several GPUs need NCCL, which this build does not have: " + nccl_status().why_not);
}

std::unique_ptr<Communicator> nccl_communicator(Device, int, int, const std::vector<uint8_t>&, double,
                                                std::shared_ptr<NcclLocalGroup>) {
  throw Error("several GPUs need NCCL, which this build does not have: " + nccl_status().why_not);
}

#endif

}  // namespace yolo
