// Detection (kernels/detect.h): hand-set predictions decode to known boxes, the threshold and
// the order, on every implementation available here; the CPU version equals the reference bit
// for bit and the CUDA version matches it on random inputs (capacity overflow included); NMS
// hand cases and random groups full of overlaps; argument checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu_parallel.h"
#include "kernels/detect.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

using yolo::testing::Impl;
using yolo::testing::impl_name;
using yolo::testing::impls_here;

// Far below every threshold used here: s(-30) is about 1e-13.
constexpr float kOff = -30.0f;

// A [yolo] layer's raw outputs: n*h*w pixels of `stride` floats, the view at channel `offset`.
struct Input {
  YoloLossConfig config;
  int n = 1, h = 1, w = 1, c = 0, stride = 0, offset = 0;
  std::vector<float> data;

  size_t index(int b, int j, int i, int a, int e) const {
    return ((size_t(b) * h + j) * w + i) * stride + offset + size_t(a) * (5 + config.classes) + e;
  }
  float& at(int b, int j, int i, int a, int e) { return data[index(b, j, i, a, e)]; }
  template <typename T>
  NhwcView<const T> view(const T* base) const {
    return nhwc<const T>(base + offset, n, h, w, c, stride);
  }
};

Input make_input(const YoloLossConfig& config, int n, int h, int w, int pad = 0, int offset = 0) {
  Input in;
  in.config = config;
  in.n = n, in.h = h, in.w = w, in.c = yolo_loss_channels(config), in.stride = in.c + pad, in.offset = offset;
  in.data.assign(size_t(n) * h * w * in.stride, kOff);
  return in;
}

// Anchors in network pixels chosen so that anchor / 416 is exact: (104, 52) -> (0.25, 0.125).
YoloLossConfig hand_config(int classes) {
  return make_yolo_loss_config({208, 104, 104, 52, 52, 208}, {1, 2}, classes, 416, 416);
}

Detection poison_detection() {
  Detection d;
  std::memset(static_cast<void*>(&d), 0xFF, sizeof d);
  return d;
}
bool same_bits(const Detection& a, const Detection& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string describe(const Detection& d) {
  return "(image " + std::to_string(d.image) + ", class " + std::to_string(d.class_id) + ", index " +
         std::to_string(d.index) + ", score " + std::to_string(d.score) + ", box " + std::to_string(d.x) + " " +
         std::to_string(d.y) + " " + std::to_string(d.w) + " " + std::to_string(d.h) + ", objectness " +
         std::to_string(d.objectness) + ")";
}

// "" when equal bit for bit, else the first difference.
std::string first_difference(const std::vector<Detection>& got, const std::vector<Detection>& ref) {
  for (size_t s = 0; s < std::min(got.size(), ref.size()); ++s)
    if (!same_bits(got[s], ref[s]))
      return "detection " + std::to_string(s) + ": got " + describe(got[s]) + ", reference " + describe(ref[s]);
  if (got.size() != ref.size()) return "got " + std::to_string(got.size()) + " detections, reference " + std::to_string(ref.size());
  return "";
}

// The CUDA version's outcome: *count and the whole output buffer (capacity + 3 slots, poisoned).
struct DeviceDecode {
  int count = 0;
  std::vector<Detection> buffer;
  // The detections it wrote: the first min(count, capacity) slots.
  std::vector<Detection> written(int capacity) const {
    return {buffer.begin(), buffer.begin() + std::max(0, std::min(count, capacity))};
  }
};

DeviceDecode decode_on_device(Device device, const Input& in, float threshold, int capacity) {
  DeviceArray<float> d_input(device, in.data);
  DeviceArray<Detection> d_out(device, size_t(capacity) + 3);
  DeviceArray<int> d_count(device, 1);
  size_t bytes = yolo_decode_workspace_bytes(in.n, in.h, in.w, in.config);
  DeviceArray<unsigned char> d_workspace(device, bytes);
  d_out.poison();
  d_count.poison();
  d_workspace.poison();  // nothing may rely on a cleared workspace
  yolo_decode_cuda(in.view(d_input.data()), in.config, threshold, d_out.data(), capacity, d_count.data(),
                   d_workspace.data(), bytes, nullptr);
  DeviceDecode result{d_count.download()[0], d_out.download()};
  for (size_t s = size_t(std::max(0, std::min(result.count, capacity))); s < result.buffer.size(); ++s)
    if (!same_bits(result.buffer[s], poison_detection())) {
      FAIL_CHECK("slot " << s << " beyond the " << result.count << " found (capacity " << capacity << ") was written");
      break;
    }
  return result;
}

std::vector<Detection> decode(Impl impl, const Input& in, float threshold) {
  std::vector<Detection> out;
  if (impl == Impl::Reference) {
    yolo_decode_reference(in.view(in.data.data()), in.config, threshold, out);
  } else if (impl == Impl::Cpu) {
    yolo_decode_cpu(in.view(in.data.data()), in.config, threshold, out);
  } else {
    std::string why;
    const int capacity = in.n * in.h * in.w * in.config.mask_count * in.config.classes;  // room for all
    DeviceDecode d = decode_on_device(*kernel_device(&why), in, threshold, capacity);
    out = d.written(capacity);
    CHECK(d.count == int(out.size()));
  }
  return out;
}

// Runs `run` with a pool of `threads` threads, then restores the pool.
template <typename Run>
void with_pool_threads(int threads, const Run& run) {
  int saved = cpu_pool_threads();
  set_cpu_pool_threads(threads);
  run();
  set_cpu_pool_threads(saved);
}

// ((b*H + j)*W + i)*A + a
int position_index(const Input& in, int b, int j, int i, int a) {
  return ((b * in.h + j) * in.w + i) * in.config.mask_count + a;
}

}  // namespace

