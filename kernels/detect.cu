// Detection (see detect.h): decoding a [yolo] layer's outputs into scored boxes and greedy
// per-class NMS, each as the naive reference, the threaded CPU version and CUDA kernels. All
// three share the per-prediction float math below, so they agree bit for bit where the
// arithmetic is the same (host builds; a GPU's expf may differ from the host's in the last bit).
#include "kernels/detect.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"
#include "kernels/sort.cuh"

namespace yolo {
namespace {

// ---- argument checks --------------------------------------------------------------------------

[[noreturn]] void bad_argument(const char* op, const std::string& why) { throw Error(std::string(op) + ": " + why); }

void check_config(const YoloLossConfig& c, const char* op) {
  if (c.num_anchors < 1 || c.num_anchors > kYoloMaxAnchors || c.mask_count < 1 || c.mask_count > kYoloMaxAnchors)
    bad_argument(op, "config has " + std::to_string(c.num_anchors) + " anchors and " + std::to_string(c.mask_count) +
                         " mask entries; each must be in [1, " + std::to_string(kYoloMaxAnchors) + "]");
  for (int a = 0; a < c.mask_count; ++a) {
    int n = c.mask[a];
    if (n < 0 || n >= c.num_anchors)
      bad_argument(op, "mask entry " + std::to_string(n) + " is not an anchor index in [0, " +
                           std::to_string(c.num_anchors) + ")");
    for (float v : {c.anchors[2 * n], c.anchors[2 * n + 1]})
      if (!(v > 0.0f) || !std::isfinite(v))
        bad_argument(op, "anchor " + std::to_string(n) + " has size " + std::to_string(v) + "; must be positive");
  }
  if (c.classes < 1) bad_argument(op, "classes must be at least 1, got " + std::to_string(c.classes));
  if (c.net_w < 1 || c.net_h < 1)
    bad_argument(op, "network size " + std::to_string(c.net_w) + "x" + std::to_string(c.net_h) + " must be positive");
}

// Predictions are numbered with int position indices: ((b*H + j)*W + i)*A + a.
void check_grid(int n, int h, int w, const YoloLossConfig& c, const char* op) {
  if (n < 1 || h < 1 || w < 1)
    bad_argument(op, "batch and grid " + std::to_string(n) + "x" + std::to_string(h) + "x" + std::to_string(w) +
                         " have an empty dimension");
  if (size_t(n) * h * w * c.mask_count > size_t(INT_MAX))
    bad_argument(op, "too many predictions for int position indices; decode fewer images at a time");
}

void check_decode_arguments(const ConstAct& input, const YoloLossConfig& c, float threshold, const char* op) {
  check_config(c, op);
  check_view_arg(input, op, "input");
  check_grid(input.n, input.h, input.w, c, op);
  if (input.c != yolo_loss_channels(c))
    bad_argument(op, "input has " + std::to_string(input.c) + " channels; mask_count*(5+classes) = " +
                         std::to_string(yolo_loss_channels(c)));
  if (std::isnan(threshold)) bad_argument(op, "threshold is NaN");
}

void check_nms_arguments(const Detection* detections, int count, float iou_threshold, const int* keep, const char* op) {
  if (count < 0) bad_argument(op, "negative count " + std::to_string(count));
  if (count > 0 && (!detections || !keep)) bad_argument(op, "null detections or keep");
  if (std::isnan(iou_threshold)) bad_argument(op, "iou_threshold is NaN");
}

// ---- shared float math (reference, CPU version and kernels) ---------------------------------

YOLO_HOST_DEVICE inline float logistic(float z) { return 1.0f / (1.0f + expf(-z)); }

// The class score of a prediction with this objectness and class logit.
YOLO_HOST_DEVICE inline float class_score(float objectness, float class_logit) {
  return objectness * logistic(class_logit);
}

// Box and objectness of the prediction whose channels start at p (tx), at cell (i, j), mask anchor a.
YOLO_HOST_DEVICE inline Detection decode_box(const float* p, int i, int j, int a, int W, int H,
                                             const YoloLossConfig& c) {
  const int n = c.mask[a];
  Detection d;
  d.x = (float(i) + logistic(p[0])) / float(W);
  d.y = (float(j) + logistic(p[1])) / float(H);
  d.w = expf(p[2]) * c.anchors[2 * n] / float(c.net_w);
  d.h = expf(p[3]) * c.anchors[2 * n + 1] / float(c.net_h);
  d.objectness = logistic(p[4]);
  return d;
}

YOLO_HOST_DEVICE inline Detection scored(Detection box, float score, int class_id, int image, int index) {
  box.score = score, box.class_id = class_id, box.image = image, box.index = index;
  return box;
}

YOLO_HOST_DEVICE inline bool same_group(const Detection& d, int image, int class_id) {
  return d.image == image && d.class_id == class_id;
}

// The order of detect.h within one (image, class) group.
bool ranks_before(const Detection& a, const Detection& b) {
  return a.score != b.score ? a.score > b.score : a.index < b.index;
}

// ---- CUDA: decode -----------------------------------------------------------------------------
// Candidates are counted per (image, class) group, the groups laid out by an exclusive scan,
// and each candidate written into its group as a key (score descending, then position index)
// by atomically reserved slots. Keys are unique within a group, so sorting the groups gives
// the same order whatever order the atomics handed out: the output is deterministic. (One
// device-wide sort instead would need (image, class, score, index) in one key, more than 64
// bits in general, and its item count on the host; the group offsets never leave the device.)

constexpr int kDecodeThreads = 256;   // one thread per (cell, anchor)
constexpr int kScanThreads = 256;
constexpr int kWriteThreads = 256;
constexpr int kMaxWriteBlocks = 4096;
constexpr int kMaxCudaClasses = 8192;  // a block keeps one counter per class in shared memory

// score is in [0, 1], where float bits grow with the value: 1.0f's bits minus them (30 bits)
// sort descending, and the position index breaks ties.
__device__ inline uint64_t candidate_key(float score, int index) {
  return uint64_t(0x3F800000u - __float_as_uint(score)) << 32 | uint32_t(index);
}

// Channels of prediction `position` ((j*W + i)*A + a) of image b, with its cell and anchor.
struct Prediction {
  const float* p;
  int i, j, a;
};
__device__ inline Prediction prediction(const ConstAct& input, const YoloLossConfig& c, int b, int position) {
  const int a = position % c.mask_count, cell = position / c.mask_count;
  const int i = cell % input.w, j = cell / input.w;
  return Prediction{input.data + input.at(b, j, i, a * (5 + c.classes)), i, j, a};
}

// Block (x, b): image b's predictions [x*blockDim, ...). Leaves the block's candidates per class
// in class_count (shared, one per class).
__device__ inline void count_block_candidates(const ConstAct& input, const YoloLossConfig& c, float threshold,
                                              int* class_count) {
  const int K = c.classes, position = int(blockIdx.x * blockDim.x + threadIdx.x);
  for (int k = int(threadIdx.x); k < K; k += int(blockDim.x)) class_count[k] = 0;
  __syncthreads();
  if (position < input.h * input.w * c.mask_count) {
    const float* p = prediction(input, c, int(blockIdx.y), position).p;
    const float objectness = logistic(p[4]);
    for (int k = 0; k < K; ++k)
      if (class_score(objectness, p[5 + k]) > threshold) atomicAdd(&class_count[k], 1);
  }
  __syncthreads();
}

__global__ void clear_kernel(int* values, int count) {
  for (int g = int(blockIdx.x * blockDim.x + threadIdx.x); g < count; g += int(gridDim.x * blockDim.x)) values[g] = 0;
}

__global__ void __launch_bounds__(kDecodeThreads)
    count_candidates_kernel(ConstAct input, YoloLossConfig c, float threshold, int* group_counts) {
  DYNAMIC_SHARED(int, class_count);
  count_block_candidates(input, c, threshold, class_count);
  const int K = c.classes, b = int(blockIdx.y);
  for (int k = int(threadIdx.x); k < K; k += int(blockDim.x))
    if (class_count[k] > 0) atomicAdd(&group_counts[b * K + k], class_count[k]);
}

// One block: offsets[g] = sum of group_counts before g, offsets[groups] = *total = all; clears
// the cursors the scatter pass reserves slots with. Thread t scans a contiguous range.
__global__ void __launch_bounds__(kScanThreads)
    group_offsets_kernel(const int* group_counts, int groups, int* offsets, int* cursor, int* total) {
  __shared__ int range_start[kScanThreads];
  const int t = int(threadIdx.x), per = (groups + kScanThreads - 1) / kScanThreads;
  const int lo = min(groups, t * per), hi = min(groups, lo + per);
  int sum = 0;
  for (int g = lo; g < hi; ++g) sum += group_counts[g];
  range_start[t] = sum;
  __syncthreads();
  if (t == 0) {
    int running = 0;
    for (int u = 0; u < kScanThreads; ++u) {
      int range_sum = range_start[u];
      range_start[u] = running;
      running += range_sum;
    }
    offsets[groups] = running;
    *total = running;
  }
  __syncthreads();
  int running = range_start[t];
  for (int g = lo; g < hi; ++g) {
    offsets[g] = running;
    running += group_counts[g];
    cursor[g] = 0;
  }
}

// Recounts the block's candidates (the same decisions as count_candidates_kernel), reserves a
// run of slots per class in each group, and writes every candidate's key into its slot.
__global__ void __launch_bounds__(kDecodeThreads)
    scatter_candidates_kernel(ConstAct input, YoloLossConfig c, float threshold, const int* offsets, int* cursor,
                              uint64_t* keys) {
  DYNAMIC_SHARED(int, next_slot);
  count_block_candidates(input, c, threshold, next_slot);
  const int K = c.classes, b = int(blockIdx.y), predictions = input.h * input.w * c.mask_count;
  for (int k = int(threadIdx.x); k < K; k += int(blockDim.x)) {
    int n = next_slot[k];
    if (n > 0) next_slot[k] = offsets[b * K + k] + atomicAdd(&cursor[b * K + k], n);
  }
  __syncthreads();
  const int position = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (position >= predictions) return;
  const float* p = prediction(input, c, b, position).p;
  const float objectness = logistic(p[4]);
  for (int k = 0; k < K; ++k) {
    float score = class_score(objectness, p[5 + k]);
    if (score > threshold) keys[atomicAdd(&next_slot[k], 1)] = candidate_key(score, b * predictions + position);
  }
}

// out[s] for s < min(total, capacity): the group holding sorted slot s (a binary search of the
// offsets), the key's score and position, the box decoded again from the input.
__global__ void __launch_bounds__(kWriteThreads)
    write_detections_kernel(ConstAct input, YoloLossConfig c, const int* offsets, int groups, const uint64_t* keys,
                            Detection* out, int capacity) {
  const int limit = min(offsets[groups], capacity), K = c.classes, predictions = input.h * input.w * c.mask_count;
  for (int s = int(blockIdx.x * blockDim.x + threadIdx.x); s < limit; s += int(gridDim.x * blockDim.x)) {
    int lo = 0, hi = groups;  // offsets[lo] <= s < offsets[hi]
    while (hi - lo > 1) {
      int mid = lo + (hi - lo) / 2;
      if (offsets[mid] <= s) lo = mid;
      else hi = mid;
    }
    const uint64_t key = keys[s];
    const int index = int(uint32_t(key)), b = lo / K;
    const float score = __uint_as_float(0x3F800000u - uint32_t(key >> 32));
    Prediction q = prediction(input, c, b, index - b * predictions);
    out[s] = scored(decode_box(q.p, q.i, q.j, q.a, input.w, input.h, c), score, lo % K, b, index);
  }
}

// ---- CUDA: NMS --------------------------------------------------------------------------------
// Block x owns the groups that start in [x*kNmsThreads, (x+1)*kNmsThreads) and runs each with
// all its threads: boxes in tiles of 64, a tile's own overlaps resolved greedily through a
// 64-bit mask per box, then the tile's survivors suppress the rest of the group in parallel.

constexpr int kNmsThreads = 256;
constexpr int kNmsTile = 64;

// (x, y, w, h) packed in a float4's (x, y, z, w).
__device__ inline Detection box_of(float4 b) {
  Detection d;
  d.x = b.x, d.y = b.y, d.w = b.z, d.h = b.w;
  return d;
}

__global__ void __launch_bounds__(kNmsThreads)
    nms_kernel(const Detection* detections, int count, float iou_threshold, int* keep) {
  __shared__ int starts_group[kNmsThreads];
  __shared__ float4 tile[kNmsTile];
  __shared__ unsigned long long overlaps[kNmsTile];  // bit q of box p: p suppresses q if p is kept
  __shared__ unsigned long long tile_kept;
  __shared__ int group_end;
  const int t = int(threadIdx.x), first = int(blockIdx.x) * kNmsThreads;
  const int s = first + t;
  starts_group[t] = s < count && (s == 0 || !same_group(detections[s - 1], detections[s].image, detections[s].class_id));
  __syncthreads();

  for (int local = 0; local < kNmsThreads; ++local) {
    if (!starts_group[local]) continue;
    const int start = first + local, image = detections[start].image, class_id = detections[start].class_id;
    if (t == 0) group_end = count;
    __syncthreads();
    for (int from = start + 1; from < count; from += kNmsThreads) {
      int q = from + t;
      if (q < count && !same_group(detections[q], image, class_id)) atomicMin(&group_end, q);
      __syncthreads();
      bool found = group_end < count;
      __syncthreads();  // everyone has read group_end before the next chunk may lower it
      if (found) break;
    }
    const int end = group_end;
    for (int q = start + t; q < end; q += kNmsThreads) keep[q] = 1;
    __syncthreads();

    for (int base = start; base < end; base += kNmsTile) {
      const int n = min(kNmsTile, end - base);
      if (t < n) {
        const Detection& d = detections[base + t];
        tile[t] = make_float4(d.x, d.y, d.w, d.h);
      }
      __syncthreads();
      if (t < n) {
        unsigned long long bits = 0;
        for (int q = t + 1; q < n; ++q)
          if (box_iou(box_of(tile[t]), box_of(tile[q])) > iou_threshold) bits |= 1ull << q;
        overlaps[t] = bits;
      }
      __syncthreads();
      if (t == 0) {  // greedy within the tile, in order; earlier tiles' survivors already applied
        unsigned long long alive = 0;
        for (int p = 0; p < n; ++p) alive |= (unsigned long long)(keep[base + p] != 0) << p;
        for (int p = 0; p < n; ++p)
          if (alive >> p & 1) alive &= ~overlaps[p];
        for (int p = 0; p < n; ++p) keep[base + p] = int(alive >> p & 1);
        tile_kept = alive;
      }
      __syncthreads();
      const unsigned long long kept = tile_kept;
      for (int q = base + n + t; kept != 0 && q < end; q += kNmsThreads) {
        if (!keep[q]) continue;
        const Detection& d = detections[q];
        Detection candidate = box_of(make_float4(d.x, d.y, d.w, d.h));
        for (int p = 0; p < n; ++p)
          if ((kept >> p & 1) && box_iou(box_of(tile[p]), candidate) > iou_threshold) {
            keep[q] = 0;
            break;
          }
      }
      __syncthreads();
    }
  }
}

// ---- workspace layout -------------------------------------------------------------------------

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Limits of the CUDA version beyond the shared checks: grid y is the image, a block's class
// counters live in shared memory, and candidate slots are int.
void check_cuda_limits(int n, int h, int w, const YoloLossConfig& c, const char* op) {
  if (n > 65535) bad_argument(op, "batch " + std::to_string(n) + " exceeds the grid's y limit 65535");
  if (c.classes > kMaxCudaClasses)
    bad_argument(op, std::to_string(c.classes) + " classes; the CUDA version handles at most " +
                         std::to_string(kMaxCudaClasses));
  if (size_t(n) * h * w * c.mask_count * c.classes > size_t(INT_MAX))
    bad_argument(op, "too many (prediction, class) pairs for one call; decode fewer images at a time");
}

struct DecodeWorkspace {
  size_t counts = 0, offsets = 0, cursor = 0, keys = 0, alternate = 0, sort_temp = 0, sort_temp_bytes = 0, total = 0;
  int groups = 0, items = 0;
};
DecodeWorkspace decode_workspace(int n, int h, int w, const YoloLossConfig& c) {
  DecodeWorkspace l;
  l.groups = n * c.classes;
  l.items = n * h * w * c.mask_count * c.classes;
  l.offsets = align_up(size_t(l.groups) * sizeof(int));
  l.cursor = l.offsets + align_up((size_t(l.groups) + 1) * sizeof(int));
  l.keys = l.cursor + align_up(size_t(l.groups) * sizeof(int));
  l.alternate = l.keys + align_up(size_t(l.items) * sizeof(uint64_t));
  l.sort_temp = l.alternate + align_up(size_t(l.items) * sizeof(uint64_t));
  l.sort_temp_bytes = segmented_sort_temp_bytes(l.items, l.groups);
  l.total = l.sort_temp + align_up(l.sort_temp_bytes);
  return l;
}

}  // namespace

// ---- decode: reference, CPU, CUDA -------------------------------------------------------------

void yolo_decode_reference(ConstAct input, const YoloLossConfig& config, float threshold,
                           std::vector<Detection>& out) {
  check_decode_arguments(input, config, threshold, "yolo_decode_reference");
  const int A = config.mask_count, K = config.classes, H = input.h, W = input.w;
  for (int b = 0; b < input.n; ++b)
    for (int k = 0; k < K; ++k) {
      std::vector<Detection> group;
      for (int j = 0; j < H; ++j)
        for (int i = 0; i < W; ++i)
          for (int a = 0; a < A; ++a) {
            const float* p = input.data + input.at(b, j, i, a * (5 + K));
            float score = class_score(logistic(p[4]), p[5 + k]);
            if (score > threshold)
              group.push_back(scored(decode_box(p, i, j, a, W, H, config), score, k, b, ((b * H + j) * W + i) * A + a));
          }
      std::sort(group.begin(), group.end(), ranks_before);
      out.insert(out.end(), group.begin(), group.end());
    }
}

void yolo_decode_cpu(ConstAct input, const YoloLossConfig& config, float threshold, std::vector<Detection>& out) {
  check_decode_arguments(input, config, threshold, "yolo_decode_cpu");
  const int A = config.mask_count, K = config.classes, H = input.h, W = input.w;
  // Work items: (image, run of classes), so one image still spreads over the threads; their
  // outputs are concatenated in item order, which is (image, class) order.
  constexpr int kClassesPerItem = 16;
  const int runs = (K + kClassesPerItem - 1) / kClassesPerItem;
  std::vector<std::vector<Detection>> items(size_t(input.n) * runs);
  parallel_for(items.size(), [&](size_t item) {
    const int b = int(item / runs), k0 = int(item % runs) * kClassesPerItem, k1 = std::min(K, k0 + kClassesPerItem);
    std::vector<std::vector<Detection>> groups(size_t(k1 - k0));
    for (int j = 0; j < H; ++j)
      for (int i = 0; i < W; ++i)
        for (int a = 0; a < A; ++a) {
          const float* p = input.data + input.at(b, j, i, a * (5 + K));
          const float objectness = logistic(p[4]);
          Detection box;
          bool decoded = false;
          for (int k = k0; k < k1; ++k) {
            float score = class_score(objectness, p[5 + k]);
            if (!(score > threshold)) continue;
            if (!decoded) box = decode_box(p, i, j, a, W, H, config), decoded = true;
            groups[size_t(k - k0)].push_back(scored(box, score, k, b, ((b * H + j) * W + i) * A + a));
          }
        }
    for (std::vector<Detection>& group : groups) {
      std::sort(group.begin(), group.end(), ranks_before);
      items[item].insert(items[item].end(), group.begin(), group.end());
    }
  });
  size_t total = out.size();
  for (const std::vector<Detection>& item : items) total += item.size();
  out.reserve(total);
  for (const std::vector<Detection>& item : items) out.insert(out.end(), item.begin(), item.end());
}

size_t yolo_decode_workspace_bytes(int n, int h, int w, const YoloLossConfig& config) {
  const char* op = "yolo_decode_workspace_bytes";
  check_config(config, op);
  check_grid(n, h, w, config, op);
  check_cuda_limits(n, h, w, config, op);
  return decode_workspace(n, h, w, config).total;
}

void yolo_decode_cuda(ConstAct input, const YoloLossConfig& config, float threshold, Detection* out, int capacity,
                      int* count, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "yolo_decode_cuda";
  check_decode_arguments(input, config, threshold, op);
  check_cuda_limits(input.n, input.h, input.w, config, op);
  if (capacity < 0) bad_argument(op, "negative capacity " + std::to_string(capacity));
  if (capacity > 0 && !out) bad_argument(op, "null out with capacity " + std::to_string(capacity));
  if (!count) bad_argument(op, "null count");
  const DecodeWorkspace l = decode_workspace(input.n, input.h, input.w, config);
  if (!workspace || workspace_bytes < l.total)
    bad_argument(op, "workspace of " + std::to_string(workspace_bytes) + " bytes; yolo_decode_workspace_bytes says " +
                         std::to_string(l.total));
  char* base = static_cast<char*>(workspace);
  auto* group_counts = reinterpret_cast<int*>(base + l.counts);
  auto* offsets = reinterpret_cast<int*>(base + l.offsets);
  auto* cursor = reinterpret_cast<int*>(base + l.cursor);
  auto* keys = reinterpret_cast<uint64_t*>(base + l.keys);
  auto* alternate = reinterpret_cast<uint64_t*>(base + l.alternate);

  const dim3 grid(ceil_div(size_t(input.h) * input.w * config.mask_count, kDecodeThreads), unsigned(input.n));
  const size_t class_counters = size_t(config.classes) * sizeof(int);
  LAUNCH(clear_kernel, dim3(std::min(ceil_div(size_t(l.groups), 256), 1024u)), dim3(256), 0, stream, group_counts,
         l.groups);
  LAUNCH(count_candidates_kernel, grid, dim3(kDecodeThreads), class_counters, stream, input, config, threshold,
         group_counts);
  LAUNCH(group_offsets_kernel, dim3(1), dim3(kScanThreads), 0, stream, group_counts, l.groups, offsets, cursor, count);
  LAUNCH(scatter_candidates_kernel, grid, dim3(kDecodeThreads), class_counters, stream, input, config, threshold,
         offsets, cursor, keys);
  const uint64_t* sorted = segmented_sort_keys(keys, alternate, l.items, l.groups, offsets, offsets + 1,
                                               base + l.sort_temp, l.sort_temp_bytes, stream);
  if (capacity == 0) return;
  LAUNCH(write_detections_kernel, dim3(std::min(ceil_div(size_t(capacity), kWriteThreads), unsigned(kMaxWriteBlocks))),
         dim3(kWriteThreads), 0, stream, input, config, offsets, l.groups, sorted, out, capacity);
}

// ---- NMS: reference, CPU, CUDA ----------------------------------------------------------------
// A group is a maximal run of equal (image, class); within it, boxes are taken in array order.

void nms_reference(const Detection* detections, int count, float iou_threshold, int* keep) {
  check_nms_arguments(detections, count, iou_threshold, keep, "nms_reference");
  for (int i = 0; i < count; ++i) keep[i] = 1;
  for (int i = 0; i < count; ++i) {
    if (!keep[i]) continue;
    for (int j = i + 1; j < count && same_group(detections[j], detections[i].image, detections[i].class_id); ++j)
      if (keep[j] && box_iou(detections[i], detections[j]) > iou_threshold) keep[j] = 0;
  }
}

void nms_cpu(const Detection* detections, int count, float iou_threshold, int* keep) {
  check_nms_arguments(detections, count, iou_threshold, keep, "nms_cpu");
  std::vector<std::pair<int, int>> groups;  // [start, end)
  for (int start = 0, end = 0; start < count; start = end) {
    end = start + 1;
    while (end < count && same_group(detections[end], detections[start].image, detections[start].class_id)) ++end;
    groups.emplace_back(start, end);
  }
  // A box survives when no earlier survivor of its group overlaps it too much: the reference's
  // rule, with the same box_iou(kept, later) calls.
  parallel_for(groups.size(), [&](size_t g) {
    std::vector<int> kept;
    for (int q = groups[g].first; q < groups[g].second; ++q) {
      bool survives = true;
      for (int p : kept)
        if (box_iou(detections[p], detections[q]) > iou_threshold) {
          survives = false;
          break;
        }
      keep[q] = survives;
      if (survives) kept.push_back(q);
    }
  });
}

void nms_cuda(const Detection* detections, int count, float iou_threshold, int* keep, cudaStream_t stream) {
  check_nms_arguments(detections, count, iou_threshold, keep, "nms_cuda");
  if (count == 0) return;
  LAUNCH(nms_kernel, dim3(ceil_div(size_t(count), kNmsThreads)), dim3(kNmsThreads), 0, stream, detections, count,
         iou_threshold, keep);
}

}  // namespace yolo
