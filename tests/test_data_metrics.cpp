// mAP: hand-computed all-point and 101-point APs, the matching rules (duplicates, wrong class,
// difficult truths, min_score, IoU exactly 0.5, score ties), classes without truths, the table,
// bad input, and a large random case against a brute-force reference, timed.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "data/metrics.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

EvalBox box(int image, int class_id, float x0, float y0, float x1, float y1, float score = 0) {
  EvalBox b;
  b.image = image;
  b.class_id = class_id;
  b.x0 = x0;
  b.y0 = y0;
  b.x1 = x1;
  b.y1 = y1;
  b.score = score;
  return b;
}

// A truth of class 0 in each of `n` images, at (10, 10)-(50, 40).
std::vector<EvalBox> one_truth_per_image(int n) {
  std::vector<EvalBox> truths;
  for (int i = 0; i < n; ++i) truths.push_back(box(i, 0, 10, 10, 50, 40));
  return truths;
}

EvalBox hit(int image, float score) { return box(image, 0, 10, 10, 50, 40, score); }
EvalBox miss(int image, float score) { return box(image, 0, 100, 100, 120, 130, score); }

// The detections TP, FP, TP, FP, TP against 4 truths (the 4th never found).
std::vector<EvalBox> tp_fp_tp_fp_tp() {
  return {hit(0, 0.9f), miss(0, 0.8f), hit(1, 0.7f), miss(1, 0.6f), hit(2, 0.5f)};
}

// TP, FP, TP, FP, TP with 4 truths: precision 1, 1/2, 2/3, 2/4, 3/5 at recall .25, .25, .5, .5, .75.
// Interpolated (max to the right): 1, 2/3, 2/3, 3/5, 3/5.
// All-point: .25*1 + .25*(2/3) + .25*(3/5) = 1/4 + 1/6 + 3/20 = 17/30.
// 101-point: levels 0..0.25 (26) -> 1, 0.26..0.50 (25) -> 2/3, 0.51..0.75 (25) -> 3/5,
// 0.76..1 (25) -> 0: (26 + 50/3 + 15) / 101 = 173/303.
constexpr double kAllPoint = 17.0 / 30.0;
constexpr double k101 = 173.0 / 303.0;

// The matching rule of metrics.h, written the obvious O(D*T) way, for the random comparison.
ClassAp reference_class(const std::vector<EvalBox>& detections, const std::vector<EvalBox>& truths, int c,
                        float min_score) {
  std::vector<EvalBox> dets;
  for (const EvalBox& d : detections)
    if (d.class_id == c && d.score >= min_score) dets.push_back(d);
  std::stable_sort(dets.begin(), dets.end(), [](const EvalBox& a, const EvalBox& b) { return a.score > b.score; });
  ClassAp out;
  out.class_id = c;
  out.detections = int(dets.size());
  for (const EvalBox& t : truths) out.truths += t.class_id == c && !t.difficult;
  if (out.truths == 0) return out;
  auto iou = [](const EvalBox& a, const EvalBox& b) {
    double w = std::min<double>(a.x1, b.x1) - std::max<double>(a.x0, b.x0);
    double h = std::min<double>(a.y1, b.y1) - std::max<double>(a.y0, b.y0);
    if (w <= 0 || h <= 0) return 0.0;
    double inter = w * h;
    return inter / ((double(a.x1) - a.x0) * (double(a.y1) - a.y0) + (double(b.x1) - b.x0) * (double(b.y1) - b.y0) - inter);
  };
  auto ap_at = [&](double t, bool strict, bool all_points) {
    std::vector<char> matched(truths.size(), 0);
    std::vector<double> recall, precision;
    int tp = 0, fp = 0;
    for (const EvalBox& d : dets) {
      int best = -1;
      double best_iou = 0;
      for (size_t j = 0; j < truths.size(); ++j) {
        if (truths[j].class_id != c || truths[j].image != d.image) continue;
        double v = iou(d, truths[j]);
        if (v > best_iou) {
          best = int(j);
          best_iou = v;
        }
      }
      bool passes = best >= 0 && (strict ? best_iou > t : best_iou >= t);
      if (passes && truths[size_t(best)].difficult) continue;
      if (passes && !matched[size_t(best)]) {
        matched[size_t(best)] = 1;
        ++tp;
      } else {
        ++fp;
      }
      recall.push_back(double(tp) / out.truths);
      precision.push_back(double(tp) / (tp + fp));
    }
    return all_points ? average_precision_all_points(recall, precision) : average_precision_101(recall, precision);
  };
  out.ap50 = ap_at(0.5, true, true);
  for (int k = 0; k < 10; ++k) out.ap50_95 += ap_at((50 + 5 * k) / 100.0, false, false) / 10;
  return out;
}

}  // namespace