TEST_CASE("detect: a hand-set prediction decodes to the stated box") {
  Input in = make_input(hand_config(3), 2, 3, 4);
  // Image 1, cell (i=2, j=1), mask anchor 1 (model anchor 2: 52x208 pixels).
  for (int e = 0; e < 4; ++e) in.at(1, 1, 2, 1, e) = 0.0f;  // s(0) = 0.5, exp(0) = 1
  in.at(1, 1, 2, 1, 4) = 30.0f;                             // s(30) rounds to 1
  in.at(1, 1, 2, 1, 5 + 1) = 0.0f;                          // class 1: score 1 * 0.5
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    std::vector<Detection> out = decode(impl, in, 0.1f);
    REQUIRE(out.size() == 1);
    const Detection& d = out[0];
    CHECK(d.x == 0.625f);  // (2 + 0.5) / 4
    CHECK(d.y == 0.5f);    // (1 + 0.5) / 3
    CHECK(d.w == 0.125f);  // 52 / 416
    CHECK(d.h == 0.5f);    // 208 / 416
    CHECK(d.objectness == 1.0f);
    CHECK(d.score == 0.5f);
    CHECK(d.class_id == 1);
    CHECK(d.image == 1);
    CHECK(d.index == position_index(in, 1, 1, 2, 1));
  }
}

TEST_CASE("detect: a score exactly at the threshold is excluded") {
  Input in = make_input(hand_config(2), 1, 2, 2);
  in.at(0, 0, 1, 0, 4) = 0.0f;      // objectness 0.5
  in.at(0, 0, 1, 0, 5 + 0) = 0.0f;  // class 0: score 0.5 * 0.5 = 0.25 exactly
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    CHECK(decode(impl, in, 0.25f).empty());
    std::vector<Detection> below = decode(impl, in, std::nextafter(0.25f, 0.0f));
    REQUIRE(below.size() == 1);
    CHECK(below[0].score == 0.25f);
    CHECK(below[0].objectness == 0.5f);
    CHECK(below[0].index == position_index(in, 0, 0, 1, 0));
  }
}

