// The training loop's setup and what it reports and keeps (see train_loop_phases.h): the
// progress line, the epoch's summary, validation and best.weights, results.csv and its chart,
// checkpoints, the stop on a signal, and the run's end.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <tuple>

#include "data/image.h"
#include "graph/checkpoint_files.h"
#include "graph/evaluate.h"
#include "graph/run_record.h"
#include "graph/train_loop_phases.h"
#include "graph/weights.h"
#include "runtime/check.h"
#include "runtime/stop_signal.h"

namespace yolo::graph {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string duration_text(double seconds) {
  char buf[32];
  int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", s / 3600, s / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
  return buf;
}

// Why the steps run eagerly rather than as CUDA Graphs ("": graphs).
std::string graphs_off_reason(const TrainOptions& options, Device device, const DataParallel* dp) {
  if (!options.graphs) return "--no-graph";
  if (!device.runs_kernels()) return "the CPU backend runs its ops as they are queued";
  if (dp && !dp->graphs_off.empty()) return dp->graphs_off;
  return "";
}

// The run's end when it stopped early: the message for a signal's stop.
std::string signal_stop_message(int signal, int64_t step, const std::string& out_dir) {
  const std::string who =
      signal ? std::string("stopped by ") + signal_name(signal) : "stopped: another rank was asked to";
  return who + " after step " + std::to_string(step) + "; saved " + out_dir + "/last.weights and " + out_dir +
         "/last.ckpt";
}

}  // namespace

TrainLoop::TrainLoop(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options, int batch,
                     int subdivisions, const Start& start, DataParallel* dp)
    : graph_(graph),
      executor_(executor),
      source_(source),
      options_(options),
      batch_(batch),
      subdivisions_(subdivisions),
      start_iteration_(start.iteration),
      dp_(dp),
      rank_(dp ? dp->comm->rank() : 0),
      leader_(rank_ == 0),
      net_(graph.net),
      seen_(start.seen),
      scaler_(executor.precision() == Precision::Fp16 && options.loss_scaling, options.initial_loss_scale),
      divergence_(options.max_skipped_steps) {
  if (scaler_.enabled() && start.loss_scale) scaler_.restore(*start.loss_scale, options.out_dir + "/last.ckpt");
  // GPUs: the scale the steps run at is kept and adjusted on the device; scaler_ mirrors it.
  if (scaler_.enabled() && executor.device().runs_kernels())
    executor.keep_loss_scale_on_device(scaler_.scale(), static_cast<int>(scaler_.clean_steps()),
                                       scaler_.growth_interval());
  max_batches_ = options.max_batches ? options.max_batches : net_.max_batches;
  if (max_batches_ <= 0) throw Error(graph.path + ": max_batches is 0: set it in [net] or pass --max-batches");
  schedule_ = net_;
  schedule_.max_batches = static_cast<int>(std::min<int64_t>(max_batches_, INT32_MAX));
  std::filesystem::create_directories(options.out_dir);
  result_.weights_path = options.out_dir + "/last.weights";
  result_.checkpoint_path = options.out_dir + "/last.ckpt";
  tty_ = options.progress_in_place && isatty(fileno(stdout));
  t_start_ = t_print_ = t_chart_ = std::chrono::steady_clock::now();
  last_epoch_reported_ = source.state().epoch;
  results_csv_ = options.out_dir + "/results.csv";
  chart_png_ = options.out_dir + "/chart.png";
  if (leader_ && start_iteration_ == 0) std::filesystem::remove(results_csv_);  // a fresh run starts a fresh record
  check_output_folder_fits();
  saver_ = std::make_unique<CheckpointSaver>(executor, options.out_dir);
  last_save_ = std::chrono::steady_clock::now();
  run_began_ = std::filesystem::file_time_type::clock::now();
  read_through_ = start_iteration_;
  queued_through_ = start_iteration_ - 1;
  announce_checkpoints();
  announce_graphs_and_idle();
  look_ahead_ = options.look_ahead && executor.device().runs_kernels() && graph.detection && source.fetch_ahead &&
                graphs_->on();
  if (leader_ && look_ahead_)
    std::printf("train_yolo: look-ahead: each micro-batch is queued before the previous one's loss is read "
                "(--no-look-ahead: after it)\n");
}