TEST_CASE("metrics: interpolations of a hand-computed curve") {
  std::vector<double> recall = {0.25, 0.25, 0.5, 0.5, 0.75};
  std::vector<double> precision = {1, 0.5, 2.0 / 3, 0.5, 0.6};
  CHECK(average_precision_all_points(recall, precision) == doctest::Approx(kAllPoint).epsilon(1e-12));
  CHECK(average_precision_101(recall, precision) == doctest::Approx(k101).epsilon(1e-12));
  CHECK(average_precision_all_points({}, {}) == 0);
  CHECK(average_precision_101({}, {}) == 0);
  // A perfect curve: all-point 1, and 101-point 1 (every level reached).
  CHECK(average_precision_all_points({0.5, 1.0}, {1, 1}) == 1.0);
  CHECK(average_precision_101({0.5, 1.0}, {1, 1}) == 1.0);
  CHECK_THROWS_WITH_AS(average_precision_all_points({0.5}, {1, 1}), doctest::Contains("1 recall values but 2"),
                       Error);
  CHECK_THROWS_WITH_AS(average_precision_101({0.5, 0.25}, {1, 1}), doctest::Contains("recall decreases at point 1"),
                       Error);
}

TEST_CASE("metrics: all-correct detections give AP 1 and mAP 1") {
  std::vector<EvalBox> truths = one_truth_per_image(3);
  truths.push_back(box(0, 1, 60, 60, 90, 80));
  truths.push_back(box(2, 1, 0, 0, 5, 5));
  std::vector<EvalBox> dets;
  for (EvalBox t : truths) {
    t.score = 0.9f;
    dets.push_back(t);
  }
  MapResult r = evaluate_map(dets, truths, 2);
  REQUIRE(r.classes.size() == 2);
  CHECK(r.classes[0].class_id == 0);
  CHECK(r.classes[1].class_id == 1);
  CHECK(r.classes[0].truths == 3);
  CHECK(r.classes[1].truths == 2);
  CHECK(r.classes[0].detections == 3);
  for (const ClassAp& c : r.classes) {
    CHECK(c.ap50 == 1.0);
    CHECK(c.ap50_95 == 1.0);
  }
  CHECK(r.map50 == 1.0);
  CHECK(r.map50_95 == 1.0);
}

TEST_CASE("metrics: a known TP/FP sequence gives its exact APs") {
  MapResult r = evaluate_map(tp_fp_tp_fp_tp(), one_truth_per_image(4), 1);
  CHECK(r.classes[0].truths == 4);
  CHECK(r.classes[0].detections == 5);
  CHECK(r.classes[0].ap50 == doctest::Approx(kAllPoint).epsilon(1e-12));
  // Every TP is exact (IoU 1), so all ten COCO thresholds give the same 101-point AP.
  CHECK(r.classes[0].ap50_95 == doctest::Approx(k101).epsilon(1e-12));
  CHECK(r.map50 == doctest::Approx(kAllPoint).epsilon(1e-12));
  CHECK(r.map50_95 == doctest::Approx(k101).epsilon(1e-12));
}

TEST_CASE("metrics: a duplicate detection of a found truth is a false positive") {
  // TP, duplicate (FP), TP with 2 truths: precision 1, 1/2, 2/3 at recall .5, .5, 1 -> .5*1 + .5*(2/3) = 5/6.
  std::vector<EvalBox> dets = {hit(0, 0.9f), box(0, 0, 11, 10, 50, 40, 0.8f), hit(1, 0.7f)};
  MapResult r = evaluate_map(dets, one_truth_per_image(2), 1);
  CHECK(r.classes[0].ap50 == doctest::Approx(5.0 / 6).epsilon(1e-12));

  // The best truth decides even when it is taken: the second detection overlaps truth A
  // (IoU 80/100) more than the free truth B (IoU 70/110), so it is a FP and B stays missed:
  // TP, FP with 2 truths -> recall .5, precision 1 -> AP 0.5.
  std::vector<EvalBox> truths = {box(0, 0, 0, 0, 10, 10), box(0, 0, 1, 0, 11, 10)};
  std::vector<EvalBox> pair = {box(0, 0, 0, 0, 10, 10, 0.9f), box(0, 0, 0, 0, 8, 10, 0.8f)};
  MapResult r2 = evaluate_map(pair, truths, 1);
  CHECK(r2.classes[0].ap50 == doctest::Approx(0.5).epsilon(1e-12));
}

