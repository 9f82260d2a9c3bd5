// The executor's steps (see executor.h): micro-batches and their inputs, the update, the loss,
// the parameters' transfers, tracing and timing, synchronised BatchNorm.
#include <algorithm>
#include <cmath>

#include "data/dataset.h"
#include "graph/executor_impl.h"
#include "runtime/check.h"
#include "runtime/fault.h"
#include "runtime/nvtx.h"

namespace yolo::graph {

using namespace detail;

float* Executor::gradients() { return impl_->grads; }

void Executor::set_loss_scale(float scale) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    throw Error("set_loss_scale: " + std::to_string(scale) + " is not a positive finite scale");
  if (scale != 1.0f && !impl_->kernels) throw Error("set_loss_scale: loss scaling (fp16) runs on GPUs only");
  Impl& m = *impl_;
  if (m.loss_scale_growth > 0) throw Error("set_loss_scale: the loss scale is kept on the device (keep_loss_scale_on_device)");
  if (scale == m.loss_scale) return;
  m.loss_scale = scale;
  // In the compute stream's order: the micro-batches queued after this call read it (a pageable
  // source is staged before copy_bytes returns).
  if (m.loss_scale_at) copy_bytes(m.loss_scale_at, &m.loss_scale, sizeof(float), stream_.get());
}
void Executor::keep_loss_scale_on_device(float scale, int clean, int growth_interval) {
  Impl& m = *impl_;
  if (!m.kernels) throw Error("keep_loss_scale_on_device: loss scaling (fp16) runs on GPUs only");
  if (!(scale >= kLossScaleMin && scale <= kLossScaleMax) || clean < 0 || growth_interval < 1 || clean >= growth_interval)
    throw Error("keep_loss_scale_on_device: scale " + std::to_string(scale) + ", " + std::to_string(clean) +
                " clean steps of " + std::to_string(growth_interval) + " is not a state of the scaler");
  set_current_device(device_);
  m.loss_scale = scale;
  m.loss_scale_growth = growth_interval;
  m.loss_scale_host = LossScaleLive{scale, clean};
  copy_bytes(m.loss_scale_live, &m.loss_scale_host, sizeof(LossScaleLive), stream_.get());
}

LossScaleLive Executor::device_loss_scale() {
  Impl& m = *impl_;
  LossScaleLive out;
  if (!m.loss_scale_live) throw Error("device_loss_scale: the CPU backend keeps no loss scale on a device");
  set_current_device(device_);
  m.copy(&out, m.loss_scale_live, sizeof out);
  return out;
}

float* Executor::parameters() { return impl_->params; }

// ---- steps, loss, parameters ----------------------------------------------------------------

void Executor::use_inputs(const float* images, const YoloTruth* truths, const int* truth_counts, const int* labels) {
  Impl& m = *impl_;
  if (graph_.detection && (!truths || !truth_counts)) throw Error("train_micro_batch: a detector needs truths");
  if (!graph_.detection && !labels) throw Error("train_micro_batch: a classifier needs labels");
  m.in_images = images;
  m.in_truths = truths;
  m.in_counts = truth_counts;
  m.in_labels = labels;
}

void Executor::stage_inputs(const float* images, const YoloTruth* truths, const int* truth_counts, const int* labels) {
  Impl& m = *impl_;
  if (!m.staged_images) throw Error("stage_inputs: the CPU backend reads the inputs where they are (no graphs)");
  use_inputs(images, truths, truth_counts, labels);
  set_current_device(device_);
  const size_t n = static_cast<size_t>(micro_batch_);
  copy_bytes(m.staged_images, images, n * graph_.input.elements() * sizeof(float), stream_.get());
  m.in_images = m.staged_images;
  if (truths) {
    copy_bytes(m.staged_truths, truths, n * data::kMaxBoxes * sizeof(YoloTruth), stream_.get());
    copy_bytes(m.staged_counts, truth_counts, n * sizeof(int), stream_.get());
    m.in_truths = m.staged_truths;
    m.in_counts = m.staged_counts;
  }
  if (labels) {
    copy_bytes(m.staged_labels, labels, n * sizeof(int), stream_.get());
    m.in_labels = m.staged_labels;
  }
}