TEST_CASE("detect: one box passing for two classes appears under both") {
  Input in = make_input(hand_config(4), 1, 2, 3);
  in.at(0, 1, 0, 1, 4) = 30.0f;
  in.at(0, 1, 0, 1, 5 + 0) = 0.0f;   // class 0: 0.5
  in.at(0, 1, 0, 1, 5 + 3) = 30.0f;  // class 3: 1
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    std::vector<Detection> out = decode(impl, in, 0.3f);
    REQUIRE(out.size() == 2);
    CHECK(out[0].class_id == 0);
    CHECK(out[0].score == 0.5f);
    CHECK(out[1].class_id == 3);
    CHECK(out[1].score == 1.0f);
    for (const Detection& d : out) {
      CHECK(d.index == position_index(in, 0, 1, 0, 1));
      CHECK(d.x == out[0].x);
      CHECK(d.y == out[0].y);
      CHECK(d.w == out[0].w);
      CHECK(d.h == out[0].h);
    }
  }
}

TEST_CASE("detect: detections come sorted by image, class, score descending, then position") {
  Input in = make_input(hand_config(3), 2, 3, 3);
  // (b, j, i, a, class, class logit) with objectness 1: scores s(logit).
  const std::tuple<int, int, int, int, int, float> set[] = {
      {1, 0, 0, 0, 0, 0.0f},  {0, 2, 2, 1, 2, 0.0f}, {0, 0, 1, 0, 2, 30.0f}, {0, 1, 1, 0, 2, 0.0f},
      {0, 0, 0, 1, 1, 1.0f},  {1, 2, 0, 1, 0, 2.0f}, {0, 2, 1, 0, 1, 1.0f},  {1, 1, 1, 1, 2, 0.0f},
  };
  for (auto [b, j, i, a, k, logit] : set) {
    in.at(b, j, i, a, 4) = 30.0f;
    in.at(b, j, i, a, 5 + k) = logit;
  }
  // Expected (image, class, position): ties in score (s(1) twice, 0.5 twice) go by position.
  const std::tuple<int, int, int> expected[] = {
      {0, 1, position_index(in, 0, 0, 0, 1)}, {0, 1, position_index(in, 0, 2, 1, 0)},
      {0, 2, position_index(in, 0, 0, 1, 0)}, {0, 2, position_index(in, 0, 1, 1, 0)},
      {0, 2, position_index(in, 0, 2, 2, 1)}, {1, 0, position_index(in, 1, 2, 0, 1)},
      {1, 0, position_index(in, 1, 0, 0, 0)}, {1, 2, position_index(in, 1, 1, 1, 1)},
  };
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    std::vector<Detection> out = decode(impl, in, 0.1f);
    REQUIRE(out.size() == std::size(expected));
    for (size_t s = 0; s < out.size(); ++s) {
      CAPTURE(s);
      CHECK(std::tuple(out[s].image, out[s].class_id, out[s].index) == expected[s]);
    }
  }
}

