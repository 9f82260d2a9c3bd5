// Shortcuts folded into BatchNorm's apply (graph/executor_plan.cpp, Executor's fold_shortcuts):
// which shortcuts fold, and that training (one GPU, data parallel with --sync-bn, fp32 and bf16)
// and inference give what --no-fold gives: the same bits in FP32, a band in bf16 (one rounding
// fewer). The model has residual blocks with leaky and linear second convs, a residual block
// whose output is written into a route's slice, and a shortcut of a layer with itself. The names
// keep tools/adversarial_tests.sh's filter off them: the fold adds no concurrency, and emulated
// training is slow (it added 90 s to CI there). Then the second fold, BatchNorm applied where the
// next convolutions load its output (tensor cores only): which BatchNorms, and training and
// detection with --no-fold's bits (tf32 with the shortcuts folded too; bf16 on a model without).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "graph/evaluate.h"
#include "graph/executor.h"
#include "graph/executor_impl.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "kernels/precision.h"
#include "tests/graph_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::file_bytes;
using yolo::testing::TempDir;

namespace {

const char* const kResidualCfg = R"(
[net]
batch=4
subdivisions=1
width=64
height=64
channels=3
learning_rate=0.01
burn_in=2
max_batches=6
policy=steps
steps=4
scales=.5
[convolutional]
batch_normalize=1
filters=16
size=3
stride=2
pad=1
activation=leaky
[convolutional]
batch_normalize=1
filters=8
size=1
stride=1
pad=1
activation=leaky
[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky
[shortcut]
from=-3
activation=linear
[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=linear
[shortcut]
from=-2
[shortcut]
from=-1
[convolutional]
batch_normalize=1
filters=32
size=3
stride=2
pad=1
activation=leaky
[convolutional]
batch_normalize=1
filters=16
size=1
stride=1
pad=1
activation=leaky
[convolutional]
batch_normalize=1
filters=32
size=3
stride=1
pad=1
activation=leaky
[shortcut]
from=-3
[route]
layers=-1,-4
[convolutional]
size=1
stride=1
pad=1
filters=24
activation=linear
[yolo]
mask=0,1,2
anchors=8,8, 16,16, 32,24
classes=3
num=3
jitter=.1
)";

ModelSpec residual_spec() { return parse_model(parse_cfg_text(kResidualCfg, "residual.cfg")); }

TrainOptions fold_options(const std::string& out_dir, bool fold) {
  TrainOptions o;
  o.threads = 1;
  o.progress_in_place = false;
  o.batch = 4;
  o.subdivisions = 1;
  o.max_batches = 4;
  o.check_every = 1;
  o.bucket_mb = 0;
  o.out_dir = out_dir;
  o.fold_shortcuts = fold;
  o.apply_in_loads = fold;  // as --no-fold
  return o;
}

// Every box (threshold 0, so that the scores count too) an executor with these folds finds in the
// first `images` training samples, with the weights of a training run.
std::vector<ImageDetections> detect_with(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                                         const std::string& weights, Precision precision, bool fold_shortcuts,
                                         bool apply_in_loads, size_t images) {
  std::vector<data::Sample> samples(dataset.train.samples.begin(), dataset.train.samples.begin() + images);
  DetectOptions options;
  options.threads = 1;
  options.threshold = 0.0f;
  Executor executor(build_graph(spec), device, 2, 1, {}, precision, fold_shortcuts, apply_in_loads);
  std::vector<LayerParams> layers = executor.download_parameters();
  read_darknet_weights(weights, layers);
  executor.upload_parameters();
  return detect_samples(executor, samples, options);
}

// The same boxes with the same bits in both; returns how many.
size_t check_same_detections(const std::vector<ImageDetections>& a, const std::vector<ImageDetections>& b) {
  REQUIRE(a.size() == b.size());
  size_t boxes = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].detections.size() == b[i].detections.size());
    for (size_t k = 0; k < a[i].detections.size(); ++k, ++boxes) {
      const PixelDetection &f = a[i].detections[k], &u = b[i].detections[k];
      CHECK(f.class_id == u.class_id);
      CHECK(f.score == u.score);
      CHECK(f.x0 == u.x0);
      CHECK(f.y1 == u.y1);
    }
  }
  return boxes;
}

}  // namespace

