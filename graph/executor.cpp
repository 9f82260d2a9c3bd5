// The executor (see executor.h): plan, parameter layout, and the forward/backward/update
// passes over the op library (kernels/ops.h), every op queued on the replica's compute stream
// whatever the device.
#include "graph/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "data/rng.h"
#include "data/dataset.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/communicator.h"
#include "runtime/fault.h"
#include "runtime/memory.h"
#include "runtime/nvtx.h"

namespace yolo::graph {

// The loader lays truth rows out with data::kMaxBoxes boxes; the loss reads kYoloMaxTruths.
static_assert(data::kMaxBoxes == kYoloMaxTruths);

LossSums& LossSums::operator+=(const LossSums& o) {
  total += o.total;
  box += o.box;
  obj += o.obj;
  noobj += o.noobj;
  cls += o.cls;
  iou_sum += o.iou_sum;
  assigned += o.assigned;
  recall50 += o.recall50;
  truths_invalid += o.truths_invalid;
  images += o.images;
  correct += o.correct;
  return *this;
}

std::string MemoryReport::text() const {
  auto mib = [](size_t b) { return b / 1048576.0; };
  char buf[512];
  char copy[64] = "";
  if (weight_copy) std::snprintf(copy, sizeof copy, " (+ %.1f MiB 16-bit copy)", mib(weight_copy));
  char staged[96] = "";
  if (staged_inputs)
    std::snprintf(staged, sizeof staged, ", fixed input buffers %.1f MiB, BatchNorm moments %.1f MiB",
                  mib(staged_inputs), mib(bn_moments));
  std::snprintf(buf, sizeof buf,
                "memory plan (%s): parameters %.1f MiB%s, gradients %.1f MiB (+ as much for micro-batch "
                "accumulation), momentum %.1f MiB, BatchNorm statistics %.1f MiB, activations %.1f MiB (%.1f MiB "
                "without reuse), workspace %.1f MiB%s; total %.1f MiB",
                precision_name(precision), mib(parameters), copy, mib(gradients), mib(optimizer), mib(statistics),
                mib(activations), mib(activations_unplanned), mib(workspace), staged, mib(total));
  return buf;
}

namespace {

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
  size_t param_begin = 0, param_end = 0;  // this layer's range of the flat buffers
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every activation-sized buffer of a step, packed by liveness (plan.h).
struct ActivationPlan {
  std::vector<Alias> alias;
  std::vector<PlannedBuffer> buffers;
  std::vector<int> out_buffer, pre_buffer, argmax_buffer, grad_buffer;  // per node, index into buffers or -1
  size_t bytes = 0, unplanned = 0;
};

// elem: bytes of one stored activation (2 with bf16/fp16); softmax probabilities stay FP32.
ActivationPlan plan_activations(const Graph& graph, int n, size_t elem) {
  const int L = static_cast<int>(graph.nodes.size());
  ActivationPlan plan;
  plan.alias.resize(L);
  // Aliases: a one-input route is its input; a producer whose only reader is a multi-input
  // route writes straight into its slice of the route's output.
  for (int i = 0; i < L; ++i) plan.alias[i] = Alias{i, 0};
  for (int i = 0; i < L; ++i) {
    const Node& node = graph.nodes[i];
    if (node.spec.type != LayerType::Route) continue;
    if (node.inputs.size() == 1) {
      plan.alias[i] = plan.alias[node.inputs[0]];
      continue;
    }
    int channel = 0;
    for (int p : node.inputs) {
      const Node& producer = graph.nodes[p];
      LayerType t = producer.spec.type;
      bool can_write_slice = t == LayerType::Convolutional || t == LayerType::Upsample || t == LayerType::Maxpool ||
                             t == LayerType::Shortcut || t == LayerType::Route;
      if (can_write_slice && producer.consumers.size() == 1 && plan.alias[p].root == p &&
          std::count(node.inputs.begin(), node.inputs.end(), p) == 1) {
        // Everything already aliased into p (one-input routes of p) follows it.
        for (int q = 0; q < L; ++q)
          if (plan.alias[q].root == p) plan.alias[q] = Alias{i, channel + plan.alias[q].channel};
      }
      channel += producer.out.c;
    }
  }

  // Live intervals: forward of node i at position i, its backward at 2L-1-i.
  auto bwd = [&](int i) { return 2 * L - 1 - i; };
  std::vector<int> out_first(L), out_last(L);
  for (int i = 0; i < L; ++i) {
    const Node& node = graph.nodes[i];
    out_first[i] = i;
    out_last[i] = i;
    for (int c : node.consumers) {
      out_last[i] = std::max(out_last[i], c);
      LayerType t = graph.nodes[c].spec.type;
      if (t == LayerType::Convolutional || t == LayerType::Connected) out_last[i] = std::max(out_last[i], bwd(c));
    }
    bool needs_own_output = (node.spec.type == LayerType::Convolutional || node.spec.type == LayerType::Connected) &&
                            node.spec.activation != Activation::Linear;
    if (needs_own_output) out_last[i] = std::max(out_last[i], bwd(i));
    // Read after the whole forward pass (inference decodes the heads, the classifier's
    // accuracy reads the probabilities): the [yolo] inputs and the softmax output stay whole.
    if (node.spec.type == LayerType::Softmax) out_last[i] = 2 * L - 1;
    for (int c : node.consumers)
      if (graph.nodes[c].spec.type == LayerType::Yolo) out_last[i] = 2 * L - 1;
  }
  // A storage lives from the first to the last use of any output it holds.
  std::vector<int> root_first(L, INT32_MAX), root_last(L, -1);
  for (int i = 0; i < L; ++i) {
    int r = plan.alias[i].root;
    root_first[r] = std::min(root_first[r], out_first[i]);
    root_last[r] = std::max(root_last[r], out_last[i]);
  }
  const size_t f = elem;
  std::vector<PlannedBuffer> buffers;
  std::vector<int> out_buffer(L, -1), pre_buffer(L, -1), argmax_buffer(L, -1), grad_buffer(L, -1);
  size_t unplanned = 0;
  auto add = [&](std::string tag, size_t bytes, int first, int last) {
    buffers.push_back(PlannedBuffer{std::move(tag), bytes, first, last, 0});
    unplanned += bytes;
    return static_cast<int>(buffers.size() - 1);
  };
  for (int i = 0; i < L; ++i) {
    const Node& node = graph.nodes[i];
    size_t elements = static_cast<size_t>(n) * static_cast<size_t>(node.out.elements());
    LayerType t = node.spec.type;
    bool loss = t == LayerType::Yolo;  // yolo's output is its input: nothing stored
    const size_t out_elem = t == LayerType::Softmax ? sizeof(float) : f;
    if (plan.alias[i].root == i && !loss)
      out_buffer[i] = add("out " + std::to_string(i), elements * out_elem, root_first[i], root_last[i]);
    if (t == LayerType::Convolutional && node.spec.batch_normalize)
      pre_buffer[i] = add("bn-in " + std::to_string(i), elements * f, i, bwd(i));
    if (t == LayerType::Maxpool) argmax_buffer[i] = add("argmax " + std::to_string(i), elements * sizeof(int), i, bwd(i));
    if (t != LayerType::Yolo && t != LayerType::Softmax) {
      // Written first by the last reader's backward, or at forward time by a loss reading it.
      int first = 2 * L;  // no reader: zeroed when backward starts
      for (int c : node.consumers) {
        LayerType ct = graph.nodes[c].spec.type;
        first = std::min(first, (ct == LayerType::Yolo || ct == LayerType::Softmax) ? c : bwd(c));
      }
      if (node.consumers.empty()) first = L;
      grad_buffer[i] = add("grad " + std::to_string(i), elements * f, first, bwd(i));
    }
  }
  plan.bytes = plan_buffers(buffers);
  std::string conflict;
  if (find_plan_conflict(buffers, &conflict)) throw Error("internal error: the memory plan overlaps " + conflict);
  plan.unplanned = unplanned;
  plan.buffers = std::move(buffers);
  plan.out_buffer = std::move(out_buffer);
  plan.pre_buffer = std::move(pre_buffer);
  plan.argmax_buffer = std::move(argmax_buffer);
  plan.grad_buffer = std::move(grad_buffer);

  return plan;
}

// The largest workspace any op of the graph needs on the current device (the CPU ops only
// use one for BatchNorm).
size_t workspace_bytes(const Graph& graph, int n, bool kernels, Precision precision) {
  size_t workspace = 0;
  for (const Node& node : graph.nodes) {
    if (node.spec.type == LayerType::Convolutional && node.spec.batch_normalize)
      workspace = std::max(workspace, batchnorm_workspace_bytes(n, node.out.h, node.out.w, node.out.c));
    if (!kernels) continue;
    if (node.spec.type == LayerType::Convolutional) {
      Conv2dShape s{n, node.in.h, node.in.w, node.in.c, node.out.c, node.spec.size, node.spec.stride};
      workspace = std::max(workspace, conv2d_workspace_bytes(precision, s));
      if (node.spec.batch_normalize)  // the training forward from the conv's moments
        workspace = std::max(
            workspace, batchnorm_from_moments_workspace_bytes(conv2d_forward_moment_blocks(precision, s), node.out.c));
    }
    if (node.spec.type == LayerType::Yolo)
      workspace = std::max(workspace, yolo_loss_workspace_bytes(n, node.in.h, node.in.w, node.yolo));
    if (node.spec.type == LayerType::Connected) {
      int in = static_cast<int>(node.in.elements()), out = node.out.c;
      workspace = std::max({workspace, gemm_workspace_bytes(precision, GemmShape{n, out, in, false, true}),
                            gemm_workspace_bytes(precision, GemmShape{out, in, n, true, false}),
                            gemm_workspace_bytes(precision, GemmShape{n, in, out, false, false}),
                            gemm_workspace_bytes(precision, GemmShape{1, out, n, false, false}),
                            gemm_workspace_bytes(precision, GemmShape{out, 1, n, true, false})});
    }
  }
  return workspace;
}

}  // namespace

MemoryReport estimate_memory(const Graph& graph, int micro_batch, Precision precision) {
  const size_t elem = activation_bytes(precision);
  ActivationPlan plan = plan_activations(graph, micro_batch, elem);
  MemoryReport r;
  const size_t f = sizeof(float);
  r.precision = precision;
  r.parameters = r.gradients = r.optimizer = static_cast<size_t>(graph.trainable) * f;
  r.statistics = 2 * static_cast<size_t>(graph.bn_stats) * f;  // running + last batch statistics
  r.activations = plan.bytes;
  r.activations_unplanned = plan.unplanned;
  if (stores_16_bits(precision)) {
    // The 16-bit weight copy (indexed like the flat parameters) and the 16-bit input images.
    r.weight_copy = static_cast<size_t>(graph.trainable) * elem;
    r.activations += static_cast<size_t>(micro_batch) * graph.input.elements() * elem;
  }
  r.total = 4 * r.parameters + r.weight_copy + r.statistics + r.activations;
  return r;
}

struct Executor::Impl {
  bool kernels = false;  // the device runs the CUDA kernels (a GPU or an emulated one)
  std::unique_ptr<Arena> arena;
  float* params = nullptr;
  float* grads = nullptr;
  float* micro_grads = nullptr;
  float* momentum = nullptr;
  float* stats = nullptr;   // running mean and variance of every BN layer
  float* saved = nullptr;   // batch mean and variance of the last forward
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
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  Precision precision = Precision::Fp32;
  YoloLossStats* yolo_stats = nullptr;  // one per node (only [yolo] entries used)
  float* softmax_loss = nullptr;
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
  int* bad_label = nullptr;
  int* zero_labels = nullptr;  // inference: the softmax op wants labels even when it computes no loss
  // The optimizer's per-step values (learning rate, gradient scale, non-finite flag) in device
  // memory, read by the kernels when they run (kernels/sgd.h), and their host copy.
  SgdLive* live = nullptr;
  SgdLive live_host;
  size_t stat_count = 0;
  std::vector<NodeBuffers> nodes;
  std::vector<Alias> alias;
  ActivationPlan plan;
  char* block = nullptr;  // the activations
  std::vector<SgdSegment> segments;
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
  // Forward/backward time of the micro-batches since take_phase_times, timed by events.
  // Timing events (record_timing: replayed graphs record them too): forward start, forward end,
  // backward end; update start, update end. Read after each micro-batch's loss and after the
  // update's flag, when the host has waited for them anyway.
  std::vector<Event> marks;
  bool update_marked = false;  // marks 3 and 4 recorded since the last update_applied
  PhaseTimes phases;           // since take_phase_times

