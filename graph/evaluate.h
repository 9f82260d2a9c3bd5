// Inference with a trained executor: detections per image (decoded from the [yolo] layers,
// NMS per class, boxes mapped back through the loader's letterbox or stretch to original
// image pixels), mAP over a dataset split, and writing images with the detections drawn.
#pragma once
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/metrics.h"
#include "data/transform.h"
#include "graph/executor.h"

namespace yolo::graph {

struct DetectOptions {
  float threshold = 0.25f;     // score = objectness * class probability
  float nms = 0.45f;           // IoU above which a lower-scored box of the same class is removed
  data::ResizeMode resize = data::ResizeMode::Letterbox;
  int threads = 0;             // loader threads
};

struct PixelDetection {
  int class_id = 0;
  float score = 0;
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // original image pixels, clipped to the image
};

struct ImageDetections {
  std::string image;
  int width = 0, height = 0;
  bool ok = false;  // false: the image could not be read
  std::vector<PixelDetection> detections;  // by class, then descending score
};

// Detections for every sample of `samples` (in order), batched through the executor's
// micro-batch. The executor must hold a detector.
std::vector<ImageDetections> detect_samples(Executor& executor, const std::vector<data::Sample>& samples,
                                            const DetectOptions& options);

// mAP of a split (detections above 0.005 as darknet's `detector map` counts them); `found`, when
// given, receives the detections (per sample, in order).
data::MapResult evaluate_split(Executor& executor, const data::Split& split, int classes, DetectOptions options,
                               std::vector<ImageDetections>* found = nullptr);

// COCO's results format, which pycocotools' loadRes reads: a JSON array of {"image_id",
// "category_id", "bbox": [x, y, width, height] (pixels, top-left corner), "score"}. Ids are the
// dataset's own for COCO (its image ids, and `category_ids`, since COCO's are not contiguous);
// for the other formats (`category_ids` empty) the ids a COCO file written for the same set by
// data/synthetic.h has: the sample's image_id (its 1-based position as listed) and the class
// index + 1. Unreadable images give nothing. Throws yolo::Error naming the file if it cannot be
// written.
void write_coco_detections(const std::string& path, const std::vector<ImageDetections>& found, const data::Split& split,
                           const std::vector<int64_t>& category_ids);

// One detection as `train_yolo detect --json` prints it: a JSON object on one line,
// {"image", "class", "score", "box": [x0, y0, x1, y1] (pixels)}, its strings escaped.
std::string detection_json(const std::string& image, const std::string& class_name, const PixelDetection& d);

// Writes `image` with its detections drawn to `path` (PNG or JPEG by extension).
void write_detections_image(const ImageDetections& detections, const std::vector<std::string>& names,
                            const std::string& path);

}  // namespace yolo::graph
