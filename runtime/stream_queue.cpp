// Stream queues and host events (see stream_queue.h). One lock and one condition variable
// serve every queue and event of the process, so the adversarial scheduler sees all of them at
// once; queues are few (a handful per device) and their items coarse (an op, a kernel, a copy).
#include "runtime/stream_queue.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include "runtime/activity.h"
#include "runtime/check.h"

namespace yolo {

struct QueueScheduler {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<StreamQueue*> queues;  // creation order
  int emulated_queues = 0;
  std::optional<uint64_t> seed;
  std::mt19937_64 rng;
  StreamQueue* running = nullptr;  // adversarial: the queue whose granted item runs

  QueueScheduler() {
    if (const char* text = std::getenv("YOLO_EMU_ADVERSARIAL")) {
      char* end = nullptr;
      unsigned long long value = std::strtoull(text, &end, 10);
      if (*text && end && *end == '\0') {
        seed = value;
        rng.seed(value);
      } else {
        std::fprintf(stderr, "warning: YOLO_EMU_ADVERSARIAL=%s is not a seed (a whole number); ignored\n", text);
      }
    }
  }

  static void complete(HostEvent& e, uint64_t generation, const std::string& failure) {
    if (e.is_complete(generation)) return;
    e.later[generation] = HostEvent::Clock::now();
    for (auto it = e.later.find(e.prefix + 1); it != e.later.end() && it->first == e.prefix + 1; it = e.later.erase(it)) {
      ++e.prefix;
      e.prefix_time = it->second;
    }
    e.producers.erase(generation);
    e.wanted.erase(generation);
    if (!failure.empty() && e.failure.empty()) e.failure = failure;
  }

  // Asks for what completes `generation`; true if some queue's demand grew.
  static bool demand(HostEvent& e, uint64_t generation) {
    if (generation == 0 || e.is_complete(generation)) return false;
    e.wanted.insert(generation);
    bool grew = false;
    if (auto it = e.producers.find(generation); it != e.producers.end())
      for (auto [queue, item] : it->second)
        if (queue->demanded_ < item) {
          queue->demanded_ = item;
          grew = true;
        }
    return grew;
  }

  static bool wait_satisfied(const StreamQueue::Item& item) {
    return item.event->is_complete(item.generation) || !item.event->failure.empty();
  }

  // A satisfied wait at the head leaves the queue; a failed one becomes the queue's error.
  static void finish_wait(StreamQueue& q) {
    const StreamQueue::Item& head = q.items_.front();
    if (!head.event->failure.empty() && !q.first_error_) q.first_error_ = std::make_exception_ptr(Error(head.event->failure));
    q.items_.pop_front();
    ++q.finished_;
  }

  // After any change: in the adversarial mode, settles records and waits at the heads of the
  // scheduled queues, spreads demand along waits, and grants the next work item. Then wakes
  // everyone (queue threads check their own heads otherwise).
  void reschedule() {
    if (seed) {
      for (bool progress = true; progress;) {
        progress = false;
        for (StreamQueue* q : queues) {
          if (!q->scheduled_) continue;
          while (!q->items_.empty()) {
            StreamQueue::Item& head = q->items_.front();
            const bool wanted = q->eager_ || q->demanded_ > q->finished_;
            if (head.kind == StreamQueue::Item::Kind::Record) {
              if (!wanted || (running == q)) break;
              complete(*head.event, head.generation, "");
              q->items_.pop_front();
              ++q->finished_;
              progress = true;
            } else if (head.kind == StreamQueue::Item::Kind::Wait) {
              if (running == q) break;
              if (wait_satisfied(head)) {
                finish_wait(*q);
                progress = true;
                continue;
              }
              if (wanted && demand(*head.event, head.generation)) progress = true;
              break;
            } else {
              break;
            }
          }
        }
      }
      if (!running) {
        std::vector<StreamQueue*> eager, others;
        for (StreamQueue* q : queues) {
          if (!q->scheduled_ || q->items_.empty() || q->items_.front().kind != StreamQueue::Item::Kind::Work) continue;
          if (q->eager_) eager.push_back(q);
          else if (q->demanded_ > q->finished_) others.push_back(q);
        }
        std::vector<StreamQueue*>& pick = eager.empty() ? others : eager;
        if (!pick.empty()) {
          running = pick[pick.size() == 1 ? 0 : rng() % pick.size()];
          running->granted_ = true;
        }
      }
    }
    changed.notify_all();
  }
};

namespace {
// The queue whose work item this thread is running, if any (blocking waits there would deadlock).
thread_local StreamQueue* t_running = nullptr;

// Throws instead of deadlocking: a queue's own item waiting for that queue, or any item of an
// adversarially scheduled queue waiting at all (it holds the one token that could run the work).
void check_may_block(const StreamQueue* target, const char* what) {
  if (!t_running) return;
  if (t_running == target || t_running->scheduled())
    throw Error(std::string(what) + " from work running on stream '" + t_running->name() +
                "' would deadlock: stream work must not wait for streams");
}

// Never destroyed: queue threads may still use it while static objects are torn down at exit.
QueueScheduler& scheduler() {
  static QueueScheduler* s = new QueueScheduler();
  return *s;
}
}  // namespace

void set_adversarial_schedule(std::optional<uint64_t> seed) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (s.emulated_queues > 0)
    throw Error("set_adversarial_schedule: " + std::to_string(s.emulated_queues) +
                " emulated GPU stream(s) exist; change the schedule before creating any");
  s.seed = seed;
  if (seed) s.rng.seed(*seed);
}

