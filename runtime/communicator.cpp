// The in-process communicator (see communicator.h): a generation-counted barrier with abort
// and timeout, and collectives built from it over buffers the ranks post.
#include "runtime/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/check.h"
#include "runtime/in_process_group.h"

namespace yolo {

void InProcessGroup::Shared::barrier(int rank) {
  std::unique_lock lock(mutex);
  if (!aborted.empty()) throw Error(aborted);
  uint64_t my_generation = generation;
  if (++arrived == size) {
    arrived = 0;
    ++generation;
    changed.notify_all();
    return;
  }
  bool done = changed.wait_for(lock, std::chrono::duration<double>(timeout),
                               [&] { return generation != my_generation || !aborted.empty(); });
  if (!aborted.empty()) throw Error(aborted);
  if (!done) {
    lock.unlock();
    throw Error(time_out(rank));
  }
}

std::vector<uint64_t> InProcessGroup::Shared::all_gather(int rank, uint64_t value) {
  values[rank] = value;
  barrier(rank);
  std::vector<uint64_t> out = values;
  barrier(rank);
  return out;
}

std::string InProcessGroup::Shared::abort(int rank, const std::string& why) {
  return fail("rank " + std::to_string(rank) + " failed: " + why);
}

std::string InProcessGroup::Shared::time_out(int rank) {
  std::string message = "rank " + std::to_string(rank) + " waited " + std::to_string(static_cast<int>(timeout)) +
                        " s in a collective that the other ranks never joined (--comm-timeout)";
  fail(message);
  return message;
}

bool InProcessGroup::Shared::failed() {
  std::lock_guard lock(mutex);
  return !aborted.empty();
}

std::string InProcessGroup::Shared::fail(const std::string& message) {
  std::vector<std::shared_ptr<EmulatedCollective>> pending;
  std::string why;
  {
    std::lock_guard lock(mutex);
    if (aborted.empty()) aborted = message;
    why = aborted;
    for (auto& [number, collective] : collectives) pending.push_back(collective);
    collectives.clear();
    changed.notify_all();
  }
  for (auto& c : pending) complete_host_event(c->done, c->generation, why);
  return why;
}

namespace {

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }

  void all_reduce_sum(float* data, size_t count, Stream& stream) override {
    stream.enqueue([this, data, count] { reduce_now(data, count); });
  }

  void broadcast(float* data, size_t count, int root, Stream& stream) override {
    stream.enqueue([this, data, count, root] {
      auto& s = *shared_;
      s.buffers[rank_] = data;
      s.barrier(rank_);
      if (rank_ != root) std::memcpy(data, s.buffers[root], count * sizeof(float));
      s.barrier(rank_);  // the root's buffer is read until here
    });
  }

  std::vector<uint64_t> all_gather(uint64_t value) override { return shared_->all_gather(rank_, value); }

  void abort(const std::string& why) override { shared_->abort(rank_, why); }

  bool failed() const override { return shared_->failed(); }

 private:
  // Reduce-scatter then all-gather through the shared scratch: rank r sums slice r of every
  // rank's buffer in rank order (the same bits everywhere), then every rank copies it all back.
  void reduce_now(float* data, size_t count) {
    auto& s = *shared_;
    const int n = s.size;
    s.buffers[rank_] = data;
    if (rank_ == 0 && s.scratch.size() < count) s.scratch.resize(count);
    s.barrier(rank_);
    std::vector<const float*> parts(s.buffers.begin(), s.buffers.end());
    sum_in_rank_order(parts, count * rank_ / n, count * (rank_ + 1) / n, s.scratch.data());
    s.barrier(rank_);
    std::memcpy(data, s.scratch.data(), count * sizeof(float));
    s.barrier(rank_);  // nobody reuses the scratch before everyone has copied
  }

  std::shared_ptr<InProcessGroup::Shared> shared_;
  int rank_;
};

}  // namespace

InProcessGroup::InProcessGroup(int size, double timeout_seconds) : size_(size), shared_(std::make_shared<Shared>()) {
  if (size < 1) throw Error("an in-process group needs at least one rank");
  shared_->size = size;
  shared_->timeout = timeout_seconds;
  shared_->buffers.assign(size, nullptr);
  shared_->values.assign(size, 0);
}

InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  if (rank < 0 || rank >= size_) throw Error("rank " + std::to_string(rank) + " outside the group of " + std::to_string(size_));
  return std::make_unique<InProcessCommunicator>(shared_, rank);
}

}  // namespace yolo
