// Anchors from the dataset (darknet's calc_anchors, imageai's automatic anchors): seeded k-means
// over the box sizes as the network sees them (after letterbox or stretch to its input), with
// 1 - IoU as the distance (boxes compared as if centred on each other, so big and small boxes
// count alike), and how well a set of anchors fits the boxes (mean best IoU).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/transform.h"

namespace yolo::data {

struct BoxSize {
  float w = 0, h = 0;  // network pixels
};

// The split's box sizes at net_w x net_h; letterbox reads each image's size from its header
// (images whose header cannot be read are skipped and counted in *unreadable).
std::vector<BoxSize> network_box_sizes(const Split& split, int net_w, int net_h, ResizeMode mode,
                                       int64_t* unreadable = nullptr);

// IoU of two sizes centred on each other.
double size_iou(BoxSize a, BoxSize b);

// k anchors (k-means++ seeding from `seed`, then Lloyd iterations with 1 - IoU, each centre the
// mean of its boxes; the best mean IoU of 8 seedings, all from `seed`) sorted by area; throws
// yolo::Error when there are fewer boxes than k.
std::vector<BoxSize> kmeans_anchors(const std::vector<BoxSize>& boxes, int k, uint64_t seed);

// The mean over boxes of the best IoU with any anchor (0 without boxes).
double mean_best_iou(const std::vector<BoxSize>& boxes, const std::vector<BoxSize>& anchors);

// "10,13, 16,30, 33,23" (rounded to whole pixels, as cfgs write them).
std::string anchors_text(const std::vector<BoxSize>& anchors);

}  // namespace yolo::data
