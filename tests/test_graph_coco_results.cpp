// map --save-json (graph/evaluate.h write_coco_detections): COCO's results format with the
// dataset's own ids (COCO's image ids and non-contiguous category ids), [x, y, w, h] from the
// pixel corners; unreadable images give nothing; a set without ids (darknet, folders, VOC) gets
// those of its COCO form (same image file, same class name). detect --json (detection_json):
// one object per line, names escaped. Read back with the project's JSON reader.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/json.h"
#include "data/synthetic.h"
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
  // Another format (no category ids): the class index + 1.
  write_coco_detections(path, found, split, {});
  json = data::read_json_file(path);
  CHECK(json.items[0].find("image_id")->number == 42);
  CHECK(json.items[0].find("category_id")->number == 2);
}

TEST_CASE("COCO results of a set without ids use the ids of its COCO form: same image file, same class name") {
  yolo::testing::TempDir dir;
  data::SyntheticOptions o;
  o.train_images = 2;
  o.valid_images = 4;
  o.width = 64;
  o.height = 48;
  o.png = true;
  const data::SyntheticSet set = data::write_synthetic_dataset(dir / "shapes", o);
  // The second validation image's label file is malformed: left out, the ids of the others stay.
  yolo::testing::write_text_file(dir / "shapes/validation/labels/000001.txt", "not a label\n");
  // The COCO form's ids: image id -> file name, category id -> class name.
  const data::JsonValue coco = data::read_json_file(dir / "shapes/annotations/instances_validation.json");
  std::map<int64_t, std::string> files, categories;
  for (const data::JsonValue& image : coco.find("images")->items)
    files[static_cast<int64_t>(image.find("id")->number)] = image.find("file_name")->string;
  for (const data::JsonValue& category : coco.find("categories")->items)
    categories[static_cast<int64_t>(category.find("id")->number)] = category.find("name")->string;

  for (data::Format format : {data::Format::Darknet, data::Format::Folders, data::Format::Voc}) {
    CAPTURE(data::format_name(format));
    data::OpenOptions open;
    open.force_format = true;
    open.format = format;
    // VOC's classes are collected and sorted unless a names file fixes their order (as the others' do).
    if (format == data::Format::Voc) open.names_file = set.names_file;
    const data::Dataset d = data::open_dataset(format == data::Format::Darknet ? set.data_file : set.root, open);
    const data::Split& valid = d.valid;
    REQUIRE(valid.samples.size() == (format == data::Format::Voc ? 4 : 3));
    std::vector<ImageDetections> found(valid.samples.size());
    for (size_t i = 0; i < found.size(); ++i) {
      found[i].ok = true;
      for (int c = 0; c < static_cast<int>(d.class_names.size()); ++c)
        found[i].detections.push_back(PixelDetection{c, 0.5f, 1, 2, 10, 20});
    }
    const std::string path = dir / "results.json";
    write_coco_detections(path, found, valid, d.category_ids);
    const data::JsonValue results = data::read_json_file(path);
    REQUIRE(results.items.size() == found.size() * d.class_names.size());
    for (size_t k = 0; k < results.items.size(); ++k) {
      CAPTURE(k);
      const data::JsonValue& r = results.items[k];
      const auto image_id = static_cast<int64_t>(r.find("image_id")->number);
      const auto category_id = static_cast<int64_t>(r.find("category_id")->number);
      REQUIRE(files.count(image_id) == 1);
      REQUIRE(categories.count(category_id) == 1);
      const size_t sample = k / d.class_names.size(), class_id = k % d.class_names.size();
      CHECK(files[image_id] == std::filesystem::path(valid.samples[sample].image).filename().string());
      CHECK(categories[category_id] == d.class_names[class_id]);
    }
  }
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