  Stream* stream = nullptr;  // the executor's compute stream

  OpContext context(Stream& on) const { return OpContext{&on, workspace, workspace_bytes, precision}; }
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

// ---- construction: parameters, plan, arena ----------------------------------------------------

Executor::Executor(const Graph& graph, Device device, int micro_batch, uint64_t seed,
                   std::vector<std::pair<int, int>> other_sizes, Precision precision)
    : graph_(graph), device_(device), precision_(precision), micro_batch_(micro_batch), impl_(std::make_unique<Impl>()) {
  if (micro_batch < 1) throw Error("micro-batch must be at least 1 image per device");
  Impl& m = *impl_;
  m.kernels = device.runs_kernels();
  m.precision = precision;
  set_current_device(device);
  if (precision != Precision::Fp32) {
    if (!m.kernels)
      throw Error(std::string("precision ") + precision_name(precision) +
                  " (--precision, or the cfg's [net] precision=) runs on tensor cores, but " + device.name() +
                  " is the CPU backend (fp32 only)");
    require_precision(precision, ("training on " + device.name()).c_str());
  }
  m.half = stores_16_bits(precision);
  m.elem = activation_bytes(precision);
  stream_ = std::make_unique<Stream>(device, StreamPriority::Normal, "compute");
  m.stream = stream_.get();
  const int L = static_cast<int>(graph.nodes.size());
  const int n = micro_batch;
  m.nodes.resize(L);

  // Parameter layout: layers in reverse (the order backward produces gradients), each layer's
  // weights, then biases, then BN scales.
  size_t offset = 0, stat_offset = 0, saved_offset = 0;
  for (int i = L - 1; i >= 0; --i) {
    const Node& node = graph.nodes[i];
    NodeBuffers& nb = m.nodes[i];
    auto take = [&](int64_t count, bool decay) {
      if (count == 0) return int64_t(-1);
      m.segments.push_back(SgdSegment{offset, static_cast<size_t>(count), decay});
      int64_t at = static_cast<int64_t>(offset);
      offset += static_cast<size_t>(count);
      return at;
    };
    nb.param_begin = offset;
    nb.w = take(node.weights, true);
    nb.b = take(node.biases, false);
    nb.s = take(node.scales, false);
    nb.param_end = offset;
    if (node.stats) {
      nb.mean = static_cast<int64_t>(stat_offset);
      nb.var = nb.mean + node.out.c;
      stat_offset += static_cast<size_t>(node.stats);
      nb.saved = static_cast<int64_t>(saved_offset);
      saved_offset += static_cast<size_t>(node.stats);
    }
  }
  param_count_ = offset;
  m.stat_count = stat_offset;

  // Multi-scale: the plan is made for the largest input size (every buffer shrinks with the
  // input, and the live intervals do not depend on it), the workspace for the largest need.
  sizes_.push_back({graph.input.w, graph.input.h});
  std::vector<Graph> candidates{graph};
  for (auto [w, h] : other_sizes) {
    if (w == graph.input.w && h == graph.input.h) continue;
    candidates.push_back(build_graph(spec_of(graph), w, h));
    sizes_.push_back({w, h});
  }
  const Graph* largest = &candidates[0];
  for (const Graph& g : candidates)
    if (g.input.elements() > largest->input.elements()) largest = &g;
  for (const Graph& g : candidates)
    if (g.input.h > largest->input.h || g.input.w > largest->input.w)
      throw Error("multi-scale sizes must grow together in width and height");
  m.plan = plan_activations(*largest, n, m.elem);
  m.alias = m.plan.alias;
  plan_ = m.plan.buffers;
  const size_t f = sizeof(float);
  size_t activation_bytes = m.plan.bytes;

  size_t workspace = 0;
  for (const Graph& g : candidates) workspace = std::max(workspace, workspace_bytes(g, n, m.kernels, precision));

  memory_ = estimate_memory(*largest, n, precision);
  memory_.workspace = workspace;
  // GPUs: fixed buffers for a micro-batch's inputs, which a captured step reads (stage_inputs).
  size_t moment_blocks = 0, moment_floats = 0;
  if (m.kernels)
    for (const Graph& g : candidates)
      for (const Node& node : g.nodes)
        if (node.spec.type == LayerType::Convolutional && node.spec.batch_normalize) {
          Conv2dShape s{n, node.in.h, node.in.w, node.in.c, node.out.c, node.spec.size, node.spec.stride};
          const size_t blocks = static_cast<size_t>(conv2d_forward_moment_blocks(precision, s));
          moment_blocks = std::max(moment_blocks, blocks);
          moment_floats = std::max(moment_floats, blocks * 2 * static_cast<size_t>(node.out.c));
        }
  memory_.bn_moments = (moment_floats + moment_blocks) * f;
  if (m.kernels) {
    memory_.staged_inputs = static_cast<size_t>(n) *
                            (largest->input.elements() * f + data::kMaxBoxes * sizeof(YoloTruth) + 2 * sizeof(int));
  }
  size_t small = L * sizeof(YoloLossStats) + 64 + static_cast<size_t>(n) * f + m.segments.size() * sizeof(SgdSegment);
  // Each sub-allocation may add alignment and an ASan red zone: a generous margin per block.
  const size_t input16_bytes = m.half ? static_cast<size_t>(n) * largest->input.elements() * m.elem : 0;
  memory_.total = 4 * param_count_ * f + memory_.weight_copy + memory_.statistics + activation_bytes + input16_bytes +
                  workspace + memory_.staged_inputs + memory_.bn_moments + small + 16 * 4096;
  if (std::optional<MemoryInfo> info = device_memory_info(device); info && memory_.total > info->free_bytes)
    throw Error("the model does not fit on " + device.name() + ": it needs " + std::to_string(memory_.total >> 20) +
                " MiB (" + memory_.text() + ") but " + std::to_string(info->free_bytes >> 20) +
                " MiB are free; lower --batch, raise subdivisions or use a smaller --size");
  m.arena = std::make_unique<Arena>(device, memory_.total, "replica " + device.name());
  Arena& arena = *m.arena;
  m.params = arena.allocate_array<float>(std::max<size_t>(param_count_, 1), "parameters");
  m.grads = arena.allocate_array<float>(std::max<size_t>(param_count_, 1), "gradients");
  m.micro_grads = arena.allocate_array<float>(std::max<size_t>(param_count_, 1), "micro-batch gradients");
  m.momentum = arena.allocate_array<float>(std::max<size_t>(param_count_, 1), "momentum");
  m.stats = arena.allocate_array<float>(std::max<size_t>(m.stat_count, 1), "bn statistics");
  m.saved = arena.allocate_array<float>(std::max<size_t>(m.stat_count, 1), "bn batch statistics");
  m.ones = arena.allocate_array<float>(static_cast<size_t>(n), "ones");
  m.yolo_stats = arena.allocate_array<YoloLossStats>(static_cast<size_t>(L), "loss statistics");
  m.softmax_loss = arena.allocate_array<float>(1, "softmax loss");
  m.bad_label = arena.allocate_array<int>(1, "bad label");
  m.zero_labels = arena.allocate_array<int>(static_cast<size_t>(n), "inference labels");
  m.live = arena.allocate_array<SgdLive>(1, "optimizer step values");
  if (moment_blocks) {
    m.moment_partials = arena.allocate_array<float>(moment_floats, "BatchNorm moments");
    m.moment_counts = arena.allocate_array<float>(moment_blocks, "BatchNorm moment counts");
  }
  if (m.kernels) {
    m.loss_scale_at = arena.allocate_array<float>(1, "loss scale");
    m.staged_images = arena.allocate_array<float>(static_cast<size_t>(n) * largest->input.elements(), "staged images");
    m.staged_truths = arena.allocate_array<YoloTruth>(static_cast<size_t>(n) * data::kMaxBoxes, "staged truths");
    m.staged_counts = arena.allocate_array<int>(static_cast<size_t>(n), "staged truth counts");
    m.staged_labels = arena.allocate_array<int>(static_cast<size_t>(n), "staged labels");
  }
  m.device_segments = arena.allocate_array<SgdSegment>(std::max<size_t>(m.segments.size(), 1), "sgd segments");
  m.block = static_cast<char*>(arena.allocate(std::max<size_t>(activation_bytes, 1), "activations"));
  if (m.half) {
    m.weights16 = static_cast<float*>(arena.allocate(std::max<size_t>(param_count_, 1) * m.elem, "16-bit weights"));
    m.ones16 = static_cast<float*>(arena.allocate(static_cast<size_t>(n) * m.elem, "16-bit ones"));
    m.input16 = static_cast<float*>(arena.allocate(std::max<size_t>(input16_bytes, 1), "16-bit input"));
    // The optimizer writes the copy of the conv/connected weights (the segments with decay).
    for (SgdSegment& segment : m.segments) segment.copy16 = segment.decay;
  }
  if (workspace) {
    m.workspace = arena.allocate(workspace, "workspace");
    m.workspace_bytes = workspace;
  }

  bind_views();

  // Initial values: darknet's scheme (uniform in +-sqrt(2 / fan-in)), BN scales 1, biases 0.
  m.host_params.assign(param_count_, 0.0f);
  m.host_stats.assign(m.stat_count, 0.0f);
  for (int i = 0; i < L; ++i) {
    const Node& node = graph.nodes[i];
    const NodeBuffers& nb = m.nodes[i];
    if (nb.w >= 0) {
      int64_t fan_in = node.weights / node.out.c;
      float scale = std::sqrt(2.0f / static_cast<float>(fan_in));
      data::KeyedRng rng(seed, 0x57E1647ull, static_cast<uint64_t>(i));
      for (int64_t k = 0; k < node.weights; ++k) m.host_params[nb.w + k] = rng.uniform(-scale, scale);
    }
    if (nb.s >= 0) std::fill_n(m.host_params.begin() + nb.s, node.scales, 1.0f);
    if (nb.var >= 0) std::fill_n(m.host_stats.begin() + nb.var, node.out.c, 1.0f);
  }
  m.copy(m.params, m.host_params.data(), param_count_ * f);
  m.copy(m.stats, m.host_stats.data(), m.stat_count * f);
  m.zero(m.momentum, param_count_ * f);
  std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  m.copy(m.ones, ones.data(), ones.size() * f);
  if (m.half) to_storage(m.context(*stream_), m.ones, m.ones16, ones.size());
  m.refresh_weight_copy(param_count_);
  m.zero(m.zero_labels, static_cast<size_t>(n) * sizeof(int));
  sgd_check_segments(m.segments.data(), static_cast<int>(m.segments.size()), 0, param_count_);
  m.copy(m.device_segments, m.segments.data(), m.segments.size() * sizeof(SgdSegment));
  if (m.loss_scale_at) m.copy(m.loss_scale_at, &m.loss_scale, sizeof(float));
  for (int k = 0; k < 5; ++k) m.marks.emplace_back(device_);
  m.synchronize();
}

Executor::~Executor() {
  // The arena must outlive the work queued on the stream (an exception may unwind mid-step).
  try {
    if (stream_) stream_->synchronize();
  } catch (const std::exception&) {
    // Already failing; the error that got us here is the one to report.
  }
}

// Points every node's views at its planned buffers, with the current graph's shapes.
void Executor::bind_views() {
  Impl& m = *impl_;
  const ActivationPlan& p = m.plan;
  const int L = static_cast<int>(graph_.nodes.size());
  const int n = micro_batch_;
  auto at = [&](int buffer) { return m.block + p.buffers[buffer].offset; };
  for (int i = 0; i < L; ++i) {
    NodeBuffers& nb = m.nodes[i];
    if (p.pre_buffer[i] >= 0) nb.pre = reinterpret_cast<float*>(at(p.pre_buffer[i]));
    if (p.argmax_buffer[i] >= 0) nb.argmax = reinterpret_cast<int*>(at(p.argmax_buffer[i]));
    if (p.grad_buffer[i] >= 0) nb.grad = reinterpret_cast<float*>(at(p.grad_buffer[i]));
  }
  for (int i = 0; i < L; ++i) {
    const Node& node = graph_.nodes[i];
    NodeBuffers& nb = m.nodes[i];
    if (node.spec.type == LayerType::Yolo) {
      nb.out = m.nodes[node.inputs[0]].out;
      continue;
    }
    int root = m.alias[i].root;
    float* base = reinterpret_cast<float*>(at(p.out_buffer[root]));
    nb.out = Act{m.advance(base, m.alias[i].channel), n, node.out.h, node.out.w, node.out.c, graph_.nodes[root].out.c};
  }
}

void Executor::set_input_size(int width, int height) {
  if (width == graph_.input.w && height == graph_.input.h) return;
  if (std::find(sizes_.begin(), sizes_.end(), std::pair<int, int>{width, height}) == sizes_.end())
    throw Error("input size " + std::to_string(width) + "x" + std::to_string(height) +
                " was not planned for (pass it to the Executor)");
  graph_ = build_graph(spec_of(graph_), width, height);
  bind_views();
}

ModelSpec spec_of(const Graph& graph) {
  ModelSpec spec;
  spec.path = graph.path;
  spec.net = graph.net;
  for (const Node& node : graph.nodes) spec.layers.push_back(node.spec);
  return spec;
}

ConstAct Executor::output(int node) const {
  Impl& m = *impl_;
  ConstAct out = as_const(m.nodes.at(static_cast<size_t>(node)).out);
  if (!m.half || graph_.nodes[static_cast<size_t>(node)].spec.type == LayerType::Softmax) return out;
  // 16-bit: widened into one FP32 buffer (in the compute stream's order), with the view's stride:
  // element p * stride + ch of the copy is that of the view (a slice's gaps come along).
  const size_t pixels = out.pixels();
  if (pixels == 0) return out;
  const size_t count = (pixels - 1) * static_cast<size_t>(out.stride) + static_cast<size_t>(out.c);
  if (m.widened.size() < count * sizeof(float)) m.widened = DeviceMemory(device_, count * sizeof(float));
  float* wide = static_cast<float*>(m.widened.data());
  from_storage(m.context(*stream_), out.data, wide, count);
  return ConstAct{wide, out.n, out.h, out.w, out.c, out.stride};
}

// ---- the passes ------------------------------------------------------------------------------

namespace {

// A dense view of a node's gradient (c channels, no slice).
Act grad_view(float* grad, const Act& out) { return Act{grad, out.n, out.h, out.w, out.c, out.c}; }

// A flat array as an NHWC view, for the element-wise ops (1 x 1 x count x 1).
Act flat(float* data, size_t count) { return Act{data, 1, 1, static_cast<int>(count), 1, 1}; }

}  // namespace

void Executor::forward(bool training) {
  Impl& m = *impl_;
  const float* images = m.in_images;
  const YoloTruth* truths = m.in_truths;
  const int* truth_counts = m.in_counts;
  const int* labels = m.in_labels;
  m.current_images = images;
  const int n = micro_batch_;
  const OpContext c = m.context(*stream_);
  if (m.half) {  // the images as 16-bit activations, for the first layer's forward and backward
    to_storage(c, images, m.input16, static_cast<size_t>(n) * graph_.input.elements());
    images = m.input16;
    m.current_images = images;
  }
  ConstAct image = ConstAct{images, n, graph_.input.h, graph_.input.w, graph_.input.c, graph_.input.c};
  auto input_of = [&](const Node& node, size_t k = 0) {
    int p = node.inputs[k];
    return p == kNetworkInput ? image : as_const(m.nodes[p].out);
  };
  for (const Node& node : graph_.nodes) {
    NodeBuffers& nb = m.nodes[node.index];
    const LayerSpec& l = node.spec;
    if (tracing_) stream_->record(m.events[4 * node.index]);
    if (kNvtxRanges) nvtx_push(std::to_string(node.index) + " " + layer_type_name(l.type) + " forward");
    ConstAct in = input_of(node);
    float* p = m.params;
    switch (l.type) {
      case LayerType::Convolutional: {
        Conv2dShape shape{n, node.in.h, node.in.w, node.in.c, node.out.c, l.size, l.stride};
        if (!l.batch_normalize) {
          conv2d_forward(c, shape, in, m.weights_at(nb.w), p + nb.b, nb.out);
          if (l.activation != Activation::Linear) activation_forward(c, l.activation, as_const(nb.out), nb.out);
          break;
        }
        Act pre{nb.pre, n, node.out.h, node.out.w, node.out.c, node.out.c};
        // GPUs, training: the conv's epilogue also writes BatchNorm's statistics (per block of
        // pixels), so that the BatchNorm reads its input once (with --sync-bn: its sums too).
        const bool moments = training && m.moment_partials;
        conv2d_forward(c, shape, in, m.weights_at(nb.w), nullptr, pre,
                       moments ? ConvMoments{m.moment_partials, m.moment_counts} : ConvMoments{});
        if (!training) {
          batchnorm_activation_forward_inference(c, l.activation, as_const(pre), p + nb.s, p + nb.b, m.stats + nb.mean,
                                                 m.stats + nb.var, nb.out);
          break;
        }
        float* saved_mean = m.saved + nb.saved;
        float* saved_var = saved_mean + node.out.c;
        float* running_mean = m.stats + nb.mean;
        float* running_var = m.stats + nb.var;
        if (m.bn_comm) {
          // Statistics over every replica: sums, then squares about the global mean.
          const double total = static_cast<double>(pre.pixels()) * m.bn_comm->size();
          float* sums = static_cast<float*>(m.bn_scratch.data());
          float* squares = sums + node.out.c;
          const int blocks = moments ? conv2d_forward_moment_blocks(m.precision, shape) : 0;
          if (moments)
            batchnorm_sums_from_moments(c, node.out.c, m.moment_partials, m.moment_counts, blocks, sums);
          else
            batchnorm_sums(c, as_const(pre), sums);
          sync_batchnorm_sums(sums, node.out.c);
          if (moments)
            batchnorm_centered_squares_from_moments(c, node.out.c, m.moment_partials, m.moment_counts, blocks, sums,
                                                    total, squares);
          else
            batchnorm_centered_squares(c, as_const(pre), sums, total, squares);
          sync_batchnorm_sums(squares, node.out.c);
          batchnorm_activation_forward_from_sums(c, l.activation, as_const(pre), p + nb.s, p + nb.b, nb.out, sums,
                                                 squares, total, saved_mean, saved_var, running_mean, running_var);
        } else if (moments) {
          batchnorm_activation_forward_from_moments(
              c, l.activation, as_const(pre), p + nb.s, p + nb.b, nb.out, m.moment_partials, m.moment_counts,
              conv2d_forward_moment_blocks(m.precision, shape), saved_mean, saved_var, running_mean, running_var);
        } else {
          batchnorm_activation_forward_training(c, l.activation, as_const(pre), p + nb.s, p + nb.b, nb.out, saved_mean,
                                                saved_var, running_mean, running_var);
        }
        break;
      }
      case LayerType::Shortcut:
        shortcut_forward(c, in, input_of(node, 1), nb.out);
        break;
      case LayerType::Route: {
        if (node.inputs.size() == 1) break;  // the input itself
        ConstAct inputs[kRouteMaxInputs];
        for (size_t k = 0; k < node.inputs.size(); ++k) inputs[k] = input_of(node, k);
        route_forward(c, std::span<const ConstAct>(inputs, node.inputs.size()), nb.out);
        break;
      }
      case LayerType::Upsample:
        upsample_forward(c, in, nb.out, l.stride);
        break;
      case LayerType::Maxpool:
        maxpool_forward(c, in, nb.out, nb.argmax, l.size, l.stride);
        break;
      case LayerType::Yolo: {
        if (!training) break;
        NodeBuffers& producer = m.nodes[node.inputs[0]];
        YoloLossConfig config = node.yolo;
        config.grad_scale = m.loss_scale;
        config.grad_scale_at = m.loss_scale_at;  // GPUs: read when the kernel runs (a replayed graph)
        yolo_loss(c, in, config, truths, truth_counts, kYoloMaxTruths, grad_view(producer.grad, producer.out),
                  m.yolo_stats + node.index);
        break;
      }
      case LayerType::Connected: {
        int inputs = static_cast<int>(node.in.elements()), outputs = node.out.c;
        gemm(c, GemmShape{n, outputs, inputs, false, true}, in.data, m.weights_at(nb.w), p + nb.b, nb.out.data,
             false);  // in W^T + b
        if (l.activation != Activation::Linear) activation_forward(c, l.activation, as_const(nb.out), nb.out);
        break;
      }
      case LayerType::Softmax: {
        NodeBuffers& producer = m.nodes[node.inputs[0]];
        if (training)
          softmax_cross_entropy(c, in.data, labels, n, node.out.c, m.softmax_loss, producer.grad, nb.out.data,
                                m.bad_label, m.loss_scale, m.loss_scale_at);
        else  // the op wants labels even when it computes no loss
          softmax_cross_entropy(c, in.data, m.zero_labels, n, node.out.c, nullptr, nullptr, nb.out.data, m.bad_label);
        break;
      }
    }
    if (kNvtxRanges) nvtx_pop();
    if (tracing_) stream_->record(m.events[4 * node.index + 1]);
  }
}

void Executor::backward(bool accumulate) {
  Impl& m = *impl_;
  const int n = micro_batch_;
  const OpContext c = m.context(*stream_);
  float* p = m.params;
  float* g = accumulate ? m.micro_grads : m.grads;  // parameter gradients are written (=) by the ops
  const int L = static_cast<int>(graph_.nodes.size());
  for (NodeBuffers& nb : m.nodes) nb.first_writer_pending = true;
  for (const Node& node : graph_.nodes)
    if (node.consumers.empty() && m.nodes[node.index].grad)
      fill_bytes(m.nodes[node.index].grad, 0, static_cast<size_t>(n) * node.out.elements() * m.elem, *stream_);
  // A loss writes its input's gradient at forward time.
  for (const Node& node : graph_.nodes)
    if (node.spec.type == LayerType::Yolo || node.spec.type == LayerType::Softmax)
      m.nodes[node.inputs[0]].first_writer_pending = false;
  // Whether this writer adds to the gradient of producer `q` (false for its first writer).
  auto accumulate_into = [&](int q) {
    bool add = !m.nodes[q].first_writer_pending;
    m.nodes[q].first_writer_pending = false;
    return add;
  };
  for (int i = L - 1; i >= 0; --i) {
    const Node& node = graph_.nodes[i];
    NodeBuffers& nb = m.nodes[i];
    const LayerSpec& l = node.spec;
    if (l.type == LayerType::Yolo || l.type == LayerType::Softmax) continue;
    if (before_backward_) before_backward_(i);
    if (tracing_) stream_->record(m.events[4 * i + 2]);
    if (kNvtxRanges) nvtx_push(std::to_string(i) + " " + layer_type_name(l.type) + " backward");
    const bool has_params = nb.param_end > nb.param_begin;
    // A planted fault (emulated build only): the data-parallel driver hears of this layer's
    // gradients before its kernels are queued.
    const bool early = has_params && gradients_ready_ && fault_injected(Fault::AllReduceBeforeLastKernel);
    if (early) gradients_ready_(nb.param_end);
    Act grad = grad_view(nb.grad, nb.out);
    int q0 = node.inputs[0];
    Act grad_in = q0 == kNetworkInput ? Act{} : grad_view(m.nodes[q0].grad, m.nodes[q0].out);
    switch (l.type) {
      case LayerType::Convolutional: {
        Conv2dShape shape{n, node.in.h, node.in.w, node.in.c, node.out.c, l.size, l.stride};
        ConstAct in = q0 == kNetworkInput ? ConstAct{m.current_images, n, node.in.h, node.in.w, node.in.c, node.in.c}
                                          : as_const(m.nodes[q0].out);
        if (l.batch_normalize) {
          ConstAct pre{nb.pre, n, node.out.h, node.out.w, node.out.c, node.out.c};
          const float* saved_mean = m.saved + nb.saved;
          const float* saved_var = saved_mean + node.out.c;
          if (m.bn_comm) {
            // This replica's gamma/beta gradients stay local (the gradient all-reduce adds them);
            // the copy in sums2 is all-reduced for grad_x.
            const double total = static_cast<double>(pre.pixels()) * m.bn_comm->size();
            float* sums2 = static_cast<float*>(m.bn_scratch.data()) + 2 * node.out.c;
            batchnorm_activation_backward_sums(c, l.activation, as_const(nb.out), as_const(grad), pre, saved_mean,
                                               saved_var, g + nb.s, g + nb.b, sums2);
            sync_batchnorm_sums(sums2, 2 * node.out.c);
            batchnorm_activation_backward_apply(c, l.activation, as_const(nb.out), as_const(grad), pre, p + nb.s,
                                                saved_mean, saved_var, sums2, total, grad);
          } else {
            batchnorm_activation_backward(c, l.activation, as_const(nb.out), as_const(grad), pre, p + nb.s, saved_mean,
                                          saved_var, grad, g + nb.s, g + nb.b);
          }
        } else if (l.activation != Activation::Linear) {
          activation_backward(c, l.activation, as_const(nb.out), as_const(grad), grad);
        }
        conv2d_backward_weights(c, shape, in, as_const(grad), g + nb.w, l.batch_normalize ? nullptr : g + nb.b);
        if (q0 != kNetworkInput)
          conv2d_backward_data(c, shape, as_const(grad), m.weights_at(nb.w), grad_in, accumulate_into(q0));
        break;
      }
      case LayerType::Shortcut: {
        int q1 = node.inputs[1];
        Act grad_b = grad_view(m.nodes[q1].grad, m.nodes[q1].out);
        if (q0 == q1) {  // x + x: two contributions to one gradient
          shortcut_backward(c, as_const(grad), grad_in, Act{}, accumulate_into(q0), false);
          shortcut_backward(c, as_const(grad), grad_in, Act{}, true, false);
        } else {
          bool add_a = accumulate_into(q0), add_b = accumulate_into(q1);
          shortcut_backward(c, as_const(grad), grad_in, grad_b, add_a, add_b);
        }
        break;
      }
      case LayerType::Route: {
        int channel = 0;
        for (int q : node.inputs) {
          const Node& producer = graph_.nodes[q];
          ConstAct slice{m.advance(grad.data, channel), n, node.out.h, node.out.w, producer.out.c, node.out.c};
          Act target = grad_view(m.nodes[q].grad, m.nodes[q].out);
          route_backward(c, slice, std::span<const Act>(&target, 1), accumulate_into(q));
          channel += producer.out.c;
        }
        break;
      }
      case LayerType::Upsample:
        upsample_backward(c, as_const(grad), grad_in, l.stride, accumulate_into(q0));
        break;
      case LayerType::Maxpool:
        maxpool_backward(c, as_const(grad), nb.argmax, grad_in, l.size, l.stride, accumulate_into(q0));
        break;
      case LayerType::Connected: {
        int inputs = static_cast<int>(node.in.elements()), outputs = node.out.c;
        if (l.activation != Activation::Linear) activation_backward(c, l.activation, as_const(nb.out), as_const(grad), grad);
        const float* in = q0 == kNetworkInput ? m.current_images : m.nodes[q0].out.data;
        gemm(c, GemmShape{outputs, inputs, n, true, false}, grad.data, in, nullptr, g + nb.w, false);  // dW = grad^T in
        if (m.half)  // db = grad^T 1: the A^T B layout, which writes FP32 from 16-bit operands
          gemm(c, GemmShape{outputs, 1, n, true, false}, grad.data, m.ones16, nullptr, g + nb.b, false);
        else  // db = 1 grad
          gemm(c, GemmShape{1, outputs, n, false, false}, m.ones, grad.data, nullptr, g + nb.b, false);
        if (q0 != kNetworkInput)  // d in = grad W
          gemm(c, GemmShape{n, inputs, outputs, false, false}, grad.data, m.weights_at(nb.w), nullptr, grad_in.data,
               accumulate_into(q0));
        break;
      }
      default:
        break;
    }
    // This layer's parameter gradients are complete: add this micro-batch's to the earlier
    // ones, and tell the data-parallel driver the final prefix of the flat buffer.
    if (has_params) {
      if (accumulate) {
        size_t count = nb.param_end - nb.param_begin;
        Act sum = flat(m.grads + nb.param_begin, count);
        shortcut_forward(m.fp32_context(*stream_), as_const(sum), as_const(flat(m.micro_grads + nb.param_begin, count)),
                         sum);
      }
      if (gradients_ready_ && !early) gradients_ready_(nb.param_end);
    }
    if (kNvtxRanges) nvtx_pop();
    if (tracing_) stream_->record(m.events[4 * i + 3]);
  }
}

float* Executor::gradients() { return impl_->grads; }

void Executor::set_loss_scale(float scale) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    throw Error("set_loss_scale: " + std::to_string(scale) + " is not a positive finite scale");
  if (scale != 1.0f && !impl_->kernels) throw Error("set_loss_scale: loss scaling (fp16) runs on GPUs only");
  Impl& m = *impl_;
  if (scale == m.loss_scale) return;
  m.loss_scale = scale;
  // In the compute stream's order: the micro-batches queued after this call read it (a pageable
  // source is staged before copy_bytes returns).
  if (m.loss_scale_at) copy_bytes(m.loss_scale_at, &m.loss_scale, sizeof(float), stream_.get());
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
  m.zero(m.bad_label, sizeof(int));
  stream_->record_timing(m.marks[0]);
  forward(true);
  stream_->record_timing(m.marks[1]);
  backward(accumulate);
  stream_->record_timing(m.marks[2]);
}

void Executor::read_micro_batch_loss() {
  Impl& m = *impl_;
  set_current_device(device_);
  // The read-back below waits for the compute stream, which (--sync-bn) waits for other ranks:
  // wait for it first with the communicator's deadline.
  if (m.bn_comm) m.bn_comm->wait(*stream_);
  LossSums sums;
  sums.images = micro_batch_;
  for (const Node& node : graph_.nodes) {
    if (node.spec.type == LayerType::Yolo) {
      YoloLossStats s;
      // A planted fault (emulated build only): a copy that is not ordered after the stream.
      if (fault_injected(Fault::LossReadWithoutSync)) copy_bytes(&s, m.yolo_stats + node.index, sizeof s);
      else m.copy(&s, m.yolo_stats + node.index, sizeof s);
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
      m.copy(&loss, m.softmax_loss, sizeof loss);
      m.copy(&bad, m.bad_label, sizeof bad);  // CUDA kernels report a bad label here; the CPU op throws
      if (bad) throw Error("label of sample " + std::to_string(bad - 1) + " is outside [0, " +
                           std::to_string(node.out.c) + ")");
      sums.total += loss;
      sums.cls += loss;
      // Accuracy: argmax of the probabilities against the labels.
      std::vector<float> probs(static_cast<size_t>(micro_batch_) * node.out.c);
      std::vector<int> host_labels(static_cast<size_t>(micro_batch_));
      m.copy(probs.data(), m.nodes[node.index].out.data, probs.size() * sizeof(float));
      m.copy(host_labels.data(), m.in_labels, host_labels.size() * sizeof(int));
      for (int b = 0; b < micro_batch_; ++b) {
        const float* row = probs.data() + static_cast<size_t>(b) * node.out.c;
        sums.correct += (std::max_element(row, row + node.out.c) - row) == host_labels[b];
      }
    }
  }
  m.loss += sums;
  // The stream has passed the micro-batch's timing events: its forward and backward time.
  m.phases.forward_ms += m.marks[1].elapsed_ms_since(m.marks[0]);
  m.phases.backward_ms += m.marks[2].elapsed_ms_since(m.marks[1]);
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
  m.live_host = SgdLive{learning_rate, grad_scale, 0};
  copy_bytes(m.live, &m.live_host, sizeof(SgdLive), stream_.get());
}

void Executor::queue_update(float momentum, float decay) {
  Impl& m = *impl_;
  set_current_device(device_);
  const OpContext c = m.context(*stream_);
  // The step's values come from device memory (set_step_values) and the skip is decided there
  // (the update reads the flag), so nothing between the check and the update waits for the host.
  stream_->record_timing(m.marks[3]);
  grad_nonfinite_check(c, m.grads, param_count_, &m.live->nonfinite);
  SgdHyper hyper{0.0f, momentum, decay, 0.0f, m.live};
  sgd_update(c, m.params, m.grads, m.momentum, m.device_segments, static_cast<int>(m.segments.size()), 0, param_count_,
             hyper, m.half ? m.weights16 : nullptr);
  stream_->record_timing(m.marks[4]);
  m.update_marked = true;
}

bool Executor::update_applied() {
  Impl& m = *impl_;
  set_current_device(device_);
  int flag = 0;
  m.copy(&flag, &m.live->nonfinite, sizeof flag);
  if (m.update_marked) {
    // From the last backward's end: what the compute stream waited for (the all-reduces), then the update.
    m.phases.wait_ms += m.marks[3].elapsed_ms_since(m.marks[2]);
    m.phases.update_ms += m.marks[4].elapsed_ms_since(m.marks[3]);
    m.update_marked = false;
  }
  return flag == 0;
}

bool Executor::apply_update(float learning_rate, float momentum, float decay, float grad_scale) {
  set_step_values(learning_rate, grad_scale);
  queue_update(momentum, decay);
  return update_applied();
}

LossSums Executor::take_loss() {
  impl_->synchronize();
  LossSums out = impl_->loss;
  impl_->loss = LossSums{};
  return out;
}

std::vector<LayerParams> Executor::download_parameters() {
  Impl& m = *impl_;
  set_current_device(device_);
  m.copy(m.host_params.data(), m.params, param_count_ * sizeof(float));
  m.copy(m.host_stats.data(), m.stats, m.stat_count * sizeof(float));
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
    lp.weights = m.host_params.data() + nb.w;
    lp.biases = m.host_params.data() + nb.b;
    if (nb.s >= 0) lp.scales = m.host_params.data() + nb.s;
    if (nb.mean >= 0) {
      lp.rolling_mean = m.host_stats.data() + nb.mean;
      lp.rolling_variance = m.host_stats.data() + nb.var;
    }
    layers.push_back(lp);
  }
  return layers;
}

void Executor::upload_parameters() {
  Impl& m = *impl_;
  set_current_device(device_);
  m.copy(m.params, m.host_params.data(), param_count_ * sizeof(float));
  m.copy(m.stats, m.host_stats.data(), m.stat_count * sizeof(float));
  m.refresh_weight_copy(param_count_);
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
  std::vector<float> out(what == "stats" ? m.stat_count : param_count_);
  m.copy(out.data(), src, out.size() * sizeof(float));
  return out;
}

void Executor::upload(const std::string& what, const std::vector<float>& values) {
  Impl& m = *impl_;
  set_current_device(device_);
  float* dst = what == "params" ? m.params : what == "momentum" ? m.momentum : what == "stats" ? m.stats : nullptr;
  if (!dst) throw Error("upload: unknown buffer '" + what + "'");
  size_t expect = what == "stats" ? m.stat_count : param_count_;
  if (values.size() != expect)
    throw Error("upload of " + what + ": " + std::to_string(values.size()) + " values, the model has " +
                std::to_string(expect));
  m.copy(dst, values.data(), expect * sizeof(float));
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