void Executor::queue_micro_batch(bool accumulate) {
  Impl& m = *impl_;
  if (!m.in_images) throw Error("queue_micro_batch: no inputs (use_inputs or stage_inputs first)");
  set_current_device(device_);
  if (tracing_) stream_->enqueue([&m] { m.trace_origin = now_ms(); });
  Impl::ResultSlot& r = m.queued();
  m.zero(r.bad_label, sizeof(int));
  stream_->record_timing(r.marks[0]);
  forward(true);
  stream_->record_timing(r.marks[1]);
  backward(accumulate);
  stream_->record_timing(r.marks[2]);
}

void Executor::set_result_slot(int slot) {
  if (slot != 0 && slot != 1) throw Error("set_result_slot: slot " + std::to_string(slot) + " is not 0 or 1");
  impl_->slot = slot;
}

void Executor::read_micro_batch_loss() { read_loss(impl_->slot, true); }

void Executor::read_micro_batch_loss(int slot) {
  if (slot != 0 && slot != 1) throw Error("read_micro_batch_loss: slot " + std::to_string(slot) + " is not 0 or 1");
  if (!graph_.detection) throw Error("read_micro_batch_loss(slot): the look-ahead reads detectors only");
  read_loss(slot, false);
}

// stream_order: the copies wait for everything queued on the compute stream; else only for the
// slot's backward-end mark (work queued after it goes on).
void Executor::read_loss(int slot, bool stream_order) {
  Impl& m = *impl_;
  Impl::ResultSlot& r = m.slots[slot];
  set_current_device(device_);
  // The read-back below waits for the compute stream (or the slot's mark), which (--sync-bn)
  // waits for other ranks: wait for it first with the communicator's deadline.
  if (m.bn_comm && stream_order) m.bn_comm->wait(*stream_);
  if (m.bn_comm && !stream_order) m.bn_comm->wait_until(r.marks[2]);
  // A planted fault (emulated build only): the loss read waits for nothing (nor the slot's mark).
  const bool no_wait = fault_injected(Fault::LossReadWithoutSync);
  if (!stream_order && !no_wait) r.marks[2].synchronize();
  auto read = [&](void* dst, const void* src, size_t bytes) {
    if (stream_order) m.copy(dst, src, bytes);
    else copy_bytes(dst, src, bytes);
  };
  LossSums sums;
  sums.images = micro_batch_;
  // Every head's statistics in one copy, from the first head's entry to the last's (one wait for
  // the stream, not one a head; the entries between are zeroed at construction).
  int first_head = -1, last_head = -1;
  for (const Node& node : graph_.nodes)
    if (node.spec.type == LayerType::Yolo) {
      if (first_head < 0) first_head = node.index;
      last_head = node.index;
    }
  std::vector<YoloLossStats> stats(first_head < 0 ? 0 : static_cast<size_t>(last_head - first_head + 1));
  if (!stats.empty()) {
    const size_t bytes = stats.size() * sizeof(YoloLossStats);
    if (no_wait) copy_bytes(stats.data(), r.yolo_stats + first_head, bytes);
    else read(stats.data(), r.yolo_stats + first_head, bytes);
  }
  for (const Node& node : graph_.nodes) {
    if (node.spec.type == LayerType::Yolo) {
      const YoloLossStats& s = stats[static_cast<size_t>(node.index - first_head)];
      sums.box += s.box_loss;
      sums.obj += s.obj_loss;
      sums.noobj += s.noobj_loss;
      sums.cls += s.class_loss;
      sums.total += s.total();
      sums.iou_sum += s.iou_sum;
      sums.assigned += s.assigned;
      sums.recall50 += s.recall50;
      sums.truths_invalid += s.truths_invalid;
    } else if (node.spec.type == LayerType::Softmax) {
      float loss = 0;
      int bad = 0;
      read(&loss, r.softmax_loss, sizeof loss);
      read(&bad, r.bad_label, sizeof bad);  // CUDA kernels report a bad label here; the CPU op throws
      if (bad) throw Error("label of sample " + std::to_string(bad - 1) + " is outside [0, " +
                           std::to_string(node.out.c) + ")");
      sums.total += loss;
      sums.cls += loss;
      // Accuracy: argmax of the probabilities against the labels.
      std::vector<float> probs(static_cast<size_t>(micro_batch_) * node.out.c);
      std::vector<int> host_labels(static_cast<size_t>(micro_batch_));
      read(probs.data(), m.nodes[node.index].out.data, probs.size() * sizeof(float));
      read(host_labels.data(), m.in_labels, host_labels.size() * sizeof(int));
      for (int b = 0; b < micro_batch_; ++b) {
        const float* row = probs.data() + static_cast<size_t>(b) * node.out.c;
        sums.correct += (std::max_element(row, row + node.out.c) - row) == host_labels[b];
      }
    }
  }
  m.loss += sums;
  // The stream has passed the micro-batch's timing events: its forward and backward time.
  m.phases.forward_ms += r.marks[1].elapsed_ms_since(r.marks[0]);
  m.phases.backward_ms += r.marks[2].elapsed_ms_since(r.marks[1]);
}

