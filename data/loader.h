// The training loader: worker threads decode, augment and batch samples into a ring of pinned
// host buffers ahead of the trainer. Every random choice is keyed by (seed, epoch, position),
// so the batches are the same bits whatever the number of threads, and a run resumed from a
// saved LoaderState continues exactly as an uninterrupted one.
//
// Epochs and sharding: each epoch is a permutation of the split (seeded, or the file order
// without shuffle). Step s of an epoch takes positions [s*W*b, (s+1)*W*b) of it (W ranks, b
// images per rank), rank r the r-th run of b. Remainder::Drop leaves out the last N mod (W*b)
// positions (a different set each shuffled epoch); Remainder::Wrap runs one more step filled
// from the start of the permutation. Every rank runs the same steps either way.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/image_cache.h"
#include "data/transform.h"
#include "kernels/yolo_loss.h"
#include "runtime/memory.h"

namespace yolo::data {

enum class Remainder { Drop, Wrap };

struct LoaderOptions {
  int batch = 1;                    // images per step on this rank
  int net_w = 416, net_h = 416;     // network input (base size with multi-scale)
  ResizeMode resize = ResizeMode::Letterbox;
  bool augment = false;             // off for validation
  AugmentParams augment_params;
  bool shuffle = true;
  bool multiscale = false;          // [yolo] random=1
  int multiscale_period = 10;       // iterations per size
  int batches_per_iteration = 1;    // subdivisions: the size changes only between iterations
  int threads = 0;                  // 0: cores - 1, at least 1
  int prefetch = 4;                 // batches in the ring (>= 2)
  uint64_t seed = 1;
  int rank = 0, world = 1;
  Remainder remainder = Remainder::Drop;
  bool strict = false;              // an unreadable image stops the run instead of a warning
  // Decoded images kept across epochs (data/image_cache.h; keyed by the sample's index, so one
  // cache serves one split); it must outlive the loader. Null: every use decodes the file.
  ImageCache* cache = nullptr;
  // Receives warnings (an unreadable image); default: stderr, "train_yolo: warning: ...".
  std::function<void(const std::string&)> warn;
};

// Where the loader is: the next batch it will hand out.
struct LoaderState {
  int64_t epoch = 0;
  int64_t step = 0;  // within the epoch
  uint64_t seed = 0; // checked on restore: the position only means something with its seed
};

struct SampleInfo {
  int64_t index = -1;   // into the split's samples
  bool ok = false;      // false: unreadable image; the slot holds a grey image with no boxes
  Placement placement;  // how the original image maps onto the network input
};

// One batch, in the loader's pinned buffers; valid until the next call to Loader::next().
struct Batch {
  int64_t epoch = 0, step = 0;  // the step within the epoch
  int64_t iteration = 0;        // steps since epoch 0 step 0 (all epochs)
  int count = 0, net_w = 0, net_h = 0;
  const float* images = nullptr;       // count x net_h x net_w x 3, RGB in [0, 1] (NHWC)
  const YoloTruth* truths = nullptr;   // count rows of kMaxBoxes
  const int* truth_counts = nullptr;   // count
  std::vector<SampleInfo> samples;
  size_t image_bytes() const { return static_cast<size_t>(count) * net_w * net_h * 3 * sizeof(float); }
};

struct EpochStats {
  int64_t epoch = 0;
  int64_t images = 0;           // samples produced (this rank)
  int64_t unreadable = 0;       // of which unreadable (grey placeholders)
  int64_t boxes = 0;            // boxes handed to training
  int64_t boxes_dropped = 0;    // dropped by augmentation (cropped away or too small)
  double wait_seconds = 0;      // the trainer blocked in next()
  double work_seconds = 0;      // worker time spent decoding and augmenting (all threads)
  std::string summary() const;  // one line for the log
};

class Loader {
 public:
  Loader(const Split& split, LoaderOptions options, LoaderState start = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int batch_size() const { return options_.batch; }
  int threads() const { return static_cast<int>(workers_.size()); }
  // The largest input size any batch can have (the size of each image buffer).
  int max_net_w() const { return max_w_; }
  int max_net_h() const { return max_h_; }

  // Blocks until the next batch is ready and returns it; the previous one is released.
  // Throws yolo::Error for an unreadable image under strict.
  const Batch& next();
  // The position of the next batch next() will return (save it with a checkpoint).
  LoaderState state() const;
  // Statistics of an epoch (complete once its last batch has been returned).
  EpochStats epoch_stats(int64_t epoch) const;
  // The input size of a batch by its iteration (multi-scale), known before it is built.
  std::pair<int, int> size_for_batch(int64_t batch_iteration) const;

 private:
  struct Slot;
  struct Job;
  void worker_loop();
  void produce(const Job& job);
  const std::vector<int64_t>& permutation(int64_t epoch);  // caller holds mutex_
  EpochStats& stats_for(int64_t epoch);                    // caller holds mutex_
  int64_t absolute(int64_t batch) const { return start_.epoch * steps_per_epoch_ + start_.step + batch; }

  const Split& split_;
  LoaderOptions options_;
  LoaderState start_;
  int64_t steps_per_epoch_ = 0;
  int max_w_ = 0, max_h_ = 0;

  mutable std::mutex mutex_;
  std::set<std::string> warned_;  // images that failed to decode, warned about once (guarded by mutex_)
  std::condition_variable work_ready_, batch_ready_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int64_t handed_out_ = 0;   // batches returned by next() (counted from start_)
  int64_t released_ = 0;     // batches whose slots may be refilled
  int64_t next_job_ = 0;     // next (batch * b + i) to claim
  bool stopping_ = false;
  std::string error_;        // first strict failure, rethrown by next()
  std::map<int64_t, std::vector<int64_t>> permutations_;  // epochs in flight
  std::map<int64_t, EpochStats> stats_;
  std::vector<std::thread> workers_;
};

}  // namespace yolo::data