TEST_CASE("folded shortcuts: which fold (a BatchNorm conv read only by the shortcut, its other input earlier)") {
  const Graph graph = build_graph(residual_spec());
  const detail::ActivationPlan plan = detail::plan_activations(graph, 2, 4, true, true);
  std::vector<std::pair<int, int>> folded;
  for (int q = 0; q < static_cast<int>(graph.nodes.size()); ++q)
    if (plan.folded_into[q] >= 0) folded.emplace_back(q, plan.folded_into[q]);
  // 3 = 0 + 2 and 5 = 3 + 4 fold; 6 = 5 + 5 has no conv; 10 = 7 + 9 folds into 9, whose apply
  // then writes the first 32 channels of route 11 (10's only reader).
  CHECK(folded == std::vector<std::pair<int, int>>{{2, 3}, {4, 5}, {9, 10}});
  CHECK(plan.alias[9].root == 11);
  CHECK(plan.alias[9].channel == 0);
  CHECK(plan.out_buffer[2] == -1);  // the conv's output is the shortcut's
  CHECK(detail::plan_activations(graph, 2, 4, true, false).folded_into == std::vector<int>(graph.nodes.size(), -1));
  CHECK_THROWS_WITH(detail::plan_activations(graph, 2, 4, false, true),
                    doctest::Contains("a folded shortcut or apply needs the BatchNorm backward to recompute its output"));
  // YOLOv3-416, batch 16, bf16: its 23 residual blocks fold. (The peak of the plan is where
  // backward starts, which the fold does not change: the gain is a pass, not memory.)
  const Graph yolov3 = build_graph(read_model("models/yolov3.cfg"));
  const detail::ActivationPlan y3 = detail::plan_activations(yolov3, 16, 2, true, true),
                               y3_unfolded = detail::plan_activations(yolov3, 16, 2, true, false);
  CHECK(std::count_if(y3.folded_into.begin(), y3.folded_into.end(), [](int s) { return s >= 0; }) == 23);
  MESSAGE("YOLOv3-416 batch 16 bf16 activations: " << y3.bytes / 1048576.0 << " MiB folded, "
                                                   << y3_unfolded.bytes / 1048576.0 << " MiB not");
  CHECK(y3.bytes <= y3_unfolded.bytes);
}

TEST_CASE("folded shortcuts, one GPU: training equals --no-fold, bit for bit in FP32, in a band in bf16") {
  KERNEL_TEST_DEVICE(device);
  TempDir dir;
  const data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  auto train = [&](const std::string& name, bool fold, Precision precision) {
    TrainOptions o = fold_options(dir / name, fold);
    o.precision = precision;
    if (precision == Precision::Bf16) o.batch = 2, o.max_batches = 2;  // emulated bf16 is slow
    return train_detector(residual_spec(), dataset, device, o);
  };
  const TrainResult fp32 = train("fp32", true, Precision::Fp32), fp32_off = train("fp32_off", false, Precision::Fp32);
  CHECK(fp32.losses == fp32_off.losses);
  CHECK(file_bytes(fp32.checkpoint_path) == file_bytes(fp32_off.checkpoint_path));
  const TrainResult bf16 = train("bf16", true, Precision::Bf16), bf16_off = train("bf16_off", false, Precision::Bf16);
  // FP32 over the same 2 steps of 2 images: the yardstick of bf16's own error.
  TrainOptions short_fp32 = fold_options(dir / "fp32_short", false);
  short_fp32.batch = 2, short_fp32.max_batches = 2;
  const TrainResult fp32_2 = train_detector(residual_spec(), dataset, device, short_fp32);
  REQUIRE(bf16.losses.size() == bf16_off.losses.size());
  for (size_t k = 0; k < bf16.losses.size(); ++k) CHECK(yolo::testing::close(bf16.losses[k], bf16_off.losses[k], 0, 2e-2));
  // The band: the fold moves bf16's result less than bf16 itself moves it from FP32's.
  const Checkpoint a = read_checkpoint(bf16.checkpoint_path), b = read_checkpoint(bf16_off.checkpoint_path),
                   f = read_checkpoint(fp32_2.checkpoint_path);
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    CAPTURE(a.tensors[t].first);
    const double fold_effect = yolo::testing::worst_difference(a.tensors[t].second, b.tensors[t].second),
                 bf16_effect = yolo::testing::worst_difference(b.tensors[t].second, f.tensors[t].second);
    MESSAGE(a.tensors[t].first << ": bf16 folded vs not " << fold_effect << ", bf16 vs fp32 " << bf16_effect);
    CHECK(fold_effect <= bf16_effect);
  }
  // One rounding fewer: bf16 does differ (the fold ran).
  CHECK(file_bytes(bf16.checkpoint_path) != file_bytes(bf16_off.checkpoint_path));
}

