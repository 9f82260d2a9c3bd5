// The synthetic shapes dataset: determinism, pixel-aligned tight boxes that match the painted
// shape (class checked by fill ratio), the occlusion rule, class coverage, and the files that
// write_synthetic_dataset produces in every label format (JPEG and PNG).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/image.h"
#include "data/synthetic.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

struct PixelBox {
  int c0, r0, c1, r1;  // inclusive
};

// The pixel corners of a normalised box, checking the documented alignment on the way.
PixelBox pixel_box(const Box& box, int width, int height) {
  double x2 = double(box.x) * width * 2, w = double(box.w) * width;
  double y2 = double(box.y) * height * 2, h = double(box.h) * height;
  CHECK(std::abs(x2 - std::round(x2)) < 1e-3);
  CHECK(std::abs(w - std::round(w)) < 1e-3);
  CHECK(std::abs(y2 - std::round(y2)) < 1e-3);
  CHECK(std::abs(h - std::round(h)) < 1e-3);
  int c0 = int(std::lround((x2 - w) / 2)), r0 = int(std::lround((y2 - h) / 2));
  return {c0, r0, c0 + int(std::lround(w)) - 1, r0 + int(std::lround(h)) - 1};
}

bool same_colour(const uint8_t* a, const uint8_t* b) { return a[0] == b[0] && a[1] == b[1] && a[2] == b[2]; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string stem(int i) {
  char name[16];
  std::snprintf(name, sizeof name, "%06d", i);
  return name;
}

}  // namespace

TEST_CASE("synthetic: an image is a pure function of (seed, index)") {
  Image a, b, c, d;
  std::vector<Box> boxes_a, boxes_b, boxes_c, boxes_d;
  draw_synthetic_image(7, 3, 96, 64, 1, 6, a, boxes_a);
  draw_synthetic_image(7, 3, 96, 64, 1, 6, b, boxes_b);
  draw_synthetic_image(7, 4, 96, 64, 1, 6, c, boxes_c);
  draw_synthetic_image(8, 3, 96, 64, 1, 6, d, boxes_d);
  REQUIRE(a.width == 96);
  REQUIRE(a.height == 64);
  REQUIRE(a.rgb.size() == size_t(96 * 64 * 3));
  CHECK(a.rgb == b.rgb);
  REQUIRE(boxes_a.size() == boxes_b.size());
  for (size_t i = 0; i < boxes_a.size(); ++i) {
    CHECK(boxes_a[i].x == boxes_b[i].x);
    CHECK(boxes_a[i].y == boxes_b[i].y);
    CHECK(boxes_a[i].w == boxes_b[i].w);
    CHECK(boxes_a[i].h == boxes_b[i].h);
    CHECK(boxes_a[i].class_id == boxes_b[i].class_id);
  }
  CHECK(a.rgb != c.rgb);
  CHECK(a.rgb != d.rgb);
}

