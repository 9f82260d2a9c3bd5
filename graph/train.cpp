// The training loop (see train.h).
#include "graph/train.h"

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
#include "data/loader.h"
#include "data/rng.h"
#include "data/transform.h"
#include "graph/evaluate.h"
#include "graph/executor.h"
#include "graph/loss_scale.h"
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

namespace yolo::graph {

float learning_rate_at(const NetParams& net, int64_t iteration) {
  if (net.burn_in > 0 && iteration < net.burn_in)
    return net.learning_rate * static_cast<float>(std::pow(static_cast<double>(iteration) / net.burn_in, 4.0));
  float rate = net.learning_rate;
  if (net.policy == NetParams::Policy::Steps)
    for (size_t k = 0; k < net.steps.size(); ++k)
      if (iteration >= net.steps[k]) rate *= net.scales[k];
  return rate;
}

StepSplit& StepSplit::operator+=(const StepSplit& o) {
  steps += o.steps;
  images += o.images;
  wall_ms += o.wall_ms;
  data_ms += o.data_ms;
  forward_ms += o.forward_ms;
  backward_ms += o.backward_ms;
  comm_ms += o.comm_ms;
  optimizer_ms += o.optimizer_ms;
  return *this;
}

std::string StepSplit::text() const {
  if (steps == 0) return "no steps";
  double n = static_cast<double>(steps);
  double other = wall_ms - data_ms - forward_ms - backward_ms - comm_ms - optimizer_ms;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%.4g img/s; a step %.1f ms = data wait %.1f + forward %.1f + backward %.1f + exposed comm %.1f + "
                "optimizer %.1f + other %.1f",
                images / std::max(wall_ms / 1000, 1e-9), wall_ms / n, data_ms / n, forward_ms / n, backward_ms / n,
                comm_ms / n, optimizer_ms / n, std::max(other, 0.0) / n);
  return buf;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string duration_text(double seconds) {
  char buf[32];
  int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", s / 3600, s / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
  return buf;
}

// 64-bit FNV-1a of a byte range.
uint64_t fnv1a64(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Identifies the architecture (and input size) a checkpoint belongs to.
std::string cfg_digest(const Graph& graph) {
  std::string table = summary_table(graph);
  uint64_t h = fnv1a64(table.data(), table.size());
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// One rank's events of the traced step (host-clock milliseconds on one timeline).
struct RankTrace {
  int rank = 0;
  std::string device;
  std::vector<TraceEvent> events;
};

// The in-process ranks' traces, written as one file (a process per rank) once all have run.
struct TraceBook {
  std::mutex mutex;
  std::vector<RankTrace> ranks;
};

// What the replicas (threads) of one process share: their traces, and which rank failed first
// (set before it aborts the communicators, so the ranks that fail because of it never win).
struct ReplicaGroup {
  TraceBook traces;
  std::atomic<int> first_failure{-1};
  void failed(int rank) {
    int none = -1;
    first_failure.compare_exchange_strong(none, rank);
  }
};

// Chrome-trace lanes (tid) by event category.
int trace_lane(const char* cat) {
  if (std::strcmp(cat, "comm") == 0) return 1;
  if (std::strcmp(cat, "copy") == 0) return 2;
  if (std::strcmp(cat, "host") == 0) return 3;
  return 0;  // forward, backward: the compute stream
}

void write_trace(const std::string& path, const std::vector<RankTrace>& ranks) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"traceEvents\":[";
    const char* sep = "\n";
    for (const RankTrace& rank : ranks) {
      out << sep << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank.rank << ",\"args\":{\"name\":\"rank "
          << rank.rank << " (" << rank.device << ")\"}}";
      sep = ",\n";
      const char* lanes[] = {"compute stream", "comm stream", "copy stream", "host thread"};
      for (int lane = 0; lane < 4; ++lane)
        out << sep << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank.rank << ",\"tid\":" << lane
            << ",\"args\":{\"name\":\"" << lanes[lane] << "\"}}";
      // Each rank's timeline starts at its first event.
      double origin = 0;
      for (size_t k = 0; k < rank.events.size(); ++k)
        origin = k ? std::min(origin, rank.events[k].start_ms) : rank.events[k].start_ms;
      for (const TraceEvent& e : rank.events) {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                      e.name.c_str(), e.cat, rank.rank, trace_lane(e.cat), (e.start_ms - origin) * 1000,
                      (e.end_ms - e.start_ms) * 1000);
        out << buf;
      }
    }
    out << "\n]}\n";
    if (!out) throw Error("cannot write the trace file " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

// What the loop needs from a data source: the next micro-batch's device pointers.
struct MicroBatch {
  const float* images = nullptr;
  const YoloTruth* truths = nullptr;
  const int* truth_counts = nullptr;
  const int* labels = nullptr;
};

struct Source {
  std::function<MicroBatch()> next;
  std::function<data::LoaderState()> state;
  std::function<std::string(int64_t epoch)> epoch_summary;  // "" when there is nothing to say
  std::function<double()> validate;                         // mAP@0.5 on the validation split (optional)
  // --trace: record the host-to-device copies (Executor::clock_ms times) while on; take them
  // once the step is done (optional: sources that copy synchronously have none).
  std::function<void(bool on)> trace_copies;
  std::function<std::vector<TraceEvent>()> take_copy_events;
  int64_t steps_per_epoch = 1;                               // in micro-batches
};

// One replica's part in data-parallel training (absent with one device).
struct DataParallel {
  Communicator* comm = nullptr;
  Stream* stream = nullptr;                          // the replica's communication stream
  std::unique_ptr<Event> gradients_done;             // on the compute stream: the comm stream waits on it
  std::unique_ptr<Event> reduced;                    // on the comm stream: the update waits on it
  std::vector<std::pair<size_t, size_t>> buckets;   // [begin, end) of the flat gradients, backward order
  bool overlap = true;
  int check_every = 100;
  TraceBook* traces = nullptr;                       // in-process ranks: rank 0 writes them all
  std::string graphs_off;                            // why this kind of group runs its steps eagerly ("": it need not)
};

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
  if (!trace) {
    dp.comm->all_reduce_sum(executor.gradients() + begin, end - begin, *dp.stream);
    return;
  }
  char label[96];
  double mb = (end - begin) * sizeof(float) / 1048576.0;
  if (bucket >= 0) std::snprintf(label, sizeof label, "allreduce bucket %d (%.1f MB)", bucket, mb);
  else std::snprintf(label, sizeof label, "allreduce all (%.1f MB)", mb);
  auto span = std::make_shared<TraceEvent>(TraceEvent{label, "comm", 0, 0});
  dp.stream->enqueue([&executor, span] { span->start_ms = executor.trace_now_ms(); });
  dp.comm->all_reduce_sum(executor.gradients() + begin, end - begin, *dp.stream);
  dp.stream->enqueue([&executor, span, trace] {
    span->end_ms = executor.trace_now_ms();
    std::lock_guard lock(trace->mutex);
    trace->events.push_back(*span);
  });
}

// The trace file of rank `rank` in a multi-process run: rank 0 the given name, the others
// "name.rankR.json" beside it.
std::string rank_trace_path(const std::string& path, int rank) {
  if (rank == 0) return path;
  std::filesystem::path p(path);
  std::string stem = p.extension() == ".json" ? p.stem().string() : p.filename().string();
  return (p.parent_path() / (stem + ".rank" + std::to_string(rank) + ".json")).string();
}

// Where training starts: step, images seen, the loader's position and (fp16) the loss scale.
struct Start {
  int64_t iteration = 0;
  uint64_t seen = 0;
  data::LoaderState loader;
  std::optional<LossScaler::State> loss_scale;  // from a checkpoint written with fp16
};

// The checkpoint tensor holding the loss scaler's state: scale, clean steps, overflows (exact as
// floats: the clean count stays below the growth interval, overflows below 2^24 in practice).
constexpr const char* kLossScaleTensor = "loss_scale";

TrainResult run_loop(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options, int batch,
                     int subdivisions, const Start& start, DataParallel* dp = nullptr) {
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
    write_checkpoint(result.checkpoint_path, ckpt);
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

  for (int64_t iteration = start_iteration; iteration < max_batches; ++iteration) {
    bool trace_this = !options.trace_file.empty() &&
                      iteration == start_iteration + std::min<int64_t>(1, max_batches - start_iteration - 1);
    const float loss_scale = scaler.scale();
    executor.set_loss_scale(loss_scale);
    const float lr = learning_rate_at(net, iteration);
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
      // A traced step runs eagerly: its per-layer events are timed where they are queued.
      const bool replay = graphs.on() && !trace_this;
      executor.set_tracing(trace_this && s == 0);  // the step's first micro-batch
      double t = Executor::clock_ms();
      MicroBatch mb = source.next();
      split.data_ms += Executor::clock_ms() - t;
      host_span("data wait", t);
      t = Executor::clock_ms();
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
    }
    const bool updated = executor.update_applied();
    scaler.update(!updated);
    if (dp) dp->stream->synchronize();  // done by now; rethrows an error of its host functions
    const PhaseTimes phases = executor.take_phase_times();
    split.forward_ms = phases.forward_ms;
    split.backward_ms = phases.backward_ms;
    split.comm_ms = phases.wait_ms;
    split.optimizer_ms = phases.update_ms;
    LossSums loss = executor.take_loss();
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
    if (!updated && leader && scaler.enabled())
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
                      loss.box / loss.images, loss.obj / loss.images, loss.noobj / loss.images,
                      loss.cls / loss.images, loss.assigned ? loss.iou_sum / loss.assigned : 0.0,
                      loss.assigned ? static_cast<double>(loss.recall50) / loss.assigned : 0.0, lr, rate,
                      duration_text(eta).c_str());
      } else {
        std::snprintf(line, sizeof line, "iter %lld/%lld  epoch %.2f  loss %.4f  accuracy %.3f  lr %.2e  %.4g img/s  ETA %s",
                      static_cast<long long>(iteration + 1), static_cast<long long>(max_batches), epoch, mean,
                      static_cast<double>(loss.correct) / std::max<int64_t>(loss.images, 1), lr, rate,
                      duration_text(eta).c_str());
      }
      std::printf(tty ? "\r%s\033[K" : "%s\n", line);
      std::fflush(stdout);
    }
    int64_t epoch_now = source.state().epoch;
    if (epoch_now != last_epoch_reported) {
      if (leader) {
        std::string summary = source.epoch_summary(last_epoch_reported);
        if (!summary.empty()) std::printf("%strain_yolo: %s\n", tty ? "\n" : "", summary.c_str());
        std::printf("%strain_yolo: epoch %lld: %s\n", summary.empty() && tty ? "\n" : "",
                    static_cast<long long>(last_epoch_reported), epoch_split.text().c_str());
      }
      epoch_split = StepSplit{};
      last_epoch_reported = epoch_now;
      // Every rank validates (on its own replica; rank 0 reports and keeps best.weights): the
      // others would otherwise wait for rank 0 in the next all-reduce, possibly past --comm-timeout.
      if (source.validate && options.valid_every > 0 && epoch_now % options.valid_every == 0) {
        double map50 = source.validate();
        bool best = map50 > result.best_map50;
        if (best) result.best_map50 = map50;
        if (leader)
          std::printf("train_yolo: epoch %lld: validation mAP@0.5 = %.4f%s\n", static_cast<long long>(epoch_now),
                      map50, best ? " (best so far: best.weights)" : "");
        if (best && leader) {
          WeightsHeader header;
          header.seen = seen;
          write_darknet_weights(options.out_dir + "/best.weights", executor.download_parameters(), header);
        }
      }
    }
    if (leader && options.checkpoint_every > 0 && (iteration + 1) % options.checkpoint_every == 0 && !last)
      save(iteration + 1);
  }
  if (tty && leader) std::printf("\n");
  if (leader && epoch_split.steps > 0)
    std::printf("train_yolo: the last %lld steps: %s\n", static_cast<long long>(epoch_split.steps),
                epoch_split.text().c_str());
  result.images_per_second = images_this_run / std::max(seconds_since(t_start), 1e-9);
  result.graphs_captured = graphs.captured();
  result.graphs_off = graphs.off_reason();
  if (leader) save(result.iterations);
  return result;
}

