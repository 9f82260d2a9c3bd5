// The training loop (see train_loop.h).
#include "graph/train_loop.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "data/feeder.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/rng.h"
#include "data/transform.h"
#include "graph/checkpoint_files.h"
#include "graph/device_idle.h"
#include "graph/divergence.h"
#include "graph/evaluate.h"
#include "graph/executor.h"
#include "graph/loss_scale.h"
#include "graph/run_record.h"
#include "graph/scaling.h"
#include "graph/step_graphs.h"
#include "graph/weights.h"
#include "runtime/check.h"
#include "runtime/communicator.h"
#include "runtime/emu_communicator.h"
#include "runtime/fault.h"
#include "runtime/memory.h"
#include "runtime/nccl_communicator.h"
#include "runtime/rendezvous.h"
#include "runtime/socket_communicator.h"
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

// A hash of the parameters' bytes (replicas must agree bit for bit).
uint64_t parameter_hash(Executor& executor) {
  std::vector<float> params = executor.download("params");
  return fnv1a64(params.data(), params.size() * sizeof(float));
}

// The all-reduce spans of a traced step: appended by host functions on the comm stream (shared:
// a failing step may unwind while some are still queued).
struct CommTrace {
  std::mutex mutex;
  std::vector<TraceEvent> events;
};

// All-reduces [begin, end) of the gradients on the comm stream once the compute stream has
// produced them (an event recorded there). With `trace`, the span is timed by host functions on
// the comm stream, after the wait, around the collective (named by its bucket; -1: all
// gradients at once).
void all_reduce_gradients(Executor& executor, DataParallel& dp, size_t begin, size_t end,
                          const std::shared_ptr<CommTrace>& trace, int bucket) {
  executor.compute_stream().record(*dp.gradients_done);
  // A planted fault (emulated build only): the all-reduce does not wait for the gradients.
  if (!fault_injected(Fault::CommSkipsComputeWait)) dp.stream->wait(*dp.gradients_done);
  if (bucket <= 0) {  // the step's first collective: the stop requests ride ahead of it
    auto* host = static_cast<float*>(dp.stop_host.data());
    copy_bytes(dp.stop_device.data(), host, sizeof(float), dp.stream);
    dp.comm->all_reduce_sum(static_cast<float*>(dp.stop_device.data()), 1, *dp.stream);
    copy_bytes(host + 1, dp.stop_device.data(), sizeof(float), dp.stream);
  }
  if (!trace) {
    dp.comm->all_reduce_sum(executor.gradients() + begin, end - begin, *dp.stream);
    return;
  }
  char label[96];
  double mb = (end - begin) * sizeof(float) / 1048576.0;
  if (bucket >= 0)
    std::snprintf(label, sizeof label, "allreduce bucket %d (%.1f MB)", bucket, mb);
  else
    std::snprintf(label, sizeof label, "allreduce all (%.1f MB)", mb);
  auto span = std::make_shared<TraceEvent>(TraceEvent{label, "comm", 0, 0});
  dp.stream->enqueue([&executor, span] { span->start_ms = executor.trace_now_ms(); });
  dp.comm->all_reduce_sum(executor.gradients() + begin, end - begin, *dp.stream);
  dp.stream->enqueue([&executor, span, trace] {
    span->end_ms = executor.trace_now_ms();
    std::lock_guard lock(trace->mutex);
    trace->events.push_back(*span);
  });
}

