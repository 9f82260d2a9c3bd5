// The training loop on one device: the loader (or MNIST batches) feeds micro-batches through
// the feeder's copy stream, the executor runs forward/backward with gradient accumulation
// over subdivisions, the optimizer follows darknet's schedule (burn-in, steps), progress is
// printed, and `last.weights` + `last.ckpt` are written (temp file + rename) so --resume
// continues exactly.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/mnist.h"
#include "graph/cfg.h"
#include "graph/graph.h"
#include "graph/learning_rate.h"
#include "kernels/precision.h"
#include "runtime/device.h"

namespace yolo::graph {

class Executor;

struct TrainOptions {
  int64_t max_batches = 0;      // optimizer steps to reach (0: the cfg's max_batches)
  int batch = 0;                // global images per step (0: the cfg's batch)
  int subdivisions = 0;         // micro-batches per step (0: the cfg's)
  int threads = 0;              // loader threads (0: cores - 1)
  // Decoded training images kept in memory (data/image_cache.h), at most this many MiB; 0: decode
  // every time; negative: data::default_image_cache_bytes().
  int64_t image_cache_mb = -1;
  bool strict = false;          // an unreadable image stops training (else a grey image and a warning)
  uint64_t seed = 1;
  std::string out_dir = "runs/train";
  std::string weights;          // start from these .weights
  int load_layers = -1;         // only the first N layers of `weights`
  bool resume = false;          // continue from out_dir/last.ckpt
  std::string trace_file;       // Chrome trace of one step's layers
  std::string timeline_file;    // Chrome trace of the device's activity in three steps (graph/device_idle.h)
  // Checkpoints (last.ckpt and last.weights; the one before kept as prev.ckpt) besides the run's
  // end: every checkpoint_every steps (0: none), and once checkpoint_minutes of training have
  // passed since the last one (0: none); written on a thread of their own (graph/checkpoint_saver.h).
  int checkpoint_every = 0;
  double checkpoint_minutes = 10;
  // The command that continues this run (printed by the ranks that save after a peer is lost);
  // "": "--resume" is said instead.
  std::string resume_command;
  int valid_every = 0;          // detector: mAP@0.5 on the validation split every N epochs; best.weights kept
  // Data parallel (several devices): gradient buckets of at most bucket_mb MiB (0: one layer each;
  // negative: default_bucket_mb of graph/scaling.h),
  // all-reduced while backward goes on (overlap) or all after it; replicas' parameter hashes
  // compared every check_every steps; a rank waiting longer than comm_timeout gives up.
  double bucket_mb = -1;
  bool overlap = true;
  bool sync_bn = false;         // BatchNorm statistics over every replica's micro-batch (else per replica)
  // What the step runs in (graph/executor.h); nullopt: auto (automatic_precision of the device:
  // bf16 on sm_80+, fp16 on sm_75, fp32 on the CPU), printed with the reason. fp16 turns on dynamic
  // loss scaling (graph/loss_scale.h).
  std::optional<Precision> precision = Precision::Fp32;
  std::string precision_reason;  // resolve_precision: why auto chose it (printed)
  // fp16's dynamic loss scaling: off only to show what it is for (tests); its first scale.
  bool loss_scaling = true;
  float initial_loss_scale = 65536.0f;
  int check_every = 100;
  double comm_timeout = 300;
  // One rank of a job started by a launcher (runtime/launch.h): this process's rank and the
  // job's size, and where the ranks meet (tcp://HOST:PORT or file:///PATH). A launched job of
  // one process still goes through its communicator (to measure what it costs).
  bool launched = false;
  int process_rank = 0, process_world = 1;
  std::string rendezvous;
  bool progress_in_place = true;  // '\r' progress on a terminal
  // GPUs and emulated GPUs: each kind of micro-batch captured as a CUDA Graph after one eager run
  // and replayed (graph/step_graphs.h); false: every step eager (--no-graph). Several GPUs in one
  // process run eagerly whatever this says (NCCL's warning; the trainer prints it).
  bool graphs = true;
  // GPUs: queue each step before the previous one's loss and update flag are read, so the device
  // does not wait for the host between steps (one device, one micro-batch a step, graphs on, no
  // fp16 loss scaling; graph/train_loop_phases.h). false: --no-look-ahead.
  bool look_ahead = true;
  // GPUs: each residual block's shortcut added in its second conv's BatchNorm apply (Executor);
  // false: a pass of its own (--no-fold), for comparison.
  bool fold_shortcuts = true;
  // GPUs, tensor cores: BatchNorms read by convolutions alone applied in those convolutions' loads
  // (Executor); false: an apply pass of their own (--no-fold, --no-load-fold), for comparison.
  bool apply_in_loads = true;
  // GPUs and emulated GPUs: record the device's activity (runtime/activity.h: CUPTI on GPUs) for
  // the split's device idle time; false: --no-idle.
  bool device_activity = true;
  // Divergence: this many steps in a row skipped for a NaN or infinite gradient stop the run
  // (--max-skipped-steps; 0: never). fp16's loss-scale adjustments never count.
  int max_skipped_steps = 10;
  // Whether this rank is asked to stop after the step under way (read before each step's
  // collectives; all ranks then stop after the same step). Empty: a SIGTERM/SIGINT received
  // (runtime/stop_signal.h). Tests stop one rank at a chosen step.
  std::function<bool(int rank, int64_t iteration)> stop_requested;
  // Test hook, before each step is queued: plant a fault in the executor's state.
  std::function<void(Executor& executor, int rank, int64_t iteration)> before_step;
  // Tests: called once step `iteration`'s loss and update flag have been read (look-ahead's order).
  std::function<void(int rank, int64_t iteration)> step_read;
};

// Where the steps' time went (milliseconds summed over `steps`): host wall clock for the data
// wait and the whole; device time (events; the CPU backend: its own clock) for forward, backward,
// the optimizer and exposed comm: what the compute stream waited for the all-reduces between the
// last backward and the update (what overlap did not hide), plus the host's parameter hash
// checks. Other: the rest (queueing, loss read-back, bookkeeping).
// Device busy and idle (GPUs, recorded activity): from each micro-batch's first kernel to its last
// (the data wait excluded), the time some kernel, copy or memset ran, and the gaps between them:
// launch gaps, and host round trips inside the step. 0 and 0 where activity is not recorded.
struct StepSplit {
  int64_t steps = 0, images = 0;
  double wall_ms = 0, data_ms = 0, forward_ms = 0, backward_ms = 0, comm_ms = 0, optimizer_ms = 0;
  double device_busy_ms = 0, device_idle_ms = 0;
  int64_t device_steps = 0;  // the steps whose device busy/idle time is in (settled later than the rest)
  StepSplit& operator+=(const StepSplit& o);
  // "412.3 img/s; a step 39.0 ms = data wait 0.1 + forward 12.0 + ...; device idle 0.4 ms (1.1%)"
  std::string text() const;
};

// Why the run ended.
enum class TrainStop {
  Finished,  // max_batches reached
  Signal,    // stop_requested (SIGTERM/SIGINT): the step under way finished and saved
  Diverged,  // max_skipped_steps non-finite steps in a row
};

struct TrainResult {
  TrainStop stop = TrainStop::Finished;
  int stop_signal = 0;       // Signal: the signal this process received (0: another rank's request)
  std::string stop_message;  // Signal and Diverged: what to tell the user (printed by the caller)
  int64_t iterations = 0;
  double last_loss = 0;      // mean per image over the last step
  double first_loss = 0;     // mean per image over the first step of this run
  double images_per_second = 0;
  std::string weights_path, checkpoint_path;
  double best_map50 = -1;       // with valid_every: the best validation mAP@0.5 (best.weights)
  StepSplit split;              // the whole run
  std::vector<double> losses;   // mean per image of every step of this run
  float loss_scale = 1;         // fp16: the loss scale at the end (1 without scaling)
  int64_t overflow_skips = 0;   // fp16: steps skipped for overflow (this run and those resumed from)
  int64_t graph_launches = 0;   // micro-batches that ran as a graph launch (rank 0's)
  size_t graphs_captured = 0;   // graphs held at the end (kinds of micro-batch: sizes x first/accumulating/last)
  std::string graphs_off;       // why the steps ran eagerly ("" while graphs were on)
};

// options with --precision auto (precision nullopt) replaced by the choice for these devices: that
// of the least capable one (automatic_precision), so every replica runs the same precision.
TrainOptions resolve_precision(const TrainOptions& options, const std::vector<Device>& devices);

// Detector training on a dataset's train split; several devices: data parallel (CPU replicas
// or GPUs as threads of this process; or, when launched, this process as one rank of
// a launched job; the global batch split evenly).
TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, const std::vector<Device>& devices,
                           const TrainOptions& options);
TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                           const TrainOptions& options);
// Classifier training (the MNIST MLP) on MNIST-shaped data; several devices as above.
TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, const std::vector<Device>& devices,
                             const TrainOptions& options);
TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, Device device,
                             const TrainOptions& options);

}  // namespace yolo::graph
