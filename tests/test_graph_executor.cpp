// The executor on the CPU backend: whole-network gradients against finite differences, the
// memory plan, micro-batch accumulation, a few steps lowering the loss, and resume == an
// uninterrupted run (bit-exact).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/json.h"
#include "data/synthetic.h"
#include "graph/executor.h"
#include "graph/plan.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::Rng;
using yolo::testing::TempDir;
using yolo::testing::file_bytes;
using yolo::testing::kTinyDetectorCfg;

namespace {

ModelSpec model_from_text(const std::string& text) { return parse_model(parse_cfg_text(text, "test.cfg")); }

// A classifier exercising every layer type but [yolo]: conv (with and without BN), maxpool,
// upsample, route (two inputs, one written in place), shortcut, connected, softmax. Smooth
// activations, so finite differences do not straddle a kink (the piecewise-linear ones are
// checked op by op in the kernel tests).
const char* kClassifierCfg = R"(
[net]
batch=4
subdivisions=1
width=8
height=8
channels=3
learning_rate=0.01
max_batches=10
[convolutional]
batch_normalize=1
filters=5
size=3
stride=1
pad=1
activation=logistic
[maxpool]
size=2
stride=2
[convolutional]
filters=6
size=3
stride=1
pad=1
activation=logistic
[upsample]
stride=2
[route]
layers=-1,0
[convolutional]
batch_normalize=1
filters=11
size=1
stride=1
pad=1
activation=linear
[convolutional]
batch_normalize=1
filters=11
size=3
stride=2
pad=1
activation=logistic
[convolutional]
filters=11
size=3
stride=2
pad=1
activation=logistic
[upsample]
stride=2
[shortcut]
from=-3
activation=linear
[connected]
output=7
activation=logistic
[connected]
output=3
activation=linear
[softmax]
groups=1
)";

}  // namespace

TEST_CASE("plan: buffers alive at the same time never share bytes; dead ones are reused") {
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<PlannedBuffer> buffers;
  for (int i = 0; i < 60; ++i) {
    int a = rng.integer(0, 40), b = rng.integer(0, 40);
    buffers.push_back(PlannedBuffer{"b" + std::to_string(i), static_cast<size_t>(rng.integer(0, 5000)),
                                    std::min(a, b), std::max(a, b), 0});
  }
  size_t total = plan_buffers(buffers, 64);
  std::string conflict;
  CHECK_FALSE(find_plan_conflict(buffers, &conflict));
  size_t sum = 0;
  for (const PlannedBuffer& b : buffers) {
    CHECK(b.offset % 64 == 0);
    CHECK(b.offset + b.bytes <= total);
    sum += b.bytes;
  }
  CHECK(total < sum);  // some reuse happened
  // The checker itself finds a planted overlap.
  buffers[1].first = buffers[0].first;
  buffers[1].last = buffers[0].last;
  buffers[1].offset = buffers[0].offset;
  buffers[0].bytes = buffers[1].bytes = 100;
  CHECK(find_plan_conflict(buffers, &conflict));

  std::vector<PlannedBuffer> two{{"a", 1000, 0, 3, 0}, {"b", 1000, 4, 9, 0}};
  CHECK(plan_buffers(two, 256) == 1024);
  CHECK(two[0].offset == two[1].offset);
}

