// The CPU backend's stream: an in-order queue of host work run by one thread of its own, and
// the state behind a CPU event. Used through yolo::Stream / yolo::Event (stream.h).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/stream.h"

namespace yolo {

// A CPU event counts records (issued on the host when record() is called) and completions
// (when the recording stream reaches that point). Point g is reached once completed >= g.
struct Event::CpuState {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t recorded = 0;
  uint64_t completed = 0;
  std::chrono::steady_clock::time_point completed_at{};

  void complete(uint64_t generation);
  void wait_for(uint64_t generation);
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
