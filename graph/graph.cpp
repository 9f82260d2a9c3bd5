// Shape inference, FLOPs and parameter counts for a cfg's layers (see graph.h).
#include "graph/graph.h"

#include <cstdio>
#include <sstream>

#include "kernels/conv.h"
#include "kernels/maxpool.h"
#include "runtime/check.h"

namespace yolo::graph {

namespace {

std::string at(const ModelSpec& spec, const LayerSpec& layer) { return spec.path + ":" + std::to_string(layer.line); }

std::string shape_text(const Shape& s) {
  return std::to_string(s.h) + "x" + std::to_string(s.w) + "x" + std::to_string(s.c);
}

// A layer index as written (negative: relative to `self`) made absolute and checked.
int resolve_index(const ModelSpec& spec, const LayerSpec& layer, int self, int written, const char* what) {
  int index = written < 0 ? self + written : written;
  if (index < 0 || index >= self)
    throw Error(at(spec, layer) + ": " + what + " " + std::to_string(written) + " of layer " + std::to_string(self) +
                " points to layer " + std::to_string(index) + ", but only layers 0.." + std::to_string(self - 1) +
                " come before it");
  return index;
}

}  // namespace

Graph build_graph(const ModelSpec& spec, int width, int height) {
  Graph graph;
  graph.path = spec.path;
  graph.net = spec.net;
  if (width > 0) graph.net.width = width;
  if (height > 0) graph.net.height = height;
  graph.input = Shape{graph.net.height, graph.net.width, graph.net.channels};
  const int count = static_cast<int>(spec.layers.size());
  if (count == 0) throw Error(spec.path + ": the cfg has no layers after [net]");

  for (int i = 0; i < count; ++i) {
    const LayerSpec& layer = spec.layers[i];
    Node node;
    node.index = i;
    node.spec = layer;
    auto previous = [&]() { return i == 0 ? kNetworkInput : i - 1; };
    auto shape_of = [&](int producer) { return producer == kNetworkInput ? graph.input : graph.nodes[producer].out; };
    switch (layer.type) {
      case LayerType::Convolutional: {
        node.inputs = {previous()};
        node.in = shape_of(node.inputs[0]);
        int pad = layer.size / 2;
        node.out = Shape{(node.in.h + 2 * pad - layer.size) / layer.stride + 1,
                         (node.in.w + 2 * pad - layer.size) / layer.stride + 1, layer.filters};
        if (node.out.h < 1 || node.out.w < 1)
          throw Error(at(spec, layer) + ": a " + std::to_string(layer.size) + "x" + std::to_string(layer.size) +
                      " convolution with stride " + std::to_string(layer.stride) + " has no output for input " +
                      shape_text(node.in));
        node.weights = static_cast<int64_t>(layer.filters) * layer.size * layer.size * node.in.c;
        node.biases = layer.filters;
        node.scales = layer.batch_normalize ? layer.filters : 0;
        node.stats = layer.batch_normalize ? 2 * layer.filters : 0;
        node.flops = 2.0 * node.weights * node.out.h * node.out.w;
        break;
      }
      case LayerType::Shortcut: {
        int from = resolve_index(spec, layer, i, layer.from, "from");
        node.inputs = {previous(), from};
        node.in = shape_of(node.inputs[0]);
        if (!(shape_of(from) == node.in))
          throw Error(at(spec, layer) + ": [shortcut] adds layer " + std::to_string(from) + " (" +
                      shape_text(shape_of(from)) + ") to layer " + std::to_string(i - 1) + " (" + shape_text(node.in) +
                      "): the shapes must be equal");
        node.out = node.in;
        break;
      }
      case LayerType::Route: {
        if (layer.layers.empty() || layer.layers.size() > 4)
          throw Error(at(spec, layer) + ": [route] takes 1 to 4 layers");
        for (int written : layer.layers) node.inputs.push_back(resolve_index(spec, layer, i, written, "layer"));
        node.in = shape_of(node.inputs[0]);
        node.out = Shape{node.in.h, node.in.w, 0};
        for (int p : node.inputs) {
          Shape s = shape_of(p);
          if (s.h != node.in.h || s.w != node.in.w)
            throw Error(at(spec, layer) + ": [route] joins layer " + std::to_string(node.inputs[0]) + " (" +
                        shape_text(node.in) + ") and layer " + std::to_string(p) + " (" + shape_text(s) +
                        "): heights and widths must be equal");
          node.out.c += s.c;
        }
        break;
      }
      case LayerType::Upsample:
        node.inputs = {previous()};
        node.in = shape_of(node.inputs[0]);
        node.out = Shape{node.in.h * layer.stride, node.in.w * layer.stride, node.in.c};
        break;
      case LayerType::Maxpool:
        node.inputs = {previous()};
        node.in = shape_of(node.inputs[0]);
        node.out = Shape{maxpool_output_size(node.in.h, layer.size, layer.stride),
                         maxpool_output_size(node.in.w, layer.size, layer.stride), node.in.c};
        break;
      case LayerType::Yolo: {
        node.inputs = {previous()};
        node.in = shape_of(node.inputs[0]);
        node.out = node.in;
        int expect = static_cast<int>(layer.mask.size()) * (layer.classes + 5);
        if (node.in.c != expect)
          throw Error(at(spec, layer) + ": [yolo] with " + std::to_string(layer.mask.size()) + " anchors and " +
                      std::to_string(layer.classes) + " classes needs " + std::to_string(layer.mask.size()) + " x (" +
                      std::to_string(layer.classes) + " + 5) = " + std::to_string(expect) +
                      " input channels, but layer " + std::to_string(node.inputs[0]) + " gives " +
                      std::to_string(node.in.c) + " (set filters=" + std::to_string(expect) + " there)");
        if (graph.detection && graph.classes != layer.classes)
          throw Error(at(spec, layer) + ": this [yolo] has classes=" + std::to_string(layer.classes) +
                      " but an earlier one has " + std::to_string(graph.classes));
        try {
          node.yolo = make_yolo_loss_config(layer.anchors, layer.mask, layer.classes, graph.net.width,
                                            graph.net.height, layer.ignore_thresh, layer.truth_thresh);
        } catch (const Error& e) {
          throw Error(at(spec, layer) + ": " + e.what());
        }
        graph.detection = true;
        graph.classes = layer.classes;
        break;
      }
      case LayerType::Connected:
        node.inputs = {previous()};
        node.in = shape_of(node.inputs[0]);
        node.out = Shape{1, 1, layer.output};
        node.weights = node.in.elements() * layer.output;
        node.biases = layer.output;
        node.flops = 2.0 * node.weights;
        break;
      case LayerType::Softmax:
        node.inputs = {previous()};
        node.in = shape_of(node.inputs[0]);
        if (node.in.h != 1 || node.in.w != 1)
          throw Error(at(spec, layer) + ": [softmax] needs a 1x1xC input (a [connected] layer), got " +
                      shape_text(node.in));
        node.out = node.in;
        break;
    }
    graph.nodes.push_back(std::move(node));
  }

  for (Node& node : graph.nodes)
    for (int p : node.inputs)
      if (p != kNetworkInput) graph.nodes[p].consumers.push_back(node.index);
  bool has_loss = false;
  for (const Node& node : graph.nodes) {
    bool loss = node.spec.type == LayerType::Yolo || node.spec.type == LayerType::Softmax;
    has_loss |= loss;
    // A loss writes its input's gradient directly: that input must feed nothing else.
    if (loss && (node.inputs[0] == kNetworkInput || graph.nodes[node.inputs[0]].consumers.size() != 1))
      throw Error(at(spec, node.spec) + ": the input of a [" + std::string(node.spec.type == LayerType::Yolo ? "yolo" : "softmax") +
                  "] layer must be a layer that feeds nothing else");
    if (loss && !node.consumers.empty())
      throw Error(at(spec, node.spec) + ": nothing may read the output of a loss layer (layer " +
                  std::to_string(node.consumers[0]) + " does)");
    if (node.spec.type == LayerType::Softmax && graph.detection)
      throw Error(at(spec, node.spec) + ": a net has either [yolo] heads or a [softmax], not both");
    graph.conv_flops += node.spec.type == LayerType::Convolutional ? node.flops : 0;
    graph.total_flops += node.flops;
    graph.trainable += node.trainable();
    graph.bn_stats += node.stats;
  }
  if (!has_loss) throw Error(spec.path + ": the net has no loss: it needs [yolo] layers or a final [softmax]");
  if (graph.detection && (graph.net.width % 32 || graph.net.height % 32))
    throw Error(spec.path + ": the input size " + std::to_string(graph.net.width) + "x" +
                std::to_string(graph.net.height) + " must be a multiple of 32 for a detector");
  return graph;
}

std::string summary_table(const Graph& graph) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%5s %-10s %7s %-13s %-16s    %-16s %9s\n", "layer", "type", "filters", "size/strd",
                "input", "output", "BFLOPs");
  out << line;
  auto hwc = [](const Shape& s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%4d x%4d x%5d", s.h, s.w, s.c);
    return std::string(buf);
  };
  for (const Node& node : graph.nodes) {
    const LayerSpec& l = node.spec;
    std::string filters, size, input = hwc(node.in);
    switch (l.type) {
      case LayerType::Convolutional:
        filters = std::to_string(l.filters);
        size = std::to_string(l.size) + " x" + std::to_string(l.size) + " /" + std::to_string(l.stride);
        break;
      case LayerType::Maxpool:
        size = std::to_string(l.size) + " x" + std::to_string(l.size) + " /" + std::to_string(l.stride);
        break;
      case LayerType::Upsample:
        size = "x" + std::to_string(l.stride);
        break;
      case LayerType::Shortcut:
        input = "layer " + std::to_string(node.inputs[1]);
        break;
      case LayerType::Route: {
        input.clear();
        for (int p : node.inputs) input += (input.empty() ? "" : " ") + std::to_string(p);
        break;
      }
      case LayerType::Connected:
        filters = std::to_string(l.output);
        break;
      default:
        break;
    }
    std::snprintf(line, sizeof line, "%5d %-10s %7s %-13s %-16s -> %-16s %9.3f\n", node.index, layer_type_name(l.type),
                  filters.c_str(), size.c_str(), input.c_str(), hwc(node.out).c_str(), node.flops / 1e9);
    out << line;
  }
  int counts[8] = {};
  for (const Node& node : graph.nodes) ++counts[static_cast<int>(node.spec.type)];
  std::snprintf(line, sizeof line,
                "%zu layers (%d conv, %d shortcut, %d route, %d upsample, %d maxpool, %d yolo, %d connected, %d "
                "softmax) at %dx%dx%d\n",
                graph.nodes.size(), counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
                counts[7], graph.input.h, graph.input.w, graph.input.c);
  out << line;
  std::snprintf(line, sizeof line, "BFLOPs per image: %.3f in conv layers, %.3f in all\n", graph.conv_flops / 1e9,
                graph.total_flops / 1e9);
  out << line;
  std::snprintf(line, sizeof line,
                "parameters: %lld trainable + %lld BatchNorm running statistics = %lld values in a .weights file\n",
                static_cast<long long>(graph.trainable), static_cast<long long>(graph.bn_stats),
                static_cast<long long>(graph.trainable + graph.bn_stats));
  out << line;
  return out.str();
}