TEST_CASE("executor: each layer's parameters start kParamAlignment-aligned; downloads stay packed (stock YOLOv3)") {
  // The stock cfg's 255-channel heads (255 * (c_in + 1) parameters each) put every later layer
  // at an odd offset when the layers lie back to back: its 16-bit weights then fail the tensor
  // cores' 16-byte loads, and TMA's swizzled maps want 128-byte bases.
  const Graph graph = build_graph(read_model("models/yolov3.cfg"), 64, 64);
  Executor ex(graph, Device::cpu(), 1, 3);
  std::vector<LayerParams> layers = ex.download_parameters();
  REQUIRE(layers.size() == 75);
  const float* base = layers.back().weights;  // the last layer's weights come first
  size_t packed = 0;
  for (const LayerParams& l : layers) {
    CAPTURE(l.layer);
    for (const float* p : {l.weights, l.biases, l.scales})
      if (p) CHECK((p - base) % ptrdiff_t(kParamAlignment) == 0);
    packed += l.weight_count() + size_t(l.c_out) * (l.batch_normalize ? 2 : 1);
  }
  CHECK(ex.packed_parameter_count() == packed);
  CHECK(ex.parameter_count() > packed);  // the gaps
  // Packed as the layers lay before (a checkpoint's tensors): in backward order, each layer's
  // weights, biases, scales.
  std::vector<float> expect;
  for (auto l = layers.rbegin(); l != layers.rend(); ++l) {
    expect.insert(expect.end(), l->weights, l->weights + l->weight_count());
    expect.insert(expect.end(), l->biases, l->biases + l->c_out);
    if (l->scales) expect.insert(expect.end(), l->scales, l->scales + l->c_out);
  }
  const std::vector<float> params = ex.download("params");
  CHECK(params == expect);
  // An upload in that order lands in each layer's place, and the gaps stay zero.
  std::vector<float> changed = params;
  for (size_t i = 0; i < changed.size(); ++i) changed[i] = float(i % 1000) * 0.001f;
  ex.upload("params", changed);
  CHECK(ex.download("params") == changed);
  layers = ex.download_parameters();
  CHECK(layers.back().weights[0] == changed[0]);
  std::vector<bool> covered(ex.parameter_count(), false);  // the flat buffer (CPU: host memory) outside them: zeros
  for (const LayerParams& l : layers) {
    const float* mirror = layers.back().weights;
    std::fill_n(covered.begin() + (l.weights - mirror), l.weight_count(), true);
    std::fill_n(covered.begin() + (l.biases - mirror), l.c_out, true);
    if (l.scales) std::fill_n(covered.begin() + (l.scales - mirror), l.c_out, true);
  }
  size_t nonzero_gaps = 0;
  for (size_t i = 0; i < covered.size(); ++i) nonzero_gaps += !covered[i] && ex.parameters()[i] != 0.0f;
  CHECK(nonzero_gaps == 0);
  const auto ranges = ex.layer_parameter_ranges();
  REQUIRE(ranges.size() == 75);
  CHECK(ranges.front().first == 0);
  CHECK(ranges.back().second == ex.parameter_count());
  for (size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i].first == ranges[i - 1].second);
}

TEST_CASE("executor: whole-network gradients match finite differences (CPU, every layer type)") {
  Rng rng;
  CAPTURE(rng.seed());
  ModelSpec spec = model_from_text(kClassifierCfg);
  Graph graph = build_graph(spec);
  const int n = 3;
  Executor ex(graph, Device::cpu(), n, rng.seed());
  std::vector<float> images = rng.floats(static_cast<size_t>(n) * 8 * 8 * 3, 0, 1);
  std::vector<int> labels{0, 2, 1};
  auto loss_now = [&]() {
    ex.train_micro_batch(images.data(), nullptr, nullptr, labels.data(), false);
    return ex.take_loss().total;
  };
  loss_now();
  std::vector<float> grads = ex.download("grads");
  std::vector<float> params = ex.download("params");
  REQUIRE(grads.size() == params.size());
  // Parameters of every layer: the flat layout is layers in reverse, each layer's weights,
  // biases, then BN scales (executor.h). Two random entries of each segment.
  std::vector<std::pair<size_t, size_t>> segments;  // (offset, count)
  size_t offset = 0;
  for (int i = static_cast<int>(graph.nodes.size()) - 1; i >= 0; --i)
    for (int64_t count : {graph.nodes[i].weights, graph.nodes[i].biases, graph.nodes[i].scales})
      if (count) {
        segments.emplace_back(offset, static_cast<size_t>(count));
        offset += static_cast<size_t>(count);
      }
  REQUIRE(offset == params.size());
  int checked = 0, bad = 0;
  for (const auto& [begin, count] : segments)
    for (int pick = 0; pick < 2; ++pick) {
      size_t k = begin + static_cast<size_t>(rng.integer(0, static_cast<int>(count) - 1));
      const float eps = 1e-3f;
      std::vector<float> p = params;
      p[k] = params[k] + eps;
      ex.upload("params", p);
      double up = loss_now();
      p[k] = params[k] - eps;
      ex.upload("params", p);
      double down = loss_now();
      double numeric = (up - down) / (2 * eps);
      if (!yolo::testing::close(grads[k], numeric, 2e-3, 5e-2)) {
        ++bad;
        MESSAGE("param " << k << ": analytic " << grads[k] << " numeric " << numeric);
      }
      ++checked;
    }
  ex.upload("params", params);
  // A perturbation can still flip a maxpool window's winner (a kink): allow one such sample.
  CHECK(bad <= 1);
  CHECK(checked == 2 * static_cast<int>(segments.size()));
}