std::optional<uint64_t> adversarial_schedule() {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  return s.seed;
}

StreamQueue::StreamQueue(std::string name, int emulated_device, bool high_priority)
    : name_(std::move(name)), high_priority_(high_priority), emulated_device_(emulated_device) {
  const bool emulated_gpu = emulated_device >= 0;
  QueueScheduler& s = scheduler();
  {
    std::lock_guard lock(s.mutex);
    scheduled_ = emulated_gpu && s.seed.has_value();
    eager_ = high_priority;
    if (emulated_gpu) ++s.emulated_queues;  // the schedule cannot change under this queue
  }
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    std::lock_guard lock(s.mutex);
    if (emulated_gpu) --s.emulated_queues;
    throw;
  }
  {
    std::lock_guard lock(s.mutex);
    s.queues.push_back(this);
  }
  // Thread names show in debuggers and traces; Linux allows 15 characters.
  std::string label = ((emulated_gpu ? "e:" : "s:") + name_).substr(0, 15);
  pthread_setname_np(thread_.native_handle(), label.c_str());
}

StreamQueue::~StreamQueue() {
  QueueScheduler& s = scheduler();
  {
    std::lock_guard lock(s.mutex);
    demanded_ = pushed_;
    stopping_ = true;
    s.reschedule();
  }
  thread_.join();
  std::exception_ptr error;
  {
    std::lock_guard lock(s.mutex);
    s.queues.erase(std::find(s.queues.begin(), s.queues.end(), this));
    if (emulated_device_ >= 0) --s.emulated_queues;
    error = first_error_;
  }
  if (error) {  // destructors cannot throw: say it rather than lose it
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: stream '%s' was destroyed with an unreported error: %s\n", name_.c_str(), e.what());
    } catch (...) {
      std::fprintf(stderr, "warning: stream '%s' was destroyed with an unreported error\n", name_.c_str());
    }
  }
}

uint64_t StreamQueue::push_item(Item item) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (capture_ || (item.kind == Item::Kind::Wait && item.event->captured.count(item.generation))) {
    capture_item(std::move(item));
    return 0;
  }
  items_.push_back(std::move(item));
  uint64_t number = ++pushed_;
  if (items_.back().kind == Item::Kind::Record) {
    HostEvent& e = *items_.back().event;
    const uint64_t generation = items_.back().generation;
    e.producers[generation].emplace_back(this, number);
    // A host may have asked for this generation between its issue and this push.
    if (e.wanted.count(generation)) QueueScheduler::demand(e, generation);
  }
  s.reschedule();
  return number;
}

uint64_t StreamQueue::push(std::function<void()> work) {
  Item item;
  item.work = std::move(work);
  return push_item(std::move(item));
}

uint64_t StreamQueue::record(const std::shared_ptr<HostEvent>& event, bool external) {
  QueueScheduler& s = scheduler();
  uint64_t generation;
  {
    std::lock_guard lock(s.mutex);
    generation = ++event->issued;
  }
  Item item;
  item.kind = Item::Kind::Record;
  item.event = event;
  item.generation = generation;
  item.external = external;
  push_item(std::move(item));
  return generation;
}

void StreamQueue::push_replayable(std::function<void(StreamQueue&)> enqueue) {
  {
    QueueScheduler& s = scheduler();
    std::lock_guard lock(s.mutex);
    if (capture_) {
      Item item;
      item.replay = std::move(enqueue);
      capture_item(std::move(item));
      return;
    }
  }
  enqueue(*this);
}