namespace {

struct RandomCase {
  int n, h, w, anchors, classes, pad, offset;
  bool coarse;  // logits from a few values: many exactly tied scores
  float threshold;
};
const RandomCase kRandomCases[] = {
    {1, 1, 1, 1, 1, 0, 0, false, -1.0f},  {3, 5, 7, 3, 4, 0, 0, false, 0.2f}, {2, 13, 11, 2, 9, 5, 3, false, 0.3f},
    {4, 3, 5, 1, 17, 0, 0, true, 0.2f},  {2, 7, 3, 3, 33, 2, 1, true, 0.1f}, {3, 4, 3, 2, 5, 0, 0, false, 0.5f},
};

std::string describe(const RandomCase& k) {
  return std::to_string(k.n) + "x" + std::to_string(k.h) + "x" + std::to_string(k.w) + ", " +
         std::to_string(k.anchors) + " anchors, " + std::to_string(k.classes) + " classes, threshold " +
         std::to_string(k.threshold);
}

Input random_input(Rng& rng, const RandomCase& k) {
  const std::vector<float> anchors = {10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326};
  std::vector<int> mask;
  for (int a = 0; a < k.anchors; ++a) mask.push_back(2 * a + 1);
  Input in = make_input(make_yolo_loss_config(anchors, mask, k.classes, 416, 416), k.n, k.h, k.w, k.pad, k.offset);
  const float levels[] = {-1.0f, 0.0f, 1.0f, 2.0f};
  for (float& v : in.data) v = k.coarse ? levels[rng.integer(0, 3)] : rng.uniform(-4.0f, 3.0f);
  return in;
}

// A GPU's device version against the reference, whose expf may differ from the host's in the
// last bit (so may scores, and with them near-tied orders or a score at the threshold): every
// detection matches the reference's of the same (image, class, position) closely, one missing
// on either side only at the threshold, and the order holds for the device's own scores.
void check_close_to_reference(const std::vector<Detection>& got, const std::vector<Detection>& ref, float threshold) {
  using Key = std::tuple<int, int, int>;
  auto key = [](const Detection& d) { return Key{d.image, d.class_id, d.index}; };
  auto at_threshold = [&](const Detection& d) { return close(d.score, threshold, 1e-6, 1e-5); };
  std::map<Key, Detection> expected;
  for (const Detection& d : ref) expected[key(d)] = d;
  size_t matched = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    const Detection& d = got[s];
    std::string what = describe(d);
    CAPTURE(what);
    if (s > 0) {
      const Detection& e = got[s - 1];
      bool ordered = std::tuple(e.image, e.class_id) < std::tuple(d.image, d.class_id) ||
                     (e.image == d.image && e.class_id == d.class_id &&
                      (e.score > d.score || (e.score == d.score && e.index < d.index)));
      CHECK_MESSAGE(ordered, "after " << describe(e));
    }
    auto found = expected.find(key(d));
    if (found == expected.end()) {
      CHECK(at_threshold(d));
      continue;
    }
    ++matched;
    const Detection& r = found->second;
    const std::pair<float, float> fields[] = {{d.x, r.x}, {d.y, r.y}, {d.w, r.w}, {d.h, r.h},
                                              {d.objectness, r.objectness}, {d.score, r.score}};
    for (auto [g, e] : fields)
      CHECK(close(g, e, 1e-6, 1e-5));
  }
  if (matched < ref.size()) {
    std::map<Key, bool> have;
    for (const Detection& d : got) have[key(d)] = true;
    for (const Detection& r : ref)
      if (!have.count(key(r))) CHECK_MESSAGE(at_threshold(r), "missing " << describe(r));
  }
}

}  // namespace

TEST_CASE("detect: cpu equals the reference bit for bit on random inputs") {
  Rng rng;
  CAPTURE(rng.seed());
  for (const RandomCase& k : kRandomCases) {
    std::string shape = describe(k);
    CAPTURE(shape);
    Input in = random_input(rng, k);
    std::vector<Detection> ref = decode(Impl::Reference, in, k.threshold);
    CHECK(!ref.empty());
    // Both append: what is already in `out` stays in front.
    std::vector<Detection> got = {poison_detection()};
    yolo_decode_cpu(in.view(in.data.data()), in.config, k.threshold, got);
    REQUIRE(got.size() == ref.size() + 1);
    CHECK(same_bits(got[0], poison_detection()));
    got.erase(got.begin());
    std::string difference = first_difference(got, ref);
    CHECK_MESSAGE(difference.empty(), difference);
    for (int threads : {1, 3}) {  // whatever the pool size
      CAPTURE(threads);
      std::vector<Detection> again;
      with_pool_threads(threads, [&] { yolo_decode_cpu(in.view(in.data.data()), in.config, k.threshold, again); });
      CHECK(first_difference(again, ref).empty());
    }
  }
}

