// Device activity: when each kernel, copy and memset of a device ran, for the step split's
// "idle" (device time between kernels inside a step: the launch gaps CUDA Graphs remove, and the
// host round trips of an eager step).
//   GPUs:          CUPTI's activity records (concurrent-kernel, memcpy and memset records: they do
//                  not serialise kernels), libcupti loaded at run time like NCCL (YOLO_CUPTI_LIB
//                  names the library or its folder), since Nsight Systems does not run on every
//                  machine we are lent.
//   Emulated GPUs: each work item their queues run (kernels, copies, collectives' steps, host
//                  functions), timed on the host's steady clock.
//   CPU backend:   none: its ops run on the host.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace yolo {

// One activity on the device, in the recorder's clock (nanoseconds); `name` indexes the names
// activity_name() gives: a kernel's function (CUPTI), "memcpy HtoD", "memset", an emulated
// queue's work ("emu compute"); 0 is "".
struct ActivitySpan {
  int64_t start_ns = 0, end_ns = 0;
  uint32_t name = 0;
};
const std::string& activity_name(uint32_t name);

// Records one device's activity while it lives; several may live at once (one per device of the
// process). CUPTI is process-wide: the first recorder enables it, the last disables it.
class ActivityRecorder {
 public:
  explicit ActivityRecorder(Device device);
  ~ActivityRecorder();
  ActivityRecorder(const ActivityRecorder&) = delete;
  ActivityRecorder& operator=(const ActivityRecorder&) = delete;

  bool available() const { return why_not_.empty(); }
  const std::string& why_not() const { return why_not_; }  // "" when recording
  // The spans' clock (CUPTI's timestamp; emulated GPUs: steady_clock); 0 if it cannot be read.
  int64_t now_ns() const;
  // The device's spans handed over since the last call (unordered), CUPTI's buffers flushed
  // first. A span comes once its work has completed, but CUPTI may hold a buffer back while any
  // record in it is unfinished (work of the same thread on another stream), so a span can come
  // a call or two late: callers keep recent windows open for it.
  std::vector<ActivitySpan> take();
  // CUPTI records dropped or without valid times so far (process-wide; 0 on emulated GPUs): when
  // it grows, the idle figure counts lost work as idle.
  int64_t lost() const;

 private:
  Device device_;
  std::string why_not_;
};

// The device's time inside [begin, end): busy = the time at least one span covers (spans clipped
// to the window), idle = the uncovered time between the first covered instant and the last. No
// span inside: both 0 (a window with no device work has no device step to be idle in).
struct IdleTime {
  double busy_ms = 0, idle_ms = 0;
};
IdleTime idle_time(std::vector<ActivitySpan> spans, int64_t begin, int64_t end);

// Emulated GPUs' queues (stream_queue.cpp): whether `emulated_device`'s work is being recorded,
// and a span of it.
bool emulated_activity_on(int emulated_device);
// `queue`: the emulated stream's name (the span is named "emu QUEUE").
void record_emulated_activity(int emulated_device, int64_t start_ns, int64_t end_ns, const std::string& queue);
int64_t emulated_activity_now_ns();

}  // namespace yolo