struct Setup {
  int batch = 0, subdivisions = 0, micro = 0;
};

// --precision auto over every device of this process: the choice of the least capable one, so
// that every replica runs the same precision. `why` gets the reason.
Precision automatic_precision_of(const std::vector<Device>& devices, std::string* why) {
  Precision chosen = Precision::Bf16;
  int lowest = INT32_MAX;
  for (Device d : devices) {
    int cc = 0;
    if (d.runs_kernels()) {
      set_current_device(d);
      cc = current_compute_capability();
    }
    if (!d.runs_kernels() || cc < lowest) {
      chosen = automatic_precision(d.runs_kernels(), cc, why);
      lowest = d.runs_kernels() ? cc : -1;
    }
  }
  return chosen;
}

}  // namespace

TrainOptions resolve_precision(const TrainOptions& options, const std::vector<Device>& devices) {
  TrainOptions resolved = options;
  if (!options.precision) resolved.precision = automatic_precision_of(devices, &resolved.precision_reason);
  return resolved;
}

namespace {

// The precision the step runs in: the one asked for (resolve_precision filled in auto's); the
// leader says which and why.
Precision chosen_precision(const TrainOptions& options, Device device, bool leader) {
  if (!options.precision) return chosen_precision(resolve_precision(options, {device}), device, leader);
  const Precision p = *options.precision;
  if (!leader) return p;
  const std::string how =
      options.precision_reason.empty() ? "" : " (auto: " + options.precision_reason + "; --precision to choose)";
  switch (p) {
    case Precision::Fp32:
      std::printf("train_yolo: precision fp32%s\n", how.c_str());
      break;
    case Precision::Tf32:
      std::printf(
          "train_yolo: precision tf32: convolutions and connected layers on tensor cores (FP32 tensors, "
          "inputs rounded to TF32)%s\n",
          how.c_str());
      break;
    default:
      std::printf(
          "train_yolo: precision %s: activations and their gradients in %s, convolutions on tensor cores; "
          "FP32 master weights, statistics and parameter gradients%s%s\n",
          precision_name(p), precision_name(p), p == Precision::Fp16 ? "; dynamic loss scaling from 2^16" : "",
          how.c_str());
  }
  return p;
}

// The global batch, split over `world` replicas and `subdivisions` micro-batches each.
Setup batch_setup(const ModelSpec& spec, const TrainOptions& options, int world = 1) {
  Setup s;
  s.batch = options.batch ? options.batch : spec.net.batch;
  s.subdivisions = options.subdivisions ? options.subdivisions : spec.net.subdivisions;
  if (s.batch % (s.subdivisions * world))
    throw Error("batch " + std::to_string(s.batch) + " is not a multiple of subdivisions x replicas = " +
                std::to_string(s.subdivisions) + " x " + std::to_string(world) + " (--batch, --subdivisions, or [net] in " +
                spec.path + ")");
  s.micro = s.batch / (s.subdivisions * world);
  return s;
}

Start prepare_start(const Graph& graph, Executor& executor, const TrainOptions& options) {
  Start start;
  if (options.resume) {
    std::string path = options.out_dir + "/last.ckpt";
    Checkpoint ckpt = read_checkpoint(path);
    if (ckpt.cfg_digest != cfg_digest(graph))
      throw Error(path + " was written for another architecture or input size than " + graph.path +
                  ": resume with the same --cfg and --size");
    if (ckpt.seed != options.seed)
      throw Error(path + " was written with --seed " + std::to_string(ckpt.seed) + ": resume with the same seed");
    for (const auto& [name, values] : ckpt.tensors) {
      if (name != kLossScaleTensor) {
        executor.upload(name, values);
        continue;
      }
      if (values.size() != 3)
        throw Error(path + ": the loss_scale entry holds " + std::to_string(values.size()) +
                    " values, not 3 (scale, clean steps, overflows)");
      start.loss_scale = LossScaler::State{values[0], static_cast<int64_t>(values[1]), static_cast<int64_t>(values[2])};
    }
    start.iteration = ckpt.iteration;
    start.seen = ckpt.seen;
    start.loader = ckpt.loader;
    std::printf("train_yolo: resuming %s at step %lld\n", path.c_str(), static_cast<long long>(start.iteration));
  } else if (!options.weights.empty()) {
    std::vector<LayerParams> layers = executor.download_parameters();
    WeightsHeader header = read_darknet_weights(options.weights, layers, options.load_layers);
    executor.upload_parameters();
    std::printf("train_yolo: loaded %s%s (trained on %llu images)\n", options.weights.c_str(),
                options.load_layers >= 0 ? (" (layers 0.." + std::to_string(options.load_layers - 1) + ")").c_str() : "",
                static_cast<unsigned long long>(header.seen));
  }
  return start;
}

}  // namespace