void Executor::train_micro_batch(const float* images, const YoloTruth* truths, const int* truth_counts,
                                 const int* labels, bool accumulate) {
  use_inputs(images, truths, truth_counts, labels);
  queue_micro_batch(accumulate);
  read_micro_batch_loss();
}

void Executor::infer(const float* images) {
  Impl& m = *impl_;
  set_current_device(device_);
  m.in_images = images;
  m.in_truths = nullptr;
  m.in_counts = nullptr;
  m.in_labels = nullptr;
  forward(false);
  m.synchronize();
}

void Executor::set_step_values(float learning_rate, float grad_scale) {
  Impl& m = *impl_;
  set_current_device(device_);
  Impl::ResultSlot& r = m.queued();
  m.live_host = SgdLive{learning_rate, grad_scale, 0};
  copy_bytes(r.live, &m.live_host, sizeof(SgdLive), stream_.get());
  // The update that follows, queued or replayed, is timed (its phase times were 0 under replay).
  if (r.update_queued) r.update_marked = true;
}

void Executor::queue_update(float momentum, float decay) {
  Impl& m = *impl_;
  set_current_device(device_);
  const OpContext c = m.context(*stream_);
  // The step's values come from device memory (set_step_values) and the skip is decided there
  // (the update reads the flag), so nothing between the check and the update waits for the host.
  Impl::ResultSlot& r = m.queued();
  stream_->record_timing(r.marks[3]);
  grad_nonfinite_check(c, m.grads, param_count_, &r.live->nonfinite);
  SgdHyper hyper{0.0f, momentum, decay, 0.0f, r.live};
  if (m.loss_scale_growth > 0) hyper.loss_scale = m.loss_scale_at;
  sgd_update(c, m.params, m.grads, m.momentum, m.device_segments, static_cast<int>(m.segments.size()), 0, param_count_,
             hyper, m.half ? m.weights16 : nullptr);
  // After the update read it: the scale the next step runs at.
  if (m.loss_scale_growth > 0) loss_scale_update(c, &r.live->nonfinite, m.loss_scale_live, m.loss_scale_growth);
  stream_->record_timing(r.marks[4]);
  r.update_marked = r.update_queued = true;
}

bool Executor::update_applied() { return read_update(impl_->slot, true); }

bool Executor::update_applied(int slot) {
  if (slot != 0 && slot != 1) throw Error("update_applied: slot " + std::to_string(slot) + " is not 0 or 1");
  return read_update(slot, false);
}

const Event& Executor::update_done(int slot) const {
  if (slot != 0 && slot != 1) throw Error("update_done: slot " + std::to_string(slot) + " is not 0 or 1");
  return impl_->slots[slot].marks[4];
}

// stream_order: as read_loss.
bool Executor::read_update(int slot, bool stream_order) {
  Impl& m = *impl_;
  Impl::ResultSlot& r = m.slots[slot];
  set_current_device(device_);
  int flag = 0;
  if (stream_order) {
    m.copy(&flag, &r.live->nonfinite, sizeof flag);
  } else {
    r.marks[4].synchronize();
    copy_bytes(&flag, &r.live->nonfinite, sizeof flag);
  }
  if (r.update_marked) {
    // From the last backward's end: what the compute stream waited for (the all-reduces), then the update.
    m.phases.wait_ms += r.marks[3].elapsed_ms_since(r.marks[2]);
    m.phases.update_ms += r.marks[4].elapsed_ms_since(r.marks[3]);
    r.update_marked = false;
  }
  return flag == 0;
}

bool Executor::apply_update(float learning_rate, float momentum, float decay, float grad_scale) {
  set_step_values(learning_rate, grad_scale);
  queue_update(momentum, decay);
  return update_applied();
}

