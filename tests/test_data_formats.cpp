// One synthetic set read through all four formats gives the generator's boxes in each; and
// the whole pipeline (decode, jitter, flip, letterbox, batch) keeps every box on its shape.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "tests/test_support.h"

using namespace yolo::data;
using yolo::testing::TempDir;

namespace {

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// Boxes by image file name, with class names rather than ids (formats may order classes differently).
struct NamedBox {
  Box box;
  std::string name;
};
std::map<std::string, std::vector<NamedBox>> by_file(const std::vector<Sample>& samples,
                                                     const std::vector<std::string>& names) {
  std::map<std::string, std::vector<NamedBox>> out;
  for (const Sample& s : samples) {
    auto& boxes = out[file_name(s.image)];
    for (const Box& b : s.boxes) boxes.push_back({b, names.at(b.class_id)});
  }
  return out;
}

void check_same(const std::vector<Sample>& got, const std::vector<std::string>& got_names,
                const std::vector<Sample>& truth, const char* format) {
  CAPTURE(format);
  auto a = by_file(got, got_names), b = by_file(truth, synthetic_class_names());
  REQUIRE(a.size() == b.size());
  for (const auto& [file, boxes] : b) {
    CAPTURE(file);
    REQUIRE(a.count(file) == 1);
    const auto& other = a[file];
    REQUIRE(other.size() == boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k) {
      CHECK(other[k].name == boxes[k].name);
      CHECK(std::abs(other[k].box.x - boxes[k].box.x) < 1e-5f);
      CHECK(std::abs(other[k].box.y - boxes[k].box.y) < 1e-5f);
      CHECK(std::abs(other[k].box.w - boxes[k].box.w) < 1e-5f);
      CHECK(std::abs(other[k].box.h - boxes[k].box.h) < 1e-5f);
      CHECK_FALSE(other[k].box.difficult);
    }
  }
}

}  // namespace

TEST_CASE("every format reads the same synthetic set to the generator's boxes") {
  TempDir dir;
  SyntheticOptions o;
  o.train_images = 7;
  o.valid_images = 3;
  o.width = 101;
  o.height = 77;
  o.png = true;
  o.seed = 5;
  SyntheticSet set = write_synthetic_dataset(dir / "shapes", o);

  for (Format format : {Format::Darknet, Format::Folders, Format::Voc, Format::Coco}) {
    OpenOptions open;
    open.force_format = true;
    open.format = format;
    std::string path = format == Format::Darknet ? set.data_file : set.root;
    Dataset d = open_dataset(path, open);
    CHECK(d.format == format);
    check_same(d.train.samples, d.class_names, set.train, format_name(format));
    check_same(d.valid.samples, d.class_names, set.valid, format_name(format));
    CHECK(d.train.counts.missing_label_files == 0);
    CHECK(d.train.counts.clipped_boxes == 0);
  }
  // Detected without being told: the .data file, the COCO json, and VOC's sorted class names.
  CHECK(open_dataset(set.data_file).format == Format::Darknet);
  CHECK(open_dataset(set.root + "/annotations/instances_train.json").format == Format::Coco);
  OpenOptions voc;
  voc.force_format = true;
  voc.format = Format::Voc;
  CHECK(open_dataset(set.root, voc).class_names == std::vector<std::string>{"ellipse", "rectangle", "triangle"});
  voc.names_file = set.names_file;
  CHECK(open_dataset(set.root, voc).class_names == synthetic_class_names());
}

namespace {

// Seven colours that a bilinear blend of any two of them can never produce exactly.
const uint8_t kPure[7][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 0}, {255, 0, 255}, {0, 255, 255}, {255, 255, 255}};

int pure_colour_of(const float* p) {
  for (int k = 0; k < 7; ++k)
    if (std::abs(p[0] - kPure[k][0] / 255.0f) < 1e-4f && std::abs(p[1] - kPure[k][1] / 255.0f) < 1e-4f &&
        std::abs(p[2] - kPure[k][2] / 255.0f) < 1e-4f)
      return k;
  return -1;
}

}  // namespace

