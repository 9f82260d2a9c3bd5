// Anchors from the dataset (data/anchors.h): k-means with 1 - IoU recovers planted box sizes; the
// sizes are the network's view (letterbox keeps the image's aspect, stretch does not); mean best
// IoU against a set of anchors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "data/anchors.h"
#include "data/image.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo::data;
using yolo::testing::Rng;
using yolo::testing::TempDir;

TEST_CASE("anchors: k-means with 1 - IoU recovers 3 planted sizes (jittered 5%), sorted by area, seeded") {
  Rng rng;
  CAPTURE(rng.seed());
  const std::vector<BoxSize> planted = {{150, 100}, {20, 30}, {60, 60}};
  std::vector<BoxSize> boxes;
  for (int i = 0; i < 600; ++i) {
    const BoxSize& p = planted[static_cast<size_t>(i) % planted.size()];
    boxes.push_back({p.w * rng.uniform(0.95f, 1.05f), p.h * rng.uniform(0.95f, 1.05f)});
  }
  const std::vector<BoxSize> anchors = kmeans_anchors(boxes, 3, 42);
  REQUIRE(anchors.size() == 3);
  const BoxSize expect[] = {{20, 30}, {60, 60}, {150, 100}};  // by area
  for (int k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(anchors[k].w == doctest::Approx(expect[k].w).epsilon(0.02));
    CHECK(anchors[k].h == doctest::Approx(expect[k].h).epsilon(0.02));
  }
  CHECK(mean_best_iou(boxes, anchors) > 0.9);
  CHECK(mean_best_iou(boxes, {{400, 400}}) < 0.1);  // one huge anchor fits nothing
  // The same seed, the same anchors.
  const std::vector<BoxSize> again = kmeans_anchors(boxes, 3, 42);
  for (int k = 0; k < 3; ++k) CHECK(again[k].w == anchors[k].w);
  CHECK(anchors_text(anchors).find(",") != std::string::npos);
  std::string error;
  try {
    kmeans_anchors({{1, 1}, {2, 2}}, 3, 1);
  } catch (const yolo::Error& e) {
    error = e.what();
  }
  CHECK(error.find("2 boxes for 3 anchors") != std::string::npos);
}

TEST_CASE("anchors: box sizes as the network sees them: letterbox keeps the aspect, stretch fills") {
  TempDir dir;
  Image image;
  image.width = 200;
  image.height = 100;
  image.rgb.assign(200 * 100 * 3, 90);
  write_image(dir / "a.png", image);
  Split split;
  Sample sample;
  sample.image = dir / "a.png";
  sample.boxes.push_back(Box{0.5f, 0.5f, 0.5f, 0.5f, 0});
  split.samples.push_back(sample);
  std::vector<BoxSize> letter = network_box_sizes(split, 416, 416, ResizeMode::Letterbox);
  REQUIRE(letter.size() == 1);
  CHECK(letter[0].w == doctest::Approx(208));  // 100 image pixels x 2.08
  CHECK(letter[0].h == doctest::Approx(104));
  std::vector<BoxSize> stretch = network_box_sizes(split, 416, 416, ResizeMode::Stretch);
  CHECK(stretch[0].w == doctest::Approx(208));
  CHECK(stretch[0].h == doctest::Approx(208));
  sample.image = dir / "gone.png";
  split.samples.push_back(sample);
  int64_t unreadable = 0;
  CHECK(network_box_sizes(split, 416, 416, ResizeMode::Letterbox, &unreadable).size() == 1);
  CHECK(unreadable == 1);
}