TEST_CASE("detect: cuda matches the reference on random inputs, also when capacity is too small") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (const RandomCase& k : kRandomCases) {
    std::string shape = describe(k);
    CAPTURE(shape);
    Input in = random_input(rng, k);
    std::vector<Detection> ref = decode(Impl::Reference, in, k.threshold);
    const int found = int(ref.size());
    DeviceDecode full = decode_on_device(device, in, k.threshold, found + 5);
    std::vector<Detection> got = full.written(found + 5);
    if (kernels_emulated()) {  // host math: the same bits
      CHECK(full.count == found);
      std::string difference = first_difference(got, ref);
      CHECK_MESSAGE(difference.empty(), difference);
    } else {
      CHECK(full.count == int(got.size()));
      check_close_to_reference(got, ref, k.threshold);
    }
    DeviceDecode again = decode_on_device(device, in, k.threshold, found + 5);
    CHECK(same_bits(again.buffer, full.buffer));

    // Too small: the count is still all found, the slots hold what a larger buffer starts with.
    for (int capacity : {0, 1, full.count / 2, std::max(0, full.count - 1)}) {
      CAPTURE(capacity);
      DeviceDecode part = decode_on_device(device, in, k.threshold, capacity);
      CHECK(part.count == full.count);
      std::vector<Detection> head(got.begin(), got.begin() + std::min(capacity, int(got.size())));
      std::string difference = first_difference(part.written(capacity), head);
      CHECK_MESSAGE(difference.empty(), difference);
    }
  }
}

// ---- NMS ------------------------------------------------------------------------------------

namespace {

Detection box(int image, int class_id, float score, float x, float y, float w, float h, int index = 0) {
  Detection d;
  d.x = x, d.y = y, d.w = w, d.h = h;
  d.objectness = score, d.score = score, d.class_id = class_id, d.image = image, d.index = index;
  return d;
}

std::vector<int> nms(Impl impl, const std::vector<Detection>& detections, float iou_threshold) {
  const int count = int(detections.size());
  std::vector<int> keep(detections.size(), -7);
  if (impl == Impl::Reference) {
    nms_reference(detections.data(), count, iou_threshold, keep.data());
  } else if (impl == Impl::Cpu) {
    nms_cpu(detections.data(), count, iou_threshold, keep.data());
  } else {
    std::string why;
    Device device = *kernel_device(&why);
    DeviceArray<Detection> d_detections(device, detections);
    DeviceArray<int> d_keep(device, detections.size());
    d_keep.poison();
    nms_cuda(d_detections.data(), count, iou_threshold, d_keep.data(), nullptr);
    keep = d_keep.download();
  }
  return keep;
}

// Squares of side 0.25 (areas exact): centres 0.05 apart overlap with IoU 2/3, 0.1 apart 3/7.
struct NmsCase {
  const char* what;
  std::vector<Detection> detections;
  std::vector<int> keep;
};
std::vector<NmsCase> nms_cases() {
  const float s = 0.25f;
  return {
      {"IoU 2/3 > 0.45: the lower score goes", {box(0, 0, 0.9f, 0.3f, 0.5f, s, s), box(0, 0, 0.8f, 0.35f, 0.5f, s, s)},
       {1, 0}},
      {"IoU 3/7 < 0.45: both stay", {box(0, 0, 0.9f, 0.3f, 0.5f, s, s), box(0, 0, 0.8f, 0.4f, 0.5f, s, s)}, {1, 1}},
      {"different classes never suppress",
       {box(0, 0, 0.9f, 0.3f, 0.5f, s, s), box(0, 1, 0.8f, 0.3f, 0.5f, s, s)}, {1, 1}},
      {"different images never suppress",
       {box(0, 2, 0.9f, 0.3f, 0.5f, s, s), box(1, 2, 0.8f, 0.3f, 0.5f, s, s)}, {1, 1}},
      {"greedy chain: A removes B, so C (overlapping only B) stays",
       {box(0, 0, 0.9f, 0.3f, 0.5f, s, s), box(0, 0, 0.8f, 0.35f, 0.5f, s, s), box(0, 0, 0.7f, 0.4f, 0.5f, s, s)},
       {1, 0, 1}},
      {"identical boxes: only the first stays",
       {box(0, 0, 0.9f, 0.5f, 0.5f, s, s), box(0, 0, 0.9f, 0.5f, 0.5f, s, s), box(0, 0, 0.9f, 0.5f, 0.5f, s, s)},
       {1, 0, 0}},
      {"empty boxes overlap nothing", {box(0, 0, 0.9f, 0.5f, 0.5f, 0, 0), box(0, 0, 0.8f, 0.5f, 0.5f, 0, 0)}, {1, 1}},
  };
}

}  // namespace