void StreamQueue::wait(const std::shared_ptr<HostEvent>& event, uint64_t generation) {
  if (generation == 0) return;  // never recorded: nothing to wait for, as in CUDA
  Item item;
  item.kind = Item::Kind::Wait;
  item.event = event;
  item.generation = generation;
  push_item(std::move(item));
}

uint64_t StreamQueue::pushed() const {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  return pushed_;
}

void StreamQueue::wait_for(uint64_t item) {
  check_may_block(this, "a copy to pageable memory");
  QueueScheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  refuse_if_capturing("a copy to pageable memory");
  if (demanded_ < item) {
    demanded_ = item;
    s.reschedule();
  }
  s.changed.wait(lock, [&] { return finished_ >= item; });
  if (first_error_) std::rethrow_exception(std::exchange(first_error_, nullptr));
}

bool StreamQueue::has_run(uint64_t item) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  refuse_if_capturing("a stream query");
  if (finished_ >= item) return true;
  if (demanded_ < item) {
    demanded_ = item;
    s.reschedule();
  }
  return false;
}

void StreamQueue::drain() {
  check_may_block(this, "a stream synchronise");
  QueueScheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  refuse_if_capturing("a stream synchronise");
  uint64_t target = pushed_;
  if (demanded_ < target) {
    demanded_ = target;
    s.reschedule();
  }
  s.changed.wait(lock, [&] { return finished_ >= target; });
  if (first_error_) std::rethrow_exception(std::exchange(first_error_, nullptr));
}

void StreamQueue::run() {
  QueueScheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  for (;;) {
    if (scheduled_) {
      // The scheduler settles records and waits; this thread runs the work it is granted.
      s.changed.wait(lock, [&] { return granted_ || (stopping_ && items_.empty()); });
      if (!granted_) return;
    } else {
      s.changed.wait(lock, [&] {
        if (items_.empty()) return stopping_;
        const Item& head = items_.front();
        return head.kind != Item::Kind::Wait || QueueScheduler::wait_satisfied(head);
      });
      if (items_.empty()) return;  // stopping, and everything has run
      Item& head = items_.front();
      if (head.kind == Item::Kind::Wait) {
        QueueScheduler::finish_wait(*this);
        s.reschedule();
        continue;
      }
      if (head.kind == Item::Kind::Record) {
        QueueScheduler::complete(*head.event, head.generation, "");
        items_.pop_front();
        ++finished_;
        s.reschedule();  // a scheduled queue may wait for it
        continue;
      }
    }
    Item item = std::move(items_.front());
    items_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    t_running = this;
    // Emulated GPUs' activity for the step split's idle time (activity.h).
    const bool timed = emulated_activity_on(emulated_device_);
    const int64_t started = timed ? emulated_activity_now_ns() : 0;
    try {
      item.work();
    } catch (...) {
      error = std::current_exception();
    }
    if (timed) record_emulated_activity(emulated_device_, started, emulated_activity_now_ns(), name_);
    t_running = nullptr;
    lock.lock();
    if (error && !first_error_) first_error_ = error;
    ++finished_;
    if (scheduled_) {
      granted_ = false;
      s.running = nullptr;
    }
    s.reschedule();
    // Its captures are released with the token handed on (a destructor may wait on a stream).
    lock.unlock();
    item.work = nullptr;
    lock.lock();
  }
}

std::shared_ptr<HostEvent> make_host_event() { return std::make_shared<HostEvent>(); }

uint64_t host_event_issued(const HostEvent& event) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  return event.issued;
}

// The host may not wait on, or query, a record made in a capture that has not ended.
static void refuse_captured(const HostEvent& event, uint64_t generation, const char* what) {
  if (event.captured.count(generation))
    throw Error(std::string(what) +
                " of an event recorded in a stream capture that has not ended (CUDA refuses it: "
                "cudaErrorCapturedEvent)");
}

bool host_event_done(const std::shared_ptr<HostEvent>& event, uint64_t generation) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  refuse_captured(*event, generation, "a query");
  if (generation == 0 || event->is_complete(generation)) return true;
  if (QueueScheduler::demand(*event, generation)) s.reschedule();
  return false;
}

void host_event_wait(const std::shared_ptr<HostEvent>& event, uint64_t generation) {
  check_may_block(nullptr, "an event synchronise");
  QueueScheduler& s = scheduler();
  std::unique_lock lock(s.mutex);
  if (generation == 0) return;
  refuse_captured(*event, generation, "a synchronise");
  if (QueueScheduler::demand(*event, generation)) s.reschedule();
  s.changed.wait(lock, [&] { return event->is_complete(generation); });
}