TEST_CASE("synthetic: a lone shape's box is tight around exactly its pixels, and its fill fits its class") {
  const int width = 120, height = 90;
  int per_class[3] = {0, 0, 0};
  for (int index = 0; index < 40; ++index) {
    CAPTURE(index);
    Image image;
    std::vector<Box> boxes;
    draw_synthetic_image(11, index, width, height, 1, 1, image, boxes);
    REQUIRE(boxes.size() == 1);
    const Box& box = boxes[0];
    PixelBox b = pixel_box(box, width, height);
    REQUIRE(b.c0 >= 0);
    REQUIRE(b.r0 >= 0);
    REQUIRE(b.c1 < width);
    REQUIRE(b.r1 < height);
    // Sides of 6%..45% of the image (a triangle's tip may lose a pixel column or row).
    CHECK(b.c1 - b.c0 + 1 >= int(0.06 * width) - 1);
    CHECK(b.c1 - b.c0 + 1 <= int(0.45 * width));
    CHECK(b.r1 - b.r0 + 1 >= int(0.06 * height) - 1);
    CHECK(b.r1 - b.r0 + 1 <= int(0.45 * height));
    // The shape is flat-coloured and the noisy background never hits that exact colour: the
    // most common colour in the box is the shape's.
    std::map<uint32_t, int> histogram;
    for (int y = b.r0; y <= b.r1; ++y)
      for (int x = b.c0; x <= b.c1; ++x) {
        const uint8_t* p = image.pixel(x, y);
        ++histogram[uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2]];
      }
    auto mode = std::max_element(histogram.begin(), histogram.end(),
                                 [](const auto& l, const auto& r) { return l.second < r.second; });
    const uint8_t colour[3] = {uint8_t(mode->first >> 16), uint8_t(mode->first >> 8), uint8_t(mode->first)};
    int inside = 0, outside = 0;
    bool top = false, bottom = false, left = false, right = false;
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) {
        if (!same_colour(image.pixel(x, y), colour)) continue;
        bool in_box = x >= b.c0 && x <= b.c1 && y >= b.r0 && y <= b.r1;
        (in_box ? inside : outside) += 1;
        top |= y == b.r0;
        bottom |= y == b.r1;
        left |= x == b.c0;
        right |= x == b.c1;
      }
    CHECK(outside == 0);
    CHECK(top);
    CHECK(bottom);
    CHECK(left);
    CHECK(right);
    double fill = double(inside) / ((b.c1 - b.c0 + 1) * (b.r1 - b.r0 + 1));
    CAPTURE(box.class_id);
    REQUIRE(box.class_id >= 0);
    REQUIRE(box.class_id < 3);
    ++per_class[box.class_id];
    if (box.class_id == 0) CHECK(fill == 1.0);
    if (box.class_id == 1) CHECK((fill > 0.65 && fill < 0.9));  // pi/4 = 0.785
    if (box.class_id == 2) CHECK((fill > 0.35 && fill < 0.68));  // 1/2
  }
  for (int c = 0; c < 3; ++c) CHECK(per_class[c] > 0);
}

TEST_CASE("synthetic: many shapes: boxes inside the image, all classes, none more than half buried") {
  const int width = 160, height = 120;
  int per_class[3] = {0, 0, 0};
  size_t most = 0;
  for (int index = 0; index < 50; ++index) {
    CAPTURE(index);
    Image image;
    std::vector<Box> boxes;
    draw_synthetic_image(3, index, width, height, 2, 6, image, boxes);
    CHECK(!boxes.empty());
    CHECK(boxes.size() <= 6);
    most = std::max(most, boxes.size());
    std::vector<PixelBox> pixel_boxes;
    for (const Box& box : boxes) {
      CHECK(box.x - box.w / 2 >= -1e-6f);
      CHECK(box.x + box.w / 2 <= 1 + 1e-6f);
      CHECK(box.y - box.h / 2 >= -1e-6f);
      CHECK(box.y + box.h / 2 <= 1 + 1e-6f);
      CHECK(box.w > 0);
      CHECK(box.h > 0);
      REQUIRE(box.class_id >= 0);
      REQUIRE(box.class_id < 3);
      ++per_class[box.class_id];
      pixel_boxes.push_back(pixel_box(box, width, height));
    }
    // Boxes come in drawing order: count each box's pixels covered by later boxes.
    for (size_t i = 0; i < pixel_boxes.size(); ++i) {
      const PixelBox& b = pixel_boxes[i];
      int covered = 0;
      for (int y = b.r0; y <= b.r1; ++y)
        for (int x = b.c0; x <= b.c1; ++x)
          for (size_t j = i + 1; j < pixel_boxes.size(); ++j) {
            const PixelBox& o = pixel_boxes[j];
            if (x >= o.c0 && x <= o.c1 && y >= o.r0 && y <= o.r1) {
              ++covered;
              break;
            }
          }
      CHECK(2 * covered <= (b.c1 - b.c0 + 1) * (b.r1 - b.r0 + 1));
    }
  }
  for (int c = 0; c < 3; ++c) CHECK(per_class[c] >= 10);
  CHECK(most >= 5);
}