TEST_CASE("nms: hand cases") {
  for (Impl impl : impls_here()) {
    CAPTURE(impl_name(impl));
    for (const NmsCase& c : nms_cases()) {
      CAPTURE(c.what);
      CHECK(nms(impl, c.detections, 0.45f) == c.keep);
    }
    // IoU exactly at the threshold (1/3, exact operands) does not exceed it.
    std::vector<Detection> third = {box(0, 0, 0.9f, 0.5f, 0.5f, 0.25f, 0.25f), box(0, 0, 0.8f, 0.625f, 0.5f, 0.25f, 0.25f)};
    CHECK(box_iou(third[0], third[1]) == 1.0f / 3.0f);
    CHECK(nms(impl, third, 1.0f / 3.0f) == std::vector<int>{1, 1});
    CHECK(nms(impl, third, std::nextafter(1.0f / 3.0f, 0.0f)) == std::vector<int>{1, 0});
  }
}

namespace {

// Sorted groups of clustered boxes on a 1/128 grid (every IoU operand exact, so a GPU computes
// the same IoUs as the host), sizes from empty to several tiles and blocks of the kernel.
std::vector<Detection> random_groups(Rng& rng) {
  std::vector<Detection> all;
  const int sizes[] = {1, 2, 0, 7, 63, 64, 65, 130, 1, 300, 3, 700};
  int group = 0;
  for (int image = 0; image < 3; ++image)
    for (int class_id = 0; class_id < 4; ++class_id) {
      const int size = sizes[group++ % std::size(sizes)];
      std::vector<Detection> members;
      float cx[3], cy[3];
      for (int c = 0; c < 3; ++c) cx[c] = rng.integer(20, 108) / 128.0f, cy[c] = rng.integer(20, 108) / 128.0f;
      for (int m = 0; m < size; ++m) {
        int c = rng.integer(0, 2);
        members.push_back(box(image, class_id, rng.uniform(0.0f, 1.0f), cx[c] + rng.integer(-6, 6) / 128.0f,
                              cy[c] + rng.integer(-6, 6) / 128.0f, rng.integer(8, 40) / 128.0f,
                              rng.integer(8, 40) / 128.0f, rng.integer(0, 1 << 20)));
      }
      std::sort(members.begin(), members.end(), [](const Detection& a, const Detection& b) {
        return a.score != b.score ? a.score > b.score : a.index < b.index;
      });
      all.insert(all.end(), members.begin(), members.end());
    }
  return all;
}

}  // namespace

TEST_CASE("nms: cpu and cuda equal the reference on random groups full of overlaps") {
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<Detection> detections = random_groups(rng);
  for (float threshold : {0.45f, 0.2f, 0.7f}) {
    CAPTURE(threshold);
    std::vector<int> ref = nms(Impl::Reference, detections, threshold);
    size_t kept = size_t(std::count(ref.begin(), ref.end(), 1));
    CHECK(kept > 20);  // the case means something: many suppressed, many kept
    CHECK(kept + 200 < ref.size());
    for (Impl impl : impls_here()) {
      if (impl == Impl::Reference) continue;
      CAPTURE(impl_name(impl));
      CHECK(nms(impl, detections, threshold) == ref);
    }
    for (int threads : {1, 3}) {
      CAPTURE(threads);
      with_pool_threads(threads, [&] { CHECK(nms(Impl::Cpu, detections, threshold) == ref); });
    }
  }
}