TEST_CASE("metrics: a detection of the wrong class never matches") {
  std::vector<EvalBox> dets = {box(0, 1, 10, 10, 50, 40, 0.9f)};
  MapResult r = evaluate_map(dets, one_truth_per_image(1), 3);
  CHECK(r.classes[0].truths == 1);
  CHECK(r.classes[0].detections == 0);
  CHECK(r.classes[0].ap50 == 0);
  CHECK(r.classes[1].detections == 1);
  CHECK(r.classes[1].truths == 0);
  CHECK(r.map50 == 0);  // only class 0 has truths, and its AP is 0
  CHECK(r.map50_95 == 0);
  // Nor does a detection in another image.
  MapResult other = evaluate_map({hit(5, 0.9f)}, one_truth_per_image(1), 1);
  CHECK(other.classes[0].ap50 == 0);
}

TEST_CASE("metrics: a difficult truth is neither counted nor matched") {
  std::vector<EvalBox> truths = one_truth_per_image(4);
  MapResult base = evaluate_map(tp_fp_tp_fp_tp(), truths, 1);

  EvalBox difficult = box(7, 0, 0, 0, 20, 20);
  difficult.difficult = true;
  truths.push_back(difficult);
  std::vector<EvalBox> dets = tp_fp_tp_fp_tp();
  dets.push_back(box(7, 0, 0, 0, 20, 20, 0.95f));  // on the difficult truth: ignored
  dets.push_back(box(7, 0, 0, 0, 20, 19.5f, 0.55f));  // again (IoU 0.975): still ignored, never a duplicate
  MapResult r = evaluate_map(dets, truths, 1);
  CHECK(r.classes[0].truths == 4);
  CHECK(r.classes[0].detections == 7);
  CHECK(r.classes[0].ap50 == base.classes[0].ap50);
  CHECK(r.classes[0].ap50_95 == base.classes[0].ap50_95);
  CHECK(r.classes[0].ap50 == doctest::Approx(kAllPoint).epsilon(1e-12));

  // A detection that only grazes a difficult truth (IoU 0.1) is an ordinary false positive:
  // FP first, then the 4 truths found -> precision 0, 1/2, 2/3, 3/4, 4/5 at recall 0, .25 .. 1,
  // all-point = .25 * (4/5 * 4) = 0.8.
  std::vector<EvalBox> graze = {box(7, 0, 0, 0, 20, 2, 0.99f), hit(0, 0.9f), hit(1, 0.8f), hit(2, 0.7f), hit(3, 0.6f)};
  MapResult g = evaluate_map(graze, truths, 1);
  CHECK(g.classes[0].ap50 == doctest::Approx(0.8).epsilon(1e-12));
}

