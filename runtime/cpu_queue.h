// The CPU backend's stream: an in-order queue of host work run by one thread of its own, and
// the state behind a CPU event. Used through yolo::Stream / yolo::Event (stream.h).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/stream.h"

namespace yolo {

// A CPU event numbers its records (generation g is issued on the host when record() is called)
// and notes each one's completion when its stream reaches it. Records on different streams may
// complete out of order, so completion is kept per generation: all of 1..prefix are complete,
// plus those in `later`.
struct Event::CpuState {
  using Clock = std::chrono::steady_clock;
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t recorded = 0;
  uint64_t prefix = 0;
  std::map<uint64_t, Clock::time_point> later;
  Clock::time_point prefix_time{};  // completion time of generation `prefix`

  void complete(uint64_t generation);
  void wait_for(uint64_t generation);
  bool is_complete(uint64_t generation) const { return generation <= prefix || later.count(generation); }
  // Completion time of the most recent record; the caller holds the mutex and it is complete.
  Clock::time_point latest_time() const { return recorded <= prefix ? prefix_time : later.at(recorded); }
};

class Stream::CpuQueue {
 public:
  explicit CpuQueue(std::string name);
  ~CpuQueue();  // drains the queue, then joins the thread
  void push(std::function<void()> work);
  void drain();  // blocks until everything pushed so far has run; rethrows the first error

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  uint64_t pushed_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::exception_ptr first_error_;
  std::thread thread_;
};

}  // namespace yolo
