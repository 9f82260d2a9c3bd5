// Heads that follow the dataset: a detector cfg written for one class count (YOLOv3's 80) trained
// on a dataset with another gets its [yolo] layers' classes and the filters of the convolution
// before each ((5 + classes) per anchor of its mask) rewritten, as imageai and ultralytics do,
// instead of refusing. The rewritten cfg keeps the file's comments and layout: only those lines
// change (a missing classes= or filters= line is added after its section's header).
#pragma once
#include <string>
#include <vector>

#include "graph/cfg.h"

namespace yolo::graph {

struct ResizedHeads {
  std::string cfg_text;          // the cfg as trained
  std::vector<int> head_layers;  // the convolutions before the [yolo] layers (layer indices)
  int old_classes = 0, classes = 0;
};

// The cfg at `path` (text `text`) with every [yolo] head sized for `classes`. Throws yolo::Error
// naming the file and line when a [yolo] does not follow a [convolutional] (nothing to resize).
ResizedHeads resize_yolo_heads(const std::string& text, const std::string& path, int classes);

// The cfg text with every [yolo]'s anchors= set to `anchors` ("10,13, 16,30, ..."; each head
// picks its own by mask, as darknet's cfgs have it), the line added where a [yolo] has none.
std::string set_yolo_anchors(const std::string& text, const std::string& path, const std::string& anchors);

// The convolutions feeding the [yolo] layers of `spec` (layer indices, ascending).
std::vector<int> yolo_head_layers(const ModelSpec& spec);

}  // namespace yolo::graph
