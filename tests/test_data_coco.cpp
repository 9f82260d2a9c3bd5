// COCO JSON: category ids -> classes (sorted by id, or by a names file), exact boxes from
// [x, y, w, h] pixels, iscrowd kept as difficult, the folder form with its image folders, and
// errors naming the file, line and array element.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "data/dataset.h"
#include "runtime/check.h"
#include "tests/data_checks.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

// Line 1 "{", line 2 "images": [, the images one per line, then one line "], annotations: [",
// the annotations one per line, one line "], categories: [", the categories one per line, "]}".
std::string coco_json(const std::string& images, const std::string& annotations, const std::string& categories) {
  return "{\n\"images\": [\n" + images + "], \"annotations\": [\n" + annotations + "], \"categories\": [\n" +
         categories + "]}\n";
}

const std::string kImages =
    "{\"id\": 10, \"file_name\": \"a.jpg\", \"width\": 17, \"height\": 9, \"license\": 3},\n"
    "{\"id\": 4, \"file_name\": \"sub/b.jpg\", \"width\": 10, \"height\": 20}\n";
const int kFirstAnnotationLine = 6;  // with kImages' two lines

const std::string kCategories =
    "{\"id\": 1, \"name\": \"person\", \"supercategory\": \"p\"},\n"
    "{\"id\": 7, \"name\": \"zebra\"},\n"
    "{\"id\": 3, \"name\": \"car\"}\n";

const std::string kAnnotations =
    "{\"id\": 1, \"image_id\": 10, \"category_id\": 7, \"bbox\": [0, 0, 17, 9], \"iscrowd\": 0, "
    "\"segmentation\": [[0, 0, 17, 0, 17, 9]], \"area\": 153},\n"
    "{\"id\": 2, \"image_id\": 4, \"category_id\": 3, \"bbox\": [2, 3, 4, 5], \"iscrowd\": 1, "
    "\"segmentation\": {\"counts\": [1, 2, 3], \"size\": [20, 10]}},\n"
    "{\"id\": 3, \"image_id\": 10, \"category_id\": 1, \"bbox\": [1.5, 2, 3.0, 4e0]},\n"
    "{\"id\": 4, \"image_id\": 4, \"category_id\": 1, \"bbox\": [0, 0, 0, 5]}\n";

// read_coco(path) must report a problem starting with "WHERE: " and containing `fragment`: an
// error when the file itself is malformed, else a problem of the split (its image left out).
void check_coco_error(const std::string& path, const OpenOptions& options, const std::string& where,
                      const std::string& fragment) {
  std::vector<std::string> messages;
  try {
    Dataset d = read_coco(path, options);
    for (const Split* split : {&d.train, &d.valid})
      for (const Problem& p : split->problems) messages.push_back(p.message);
  } catch (const Error& e) {
    messages.push_back(e.what());
  }
  std::string all;
  bool found = false;
  for (const std::string& m : messages) {
    all += m + "\n";
    found = found || (m.rfind(where + ": ", 0) == 0 && m.find(fragment) != std::string::npos);
  }
  CHECK_MESSAGE(found, "expected a problem at " << where << " with '" << fragment << "'; got:\n" << all);
}