TEST_CASE("executor: two micro-batches accumulate to the gradient of the whole batch (no BatchNorm)") {
  Rng rng;
  ModelSpec spec = model_from_text(R"(
[net]
batch=6
subdivisions=1
inputs=10
max_batches=1
[connected]
output=9
activation=leaky
[connected]
output=4
activation=linear
[softmax]
)");
  Graph graph = build_graph(spec);
  std::vector<float> images = rng.floats(6 * 10, -1, 1);
  std::vector<int> labels{0, 1, 2, 3, 1, 0};
  Executor whole(graph, Device::cpu(), 6, 5);
  whole.train_micro_batch(images.data(), nullptr, nullptr, labels.data(), false);
  std::vector<float> expect = whole.download("grads");
  // The probabilities survive the backward pass (their buffer is not reused), and inference
  // (no BatchNorm here) gives the same ones.
  const int last = static_cast<int>(graph.nodes.size()) - 1;
  std::vector<float> trained(whole.output(last).data, whole.output(last).data + 6 * 4);
  for (int b = 0; b < 6; ++b) {
    double sum = 0;
    for (int c = 0; c < 4; ++c) sum += trained[b * 4 + c];
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
  }
  whole.infer(images.data());
  for (int k = 0; k < 24; ++k) CHECK(whole.output(last).data[k] == trained[k]);
  Executor halves(graph, Device::cpu(), 3, 5);
  halves.train_micro_batch(images.data(), nullptr, nullptr, labels.data(), false);
  halves.train_micro_batch(images.data() + 30, nullptr, nullptr, labels.data() + 3, true);
  std::vector<float> got = halves.download("grads");
  REQUIRE(got.size() == expect.size());
  for (size_t k = 0; k < got.size(); ++k) CHECK(yolo::testing::close(got[k], expect[k], 1e-5, 1e-4));
  CHECK(std::abs(whole.take_loss().total - halves.take_loss().total) < 1e-4);
}

namespace {



}  // namespace

TEST_CASE("executor: a few steps on a fixed batch lower the detection loss (CPU)") {
  Rng rng;
  CAPTURE(rng.seed());
  ModelSpec spec = model_from_text(kTinyDetectorCfg);
  Graph graph = build_graph(spec);
  const int n = 4;
  Executor ex(graph, Device::cpu(), n, rng.seed());
  std::vector<float> images;
  std::vector<YoloTruth> truths;
  std::vector<int> counts;
  yolo::testing::synthetic_batch(rng.seed(), 0, n, 64, 64, images, truths, counts);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    ex.train_micro_batch(images.data(), truths.data(), counts.data(), nullptr, false);
    REQUIRE(ex.apply_update(0.01f, 0.9f, 0.0005f, 1.0f / n));
    double loss = ex.take_loss().total;
    if (step == 0) first = loss;
    last = loss;
  }
  CAPTURE(first);
  CAPTURE(last);
  CHECK(std::isfinite(last));
  CHECK(last < 0.5 * first);
}

