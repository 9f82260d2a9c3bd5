// A synthetic detection dataset: coloured rectangles, ellipses and triangles of varied sizes,
// colours and positions (overlaps allowed) over a noisy background, written as real image
// files with the labels in every format open_dataset reads (YOLO text, VOC XML, COCO JSON, a
// darknet .data file). The default run and the tests train and check on it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image.h"

namespace yolo::data {

struct SyntheticOptions {
  int train_images = 200;
  int valid_images = 50;
  int width = 640, height = 480;  // every image
  int min_shapes = 1, max_shapes = 6;
  uint64_t seed = 1;
  bool png = false;  // JPEG (quality 90) by default
};

// The class names, in class-id order.
const std::vector<std::string>& synthetic_class_names();  // {"rectangle", "ellipse", "triangle"}

// Draws image `index` of the stream keyed by `seed`: pixels, and its ground-truth boxes (the
// tight pixel-aligned bounding box of each shape as drawn, normalised).
void draw_synthetic_image(uint64_t seed, int64_t index, int width, int height, int min_shapes, int max_shapes,
                          Image& image, std::vector<Box>& boxes);

struct SyntheticSet {
  std::string root;
  std::string data_file;   // root/shapes.data (darknet)
  std::string names_file;  // root/shapes.names
  std::vector<Sample> train, valid;  // ground truth as drawn (image = path written)
};

// Writes the dataset under `root` (created if needed):
//   shapes.names, shapes.data, train.txt, valid.txt              (darknet; paths relative to root)
//   train/images/NNNNNN.jpg, train/labels/NNNNNN.txt             (YOLO text; also the folders format)
//   train/annotations/NNNNNN.xml                                 (Pascal VOC, imageai's layout)
//   validation/... the same for the validation split
//   annotations/instances_train.json, instances_validation.json  (COCO; category ids 1..3)
SyntheticSet write_synthetic_dataset(const std::string& root, const SyntheticOptions& options);

}  // namespace yolo::data
