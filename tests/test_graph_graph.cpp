// cfg -> graph: shapes, FLOPs and parameter counts of the real architectures, .weights sizes,
// the memory plan, and shape errors that name the cfg line.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "graph/executor.h"
#include "graph/executor_impl.h"
#include "graph/graph.h"
#include "graph/weights.h"
#include "runtime/check.h"

using namespace yolo;
using namespace yolo::graph;

namespace {

// Parameter descriptions (no data) of every conv/connected layer, for .weights sizes.
std::vector<LayerParams> layer_shapes(const Graph& graph) {
  std::vector<LayerParams> layers;
  for (const Node& node : graph.nodes) {
    if (node.spec.type != LayerType::Convolutional && node.spec.type != LayerType::Connected) continue;
    LayerParams lp;
    lp.layer = node.index;
    lp.type = node.spec.type;
    lp.c_out = node.out.c;
    lp.c_in = node.in.c;
    lp.k = node.spec.type == LayerType::Convolutional ? node.spec.size : 1;
    if (node.spec.type == LayerType::Connected) {
      lp.in_h = node.in.h;
      lp.in_w = node.in.w;
    }
    lp.batch_normalize = node.spec.batch_normalize;
    layers.push_back(lp);
  }
  return layers;
}

int count_type(const Graph& graph, LayerType type) {
  int n = 0;
  for (const Node& node : graph.nodes) n += node.spec.type == type;
  return n;
}

std::string error_of(const std::string& cfg_text) {
  try {
    build_graph(parse_model(parse_cfg_text(cfg_text, "bad.cfg")));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("YOLOv3 at 416: 107 layers, 65.864 conv BFLOPs, 61,949,149 parameters, 248,007,048-byte .weights") {
  Graph graph = build_graph(read_model("models/yolov3.cfg"));
  CHECK(graph.nodes.size() == 107);
  CHECK(count_type(graph, LayerType::Convolutional) == 75);
  CHECK(count_type(graph, LayerType::Shortcut) == 23);
  CHECK(count_type(graph, LayerType::Route) == 4);
  CHECK(count_type(graph, LayerType::Upsample) == 2);
  CHECK(count_type(graph, LayerType::Yolo) == 3);
  CHECK(std::round(graph.conv_flops / 1e6) / 1e3 == doctest::Approx(65.864).epsilon(1e-9));
  CHECK(graph.trainable == 61949149);
  CHECK(graph.bn_stats == 52608);
  CHECK(darknet_weights_bytes(layer_shapes(graph)) == 248007048ull);
  // The heads: 13x13, 26x26, 52x52 with 255 channels.
  CHECK(graph.nodes[82].out == Shape{13, 13, 255});
  CHECK(graph.nodes[94].out == Shape{26, 26, 255});
  CHECK(graph.nodes[106].out == Shape{52, 52, 255});
  std::string table = summary_table(graph);
  CHECK(table.find("65.864 in conv layers") != std::string::npos);
  CHECK(table.find("61949149 trainable + 52608 BatchNorm running statistics = 62001757") != std::string::npos);

  Graph at608 = build_graph(read_model("models/yolov3.cfg"), 608, 608);
  CHECK(std::round(at608.conv_flops / 1e7) / 1e2 == doctest::Approx(140.69).epsilon(1e-9));
  CHECK(at608.nodes[82].out == Shape{19, 19, 255});
}

TEST_CASE("YOLOv3-tiny at 416: 24 layers, 5.565 conv BFLOPs, 8,858,734 values, 35,434,956-byte .weights") {
  Graph graph = build_graph(read_model("models/yolov3-tiny.cfg"));
  CHECK(graph.nodes.size() == 24);
  CHECK(std::round(graph.conv_flops / 1e6) / 1e3 == doctest::Approx(5.565).epsilon(1e-9));
  CHECK(graph.trainable + graph.bn_stats == 8858734);
  CHECK(darknet_weights_bytes(layer_shapes(graph)) == 35434956ull);
}

TEST_CASE("the MNIST MLP and the demo net build; the MLP is 784-4096-2048-512-64-10") {
  Graph mlp = build_graph(read_model("models/mnist-mlp.cfg"));
  CHECK_FALSE(mlp.detection);
  std::vector<int> widths;
  for (const Node& node : mlp.nodes)
    if (node.spec.type == LayerType::Connected) widths.push_back(node.out.c);
  CHECK(mlp.input.elements() == 784);
  CHECK(widths == std::vector<int>{4096, 2048, 512, 64, 10});
  Graph demo = build_graph(read_model("models/demo.cfg"));
  CHECK(demo.detection);
  CHECK(demo.classes == 3);
}

TEST_CASE("memory plan of YOLOv3: no two live buffers overlap, and liveness saves memory") {
  Graph graph = build_graph(read_model("models/yolov3.cfg"));
  MemoryReport report = estimate_memory(graph, 4);
  CHECK(report.activations < report.activations_unplanned * 2 / 3);
  CHECK(report.parameters == 61949149ull * 4);
  CHECK(report.text().find("activations") != std::string::npos);
}

TEST_CASE("memory plan on GPUs: a BatchNorm output lives until its last reader, not its own backward (recomputed)") {
  Graph graph = build_graph(read_model("models/yolov3.cfg"));  // 416 x 416
  const int L = static_cast<int>(graph.nodes.size());
  const detail::ActivationPlan kept = detail::plan_activations(graph, 16, 2, false),
                               recomputed = detail::plan_activations(graph, 16, 2, true);
  MESSAGE("YOLOv3-416 batch 16, bf16 activations: " << kept.bytes / 1048576.0 << " MiB keeping BatchNorm outputs, "
                                                    << recomputed.bytes / 1048576.0 << " MiB recomputing them");
  CHECK(recomputed.bytes < kept.bytes);
  int shortcut_fed = 0;
  for (const Node& node : graph.nodes) {
    const int i = node.index;
    if (node.spec.type != LayerType::Convolutional || !node.spec.batch_normalize || node.consumers.size() != 1 ||
        graph.nodes[node.consumers[0]].spec.type != LayerType::Shortcut)
      continue;
    CAPTURE(i);
    ++shortcut_fed;
    REQUIRE(kept.out_buffer[i] >= 0);
    REQUIRE(recomputed.out_buffer[i] >= 0);
    CHECK(kept.buffers[kept.out_buffer[i]].last == 2 * L - 1 - i);  // its own backward read it
    CHECK(recomputed.buffers[recomputed.out_buffer[i]].last == node.consumers[0]);
  }
  CHECK(shortcut_fed == 23);  // every residual block's second convolution
}

TEST_CASE("memory plan of YOLOv3-416 in bf16/fp16: activations at most 55% of fp32's, plus the 16-bit weight copy") {
  Graph graph = build_graph(read_model("models/yolov3.cfg"));  // 416 x 416
  const MemoryReport fp32 = estimate_memory(graph, 16), bf16 = estimate_memory(graph, 16, Precision::Bf16),
                     fp16 = estimate_memory(graph, 16, Precision::Fp16);
  const double ratio = double(bf16.activations) / double(fp32.activations);
  MESSAGE("YOLOv3-416 batch 16 activations: fp32 " << fp32.activations / 1048576.0 << " MiB, bf16 "
                                                   << bf16.activations / 1048576.0 << " MiB (" << ratio << ")");
  CHECK(ratio <= 0.55);  // the target: 16-bit activations, gradients and input
  CHECK(ratio >= 0.45);  // and not less than half: only the storage type changed
  CHECK(fp16.activations == bf16.activations);
  CHECK(bf16.weight_copy == 61949149ull * 2);
  CHECK(fp32.weight_copy == 0);
  CHECK(bf16.total == 4 * bf16.parameters + bf16.weight_copy + bf16.statistics + bf16.activations);
  CHECK(bf16.text().find("memory plan (bf16)") != std::string::npos);
  CHECK(bf16.text().find("16-bit copy") != std::string::npos);
}

TEST_CASE("memory plan: the [yolo] heads' inputs survive the whole forward pass (inference reads them after)") {
  Graph graph = build_graph(read_model("models/demo.cfg"));
  Executor executor(graph, Device::cpu(), 1, 1);
  const int last = 2 * static_cast<int>(graph.nodes.size()) - 1;
  int heads = 0;
  for (const Node& node : graph.nodes) {
    if (node.spec.type != LayerType::Yolo) continue;
    ++heads;
    std::string tag = "out " + std::to_string(node.inputs[0]);
    bool found = false;
    for (const PlannedBuffer& b : executor.plan())
      if (b.tag == tag) {
        found = true;
        CHECK(b.last == last);
      }
    CHECK(found);
  }
  CHECK(heads == 2);
}

TEST_CASE("shape errors name the cfg line and what to change") {
  const std::string head = "[net]\nwidth=64\nheight=64\nchannels=3\n";
  // Route to a layer that does not exist yet (line 9 is the [route] header).
  CHECK(error_of(head + "[convolutional]\nfilters=4\nsize=1\nactivation=linear\n[route]\nlayers=3\n")
            .find("bad.cfg:9: layer 3 of layer 1 points to layer 3") != std::string::npos);
  // A [yolo] fed the wrong number of channels.
  std::string yolo = head + "[convolutional]\nfilters=20\nsize=1\nactivation=linear\n[yolo]\nmask=0,1\nanchors=1,1,2,2\n"
                            "num=2\nclasses=3\n";
  CHECK(error_of(yolo).find("bad.cfg:9: [yolo] with 2 anchors and 3 classes needs 2 x (3 + 5) = 16 input channels") !=
        std::string::npos);
  CHECK(error_of(yolo).find("set filters=16") != std::string::npos);
  // A shortcut joining different shapes.
  std::string shortcut = head +
                         "[convolutional]\nfilters=4\nsize=1\nactivation=linear\n"
                         "[convolutional]\nfilters=8\nsize=1\nactivation=linear\n[shortcut]\nfrom=-2\n";
  CHECK(error_of(shortcut).find("bad.cfg:13: [shortcut] adds layer 0 (64x64x4) to layer 1 (64x64x8)") !=
        std::string::npos);
  // No loss layer.
  CHECK(error_of(head + "[convolutional]\nfilters=4\nsize=1\nactivation=linear\n").find("no loss") !=
        std::string::npos);
}