// Before the first step: the output folder can take what the saves will write.
void TrainLoop::check_output_folder_fits() {
  if (!leader_) return;
  std::vector<std::pair<std::string, uint64_t>> tensors = {{"params", executor_.packed_parameter_count()},
                                                           {"momentum", executor_.packed_parameter_count()},
                                                           {"stats", executor_.download("stats").size()}};
  if (scaler_.enabled()) tensors.emplace_back(kLossScaleTensor, 3);
  check_output_folder(options_.out_dir, checkpoint_bytes(cfg_digest(graph_), tensors),
                      darknet_weights_bytes(executor_.download_parameters()), options_.valid_every > 0 ? 2 : 1);
}

void TrainLoop::announce_graphs_and_idle() {
  graphs_ = std::make_unique<StepGraphs>(executor_.compute_stream(),
                                         graphs_off_reason(options_, executor_.device(), dp_));
  if (leader_ && executor_.device().runs_kernels()) {
    if (graphs_->on())
      std::printf(
          "train_yolo: CUDA Graphs: each kind of micro-batch is captured after one eager run and replayed "
          "(--no-graph: eager)\n");
    else
      std::printf("train_yolo: the steps run eagerly, without CUDA Graphs: %s\n", graphs_->off_reason().c_str());
  }
  idle_ = std::make_unique<DeviceIdle>(executor_.device(), options_.device_activity && executor_.device().runs_kernels());
  if (leader_ && executor_.device().runs_kernels() && !idle_->available() && options_.device_activity)
    std::printf("train_yolo: device idle time is not measured: %s\n", idle_->why_not().c_str());
  if (options_.timeline_file.empty()) return;
  if (!idle_->available()) {
    const std::string why =
        executor_.device().runs_kernels() ? idle_->why_not() : "the CPU backend runs its ops on the host";
    if (leader_) std::printf("train_yolo: --timeline: no device timeline is recorded: %s\n", why.c_str());
    return;
  }
  // The run's 4th to 6th steps: by then every kind of micro-batch ran eagerly once and was
  // captured (CUDA Graphs), so these are replays. Shorter runs: their last three.
  const int64_t steps = max_batches_ - start_iteration_;
  const int64_t count = std::min<int64_t>(3, steps);
  idle_->keep_timeline(std::min<int64_t>(3, steps - count), count);
  timeline_ = true;
}

// --timeline: each kept window (host lane: from a micro-batch's queueing to its loss read, or a
// pipelined step's, first micro-batch to last) and the
// device's spans in it (device lane), on the recorder's clock; a span that two windows overlap once.
void TrainLoop::write_timeline() {
  if (!timeline_) return;
  RankTrace trace{rank_, executor_.device().name(), {}};
  std::set<std::tuple<int64_t, int64_t, uint32_t>> written;
  int64_t first = -1, last = -1;
  for (const DeviceIdle::TimelineWindow& w : idle_->take_timeline()) {
    const int64_t step = start_iteration_ + w.step + 1;
    first = first < 0 ? step : first;
    last = step;
    trace.events.push_back(TraceEvent{"step " + std::to_string(step) + ": queued .. loss read", "host",
                                      static_cast<double>(w.begin) * 1e-6, static_cast<double>(w.end) * 1e-6});
    for (const ActivitySpan& s : w.spans)
      if (written.emplace(s.start_ns, s.end_ns, s.name).second)
        trace.events.push_back(TraceEvent{activity_name(s.name), "device", static_cast<double>(s.start_ns) * 1e-6,
                                          static_cast<double>(s.end_ns) * 1e-6});
  }
  if (first < 0) {
    if (leader_) std::printf("train_yolo: --timeline: nothing to write: the run ended before its steps were kept\n");
    return;
  }
  const std::string path = rank_trace_path(options_.timeline_file, rank_);
  write_trace(path, {trace});
  if (leader_)
    std::printf("train_yolo: --timeline: steps %lld-%lld, %zu device spans, in %s\n", static_cast<long long>(first),
                static_cast<long long>(last), written.size(), path.c_str());
}