namespace {

// Buckets of the flat gradient buffer (backward order: layers reversed, each layer's weights,
// biases, scales; see executor.h) as [begin, end) float ranges: whole layers, grouped by the
// rule the scaling model uses (group_layers).
std::vector<std::pair<size_t, size_t>> bucket_plan(const Graph& graph, double bucket_mb) {
  std::vector<int64_t> bytes;
  for (int i = static_cast<int>(graph.nodes.size()) - 1; i >= 0; --i)
    if (int64_t n = graph.nodes[i].trainable(); n > 0) bytes.push_back(n * static_cast<int64_t>(sizeof(float)));
  std::vector<std::pair<size_t, size_t>> buckets;
  size_t offset = 0;
  std::vector<size_t> starts;  // each layer's first float
  for (int64_t b : bytes) {
    starts.push_back(offset);
    offset += static_cast<size_t>(b) / sizeof(float);
  }
  starts.push_back(offset);
  for (auto [first, end] : group_layers(bytes, bucket_mb)) buckets.emplace_back(starts[first], starts[end]);
  return buckets;
}

// Runs the loop on this replica; with a communicator, data parallel: identical starting
// parameters (rank 0's), then bucketed all-reduces.
TrainResult run_replica(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options,
                        const Setup& setup, const Start& start, Communicator* comm, ReplicaGroup* group) {
  if (!comm) return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start);
  Stream comm_stream(executor.device(), StreamPriority::High, "comm");
  DataParallel dp;
  dp.comm = comm;
  dp.stream = &comm_stream;
  dp.gradients_done = std::make_unique<Event>(executor.device());
  dp.reduced = std::make_unique<Event>(executor.device());
  // NCCL's documentation: several GPUs per process with graph-captured collectives may deadlock
  // (a cudaGraphLaunch can block until the other GPUs' kernels launch).
  if (executor.device().is_cuda() && group && comm->size() > 1)
    dp.graphs_off =
        "NCCL warns that graph-captured collectives of several GPUs in one process may deadlock in "
        "cudaGraphLaunch; one process per GPU (started by a launcher: torchrun, mpirun, srun) replays the step as "
        "graphs";
  // The parameters were initialised or loaded on the compute stream.
  executor.compute_stream().record(*dp.gradients_done);
  comm_stream.wait(*dp.gradients_done);
  comm->broadcast(executor.parameters(), executor.parameter_count(), 0, comm_stream);
  comm->wait(comm_stream);
  const double bucket_mb = options.bucket_mb >= 0 ? options.bucket_mb
                                                 : default_bucket_mb(static_cast<int64_t>(executor.parameter_count() * sizeof(float)));
  dp.buckets = bucket_plan(graph, bucket_mb);
  dp.overlap = options.overlap;
  dp.check_every = options.check_every;
  dp.traces = group ? &group->traces : nullptr;
  if (options.sync_bn) executor.set_batchnorm_sync(comm, &comm_stream);
  // The executor's hooks point into this frame: cleared however it is left.
  struct Unhook {
    Executor& executor;
    ~Unhook() {
      executor.set_gradients_ready({});
      executor.set_batchnorm_sync(nullptr, nullptr);
    }
  } unhook{executor};
  if (comm->rank() == 0)
    std::printf("train_yolo: data parallel over %d replicas: %zu gradient buckets (--bucket-mb %.3g), %s; BatchNorm "
                "statistics %s\n",
                comm->size(), dp.buckets.size(), bucket_mb,
                dp.overlap ? "all-reduce overlapped with backward" : "all-reduce after backward (--no-overlap)",
                options.sync_bn ? "over all replicas (--sync-bn)" : "per replica (rank 0's are saved)");
  try {
    return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start, &dp);
  } catch (const std::exception& e) {
    // Stop the other ranks now, before unwinding waits for this replica's streams.
    if (group) group->failed(comm->rank());
    comm->abort(e.what());
    throw;
  }
}

