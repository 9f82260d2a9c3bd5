// Test helpers for emulated GPUs: restore their properties, and switch the adversarial schedule
// on for one test (runtime/stream_queue.h: no emulated stream may exist around the switches).
#pragma once
#include <cstdint>
#include <optional>

#include "runtime/device.h"
#include "runtime/stream_queue.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

namespace yolo::testing {

#if YOLO_EMULATED_KERNELS
// Every emulated GPU back to the default (H200-like) properties at scope exit.
struct EmulatedDevicesReset {
  ~EmulatedDevicesReset() {
    for (int i = 0; i < emu::kMaxDevices; ++i) emu::configure_device(i, emu::preset_for(90));
    emu::set_current_device(-1);
  }
};
#endif

// The adversarial schedule with `seed` for the scope's emulated streams (created inside it).
class AdversarialSchedule {
 public:
  explicit AdversarialSchedule(uint64_t seed) : previous_(adversarial_schedule()) { set_adversarial_schedule(seed); }
  ~AdversarialSchedule() { set_adversarial_schedule(previous_); }
  AdversarialSchedule(const AdversarialSchedule&) = delete;
  AdversarialSchedule& operator=(const AdversarialSchedule&) = delete;

 private:
  std::optional<uint64_t> previous_;
};

}  // namespace yolo::testing