TEST_CASE("augmented samples' boxes still cover the generator's shapes (flip, scale, crop, letterbox)") {
  TempDir dir;
  // Label images: each ground-truth box of a generated image painted in its own pure colour,
  // in drawing order, on black; the generator leaves every shape at least half uncovered.
  Split split;
  split.name = "train";
  const int images = 8;
  for (int i = 0; i < images; ++i) {
    Image drawn;
    std::vector<Box> boxes;
    draw_synthetic_image(77, i, 160 + 8 * i, 120, 2, 6, drawn, boxes);
    Image label;
    label.width = drawn.width;
    label.height = drawn.height;
    label.rgb.assign(drawn.rgb.size(), 0);
    for (size_t k = 0; k < boxes.size(); ++k) {
      const Box& b = boxes[k];
      int x0 = static_cast<int>(std::lround((b.x - b.w / 2) * label.width));
      int x1 = static_cast<int>(std::lround((b.x + b.w / 2) * label.width));
      int y0 = static_cast<int>(std::lround((b.y - b.h / 2) * label.height));
      int y1 = static_cast<int>(std::lround((b.y + b.h / 2) * label.height));
      for (int y = y0; y < y1; ++y)
        for (int x = x0; x < x1; ++x) std::copy(kPure[k], kPure[k] + 3, label.pixel(x, y));
    }
    Sample s;
    s.image = dir / ("label" + std::to_string(i) + ".png");
    s.boxes = boxes;
    write_image(s.image, label);
    split.samples.push_back(s);
  }
  LoaderOptions o;
  o.batch = 4;
  o.net_w = 96;
  o.net_h = 128;
  o.augment = true;
  o.augment_params.jitter = 0.3f;  // colour left alone: the colours identify the boxes
  o.threads = 2;
  o.seed = yolo::testing::Rng().seed();
  CAPTURE(o.seed);
  Loader loader(split, o);
  int flipped = 0, checked = 0;
  for (int step = 0; step < 6; ++step) {
    const Batch& batch = loader.next();
    for (int i = 0; i < batch.count; ++i) {
      flipped += batch.samples[i].placement.flip;
      const float* img = batch.images + static_cast<size_t>(i) * batch.net_w * batch.net_h * 3;
      for (int t = 0; t < batch.truth_counts[i]; ++t) {
        const yolo::YoloTruth& truth = batch.truths[static_cast<size_t>(i) * kMaxBoxes + t];
        double x0 = (truth.x - truth.w / 2) * batch.net_w, x1 = (truth.x + truth.w / 2) * batch.net_w;
        double y0 = (truth.y - truth.h / 2) * batch.net_h, y1 = (truth.y + truth.h / 2) * batch.net_h;
        // A box clipped by the network border may show only its covered part: judge whole boxes.
        if (x0 < 1 || y0 < 1 || x1 > batch.net_w - 1 || y1 > batch.net_h - 1) continue;
        // The box's colour: the most common pure colour inside it.
        int votes[7] = {}, inside = 0;
        for (int y = 0; y < batch.net_h; ++y)
          for (int x = 0; x < batch.net_w; ++x)
            if (x + 0.5 > x0 + 1.5 && x + 0.5 < x1 - 1.5 && y + 0.5 > y0 + 1.5 && y + 0.5 < y1 - 1.5) {
              ++inside;
              int c = pure_colour_of(img + (static_cast<size_t>(y) * batch.net_w + x) * 3);
              if (c >= 0) ++votes[c];
            }
        if (inside < 4) continue;  // too thin to judge after clipping
        int colour = static_cast<int>(std::max_element(votes, votes + 7) - votes);
        CAPTURE(step);
        CAPTURE(i);
        CAPTURE(t);
        // At least half of the shape is uncovered; the bilinear edge band takes a little more.
        CHECK(votes[colour] >= 0.4 * inside);
        // Every pixel of that colour lies inside the box (grown by the bilinear edge band).
        int outside = 0;
        for (int y = 0; y < batch.net_h; ++y)
          for (int x = 0; x < batch.net_w; ++x)
            if ((x + 0.5 < x0 - 1.5 || x + 0.5 > x1 + 1.5 || y + 0.5 < y0 - 1.5 || y + 0.5 > y1 + 1.5) &&
                pure_colour_of(img + (static_cast<size_t>(y) * batch.net_w + x) * 3) == colour)
              ++outside;
        CHECK(outside == 0);
        ++checked;
      }
    }
  }
  CHECK(checked > 10);
  CHECK(flipped > 0);
  CHECK(flipped < 24);
}