// One replica's training, on `device`, as rank comm->rank() (comm: null with one device).
using ReplicaFn = std::function<TrainResult(Device device, Communicator* comm, ReplicaGroup* group)>;

// This process is one rank of a job started by a launcher (mpirun, srun, torchrun): it meets
// the others at the rendezvous, then trains on its one device.
TrainResult run_as_process_rank(const std::vector<Device>& devices, const TrainOptions& options,
                                const ReplicaFn& replica) {
  const int rank = options.process_rank, world = options.process_world;
  if (devices.size() != 1)
    throw Error("--devices: this process is rank " + std::to_string(rank) + " of " + std::to_string(world) +
                " and trains on one device, not " + std::to_string(devices.size()) +
                " (one process per GPU; the default picks gpu:LOCAL_RANK)");
  const Device device = devices[0];
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<InProcessGroup> alone;
  if (world == 1) {
    // Nobody to meet: the communicator of a job of one (NCCL still runs its collectives).
    if (device.is_cuda()) {
      comm = nccl_communicator(device, 0, 1, nccl_unique_id(), options.comm_timeout);
    } else {
      alone = std::make_unique<InProcessGroup>(1, options.comm_timeout);
      comm = replica_communicator(*alone, 0, device);
    }
  } else {
    if (device.is_emu())
      throw Error("rank " + std::to_string(rank) + " of " + std::to_string(world) +
                  ": emulated GPUs train as threads of one process (--devices emu:0,1,...), not as launched ranks");
    if (options.rendezvous.empty())
      throw Error("rank " + std::to_string(rank) + " of " + std::to_string(world) +
                  ": the ranks need a meeting point: set MASTER_ADDR and MASTER_PORT, or pass "
                  "--rendezvous tcp://HOST:PORT or --rendezvous file:///shared/path");
    Rendezvous meeting = Rendezvous::join(options.rendezvous, rank, world, options.comm_timeout);
    if (device.is_cuda()) {
      std::vector<uint8_t> id = meeting.broadcast_bytes(rank == 0 ? nccl_unique_id() : std::vector<uint8_t>{});
      comm = nccl_communicator(device, rank, world, id, options.comm_timeout);
    } else {
      comm = socket_communicator(std::move(meeting), options.comm_timeout);
    }
  }
  try {
    return replica(device, comm.get(), nullptr);
  } catch (const std::exception& e) {
    comm->abort(e.what());
    throw Error("rank " + std::to_string(rank) + ": " + e.what());
  }
}

