// DeviceFeeder (see feeder.h). Call t uses buffer t % 2.
#include "data/feeder.h"

namespace yolo::data {

DeviceFeeder::DeviceFeeder(Loader& loader, Device device)
    : loader_(loader),
      copy_(device, StreamPriority::Normal, "copy"),
      copied_{Event(device), Event(device)},
      free_{Event(device), Event(device)} {
  size_t b = static_cast<size_t>(loader.batch_size());
  for (int k = 0; k < 2; ++k) {
    images_[k] = DeviceMemory(device, b * loader.max_net_w() * loader.max_net_h() * 3 * sizeof(float));
    truths_[k] = DeviceMemory(device, b * kMaxBoxes * sizeof(YoloTruth));
    counts_[k] = DeviceMemory(device, b * sizeof(int));
  }
}

DeviceFeeder::~DeviceFeeder() {
  // The device buffers are freed after this; copies still queued must finish first.
  try {
    copy_.synchronize();
  } catch (const std::exception&) {
    // Already failing; the error that got us here is the one to report.
  }
}

const DeviceBatch& DeviceFeeder::next(Stream& compute) {
  int k = static_cast<int>(calls_ % 2), other = 1 - k;
  // Work enqueued on compute so far ends with batch t-1 (buffer `other`): once it is done,
  // that buffer may be refilled by call t+1.
  if (calls_ > 0) {
    compute.record(free_[other]);
    free_recorded_[other] = true;
  }
  // The loader reuses the previous batch's pinned slot once next() is called: its copy must be over.
  if (copy_recorded_[other]) copied_[other].synchronize();
  const Batch& batch = loader_.next();
  if (free_recorded_[k]) copy_.wait(free_[k]);
  size_t truth_bytes = static_cast<size_t>(batch.count) * kMaxBoxes * sizeof(YoloTruth);
  size_t count_bytes = static_cast<size_t>(batch.count) * sizeof(int);
  size_t bytes = batch.image_bytes() + truth_bytes + count_bytes;
  if (observer_) copy_.enqueue([observer = observer_, bytes] { observer(true, bytes); });
  copy_bytes(images_[k].data(), batch.images, batch.image_bytes(), &copy_);
  copy_bytes(truths_[k].data(), batch.truths, truth_bytes, &copy_);
  copy_bytes(counts_[k].data(), batch.truth_counts, count_bytes, &copy_);
  if (observer_) copy_.enqueue([observer = observer_, bytes] { observer(false, bytes); });
  copy_.record(copied_[k]);
  copy_recorded_[k] = true;
  compute.wait(copied_[k]);
  out_[k] = DeviceBatch{&batch, static_cast<const float*>(images_[k].data()),
                        static_cast<const YoloTruth*>(truths_[k].data()), static_cast<const int*>(counts_[k].data())};
  ++calls_;
  return out_[k];
}

}  // namespace yolo::data
