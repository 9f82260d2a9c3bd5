// A small fork-join pool for the fast CPU ops (see cpu_parallel.h).
#include "kernels/cpu_parallel.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace yolo {

namespace {

thread_local bool t_in_pool_work = false;

class Pool {
 public:
  explicit Pool(int n) {
    threads_ = n < 1 ? 1 : n;
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  void run(size_t count, const std::function<void(size_t)>& work) {
    std::lock_guard serial(run_mutex_);  // one parallel_for at a time; callers queue
    {
      std::lock_guard lock(mutex_);
      work_ = &work;
      count_ = count;
      next_ = 0;
      active_ = int(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    spin_until([&] { return active_.load() == 0; });
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    work_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void drain() {
    t_in_pool_work = true;
    for (size_t i; (i = next_.fetch_add(1)) < count_;) {
      try {
        (*work_)(i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    t_in_pool_work = false;
  }
  // Spins up to kSpinMicros for ready() before the caller blocks on a condition variable. A
  // demo step makes about 110 parallel_for calls, most microseconds apart, and a sleeping
  // thread's futex wake-up takes tens of microseconds (more where the machine is shared); the
  // spin bridges the gaps within a step and gives up between steps.
  template <typename Ready>
  static void spin_until(Ready ready) {
    constexpr int kSpinMicros = 200;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    for (int i = 0; !ready(); ++i) {
      if (i % 64 == 63 && std::chrono::steady_clock::now() > give_up) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
  void worker() {
    uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load() != seen || stopping_.load(); });
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_.load() != seen; });
        if (stopping_) return;
        seen = generation_.load();
      }
      drain();
      std::lock_guard lock(mutex_);
      if (--active_ == 0) done_.notify_all();
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mutex_, run_mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* work_ = nullptr;
  size_t count_ = 0;
  std::atomic<size_t> next_{0};
  // Written under mutex_; atomic because the spins read them without it.
  std::atomic<int> active_{0};  // workers still draining this call
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::exception_ptr error_;
};

int default_threads() {
  int n = int(std::thread::hardware_concurrency());
  if (const char* env = std::getenv("YOLO_CPU_THREADS")) n = std::atoi(env);
  return n;
}

std::unique_ptr<Pool>& pool_slot() {
  static std::unique_ptr<Pool> slot = std::make_unique<Pool>(default_threads());
  return slot;
}

Pool& pool() { return *pool_slot(); }

}  // namespace

void parallel_for(size_t count, const std::function<void(size_t)>& work) {
  if (count == 0) return;
  if (count == 1 || t_in_pool_work || pool().threads() == 1) {
    for (size_t i = 0; i < count; ++i) work(i);
    return;
  }
  pool().run(count, work);
}

int cpu_pool_threads() { return pool().threads(); }

void set_cpu_pool_threads(int threads) {
  pool_slot().reset();  // joins the old workers first
  pool_slot() = std::make_unique<Pool>(threads);
}

}  // namespace yolo