// The run's end when it stopped early: the message for a signal's stop.
std::string signal_stop_message(int signal, int64_t step, const std::string& out_dir) {
  const std::string who =
      signal ? std::string("stopped by ") + signal_name(signal) : "stopped: another rank was asked to";
  return who + " after step " + std::to_string(step) + "; saved " + out_dir + "/last.weights and " + out_dir +
         "/last.ckpt";
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string cfg_digest(const Graph& graph) {
  std::string table = summary_table(graph);
  uint64_t h = fnv1a64(table.data(), table.size());
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

TrainResult run_loop(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options, int batch,
                     int subdivisions, const Start& start, DataParallel* dp) {
  const int64_t start_iteration = start.iteration;
  uint64_t seen = start.seen;
  const int rank = dp ? dp->comm->rank() : 0;
  const bool leader = rank == 0;  // prints, validates and saves
  const NetParams& net = graph.net;
  // fp16: dynamic loss scaling, decided on the reduced gradients (the same on every rank).
  LossScaler scaler(executor.precision() == Precision::Fp16 && options.loss_scaling, options.initial_loss_scale);
  if (scaler.enabled() && start.loss_scale) scaler.restore(*start.loss_scale, options.out_dir + "/last.ckpt");
  int64_t max_batches = options.max_batches ? options.max_batches : net.max_batches;
  if (max_batches <= 0) throw Error(graph.path + ": max_batches is 0: set it in [net] or pass --max-batches");
  NetParams schedule = net;  // policy=poly decays to 0 at the run's end
  schedule.max_batches = static_cast<int>(std::min<int64_t>(max_batches, INT32_MAX));
  std::filesystem::create_directories(options.out_dir);
  TrainResult result;
  result.weights_path = options.out_dir + "/last.weights";
  result.checkpoint_path = options.out_dir + "/last.ckpt";
  bool tty = options.progress_in_place && isatty(fileno(stdout));
  auto t_start = std::chrono::steady_clock::now();
  auto t_print = t_start;
  int64_t images_this_run = 0;
  int64_t last_epoch_reported = source.state().epoch;
  StepSplit epoch_split;  // since the last epoch summary
  LossSums epoch_loss;    // likewise
  // results.csv (graph/run_record.h), appended each epoch by rank 0, and chart.png from it: drawn
  // at most every 10 s and at the end (its PNG takes 30 ms to encode, which the demo's 50 short
  // epochs made 1.5 s of the run).
  const std::string results_csv = options.out_dir + "/results.csv", chart_png = options.out_dir + "/chart.png";
  bool records_written = false, chart_due = false;
  auto t_chart = t_start;
  auto write_chart = [&] {
    data::write_image(chart_png, draw_chart(read_results(results_csv)));
    t_chart = std::chrono::steady_clock::now();
    chart_due = false;
  };
  if (leader && start_iteration == 0) std::filesystem::remove(results_csv);  // a fresh run starts a fresh record
  auto record_epoch = [&](double epoch, int64_t iteration, float rate, const StepSplit& split, const LossSums& sums,
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
    append_results(results_csv, r);
    records_written = chart_due = true;
    if (std::chrono::steady_clock::now() - t_chart >= std::chrono::seconds(10)) write_chart();
  };

  // Before the first step: the output folder can take what the saves will write.
  if (leader) {
    std::vector<std::pair<std::string, uint64_t>> tensors = {{"params", executor.parameter_count()},
                                                             {"momentum", executor.parameter_count()},
                                                             {"stats", executor.download("stats").size()}};
    if (scaler.enabled()) tensors.emplace_back(kLossScaleTensor, 3);
    check_output_folder(options.out_dir, checkpoint_bytes(cfg_digest(graph), tensors),
                        darknet_weights_bytes(executor.download_parameters()), options.valid_every > 0 ? 2 : 1);
  }

  auto save = [&](int64_t iteration) {
    std::vector<LayerParams> layers = executor.download_parameters();
    WeightsHeader header;
    header.seen = seen;
    write_darknet_weights(result.weights_path, layers, header);
    Checkpoint ckpt;
    ckpt.cfg_digest = cfg_digest(graph);
    ckpt.iteration = iteration;
    ckpt.seen = seen;
    ckpt.loader = source.state();
    ckpt.seed = options.seed;
    ckpt.tensors.emplace_back("params", executor.download("params"));
    ckpt.tensors.emplace_back("momentum", executor.download("momentum"));
    ckpt.tensors.emplace_back("stats", executor.download("stats"));
    if (scaler.enabled()) {
      const LossScaler::State st = scaler.state();
      ckpt.tensors.emplace_back(kLossScaleTensor, std::vector<float>{st.scale, static_cast<float>(st.clean),
                                                                     static_cast<float>(st.overflows)});
    }
    save_checkpoint(options.out_dir, ckpt);
  };

  StepGraphs graphs(executor.compute_stream(), graphs_off_reason(options, executor.device(), dp));
  if (leader && executor.device().runs_kernels()) {
    if (graphs.on())
      std::printf(
          "train_yolo: CUDA Graphs: each kind of micro-batch is captured after one eager run and replayed "
          "(--no-graph: eager)\n");
    else
      std::printf("train_yolo: the steps run eagerly, without CUDA Graphs: %s\n", graphs.off_reason().c_str());
  }
  // The device's busy and idle time inside each micro-batch (graph/device_idle.h).
  DeviceIdle idle(executor.device(), options.device_activity && executor.device().runs_kernels());
  if (leader && executor.device().runs_kernels() && !idle.available() && options.device_activity)
    std::printf("train_yolo: device idle time is not measured: %s\n", idle.why_not().c_str());
  auto settle_idle = [&](size_t keep_open) {
    const StepSplit device = idle.settle(keep_open);
    epoch_split += device;
    result.split += device;
    if (std::string notice = idle.take_notice(); !notice.empty() && leader)
      std::printf("%strain_yolo: %s\n", tty ? "\n" : "", notice.c_str());
  };

  // Stops: a signal's request (all ranks after the same step) and divergence.
  auto stop_requested = [&](int64_t iteration) {
    return options.stop_requested ? options.stop_requested(rank, iteration) : stop_signal() != 0;
  };
  DivergenceWatch divergence(options.max_skipped_steps);

  for (int64_t iteration = start_iteration; iteration < max_batches; ++iteration) {
    if (options.before_step) options.before_step(executor, rank, iteration);
    if (dp) static_cast<float*>(dp->stop_host.data())[0] = stop_requested(iteration) ? 1.0f : 0.0f;
    const bool check_this = divergence.check_due();  // the per-layer check of a diverging run
    NonFinite found;
    bool forward_checked = false;
    bool trace_this = !options.trace_file.empty() &&
                      iteration == start_iteration + std::min<int64_t>(1, max_batches - start_iteration - 1);
    const float loss_scale = scaler.scale();
    executor.set_loss_scale(loss_scale);
    const float lr = learning_rate_at(schedule, iteration, options.seed);
    auto comm_trace = trace_this && dp ? std::make_shared<CommTrace>() : nullptr;
    std::vector<TraceEvent> host_events;  // host clock (Executor::clock_ms), converted after the step
    auto host_span = [&](const char* name, double start_ms) {
      if (trace_this) host_events.push_back(TraceEvent{name, "host", start_ms, Executor::clock_ms()});
    };
    const double step_start = Executor::clock_ms();
    StepSplit split;
    if (trace_this && source.trace_copies) source.trace_copies(true);
    for (int s = 0; s < subdivisions; ++s) {
      const bool last = s == subdivisions - 1;
      // A traced step runs eagerly: its per-layer events are timed where they are queued. So does
      // the checked one: its outputs are read back from the host during backward.
      const bool replay = graphs.on() && !trace_this && !check_this;
      if (check_this && last)  // before the first backward, every forward output is still held
        executor.set_before_backward([&](int) {
          if (!forward_checked) found = find_non_finite_forward(graph, executor), forward_checked = true;
        });
      executor.set_tracing(trace_this && s == 0);  // the step's first micro-batch
      double t = Executor::clock_ms();
      MicroBatch mb = source.next();
      split.data_ms += Executor::clock_ms() - t;
      host_span("data wait", t);
      t = Executor::clock_ms();
      idle.open_window();
      if (replay)
        executor.stage_inputs(mb.images, mb.truths, mb.truth_counts, mb.labels);
      else
        executor.use_inputs(mb.images, mb.truths, mb.truth_counts, mb.labels);
      // The loss scale is divided back out with the batch.
      if (last) executor.set_step_values(lr, 1.0f / (static_cast<float>(batch) * loss_scale));
      // Everything of this micro-batch that runs on the device, queued without waiting for the
      // host: forward, backward and, in the last, the all-reduces and the update.
      auto queue = [&] {
        size_t next_bucket = 0;
        // Overlap: in the step's last micro-batch, each bucket's all-reduce starts on the
        // communication stream as soon as backward has produced its last gradient.
        if (dp && dp->overlap && last)
          executor.set_gradients_ready([&](size_t ready) {
            while (next_bucket < dp->buckets.size() && dp->buckets[next_bucket].second <= ready) {
              auto [begin, end] = dp->buckets[next_bucket];
              all_reduce_gradients(executor, *dp, begin, end, comm_trace, static_cast<int>(next_bucket));
              ++next_bucket;
            }
          });
        else
          executor.set_gradients_ready({});
        executor.queue_micro_batch(s > 0);
        executor.set_gradients_ready({});  // the callback refers to this frame's next_bucket
        if (!last) return;
        if (dp) {
          if (!dp->overlap)
            all_reduce_gradients(executor, *dp, 0, executor.parameter_count(), comm_trace, -1);
          else if (next_bucket != dp->buckets.size())
            throw Error("internal error: " + std::to_string(next_bucket) + " of " + std::to_string(dp->buckets.size()) +
                        " gradient buckets were all-reduced in backward");
          dp->stream->record(*dp->reduced);  // the update waits for the reduced gradients on the device
          executor.compute_stream().wait(*dp->reduced);
        }
        executor.queue_update(net.momentum, net.decay);
      };
      const std::string key = std::to_string(executor.graph().input.w) + "x" +
                              std::to_string(executor.graph().input.h) + (s > 0 ? " accumulating" : " first") +
                              (last ? " last" : "");
      if (replay) {
        if (graphs.run(key, queue)) ++result.graph_launches;
        if (std::string why = graphs.take_notice(); !why.empty() && leader)
          std::printf("%strain_yolo: CUDA Graphs off, the steps run eagerly from now on: %s\n", tty ? "\n" : "",
                      why.c_str());
      } else {
        queue();
      }
      host_span("queue micro-batch (host)", t);
      t = Executor::clock_ms();
      if (last && dp) dp->comm->wait(executor.compute_stream());  // the step's collectives, with the deadline
      executor.read_micro_batch_loss();
      host_span("wait for the micro-batch (host)", t);
      idle.close_window(last);
      if (check_this && last) executor.set_before_backward({});
    }
    if (idle.due()) settle_idle(DeviceIdle::kKeepOpen);
    const bool updated = executor.update_applied();
    scaler.update(!updated);
    if (dp) dp->stream->synchronize();  // done by now; rethrows an error of its host functions
    const PhaseTimes phases = executor.take_phase_times();
    split.forward_ms = phases.forward_ms;
    split.backward_ms = phases.backward_ms;
    split.comm_ms = phases.wait_ms;
    split.optimizer_ms = phases.update_ms;
    LossSums loss = executor.take_loss();
    epoch_loss += loss;
    if (dp && dp->check_every > 0 && (iteration + 1) % dp->check_every == 0) {
      double t = Executor::clock_ms();
      std::vector<uint64_t> hashes = dp->comm->all_gather(parameter_hash(executor));
      for (size_t r = 1; r < hashes.size(); ++r)
        if (hashes[r] != hashes[0])
          throw Error("replicas diverged at step " + std::to_string(iteration + 1) + ": rank " + std::to_string(r) +
                      "'s parameters differ from rank 0's");
      split.comm_ms += Executor::clock_ms() - t;
      host_span("parameter hash check", t);
    }
    split.steps = 1;
    split.images = batch;
    split.wall_ms = Executor::clock_ms() - step_start;
    epoch_split += split;
    result.split += split;
    if (trace_this) {
      RankTrace trace{rank, executor.device().name(), executor.take_trace()};
      if (comm_trace) trace.events.insert(trace.events.end(), comm_trace->events.begin(), comm_trace->events.end());
      // Host times onto the executor's trace clock.
      double origin = Executor::clock_ms() - executor.trace_now_ms();
      if (source.take_copy_events) {
        std::vector<TraceEvent> copies = source.take_copy_events();
        host_events.insert(host_events.end(), copies.begin(), copies.end());
        source.trace_copies(false);
      }
      for (TraceEvent e : host_events) {
        e.start_ms -= origin;
        e.end_ms -= origin;
        trace.events.push_back(e);
      }
      if (dp && dp->traces) {
        std::lock_guard lock(dp->traces->mutex);
        dp->traces->ranks.push_back(std::move(trace));
      } else {
        write_trace(rank_trace_path(options.trace_file, rank), {trace});
      }
    }
    seen += static_cast<uint64_t>(batch);
    images_this_run += batch;
    double mean = loss.images ? loss.total / static_cast<double>(loss.images) : 0;
    if (iteration == start_iteration) result.first_loss = mean;
    result.last_loss = mean;
    result.losses.push_back(mean);
    result.loss_scale = scaler.scale();
    result.overflow_skips = scaler.overflows();
    result.iterations = iteration + 1;
    // Divergence: non-finite gradients in max_skipped_steps steps in a row. fp16's overflows are
    // loss-scale adjustments, not divergence, while the scale can still go down; at its floor
    // (2^-24) a skipped step is divergence again, or such a run would skip forever.
    const bool scale_adjusted = scaler.enabled() && loss_scale > LossScaler::kMin;
    const bool skipped = !updated && !scale_adjusted;
    std::vector<uint64_t> findings;
    if (skipped && check_this) {
      if (found.layer < 0) found = find_non_finite_gradients(graph, executor);
      // Every rank skipped this step (the gradients were reduced) and checked it.
      findings = dp ? dp->comm->all_gather(found.code()) : std::vector<uint64_t>{found.code()};
    }
    divergence.step_done(iteration + 1, skipped, findings);
    if (!updated && leader && scale_adjusted)
      std::printf(
          "%strain_yolo: step %lld skipped: fp16 gradients overflowed at loss scale %g; the scale is now %g "
          "(a loss-scale adjustment, not divergence)\n",
          tty ? "\n" : "", static_cast<long long>(iteration + 1), static_cast<double>(loss_scale),
          static_cast<double>(scaler.scale()));
    else if (!updated && leader)
      std::printf("%strain_yolo: step %lld skipped: a gradient was NaN or infinite (the parameters are unchanged)\n",
                  tty ? "\n" : "", static_cast<long long>(iteration + 1));

    double elapsed = seconds_since(t_start);
    double rate = images_this_run / std::max(elapsed, 1e-9);
    bool last = iteration + 1 == max_batches;
    if (leader && (seconds_since(t_print) >= (tty ? 0.25 : 2.0) || last || iteration == start_iteration)) {
      t_print = std::chrono::steady_clock::now();
      double eta = (max_batches - iteration - 1) * static_cast<double>(batch) / std::max(rate, 1e-9);
      data::LoaderState st = source.state();
      double epoch = st.epoch + static_cast<double>(st.step) / std::max<int64_t>(source.steps_per_epoch, 1);
      char line[400];
      if (graph.detection) {
        std::snprintf(line, sizeof line,
                      "iter %lld/%lld  epoch %.2f  loss %.3f (box %.3f obj %.3f noobj %.3f cls %.3f)  IoU %.2f  "
                      "recall %.2f  lr %.2e  %.4g img/s  ETA %s",
                      static_cast<long long>(iteration + 1), static_cast<long long>(max_batches), epoch, mean,
                      loss.box / loss.images, loss.obj / loss.images, loss.noobj / loss.images, loss.cls / loss.images,
                      loss.assigned ? loss.iou_sum / loss.assigned : 0.0,
                      loss.assigned ? static_cast<double>(loss.recall50) / loss.assigned : 0.0, lr, rate,
                      duration_text(eta).c_str());
      } else {
        std::snprintf(line, sizeof line,
                      "iter %lld/%lld  epoch %.2f  loss %.4f  accuracy %.3f  lr %.2e  %.4g img/s  ETA %s",
                      static_cast<long long>(iteration + 1), static_cast<long long>(max_batches), epoch, mean,
                      static_cast<double>(loss.correct) / std::max<int64_t>(loss.images, 1), lr, rate,
                      duration_text(eta).c_str());
      }
      std::printf(tty ? "\r%s\033[K" : "%s\n", line);
      std::fflush(stdout);
    }
    int64_t epoch_now = source.state().epoch;
    if (epoch_now != last_epoch_reported) {
      settle_idle(0);
      // One line per epoch: the mean loss, the step split, what the loader did. Epochs are
      // counted as completed ones, as the progress line's fraction and results.csv count them:
      // the first epoch ends as "epoch 1".
      if (leader) {
        std::string summary = source.epoch_summary(last_epoch_reported);
        std::printf("%strain_yolo: epoch %lld: loss %.4g; %s%s%s\n", tty ? "\n" : "",
                    static_cast<long long>(epoch_now),
                    epoch_loss.images ? epoch_loss.total / static_cast<double>(epoch_loss.images) : 0.0,
                    epoch_split.text().c_str(), summary.empty() ? "" : "; data: ", summary.c_str());
      }
      const StepSplit finished_split = epoch_split;
      const LossSums finished_loss = epoch_loss;
      epoch_split = StepSplit{};
      epoch_loss = LossSums{};
      last_epoch_reported = epoch_now;
      double validated = -1;
      // Every rank validates (on its own replica; rank 0 reports and keeps best.weights): the
      // others would otherwise wait for rank 0 in the next all-reduce, possibly past --comm-timeout.
      if (source.validate && options.valid_every > 0 && epoch_now % options.valid_every == 0) {
        double map50 = source.validate();
        validated = map50;
        bool best = map50 > result.best_map50;
        if (best) result.best_map50 = map50;
        if (leader)
          std::printf("train_yolo: epoch %lld: validation mAP@0.5 = %.4f%s\n", static_cast<long long>(epoch_now), map50,
                      best ? " (best so far: best.weights)" : "");
        if (best && leader) {
          WeightsHeader header;
          header.seen = seen;
          write_darknet_weights(options.out_dir + "/best.weights", executor.download_parameters(), header);
        }
      }
      if (leader)
        record_epoch(static_cast<double>(epoch_now), iteration + 1, lr, finished_split, finished_loss, validated);
    }
    if (divergence.diverged()) {
      result.stop = TrainStop::Diverged;
      result.stop_message = divergence.message(graph, dp != nullptr);
      break;
    }
    bool stop_now = false;
    if (dp)
      stop_now = static_cast<const float*>(dp->stop_host.data())[1] > 0;  // every rank reads the same sum
    else
      stop_now = stop_requested(iteration);
    if (stop_now && !last) {
      result.stop = TrainStop::Signal;
      result.stop_signal = stop_signal();
      result.stop_message = signal_stop_message(result.stop_signal, iteration + 1, options.out_dir);
      break;
    }
    // Not while steps are being skipped: the failing forward passes may have reached BatchNorm's
    // running statistics, and the checkpoint before them is the last good one.
    if (leader && options.checkpoint_every > 0 && (iteration + 1) % options.checkpoint_every == 0 && !last &&
        !divergence.skipping())
      save(iteration + 1);
  }
  if (tty && leader) std::printf("\n");
  settle_idle(0);
  // The partial last epoch gets its row too (epoch fractional).
  if (leader && epoch_split.steps > 0) {
    const data::LoaderState st = source.state();
    record_epoch(st.epoch + static_cast<double>(st.step) / std::max<int64_t>(source.steps_per_epoch, 1),
                 result.iterations,
                 learning_rate_at(schedule, std::max<int64_t>(result.iterations - 1, 0), options.seed), epoch_split,
                 epoch_loss, -1);
  }
  if (leader && chart_due) write_chart();
  if (leader && records_written)
    std::printf("train_yolo: per-epoch results in %s, chart %s\n", results_csv.c_str(), chart_png.c_str());
  if (leader && idle.empty_windows() > 0)
    std::printf(
        "train_yolo: no device activity was recorded in %lld of %lld micro-batches (CUPTI handed it "
        "over late?): the idle figure leaves them out\n",
        static_cast<long long>(idle.empty_windows()), static_cast<long long>(idle.settled_windows()));
  if (leader && epoch_split.steps > 0)
    std::printf("train_yolo: the last %lld steps: %s\n", static_cast<long long>(epoch_split.steps),
                epoch_split.text().c_str());
  result.images_per_second = images_this_run / std::max(seconds_since(t_start), 1e-9);
  result.graphs_captured = graphs.captured();
  result.graphs_off = graphs.off_reason();
  if (leader && result.stop == TrainStop::Diverged) {
    // Skipped steps leave the parameters and momentum as they were, but the failing forward
    // passes may have reached BatchNorm's running statistics: only a finite state is saved.
    if (!state_finite(executor)) {
      result.stop_message += ". The checkpoint on disk was kept (the running state is not finite): " +
                             (std::filesystem::exists(result.checkpoint_path) ? result.checkpoint_path
                                                                              : std::string("none was saved yet"));
      return result;
    }
    result.stop_message += ". The state before the skipped steps is saved in " + result.checkpoint_path;
  }
  if (leader) save(result.iterations);
  return result;
}

}  // namespace yolo::graph
