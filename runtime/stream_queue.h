// The work queue behind every stream that is not a CUDA stream: the CPU backend's and the
// emulated GPUs'. Each queue has a thread of its own that runs the queue's items in order: work
// (a CPU op, a copy, an emulated kernel, a step of a collective, a host function), event records
// and event waits. A HostEvent numbers its records: a wait waits for one generation, which
// completes when the recording queue reaches that record. Used through yolo::Stream and
// yolo::Event (stream.h); collectives of emulated GPUs use the HostEvent functions directly.
//
// How items are scheduled:
//   - By default every queue runs an item as soon as the waits before it allow: compute, copy
//     and communication queues really overlap (emulated kernels still run one at a time).
//   - In the adversarial mode (emulated GPUs' queues only; set_adversarial_schedule) work is
//     delayed as far as the waits allow, so a missing synchronisation fails every time instead
//     of by chance. A normal-priority queue runs an item only when something needs it - the host
//     (a stream or event synchronise, an event query, a copy to pageable memory) or a running
//     queue that waits for an event recorded on it - and only up to that point. A high-priority
//     (communication) queue runs each item as soon as its waits allow, as a GPU favours it. One
//     item runs at a time in the whole process; equally urgent queues are picked by the seed.
//     So a consumer that forgot to wait for its producer reads the data before it is written,
//     and a host that forgot to synchronise reads what the device has not produced yet. (Event
//     timings then measure the schedule, not the work.)
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace yolo {

class StreamQueue;
struct CapturedGraph;

// Numbered completion points: the state behind an Event of a CPU or emulated stream, and behind
// the completion of an emulated GPUs' collective. Generations may complete in any order; all of
// 1..prefix are complete, plus those in `later`. Guarded by the queues' lock.
struct HostEvent {
  using Clock = std::chrono::steady_clock;
  uint64_t issued = 0;  // generations handed out (by records)
  uint64_t prefix = 0;
  std::map<uint64_t, Clock::time_point> later;
  Clock::time_point prefix_time{};
  // Pending generations: the queue items that complete them (what the adversarial mode asks
  // for when something waits), and the generations asked for before their producer was known.
  std::map<uint64_t, std::vector<std::pair<StreamQueue*, uint64_t>>> producers;
  std::set<uint64_t> wanted;
  std::string failure;  // set by a failed completion (an aborted collective): waits fail with it
  // Generations recorded during a stream capture that has not ended (stream_capture.h): only
  // streams of the same capture may wait on them, and the host may not.
  std::map<uint64_t, CapturedGraph*> captured;

  bool is_complete(uint64_t generation) const { return generation <= prefix || later.count(generation); }
};

// The adversarial mode for emulated GPUs' queues (nullopt: off). The default comes from the
// environment variable YOLO_EMU_ADVERSARIAL (a seed). Changing it while an emulated GPU's queue
// exists throws yolo::Error.
void set_adversarial_schedule(std::optional<uint64_t> seed);
std::optional<uint64_t> adversarial_schedule();

class StreamQueue {
 public:
  // emulated_device: the emulated GPU it belongs to (scheduled adversarially in that mode), or -1
  // for the CPU; high_priority: eager in the adversarial mode.
  StreamQueue(std::string name, int emulated_device, bool high_priority);
  ~StreamQueue();  // runs what was queued, then joins its thread
  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;

  uint64_t push(std::function<void()> work);                 // returns the item's number (1, 2, ...)
  // Returns the generation issued. external: in a capture, each launch records `event` itself
  // (CUDA's cudaEventRecordExternal), for events the host reads after a launch (timings).
  uint64_t record(const std::shared_ptr<HostEvent>& event, bool external = false);
  void wait(const std::shared_ptr<HostEvent>& event, uint64_t generation);  // generation 0: nothing
  // Blocking waits (these two, and host_event_wait) must not be called from a queue's own work
  // (nor from any work of an adversarially scheduled queue): they throw yolo::Error instead of
  // deadlocking.
  void drain();                   // everything pushed so far has run; rethrows (and forgets) the first error
  void wait_for(uint64_t item);   // `item` has run; rethrows (and forgets) the first error, as drain
  bool scheduled() const { return scheduled_; }
  bool has_run(uint64_t item);    // never blocks (asks for the item in the adversarial mode)
  uint64_t pushed() const;
  const std::string& name() const { return name_; }
  int emulated_device() const { return emulated_device_; }
  bool high_priority() const { return high_priority_; }

  // Stream capture (stream_capture.h, CUDA's cudaStreamBeginCapture): while a queue captures, what
  // is pushed, recorded and waited on it goes into the graph instead of running (push returns 0).
  // A queue that waits on an event recorded in the capture joins it. The blocking calls above
  // throw on a capturing queue, as CUDA refuses them.
  // Work whose items must be made afresh at each launch (a collective's, which are numbered as
  // they are issued): outside a capture, enqueue(*this) now; in a capture, each launch calls
  // enqueue with the queue the graph runs that branch on.
  void push_replayable(std::function<void(StreamQueue&)> enqueue);
  void begin_capture();                          // throws if this queue is capturing already
  std::shared_ptr<CapturedGraph> end_capture();  // the capture this queue began; throws if unjoined
  bool capturing() const;

  struct Item {
    enum class Kind { Work, Record, Wait } kind = Kind::Work;
    std::function<void()> work;
    std::shared_ptr<HostEvent> event;
    uint64_t generation = 0;
    bool external = false;                     // Record: a launch records `event` itself too
    std::function<void(StreamQueue&)> replay;  // Work from push_replayable: a launch calls this
  };

 private:
  friend struct QueueScheduler;
  uint64_t push_item(Item item);
  void capture_item(Item item);                      // the queues' lock held
  void refuse_if_capturing(const char* what) const;  // the queues' lock held
  void run();

  std::string name_;
  bool high_priority_ = false;
  bool scheduled_ = false;  // adversarial: runs only what the scheduler grants
  bool eager_ = false;      // adversarial: high priority
  int emulated_device_ = -1;
  // Guarded by the queues' lock:
  std::deque<Item> items_;
  uint64_t pushed_ = 0, finished_ = 0, demanded_ = 0;
  bool stopping_ = false, granted_ = false;
  std::exception_ptr first_error_;
  std::shared_ptr<CapturedGraph> capture_;  // the capture this queue takes part in, or null
  std::thread thread_;
};

// What a capture recorded: per queue (the one that began it first, then those that joined), its
// items in order. Replayed by stream_capture.h's Graph.
struct CapturedGraph : std::enable_shared_from_this<CapturedGraph> {
  StreamQueue* origin = nullptr;
  std::vector<std::pair<StreamQueue*, std::vector<StreamQueue::Item>>> queues;
  std::vector<StreamQueue::Item>& items_of(StreamQueue* queue);
};

// HostEvent operations for the host and for collectives (each takes the queues' lock).
std::shared_ptr<HostEvent> make_host_event();
uint64_t host_event_issued(const HostEvent& event);
// Whether `generation` is complete; if not, asks for it (adversarial mode). Never blocks.
bool host_event_done(const std::shared_ptr<HostEvent>& event, uint64_t generation);
void host_event_wait(const std::shared_ptr<HostEvent>& event, uint64_t generation);  // blocks until complete
// When `generation` completed (it must be complete).
HostEvent::Clock::time_point host_event_time(const std::shared_ptr<HostEvent>& event, uint64_t generation);
// For completions that no record makes (collectives): a new generation, its completion (failure
// non-empty: its waits fail with that message), and the queue items that bring it about.
uint64_t issue_host_event(const std::shared_ptr<HostEvent>& event);
void complete_host_event(const std::shared_ptr<HostEvent>& event, uint64_t generation, const std::string& failure = "");
void add_host_event_producer(const std::shared_ptr<HostEvent>& event, uint64_t generation, StreamQueue& queue,
                             uint64_t item);

}  // namespace yolo
