// The emulated GPUs' communicator (see emu_communicator.h).
#include "runtime/emu_communicator.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/check.h"
#include "runtime/in_process_group.h"
#include "runtime/stream_queue.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

namespace yolo {

#if YOLO_EMULATED_KERNELS

namespace {

using Clock = std::chrono::steady_clock;

class EmulatedGpuCommunicator : public Communicator {
 public:
  EmulatedGpuCommunicator(std::shared_ptr<InProcessGroup::Shared> shared, int rank, Device device)
      : shared_(std::move(shared)), rank_(rank), device_(device) {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }

  void all_reduce_sum(float* data, size_t count, Stream& stream) override {
    enqueue("all-reduce", -1, data, count, stream);
  }

  void broadcast(float* data, size_t count, int root, Stream& stream) override {
    if (root < 0 || root >= size()) throw Error("broadcast: root " + std::to_string(root) + " outside the group");
    enqueue("broadcast", root, data, count, stream);
  }

  std::vector<uint64_t> all_gather(uint64_t value) override { return shared_->all_gather(rank_, value); }

  void abort(const std::string& why) override { shared_->abort(rank_, why); }

  bool failed() const override { return shared_->failed(); }

  // Polls the stream (asking for its work in the adversarial mode) until done, an abort, or
  // the group's timeout.
  void wait(Stream& stream) override {
    StreamQueue& queue = own_queue(stream);
    const uint64_t target = queue.pushed();
    poll([&] { return queue.has_run(target); });
  }

  void wait_until(const Event& event) override {
    if (event.device() != device_)
      throw Error("rank " + std::to_string(rank_) + " (" + device_.name() + "): a wait for an event of " +
                  event.device().name());
    poll([&] { return event.query(); });  // a query asks for the event in the adversarial mode
  }

 private:
  template <typename Done>
  void poll(Done done) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(shared_->timeout);
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      // As NCCL's state is checked with its stream (nccl_communicator.cpp): an aborted group
      // fails the wait even where the stream has run (its collectives ended with the abort).
      const bool ran = done();
      std::string aborted = aborted_message();
      if (!aborted.empty()) throw Error(shared_->fail(aborted));
      if (ran) return;
      if (Clock::now() > deadline) throw Error(shared_->time_out(rank_));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  std::string aborted_message() {
    std::lock_guard lock(shared_->mutex);
    return shared_->aborted;
  }

  StreamQueue& own_queue(Stream& stream) const {
    if (stream.device() != device_ || !stream.queue())
      throw Error("rank " + std::to_string(rank_) + " (" + device_.name() + "): a collective on stream '" +
                  stream.name() + "' of " + stream.device().name() + " (it must be a stream of " + device_.name() + ")");
    return *stream.queue();
  }

  // In a stream capture the collective is numbered and queued afresh at each launch of the graph
  // (push_replayable), as every rank captures and launches alike; the graph must not outlive this
  // communicator.
  void enqueue(const char* op, int root, float* data, size_t count, Stream& stream) {
    own_queue(stream).push_replayable(
        [this, op, root, data, count](StreamQueue& queue) { enqueue_on(op, root, data, count, queue); });
  }

  // This rank's part of collective number `++issued_` (every rank issues them in one order):
  // an arrive item, then a wait for the collective's completion.
  void enqueue_on(const char* op, int root, float* data, size_t count, StreamQueue& queue) {
    auto& s = *shared_;
    std::shared_ptr<EmulatedCollective> c;
    std::string out_of_step;
    {
      std::lock_guard lock(s.mutex);
      if (!s.aborted.empty()) throw Error("rank " + std::to_string(rank_) + ": the communicator was aborted: " + s.aborted);
      uint64_t number = ++issued_;
      auto [it, fresh] = s.collectives.try_emplace(number);
      if (fresh) {
        it->second = std::make_shared<EmulatedCollective>();
        it->second->op = op;
        it->second->root = root;
        it->second->count = count;
        it->second->contributions.resize(size_t(s.size));
        it->second->outputs.assign(size_t(s.size), nullptr);
      }
      c = it->second;
      if (c->op != std::string(op) || c->root != root || c->count != count)
        out_of_step = "rank " + std::to_string(rank_) + " issued a " + op + " of " + std::to_string(count) +
                      " floats where another rank issued a " + c->op + " of " + std::to_string(c->count) +
                      ": the ranks' collectives are out of step";
    }
    if (!out_of_step.empty()) throw Error(s.fail(out_of_step));
    std::shared_ptr<InProcessGroup::Shared> shared = shared_;
    const int rank = rank_, device = device_.index;
    uint64_t item = queue.push([shared, c, rank, device, data] { arrive(*shared, *c, rank, device, data); });
    add_host_event_producer(c->done, c->generation, queue, item);
    queue.wait(c->done, c->generation);
  }

