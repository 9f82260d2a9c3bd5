// The executor's memory plan (see executor.h, plan.h): activation buffers packed by liveness,
// the workspace the ops need, and the memory estimate train_yolo prints.
#include <algorithm>
#include <cstdio>

#include "graph/executor_impl.h"
#include "runtime/check.h"

namespace yolo::graph {

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

namespace detail {

// elem: bytes of one stored activation (2 with bf16/fp16); softmax probabilities stay FP32.
int folded_residual(const Graph& graph, int conv, int shortcut) {
  const std::vector<int>& in = graph.nodes[shortcut].inputs;
  return in[0] == conv ? in[1] : in[0];
}

namespace {

// The conv a shortcut can fold into (see plan_activations), or -1.
int foldable_conv(const Graph& graph, const std::vector<Alias>& alias, int shortcut) {
  const Node& s = graph.nodes[shortcut];
  if (s.spec.type != LayerType::Shortcut || s.inputs.size() != 2 || s.inputs[0] == s.inputs[1]) return -1;
  for (int q : s.inputs) {
    const Node& conv = graph.nodes[q];
    const int other = folded_residual(graph, q, shortcut);
    if (conv.spec.type == LayerType::Convolutional && conv.spec.batch_normalize && conv.consumers.size() == 1 &&
        alias[q].root == q && other < q && conv.out == s.out)
      return q;
  }
  return -1;
}

// BatchNorm convs whose every reader is a conv that reads a normalized input (and reads nothing
// else: one input). Not one whose output is a route's slice or a folded shortcut's.
std::vector<char> applied_in_loads(const Graph& graph, const ActivationPlan& plan,
                                   const std::vector<char>& reads_normalized) {
  const size_t L = graph.nodes.size();
  std::vector<char> applied(L, 0);
  if (reads_normalized.empty()) return applied;
  for (size_t q = 0; q < L; ++q) {
    const Node& node = graph.nodes[q];
    bool ok = node.spec.type == LayerType::Convolutional && node.spec.batch_normalize && !node.consumers.empty() &&
              plan.alias[q].root == static_cast<int>(q) && plan.folded_into[q] < 0;
    for (int c : node.consumers) ok = ok && reads_normalized.at(static_cast<size_t>(c));
    applied[q] = ok;
  }
  return applied;
}

}  // namespace

ActivationPlan plan_activations(const Graph& graph, int n, size_t elem, bool bn_recomputes_output,
                                bool fold_shortcuts, const std::vector<char>& reads_normalized) {
  if ((fold_shortcuts || !reads_normalized.empty()) && !bn_recomputes_output)
    throw Error("internal error: a folded shortcut or apply needs the BatchNorm backward to recompute its output");
  const int L = static_cast<int>(graph.nodes.size());
  ActivationPlan plan;
  plan.alias.resize(L);
  plan.folded_into.assign(L, -1);
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

  // A folded conv writes the shortcut's output (and whatever that is aliased into) from its apply.
  for (int s = 0; fold_shortcuts && s < L; ++s) {
    const int q = foldable_conv(graph, plan.alias, s);
    if (q < 0) continue;
    plan.folded_into[q] = s;
    plan.alias[q] = plan.alias[s];
  }
  plan.applied_in_loads = applied_in_loads(graph, plan, reads_normalized);

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
    // An activation's backward reads its output, except BatchNorm's on GPUs (it recomputes it).
    bool needs_own_output = (node.spec.type == LayerType::Convolutional || node.spec.type == LayerType::Connected) &&
                            node.spec.activation != Activation::Linear &&
                            !(bn_recomputes_output && node.spec.batch_normalize);
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
    if (plan.alias[i].root == i && !loss && !plan.applied_in_loads[i])
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

}  // namespace detail

MemoryReport estimate_memory(const Graph& graph, int micro_batch, Precision precision) {
  const size_t elem = activation_bytes(precision);
  detail::ActivationPlan plan = detail::plan_activations(graph, micro_batch, elem);
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

}  // namespace yolo::graph