void TrainLoop::settle_idle(size_t keep_open) {
  const StepSplit device = idle_->settle(keep_open);
  epoch_split_ += device;
  result_.split += device;
  if (std::string notice = idle_->take_notice(); !notice.empty() && leader_)
    std::printf("%strain_yolo: %s\n", tty_ ? "\n" : "", notice.c_str());
}

void TrainLoop::write_chart() {
  data::write_image(chart_png_, draw_chart(read_results(results_csv_)));
  t_chart_ = std::chrono::steady_clock::now();
  chart_due_ = false;
}

void TrainLoop::record_epoch(double epoch, int64_t iteration, float rate, const StepSplit& split, const LossSums& sums,
                             double map50) {
  EpochRecord r;
  const double images = std::max<double>(static_cast<double>(sums.images), 1);
  const double steps = std::max<double>(static_cast<double>(split.steps), 1);
  r.epoch = epoch;
  r.iteration = iteration;
  r.loss = sums.total / images;
  r.box = sums.box / images;
  r.obj = sums.obj / images;
  r.noobj = sums.noobj / images;
  r.cls = sums.cls / images;
  r.iou = sums.assigned ? sums.iou_sum / static_cast<double>(sums.assigned) : 0;
  r.recall = sums.assigned ? static_cast<double>(sums.recall50) / static_cast<double>(sums.assigned) : 0;
  r.learning_rate = rate;
  r.images_per_second = static_cast<double>(split.images) / std::max(split.wall_ms / 1000, 1e-9);
  r.data_ms = split.data_ms / steps;
  r.forward_ms = split.forward_ms / steps;
  r.backward_ms = split.backward_ms / steps;
  r.comm_ms = split.comm_ms / steps;
  r.optimizer_ms = split.optimizer_ms / steps;
  r.other_ms = std::max(0.0, split.wall_ms - split.data_ms - split.forward_ms - split.backward_ms - split.comm_ms -
                                 split.optimizer_ms) /
               steps;
  r.idle_ms = split.device_steps > 0 ? split.device_idle_ms / static_cast<double>(split.device_steps) : std::nan("");
  r.map50 = map50;
  append_results(results_csv_, r);
  records_written_ = chart_due_ = true;
  if (std::chrono::steady_clock::now() - t_chart_ >= std::chrono::seconds(10)) write_chart();
}

// The host's mirror of the loss scale against the device's (GPUs; every step read by now).
void TrainLoop::check_scale_mirror() {
  if (!executor_.device().runs_kernels()) return;
  const LossScaleLive device = executor_.device_loss_scale();
  if (device.scale != scaler_.scale() || device.clean != scaler_.clean_steps())
    throw Error("internal error: the loss scale on " + executor_.device().name() + " is " +
                std::to_string(device.scale) + " after " + std::to_string(device.clean) +
                " clean steps, the host's mirror says " + std::to_string(scaler_.scale()) + " after " +
                std::to_string(scaler_.clean_steps()));
}

