// Finding a step's first non-finite value (see divergence.h).
#include "graph/divergence.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/memory.h"

namespace yolo::graph {
namespace {

bool finite(const float* values, size_t count) {
  bool ok = true;
  for (size_t i = 0; i < count; ++i) ok &= std::isfinite(values[i]);
  return ok;
}

bool layer_params_finite(const LayerParams& l) {
  const size_t n = static_cast<size_t>(l.c_out);
  bool ok = finite(l.weights, l.weight_count()) && finite(l.biases, n);
  if (l.batch_normalize) ok = ok && finite(l.scales, n) && finite(l.rolling_mean, n) && finite(l.rolling_variance, n);
  return ok;
}

bool output_finite(Executor& executor, int node) {
  const ConstAct out = executor.output(node);
  const size_t pixels = out.pixels();
  if (pixels == 0 || !out.data) return true;
  const size_t stride = static_cast<size_t>(out.stride), channels = static_cast<size_t>(out.c);
  std::vector<float> host((pixels - 1) * stride + channels);
  copy_and_wait(host.data(), out.data, host.size() * sizeof(float), executor.compute_stream());
  bool ok = true;
  for (size_t p = 0; p < pixels; ++p) ok &= finite(host.data() + p * stride, channels);
  return ok;
}

}  // namespace

uint64_t NonFinite::code() const {
  if (layer < 0) return kNone;
  if (kind == Gradients) return (uint64_t{1} << 40) + static_cast<uint64_t>(layer);
  return static_cast<uint64_t>(layer) * 2 + static_cast<uint64_t>(kind);
}

NonFinite NonFinite::from_code(uint64_t code) {
  if (code == kNone) return NonFinite{};
  if (code >= (uint64_t{1} << 40)) return NonFinite{static_cast<int>(code - (uint64_t{1} << 40)), Gradients};
  return NonFinite{static_cast<int>(code / 2), code % 2 ? Output : Parameters};
}

std::string NonFinite::text(const Graph& graph) const {
  if (layer < 0) return "no layer (every parameter, output and gradient read back was finite)";
  const std::string name = "layer " + std::to_string(layer) + " (" +
                           layer_type_name(graph.nodes.at(static_cast<size_t>(layer)).spec.type) + ")";
  switch (kind) {
    case Parameters:
      return name + "'s parameters";
    case Output:
      return name + "'s output";
    default:
      return "the gradients of " + name + " (forward was finite; backward produced the first one there)";
  }
}

NonFinite find_non_finite_forward(const Graph& graph, Executor& executor) {
  std::vector<LayerParams> params = executor.download_parameters();
  size_t next_params = 0;
  for (const Node& node : graph.nodes) {
    while (next_params < params.size() && params[next_params].layer < node.index) ++next_params;
    if (next_params < params.size() && params[next_params].layer == node.index &&
        !layer_params_finite(params[next_params]))
      return NonFinite{node.index, NonFinite::Parameters};
    if (!output_finite(executor, node.index)) return NonFinite{node.index, NonFinite::Output};
  }
  return NonFinite{};
}

NonFinite find_non_finite_gradients(const Graph& graph, Executor& executor) {
  // The flat gradients are in backward order: the last layer's first (executor.h).
  const std::vector<float> grads = executor.download("grads");
  size_t offset = 0;
  for (auto node = graph.nodes.rbegin(); node != graph.nodes.rend(); ++node) {
    const size_t count = static_cast<size_t>(node->trainable());
    if (count > 0 && offset + count <= grads.size() && !finite(grads.data() + offset, count))
      return NonFinite{node->index, NonFinite::Gradients};
    offset += count;
  }
  return NonFinite{};
}

void DivergenceWatch::step_done(int64_t step, bool skipped, const std::vector<uint64_t>& findings) {
  const bool checked = check_due();
  if (!skipped) {
    in_a_row_ = 0;
    return;
  }
  last_ = step;
  if (in_a_row_++ == 0) {
    first_ = step;
    located_step_ = 0;
  } else if (checked && !findings.empty()) {  // the earliest finding in forward order wins
    const auto earliest = std::min_element(findings.begin(), findings.end());
    found_ = NonFinite::from_code(*earliest);
    found_rank_ = static_cast<int>(earliest - findings.begin());
    located_step_ = step;
  }
}

std::string DivergenceWatch::message(const Graph& graph, bool ranks) const {
  const std::string where = ranks ? " on rank " + std::to_string(found_rank_) : "";
  const std::string located =
      located_step_ > 0
          ? "The first non-finite value, in forward order" + where + ", was in " + found_.text(graph) + " at step " +
                std::to_string(located_step_) + " (the per-layer check runs on the second skipped step)"
          : "The layer is not named: the per-layer check runs on the second skipped step in a row "
            "(--max-skipped-steps 2 or more)";
  return "training diverged: " + std::to_string(in_a_row_) + " steps in a row (" + std::to_string(first_) + " to " +
         std::to_string(last_) + ") were skipped for NaN or infinite gradients (--max-skipped-steps " +
         std::to_string(max_skipped_) + "). " + located +
         ". Usual remedies: a lower learning_rate, a longer burn_in (both in [net]), or resuming from an earlier "
         "checkpoint";
}

bool state_finite(Executor& executor) {
  for (const char* what : {"params", "momentum", "stats"}) {
    const std::vector<float> values = executor.download(what);
    if (!finite(values.data(), values.size())) return false;
  }
  return true;
}

}  // namespace yolo::graph