// No wait: read_micro_batch_loss waited for what it added. (A wait here for the whole stream
// would, with look-ahead, wait for the step queued after the one being read.)
LossSums Executor::take_loss() {
  LossSums out = impl_->loss;
  impl_->loss = LossSums{};
  return out;
}

std::vector<LayerParams> Executor::download_parameters() {
  Impl& m = *impl_;
  set_current_device(device_);
  m.copy(m.host_params.data(), m.params, param_count_ * sizeof(float));
  m.copy(m.host_stats.data(), m.stats, m.stat_count * sizeof(float));
  return parameter_views(m.host_params.data(), m.host_stats.data());
}

std::vector<LayerParams> Executor::parameter_views(float* flat_params, float* stats) const {
  const Impl& m = *impl_;
  std::vector<LayerParams> layers;
  for (const Node& node : graph_.nodes) {
    if (node.spec.type != LayerType::Convolutional && node.spec.type != LayerType::Connected) continue;
    const NodeBuffers& nb = m.nodes[node.index];
    LayerParams lp;
    lp.layer = node.index;
    lp.type = node.spec.type;
    lp.c_out = node.out.c;
    lp.batch_normalize = node.spec.batch_normalize;
    if (node.spec.type == LayerType::Convolutional) {
      lp.c_in = node.in.c;
      lp.k = node.spec.size;
    } else {
      lp.c_in = node.in.c;
      lp.in_h = node.in.h;
      lp.in_w = node.in.w;
    }
    lp.weights = flat_params + nb.w;
    lp.biases = flat_params + nb.b;
    if (nb.s >= 0) lp.scales = flat_params + nb.s;
    if (nb.mean >= 0) {
      lp.rolling_mean = stats + nb.mean;
      lp.rolling_variance = stats + nb.var;
    }
    layers.push_back(lp);
  }
  return layers;
}

void Executor::queue_state_copy(StateCopy& into) {
  Impl& m = *impl_;
  set_current_device(device_);
  const size_t flat = param_count_ * sizeof(float), stats = std::max<size_t>(m.stat_count, 1) * sizeof(float);
  if (into.params.size() != flat) {
    into.params = PinnedHostBuffer(flat);
    into.momentum = PinnedHostBuffer(flat);
    into.stats = PinnedHostBuffer(stats);
    into.done = std::make_unique<Event>(device_);
  }
  copy_bytes(into.params.data(), m.params, flat, stream_.get());
  copy_bytes(into.momentum.data(), m.momentum, flat, stream_.get());
  if (m.stat_count > 0) copy_bytes(into.stats.data(), m.stats, m.stat_count * sizeof(float), stream_.get());
  stream_->record(*into.done);
}

std::vector<float> Executor::pack(const float* flat) const {
  std::vector<float> out;
  out.reserve(packed_count_);
  for (const auto& [offset, count] : impl_->packed) out.insert(out.end(), flat + offset, flat + offset + count);
  return out;
}

size_t Executor::stat_count() const { return impl_->stat_count; }

int* Executor::update_skip_flag(int slot) {
  if (slot != 0 && slot != 1) throw Error("update_skip_flag: slot " + std::to_string(slot) + " is not 0 or 1");
  return &impl_->slots[slot].live->nonfinite;
}

void Executor::upload_parameters() {
  Impl& m = *impl_;
  set_current_device(device_);
  m.copy(m.params, m.host_params.data(), param_count_ * sizeof(float));
  m.copy(m.stats, m.host_stats.data(), m.stat_count * sizeof(float));
  m.refresh_weight_copy(param_count_);
}

std::vector<std::pair<size_t, size_t>> Executor::layer_parameter_ranges() const {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (int i = static_cast<int>(impl_->nodes.size()) - 1; i >= 0; --i)
    if (const NodeBuffers& nb = impl_->nodes[i]; nb.param_end > nb.param_begin)
      ranges.emplace_back(nb.param_begin, nb.param_end);
  return ranges;
}

std::vector<float> Executor::download(const std::string& what) {
  Impl& m = *impl_;
  set_current_device(device_);
  float* src = what == "params"     ? m.params
               : what == "momentum" ? m.momentum
               : what == "stats"    ? m.stats
               : what == "grads"    ? m.grads
                                    : nullptr;
  if (!src) throw Error("download: unknown buffer '" + what + "'");
  if (what == "stats") {
    std::vector<float> out(m.stat_count);
    m.copy(out.data(), src, out.size() * sizeof(float));
    return out;
  }
  std::vector<float> flat(param_count_);  // the flat buffer, then its parameters packed
  m.copy(flat.data(), src, flat.size() * sizeof(float));
  return pack(flat.data());
}

