// The training loader (see loader.h): a job is one sample of one batch; workers claim jobs in
// order under one mutex, build them outside it, and the trainer takes whole batches in order.
#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>

#include "data/image.h"
#include "runtime/check.h"

namespace yolo::data {

namespace {

constexpr uint64_t kAugmentSalt = 0xA06E47A7105EEDull;  // keeps augmentation draws apart from shuffling
constexpr uint64_t kShuffleSalt = 0x5E7F1E5A17ull;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string EpochStats::summary() const {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << images << " images";
  if (unreadable) out << " (" << unreadable << " unreadable, replaced by grey images without boxes)";
  out << ", " << boxes << " boxes";
  if (boxes_dropped) out << " (" << boxes_dropped << " cropped away by augmentation)";
  out << "; trainer waited " << wait_seconds << " s for data; loader threads busy " << work_seconds << " s";
  return out.str();
}

struct Loader::Job {
  int64_t batch = 0;  // counted from start_
  int index_in_batch = 0;
  int64_t epoch = 0, position = 0, sample = 0;
  int net_w = 0, net_h = 0;
};

struct Loader::Slot {
  PinnedHostBuffer images, truths, counts;
  Batch batch;
  int64_t holds = -1;  // which batch (counted from start_) the slot is being filled with
  int done = 0;
};

Loader::Loader(const Split& split, LoaderOptions options, LoaderState start)
    : split_(split), options_(std::move(options)), start_(start) {
  const LoaderOptions& o = options_;
  auto fail = [](const std::string& what) { throw Error("loader: " + what); };
  if (o.batch < 1) fail("batch must be at least 1");
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    fail("rank " + std::to_string(o.rank) + " is outside world size " + std::to_string(o.world));
  if (o.net_w < 32 || o.net_h < 32 || o.net_w % 32 || o.net_h % 32 || o.net_w > 8192 || o.net_h > 8192)
    fail("network size " + std::to_string(o.net_w) + "x" + std::to_string(o.net_h) +
         " must be multiples of 32 in 32..8192");
  if (o.prefetch < 2) fail("prefetch must be at least 2 batches");
  if (o.batches_per_iteration < 1 || o.multiscale_period < 1) fail("subdivisions and multi-scale period must be >= 1");
  start_.seed = o.seed;
  if (start.seed != 0 && start.seed != o.seed)
    fail("the saved position was taken with seed " + std::to_string(start.seed) + ", this run uses seed " +
         std::to_string(o.seed) + ": resume with the same seed");

  int64_t n = static_cast<int64_t>(split.samples.size());
  int64_t global_batch = static_cast<int64_t>(o.world) * o.batch;
  steps_per_epoch_ = o.remainder == Remainder::Drop ? n / global_batch : (n + global_batch - 1) / global_batch;
  if (n == 0) fail("the " + split.name + " split has no images");
  if (steps_per_epoch_ == 0)
    fail("the " + split.name + " split has " + std::to_string(n) + " images, fewer than one global batch (" +
         std::to_string(o.world) + " x " + std::to_string(o.batch) +
         " = " + std::to_string(global_batch) + "): lower the batch or let the last step wrap around");
  if (start_.epoch < 0 || start_.step < 0 || start_.step >= steps_per_epoch_)
    fail("saved position epoch " + std::to_string(start.epoch) + " step " + std::to_string(start.step) +
         " does not fit " + std::to_string(steps_per_epoch_) + " steps per epoch (was the dataset or batch changed?)");

  max_w_ = o.net_w;
  max_h_ = o.net_h;
  if (o.multiscale)
    for (auto [w, h] : multiscale_sizes(o.net_w, o.net_h)) {
      max_w_ = std::max(max_w_, w);
      max_h_ = std::max(max_h_, h);
    }

  size_t pixels = static_cast<size_t>(max_w_) * max_h_ * 3;
  for (int s = 0; s < o.prefetch; ++s) {
    auto slot = std::make_unique<Slot>();
    slot->images = PinnedHostBuffer(pixels * o.batch * sizeof(float));
    slot->truths = PinnedHostBuffer(static_cast<size_t>(o.batch) * kMaxBoxes * sizeof(YoloTruth));
    slot->counts = PinnedHostBuffer(static_cast<size_t>(o.batch) * sizeof(int));
    slots_.push_back(std::move(slot));
  }
  if (!options_.warn)
    options_.warn = [](const std::string& message) { std::fprintf(stderr, "train_yolo: warning: %s\n", message.c_str()); };

  int threads = o.threads;
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  batch_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::pair<int, int> Loader::size_for_batch(int64_t batch_iteration) const {
  if (!options_.multiscale) return {options_.net_w, options_.net_h};
  return multiscale_size(options_.seed, batch_iteration / options_.batches_per_iteration, options_.net_w,
                         options_.net_h, options_.multiscale_period);
}

const std::vector<int64_t>& Loader::permutation(int64_t epoch) {
  auto it = permutations_.find(epoch);
  if (it != permutations_.end()) return it->second;
  std::vector<int64_t> order(split_.samples.size());
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {  // Fisher-Yates from a key of (seed, epoch)
    KeyedRng rng(options_.seed ^ kShuffleSalt, static_cast<uint64_t>(epoch));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  return permutations_.emplace(epoch, std::move(order)).first->second;
}

EpochStats& Loader::stats_for(int64_t epoch) {
  EpochStats& stats = stats_[epoch];
  stats.epoch = epoch;
  return stats;
}

void Loader::worker_loop() {
  const int b = options_.batch;
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || next_job_ / b < released_ + options_.prefetch; });
      if (stopping_) return;
      job.batch = next_job_ / b;
      job.index_in_batch = static_cast<int>(next_job_ % b);
      ++next_job_;
      int64_t absolute_batch = absolute(job.batch);
      job.epoch = absolute_batch / steps_per_epoch_;
      int64_t step = absolute_batch % steps_per_epoch_;
      job.position = (step * options_.world + options_.rank) * b + job.index_in_batch;
      job.sample = permutation(job.epoch)[static_cast<size_t>(job.position % static_cast<int64_t>(split_.samples.size()))];
      std::tie(job.net_w, job.net_h) = size_for_batch(absolute_batch);
      Slot& slot = *slots_[job.batch % options_.prefetch];
      if (job.index_in_batch == 0) {  // jobs are claimed in order: the first one sets the batch up
        slot.holds = job.batch;
        slot.done = 0;
        Batch& batch = slot.batch;
        batch.epoch = job.epoch;
        batch.step = step;
        batch.iteration = absolute_batch;
        batch.count = b;
        batch.net_w = job.net_w;
        batch.net_h = job.net_h;
        batch.images = static_cast<const float*>(slot.images.data());
        batch.truths = static_cast<const YoloTruth*>(slot.truths.data());
        batch.truth_counts = static_cast<const int*>(slot.counts.data());
        batch.samples.assign(b, SampleInfo{});
      }
    }
    produce(job);
  }
}

