// CPU streams and events (see cpu_queue.h).
#include "runtime/cpu_queue.h"

#include <pthread.h>

#include <cstdio>

namespace yolo {

void Event::CpuState::complete(uint64_t generation) {
  std::lock_guard lock(mutex);
  later[generation] = Clock::now();
  // Fold the contiguous run after `prefix` into it (keeps `later` small).
  for (auto it = later.find(prefix + 1); it != later.end() && it->first == prefix + 1; it = later.erase(it)) {
    ++prefix;
    prefix_time = it->second;
  }
  changed.notify_all();
}

void Event::CpuState::wait_for(uint64_t generation) {
  std::unique_lock lock(mutex);
  changed.wait(lock, [&] { return is_complete(generation); });
}

Stream::CpuQueue::CpuQueue(std::string name) : thread_([this] { run(); }) {
  // Thread names show in debuggers and traces; Linux allows 15 characters.
  std::string label = ("s:" + name).substr(0, 15);
  pthread_setname_np(thread_.native_handle(), label.c_str());
}

Stream::CpuQueue::~CpuQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  if (first_error_) {  // destructors cannot throw: say it rather than lose it
    try {
      std::rethrow_exception(first_error_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: a CPU stream was destroyed with an unreported error: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "warning: a CPU stream was destroyed with an unreported error\n");
    }
  }
}

void Stream::CpuQueue::push(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(work));
    ++pushed_;
  }
  changed_.notify_all();
}

void Stream::CpuQueue::drain() {
  std::unique_lock lock(mutex_);
  uint64_t target = pushed_;
  changed_.wait(lock, [&] { return finished_ >= target; });
  if (first_error_) {
    std::exception_ptr error = std::exchange(first_error_, nullptr);
    std::rethrow_exception(error);
  }
}

void Stream::CpuQueue::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything has run
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !first_error_) first_error_ = error;
    ++finished_;
    changed_.notify_all();
  }
}

}  // namespace yolo
