// The static graph: a cfg's layers as nodes with their shapes inferred from the input size,
// their producers (route/shortcut edges), FLOPs and parameter counts; and the darknet-style
// summary table `train_yolo --summary` prints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "graph/cfg.h"
#include "kernels/precision.h"
#include "kernels/tc_plan.h"
#include "kernels/yolo_loss.h"

namespace yolo::graph {

// One image's activation shape (NHWC without the batch).
struct Shape {
  int h = 0, w = 0, c = 0;
  int64_t elements() const { return static_cast<int64_t>(h) * w * c; }
  bool operator==(const Shape&) const = default;
};

constexpr int kNetworkInput = -1;  // a producer index meaning the network's input

struct Node {
  int index = 0;
  LayerSpec spec;
  std::vector<int> inputs;  // producer node indices (kNetworkInput for the image)
  Shape in, out;            // in: the first input's shape
  double flops = 0;         // per image; a multiply-add counts 2 (darknet's BFLOPs)
  int64_t weights = 0, biases = 0, scales = 0, stats = 0;  // parameter counts (stats: BN running mean + var)
  std::vector<int> consumers;  // nodes that read this node's output, ascending
  YoloLossConfig yolo;         // [yolo] nodes
  int64_t trainable() const { return weights + biases + scales; }
};

struct Graph {
  std::string path;
  NetParams net;
  Shape input;
  std::vector<Node> nodes;
  double conv_flops = 0, total_flops = 0;  // per image
  int64_t trainable = 0, bn_stats = 0;
  int classes = 0;        // of the detection heads (0 without [yolo])
  bool detection = false; // has [yolo] heads (else: a classifier ending in [softmax])
};

// Builds the graph for an input of width x height (the cfg's by default). Errors name the
// cfg file and the layer's line: a route or shortcut index that points outside the layers
// before it, shapes that do not match (shortcut, route), a [yolo] whose input does not have
// mask_count * (classes + 5) channels or feeds anything else, [yolo] heads that disagree on
// classes, a [softmax] input that is not 1x1, a loss-less net, an input size that is not a
// multiple of 32 for a detector.
Graph build_graph(const ModelSpec& spec, int width = 0, int height = 0);

// darknet-style table: index, type, filters, size/stride, input -> output, BFLOPs; then totals.
std::string summary_table(const Graph& graph);
// The tensor-core planner's choice and predicted microseconds per conv layer and pass (kernels/
// tc_plan.h) at `micro_batch` in `precision` (tf32, bf16 or fp16) on `gpu`: `--summary`'s table.
std::string tc_plan_table(const Graph& graph, int micro_batch, Precision precision, const tc::GpuDesc& gpu);

}  // namespace yolo::graph