HostEvent::Clock::time_point host_event_time(const std::shared_ptr<HostEvent>& event, uint64_t generation) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (!event->is_complete(generation)) throw Error("host_event_time: the event has not completed");
  if (generation == event->prefix) return event->prefix_time;
  auto it = event->later.find(generation);
  if (it == event->later.end())
    throw Error("host_event_time: only an event's latest completion is kept (generation " + std::to_string(generation) +
                " is older)");
  return it->second;
}

uint64_t issue_host_event(const std::shared_ptr<HostEvent>& event) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  return ++event->issued;
}

void complete_host_event(const std::shared_ptr<HostEvent>& event, uint64_t generation, const std::string& failure) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  QueueScheduler::complete(*event, generation, failure);
  s.reschedule();
}

void add_host_event_producer(const std::shared_ptr<HostEvent>& event, uint64_t generation, StreamQueue& queue,
                             uint64_t item) {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (event->is_complete(generation)) return;
  event->producers[generation].emplace_back(&queue, item);
  if (event->wanted.count(generation) && QueueScheduler::demand(*event, generation)) s.reschedule();
}

// ---- stream capture ------------------------------------------------------------------------

std::vector<StreamQueue::Item>& CapturedGraph::items_of(StreamQueue* queue) {
  for (auto& [q, items] : queues)
    if (q == queue) return items;
  queues.emplace_back(queue, std::vector<StreamQueue::Item>{});
  return queues.back().second;
}

void StreamQueue::refuse_if_capturing(const char* what) const {
  if (capture_)
    throw Error(std::string(what) + " on stream '" + name_ +
                "', which is capturing (CUDA refuses it: "
                "cudaErrorStreamCaptureUnsupported)");
}

void StreamQueue::capture_item(Item item) {
  if (item.kind == Item::Kind::Wait) {
    auto it = item.event->captured.find(item.generation);
    if (it == item.event->captured.end())
      throw Error("stream '" + name_ +
                  "' waits, in a capture, on an event recorded outside it (CUDA refuses it: "
                  "cudaErrorStreamCaptureIsolation)");
    if (!capture_) {
      capture_ = it->second->shared_from_this();  // a fork: this queue joins the capture
    } else if (it->second != capture_.get()) {
      throw Error("stream '" + name_ + "' waits on an event recorded in another stream capture");
    }
  }
  if (item.kind == Item::Kind::Record) item.event->captured[item.generation] = capture_.get();
  capture_->items_of(this).push_back(std::move(item));
}

void StreamQueue::begin_capture() {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (capture_) throw Error("stream '" + name_ + "' is capturing already");
  capture_ = std::make_shared<CapturedGraph>();
  capture_->origin = this;
  capture_->items_of(this);
}

bool StreamQueue::capturing() const {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  return capture_ != nullptr;
}

std::shared_ptr<CapturedGraph> StreamQueue::end_capture() {
  QueueScheduler& s = scheduler();
  std::lock_guard lock(s.mutex);
  if (!capture_ || capture_->origin != this)
    throw Error("stream '" + name_ + "' did not begin a capture (end it on the stream that began it)");
  std::shared_ptr<CapturedGraph> graph = capture_;
  // Every queue that joined must be joined back: its last item a record the origin waits on.
  std::string unjoined;
  const std::vector<Item>& origin_items = graph->items_of(this);
  for (auto& [queue, items] : graph->queues) {
    if (queue == this) continue;
    const bool joined =
        !items.empty() && items.back().kind == Item::Kind::Record &&
        std::any_of(origin_items.begin(), origin_items.end(), [&](const Item& w) {
          return w.kind == Item::Kind::Wait && w.event == items.back().event && w.generation == items.back().generation;
        });
    if (!joined && unjoined.empty()) unjoined = queue->name_;
  }
  // The capture ends either way: the queues run their own work again, and the records made in it
  // complete (they live on as dependencies inside the graph only).
  for (auto& [queue, items] : graph->queues) {
    queue->capture_ = nullptr;
    for (const Item& item : items)
      if (item.kind == Item::Kind::Record) {
        item.event->captured.erase(item.generation);
        QueueScheduler::complete(*item.event, item.generation, "");
      }
  }
  s.reschedule();
  if (!unjoined.empty())
    throw Error("stream '" + unjoined + "' joined the capture of '" + name_ +
                "' but was not joined back (its last work must be waited on by '" + name_ +
                "'; CUDA refuses it: cudaErrorStreamCaptureUnjoined)");
  return graph;
}

}  // namespace yolo