void Loader::produce(const Job& job) {
  auto t0 = std::chrono::steady_clock::now();
  Slot& slot = *slots_[job.batch % options_.prefetch];
  const Sample& sample = split_.samples[static_cast<size_t>(job.sample)];
  size_t pixels = static_cast<size_t>(job.net_w) * job.net_h * 3;
  float* image_out = static_cast<float*>(slot.images.data()) + pixels * job.index_in_batch;
  YoloTruth* truths_out = static_cast<YoloTruth*>(slot.truths.data()) + static_cast<size_t>(kMaxBoxes) * job.index_in_batch;
  int* count_out = static_cast<int*>(slot.counts.data()) + job.index_in_batch;

  SampleInfo info;
  info.index = job.sample;
  thread_local Image decoded;
  thread_local std::vector<Box> boxes;
  std::string error;
  int dropped = 0;
  boxes.clear();
  std::shared_ptr<const Image> cached;
  if (options_.cache) {
    cached = options_.cache->read(job.sample, sample.image, error);
    info.ok = cached != nullptr;
  } else {
    info.ok = read_image(sample.image, decoded, error);
  }
  const Image& image = cached ? *cached : decoded;
  if (info.ok) {
    KeyedRng rng(options_.seed ^ kAugmentSalt, static_cast<uint64_t>(job.epoch), static_cast<uint64_t>(job.position));
    Augmentation aug;
    if (options_.augment) {
      aug = draw_augmentation(image.width, image.height, job.net_w, job.net_h, options_.resize, options_.augment_params,
                              rng);
    } else {
      aug.placement = fit_placement(image.width, image.height, job.net_w, job.net_h, options_.resize);
    }
    info.placement = aug.placement;
    render_input(image, aug.placement, aug.color, image_out);
    dropped = transform_boxes(sample.boxes, aug.placement, options_.augment_params.min_box_pixels, boxes);
  } else {
    std::fill(image_out, image_out + pixels, 0.5f);
  }
  int n = std::min(static_cast<int>(boxes.size()), kMaxBoxes);
  for (int k = 0; k < n; ++k) truths_out[k] = YoloTruth{boxes[k].x, boxes[k].y, boxes[k].w, boxes[k].h, boxes[k].class_id};
  *count_out = n;
  double busy = seconds_since(t0);

  if (!info.ok && !options_.strict) {
    // Changed since the dataset's scan: warned once per image; each epoch's summary counts it.
    // The first few by name; after them one line, and each epoch's summary counts the rest.
    constexpr size_t kNamed = 5;
    bool first = false;
    size_t named = 0;
    {
      std::lock_guard lock(mutex_);
      first = warned_.insert(sample.image).second;
      named = warned_.size();
    }
    if (first && named <= kNamed)
      options_.warn(error + " (skipped: a grey image without boxes takes its place; warned once)");
    else if (first && named == kNamed + 1)
      options_.warn("more images fail to decode: not named one by one from here on; each epoch's line counts them");
  }
  {
    std::lock_guard lock(mutex_);
    slot.batch.samples[job.index_in_batch] = info;
    EpochStats& stats = stats_for(job.epoch);
    ++stats.images;
    stats.unreadable += info.ok ? 0 : 1;
    stats.boxes += n;
    stats.boxes_dropped += dropped;
    stats.work_seconds += busy;
    if (!info.ok && options_.strict && error_.empty()) error_ = error + " (--strict)";
    ++slot.done;
  }
  batch_ready_.notify_all();
}

const Batch& Loader::next() {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  released_ = handed_out_;  // the caller is done with the batch it had
  // Epochs before the one being handed out need their permutations no more.
  int64_t current_epoch = absolute(handed_out_) / steps_per_epoch_;
  permutations_.erase(permutations_.begin(), permutations_.lower_bound(current_epoch));
  work_ready_.notify_all();
  Slot& slot = *slots_[handed_out_ % options_.prefetch];
  batch_ready_.wait(lock, [&] {
    return !error_.empty() || (slot.holds == handed_out_ && slot.done == options_.batch);
  });
  if (!error_.empty()) throw Error(error_);
  stats_for(slot.batch.epoch).wait_seconds += seconds_since(t0);
  ++handed_out_;
  return slot.batch;
}

LoaderState Loader::state() const {
  std::lock_guard lock(mutex_);
  int64_t a = absolute(handed_out_);
  return LoaderState{a / steps_per_epoch_, a % steps_per_epoch_, options_.seed};
}

EpochStats Loader::epoch_stats(int64_t epoch) const {
  std::lock_guard lock(mutex_);
  auto it = stats_.find(epoch);
  if (it == stats_.end()) return EpochStats{epoch};
  return it->second;
}

}  // namespace yolo::data