void TrainLoop::announce_checkpoints() {
  if (!leader_) return;
  std::string when;
  if (options_.checkpoint_minutes > 0) {
    char text[64];
    std::snprintf(text, sizeof text, "every %g min", options_.checkpoint_minutes);
    when = text;
  }
  if (options_.checkpoint_every > 0)
    when += (when.empty() ? "every " : ", every ") +
            (options_.checkpoint_every == 1 ? std::string("step") : std::to_string(options_.checkpoint_every) + " steps");
  if (when.empty())
    std::printf("train_yolo: checkpoints: at the end only (--checkpoint-every 0)\n");
  else
    std::printf("train_yolo: checkpoints: %s and at the end, in %s/last.ckpt (the one before kept as prev.ckpt), "
                "written while training goes on (--checkpoint-minutes M, --checkpoint-every N steps; "
                "--checkpoint-every 0: at the end only)\n",
                when.c_str(), options_.out_dir.c_str());
}

// A periodic save after step `iteration` (decided as it is queued, so that its copy follows its
// update); one copy at a time (look-ahead queues the next step only once this one is decided).
bool TrainLoop::save_due(int64_t iteration) const {
  if (iteration + 1 >= max_batches_ || saver_->copy_queued()) return false;  // the run's end saves anyway
  if (options_.checkpoint_every > 0 && (iteration + 1) % options_.checkpoint_every == 0) return true;
  return options_.checkpoint_minutes > 0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
             options_.checkpoint_minutes * 60;
}

// Once the step is read: its copy written, unless the step was skipped or steps are being skipped
// (the failing forward passes may have reached BatchNorm's running statistics, and the checkpoint
// before them is the last good one). A time-based save then comes at the next good step.
void TrainLoop::keep_or_drop_copy(const Step& step) {
  if (!step.updated || divergence_.skipping()) {
    saver_->discard();
    return;
  }
  Checkpoint ckpt = checkpoint_header(step.iteration + 1);
  if (scaler_.enabled()) {
    const LossScaler::State st = scaler_.state();
    ckpt.tensors.emplace_back(kLossScaleTensor, std::vector<float>{st.scale, static_cast<float>(st.clean),
                                                                   static_cast<float>(st.overflows)});
  }
  saver_->write(std::move(ckpt), seen_);
  last_save_ = std::chrono::steady_clock::now();
}

void TrainLoop::report_saver_failure() {
  if (const std::string failure = saver_->take_failure(); !failure.empty())
    std::printf("%strain_yolo: %s\n", tty_ ? "\n" : "", failure.c_str());
}

Checkpoint TrainLoop::checkpoint_header(int64_t iteration) const {
  Checkpoint ckpt;
  ckpt.cfg_digest = cfg_digest(graph_);
  ckpt.iteration = iteration;
  ckpt.seen = seen_;
  ckpt.loader = loader_state();
  ckpt.seed = options_.seed;
  ckpt.batch = batch_;
  ckpt.subdivisions = subdivisions_;
  return ckpt;
}

void TrainLoop::save(int64_t iteration, bool check_mirror) {
  std::vector<LayerParams> layers = executor_.download_parameters();
  WeightsHeader header;
  header.seen = seen_;
  write_darknet_weights(result_.weights_path, layers, header);
  Checkpoint ckpt = checkpoint_header(iteration);
  ckpt.tensors.emplace_back("params", executor_.download("params"));
  ckpt.tensors.emplace_back("momentum", executor_.download("momentum"));
  ckpt.tensors.emplace_back("stats", executor_.download("stats"));
  if (scaler_.enabled()) {
    const LossScaler::State st = scaler_.state();
    if (check_mirror) check_scale_mirror();
    ckpt.tensors.emplace_back(kLossScaleTensor, std::vector<float>{st.scale, static_cast<float>(st.clean),
                                                                   static_cast<float>(st.overflows)});
  }
  save_checkpoint(options_.out_dir, ckpt);
}