#if YOLO_EMU  // two replicas: emulated GPUs (the GPU machine has one)
TEST_CASE("folded shortcuts, data parallel over two replicas with --sync-bn: --no-fold's bits (FP32)") {
  TempDir dir;
  const data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const std::vector<Device> two{Device::emu(0), Device::emu(1)};
  auto train = [&](const std::string& name, bool fold) {
    TrainOptions o = fold_options(dir / name, fold);
    o.sync_bn = true;
    o.max_batches = 3;
    return train_detector(residual_spec(), dataset, two, o);
  };
  const TrainResult folded = train("fold", true), unfolded = train("no_fold", false);
  CHECK(folded.losses == unfolded.losses);
  CHECK(file_bytes(folded.checkpoint_path) == file_bytes(unfolded.checkpoint_path));
}
#endif

TEST_CASE("folded shortcuts: inference (detect) finds what --no-fold finds, to the bit (FP32)") {
  KERNEL_TEST_DEVICE(device);
  TempDir dir;
  const data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  // Weights worth detecting with: a few steps of training, loaded into both executors.
  const TrainResult trained = train_detector(residual_spec(), dataset, device, fold_options(dir / "train", true));
  auto detect = [&](bool fold) {
    return detect_with(residual_spec(), dataset, device, trained.weights_path, Precision::Fp32, fold, fold, 3);
  };
  CHECK(check_same_detections(detect(true), detect(false)) > 0);
}

// ---- BatchNorm applied where its readers load it (plan.applied_in_loads; kernels/conv.h) ----

TEST_CASE("BatchNorm applied in the loads: which (a BatchNorm conv read by convolutions alone)") {
  const Graph graph = build_graph(residual_spec());
  const size_t L = graph.nodes.size();
  std::vector<char> convs(L, 0);
  for (const Node& node : graph.nodes) convs[node.index] = node.spec.type == LayerType::Convolutional;
  const detail::ActivationPlan plan = detail::plan_activations(graph, 2, 2, true, true, convs);
  std::vector<int> applied;
  for (size_t q = 0; q < L; ++q)
    if (plan.applied_in_loads[q]) applied.push_back(static_cast<int>(q));
  // 1 and 8 feed a 3x3 conv alone; 0 and 7 also feed a shortcut; 2, 4 and 9 are folded into one;
  // 12 has no BatchNorm.
  CHECK(applied == std::vector<int>{1, 8});
  CHECK(plan.out_buffer[1] == -1);
  CHECK(plan.out_buffer[8] == -1);
  CHECK(plan.out_buffer[0] >= 0);
  std::vector<char> no_2 = convs;
  no_2[2] = 0;  // a reader that cannot read a normalized input keeps the apply
  CHECK_FALSE(detail::plan_activations(graph, 2, 2, true, true, no_2).applied_in_loads[1]);
  CHECK_THROWS_WITH(detail::plan_activations(graph, 2, 2, false, false, convs),
                    doctest::Contains("a folded shortcut or apply needs the BatchNorm backward to recompute"));
  // YOLOv3-416 batch 16 bf16 (every conv but the first reads a normalized input on tensor cores).
  const Graph yolov3 = build_graph(read_model("models/yolov3.cfg"));
  std::vector<char> y3_convs(yolov3.nodes.size(), 0);
  for (const Node& node : yolov3.nodes)
    y3_convs[node.index] = node.spec.type == LayerType::Convolutional && node.in.c > 4;
  const detail::ActivationPlan y3 = detail::plan_activations(yolov3, 16, 2, true, true, y3_convs),
                               y3_stored = detail::plan_activations(yolov3, 16, 2, true, true);
  size_t count = 0, elements = 0;
  for (const Node& node : yolov3.nodes)
    if (y3.applied_in_loads[node.index]) ++count, elements += node.out.elements();
  MESSAGE("YOLOv3-416: " << count << " BatchNorms applied in the loads, " << elements * 16 * 2 / 1e6
                         << " MB of outputs a step never stored (bf16, batch 16); activations "
                         << y3.bytes / 1048576.0 << " MiB, " << y3_stored.bytes / 1048576.0 << " MiB stored");
  CHECK(count == 40);
  CHECK(y3.bytes < y3_stored.bytes);
}

