// Moves loader batches onto the device on a copy stream of their own, so the copy of batch
// t+1 overlaps the compute of batch t. Two device buffers alternate; events order the copy
// after the compute that last read its buffer, and the compute after the copy.
#pragma once
#include <functional>

#include "data/loader.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/stream.h"

namespace yolo::data {

struct DeviceBatch {
  const Batch* host = nullptr;          // the loader's batch (sizes, sample info)
  const float* images = nullptr;        // on the device, layout as Batch::images
  const YoloTruth* truths = nullptr;    // on the device
  const int* truth_counts = nullptr;    // on the device
};

class DeviceFeeder {
 public:
  DeviceFeeder(Loader& loader, Device device);
  // Takes the next batch from the loader, starts its copy on the copy stream and makes
  // `compute` wait for it. The device buffers stay valid until the call after the next one
  // (work enqueued on `compute` before the next call may still read them); `host` only until
  // the next call (the loader then refills its slot).
  const DeviceBatch& next(Stream& compute);
  ~DeviceFeeder();
  Stream& copy_stream() { return copy_; }
  // --trace: called on the copy stream (a host function there) just before and just after each
  // batch's copy, with its bytes. Empty: none.
  void set_copy_observer(std::function<void(bool begin, size_t bytes)> observer) { observer_ = std::move(observer); }

 private:
  Loader& loader_;
  Stream copy_;
  DeviceMemory images_[2], truths_[2], counts_[2];
  Event copied_[2], free_[2];
  bool copy_recorded_[2] = {false, false}, free_recorded_[2] = {false, false};
  DeviceBatch out_[2];
  int64_t calls_ = 0;
  std::function<void(bool, size_t)> observer_;
};

}  // namespace yolo::data
