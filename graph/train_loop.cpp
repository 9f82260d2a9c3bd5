// The training loop (see train_loop.h): run_loop, and the phases of one step (micro-batches,
// CUDA Graphs, the all-reduces, the update's outcome, divergence). What the loop reports and
// keeps is in train_loop_report.cpp; the state both share in train_loop_phases.h.
#include "graph/train_loop.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <utility>

#include "graph/train_loop_phases.h"
#include "runtime/check.h"
#include "runtime/communicator.h"
#include "runtime/fault.h"
#include "runtime/memory.h"
#include "runtime/stop_signal.h"

namespace yolo::graph {

// The all-reduce spans of a traced step: appended by host functions on the comm stream (shared:
// a failing step may unwind while some are still queued).
struct CommTrace {
  std::mutex mutex;
  std::vector<TraceEvent> events;
};

namespace {

// A hash of the parameters' bytes (replicas must agree bit for bit).
uint64_t parameter_hash(Executor& executor) {
  std::vector<float> params = executor.download("params");
  return fnv1a64(params.data(), params.size() * sizeof(float));
}

// All-reduces [begin, end) of the gradients on the comm stream once the compute stream has
// produced them (an event recorded there). With `trace`, the span is timed by host functions on
// the comm stream, after the wait, around the collective (named by its bucket; -1: all
// gradients at once).
void all_reduce_gradients(Executor& executor, DataParallel& dp, size_t begin, size_t end,
                          const std::shared_ptr<CommTrace>& trace, int bucket, int slot) {
  executor.compute_stream().record(*dp.gradients_done);
  // A planted fault (emulated build only): the all-reduce does not wait for the gradients.
  if (!fault_injected(Fault::CommSkipsComputeWait)) dp.stream->wait(*dp.gradients_done);
  if (bucket <= 0) {  // the step's first collective: the stop requests ride ahead of it
    float* host = static_cast<float*>(dp.stop_host.data()) + 2 * slot;
    float* device = static_cast<float*>(dp.stop_device.data()) + slot;
    copy_bytes(device, host, sizeof(float), dp.stream);
    dp.comm->all_reduce_sum(device, 1, *dp.stream);
    copy_bytes(host + 1, device, sizeof(float), dp.stream);
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

// After the step's collectives, on the comm stream: the update runs only if they completed on
// this rank. A collective whose data did not all arrive ends only through the communicator's
// failure, which is set before it ends (Communicator::failed), so the host function, which runs
// after them, sees it; the copy then sets the update's skip flag (as a non-finite gradient does),
// and the step leaves the parameters and momentum as the last step every replica completed left
// them. A copy from pinned memory reads it when it runs, replayed graphs included.
void gate_update(Executor& executor, DataParallel& dp, int slot) {
  int* host = static_cast<int*>(dp.gate_host.data()) + slot;
  Communicator* comm = dp.comm;
  dp.stream->enqueue([host, comm] { *host = comm->failed() ? 1 : 0; });
  copy_bytes(executor.update_skip_flag(slot), host, sizeof(int), dp.stream);
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
  TrainLoop loop(graph, executor, source, options, batch, subdivisions, start, dp);
  return loop.run();
}

// A failure with a lost peer (the communicator failed): this rank saves what every replica
// completed before it goes (save_as_survivor). Any other failure is this rank's own: its state is
// not trusted.
TrainResult TrainLoop::run() {
  try {
    return run_steps();
  } catch (const std::exception& e) {
    if (!dp_ || !dp_->comm->failed()) throw;
    throw Error(e.what() + save_as_survivor());
  }
}

TrainResult TrainLoop::run_steps() {
  std::optional<Step> ahead;  // the next step, queued before this one's loss was read
  // A stop decided after a step while the next was queued ahead: it comes after that one.
  std::optional<TrainStop> pending;
  std::string pending_message;
  for (int64_t iteration = start_iteration_; iteration < max_batches_; ++iteration) {
    Step step = ahead ? std::move(*ahead) : begin_step(iteration);
    ahead.reset();
    if (step.queued) step.start_ms = Executor::clock_ms();  // steps' wall times tile the run
    for (int s = 0; s < subdivisions_; ++s) {
      if (step.queued <= s) queue_micro_batch_host(step, s);
      // Look-ahead: the next micro-batch is queued before this one is read.
      if (s + 1 < subdivisions_ && step.pipelined) {
        queue_micro_batch_host(step, s + 1);
      } else if (s + 1 == subdivisions_ && !pending && queue_ahead_ok(step)) {
        ahead = begin_step(iteration + 1);
        idle_->close_window(true);  // the windows tile: this one ends where the next step's begins
        step.window_closed = true;
        queue_micro_batch_host(*ahead, 0);
      }
      read_micro_batch(step, s);
    }
    end_step(step);
    watch_divergence(step);
    print_progress(step);
    end_epoch_if_due(step);
    if (pending) {  // the step queued ahead is done: now the stop decided before it
      if (*pending == TrainStop::Diverged) {
        result_.stop = TrainStop::Diverged;
        result_.stop_message = pending_message;
      } else if (iteration + 1 < max_batches_) {
        signal_stop(iteration + 1);
      }
      break;
    }
    if (divergence_.diverged()) {
      result_.stop = TrainStop::Diverged;
      result_.stop_message = divergence_.message(graph_, dp_ != nullptr);
      if (!ahead) break;
      pending = TrainStop::Diverged;
      pending_message = result_.stop_message;
      result_.stop = TrainStop::Finished;
      continue;
    }
    if (stop_after(step)) {
      if (!ahead) break;
      pending = TrainStop::Signal;
      result_.stop = TrainStop::Finished;
      continue;
    }
    if (step.save) keep_or_drop_copy(step);
    report_saver_failure();
  }
  return finish();
}

// The micro-batch to run: the one taken ahead, or the source's next (the wait is the step's data time).
MicroBatch TrainLoop::take_micro_batch(Step& step) {
  if (ahead_) return *std::exchange(ahead_, std::nullopt);
  const double t = Executor::clock_ms();
  MicroBatch mb = source_.next();
  step.split.data_ms += Executor::clock_ms() - t;
  host_span(step, "data wait", t);
  return mb;
}

// After micro-batch s is queued and before its loss is read: the next micro-batch's copy starts
// now, under the device's work, where the source allows it and a next one will run (a traced
// step's trace shows that copy).
void TrainLoop::fetch_ahead(Step& step, int s) {
  if (!source_.fetch_ahead) return;
  if (s == subdivisions_ - 1 && step.iteration + 1 >= max_batches_) return;
  // The wait counts as the step's data wait only from when the device ran out of work (stamped
  // on the host clock as the compute stream reaches this point): before, it was hidden.
  auto device_done = std::make_shared<std::atomic<double>>(0.0);
  executor_.compute_stream().enqueue([device_done] { device_done->store(Executor::clock_ms()); });
  if (s == subdivisions_ - 1) step.loader_after = source_.state();
  const double t = Executor::clock_ms();
  ahead_ = source_.next();
  const double end = Executor::clock_ms(), done = device_done->load();
  if (done > 0) step.split.data_ms += end - std::max(t, done);
  host_span(step, "take the next micro-batch (under the device's work)", t);
}

data::LoaderState TrainLoop::loader_state() const { return consumed_ ? *consumed_ : source_.state(); }

bool TrainLoop::stop_requested(int64_t iteration) const {
  return options_.stop_requested ? options_.stop_requested(rank_, iteration) : stop_signal() != 0;
}

void TrainLoop::host_span(Step& step, const char* name, double start_ms) const {
  if (step.trace) step.host_events.push_back(TraceEvent{name, "host", start_ms, Executor::clock_ms()});
}

TrainLoop::Step TrainLoop::begin_step(int64_t iteration) {
  if (options_.before_step) options_.before_step(executor_, rank_, iteration);
  Step step;
  step.iteration = iteration;
  step.micro_batches = subdivisions_;
  step.look_ahead = look_ahead_;
  step.check = divergence_.check_due();
  step.trace = trace_due(iteration);
  step.pipelined = subdivisions_ > 1 && pipeline_ok(step);
  step.lr = learning_rate_at(schedule_, iteration, options_.seed);
  step.save = leader_ && save_due(iteration);
  if (step.trace && dp_) step.comm_trace = std::make_shared<CommTrace>();
  step.start_ms = Executor::clock_ms();
  if (step.trace && source_.trace_copies) source_.trace_copies(true);
  return step;
}

// Micro-batch s of the step: its data, then everything of it that runs on the device, as a graph
// replay or eagerly, and the next micro-batch taken (read_micro_batch waits for its loss).
void TrainLoop::queue_micro_batch_host(Step& step, int s) {
  const bool last = s == subdivisions_ - 1;
  // With look-ahead, steps alternate between the executor's two result slots (a graph keeps its
  // own): before anything of this step is queued (its step values go to its slot too).
  if (look_ahead_) executor_.set_result_slot(step.slot(s));
  // Data parallel: this rank's stop request rides with the step's collectives (in its last
  // micro-batch). Its slot's previous step has been read by now: its copy of the flag is done.
  if (dp_ && last) {
    static_cast<float*>(dp_->stop_host.data())[2 * step.last_slot()] = stop_requested(step.iteration) ? 1.0f : 0.0f;
    static_cast<int*>(dp_->gate_host.data())[step.last_slot()] = -1;  // written by the step's gate (not yet run)
  }
  // A traced step runs eagerly: its per-layer events are timed where they are queued. So does
  // the checked one: its outputs are read back from the host during backward.
  const bool replay = graphs_->on() && !step.trace && !step.check;
  if (step.check && last)  // before the first backward, every forward output is still held
    executor_.set_before_backward([this, &step](int) {
      if (!step.forward_checked) step.found = find_non_finite_forward(graph_, executor_), step.forward_checked = true;
    });
  executor_.set_tracing(step.trace && s == 0);  // the step's first micro-batch
  const MicroBatch mb = take_micro_batch(step);
  if (mb.width) executor_.set_input_size(mb.width, mb.height);
  double t = Executor::clock_ms();
  if (s == 0 || !step.pipelined) idle_->open_window();
  if (replay)
    executor_.stage_inputs(mb.images, mb.truths, mb.truth_counts, mb.labels);
  else
    executor_.use_inputs(mb.images, mb.truths, mb.truth_counts, mb.labels);
  // The loss scale is divided back out with the batch (by the update on the device, which keeps it).
  if (last) executor_.set_step_values(step.lr, 1.0f / static_cast<float>(batch_));
  auto queue = [&] { queue_micro_batch(step, s, last); };
  const std::string key = std::to_string(executor_.graph().input.w) + "x" + std::to_string(executor_.graph().input.h) +
                          (s > 0 ? " accumulating" : " first") + (last ? " last" : "") +
                          (look_ahead_ ? " slot " + std::to_string(step.slot(s)) : "");
  if (replay) {
    if (graphs_->run(key, queue)) ++result_.graph_launches;
    if (std::string why = graphs_->take_notice(); !why.empty() && leader_)
      std::printf("%strain_yolo: CUDA Graphs off, the steps run eagerly from now on: %s\n", tty_ ? "\n" : "",
                  why.c_str());
  } else {
    queue();
  }
  if (last) queued_through_ = step.iteration;
  // After the step's update, before anything of the next step: the state a checkpoint keeps.
  if (last && step.save) saver_->queue_copy();
  host_span(step, "queue micro-batch (host)", t);
  step.queued = s + 1;
  fetch_ahead(step, s);
}

// The wait for micro-batch s's loss.
void TrainLoop::read_micro_batch(Step& step, int s) {
  const bool last = s == subdivisions_ - 1;
  const double t = Executor::clock_ms();
  // The step's collectives, with the deadline (look-ahead: not those of the step queued after it).
  if (last && dp_ && look_ahead_) dp_->comm->wait_until(executor_.update_done(step.last_slot()));
  else if (last && dp_) dp_->comm->wait(executor_.compute_stream());
  if (look_ahead_)
    executor_.read_micro_batch_loss(step.slot(s));  // not waiting for a micro-batch queued after it
  else
    executor_.read_micro_batch_loss();
  host_span(step, "wait for the micro-batch (host)", t);
  if (!step.window_closed && (last || !step.pipelined)) idle_->close_window(last);
  if (step.check && last) executor_.set_before_backward({});
}

// Whether the step after `step` (just queued) may be queued before `step`'s loss is read: what the
// host decides after `step` must not depend on its results or be read from the device then.
bool TrainLoop::queue_ahead_ok(const Step& step) const {
  if (!look_ahead_ || !graphs_->on()) return false;
  const int64_t next = step.iteration + 1;
  if (next >= max_batches_ || step.trace || step.check || divergence_.skipping()) return false;
  if (trace_due(next)) return false;                 // a traced step runs eagerly, alone
  // One device: a stop after this step, nothing past it. Data parallel: every rank queues alike
  // (a stop asked of one rank is all-reduced with a step and comes after the step queued ahead).
  if (!dp_ && stop_requested(step.iteration)) return false;
  if (dp_ && dp_->check_every > 0 && (step.iteration + 1) % dp_->check_every == 0) return false;  // the hash check
  // A checkpoint's copy after it: the next step waits for its decision (its copy may be due too).
  if (step.save) return false;
  // An epoch ends after it: the summary, validation and best.weights read the state after it.
  return step.loader_after && step.loader_after->epoch == last_epoch_reported_;
}

// Whether micro-batch s + 1 of `step` may be queued before micro-batch s is read: nothing the
// host does between a step's micro-batches depends on their results, except in a traced step (its
// per-layer events) and a checked one (it reads outputs during backward).
bool TrainLoop::pipeline_ok(const Step& step) const {
  return look_ahead_ && graphs_->on() && !step.trace && !step.check;
}

bool TrainLoop::trace_due(int64_t iteration) const {
  return !options_.trace_file.empty() &&
         iteration == start_iteration_ + std::min<int64_t>(1, max_batches_ - start_iteration_ - 1);
}

// Everything of micro-batch s that runs on the device, queued without waiting for the host:
// forward, backward and, in the last, the all-reduces and the update.
void TrainLoop::queue_micro_batch(Step& step, int s, bool last) {
  DataParallel* dp = dp_;
  size_t next_bucket = 0;
  // Overlap: in the step's last micro-batch, each bucket's all-reduce starts on the
  // communication stream as soon as backward has produced its last gradient.
  if (dp && dp->overlap && last)
    executor_.set_gradients_ready([&](size_t ready) {
      while (next_bucket < dp->buckets.size() && dp->buckets[next_bucket].second <= ready) {
        auto [begin, end] = dp->buckets[next_bucket];
        all_reduce_gradients(executor_, *dp, begin, end, step.comm_trace, static_cast<int>(next_bucket), step.last_slot());
        ++next_bucket;
      }
    });
  else
    executor_.set_gradients_ready({});
  executor_.queue_micro_batch(s > 0);
  executor_.set_gradients_ready({});  // the callback refers to this frame's next_bucket
  if (!last) return;
  if (dp) {
    if (!dp->overlap)
      all_reduce_gradients(executor_, *dp, 0, executor_.parameter_count(), step.comm_trace, -1, step.last_slot());
    else if (next_bucket != dp->buckets.size())
      throw Error("internal error: " + std::to_string(next_bucket) + " of " + std::to_string(dp->buckets.size()) +
                  " gradient buckets were all-reduced in backward");
    gate_update(executor_, *dp, step.last_slot());
    dp->stream->record(*dp->reduced);  // the update waits for the reduced gradients on the device
    executor_.compute_stream().wait(*dp->reduced);
  }
  executor_.queue_update(net_.momentum, net_.decay);
}

// After the step's micro-batches: whether the update applied, the phase times, the loss, the
// replicas' agreement, the trace, the counters.
void TrainLoop::end_step(Step& step) {
  // Done by now; rethrows an error of its host functions (a failed collective) before anything of
  // the step is counted (a survivor saves the steps counted). With look-ahead it may hold the next
  // step's collectives: its errors come with that step's wait (or at the end, finish()).
  if (dp_ && !look_ahead_) dp_->stream->synchronize();
  // The communicator failed after the collectives but before the gate: the update was skipped
  // on this rank alone, so the step must not count (as a skipped one would).
  if (dp_ && static_cast<const int*>(dp_->gate_host.data())[step.last_slot()] == 1)
    throw Error("rank " + std::to_string(rank_) + ": step " + std::to_string(step.iteration + 1) +
                "'s update was skipped: the communicator failed as its all-reduces ended");
  step.updated = look_ahead_ ? executor_.update_applied(step.last_slot()) : executor_.update_applied();
  consumed_ = step.loader_after ? *step.loader_after : source_.state();
  if (options_.step_read) options_.step_read(rank_, step.iteration);
  step.loss_scale = scaler_.scale();  // the steps before it are read: the scale it ran at
  scaler_.update(!step.updated);
  const PhaseTimes phases = executor_.take_phase_times();
  step.split.forward_ms = phases.forward_ms;
  step.split.backward_ms = phases.backward_ms;
  step.split.comm_ms = phases.wait_ms;
  step.split.optimizer_ms = phases.update_ms;
  step.loss = executor_.take_loss();
  epoch_loss_ += step.loss;
  seen_ += static_cast<uint64_t>(batch_);
  images_this_run_ += batch_;
  read_through_ = step.iteration + 1;  // counted: a survivor's save from here includes it
  check_replicas(step);
  step.split.steps = 1;
  step.split.images = batch_;
  step.split.wall_ms = Executor::clock_ms() - step.start_ms;
  epoch_split_ += step.split;
  result_.split += step.split;
  if (step.trace) write_step_trace(step);
  const double mean = step.loss.images ? step.loss.total / static_cast<double>(step.loss.images) : 0;
  if (step.iteration == start_iteration_) result_.first_loss = mean;
  result_.last_loss = mean;
  result_.losses.push_back(mean);
  result_.loss_scale = scaler_.scale();
  result_.overflow_skips = scaler_.overflows();
  result_.iterations = step.iteration + 1;
}

// Data parallel, every check_every steps: the replicas' parameters agree bit for bit.
void TrainLoop::check_replicas(Step& step) {
  if (!dp_ || dp_->check_every <= 0 || (step.iteration + 1) % dp_->check_every != 0) return;
  double t = Executor::clock_ms();
  std::vector<uint64_t> hashes = dp_->comm->all_gather(parameter_hash(executor_));
  for (size_t r = 1; r < hashes.size(); ++r)
    if (hashes[r] != hashes[0])
      throw Error("replicas diverged at step " + std::to_string(step.iteration + 1) + ": rank " + std::to_string(r) +
                  "'s parameters differ from rank 0's");
  step.split.comm_ms += Executor::clock_ms() - t;
  host_span(step, "parameter hash check", t);
}

void TrainLoop::write_step_trace(Step& step) {
  RankTrace trace{rank_, executor_.device().name(), executor_.take_trace()};
  if (step.comm_trace)
    trace.events.insert(trace.events.end(), step.comm_trace->events.begin(), step.comm_trace->events.end());
  // Host times onto the executor's trace clock.
  double origin = Executor::clock_ms() - executor_.trace_now_ms();
  if (source_.take_copy_events) {
    std::vector<TraceEvent> copies = source_.take_copy_events();
    step.host_events.insert(step.host_events.end(), copies.begin(), copies.end());
    source_.trace_copies(false);
  }
  for (TraceEvent e : step.host_events) {
    e.start_ms -= origin;
    e.end_ms -= origin;
    trace.events.push_back(e);
  }
  if (dp_ && dp_->traces) {
    std::lock_guard lock(dp_->traces->mutex);
    dp_->traces->ranks.push_back(std::move(trace));
  } else {
    write_trace(rank_trace_path(options_.trace_file, rank_), {trace});
  }
}

// Divergence: non-finite gradients in max_skipped_steps steps in a row. fp16's overflows are
// loss-scale adjustments, not divergence, while the scale can still go down; at its floor
// (2^-24) a skipped step is divergence again, or such a run would skip forever.
void TrainLoop::watch_divergence(Step& step) {
  const bool scale_adjusted = scaler_.enabled() && step.loss_scale > LossScaler::kMin;
  const bool skipped = !step.updated && !scale_adjusted;
  std::vector<uint64_t> findings;
  if (skipped && step.check) {
    if (step.found.layer < 0) step.found = find_non_finite_gradients(graph_, executor_);
    // Every rank skipped this step (the gradients were reduced) and checked it.
    findings = dp_ ? dp_->comm->all_gather(step.found.code()) : std::vector<uint64_t>{step.found.code()};
  }
  divergence_.step_done(step.iteration + 1, skipped, findings);
  if (!step.updated && leader_ && scale_adjusted)
    std::printf(
        "%strain_yolo: step %lld skipped: fp16 gradients overflowed at loss scale %g; the scale is now %g "
        "(a loss-scale adjustment, not divergence)\n",
        tty_ ? "\n" : "", static_cast<long long>(step.iteration + 1), static_cast<double>(step.loss_scale),
        static_cast<double>(scaler_.scale()));
  else if (!step.updated && leader_)
    std::printf("%strain_yolo: step %lld skipped: a gradient was NaN or infinite (the parameters are unchanged)\n",
                tty_ ? "\n" : "", static_cast<long long>(step.iteration + 1));
}

}  // namespace yolo::graph
