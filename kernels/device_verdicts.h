// A verdict per device, computed once and shared by every thread (kernels/wgmma_check.cu keeps the
// wgmma self-check's this way): the first thread to ask runs the check; a question asked from
// inside the check, on its own thread (its kernels consult the planner, which asks again), gets
// nullptr, "nothing verified yet"; another thread waits for the verdict, so that its plans match
// the ones that follow. A check that throws leaves the device failed: the exception goes to its
// caller, and every later question throws yolo::Error saying so, with `advice`. Host code.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "runtime/check.h"

namespace yolo {

template <typename Verdict>
class DeviceVerdicts {
 public:
  static constexpr int kDevices = 64;
  explicit DeviceVerdicts(std::string advice) : advice_(std::move(advice)) {}

  // The verdict of `device` (0..kDevices-1; others: nullptr), running `check` the first time.
  const Verdict* get(int device, const std::function<Verdict()>& check) {
    if (device < 0 || device >= kDevices) return nullptr;
    Slot& slot = slots_[device];
    int state = slot.state.load(std::memory_order_acquire);  // asked at every launch: read first
    if (state == kKnown) return &slot.verdict;
    if (state == kUnknown && slot.state.compare_exchange_strong(state, kChecking)) return run(slot, check);
    if (slot.checker.load() == std::this_thread::get_id()) return nullptr;  // asked from inside the check
    while ((state = slot.state.load(std::memory_order_acquire)) == kChecking)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (state == kFailed)
      throw Error("gpu:" + std::to_string(device) + ": the check could not finish there (see the message above). " +
                  advice_);
    return &slot.verdict;
  }

 private:
  enum : int { kUnknown, kChecking, kKnown, kFailed };
  struct Slot {
    std::atomic<int> state{kUnknown};
    std::atomic<std::thread::id> checker{};
    Verdict verdict{};
  };

  const Verdict* run(Slot& slot, const std::function<Verdict()>& check) {
    slot.checker.store(std::this_thread::get_id());
    try {
      slot.verdict = check();
    } catch (...) {
      slot.checker.store(std::thread::id{});
      slot.state.store(kFailed, std::memory_order_release);
      throw;
    }
    slot.checker.store(std::thread::id{});
    slot.state.store(kKnown, std::memory_order_release);
    return &slot.verdict;
  }

  std::string advice_;
  Slot slots_[kDevices];
};

}  // namespace yolo