std::string error_of(const std::string& path) {
  try {
    read_coco(path, {});
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("coco: categories sorted by id become classes; boxes from [x, y, w, h]; iscrowd is difficult") {
  TempDir dir;
  std::filesystem::create_directories(dir / "train/images");
  std::string file = dir / "annotations/instances_train.json";
  write_text_file(file, coco_json(kImages, kAnnotations, kCategories));
  Dataset d = read_coco(file, {});
  CHECK(d.format == Format::Coco);
  CHECK(d.class_names == std::vector<std::string>{"person", "car", "zebra"});  // ids 1, 3, 7
  CHECK(d.train.name == "train");
  CHECK(d.valid.samples.empty());
  REQUIRE(d.train.samples.size() == 2);  // in the order of "images"
  CHECK(d.train.samples[0].image == dir / "train/images/a.jpg");
  CHECK(d.train.samples[1].image == dir / "train/images/sub/b.jpg");
  REQUIRE(d.train.samples[0].boxes.size() == 2);
  check_box(d.train.samples[0].boxes[0], 0.5, 0.5, 1, 1, 2, false);
  check_box(d.train.samples[0].boxes[1], 3.0 / 17, 4.0 / 9, 3.0 / 17, 4.0 / 9, 0, false);
  REQUIRE(d.train.samples[1].boxes.size() == 1);
  check_box(d.train.samples[1].boxes[0], 0.4, 0.275, 0.4, 0.25, 1, true);
  CHECK(d.train.counts.images == 2);
  CHECK(d.train.counts.boxes == 3);
  CHECK(d.train.counts.difficult_boxes == 1);
  CHECK(d.train.counts.empty_boxes == 1);  // the zero-width one
  CHECK(d.description.find("COCO at " + file) == 0);
  CHECK(d.description.find("3 classes, category ids sorted ascending -> classes 0..2") != std::string::npos);
  // Each class's category id in the file (for --save-json): zebra (7) -> class 2 by sorted id.
  CHECK(d.category_ids == std::vector<int64_t>{1, 3, 7});
  CHECK(d.train.samples[0].image_id >= 0);
}

TEST_CASE("coco: a names file maps categories by name; a name not in it is an error with file and line") {
  TempDir dir;
  std::filesystem::create_directories(dir / "train/images");
  std::string file = dir / "annotations/instances_train.json";
  write_text_file(file, coco_json(kImages, kAnnotations, kCategories));
  write_text_file(dir / "names.txt", "zebra\ncar\nperson\nunused\n");
  OpenOptions options;
  options.names_file = dir / "names.txt";
  Dataset d = read_coco(file, options);
  CHECK(d.class_names == std::vector<std::string>{"zebra", "car", "person", "unused"});
  REQUIRE(d.train.samples.size() == 2);
  REQUIRE(d.train.samples[0].boxes.size() == 2);
  CHECK(d.train.samples[0].boxes[0].class_id == 0);
  CHECK(d.train.samples[0].boxes[1].class_id == 2);
  CHECK(d.train.samples[1].boxes.at(0).class_id == 1);
  CHECK(d.description.find("4 classes from " + options.names_file + " by category name") != std::string::npos);

  write_text_file(dir / "names.txt", "zebra\nperson\n");
  int car_line = kFirstAnnotationLine + 4 + 3;  // four annotations, the "categories" line, person, zebra
  check_coco_error(file, options, file + ":" + std::to_string(car_line),
                   "category 3 'car' is not in the names file " + options.names_file);
}

TEST_CASE("coco: malformed files are errors naming the file, line and element") {
  TempDir dir;
  std::filesystem::create_directories(dir / "images");
  std::string file = dir / "instances_x.json";
  auto expect = [&](const std::string& text, int line, const std::string& fragment) {
    CAPTURE(text);
    write_text_file(file, text);
    check_coco_error(file, {}, file + ":" + std::to_string(line), fragment);
  };
  const int a = kFirstAnnotationLine;
  auto with_annotation = [&](const std::string& annotation) {
    return coco_json(kImages, annotation + "\n", kCategories);
  };
  expect(with_annotation("{\"image_id\": 99, \"category_id\": 1, \"bbox\": [0, 0, 1, 1]}"), a,
         "annotations[0]: image_id 99 is not in \"images\"");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 2, \"bbox\": [0, 0, 1, 1]}"), a,
         "annotations[0]: category_id 2 is not in \"categories\"");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1}"), a, "annotations[0]: no \"bbox\" member");
  expect(with_annotation("{\"category_id\": 1, \"bbox\": [0, 0, 1, 1]}"), a, "no \"image_id\" member");
  expect(with_annotation("{\"image_id\": \"10\", \"category_id\": 1, \"bbox\": [0, 0, 1, 1]}"), a,
         "\"image_id\" is a string, expected a number");
  expect(with_annotation("{\"image_id\": 10.5, \"category_id\": 1, \"bbox\": [0, 0, 1, 1]}"), a,
         "\"image_id\" is 10.5, expected a whole number");
  expect(with_annotation("{\"image_id\": 1e300, \"category_id\": 1, \"bbox\": [0, 0, 1, 1]}"), a,
         "expected a whole number");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [0, 0, 1]}"), a,
         "\"bbox\" must be 4 numbers [x, y, width, height] in pixels");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [0, 0, 1, \"1\"]}"), a,
         "\"bbox\" must be 4 numbers");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": {}}"), a,
         "\"bbox\" is an object, expected an array");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [0, 0, -1, 1]}"), a,
         "negative width or height");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [0, 0, 1, 1], \"iscrowd\": 2}"), a,
         "\"iscrowd\" must be 0 or 1");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [0, 0, 40, 9]}"), a,
         "annotations[0]: \"bbox\" [0, 0, 40, 9] extends past the image's right edge (x + width 40 > 17); the image "
         "is 17x9 pixels by \"images\"");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [-5, -3, 10, 5]}"), a,
         "extends past the image's left edge (x -5 < 0) and its top edge (y -3 < 0)");
  expect(with_annotation("{\"image_id\": 10, \"category_id\": 1, \"bbox\": [20, 0, 5, 5]}"), a,
         "lies entirely outside the image, past its right edge (x + width 25 > 17)");
  expect(with_annotation("7"), a, "annotations[0] is a number, expected an object");
  expect(coco_json("{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 0, \"height\": 5}\n", "", kCategories), 3,
         "images[0]: image size 0x5 is not positive");
  expect(coco_json("{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 5, \"height\": 5},\n"
                   "{\"id\": 1, \"file_name\": \"b.jpg\", \"width\": 5, \"height\": 5}\n",
                   "", kCategories),
         4, "images[1]: image id 1 repeats");
  expect(coco_json("{\"id\": 1, \"file_name\": 5, \"width\": 5, \"height\": 5}\n", "", kCategories), 3,
         "images[0]: \"file_name\" is a number, expected a string");
  expect(coco_json("{\"id\": 1, \"width\": 5, \"height\": 5}\n", "", kCategories), 3, "no \"file_name\" member");
  expect(coco_json(kImages, "", "{\"id\": 1, \"name\": \"a\"},\n{\"id\": 1, \"name\": \"b\"}\n"), 8,
         "categories[1]: category id 1 repeats (first at line 7)");
  expect(coco_json(kImages, "", "{\"id\": 1, \"name\": \"a\"},\n{\"id\": 2, \"name\": \"a\"}\n"), 8,
         "category name 'a' repeats (id 1 has it too)");
  expect(coco_json(kImages, "", "{\"id\": 1}\n"), 7, "categories[0]: no \"name\" member");
  expect(coco_json(kImages, "", ""), 6, "\"categories\" is empty");
  expect("{\"images\": [], \"categories\": [{\"id\": 1, \"name\": \"a\"}]}", 1, "no \"annotations\" member");
  expect("[1, 2]", 1, "the file holds an array, expected a COCO object");
  expect("{\"images\": [\n{\"id\": 1,\n\"file_name\": \"a.jpg\"", 3, "the file ends inside the object opened at line 2");
  expect("{\"images\": [\n{\"id\": 1,\n\"file_name\": \"a.jpg\"}\n,", 4, "the file ends where a value was expected");
  expect("{\"images\": [\n{\"id\": 1,\n\"file_name\" \"a.jpg\"}", 3, "expected ':'");
  check_coco_error(dir / "nothing.json", {}, "COCO " + (dir / "nothing.json"), "no such file or directory");
}

