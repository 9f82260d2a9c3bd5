// Inference end to end: a detector whose head is set by hand predicts known boxes; the loader's
// letterbox, the decode, NMS and the mapping back to original pixels must give exactly them,
// and mAP against those boxes as truths must be 1.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "data/image.h"
#include "graph/evaluate.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::TempDir;

namespace {

// 32x32 input; one 1x1 convolution with stride 8 gives a 4x4 grid; one anchor of 8x12
// network pixels; 3 classes.
const char* kHandCfg = R"(
[net]
batch=1
width=32
height=32
channels=3
[convolutional]
filters=8
size=1
stride=8
pad=1
activation=linear
[yolo]
mask=0
anchors=8,12
classes=3
num=1
)";

// Weights 0; biases tx = ty = tw = th = 0, objectness and class 1 strongly on.
void set_head(Executor& executor) {
  std::vector<LayerParams> layers = executor.download_parameters();
  REQUIRE(layers.size() == 1);
  std::fill(layers[0].weights, layers[0].weights + layers[0].weight_count(), 0.0f);
  const float biases[8] = {0, 0, 0, 0, 10, -10, 10, -10};
  std::copy(biases, biases + 8, layers[0].biases);
  executor.upload_parameters();
}

// The whole inference path on `device`: loader, forward, decode, NMS, mapping back, mAP, drawing.
void check_hand_set_head(Device device) {
  TempDir dir;
  // A 64x32 image: letterboxed into 32x32 at scale 0.5 with 8-pixel bars above and below.
  data::Image image;
  image.width = 64;
  image.height = 32;
  image.rgb.assign(64 * 32 * 3, 100);
  data::write_image(dir / "wide.png", image);
  Graph graph = build_graph(parse_model(parse_cfg_text(kHandCfg, "hand.cfg")));
  Executor executor(graph, device, 1, 1);
  set_head(executor);
  DetectOptions options;
  options.threads = 1;
  std::vector<ImageDetections> found = detect_samples(executor, {data::Sample{dir / "wide.png", {}}}, options);
  REQUIRE(found.size() == 1);
  CHECK(found[0].ok);
  CHECK(found[0].width == 64);
  CHECK(found[0].height == 32);
  // Cell (i, j): network box centre ((i + 0.5) * 8, (j + 0.5) * 8), size 8 x 12 (boxes of
  // neighbouring rows overlap with IoU 0.2 < 0.45: NMS keeps all); in the original image
  // x = 2 * x_net, y = 2 * (y_net - 8), clipped to 64 x 32 (every row is clipped somewhere).
  std::vector<std::array<float, 4>> expect;
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 4; ++i) {
      float cy = (j + 0.5f) * 8;
      expect.push_back({16.0f * i, std::max(0.0f, 2 * (cy - 6 - 8)), 16.0f * i + 16, std::min(32.0f, 2 * (cy + 6 - 8))});
    }
  REQUIRE(found[0].detections.size() == 16);
  for (const PixelDetection& d : found[0].detections) {
    CHECK(d.class_id == 1);
    CHECK(d.score == doctest::Approx(1.0 / (1 + std::exp(-10.0)) / (1 + std::exp(-10.0))).epsilon(1e-6));
    bool matched = false;
    for (const auto& e : expect)
      matched |= std::abs(d.x0 - e[0]) < 1e-3f && std::abs(d.y0 - e[1]) < 1e-3f && std::abs(d.x1 - e[2]) < 1e-3f &&
                 std::abs(d.y1 - e[3]) < 1e-3f;
    CAPTURE(d.x0);
    CAPTURE(d.y0);
    CAPTURE(d.x1);
    CAPTURE(d.y1);
    CHECK(matched);
  }
  // The same boxes as truths: mAP 1; as a different class: 0.
  data::Split split;
  split.name = "valid";
  data::Sample sample{dir / "wide.png", {}};
  for (const auto& e : expect)
    sample.boxes.push_back(data::Box{(e[0] + e[2]) / 2 / 64, (e[1] + e[3]) / 2 / 32, (e[2] - e[0]) / 64,
                                     (e[3] - e[1]) / 32, 1, false});
  split.samples.push_back(sample);
  CHECK(evaluate_split(executor, split, 3, options).map50 == doctest::Approx(1.0));
  for (data::Box& b : split.samples[0].boxes) b.class_id = 2;
  CHECK(evaluate_split(executor, split, 3, options).map50 == doctest::Approx(0.0));
  // Drawn and written.
  write_detections_image(found[0], {"a", "b", "c"}, dir / "drawn.png");
  data::Image drawn;
  std::string error;
  REQUIRE(data::read_image(dir / "drawn.png", drawn, error));
  CHECK(drawn.rgb != image.rgb);
}

}  // namespace

TEST_CASE("detect: hand-set head -> boxes in original pixels through the letterbox (CPU)") {
  check_hand_set_head(Device::cpu());
}

TEST_CASE("detect: hand-set head on the kernel device (the CUDA decode and NMS: emu:0, or gpu:0 natively)") {
  KERNEL_TEST_DEVICE(device);
  check_hand_set_head(device);
}