std::string tc_plan_table(const Graph& graph, int micro_batch, Precision precision, const tc::GpuDesc& gpu) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line,
                "tensor-core plans on %s (sm_%d, %d SMs), %s, micro-batch %d: plan and predicted us (small: on CUDA "
                "cores, few input channels)\n",
                gpu.name.c_str(), gpu.cc, gpu.sms, precision_name(precision), micro_batch);
  out << line;
  std::snprintf(line, sizeof line, "%5s %-16s %-16s %-16s\n", "layer", "fwd", "bwd data", "bwd weights");
  out << line;
  double total_us = 0;
  for (const Node& node : graph.nodes) {
    if (node.spec.type != LayerType::Convolutional) continue;
    const Conv2dShape s{micro_batch, node.in.h, node.in.w, node.in.c, node.out.c, node.spec.size, node.spec.stride};
    std::string cells[3];
    const tc::TcPass passes[3] = {tc::TcPass::Forward, tc::TcPass::BackwardData, tc::TcPass::BackwardWeights};
    for (int i = 0; i < 3; ++i) {
      if (passes[i] == tc::TcPass::BackwardData && node.inputs[0] == kNetworkInput) {
        cells[i] = "-";  // the image needs no gradient
        continue;
      }
      if (passes[i] != tc::TcPass::BackwardData && conv2d_tc_small_channels(s)) {
        cells[i] = "small";  // CUDA cores: an input of few channels (kernels/conv_small_c.h)
        continue;
      }
      const tc::TcProblem problem = conv2d_tc_problem(s, passes[i], precision);
      const tc::TcPlan plan = tc::choose_plan(problem, gpu);
      char cell[32];
      const double us = tc::predict(problem, plan, gpu).total_us;
      total_us += us;
      std::snprintf(cell, sizeof cell, "%-7s %6.0f", tc::plan_code(plan).c_str(), us);
      cells[i] = cell;
    }
    std::snprintf(line, sizeof line, "%5d %-16s %-16s %-16s\n", node.index, cells[0].c_str(), cells[1].c_str(),
                  cells[2].c_str());
    out << line;
  }
  std::snprintf(line, sizeof line, "predicted sum of the tensor-core passes: %.2f ms a micro-batch\n", total_us / 1000);
  out << line;
  return out.str();
}

}  // namespace yolo::graph