TEST_CASE("coco: a folder with annotations/instances_train*.json and instances_val*.json") {
  TempDir dir;
  std::filesystem::create_directories(dir / "train/images");  // preferred over train/ itself
  std::filesystem::create_directories(dir / "validation/images");
  write_text_file(dir / "annotations/instances_train.json", coco_json(kImages, kAnnotations, kCategories));
  // The validation file lists the categories in another order: mapping is by id.
  write_text_file(dir / "annotations/instances_validation.json",
                  coco_json("{\"id\": 1, \"file_name\": \"v.jpg\", \"width\": 8, \"height\": 8}\n",
                            "{\"image_id\": 1, \"category_id\": 7, \"bbox\": [0, 0, 4, 8]}\n",
                            "{\"id\": 7, \"name\": \"zebra\"},\n{\"id\": 1, \"name\": \"person\"},\n"
                            "{\"id\": 3, \"name\": \"car\"}\n"));
  write_text_file(dir / "annotations/person_keypoints_train.json", "not read");
  write_text_file(dir / "annotations/instances_test.json", "not read either");
  Dataset d = read_coco(dir.path(), {});
  CHECK(d.class_names == std::vector<std::string>{"person", "car", "zebra"});
  REQUIRE(d.train.samples.size() == 2);
  CHECK(d.train.samples[0].image == dir / "train/images/a.jpg");
  CHECK(d.train.counts.boxes == 3);
  REQUIRE(d.valid.samples.size() == 1);
  CHECK(d.valid.name == "valid");
  CHECK(d.valid.samples[0].image == dir / "validation/images/v.jpg");
  REQUIRE(d.valid.samples[0].boxes.size() == 1);
  check_box(d.valid.samples[0].boxes[0], 0.25, 0.5, 0.5, 1, 2, false);
  CHECK(d.valid.counts.images == 1);
  CHECK(d.description.find("; valid (" + (dir / "annotations/instances_validation.json")) != std::string::npos);

  // A validation file whose categories disagree with the training file's.
  std::string valid = dir / "annotations/instances_validation.json";
  write_text_file(valid, coco_json("", "", "{\"id\": 9, \"name\": \"bird\"}\n"));
  CHECK(error_of(dir.path()).rfind(valid + ":5: category 9 'bird' is not among the training file's categories", 0) ==
        0);
  write_text_file(valid, coco_json("", "", "{\"id\": 9, \"name\": \"car\"}\n"));
  CHECK(error_of(dir.path()).rfind(valid + ":5: category 9 'car': the training file gives it id 3", 0) == 0);
}