void TrainLoop::print_progress(const Step& step) {
  const int64_t iteration = step.iteration;
  const LossSums& loss = step.loss;
  const double mean = loss.images ? loss.total / static_cast<double>(loss.images) : 0;
  double elapsed = seconds_since(t_start_);
  double rate = images_this_run_ / std::max(elapsed, 1e-9);
  bool last = iteration + 1 == max_batches_;
  if (!leader_ || !(seconds_since(t_print_) >= (tty_ ? 0.25 : 2.0) || last || iteration == start_iteration_)) return;
  t_print_ = std::chrono::steady_clock::now();
  double eta = (max_batches_ - iteration - 1) * static_cast<double>(batch_) / std::max(rate, 1e-9);
  data::LoaderState st = loader_state();
  double epoch = st.epoch + static_cast<double>(st.step) / std::max<int64_t>(source_.steps_per_epoch, 1);
  char line[400];
  if (graph_.detection) {
    std::snprintf(line, sizeof line,
                  "iter %lld/%lld  epoch %.2f  loss %.3f (box %.3f obj %.3f noobj %.3f cls %.3f)  IoU %.2f  "
                  "recall %.2f  lr %.2e  %.4g img/s  ETA %s",
                  static_cast<long long>(iteration + 1), static_cast<long long>(max_batches_), epoch, mean,
                  loss.box / loss.images, loss.obj / loss.images, loss.noobj / loss.images, loss.cls / loss.images,
                  loss.assigned ? loss.iou_sum / loss.assigned : 0.0,
                  loss.assigned ? static_cast<double>(loss.recall50) / loss.assigned : 0.0, step.lr, rate,
                  duration_text(eta).c_str());
  } else {
    std::snprintf(line, sizeof line, "iter %lld/%lld  epoch %.2f  loss %.4f  accuracy %.3f  lr %.2e  %.4g img/s  ETA %s",
                  static_cast<long long>(iteration + 1), static_cast<long long>(max_batches_), epoch, mean,
                  static_cast<double>(loss.correct) / std::max<int64_t>(loss.images, 1), step.lr, rate,
                  duration_text(eta).c_str());
  }
  std::printf(tty_ ? "\r%s\033[K" : "%s\n", line);
  std::fflush(stdout);
}

// One line per epoch: the mean loss, the step split, what the loader did; validation (every
// rank validates, on its own replica; rank 0 reports and keeps best.weights: the others would
// otherwise wait for rank 0 in the next all-reduce, possibly past --comm-timeout); results.csv.
void TrainLoop::end_epoch_if_due(const Step& step) {
  const int64_t epoch_now = loader_state().epoch;
  if (epoch_now == last_epoch_reported_) return;
  settle_idle(0);
  // Epochs are counted as completed ones, as the progress line's fraction and results.csv count
  // them: the first epoch ends as "epoch 1".
  if (leader_) {
    std::string summary = source_.epoch_summary(last_epoch_reported_);
    std::printf("%strain_yolo: epoch %lld: loss %.4g; %s%s%s\n", tty_ ? "\n" : "", static_cast<long long>(epoch_now),
                epoch_loss_.images ? epoch_loss_.total / static_cast<double>(epoch_loss_.images) : 0.0,
                epoch_split_.text().c_str(), summary.empty() ? "" : "; data: ", summary.c_str());
  }
  const StepSplit finished_split = epoch_split_;
  const LossSums finished_loss = epoch_loss_;
  epoch_split_ = StepSplit{};
  epoch_loss_ = LossSums{};
  last_epoch_reported_ = epoch_now;
  double validated = -1;
  if (source_.validate && options_.valid_every > 0 && epoch_now % options_.valid_every == 0) {
    double map50 = source_.validate();
    validated = map50;
    bool best = map50 > result_.best_map50;
    if (best) result_.best_map50 = map50;
    if (leader_)
      std::printf("train_yolo: epoch %lld: validation mAP@0.5 = %.4f%s\n", static_cast<long long>(epoch_now), map50,
                  best ? " (best so far: best.weights)" : "");
    if (best && leader_) {
      WeightsHeader header;
      header.seen = seen_;
      write_darknet_weights(options_.out_dir + "/best.weights", executor_.download_parameters(), header);
    }
  }
  if (leader_)
    record_epoch(static_cast<double>(epoch_now), step.iteration + 1, step.lr, finished_split, finished_loss, validated);
}

