// map --save-json (graph/evaluate.h write_coco_detections): COCO's results format with the
// dataset's own ids (COCO's image ids and non-contiguous category ids), [x, y, w, h] from the
// pixel corners; unreadable images give nothing; the other formats use the sample and class
// indices. detect --json (detection_json): one object per line, names escaped. Read back with
// the project's JSON reader.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "data/json.h"
#include "graph/evaluate.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;

TEST_CASE("COCO results: the dataset's ids, [x, y, width, height], unreadable images left out") {
  yolo::testing::TempDir dir;
  data::Split split;
  split.samples.resize(3);
  split.samples[0].image_id = 42;
  split.samples[1].image_id = 7;
  split.samples[2].image_id = 9;
  std::vector<ImageDetections> found(3);
  found[0].ok = true;
  found[0].detections = {PixelDetection{1, 0.75f, 10, 20, 40, 60}, PixelDetection{0, 0.5f, 0, 0, 5, 5}};
  found[1].ok = false;  // unreadable
  found[1].detections = {PixelDetection{0, 0.9f, 1, 1, 2, 2}};
  found[2].ok = true;
  const std::string path = dir / "det.json";
  write_coco_detections(path, found, split, {1, 90});
  data::JsonValue json = data::read_json_file(path);
  REQUIRE(json.kind == data::JsonKind::Array);
  REQUIRE(json.items.size() == 2);
  const data::JsonValue& first = json.items[0];
  CHECK(first.find("image_id")->number == 42);
  CHECK(first.find("category_id")->number == 90);  // class 1 is COCO's category 90
  const data::JsonValue& bbox = *first.find("bbox");
  REQUIRE(bbox.items.size() == 4);
  CHECK(bbox.items[0].number == doctest::Approx(10));
  CHECK(bbox.items[1].number == doctest::Approx(20));
  CHECK(bbox.items[2].number == doctest::Approx(30));
  CHECK(bbox.items[3].number == doctest::Approx(40));
  CHECK(first.find("score")->number == doctest::Approx(0.75));
  CHECK(json.items[1].find("category_id")->number == 1);
  // Another format: indices as ids.
  for (data::Sample& s : split.samples) s.image_id = -1;
  write_coco_detections(path, found, split, {});
  json = data::read_json_file(path);
  CHECK(json.items[0].find("image_id")->number == 0);
  CHECK(json.items[0].find("category_id")->number == 1);
}

TEST_CASE("detect --json: one JSON object per line, file and class names escaped") {
  const std::string image = "photos/a \"quoted\" \\ name\t1.jpg";
  const std::string name = "class \"x\"";
  const std::string line = detection_json(image, name, PixelDetection{2, 0.875f, 1.5f, 2, 30.5f, 40});
  CHECK(line.find('\n') == std::string::npos);
  const data::JsonValue json = data::parse_json(line, "the line");
  REQUIRE(json.kind == data::JsonKind::Object);
  CHECK(json.find("image")->string == image);
  CHECK(json.find("class")->string == name);
  CHECK(json.find("score")->number == doctest::Approx(0.875));
  const data::JsonValue& box = *json.find("box");
  REQUIRE(box.items.size() == 4);
  CHECK(box.items[0].number == doctest::Approx(1.5));
  CHECK(box.items[2].number == doctest::Approx(30.5));
  CHECK(box.items[3].number == doctest::Approx(40));
}