TEST_CASE("coco: image folders in the 2017 layout, under images/, and errors listing what was found") {
  TempDir dir;
  std::string one_image = "{\"id\": 1, \"file_name\": \"x.jpg\", \"width\": 8, \"height\": 8}\n";
  std::string cats = "{\"id\": 1, \"name\": \"a\"}\n";
  std::filesystem::create_directories(dir / "train2017");
  std::filesystem::create_directories(dir / "images/val2017");
  write_text_file(dir / "annotations/instances_train2017.json", coco_json(one_image, "", cats));
  write_text_file(dir / "annotations/instances_val2017.json", coco_json(one_image, "", cats));
  Dataset d = read_coco(dir.path(), {});
  CHECK(d.train.samples.at(0).image == dir / "train2017/x.jpg");
  CHECK(d.valid.samples.at(0).image == dir / "images/val2017/x.jpg");

  // A lone file beside a plain images/ folder.
  TempDir flat;
  std::filesystem::create_directories(flat / "images");
  write_text_file(flat / "instances_mine.json", coco_json(one_image, "", cats));
  CHECK(read_coco(flat / "instances_mine.json", {}).train.samples.at(0).image == flat / "images/x.jpg");

  std::filesystem::remove_all(flat / "images");
  std::string message = error_of(flat / "instances_mine.json");
  CHECK_MESSAGE(message.find("no image folder found; looked for " + (flat / "mine/images") + ", " + (flat / "mine") +
                             ", " + (flat / "images/mine") + ", " + (flat / "images")) != std::string::npos,
                message);

  write_text_file(dir / "annotations/instances_train_extra.json", coco_json(one_image, "", cats));
  message = error_of(dir.path());
  CHECK_MESSAGE(message.find("expected exactly one") != std::string::npos, message);
  CHECK_MESSAGE(message.find("instances_train2017.json") != std::string::npos, message);
  CHECK_MESSAGE(message.find("instances_train_extra.json") != std::string::npos, message);

  TempDir empty;
  message = error_of(empty.path());
  CHECK_MESSAGE(message.find("found train: none, validation: none") != std::string::npos, message);
}