// A signal's stop (every rank stops after the same step: data parallel reads the all-reduced
// requests).
bool TrainLoop::stop_after(const Step& step) {
  bool stop_now = false;
  if (dp_)
    stop_now = static_cast<const float*>(dp_->stop_host.data())[2 * step.last_slot() + 1] > 0;  // every rank reads the same sum
  else
    stop_now = stop_requested(step.iteration);
  if (!stop_now || step.iteration + 1 == max_batches_) return false;
  signal_stop(step.iteration + 1);
  return true;
}

void TrainLoop::signal_stop(int64_t steps_done) {
  result_.stop = TrainStop::Signal;
  result_.stop_signal = stop_signal();
  result_.stop_message = signal_stop_message(result_.stop_signal, steps_done, options_.out_dir);
}

TrainResult TrainLoop::finish() {
  if (dp_) dp_->stream->synchronize();  // rethrows an error of its host functions (see end_step)
  if (const std::string failure = saver_->wait(); !failure.empty() && leader_)
    std::printf("%strain_yolo: %s\n", tty_ ? "\n" : "", failure.c_str());
  if (leader_ && saver_->written() > 0)
    std::printf("%strain_yolo: %lld checkpoint%s saved while training went on, %.2f s each on the saver's thread\n",
                tty_ ? "\n" : "", static_cast<long long>(saver_->written()), saver_->written() == 1 ? "" : "s",
                saver_->write_seconds() / static_cast<double>(saver_->written()));
  if (tty_ && leader_) std::printf("\n");
  settle_idle(0);
  write_timeline();
  // The partial last epoch gets its row too (epoch fractional).
  if (leader_ && epoch_split_.steps > 0) {
    const data::LoaderState st = loader_state();
    record_epoch(st.epoch + static_cast<double>(st.step) / std::max<int64_t>(source_.steps_per_epoch, 1),
                 result_.iterations,
                 learning_rate_at(schedule_, std::max<int64_t>(result_.iterations - 1, 0), options_.seed), epoch_split_,
                 epoch_loss_, -1);
  }
  if (leader_ && chart_due_) write_chart();
  if (leader_ && records_written_)
    std::printf("train_yolo: per-epoch results in %s, chart %s\n", results_csv_.c_str(), chart_png_.c_str());
  if (leader_ && idle_->empty_windows() > 0)
    std::printf(
        "train_yolo: no device activity was recorded in %lld of %lld windows (a micro-batch each, or a step "
        "whose micro-batches were queued back to back; CUPTI handed it over late?): the idle figure leaves them "
        "out\n",
        static_cast<long long>(idle_->empty_windows()), static_cast<long long>(idle_->settled_windows()));
  if (leader_ && epoch_split_.steps > 0)
    std::printf("train_yolo: the last %lld steps: %s\n", static_cast<long long>(epoch_split_.steps),
                epoch_split_.text().c_str());
  result_.images_per_second = images_this_run_ / std::max(seconds_since(t_start_), 1e-9);
  result_.graphs_captured = graphs_->captured();
  result_.graphs_off = graphs_->off_reason();
  if (leader_ && result_.stop == TrainStop::Diverged) {
    // Skipped steps leave the parameters and momentum as they were, but the failing forward
    // passes may have reached BatchNorm's running statistics: only a finite state is saved.
    if (!state_finite(executor_)) {
      result_.stop_message += ". The checkpoint on disk was kept (the running state is not finite): " +
                             (std::filesystem::exists(result_.checkpoint_path) ? result_.checkpoint_path
                                                                              : std::string("none was saved yet"));
      return result_;
    }
    result_.stop_message += ". The state before the skipped steps is saved in " + result_.checkpoint_path;
  }
  if (leader_) save(result_.iterations);
  return result_;
}

}  // namespace yolo::graph
