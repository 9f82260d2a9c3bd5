// The executor's private state, shared by its source files (executor*.cpp) and by no one else:
// where each node's buffers live, the activation plan, and Executor::Impl.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "graph/executor.h"
#include "kernels/ops.h"
#include "runtime/communicator.h"
#include "runtime/memory.h"

namespace yolo::graph {
namespace detail {

// Where a node's output lives: its own buffer, or a channel slice of another node's (a route
// its producer writes into directly, or a one-input route that is its input).
struct Alias {
  int root = -1;    // node owning the storage (itself when not aliased)
  int channel = 0;  // first channel within the root's pixels
};

struct NodeBuffers {
  Act out;                 // micro-batch view (possibly a slice)
  float* pre = nullptr;    // conv with BatchNorm: the convolution's output (BN's input)
  int* argmax = nullptr;   // maxpool
  float* grad = nullptr;   // d loss / d out (dense, c channels)
  bool first_writer_pending = true;
  // Parameters (offsets into the flat buffers; -1 when absent).
  int64_t w = -1, b = -1, s = -1, mean = -1, var = -1, saved = -1;
  int64_t table = -1;  // BatchNorm applied in the readers' loads: its table in load_tables (4 c floats)
  size_t param_begin = 0, param_end = 0;  // this layer's range of the flat buffers
};

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every activation-sized buffer of a step, packed by liveness (plan.h).
struct ActivationPlan {
  std::vector<Alias> alias;
  // Shortcuts folded into BatchNorm's apply (GPUs): folded_into[q] is the shortcut whose output
  // conv q's apply writes (adding the shortcut's other input), -1 for the rest; such a shortcut
  // runs nothing forward.
  std::vector<int> folded_into;
  // BatchNorm applied where the next convolutions load its output (GPUs, tensor cores; kernels/
  // conv.h NormalizedInput): applied_in_loads[q] for a BatchNorm conv q read by convolutions alone;
  // its output is never stored (no buffer), and its readers read its input (pre) through the apply.
  std::vector<char> applied_in_loads;
  std::vector<PlannedBuffer> buffers;
  std::vector<int> out_buffer, pre_buffer, argmax_buffer, grad_buffer;  // per node, index into buffers or -1
  size_t bytes = 0, unplanned = 0;
};

// bn_recomputes_output: the BatchNorm backwards recompute their output from their input (GPUs),
// so a BatchNorm layer's output lives only as long as its readers need it. fold_shortcuts (needs
// bn_recomputes_output): a shortcut whose one input is a BatchNorm conv read by nothing else, its
// other input computed before that conv, is folded into the conv's apply.
// reads_normalized (needs bn_recomputes_output; empty: none): per node, whether it is a conv
// whose kernels can read a BatchNorm-normalized input (ops.h, conv2d_takes_normalized_input).
ActivationPlan plan_activations(const Graph& graph, int n, size_t elem, bool bn_recomputes_output = false,
                                bool fold_shortcuts = false, const std::vector<char>& reads_normalized = {});
// The shortcut input a folded conv's apply adds (the other one).
int folded_residual(const Graph& graph, int conv, int shortcut);

// The largest workspace any op of the graph needs on the current device (the CPU ops only
// use one for BatchNorm).
size_t workspace_bytes(const Graph& graph, int n, bool kernels, Precision precision);

// What a conv reads when its producer's BatchNorm is applied in the loads (plan.applied_in_loads):
// the producer's BatchNorm input, and the apply's table.
struct ConvInput {
  ConstAct in;
  NormalizedInput norm;
};

// A dense view of a node's gradient (c channels, no slice).
inline Act grad_view(float* grad, const Act& out) { return Act{grad, out.n, out.h, out.w, out.c, out.c}; }

// A flat array as an NHWC view, for the element-wise ops (1 x 1 x count x 1).
inline Act flat(float* data, size_t count) { return Act{data, 1, 1, static_cast<int>(count), 1, 1}; }

}  // namespace detail

struct Executor::Impl {
  bool kernels = false;  // the device runs the CUDA kernels (a GPU or an emulated one)
  std::vector<char> shortcut_folded;  // per node: a shortcut its input conv's apply computes (plan.folded_into)
  std::unique_ptr<Arena> arena;
  float* params = nullptr;
  float* grads = nullptr;
  float* micro_grads = nullptr;
  float* momentum = nullptr;
  float* stats = nullptr;   // running mean and variance of every BN layer
  float* saved = nullptr;   // batch mean and variance of the last forward
  float* load_tables = nullptr;  // the BatchNorms applied in their readers' loads (NodeBuffers::table)
  float* ones = nullptr;    // micro_batch ones (bias gradients of connected layers)
  // bf16/fp16 (stores_16_bits): the 16-bit copies the ops read. Typed float like the views (ops.h).
  bool half = false;
  size_t elem = sizeof(float);  // bytes of one stored activation
  float* weights16 = nullptr;   // the conv/connected weights, indexed like params
  float* ones16 = nullptr;      // micro_batch ones
  float* input16 = nullptr;     // the micro-batch's images
  DeviceMemory widened;         // output(): a 16-bit output widened to FP32
  float loss_scale = 1.0f;      // the losses' gradients are multiplied by this (fp16)
  float* loss_scale_at = nullptr;  // GPUs: its device copy, which the loss kernels read when they run
  // keep_loss_scale_on_device: loss_scale_at is &loss_scale_live->scale and each update adjusts it.
  LossScaleLive* loss_scale_live = nullptr;
  int loss_scale_growth = 0;  // 0: the host sets the scale (set_loss_scale)
  LossScaleLive loss_scale_host;  // the source of its first copy
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  Precision precision = Precision::Fp32;
  const float* current_images = nullptr;  // the micro-batch being trained (for the first layer's backward)
  // The micro-batch's inputs the queued work reads: the caller's buffers, or (stage_inputs) the
  // fixed buffers below, whose addresses a captured step keeps.
  const float* in_images = nullptr;
  const YoloTruth* in_truths = nullptr;
  const int* in_counts = nullptr;
  const int* in_labels = nullptr;
  // GPUs: BatchNorm's statistics from the conv's epilogue (kernels/conv.h ConvMoments), for the
  // layer being run (consumed by its BatchNorm right after): the largest layer's blocks.
  float* moment_partials = nullptr;
  float* moment_counts = nullptr;
  float* staged_images = nullptr;  // GPUs: the largest planned input size
  YoloTruth* staged_truths = nullptr;
  int* staged_counts = nullptr;
  int* staged_labels = nullptr;
  size_t staged_bytes = 0;
  int* zero_labels = nullptr;  // inference: the softmax op wants labels even when it computes no loss
  // The optimizer's per-step values (learning rate, gradient scale, non-finite flag) in device
  // memory, read by the kernels when they run (kernels/sgd.h), and their host copy.
  SgdLive live_host;
  size_t stat_count = 0;
  std::vector<detail::NodeBuffers> nodes;
  std::vector<detail::Alias> alias;
  detail::ActivationPlan plan;
  char* block = nullptr;  // the activations
  std::vector<SgdSegment> segments;
  // The parameters' ranges of the flat buffers (offset, count), in order, without the alignment
  // gaps: the packed layout downloads, uploads and checkpoints use.
  std::vector<std::pair<size_t, size_t>> packed;
  SgdSegment* device_segments = nullptr;
  std::vector<float> host_params, host_stats;
  LossSums loss;
  // Tracing
  std::vector<Event> events;  // two per node and phase
  // The trace's host clock origin: set by a host function on the compute stream when the device
  // reaches the traced micro-batch, so that host-timed events (the all-reduces, from the comm
  // stream's host functions) line up with the layer events; hence atomic.
  std::atomic<double> trace_origin{0};
  // --sync-bn: BatchNorm statistics over every replica, all-reduced on the comm stream (one
  // communicator, one stream: every rank issues the same collectives in the same order).
  Communicator* bn_comm = nullptr;
  Stream* bn_comm_stream = nullptr;
  DeviceMemory bn_scratch;  // 4 x the widest BN layer's channels: sums, squares / sums2
  std::vector<Event> bn_events;  // compute -> comm, comm -> compute
  // What queued work writes for the host to read back, in two slots (set_result_slot): the loop
  // may queue a step before it reads the one before.
  struct ResultSlot {
    YoloLossStats* yolo_stats = nullptr;  // one per node (only [yolo] entries used)
    float* softmax_loss = nullptr;
    int* bad_label = nullptr;
    SgdLive* live = nullptr;  // the optimizer's step values and non-finite flag (kernels/sgd.h)
    // Timing events (record_timing: replayed graphs record them too): forward start, forward end,
    // backward end; update start, update end. Read after each micro-batch's loss and after the
    // update's flag, when the host has waited for them anyway.
    std::vector<Event> marks;
    // Marks 3 and 4 are recorded (or will be, by work already queued) since the last
    // update_applied. A replayed graph records them without queue_update running on the host, so
    // set_step_values, which opens every step's update, sets this too once an update has been
    // queued (the events exist in the graphs from then on).
    bool update_marked = false;
    bool update_queued = false;  // queue_update has run at least once
  };
  ResultSlot slots[2];
  int slot = 0;  // where the work queued now writes
  ResultSlot& queued() { return slots[slot]; }
  PhaseTimes phases;  // since take_phase_times