TEST_CASE("synthetic: bad sizes and shape counts are refused") {
  Image image;
  std::vector<Box> boxes;
  CHECK_THROWS_WITH_AS(draw_synthetic_image(1, 0, 8, 64, 1, 2, image, boxes), doctest::Contains("8x64"), Error);
  CHECK_THROWS_WITH_AS(draw_synthetic_image(1, 0, 64, 64, 3, 2, image, boxes), doctest::Contains("min (3)"), Error);
  CHECK_THROWS_AS(draw_synthetic_image(1, 0, 64, 64, 1, kMaxBoxes + 1, image, boxes), Error);
  draw_synthetic_image(1, 0, 64, 64, 0, 0, image, boxes);
  CHECK(boxes.empty());
}

TEST_CASE("synthetic: write_synthetic_dataset writes every format, consistent with the drawing") {
  TempDir dir;
  SyntheticOptions options;
  options.train_images = 6;
  options.valid_images = 3;
  options.width = 160;
  options.height = 120;
  options.seed = 5;
  const std::string root = dir / "shapes";
  SyntheticSet set = write_synthetic_dataset(root, options);
  CHECK(set.root == root);
  CHECK(set.data_file == root + "/shapes.data");
  CHECK(set.names_file == root + "/shapes.names");
  CHECK(read_text(set.names_file) == "rectangle\nellipse\ntriangle\n");
  CHECK(read_text(set.data_file) == "classes=3\ntrain=train.txt\nvalid=valid.txt\nnames=shapes.names\nbackup=backup/\n");
  CHECK(std::filesystem::is_directory(root + "/backup"));
  REQUIRE(set.train.size() == 6);
  REQUIRE(set.valid.size() == 3);

  const char* names[3] = {"rectangle", "ellipse", "triangle"};
  struct Split {
    const char* folder;
    const char* list;
    const char* coco;
    const std::vector<Sample>* samples;
    int64_t index_offset;
  };
  const Split splits[2] = {{"train", "train.txt", "instances_train.json", &set.train, 0},
                           {"validation", "valid.txt", "instances_validation.json", &set.valid, int64_t(1) << 40}};
  for (const Split& split : splits) {
    CAPTURE(split.folder);
    std::string list, json = read_text(root + "/annotations/" + split.coco);
    CHECK(contains(json, "\"categories\""));
    CHECK(contains(json, "{\"id\": 2, \"name\": \"ellipse\"}"));
    for (size_t i = 0; i < split.samples->size(); ++i) {
      CAPTURE(i);
      const Sample& sample = (*split.samples)[i];
      std::string relative = std::string(split.folder) + "/images/" + stem(int(i)) + ".jpg";
      list += relative + "\n";
      CHECK(sample.image == root + "/" + relative);
      Image drawn, read;
      std::vector<Box> boxes;
      draw_synthetic_image(options.seed, split.index_offset + int64_t(i), options.width, options.height,
                           options.min_shapes, options.max_shapes, drawn, boxes);
      std::string error;
      REQUIRE_MESSAGE(read_image(sample.image, read, error), error);
      REQUIRE(read.rgb.size() == drawn.rgb.size());
      double sum = 0;
      for (size_t k = 0; k < read.rgb.size(); ++k) sum += std::abs(int(read.rgb[k]) - int(drawn.rgb[k]));
      CHECK(sum / double(read.rgb.size()) < 8.0);  // JPEG quality 90 of the same pixels

      REQUIRE(sample.boxes.size() == boxes.size());
      std::istringstream labels(read_text(root + "/" + split.folder + "/labels/" + stem(int(i)) + ".txt"));
      std::string xml = read_text(root + "/" + split.folder + "/annotations/" + stem(int(i)) + ".xml");
      CHECK(contains(xml, "<filename>" + stem(int(i)) + ".jpg</filename>"));
      CHECK(contains(xml, "<width>160</width>"));
      CHECK(contains(xml, "<height>120</height>"));
      CHECK(contains(xml, "<depth>3</depth>"));
      CHECK(contains(json, "\"id\": " + std::to_string(i + 1) + ", \"file_name\": \"" + stem(int(i)) + ".jpg\", \"width\": 160, \"height\": 120"));
      for (size_t k = 0; k < boxes.size(); ++k) {
        CAPTURE(k);
        const Box& box = sample.boxes[k];
        CHECK(box.class_id == boxes[k].class_id);
        CHECK(box.x == boxes[k].x);
        CHECK(box.y == boxes[k].y);
        CHECK(box.w == boxes[k].w);
        CHECK(box.h == boxes[k].h);
        int class_id = -1;
        double x = 0, y = 0, w = 0, h = 0;
        REQUIRE(bool(labels >> class_id >> x >> y >> w >> h));
        CHECK(class_id == box.class_id);
        CHECK(std::abs(x - box.x) < 1e-6);
        CHECK(std::abs(y - box.y) < 1e-6);
        CHECK(std::abs(w - box.w) < 1e-6);
        CHECK(std::abs(h - box.h) < 1e-6);
        PixelBox b = pixel_box(box, options.width, options.height);
        CHECK(contains(xml, std::string("<name>") + names[box.class_id] + "</name>"));
        CHECK(contains(xml, "<xmin>" + std::to_string(b.c0 + 1) + "</xmin>\n      <ymin>" + std::to_string(b.r0 + 1) +
                                "</ymin>\n      <xmax>" + std::to_string(b.c1 + 1) + "</xmax>\n      <ymax>" +
                                std::to_string(b.r1 + 1) + "</ymax>"));
        int bw = b.c1 - b.c0 + 1, bh = b.r1 - b.r0 + 1;
        CHECK(contains(json, "\"image_id\": " + std::to_string(i + 1) + ", \"category_id\": " +
                                 std::to_string(box.class_id + 1) + ", \"bbox\": [" + std::to_string(b.c0) + ", " +
                                 std::to_string(b.r0) + ", " + std::to_string(bw) + ", " + std::to_string(bh) +
                                 "], \"area\": " + std::to_string(bw * bh) + ", \"iscrowd\": 0"));
      }
      int extra = 0;
      CHECK_FALSE(bool(labels >> extra));  // no more lines than boxes
    }
    CHECK(read_text(root + "/" + split.list) == list);
  }
  // Train and validation come from different parts of the stream.
  Image train0, valid0;
  std::string error;
  REQUIRE(read_image(set.train[0].image, train0, error));
  REQUIRE(read_image(set.valid[0].image, valid0, error));
  CHECK(train0.rgb != valid0.rgb);
}

