// Per-class average precision and mAP (darknet/VOC all-point AP at IoU > 0.5, COCO 101-point
// AP averaged over IoU 0.50:0.95): matching of detections to truths, the interpolations, a table.
#include "data/metrics.h"

#include <algorithm>
#include <cstdio>

#include "runtime/check.h"

namespace yolo::data {

namespace {

constexpr int kCocoThresholds = 10;  // IoU 0.50, 0.55, ..., 0.95

// Continuous corner boxes: no +1 on widths. Empty or inverted boxes have no area.
double iou(const EvalBox& a, const EvalBox& b) {
  double w = std::min<double>(a.x1, b.x1) - std::max<double>(a.x0, b.x0);
  double h = std::min<double>(a.y1, b.y1) - std::max<double>(a.y0, b.y0);
  if (!(w > 0 && h > 0)) return 0;
  double inter = w * h;
  double area_a = std::max(0.0, double(a.x1) - a.x0) * std::max(0.0, double(a.y1) - a.y0);
  double area_b = std::max(0.0, double(b.x1) - b.x0) * std::max(0.0, double(b.y1) - b.y0);
  return inter / (area_a + area_b - inter);
}

void check_class(const EvalBox& box, size_t index, const char* what, int classes) {
  if (box.class_id < 0 || box.class_id >= classes)
    throw Error("evaluate_map: " + std::string(what) + " " + std::to_string(index) + " has class id " +
                std::to_string(box.class_id) + ", outside [0, " + std::to_string(classes) +
                "): pass the number of classes the names file lists");
}

void check_curve(const std::vector<double>& recall, const std::vector<double>& precision) {
  if (recall.size() != precision.size())
    throw Error("average precision: " + std::to_string(recall.size()) + " recall values but " +
                std::to_string(precision.size()) + " precision values");
  for (size_t i = 1; i < recall.size(); ++i)
    if (recall[i] < recall[i - 1])
      throw Error("average precision: recall decreases at point " + std::to_string(i) +
                  " (a curve in detection order only grows)");
}

// envelope[i] = the highest precision at any point from i on: the interpolated precision.
std::vector<double> precision_envelope(const std::vector<double>& precision) {
  std::vector<double> envelope(precision);
  for (size_t i = envelope.size(); i-- > 1;) envelope[i - 1] = std::max(envelope[i - 1], envelope[i]);
  return envelope;
}

// One detection, its best truth among all truths of its image and class (matched or not:
// the best truth alone decides, as in VOC and darknet), and that IoU. Independent of the threshold.
struct Candidate {
  size_t truth = 0;  // index into the class's truths; meaningful when best_iou > 0
  double best_iou = 0;
};

struct ClassBoxes {
  std::vector<const EvalBox*> detections;  // by descending score, ties in input order
  std::vector<const EvalBox*> truths;      // by image, then input order
};

// AP of one class at one IoU threshold; `strict` selects IoU > t (darknet) over IoU >= t (COCO).
double class_ap(const ClassBoxes& boxes, const std::vector<Candidate>& candidates, int positives, double threshold,
                bool strict, bool all_points) {
  std::vector<char> matched(boxes.truths.size(), 0);
  std::vector<double> recall, precision;
  recall.reserve(candidates.size());
  precision.reserve(candidates.size());
  int tp = 0, fp = 0;
  for (const Candidate& c : candidates) {
    bool passes = c.best_iou > 0 && (strict ? c.best_iou > threshold : c.best_iou >= threshold);
    if (passes && boxes.truths[c.truth]->difficult) continue;  // neither found nor a mistake
    if (passes && !matched[c.truth]) {
      matched[c.truth] = 1;
      ++tp;
    } else {
      ++fp;
    }
    recall.push_back(double(tp) / positives);
    precision.push_back(double(tp) / (tp + fp));
  }
  return all_points ? average_precision_all_points(recall, precision) : average_precision_101(recall, precision);
}

std::vector<Candidate> find_candidates(const ClassBoxes& boxes) {
  std::vector<Candidate> candidates(boxes.detections.size());
  auto by_image = [](const EvalBox* t, int image) { return t->image < image; };
  for (size_t d = 0; d < boxes.detections.size(); ++d) {
    const EvalBox& det = *boxes.detections[d];
    auto first = std::lower_bound(boxes.truths.begin(), boxes.truths.end(), det.image, by_image);
    for (auto it = first; it != boxes.truths.end() && (*it)->image == det.image; ++it) {
      double overlap = iou(det, **it);
      if (overlap > candidates[d].best_iou) candidates[d] = {size_t(it - boxes.truths.begin()), overlap};
    }
  }
  return candidates;
}

}  // namespace

double average_precision_all_points(const std::vector<double>& recall, const std::vector<double>& precision) {
  check_curve(recall, precision);
  std::vector<double> envelope = precision_envelope(precision);
  double ap = 0, previous_recall = 0;
  for (size_t i = 0; i < recall.size(); ++i) {
    if (recall[i] > previous_recall) ap += (recall[i] - previous_recall) * envelope[i];
    previous_recall = std::max(previous_recall, recall[i]);
  }
  return ap;
}

// Recall levels k/100 computed as a division, so a recall tp/n equal to k/100 compares equal.
double average_precision_101(const std::vector<double>& recall, const std::vector<double>& precision) {
  check_curve(recall, precision);
  std::vector<double> envelope = precision_envelope(precision);
  double sum = 0;
  size_t i = 0;
  for (int k = 0; k <= 100; ++k) {
    double level = k / 100.0;
    while (i < recall.size() && recall[i] < level) ++i;
    if (i == recall.size()) break;  // this and every higher level: no precision
    sum += envelope[i];
  }
  return sum / 101;
}

MapResult evaluate_map(const std::vector<EvalBox>& detections, const std::vector<EvalBox>& truths, int classes,
                       float min_score) {
  if (classes < 0) throw Error("evaluate_map: " + std::to_string(classes) + " classes (must be 0 or more)");
  std::vector<ClassBoxes> per_class(static_cast<size_t>(classes));
  for (size_t i = 0; i < truths.size(); ++i) {
    check_class(truths[i], i, "truth", classes);
    per_class[size_t(truths[i].class_id)].truths.push_back(&truths[i]);
  }
  for (size_t i = 0; i < detections.size(); ++i) {
    check_class(detections[i], i, "detection", classes);
    if (detections[i].score >= min_score) per_class[size_t(detections[i].class_id)].detections.push_back(&detections[i]);
  }

  MapResult result;
  result.classes.resize(size_t(classes));
  int counted = 0;
  for (int c = 0; c < classes; ++c) {
    ClassBoxes& boxes = per_class[size_t(c)];
    std::stable_sort(boxes.truths.begin(), boxes.truths.end(),
                     [](const EvalBox* a, const EvalBox* b) { return a->image < b->image; });
    std::stable_sort(boxes.detections.begin(), boxes.detections.end(),
                     [](const EvalBox* a, const EvalBox* b) { return a->score > b->score; });
    ClassAp& out = result.classes[size_t(c)];
    out.class_id = c;
    out.detections = int(boxes.detections.size());
    out.truths = int(std::count_if(boxes.truths.begin(), boxes.truths.end(), [](const EvalBox* t) { return !t->difficult; }));
    if (out.truths == 0) continue;  // AP undefined: reported as 0 and left out of the means

    std::vector<Candidate> candidates = find_candidates(boxes);
    out.ap50 = class_ap(boxes, candidates, out.truths, 0.5, true, true);
    double sum = 0;
    for (int k = 0; k < kCocoThresholds; ++k)
      sum += class_ap(boxes, candidates, out.truths, (50 + 5 * k) / 100.0, false, false);
    out.ap50_95 = sum / kCocoThresholds;
    result.map50 += out.ap50;
    result.map50_95 += out.ap50_95;
    ++counted;
  }
  if (counted > 0) {
    result.map50 /= counted;
    result.map50_95 /= counted;
  }
  return result;
}

std::string MapResult::table(const std::vector<std::string>& names) const {
  auto name_of = [&](int id) { return size_t(id) < names.size() ? names[size_t(id)] : std::to_string(id); };
  int name_width = 4;  // "name"
  for (const ClassAp& c : classes) name_width = std::max(name_width, int(name_of(c.class_id).size()));

  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%5s  %-*s  %7s  %10s  %7s  %7s\n", "class", name_width, "name", "truths",
                "detections", "AP50", "AP50:95");
  out += line;
  for (const ClassAp& c : classes) {
    std::snprintf(line, sizeof line, "%5d  ", c.class_id);
    out += line;
    std::string name = name_of(c.class_id);
    out += name + std::string(size_t(name_width) - name.size(), ' ');
    std::snprintf(line, sizeof line, "  %7d  %10d  %7.4f  %7.4f\n", c.truths, c.detections, c.ap50, c.ap50_95);
    out += line;
  }
  std::snprintf(line, sizeof line, "mAP@0.5 = %.4f, mAP@0.5:0.95 = %.4f\n", map50, map50_95);
  out += line;
  return out;
}

}  // namespace yolo::data
