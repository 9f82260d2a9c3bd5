// Shared pieces of the graph tests: a tiny detector cfg and batches of synthetic images.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/synthetic.h"
#include "kernels/yolo_loss.h"

namespace yolo::testing {

// 64x64 input, two strided BN convs and a maxpool, one [yolo] head of 3 anchors and 3 classes
// (batch 4 in 2 subdivisions, 6 steps, burn-in 2, a rate step at 4).
inline const char* const kTinyDetectorCfg = R"(
[net]
batch=4
subdivisions=2
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
filters=8
size=3
stride=2
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
batch_normalize=1
filters=16
size=3
stride=2
pad=1
activation=leaky
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

// n synthetic images of w x h (stream `seed`, images first .. first + n - 1) as a network
// input batch (NHWC floats in [0, 1]) with their truths.
inline void synthetic_batch(uint64_t seed, int64_t first, int n, int w, int h, std::vector<float>& images,
                            std::vector<YoloTruth>& truths, std::vector<int>& counts) {
  images.assign(static_cast<size_t>(n) * w * h * 3, 0.0f);
  truths.assign(static_cast<size_t>(n) * kYoloMaxTruths, YoloTruth{});
  counts.assign(n, 0);
  for (int b = 0; b < n; ++b) {
    data::Image image;
    std::vector<data::Box> boxes;
    data::draw_synthetic_image(seed, first + b, w, h, 1, 3, image, boxes);
    for (size_t k = 0; k < image.rgb.size(); ++k) images[b * image.rgb.size() + k] = image.rgb[k] / 255.0f;
    counts[b] = static_cast<int>(boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k)
      truths[b * kYoloMaxTruths + k] = YoloTruth{boxes[k].x, boxes[k].y, boxes[k].w, boxes[k].h, boxes[k].class_id};
  }
}

// A 12-image training set (80x60 PNGs, 1 validation image) written under `root` and opened.
inline data::Dataset small_shapes_dataset(const std::string& root) {
  data::SyntheticOptions options;
  options.train_images = 12;
  options.valid_images = 1;
  options.width = 80;
  options.height = 60;
  options.png = true;
  return data::open_dataset(data::write_synthetic_dataset(root, options).data_file);
}

}  // namespace yolo::testing