TEST_CASE("metrics: detections below min_score are ignored") {
  std::vector<EvalBox> dets = {miss(0, 0.004f), hit(0, 0.9f), miss(1, 0.1f)};
  MapResult r = evaluate_map(dets, one_truth_per_image(1), 1, 0.005f);
  CHECK(r.classes[0].detections == 2);
  // TP then FP: AP 1 (the FP comes after full recall).
  CHECK(r.classes[0].ap50 == 1.0);
  // With min_score 0.9 the later FP goes too; a score equal to min_score is kept.
  MapResult high = evaluate_map(dets, one_truth_per_image(1), 1, 0.9f);
  CHECK(high.classes[0].detections == 1);
  // Two truths; TP 0.9, FP 0.3, TP 0.2. All kept: precision 1, 1/2, 2/3 at recall .5, .5, 1 -> 5/6.
  // With min_score 0.3 the last TP goes (AP 1/2) and the FP, scored exactly 0.3, stays.
  std::vector<EvalBox> three = {hit(0, 0.9f), miss(0, 0.3f), hit(1, 0.2f)};
  MapResult all = evaluate_map(three, one_truth_per_image(2), 1, 0.1f);
  CHECK(all.classes[0].detections == 3);
  CHECK(all.classes[0].ap50 == doctest::Approx(5.0 / 6).epsilon(1e-12));
  MapResult cut = evaluate_map(three, one_truth_per_image(2), 1, 0.3f);
  CHECK(cut.classes[0].detections == 2);
  CHECK(cut.classes[0].ap50 == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(evaluate_map(three, one_truth_per_image(2), 1, 0.31f).classes[0].detections == 1);
}

TEST_CASE("metrics: IoU exactly 0.5 misses AP50 but matches COCO's 0.50") {
  // Truth 0..2 x 0..1 (area 2), detection 0..1 x 0..1 (area 1): IoU 1/2 exactly.
  std::vector<EvalBox> truths = {box(0, 0, 0, 0, 2, 1)};
  std::vector<EvalBox> dets = {box(0, 0, 0, 0, 1, 1, 0.9f)};
  MapResult r = evaluate_map(dets, truths, 1);
  CHECK(r.classes[0].ap50 == 0);
  CHECK(r.classes[0].ap50_95 == doctest::Approx(0.1).epsilon(1e-12));  // AP 1 at 0.50, 0 at the 9 others
  // IoU 0.75 (0..3 vs 0..4 wide): thresholds 0.50 .. 0.75 (6 of 10) match.
  MapResult r75 = evaluate_map({box(0, 0, 0, 0, 3, 1, 0.9f)}, {box(0, 0, 0, 0, 4, 1)}, 1);
  CHECK(r75.classes[0].ap50 == 1.0);
  CHECK(r75.classes[0].ap50_95 == doctest::Approx(0.6).epsilon(1e-12));
}

TEST_CASE("metrics: classes without truths are left out of the means") {
  std::vector<EvalBox> dets = {hit(0, 0.9f), box(0, 1, 0, 0, 5, 5, 0.8f)};
  MapResult r = evaluate_map(dets, one_truth_per_image(1), 3);
  CHECK(r.classes[0].ap50 == 1.0);
  CHECK(r.classes[1].ap50 == 0);
  CHECK(r.classes[2].ap50 == 0);
  CHECK(r.map50 == 1.0);
  CHECK(r.map50_95 == 1.0);
  // No class with truths at all: the means are 0.
  MapResult none = evaluate_map(dets, {}, 3);
  CHECK(none.map50 == 0);
  CHECK(none.map50_95 == 0);
  CHECK(evaluate_map({}, {}, 0).classes.empty());
}

TEST_CASE("metrics: equal scores keep input order") {
  // One truth. FP then TP at the same score: precision 0, 1/2 at recall 0, 1 -> AP 1/2.
  CHECK(evaluate_map({miss(0, 0.5f), hit(0, 0.5f)}, one_truth_per_image(1), 1).classes[0].ap50 ==
        doctest::Approx(0.5).epsilon(1e-12));
  // TP then FP: AP 1.
  CHECK(evaluate_map({hit(0, 0.5f), miss(0, 0.5f)}, one_truth_per_image(1), 1).classes[0].ap50 == 1.0);
}

TEST_CASE("metrics: the table lists every class and ends with the means") {
  std::vector<EvalBox> dets = {hit(0, 0.9f)};
  MapResult r = evaluate_map(dets, one_truth_per_image(1), 3);
  std::string table = r.table({"person", "bicycle"});
  CAPTURE(table);
  CHECK(table.find("class") == 0);
  CHECK(table.find("AP50:95") != std::string::npos);
  CHECK(table.find("    0  person         1           1   1.0000   1.0000\n") != std::string::npos);
  CHECK(table.find("    1  bicycle        0           0   0.0000   0.0000\n") != std::string::npos);
  CHECK(table.find("    2  2              0           0") != std::string::npos);  // no name: the id
  std::string last = "mAP@0.5 = 1.0000, mAP@0.5:0.95 = 1.0000\n";
  CHECK(table.size() >= last.size());
  CHECK(table.compare(table.size() - last.size(), last.size(), last) == 0);
}

TEST_CASE("metrics: class ids outside the range are errors") {
  CHECK_THROWS_WITH_AS(evaluate_map({box(0, 3, 0, 0, 1, 1, 0.9f)}, {}, 3),
                       doctest::Contains("detection 0 has class id 3, outside [0, 3)"), Error);
  CHECK_THROWS_WITH_AS(evaluate_map({}, {box(0, 0, 0, 0, 1, 1), box(0, -1, 0, 0, 1, 1)}, 2),
                       doctest::Contains("truth 1 has class id -1"), Error);
  CHECK_THROWS_WITH_AS(evaluate_map({}, {}, -1), doctest::Contains("-1 classes"), Error);
}

TEST_CASE("metrics: degenerate boxes and NaN scores do no harm") {
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<EvalBox> dets = {box(0, 0, nan, 10, 50, 40, 0.95f), box(0, 0, 50, 40, 10, 10, 0.92f), hit(0, nan),
                               hit(0, 0.9f)};
  MapResult r = evaluate_map(dets, one_truth_per_image(1), 1);
  CHECK(r.classes[0].detections == 3);  // the NaN score is below any min_score
  // FP (NaN corner), FP (inverted), TP: AP 1/3.
  CHECK(r.classes[0].ap50 == doctest::Approx(1.0 / 3).epsilon(1e-12));
}

TEST_CASE("metrics: a large random case matches the brute-force rule, fast") {
  Rng rng;
  CAPTURE(rng.seed());
  constexpr int kClasses = 5, kImages = 400;
  std::vector<EvalBox> truths, dets;
  for (int i = 0; i < kImages; ++i)
    for (int n = rng.integer(0, 8); n > 0; --n) {
      float x = rng.uniform(0, 500), y = rng.uniform(0, 500);
      EvalBox t = box(i, rng.integer(0, kClasses - 1), x, y, x + rng.uniform(5, 100), y + rng.uniform(5, 100));
      t.difficult = rng.integer(0, 9) == 0;
      truths.push_back(t);
    }
  // Detections: jittered truths (some matches, some duplicates) and random boxes; scores on a
  // coarse grid so that ties occur.
  for (int d = 0; d < 20000; ++d) {
    float score = float(rng.integer(0, 100)) / 100;
    if (rng.integer(0, 1) == 0 && !truths.empty()) {
      EvalBox t = truths[size_t(rng.integer(0, int(truths.size()) - 1))];
      t.x0 += rng.uniform(0, 10);
      t.x1 += rng.uniform(-5, 5);
      t.y0 -= rng.uniform(0, 8);
      t.score = score;
      t.difficult = false;
      dets.push_back(t);
    } else {
      float x = rng.uniform(0, 500), y = rng.uniform(0, 500);
      dets.push_back(box(rng.integer(0, kImages - 1), rng.integer(0, kClasses - 1), x, y, x + rng.uniform(5, 100),
                         y + rng.uniform(5, 100), score));
    }
  }
  auto start = std::chrono::steady_clock::now();
  MapResult r = evaluate_map(dets, truths, kClasses, 0.005f);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_MESSAGE(seconds < 1.0, "evaluate_map took " << seconds << " s for 20k detections");

  // The brute-force reference on a subset of the images (it is O(D*T)).
  auto subset = [](const std::vector<EvalBox>& v) {
    std::vector<EvalBox> out;
    for (const EvalBox& b : v)
      if (b.image < 100) out.push_back(b);
    return out;
  };
  std::vector<EvalBox> sub_dets = subset(dets), sub_truths = subset(truths);
  MapResult sub = evaluate_map(sub_dets, sub_truths, kClasses, 0.005f);
  double sum50 = 0, sum95 = 0;
  int counted = 0;
  for (int c = 0; c < kClasses; ++c) {
    CAPTURE(c);
    ClassAp ref = reference_class(sub_dets, sub_truths, c, 0.005f);
    CHECK(sub.classes[size_t(c)].truths == ref.truths);
    CHECK(sub.classes[size_t(c)].detections == ref.detections);
    CHECK(sub.classes[size_t(c)].ap50 == doctest::Approx(ref.ap50).epsilon(1e-12));
    CHECK(sub.classes[size_t(c)].ap50_95 == doctest::Approx(ref.ap50_95).epsilon(1e-12));
    CHECK(ref.ap50 > 0.05);  // the case is not trivially empty
    CHECK(ref.ap50 < 0.95);
    if (ref.truths == 0) continue;
    sum50 += ref.ap50;
    sum95 += ref.ap50_95;
    ++counted;
  }
  REQUIRE(counted > 0);
  CHECK(sub.map50 == doctest::Approx(sum50 / counted).epsilon(1e-12));
  CHECK(sub.map50_95 == doctest::Approx(sum95 / counted).epsilon(1e-12));
  CHECK(r.map50 > 0);
}