// Runs `replica` on every device: one device directly; several in this process as threads
// (CPU replicas over the in-process group, GPUs over NCCL); or as one rank of a launched job.
// A rank that fails aborts the others' communicators; the first failure is reported.
TrainResult run_replicas(const std::vector<Device>& devices, const TrainOptions& options, const ReplicaFn& replica) {
  if (devices.empty()) throw Error("no device to train on");
  if (options.launched) return run_as_process_rank(devices, options, replica);
  if (devices.size() == 1) return replica(devices[0], nullptr, nullptr);
  const DeviceKind kind = devices[0].kind;
  for (const Device& d : devices)
    if (d.kind != kind) throw Error("--devices: replicas must be all GPUs, all emulated GPUs or all CPU, not a mix");
  const bool cuda = kind == DeviceKind::Cuda;
  const int world = static_cast<int>(devices.size());
  std::unique_ptr<InProcessGroup> group;
  std::vector<uint8_t> nccl_id;
  auto nccl_local = std::make_shared<NcclLocalGroup>();
  if (cuda) nccl_id = nccl_unique_id();
  else group = std::make_unique<InProcessGroup>(world, options.comm_timeout);
  // GPUs: NCCL; emulated GPUs: their stream-ordered collectives; CPU replicas: the in-process group.
  auto communicator = [&](int r) {
    if (cuda) return nccl_communicator(devices[r], r, world, nccl_id, options.comm_timeout, nccl_local);
    return replica_communicator(*group, r, devices[r]);
  };
  ReplicaGroup shared;
  std::vector<TrainResult> results(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      try {
        comm = communicator(r);
        results[r] = replica(devices[r], comm.get(), &shared);
      } catch (const std::exception& e) {
        shared.failed(r);
        errors[r] = e.what();
        if (comm) comm->abort(e.what());
        else nccl_local->failed_rank = r;  // its communicator never formed: the others stop waiting
      }
    });
  for (std::thread& t : threads) t.join();
  if (int r = shared.first_failure.load(); r >= 0) throw Error("rank " + std::to_string(r) + ": " + errors[r]);
  std::vector<RankTrace>& traces = shared.traces.ranks;
  if (!traces.empty()) {
    std::sort(traces.begin(), traces.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
    write_trace(options.trace_file, traces);
  }
  return results[0];
}

