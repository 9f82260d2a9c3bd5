// The executor (see executor.h): plan, parameter layout, and the forward/backward/update
// passes over the op library (kernels/ops.h), every op queued on the replica's compute stream
// whatever the device. This file builds it: parameter layout, plan and arena, the views of
// every node, the multi-scale sizes. The rest: executor_plan.cpp (the memory plan),
// executor_forward.cpp, executor_backward.cpp, executor_steps.cpp (micro-batches, the update,
// loss, parameters, tracing, synchronised BatchNorm); executor_impl.h holds the shared state.
#include <algorithm>
#include <cmath>

#include "data/dataset.h"
#include "data/rng.h"
#include "graph/executor_impl.h"
#include "runtime/check.h"

namespace yolo::graph {

using namespace detail;

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

// ---- construction: parameters, plan, arena ----------------------------------------------------

namespace {

// Per node: a conv whose kernels read a BatchNorm-normalized input at every planned input size.
std::vector<char> convs_reading_normalized(const std::vector<Graph>& candidates, int n, Stream& stream,
                                           Precision precision) {
  const OpContext c{&stream, nullptr, 0, precision};
  std::vector<char> reads(candidates[0].nodes.size(), 1);
  for (const Graph& g : candidates)
    for (const Node& node : g.nodes) {
      const Conv2dShape s{n, node.in.h, node.in.w, node.in.c, node.out.c, node.spec.size, node.spec.stride};
      if (node.spec.type != LayerType::Convolutional || !conv2d_takes_normalized_input(c, s)) reads[node.index] = 0;
    }
  return reads;
}

}  // namespace

Executor::Executor(const Graph& graph, Device device, int micro_batch, uint64_t seed,
                   std::vector<std::pair<int, int>> other_sizes, Precision precision, bool fold_shortcuts,
                   bool apply_in_loads)
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
  // weights, then biases, then BN scales, each starting at a multiple of kParamAlignment elements
  // (the tensor-core kernels read weights in 16-byte chunks, and TMA's swizzled maps want
  // 128-byte aligned bases: a 255-channel head would otherwise shift every later layer). The
  // gaps are zeros that no op writes, each a segment of its own for the optimizer (it keeps them
  // zero); downloads and checkpoints see the parameters packed, without them.
  size_t offset = 0, stat_offset = 0, saved_offset = 0;
  for (int i = L - 1; i >= 0; --i) {
    const Node& node = graph.nodes[i];
    NodeBuffers& nb = m.nodes[i];
    auto take = [&](int64_t count, bool decay) {
      if (count == 0) return int64_t(-1);
      if (const size_t gap = (kParamAlignment - offset % kParamAlignment) % kParamAlignment) {
        m.segments.push_back(SgdSegment{offset, gap, false});
        offset += gap;
      }
      m.segments.push_back(SgdSegment{offset, static_cast<size_t>(count), decay});
      m.packed.push_back({offset, static_cast<size_t>(count)});
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
  for (const auto& range : m.packed) packed_count_ += range.second;
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
  m.plan = plan_activations(*largest, n, m.elem, m.kernels, m.kernels && fold_shortcuts,
                            m.kernels && apply_in_loads ? convs_reading_normalized(candidates, n, *stream_, precision)
                                                       : std::vector<char>{});
  size_t table_floats = 0;  // the applied-in-loads BatchNorms' tables (kernels/conv.h NormalizedInput)
  for (int q = 0; q < L; ++q)
    if (m.plan.applied_in_loads[q]) {
      m.nodes[q].table = static_cast<int64_t>(table_floats);
      table_floats += 4 * static_cast<size_t>(graph.nodes[q].out.c);
    }
  m.shortcut_folded.assign(L, 0);
  for (int q = 0; q < L; ++q)
    if (m.plan.folded_into[q] >= 0) m.shortcut_folded[m.plan.folded_into[q]] = 1;
  m.alias = m.plan.alias;
  plan_ = m.plan.buffers;
  const size_t f = sizeof(float);
  size_t activation_bytes = m.plan.bytes;

  size_t workspace = 0;
  for (const Graph& g : candidates) workspace = std::max(workspace, workspace_bytes(g, n, m.kernels, precision));

  memory_ = estimate_memory(*largest, n, precision);
  memory_.activations = m.plan.bytes;  // this device's plan
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
  size_t small = L * sizeof(YoloLossStats) + 64 + static_cast<size_t>(n) * f + m.segments.size() * sizeof(SgdSegment) +
                 table_floats * f;
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
  if (table_floats) m.load_tables = arena.allocate_array<float>(table_floats, "BatchNorm tables for the loads");
  for (Impl::ResultSlot& r : m.slots) {
    r.yolo_stats = arena.allocate_array<YoloLossStats>(static_cast<size_t>(L), "loss statistics");
    r.softmax_loss = arena.allocate_array<float>(1, "softmax loss");
    r.bad_label = arena.allocate_array<int>(1, "bad label");
    r.live = arena.allocate_array<SgdLive>(1, "optimizer step values");
  }
  m.zero_labels = arena.allocate_array<int>(static_cast<size_t>(n), "inference labels");
  if (moment_blocks) {
    m.moment_partials = arena.allocate_array<float>(moment_floats, "BatchNorm moments");
    m.moment_counts = arena.allocate_array<float>(moment_blocks, "BatchNorm moment counts");
  }
  if (m.kernels) {
    m.loss_scale_live = arena.allocate_array<LossScaleLive>(1, "loss scale");
    m.loss_scale_at = &m.loss_scale_live->scale;
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
  m.zero(m.grads, param_count_ * f);  // the gaps between segments: no op writes them
  m.zero(m.micro_grads, param_count_ * f);
  std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  m.copy(m.ones, ones.data(), ones.size() * f);
  if (m.half) to_storage(m.context(*stream_), m.ones, m.ones16, ones.size());
  m.refresh_weight_copy(param_count_);
  m.zero(m.zero_labels, static_cast<size_t>(n) * sizeof(int));
  for (Impl::ResultSlot& r : m.slots)  // read in one copy, heads and all between
    m.zero(r.yolo_stats, static_cast<size_t>(L) * sizeof(YoloLossStats));
  sgd_check_segments(m.segments.data(), static_cast<int>(m.segments.size()), 0, param_count_);
  m.copy(m.device_segments, m.segments.data(), m.segments.size() * sizeof(SgdSegment));
  if (m.loss_scale_at) m.copy(m.loss_scale_at, &m.loss_scale, sizeof(float));
  for (Impl::ResultSlot& r : m.slots)
    for (int k = 0; k < 5; ++k) r.marks.emplace_back(device_);
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
    if (p.out_buffer[root] < 0) {  // applied in its readers' loads: stored nowhere
      nb.out = Act{nullptr, n, node.out.h, node.out.w, node.out.c, node.out.c};
      continue;
    }
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

std::string Executor::folds_text() const {
  const detail::ActivationPlan& p = impl_->plan;
  const auto shortcuts = std::count_if(p.folded_into.begin(), p.folded_into.end(), [](int s) { return s >= 0; });
  const auto applies = std::count(p.applied_in_loads.begin(), p.applied_in_loads.end(), 1);
  if (shortcuts == 0 && applies == 0) return "";
  return "passes folded away: " + std::to_string(shortcuts) + " shortcuts added in their BatchNorm's apply, " +
         std::to_string(applies) + " BatchNorm applies done in the next convolutions' loads (--no-fold, "
         "--no-load-fold: run them)";
}

ConstAct Executor::output(int node) const {
  Impl& m = *impl_;
  ConstAct out = as_const(m.nodes.at(static_cast<size_t>(node)).out);
  if (!out.data) return out;  // a BatchNorm applied in its readers' loads has no stored output
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

}  // namespace yolo::graph