  Stream* stream = nullptr;  // the executor's compute stream

  OpContext context(Stream& on) const { return OpContext{&on, workspace, workspace_bytes, precision}; }
  // Conv `reader`'s input, with its producer's BatchNorm apply when that runs in the loads.
  detail::ConvInput conv_input(const Graph& graph, const Node& reader, ConstAct stored, int n) const {
    const int q = reader.inputs[0];
    if (q == kNetworkInput || !plan.applied_in_loads[q]) return {stored, {}};
    const Node& producer = graph.nodes[q];
    const detail::NodeBuffers& nb = nodes[q];
    return {ConstAct{nb.pre, n, producer.out.h, producer.out.w, producer.out.c, producer.out.c},
            NormalizedInput{load_tables + nb.table, producer.spec.activation}};
  }
  // For the FP32 parameter-space ops (gradient accumulation) in every precision.
  OpContext fp32_context(Stream& on) const { return OpContext{&on, workspace, workspace_bytes, Precision::Fp32}; }
  // `count` stored activations past p (pointer arithmetic in the storage type's bytes).
  float* advance(float* p, int64_t count) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(p) + count * static_cast<int64_t>(elem));
  }
  const float* advance(const float* p, int64_t count) const { return advance(const_cast<float*>(p), count); }
  // The weights the conv/connected ops multiply by: the 16-bit copy with bf16/fp16.
  const float* weights_at(int64_t offset) const { return half ? advance(weights16, offset) : params + offset; }
  // Refreshes the 16-bit weight copy from the FP32 masters (after any upload of parameters).
  void refresh_weight_copy(size_t count) {
    if (half) to_storage(context(*stream), params, weights16, count);
  }
  // A copy between host and device memory in the stream's order, done when it returns.
  void copy(void* dst, const void* src, size_t bytes) { copy_and_wait(dst, src, bytes, *stream); }
  void zero(void* dst, size_t bytes) { fill_bytes(dst, 0, bytes, *stream); }
  void synchronize() { stream->synchronize(); }
};

}  // namespace yolo::graph
