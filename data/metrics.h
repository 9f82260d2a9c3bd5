// Detection quality: per-class average precision and mAP, as darknet's `detector map` computes
// it (mAP@0.5, all-point interpolation) and as COCO does (mAP@0.5:0.95, 101-point
// interpolation). Boxes in original-image pixels, corners, continuous coordinates.
#pragma once
#include <string>
#include <vector>

namespace yolo::data {

struct EvalBox {
  int image = 0;  // any id shared by a detection and the truths of its image
  int class_id = 0;
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  float score = 0;         // detections
  bool difficult = false;  // truths: neither matched nor counted as missed
};

struct ClassAp {
  int class_id = 0;
  int truths = 0;        // non-difficult
  int detections = 0;    // above min_score
  double ap50 = 0;       // all-point interpolated AP at IoU > 0.5
  double ap50_95 = 0;    // mean over IoU 0.50, 0.55, ..., 0.95 of 101-point interpolated AP
};

struct MapResult {
  std::vector<ClassAp> classes;  // every class id in [0, classes)
  double map50 = 0;      // mean ap50 over classes with at least one non-difficult truth
  double map50_95 = 0;   // the same for ap50_95
  std::string table(const std::vector<std::string>& names) const;  // per-class lines + totals
};

// Detections below min_score are ignored (darknet: 0.005). Matching, per class and IoU
// threshold t: detections by descending score (ties: input order); each looks at the truth of
// its image and class with the highest IoU (matched or not, as VOC and darknet do); if the IoU
// passes (> t for darknet's AP50, >= t for the COCO thresholds): a difficult truth -> the
// detection is ignored (neither TP nor FP), an unmatched one -> true positive (the truth is now
// matched), an already matched one -> false positive (a duplicate); otherwise false positive.
MapResult evaluate_map(const std::vector<EvalBox>& detections, const std::vector<EvalBox>& truths, int classes,
                       float min_score = 0.005f);

// The interpolations, over a precision/recall curve in detection order.
double average_precision_all_points(const std::vector<double>& recall, const std::vector<double>& precision);
double average_precision_101(const std::vector<double>& recall, const std::vector<double>& precision);

}  // namespace yolo::data
