// The step split's device idle time (StepSplit::device_busy_ms / device_idle_ms): the loop opens
// a window after each micro-batch's data wait and closes it after its loss read; the device's
// activity (runtime/activity.h) inside each window gives its busy and idle time. Windows are
// settled in batches, the newest few left open, because CUPTI may hand a span over a flush or
// two after its work completed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/train.h"
#include "runtime/activity.h"

namespace yolo::graph {

class DeviceIdle {
 public:
  // Records `device`'s activity when `on` and it can (available(); why_not() otherwise).
  DeviceIdle(Device device, bool on);
  bool available() const { return recorder_.has_value(); }
  const std::string& why_not() const { return why_not_; }

  void open_window();                 // after the data wait
  void close_window(bool ends_step);  // after the loss read; ends_step: the step's last micro-batch
  // Settles all windows but the newest `keep_open`: their busy and idle time (and the steps they
  // end) in a StepSplit to add to the split's. The loop settles when due(), keeping kKeepOpen
  // open, and completely before each epoch's summary and at the end (the training thread has
  // synchronised with all its work by then, and CUPTI buffers records per launching thread).
  StepSplit settle(size_t keep_open = kKeepOpen);
  bool due() const { return windows_.size() >= kSettleEvery + kKeepOpen; }
  // A line to print once when CUPTI lost records since the start ("" otherwise; once).
  std::string take_notice();
  // Settled windows in which no activity was recorded at all (the device did nothing there? or a
  // span came later than its window stayed open), and all settled windows: for the final report.
  int64_t empty_windows() const { return empty_windows_; }
  int64_t settled_windows() const { return settled_windows_; }

  static constexpr size_t kKeepOpen = 8, kSettleEvery = 64;

  // --timeline: the windows of steps [first, first + count) of this run (0-based, counted by the
  // windows that end steps) and the device's spans that overlap them, kept as they settle.
  struct TimelineWindow {
    int64_t step = 0;        // 0-based within this run
    int64_t begin = 0, end = 0;  // the recorder's clock (ns): from queueing to the loss read
    std::vector<ActivitySpan> spans;
  };
  void keep_timeline(int64_t first, int64_t count);
  std::vector<TimelineWindow> take_timeline() { return std::exchange(timeline_, {}); }

 private:
  struct Window {
    int64_t begin = 0, end = 0;
    bool ends_step = false;
    int64_t step = 0;  // the step it belongs to (0-based within this run)
  };
  std::optional<ActivityRecorder> recorder_;
  std::string why_not_;
  std::vector<Window> windows_;     // not settled yet, oldest first
  std::vector<ActivitySpan> pool_;  // spans handed over that an open window may still need
  int64_t open_begin_ = 0;
  int64_t lost_at_start_ = 0;
  bool noticed_ = false;
  int64_t empty_windows_ = 0, settled_windows_ = 0;
  int64_t steps_closed_ = 0;  // windows that ended steps so far
  int64_t timeline_first_ = 0, timeline_count_ = 0;
  std::vector<TimelineWindow> timeline_;
};

}  // namespace yolo::graph
