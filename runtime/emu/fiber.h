// Fibers for the CUDA emulation: each emulated GPU thread runs on a fiber, so __syncthreads()
// and warp operations can suspend it until the rest of its block (or warp) gets there.
// Switching is cooperative and happens only at those points, so emulated results never depend
// on host scheduling. AddressSanitizer is told about every stack switch.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace yolo::emu {

// A worker fiber: a stack and a saved context. It runs `body` repeatedly: each time the
// scheduler resumes it after assign(), until body returns, then it hands control back.
class Fiber {
 public:
  explicit Fiber(size_t stack_bytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Scheduler side: run (or continue) this fiber until it suspends or finishes its body.
  void resume();
  // Fiber side: hand control back to the scheduler; returns when resumed.
  static void suspend();
  // The body the fiber runs next (set while it is idle).
  void assign(std::function<void()>* body) { body_ = body; finished_ = false; }
  bool finished() const { return finished_; }

  struct Impl;

 private:
  static void entry();
  std::unique_ptr<Impl> impl_;
  std::function<void()>* body_ = nullptr;
  bool finished_ = true;
};

// Idle fibers, kept per host thread and reused across launches.
class FiberPool {
 public:
  Fiber* acquire();
  void release(Fiber* fiber) { idle_.push_back(fiber); }

 private:
  std::vector<std::unique_ptr<Fiber>> all_;
  std::vector<Fiber*> idle_;
};

FiberPool& fiber_pool();  // this host thread's pool

}  // namespace yolo::emu