TEST_CASE("synthetic: PNG option writes lossless images; unwritable roots throw naming the path") {
  TempDir dir;
  SyntheticOptions options;
  options.train_images = 2;
  options.valid_images = 1;
  options.width = 48;
  options.height = 32;
  options.png = true;
  options.seed = 9;
  SyntheticSet set = write_synthetic_dataset(dir.path(), options);
  REQUIRE(set.train.size() == 2);
  CHECK(set.train[1].image == dir / "train/images/000001.png");
  CHECK(read_text(dir / "valid.txt") == "validation/images/000000.png\n");
  Image read, drawn;
  std::vector<Box> boxes;
  std::string error;
  REQUIRE_MESSAGE(read_image(set.train[1].image, read, error), error);
  draw_synthetic_image(9, 1, 48, 32, options.min_shapes, options.max_shapes, drawn, boxes);
  CHECK(read.rgb == drawn.rgb);

  write_text_file(dir / "file", "a file where a folder should be");
  CHECK_THROWS_WITH_AS(write_synthetic_dataset(dir / "file/set", options), doctest::Contains((dir / "file").c_str()), Error);
  options.width = 4;
  CHECK_THROWS_WITH_AS(write_synthetic_dataset(dir / "other", options), doctest::Contains("4x32"), Error);
  CHECK_FALSE(std::filesystem::exists(dir / "other"));  // checked before anything is written
}
