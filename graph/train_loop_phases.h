// run_loop's inside (see train_loop.h), private to train_loop*.cpp: one object holds what the
// loop keeps across steps, and each phase of a step is a named member. The step itself
// (micro-batches, graphs, all-reduces, the update's outcome) is in train_loop.cpp; what the loop
// reports and keeps (progress lines, epochs, validation, results.csv, saves, the end) in
// train_loop_report.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/checkpoint_saver.h"
#include "graph/device_idle.h"
#include "graph/divergence.h"
#include "graph/step_graphs.h"
#include "graph/train_loop.h"

namespace yolo::graph {

struct CommTrace;

class TrainLoop {
 public:
  TrainLoop(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options, int batch,
            int subdivisions, const Start& start, DataParallel* dp);
  TrainResult run();

 private:
  TrainResult run_steps();
  // What one step keeps between its phases.
  struct Step {
    int64_t iteration = 0;
    bool check = false;  // the per-layer check of a diverging run
    bool trace = false;  // --trace: this step is traced
    NonFinite found;
    bool forward_checked = false;
    float loss_scale = 1;  // the scale it ran at (known once the steps before it were read)
    float lr = 0;
    std::shared_ptr<CommTrace> comm_trace;
    std::vector<TraceEvent> host_events;  // host clock (Executor::clock_ms), converted after the step
    double start_ms = 0;
    StepSplit split;
    bool updated = false;
    LossSums loss;
    int queued = 0;          // its micro-batches queued so far (look-ahead: before earlier reads)
    bool window_closed = false;  // its device-idle window closed when the next step was queued
    // Its micro-batches are queued ahead of each other's reads (pipeline_ok, decided as it
    // begins): then they share one device-idle window, from the first's queueing to the last's read
    // (per-micro-batch windows would be the moments between two launches, often before the
    // device has started either).
    bool pipelined = false;
    // The loader's position after this step's micro-batches (before the next was taken ahead).
    std::optional<data::LoaderState> loader_after;
    bool save = false;  // a checkpoint is due after it: the state's copy is queued after its update
    // The executor's result slot of micro-batch s: with look-ahead they alternate over the run's
    // micro-batches (two in flight at most); without, always 0. The step's last micro-batch's
    // slot also holds its update (flag, timing marks) and, data parallel, its stop request.
    int micro_batches = 1;
    bool look_ahead = false;
    int slot(int s) const { return result_slot(look_ahead, iteration, micro_batches, s); }
    int last_slot() const { return slot(micro_batches - 1); }
  };

  // The executor's result slot of micro-batch s of step `iteration` (Step::slot; the survivor
  // reads the slots of steps it no longer holds).
  static int result_slot(bool look_ahead, int64_t iteration, int micro_batches, int s) {
    return look_ahead ? static_cast<int>((iteration * micro_batches + s) % 2) : 0;
  }

  // train_loop.cpp: the step.
  Step begin_step(int64_t iteration);
  void queue_micro_batch_host(Step& step, int s);
  void read_micro_batch(Step& step, int s);
  bool queue_ahead_ok(const Step& step) const;
  bool pipeline_ok(const Step& step) const;
  bool trace_due(int64_t iteration) const;
  void queue_micro_batch(Step& step, int s, bool last);
  void end_step(Step& step);
  void check_replicas(Step& step);
  void write_step_trace(Step& step);
  void watch_divergence(Step& step);
  MicroBatch take_micro_batch(Step& step);
  void fetch_ahead(Step& step, int s);
  data::LoaderState loader_state() const;
  bool stop_requested(int64_t iteration) const;
  void host_span(Step& step, const char* name, double start_ms) const;

  // train_loop_report.cpp: what the loop reports and keeps.
  void check_output_folder_fits();
  void announce_graphs_and_idle();
  void print_progress(const Step& step);
  void end_epoch_if_due(const Step& step);
  bool stop_after(const Step& step);  // a signal's stop; sets the result's stop
  void signal_stop(int64_t steps_done);
  void record_epoch(double epoch, int64_t iteration, float rate, const StepSplit& split, const LossSums& sums,
                    double map50);
  void write_chart();
  void settle_idle(size_t keep_open);
  void check_scale_mirror();
  // Synchronous: the state now (check_mirror: the device's loss scale against the host's).
  void save(int64_t iteration, bool check_mirror = true);
  // Periodic saves on the saver's thread (graph/checkpoint_saver.h).
  bool save_due(int64_t iteration) const;
  void keep_or_drop_copy(const Step& step);
  void report_saver_failure();
  void announce_checkpoints();
  Checkpoint checkpoint_header(int64_t iteration) const;  // all but the tensors
  // A peer lost: this rank's state saved as the last step every replica completed, if it is
  // that (the step under way dropped); returns what to add to the error.
  std::string save_as_survivor();
  std::string survivor_state(int64_t* steps) const;
  void write_timeline();
  TrainResult finish();

  const Graph& graph_;
  Executor& executor_;
  Source& source_;
  const TrainOptions& options_;
  const int batch_, subdivisions_;
  const int64_t start_iteration_;
  DataParallel* dp_;
  const int rank_;
  const bool leader_;  // prints, validates and saves
  const NetParams& net_;
  uint64_t seen_;
  LossScaler scaler_;  // fp16: dynamic loss scaling, decided on the reduced gradients
  int64_t max_batches_ = 0;
  NetParams schedule_;  // policy=poly decays to 0 at the run's end
  TrainResult result_;
  bool tty_ = false;
  std::chrono::steady_clock::time_point t_start_, t_print_, t_chart_;
  int64_t images_this_run_ = 0;
  int64_t last_epoch_reported_ = 0;
  StepSplit epoch_split_;  // since the last epoch summary
  LossSums epoch_loss_;    // likewise
  // results.csv (graph/run_record.h), appended each epoch by rank 0, and chart.png from it: drawn
  // at most every 10 s and at the end (its PNG takes 30 ms to encode, which the demo's 50 short
  // epochs made 1.5 s of the run).
  std::string results_csv_, chart_png_;
  bool records_written_ = false, chart_due_ = false;
  std::unique_ptr<StepGraphs> graphs_;
  std::unique_ptr<DeviceIdle> idle_;  // the device's busy and idle time inside each micro-batch
  bool timeline_ = false;             // --timeline: idle_ keeps three steps' spans
  DivergenceWatch divergence_;
  std::unique_ptr<CheckpointSaver> saver_;
  std::chrono::steady_clock::time_point last_save_;
  std::filesystem::file_time_type run_began_;  // a last.ckpt newer than this was written by this run
  // Steps whose update has been queued, and steps read (end_step): those between are in flight.
  int64_t queued_through_ = -1, read_through_ = 0;
  // The micro-batch taken ahead (Source::fetch_ahead), and the loader's position after the last
  // step read: what the steps so far consumed, which checkpoints, epochs and the progress line report.
  std::optional<MicroBatch> ahead_;
  std::optional<data::LoaderState> consumed_;
  // Look-ahead: the next micro-batch (of this step or the next) is queued before this one's loss
  // (and the step's update flag) are read, so the device is not idle while the host reads them
  // (a detector, graphs; TrainOptions::look_ahead). Data parallel too: every rank decides alike what to queue ahead.
  // fp16's loss scale is kept on the device, so a step queued ahead runs at the scale the step
  // before it left; scaler_ follows a step late.
  bool look_ahead_ = false;
};

}  // namespace yolo::graph