TEST_CASE("multi-scale: one plan holds every size, and a switched executor equals one built for that size") {
  Rng rng;
  ModelSpec spec = model_from_text(kTinyDetectorCfg);
  Graph at64 = build_graph(spec), at96 = build_graph(spec, 96, 96);
  const int n = 2;
  Executor both(at64, Device::cpu(), n, 11, {{96, 96}, {32, 32}});
  Executor only96(at96, Device::cpu(), n, 11);
  CHECK(both.memory().activations == only96.memory().activations);  // planned for the largest
  std::vector<float> images = rng.floats(static_cast<size_t>(n) * 96 * 96 * 3, 0, 1);
  std::vector<YoloTruth> truths(static_cast<size_t>(n) * kYoloMaxTruths);
  std::vector<int> counts{1, 2};
  truths[0] = YoloTruth{0.3f, 0.4f, 0.2f, 0.3f, 1};
  truths[kYoloMaxTruths] = YoloTruth{0.6f, 0.5f, 0.1f, 0.1f, 0};
  truths[kYoloMaxTruths + 1] = YoloTruth{0.2f, 0.7f, 0.4f, 0.2f, 2};
  // A step at 64 first, then the switch.
  both.train_micro_batch(images.data(), truths.data(), counts.data(), nullptr, false);
  both.take_loss();
  both.set_input_size(96, 96);
  CHECK(both.graph().nodes.back().out == Shape{12, 12, 24});  // stride 8
  both.train_micro_batch(images.data(), truths.data(), counts.data(), nullptr, false);
  only96.train_micro_batch(images.data(), truths.data(), counts.data(), nullptr, false);
  CHECK(both.take_loss().total == only96.take_loss().total);
  std::vector<float> a = both.download("grads"), b = only96.download("grads");
  CHECK(a == b);
  CHECK_THROWS_WITH_AS(both.set_input_size(128, 128), doctest::Contains("was not planned"), yolo::Error);
}

TEST_CASE("training resumed from a checkpoint equals an uninterrupted run, bit for bit (CPU)") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  ModelSpec spec = model_from_text(kTinyDetectorCfg);
  TrainOptions o;
  o.threads = 2;
  o.seed = 7;
  o.progress_in_place = false;
  o.out_dir = dir / "straight";
  TrainResult straight = train_detector(spec, dataset, Device::cpu(), o);
  CHECK(straight.iterations == 6);
  // chart.png: drawn at most every 10 s, and at the end of the run (this one takes less).
  data::Image chart;
  std::string chart_error;
  REQUIRE(data::read_image(o.out_dir + "/chart.png", chart, chart_error));
  CHECK(chart.width == 800);
  CHECK(chart.height == 500);

  o.out_dir = dir / "split";
  o.max_batches = 3;
  train_detector(spec, dataset, Device::cpu(), o);
  o.max_batches = 0;
  o.resume = true;
  TrainResult resumed = train_detector(spec, dataset, Device::cpu(), o);
  CHECK(resumed.iterations == 6);
  std::string a = file_bytes(straight.weights_path), b = file_bytes(resumed.weights_path);
  CHECK(a.size() == b.size());
  CHECK(a == b);
  // --trace: one step's layers as Chrome-trace events, forward and backward per layer.
  o.out_dir = dir / "traced";
  o.resume = false;
  o.max_batches = 2;
  o.trace_file = dir / "trace.json";
  train_detector(spec, dataset, Device::cpu(), o);
  data::JsonValue trace = data::read_json_file(o.trace_file);
  const data::JsonValue* events = trace.find("traceEvents");
  REQUIRE(events);
  int forward = 0, backward = 0;
  for (const data::JsonValue& e : events->items) {
    const data::JsonValue* cat = e.find("cat");
    if (!cat) continue;  // metadata (process and lane names)
    forward += cat->string == "forward";
    backward += cat->string == "backward";
    CHECK(e.find("dur")->number >= 0);
    CHECK(e.find("ph")->string == "X");
  }
  CHECK(forward == 5);   // every layer, the [yolo] loss included
  CHECK(backward == 4);  // every layer but the loss, whose gradient comes with its forward
  bool named = false;
  for (const data::JsonValue& e : events->items)
    if (e.find("name") && e.find("name")->string == "2 conv") named = true;
  CHECK(named);
  o.trace_file.clear();
  o.max_batches = 0;
  o.out_dir = dir / "split";
  o.resume = true;
  // A different seed is refused on resume.
  o.seed = 8;
  CHECK_THROWS_WITH_AS(train_detector(spec, dataset, Device::cpu(), o), doctest::Contains("same seed"), yolo::Error);
}
