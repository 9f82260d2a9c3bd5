// The step split's device idle time (see device_idle.h).
#include "graph/device_idle.h"

#include <algorithm>
#include <limits>

namespace yolo::graph {

DeviceIdle::DeviceIdle(Device device, bool on) {
  if (!on) {
    why_not_ = "--no-idle";
    return;
  }
  recorder_.emplace(device);
  if (!recorder_->available()) {
    why_not_ = recorder_->why_not();
    recorder_.reset();
    return;
  }
  lost_at_start_ = recorder_->lost();
}

void DeviceIdle::open_window() {
  if (recorder_) open_begin_ = recorder_->now_ns();
}

void DeviceIdle::close_window(bool ends_step) {
  if (!recorder_) return;
  windows_.push_back(Window{open_begin_, recorder_->now_ns(), ends_step, steps_closed_});
  steps_closed_ += ends_step ? 1 : 0;
}

void DeviceIdle::keep_timeline(int64_t first, int64_t count) {
  timeline_first_ = first;
  timeline_count_ = count;
}

StepSplit DeviceIdle::settle(size_t keep_open) {
  StepSplit device;
  if (!recorder_) return device;
  std::vector<ActivitySpan> fresh = recorder_->take();
  pool_.insert(pool_.end(), fresh.begin(), fresh.end());
  if (windows_.size() <= keep_open) return device;
  const size_t settled = windows_.size() - keep_open;
  std::vector<ActivitySpan> inside;
  for (size_t k = 0; k < settled; ++k) {
    const Window& w = windows_[k];
    device.device_steps += w.ends_step ? 1 : 0;
    if (w.begin == 0 || w.end == 0) continue;  // CUPTI's clock could not be read
    inside.clear();
    for (const ActivitySpan& span : pool_)
      if (span.start_ns < w.end && span.end_ns > w.begin) inside.push_back(span);
    if (w.step >= timeline_first_ && w.step < timeline_first_ + timeline_count_)
      timeline_.push_back(TimelineWindow{w.step, w.begin, w.end, inside});
    const IdleTime time = idle_time(inside, w.begin, w.end);
    ++settled_windows_;
    if (time.busy_ms == 0) ++empty_windows_;
    device.device_busy_ms += time.busy_ms;
    device.device_idle_ms += time.idle_ms;
  }
  windows_.erase(windows_.begin(), windows_.begin() + static_cast<std::ptrdiff_t>(settled));
  // Spans over before the oldest open window can matter no more.
  const int64_t horizon = windows_.empty() ? std::numeric_limits<int64_t>::max() : windows_.front().begin;
  std::erase_if(pool_, [&](const ActivitySpan& s) { return s.end_ns <= horizon; });
  return device;
}

std::string DeviceIdle::take_notice() {
  if (!recorder_ || noticed_) return "";
  const int64_t lost = recorder_->lost() - lost_at_start_;
  if (lost <= 0) return "";
  noticed_ = true;
  return "CUPTI lost " + std::to_string(lost) +
         " activity records (out of its device buffers): the device idle figure counts their work as idle";
}

}  // namespace yolo::graph