TrainResult train_detector_replica(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                                   const TrainOptions& options, Communicator* comm, ReplicaGroup* group) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const bool leader = rank == 0;
  Graph graph = build_graph(spec);
  if (!graph.detection) throw Error(spec.path + ": this net has no [yolo] layers: it cannot train on a detection dataset");
  if (static_cast<int>(dataset.class_names.size()) != graph.classes)
    throw Error(spec.path + ": the [yolo] layers have classes=" + std::to_string(graph.classes) + " but the dataset " +
                dataset.source + " has " + std::to_string(dataset.class_names.size()) + " classes");
  Setup setup = batch_setup(spec, options, world);
  // [yolo] random=1: multi-scale training, every size planned for up front.
  bool multiscale = false;
  float jitter = 0;
  for (const Node& node : graph.nodes)
    if (node.spec.type == LayerType::Yolo) {
      multiscale |= node.spec.random;
      jitter = node.spec.jitter;
    }
  std::vector<std::pair<int, int>> sizes;
  if (multiscale) sizes = data::multiscale_sizes(graph.net.width, graph.net.height);
  const Precision precision = chosen_precision(options, device, leader);
  Executor executor(graph, device, setup.micro, options.seed, sizes, precision);
  if (leader) std::printf("train_yolo: %s\n", executor.memory().text().c_str());
  if (multiscale && leader)
    std::printf("train_yolo: multi-scale training (random=1): %dx%d .. %dx%d, a new size every 10 steps\n",
                sizes.front().first, sizes.front().second, sizes.back().first, sizes.back().second);
  Start start = prepare_start(graph, executor, options);

  data::LoaderOptions lo;
  lo.batch = setup.micro;
  lo.net_w = graph.net.width;
  lo.net_h = graph.net.height;
  lo.augment = true;
  lo.augment_params.hue = spec.net.hue;
  lo.augment_params.saturation = spec.net.saturation;
  lo.augment_params.exposure = spec.net.exposure;
  lo.augment_params.jitter = jitter;
  lo.multiscale = multiscale;
  lo.threads = options.threads;
  lo.strict = options.strict;
  lo.seed = options.seed;
  lo.batches_per_iteration = setup.subdivisions;
  lo.rank = rank;
  lo.world = world;
  data::Loader loader(dataset.train, lo, start.loader);
  data::DeviceFeeder feeder(loader, device);
  Source source;
  source.steps_per_epoch = loader.steps_per_epoch();
  source.next = [&]() {
    const data::DeviceBatch& db = feeder.next(executor.compute_stream());
    executor.set_input_size(db.host->net_w, db.host->net_h);
    return MicroBatch{db.images, db.truths, db.truth_counts, nullptr};
  };
  source.state = [&]() { return loader.state(); };
  // --trace: the copies' spans, timed on the copy stream by host functions (shared: the feeder's
  // queued host functions may outlive this frame's other locals).
  struct CopyTrace {
    std::mutex mutex;
    bool on = false;
    double start = 0;
    std::vector<TraceEvent> events;
  };
  auto copies = std::make_shared<CopyTrace>();
  feeder.set_copy_observer([copies](bool begin, size_t bytes) {
    std::lock_guard lock(copies->mutex);
    if (!copies->on) return;
    if (begin) {
      copies->start = Executor::clock_ms();
      return;
    }
    char name[64];
    std::snprintf(name, sizeof name, "copy batch (%.1f MB)", bytes / 1048576.0);
    copies->events.push_back(TraceEvent{name, "copy", copies->start, Executor::clock_ms()});
  });
  source.trace_copies = [copies](bool on) {
    std::lock_guard lock(copies->mutex);
    copies->on = on;
  };
  source.take_copy_events = [copies, &feeder]() {
    feeder.copy_stream().synchronize();
    std::lock_guard lock(copies->mutex);
    return std::exchange(copies->events, {});
  };
  source.epoch_summary = [&](int64_t epoch) { return loader.epoch_stats(epoch).summary(); };
  if (options.valid_every > 0 && !dataset.valid.samples.empty())
    source.validate = [&]() {
      executor.set_input_size(graph.net.width, graph.net.height);
      DetectOptions detect;
      detect.threads = options.threads;
      return evaluate_split(executor, dataset.valid, graph.classes, detect).map50;
    };
  if (leader)
    std::printf("train_yolo: training %s on %d x %s: batch %d (%d replicas x %d micro-batches x %d), %dx%d, %zu "
                "training images, %lld steps per epoch\n",
                spec.path.c_str(), world, device.name().c_str(), setup.batch, world, setup.subdivisions, setup.micro,
                graph.net.width, graph.net.height, dataset.train.samples.size(),
                static_cast<long long>(loader.steps_per_epoch() / setup.subdivisions));
  return run_replica(graph, executor, source, options, setup, start, comm, group);
}

}  // namespace

TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, const std::vector<Device>& devices,
                           const TrainOptions& options) {
  const TrainOptions resolved = resolve_precision(options, devices);
  return run_replicas(devices, resolved, [&](Device device, Communicator* comm, ReplicaGroup* group) {
    return train_detector_replica(spec, dataset, device, resolved, comm, group);
  });
}

TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                           const TrainOptions& options) {
  return train_detector(spec, dataset, std::vector<Device>{device}, options);
}

namespace {

// Rank `rank` of `world` trains on micro-batch k of each of its steps with images
// order[(k * world + rank) * n ...]: together the replicas see what one replica with the
// whole batch would (the same images, the same order within the step).
TrainResult train_classifier_replica(const ModelSpec& spec, const data::MnistSet& mnist, Device device,
                                     const TrainOptions& options, Communicator* comm, ReplicaGroup* group) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  Graph graph = build_graph(spec);
  if (graph.detection) throw Error(spec.path + ": a detector cannot train on MNIST");
  int pixels = mnist.rows * mnist.cols;
  if (graph.input.elements() != pixels)
    throw Error(spec.path + ": the net takes " + std::to_string(graph.input.elements()) + " inputs, MNIST images have " +
                std::to_string(pixels));
  int classes = graph.nodes.back().out.c;
  if (classes < 10) throw Error(spec.path + ": the last layer has " + std::to_string(classes) + " outputs; MNIST has 10 classes");
  Setup setup = batch_setup(spec, options, world);
  Executor executor(graph, device, setup.micro, options.seed, {}, chosen_precision(options, device, rank == 0));
  Start start = prepare_start(graph, executor, options);
  // MNIST batches are cheap: built on the host per micro-batch and copied synchronously.
  const int n = setup.micro;
  const int64_t steps = mnist.count / (static_cast<int64_t>(n) * world);  // micro-batches per epoch and rank
  if (steps == 0) throw Error("the MNIST set has fewer images than one micro-batch on every replica");
  DeviceMemory images(device, static_cast<size_t>(n) * pixels * sizeof(float));
  DeviceMemory labels(device, static_cast<size_t>(n) * sizeof(int));
  std::vector<float> host_images(static_cast<size_t>(n) * pixels);
  std::vector<int> host_labels(static_cast<size_t>(n));
  data::LoaderState position = start.loader;
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  Source source;
  source.steps_per_epoch = steps;
  source.next = [&]() {
    if (order_epoch != position.epoch) {
      order.resize(static_cast<size_t>(mnist.count));
      std::iota(order.begin(), order.end(), 0);
      data::KeyedRng rng(options.seed, 0x4D4E495354ull, static_cast<uint64_t>(position.epoch));
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
      order_epoch = position.epoch;
    }
    const int64_t first = (position.step * world + rank) * n;
    for (int b = 0; b < n; ++b) {
      int64_t index = order[static_cast<size_t>(first + b)];
      const uint8_t* src = mnist.pixels.data() + index * pixels;
      for (int k = 0; k < pixels; ++k) host_images[static_cast<size_t>(b) * pixels + k] = src[k] / 255.0f;
      host_labels[b] = mnist.labels[static_cast<size_t>(index)];
    }
    executor.compute_stream().synchronize();  // the previous micro-batch is done with the buffers
    // On the compute stream: a copy from pageable memory may still be landing when the call
    // returns, and the kernels that read it must come after it.
    copy_bytes(images.data(), host_images.data(), host_images.size() * sizeof(float), &executor.compute_stream());
    copy_bytes(labels.data(), host_labels.data(), host_labels.size() * sizeof(int), &executor.compute_stream());
    if (++position.step == steps) {
      position.step = 0;
      ++position.epoch;
    }
    return MicroBatch{static_cast<const float*>(images.data()), nullptr, nullptr, static_cast<const int*>(labels.data())};
  };
  source.state = [&]() {
    data::LoaderState s = position;
    s.seed = options.seed;
    return s;
  };
  source.epoch_summary = [](int64_t) { return std::string(); };
  if (rank == 0)
    std::printf("train_yolo: training %s on %d x %s: batch %d (%d replicas x %d micro-batches x %d), %d MNIST images "
                "(%s)\n",
                spec.path.c_str(), world, device.name().c_str(), setup.batch, world, setup.subdivisions, setup.micro,
                mnist.count, mnist.source.c_str());
  return run_replica(graph, executor, source, options, setup, start, comm, group);
}

}  // namespace

TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, const std::vector<Device>& devices,
                             const TrainOptions& options) {
  const TrainOptions resolved = resolve_precision(options, devices);
  return run_replicas(devices, resolved, [&](Device device, Communicator* comm, ReplicaGroup* group) {
    return train_classifier_replica(spec, mnist, device, resolved, comm, group);
  });
}

TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, Device device,
                             const TrainOptions& options) {
  return train_classifier(spec, mnist, std::vector<Device>{device}, options);
}

}  // namespace yolo::graph