TEST_CASE("BatchNorm applied in the loads, one GPU: training in tf32 has --no-load-fold's bits") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("TF32 needs sm_80");
  ModelSpec spec = residual_spec();
  spec.net.width = spec.net.height = 32;  // emulated TF32 tensor cores are slow
  {  // the plan applies 1 and 8 in their readers' loads: their outputs have no buffer
    Executor executor(build_graph(spec), device, 2, 1, {}, Precision::Tf32, true);
    for (const PlannedBuffer& b : executor.plan()) {
      CHECK(b.tag != "out 1");
      CHECK(b.tag != "out 8");
    }
    CHECK(executor.folds_text() ==
          "passes folded away: 3 shortcuts added in their BatchNorm's apply, 2 BatchNorm applies done in the next "
          "convolutions' loads (--no-fold, --no-load-fold: run them)");
  }
  TempDir dir;
  const data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  auto train = [&](const std::string& name, bool in_loads) {
    TrainOptions o = fold_options(dir / name, true);  // the shortcuts folded in both
    o.apply_in_loads = in_loads;
    o.precision = Precision::Tf32;
    o.batch = 2, o.max_batches = 2;
    return train_detector(spec, dataset, device, o);
  };
  const TrainResult folded = train("fold", true), unfolded = train("no_load_fold", false);
  CHECK(folded.losses == unfolded.losses);
  CHECK(file_bytes(folded.checkpoint_path) == file_bytes(unfolded.checkpoint_path));
}

#if YOLO_EMU  // two replicas: emulated GPUs (the GPU machine has one)
TEST_CASE("BatchNorm applied in the loads, two replicas with --sync-bn (bf16): --no-load-fold's bits") {
  TempDir dir;
  const data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const std::vector<Device> two{Device::emu(0), Device::emu(1)};
  auto train = [&](const std::string& name, bool in_loads) {
    TrainOptions o = fold_options(dir / name, true);
    o.apply_in_loads = in_loads;
    o.sync_bn = true;  // the statistics all-reduced before the table is written
    o.precision = Precision::Bf16;
    o.subdivisions = 1, o.max_batches = 2;
    return train_detector(yolo::testing::tiny_detector_spec(), dataset, two, o);
  };
  const TrainResult folded = train("fold", true), unfolded = train("no_load_fold", false);
  CHECK(folded.losses == unfolded.losses);
  CHECK(file_bytes(folded.checkpoint_path) == file_bytes(unfolded.checkpoint_path));
}
#endif

TEST_CASE("BatchNorm applied in the loads, one GPU: bf16 training and detection have --no-load-fold's bits") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("BF16 needs sm_80");
  // The tiny detector has no shortcut: its one fold is conv 2's BatchNorm, applied in conv 3's loads.
  TempDir dir;
  const data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  auto train = [&](const std::string& name, bool fold) {
    TrainOptions o = fold_options(dir / name, fold);
    o.precision = Precision::Bf16;
    o.batch = 2, o.subdivisions = 1, o.max_batches = 2;
    return train_detector(yolo::testing::tiny_detector_spec(), dataset, device, o);
  };
  const TrainResult folded = train("fold", true), unfolded = train("no_fold", false);
  CHECK(folded.losses == unfolded.losses);
  CHECK(file_bytes(folded.checkpoint_path) == file_bytes(unfolded.checkpoint_path));
  // Inference: the table from the running statistics.
  auto detect = [&](bool in_loads) {
    return detect_with(yolo::testing::tiny_detector_spec(), dataset, device, folded.weights_path, Precision::Bf16,
                       true, in_loads, 2);
  };
  CHECK(check_same_detections(detect(true), detect(false)) > 0);
}