TEST_CASE("detect: bad arguments are reported") {
  YoloLossConfig config = hand_config(3);
  Input in = make_input(config, 1, 2, 2);
  ConstAct view = in.view(in.data.data());
  std::vector<Detection> out;
  CHECK_NOTHROW(yolo_decode_reference(view, config, 0.5f, out));
  ConstAct narrow = nhwc<const float>(in.data.data(), 1, 2, 2, in.c - 1);
  CHECK_THROWS_WITH_AS(yolo_decode_reference(narrow, config, 0.5f, out), doctest::Contains("channels"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_cpu(narrow, config, 0.5f, out), doctest::Contains("yolo_decode_cpu"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_cpu(view, config, NAN, out), doctest::Contains("NaN"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_cpu(nhwc<const float>(in.data.data(), 1, 0, 2, in.c), config, 0.5f, out),
                       doctest::Contains("empty"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_cpu(nhwc<const float>(nullptr, 1, 2, 2, in.c), config, 0.5f, out),
                       doctest::Contains("null"), Error);
  YoloLossConfig bad_mask = config;
  bad_mask.mask[1] = 7;
  CHECK_THROWS_WITH_AS(yolo_decode_reference(view, bad_mask, 0.5f, out), doctest::Contains("mask entry 7"), Error);
  CHECK(out.empty());

  int count = 0;
  Detection slot;
  unsigned char workspace[16];
  CHECK_THROWS_WITH_AS(yolo_decode_cuda(view, config, 0.5f, &slot, -1, &count, workspace, 16, nullptr),
                       doctest::Contains("negative capacity"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_cuda(view, config, 0.5f, nullptr, 4, &count, workspace, 16, nullptr),
                       doctest::Contains("null out"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_cuda(view, config, 0.5f, &slot, 1, nullptr, workspace, 16, nullptr),
                       doctest::Contains("null count"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_workspace_bytes(70000, 1, 1, config), doctest::Contains("65535"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_workspace_bytes(1, 1, 1, hand_config(9000)), doctest::Contains("at most"), Error);
  CHECK_THROWS_WITH_AS(yolo_decode_workspace_bytes(10000, 208, 208, config), doctest::Contains("fewer images"), Error);

  int keep[2];
  Detection pair[2];
  CHECK_THROWS_WITH_AS(nms_reference(pair, -1, 0.45f, keep), doctest::Contains("negative count"), Error);
  CHECK_THROWS_WITH_AS(nms_cpu(nullptr, 2, 0.45f, keep), doctest::Contains("null"), Error);
  CHECK_THROWS_WITH_AS(nms_cuda(pair, 2, 0.45f, nullptr, nullptr), doctest::Contains("null"), Error);
  CHECK_THROWS_WITH_AS(nms_cpu(pair, 2, NAN, keep), doctest::Contains("NaN"), Error);
  CHECK_NOTHROW(nms_cuda(nullptr, 0, 0.45f, nullptr, nullptr));
}

TEST_CASE("detect: cuda rejects a workspace smaller than it asked for") {
  KERNEL_TEST_DEVICE(device);
  YoloLossConfig config = hand_config(3);
  Input in = make_input(config, 2, 3, 3);
  DeviceArray<float> d_input(device, in.data);
  DeviceArray<Detection> d_out(device, 4);
  DeviceArray<int> d_count(device, 1);
  size_t bytes = yolo_decode_workspace_bytes(in.n, in.h, in.w, config);
  DeviceArray<unsigned char> d_workspace(device, bytes);
  CHECK_THROWS_WITH_AS(yolo_decode_cuda(in.view(d_input.data()), config, 0.5f, d_out.data(), 4, d_count.data(),
                                        d_workspace.data(), bytes - 1, nullptr),
                       doctest::Contains("yolo_decode_workspace_bytes says"), Error);
}