  // Runs on the rank's stream: reads its contribution now; the last rank to arrive writes every
  // rank's result and completes the collective.
  static void arrive(InProcessGroup::Shared& s, EmulatedCollective& c, int rank, int device, float* data) {
    try {
      // A device whose context a fault lost cannot run its part (NCCL's kernel would not launch;
      // the error reaches the host and it aborts): no contribution, the group aborted.
      if (const std::string lost = emu::device_failure(device); !lost.empty()) throw Error(lost);
      take_part(s, c, rank, data);
    } catch (const std::exception& e) {
      // Whatever went wrong, no rank's stream may wait for this collective forever.
      std::string why = s.fail("rank " + std::to_string(rank) + " failed in a " + c.op + ": " + e.what());
      complete_host_event(c.done, c.generation, why);  // in case it had already left the table
      throw;
    }
  }

  static void take_part(InProcessGroup::Shared& s, EmulatedCollective& c, int rank, float* data) {
    {
      emu::DeviceAccess access;
      if (c.root < 0 || c.root == rank) c.contributions[size_t(rank)].assign(data, data + c.count);
    }
    bool last = false;
    {
      std::lock_guard lock(s.mutex);
      if (!s.aborted.empty()) throw Error(s.aborted);
      c.outputs[size_t(rank)] = data;
      last = ++c.arrived == s.size;
      if (last)
        for (auto it = s.collectives.begin(); it != s.collectives.end(); ++it)
          if (it->second.get() == &c) {
            s.collectives.erase(it);
            break;
          }
    }
    if (!last) return;
    {
      emu::DeviceAccess access;
      std::vector<float> result;
      if (c.root < 0) {
        std::vector<const float*> parts;
        for (const std::vector<float>& part : c.contributions) parts.push_back(part.data());
        result.resize(c.count);
        sum_in_rank_order(parts, 0, c.count, result.data());
      } else {
        result = c.contributions[size_t(c.root)];
      }
      for (float* out : c.outputs) std::copy(result.begin(), result.end(), out);
    }
    complete_host_event(c.done, c.generation);
  }

  std::shared_ptr<InProcessGroup::Shared> shared_;
  int rank_;
  Device device_;
  uint64_t issued_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> emulated_gpu_communicator(InProcessGroup& group, int rank, Device device) {
  if (!device.is_emu()) throw Error("an emulated GPUs' communicator needs an emulated GPU, not " + device.name());
  if (rank < 0 || rank >= group.size())
    throw Error("rank " + std::to_string(rank) + " outside the group of " + std::to_string(group.size()));
  return std::make_unique<EmulatedGpuCommunicator>(group.shared(), rank, device);
}

#else

std::unique_ptr<Communicator> emulated_gpu_communicator(InProcessGroup&, int, Device device) {
  throw Error(device.name() + ": emulated GPUs exist only in builds whose kernels are emulated (build/train_yolo_emu)");
}

#endif

std::unique_ptr<Communicator> replica_communicator(InProcessGroup& group, int rank, Device device) {
  if (device.is_emu()) return emulated_gpu_communicator(group, rank, device);
  if (device.is_cuda()) throw Error(device.name() + ": GPUs in one process talk through NCCL, not an in-process group");
  return group.communicator(rank);
}

}  // namespace yolo
