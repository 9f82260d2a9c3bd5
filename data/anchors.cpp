// Anchors from the dataset (see anchors.h).
#include "data/anchors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "data/image.h"
#include "data/rng.h"
#include "runtime/check.h"

namespace yolo::data {

std::vector<BoxSize> network_box_sizes(const Split& split, int net_w, int net_h, ResizeMode mode, int64_t* unreadable) {
  std::vector<BoxSize> sizes;
  int64_t skipped = 0;
  for (const Sample& sample : split.samples) {
    if (sample.boxes.empty()) continue;
    float sx = static_cast<float>(net_w), sy = static_cast<float>(net_h);  // stretch: the box's fraction of the input
    if (mode == ResizeMode::Letterbox) {
      int w = 0, h = 0;
      std::string why;
      if (!read_image_size(sample.image, w, h, why)) {
        ++skipped;
        continue;
      }
      const Placement p = fit_placement(w, h, net_w, net_h, mode);
      sx = p.scale_x * static_cast<float>(w);
      sy = p.scale_y * static_cast<float>(h);
    }
    for (const Box& b : sample.boxes)
      if (b.w > 0 && b.h > 0) sizes.push_back(BoxSize{b.w * sx, b.h * sy});
  }
  if (unreadable) *unreadable = skipped;
  return sizes;
}

double size_iou(BoxSize a, BoxSize b) {
  const double inter = std::min<double>(a.w, b.w) * std::min<double>(a.h, b.h);
  const double uni = static_cast<double>(a.w) * a.h + static_cast<double>(b.w) * b.h - inter;
  return uni > 0 ? inter / uni : 0;
}

namespace {

size_t nearest(const BoxSize& box, const std::vector<BoxSize>& centres) {
  size_t best = 0;
  double best_iou = -1;
  for (size_t c = 0; c < centres.size(); ++c)
    if (double iou = size_iou(box, centres[c]); iou > best_iou) {
      best_iou = iou;
      best = c;
    }
  return best;
}

constexpr uint64_t kAnchorRestarts = 8;  // k-means++ seedings tried (kmeans_anchors)

// One k-means run: k-means++ seeding from `rng`, then Lloyd iterations with 1 - IoU.
std::vector<BoxSize> kmeans_once(const std::vector<BoxSize>& boxes, int k, KeyedRng& rng) {
  // k-means++: each next centre drawn with probability proportional to its distance squared.
  std::vector<BoxSize> centres{boxes[rng.below(boxes.size())]};
  std::vector<double> d2(boxes.size());
  while (centres.size() < static_cast<size_t>(k)) {
    double total = 0;
    for (size_t i = 0; i < boxes.size(); ++i) {
      const double d = 1 - size_iou(boxes[i], centres[nearest(boxes[i], centres)]);
      d2[i] = d * d;
      total += d2[i];
    }
    if (total <= 0) {  // every box equals a centre already: repeat one
      centres.push_back(centres.back());
      continue;
    }
    double pick = rng.unit() * total;
    size_t i = 0;
    for (; i + 1 < boxes.size() && pick >= d2[i]; ++i) pick -= d2[i];
    centres.push_back(boxes[i]);
  }
  std::vector<size_t> assigned(boxes.size(), std::numeric_limits<size_t>::max());
  for (int iteration = 0; iteration < 1000; ++iteration) {
    bool changed = false;
    for (size_t i = 0; i < boxes.size(); ++i)
      if (size_t c = nearest(boxes[i], centres); c != assigned[i]) {
        assigned[i] = c;
        changed = true;
      }
    if (!changed) break;
    std::vector<double> sw(centres.size(), 0), sh(centres.size(), 0);
    std::vector<int64_t> n(centres.size(), 0);
    for (size_t i = 0; i < boxes.size(); ++i) {
      sw[assigned[i]] += boxes[i].w;
      sh[assigned[i]] += boxes[i].h;
      ++n[assigned[i]];
    }
    for (size_t c = 0; c < centres.size(); ++c)
      if (n[c] > 0) centres[c] = BoxSize{static_cast<float>(sw[c] / n[c]), static_cast<float>(sh[c] / n[c])};
  }
  return centres;
}

}  // namespace

std::vector<BoxSize> kmeans_anchors(const std::vector<BoxSize>& boxes, int k, uint64_t seed) {
  if (k < 1) throw Error("anchors: --num must be at least 1");
  if (boxes.size() < static_cast<size_t>(k))
    throw Error("anchors: " + std::to_string(boxes.size()) + " boxes for " + std::to_string(k) +
                " anchors: need at least as many boxes as anchors");
  // k-means++ still seeds two centres in one cluster now and then (about 1% of seeds for 3 well
  // separated sizes), and Lloyd's iterations keep them there: the best of several seedings.
  std::vector<BoxSize> best;
  double best_iou = -1;
  for (uint64_t restart = 0; restart < kAnchorRestarts; ++restart) {
    KeyedRng rng(seed, 0x616E63686F7273ull, restart);  // "anchors"
    std::vector<BoxSize> centres = kmeans_once(boxes, k, rng);
    if (const double iou = mean_best_iou(boxes, centres); iou > best_iou) {
      best_iou = iou;
      best = std::move(centres);
    }
  }
  std::sort(best.begin(), best.end(), [](const BoxSize& a, const BoxSize& b) { return a.w * a.h < b.w * b.h; });
  return best;
}

double mean_best_iou(const std::vector<BoxSize>& boxes, const std::vector<BoxSize>& anchors) {
  if (boxes.empty() || anchors.empty()) return 0;
  double sum = 0;
  for (const BoxSize& b : boxes) sum += size_iou(b, anchors[nearest(b, anchors)]);
  return sum / static_cast<double>(boxes.size());
}

std::string anchors_text(const std::vector<BoxSize>& anchors) {
  std::string out;
  for (const BoxSize& a : anchors)
    out += (out.empty() ? "" : ", ") + std::to_string(std::max(1L, std::lround(a.w))) + "," +
           std::to_string(std::max(1L, std::lround(a.h)));
  return out;
}

}  // namespace yolo::data