void Executor::upload(const std::string& what, const std::vector<float>& values) {
  Impl& m = *impl_;
  set_current_device(device_);
  float* dst = what == "params" ? m.params : what == "momentum" ? m.momentum : what == "stats" ? m.stats : nullptr;
  if (!dst) throw Error("upload: unknown buffer '" + what + "'");
  const bool stats = what == "stats";
  size_t expect = stats ? m.stat_count : packed_count_;
  if (values.size() != expect)
    throw Error("upload of " + what + ": " + std::to_string(values.size()) + " values, the model has " +
                std::to_string(expect));
  if (stats) {
    m.copy(dst, values.data(), expect * sizeof(float));
    return;
  }
  std::vector<float> flat(param_count_, 0.0f);  // the gaps stay zero
  auto next = values.begin();
  for (const auto& [offset, count] : m.packed) {
    std::copy(next, next + static_cast<std::ptrdiff_t>(count), flat.begin() + static_cast<std::ptrdiff_t>(offset));
    next += static_cast<std::ptrdiff_t>(count);
  }
  m.copy(dst, flat.data(), flat.size() * sizeof(float));
  if (what == "params") m.refresh_weight_copy(param_count_);
}

void Executor::set_tracing(bool on) {
  Impl& m = *impl_;
  tracing_ = on;
  if (on && m.events.empty()) {
    for (size_t k = 0; k < 4 * graph_.nodes.size(); ++k) m.events.emplace_back(device_);
  }
}

double Executor::trace_now_ms() const { return now_ms() - impl_->trace_origin; }

double Executor::clock_ms() { return now_ms(); }

void Executor::set_batchnorm_sync(Communicator* comm, Stream* comm_stream) {
  Impl& m = *impl_;
  if (comm && !comm_stream) throw Error("set_batchnorm_sync: a communicator needs its stream");
  m.bn_comm = comm;
  m.bn_comm_stream = comm_stream;
  if (!comm || m.bn_scratch.data()) return;
  int widest = 1;
  for (const Node& node : graph_.nodes)
    if (node.spec.type == LayerType::Convolutional && node.spec.batch_normalize) widest = std::max(widest, node.out.c);
  m.bn_scratch = DeviceMemory(device_, 4 * static_cast<size_t>(widest) * sizeof(float));
  m.bn_events.clear();
  m.bn_events.emplace_back(device_);
  m.bn_events.emplace_back(device_);
}

// Sums `count` floats over the replicas, in the compute stream's order: the comm stream takes
// them after the work that wrote them, and the compute stream goes on once they are reduced.
void Executor::sync_batchnorm_sums(float* data, int count) {
  Impl& m = *impl_;
  stream_->record(m.bn_events[0]);
  m.bn_comm_stream->wait(m.bn_events[0]);
  m.bn_comm->all_reduce_sum(data, static_cast<size_t>(count), *m.bn_comm_stream);
  m.bn_comm_stream->record(m.bn_events[1]);
  stream_->wait(m.bn_events[1]);
}

PhaseTimes Executor::take_phase_times() { return std::exchange(impl_->phases, PhaseTimes{}); }

std::vector<TraceEvent> Executor::take_trace() {
  Impl& m = *impl_;
  std::vector<TraceEvent> out;
  // The events of the last traced micro-batch, relative to its first.
  m.synchronize();
  const Event* origin = nullptr;
  for (const Node& node : graph_.nodes)
    for (int phase = 0; phase < 2; ++phase) {
      const Event& begin = m.events[4 * node.index + 2 * phase];
      const Event& end = m.events[4 * node.index + 2 * phase + 1];
      if (node.spec.type == LayerType::Yolo && phase == 1) continue;
      if (node.spec.type == LayerType::Softmax && phase == 1) continue;
      if (!origin) origin = &begin;
      out.push_back(TraceEvent{std::to_string(node.index) + " " + layer_type_name(node.spec.type),
                               phase ? "backward" : "forward", begin.elapsed_ms_since(*origin),
                               end.elapsed_ms_since(*origin)});
    }
  return out;
}

}  // namespace yolo::graph
