// YOLO layer loss (see yolo_loss.h for the formulation): the naive reference (darknet's passes
// over a per-prediction target table), the fast CPU version (threaded over images) and the CUDA
// version (three launches, all on the device). The CPU and CUDA versions share the per-prediction
// math below; the reference is written independently of it.
#include "kernels/yolo_loss.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

namespace yolo {
namespace {

// ---- argument checks --------------------------------------------------------------------------

[[noreturn]] void bad_argument(const std::string& why) { throw Error("yolo_loss: " + why); }

void validate_config(const YoloLossConfig& config) {
  if (!(config.grad_scale > 0.0f) || !std::isfinite(config.grad_scale))
    bad_argument("grad_scale " + std::to_string(config.grad_scale) + " is not a positive finite number");
  if (config.num_anchors < 1 || config.num_anchors > kYoloMaxAnchors)
    bad_argument("num_anchors " + std::to_string(config.num_anchors) + " is not in [1, " +
                 std::to_string(kYoloMaxAnchors) + "]");
  if (config.mask_count < 1 || config.mask_count > kYoloMaxAnchors)
    bad_argument("mask_count " + std::to_string(config.mask_count) + " is not in [1, " +
                 std::to_string(kYoloMaxAnchors) + "]");
  for (int n = 0; n < 2 * config.num_anchors; ++n)
    if (!(config.anchors[n] > 0.0f) || !std::isfinite(config.anchors[n]))
      bad_argument("anchor value " + std::to_string(config.anchors[n]) + " (index " + std::to_string(n) +
                   ") must be positive and finite");
  for (int a = 0; a < config.mask_count; ++a)
    if (config.mask[a] < 0 || config.mask[a] >= config.num_anchors)
      bad_argument("mask entry " + std::to_string(config.mask[a]) + " is not an anchor index in [0, " +
                   std::to_string(config.num_anchors) + ")");
  if (config.classes < 1) bad_argument("classes must be at least 1, got " + std::to_string(config.classes));
  if (config.net_w < 1 || config.net_h < 1)
    bad_argument("network size " + std::to_string(config.net_w) + "x" + std::to_string(config.net_h) +
                 " must be positive");
  if (std::isnan(config.ignore_thresh) || std::isnan(config.truth_thresh)) bad_argument("a threshold is NaN");
}

template <typename In, typename Out>
void validate_arguments(const NhwcView<In>& input, const YoloLossConfig& config, const YoloTruth* truths,
                        const int* truth_counts, int truth_stride, const NhwcView<Out>& grad, const void* stats) {
  validate_config(config);
  auto shape = [](const auto& v) {
    return std::to_string(v.n) + "x" + std::to_string(v.h) + "x" + std::to_string(v.w) + "x" + std::to_string(v.c) +
           " (stride " + std::to_string(v.stride) + ")";
  };
  if (input.n < 1 || input.h < 1 || input.w < 1) bad_argument("input " + shape(input) + " has an empty dimension");
  if (input.c != yolo_loss_channels(config))
    bad_argument("input has " + std::to_string(input.c) + " channels; mask_count*(5+classes) = " +
                 std::to_string(yolo_loss_channels(config)));
  if (size_t(input.h) * input.w * config.mask_count >= (size_t(1) << 31)) bad_argument("grid too large");
  if (input.stride < input.c) bad_argument("input stride < channels: " + shape(input));
  if (grad.n != input.n || grad.h != input.h || grad.w != input.w || grad.c != input.c)
    bad_argument("grad " + shape(grad) + " does not match input " + shape(input));
  if (grad.stride < grad.c) bad_argument("grad stride < channels: " + shape(grad));
  if (!input.data || !grad.data) bad_argument("null input or grad");
  if (truth_stride < 0) bad_argument("negative truth_stride " + std::to_string(truth_stride));
  if (truth_stride > 0 && !truths) bad_argument("null truths");
  if (!truth_counts) bad_argument("null truth_counts");
  if (!stats) bad_argument("null stats");
}

// ---- shared float math (CPU version and kernels) -------------------------------------------

struct Box {
  float x, y, w, h;  // centre and size, normalised
};

// A valid truth with its place in this layer: slot = (j*W + i)*A + a, or -1 when its best anchor
// is not in the mask.
struct PreparedTruth {
  float x, y, w, h;
  int class_id;
  int slot;
};

// Per image, from the truth pass: valid truths (compacted, in order) and the truth statistics.
struct ImageTruthSummary {
  int valid_count, assigned, recall50, dropped, invalid;
  float iou_sum;
};

// Plain comparisons: the host compiler calls out to fmaxf/fminf (NaN rules) in the IoU loop.
__host__ __device__ inline float larger(float a, float b) { return a > b ? a : b; }
__host__ __device__ inline float smaller(float a, float b) { return a < b ? a : b; }

__host__ __device__ inline float logistic(float z) { return 1.0f / (1.0f + expf(-z)); }
// ln(1 + e^z) without overflow; BCE(s(z), t) = softplus(z) - t*z.
__host__ __device__ inline float softplus(float z) { return larger(z, 0.0f) + log1pf(expf(-fabsf(z))); }
__host__ __device__ inline float bce_logit(float z, float target) { return softplus(z) - target * z; }

__host__ __device__ inline float overlap(float c1, float w1, float c2, float w2) {
  float left = larger(c1 - w1 / 2, c2 - w2 / 2), right = smaller(c1 + w1 / 2, c2 + w2 / 2);
  return right - left;
}
__host__ __device__ inline float box_iou(const Box& a, const Box& b) {
  float w = overlap(a.x, a.w, b.x, b.w), h = overlap(a.y, a.h, b.y, b.h);
  float inter = (w < 0 || h < 0) ? 0.0f : w * h;
  float uni = a.w * a.h + b.w * b.h - inter;
  return uni > 0 ? inter / uni : 0.0f;
}

// Anchor n of the model in normalised units.
__host__ __device__ inline float anchor_w(const YoloLossConfig& c, int n) { return c.anchors[2 * n] / float(c.net_w); }
__host__ __device__ inline float anchor_h(const YoloLossConfig& c, int n) {
  return c.anchors[2 * n + 1] / float(c.net_h);
}

// p points at channel tx of prediction (cell i, j; mask anchor a).
__host__ __device__ inline Box decode(const float* p, int i, int j, int a, int W, int H, const YoloLossConfig& c) {
  int n = c.mask[a];
  return Box{(float(i) + logistic(p[0])) / float(W), (float(j) + logistic(p[1])) / float(H),
             expf(p[2]) * anchor_w(c, n), expf(p[3]) * anchor_h(c, n)};
}

__host__ __device__ inline bool finite_value(float v) { return fabsf(v) <= 3.40282347e38f; }  // NaN: false

__host__ __device__ inline int grid_cell(float coordinate, int cells) {
  float g = coordinate * float(cells);
  return g < 0.0f ? 0 : (g >= float(cells) ? cells - 1 : int(g));  // clamped floor, no float->int overflow
}

// Checks a truth and finds its cell and best anchor; false when the truth is invalid.
__host__ __device__ inline bool prepare_truth(const YoloTruth& t, const YoloLossConfig& c, int W, int H,
                                              PreparedTruth* out) {
  bool finite = finite_value(t.x) && finite_value(t.y) && finite_value(t.w) && finite_value(t.h);
  // Normalised boxes: centre in [0,1], size in (0,1]. Anything else (pixel coordinates by
  // mistake) would give a negative box weight 2 - w*h or land in a clamped cell.
  bool inside = t.x >= 0.0f && t.x <= 1.0f && t.y >= 0.0f && t.y <= 1.0f && t.w <= 1.0f && t.h <= 1.0f;
  if (!finite || !inside || !(t.w > 0.0f) || !(t.h > 0.0f) || t.class_id < 0 || t.class_id >= c.classes) return false;
  int i = grid_cell(t.x, W), j = grid_cell(t.y, H);
  float best = 0.0f;
  int best_n = 0;
  for (int n = 0; n < c.num_anchors; ++n) {  // width/height IoU, centres aligned
    float aw = anchor_w(c, n), ah = anchor_h(c, n);
    float inter = smaller(t.w, aw) * smaller(t.h, ah);
    float iou = inter / (t.w * t.h + aw * ah - inter);
    if (iou > best) best = iou, best_n = n;
  }
  int a = -1;
  for (int m = c.mask_count - 1; m >= 0; --m)
    if (c.mask[m] == best_n) a = m;
  *out = PreparedTruth{t.x, t.y, t.w, t.h, t.class_id, a < 0 ? -1 : (j * W + i) * c.mask_count + a};
  return true;
}

// One prediction's objectness, box targets and losses (everything except its class terms).
struct Resolved {
  int positive_class;  // class of the truth giving box/class targets, -1 when not positive
  float box_grad[4];   // 0 unless positive
  float obj_grad;
  float box_loss, obj_loss, noobj_loss;
};

__host__ __device__ inline Resolved resolve_prediction(const float* p, int i, int j, int a, int W, int H,
                                                       const YoloLossConfig& c, const PreparedTruth* truths,
                                                       int truth_count) {
  Box pred = decode(p, i, j, a, W, H, c);
  int slot = (j * W + i) * c.mask_count + a;
  float best = 0.0f;
  int best_t = -1, assigned_t = -1;
  for (int t = 0; t < truth_count; ++t) {
    float iou = box_iou(pred, Box{truths[t].x, truths[t].y, truths[t].w, truths[t].h});
    if (iou > best) best = iou, best_t = t;
    if (truths[t].slot == slot) assigned_t = t;  // the last truth at this (cell, anchor) wins
  }
  bool over_truth_thresh = c.truth_thresh < 1.0f && best > c.truth_thresh;  // IoU may round above 1
  int positive_t = assigned_t >= 0 ? assigned_t : (over_truth_thresh ? best_t : -1);
  Resolved r{-1, {0.0f, 0.0f, 0.0f, 0.0f}, 0.0f, 0.0f, 0.0f, 0.0f};
  float to = p[4], so = logistic(to);
  if (positive_t < 0) {
    if (!(best > c.ignore_thresh)) r.obj_grad = so, r.noobj_loss = softplus(to);
    return r;
  }
  const PreparedTruth& t = truths[positive_t];
  int n = c.mask[a];
  float k = 2.0f - t.w * t.h;
  float target[4] = {t.x * float(W) - float(i), t.y * float(H) - float(j),
                     logf(t.w * float(c.net_w) / c.anchors[2 * n]), logf(t.h * float(c.net_h) / c.anchors[2 * n + 1])};
  float dw = p[2] - target[2], dh = p[3] - target[3];
  r.box_grad[0] = k * (logistic(p[0]) - target[0]);
  r.box_grad[1] = k * (logistic(p[1]) - target[1]);
  r.box_grad[2] = k * dw;
  r.box_grad[3] = k * dh;
  r.box_loss = k * (bce_logit(p[0], target[0]) + bce_logit(p[1], target[1]) + 0.5f * dw * dw + 0.5f * dh * dh);
  r.obj_grad = so - 1.0f;
  r.obj_loss = softplus(-to);
  r.positive_class = t.class_id;
  return r;
}

// ---- CUDA kernels -----------------------------------------------------------------------------

constexpr int kTruthThreads = 96;  // >= kYoloMaxTruths, whole warps
constexpr int kLossThreads = 256;  // predictions per block at most
constexpr int kReduceThreads = 256;
static_assert(kTruthThreads >= kYoloMaxTruths && kTruthThreads % 32 == 0, "one thread per truth");

// A prediction's 5 box/objectness values as FP32: in place for float storage (the FP32 kernels'
// code is unchanged), widened into `scratch` for 16-bit storage.
template <typename T>
__device__ __forceinline__ const float* prediction(const T* p, float (&scratch)[5]) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
#pragma unroll
    for (int e = 0; e < 5; ++e) scratch[e] = to_float(p[e]);
    return scratch;
  }
}

// Block b: image b's truths -> compacted PreparedTruth table, dropped/invalid counts and the
// statistics of assigned truths (IoU of the prediction at the truth's cell and anchor).
// T: the storage type of the input (float, Bf16, Fp16); the math is FP32.
template <typename T>
__global__ void __launch_bounds__(kTruthThreads)
    prepare_truths_kernel(NhwcView<const T> input, YoloLossConfig c, const YoloTruth* truths, const int* truth_counts,
                          int truth_stride, PreparedTruth* prepared, ImageTruthSummary* summaries) {
  __shared__ int valid[kTruthThreads], assigned[kTruthThreads], recall[kTruthThreads];
  __shared__ float iou_part[kTruthThreads];
  int b = blockIdx.x, t = threadIdx.x;
  int count = max(truth_counts[b], 0);
  int used = min(min(count, truth_stride), kYoloMaxTruths);
  PreparedTruth p{};
  bool ok = t < used && prepare_truth(truths[size_t(b) * truth_stride + t], c, input.w, input.h, &p);
  float iou = 0.0f;
  if (ok && p.slot >= 0) {
    int a = p.slot % c.mask_count, pixel = p.slot / c.mask_count;
    int i = pixel % input.w, j = pixel / input.w;
    float scratch[5];
    Box pred = decode(prediction(input.data + input.at(b, j, i, a * (5 + c.classes)), scratch), i, j, a, input.w,
                      input.h, c);
    iou = box_iou(pred, Box{p.x, p.y, p.w, p.h});
  }
  valid[t] = ok;
  assigned[t] = ok && p.slot >= 0;
  recall[t] = ok && p.slot >= 0 && iou > 0.5f;
  iou_part[t] = iou;
  __syncthreads();
  if (ok) {
    int position = 0;  // keeps the truths' order (the last-wins rule depends on it)
    for (int u = 0; u < t; ++u) position += valid[u];
    prepared[size_t(b) * kYoloMaxTruths + position] = p;
  }
  if (t == 0) {
    ImageTruthSummary s{0, 0, 0, count - used, 0, 0.0f};
    for (int u = 0; u < kTruthThreads; ++u) {
      s.valid_count += valid[u];
      s.assigned += assigned[u];
      s.recall50 += recall[u];
      s.iou_sum += iou_part[u];
    }
    s.invalid = used - s.valid_count;
    summaries[b] = s;
  }
}

// Block (x, b): pixels [x*pixels_per_block, ...) of image b. Phase 1, one thread per prediction:
// objectness and box terms into shared memory. Phase 2, a warp per pixel: write every gradient
// element (class terms computed here). Loss partials per block.
// T: the storage type of input and grad; gradients computed in FP32 and rounded once.
template <typename T>
__global__ void __launch_bounds__(kLossThreads)
    loss_gradient_kernel(NhwcView<const T> input, YoloLossConfig c, const PreparedTruth* prepared,
                         const ImageTruthSummary* summaries, int pixels_per_block, NhwcView<T> grad, float* partials) {
  __shared__ PreparedTruth truth[kYoloMaxTruths];
  __shared__ float box_grad[kLossThreads][4];
  __shared__ float obj_grad[kLossThreads];
  __shared__ int positive_class[kLossThreads];
  const int b = blockIdx.y, A = c.mask_count, per = 5 + c.classes, W = input.w, H = input.h;
  const int first_pixel = blockIdx.x * pixels_per_block;
  const int pixels = min(pixels_per_block, H * W - first_pixel);
  const int truth_count = summaries[b].valid_count;
  const float grad_scale = c.grad_scale_at ? *c.grad_scale_at : c.grad_scale;
  for (int t = threadIdx.x; t < truth_count; t += blockDim.x) truth[t] = prepared[size_t(b) * kYoloMaxTruths + t];
  __syncthreads();

  float box_loss = 0.0f, obj_loss = 0.0f, noobj_loss = 0.0f, class_loss = 0.0f;
  for (int lp = threadIdx.x; lp < pixels * A; lp += blockDim.x) {
    int pixel = first_pixel + lp / A, a = lp % A, i = pixel % W, j = pixel / W;
    float scratch[5];
    Resolved r = resolve_prediction(prediction(input.data + input.at(b, j, i, a * per), scratch), i, j, a, W, H, c,
                                    truth, truth_count);
    for (int e = 0; e < 4; ++e) box_grad[lp][e] = r.box_grad[e];
    obj_grad[lp] = r.obj_grad;
    positive_class[lp] = r.positive_class;
    box_loss += r.box_loss;
    obj_loss += r.obj_loss;
    noobj_loss += r.noobj_loss;
  }
  __syncthreads();

  // A warp per pixel, lanes along its channels (coalesced writes); channel ch = a*per + k, with
  // (a, k) stepped along instead of divided out per element.
  const int channels = input.c, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int lane_a = lane / per, lane_k = lane - lane_a * per;
  const size_t pixel_base = size_t(b) * H * W + first_pixel;
  for (int local_pixel = threadIdx.x / 32; local_pixel < pixels; local_pixel += warps) {
    const T* x = input.data + (pixel_base + local_pixel) * input.stride;
    T* out = grad.data + (pixel_base + local_pixel) * grad.stride;
    int a = lane_a, k = lane_k;
    for (int ch = lane; ch < channels; ch += 32) {
      int lp = local_pixel * A + a;
      float g = 0.0f;
      if (k < 4) {
        g = box_grad[lp][k];
      } else if (k == 4) {
        g = obj_grad[lp];
      } else if (positive_class[lp] >= 0) {
        float target = k - 5 == positive_class[lp] ? 1.0f : 0.0f;
        const float xv = to_float(x[ch]);
        g = logistic(xv) - target;
        class_loss += bce_logit(xv, target);
      }
      out[ch] = from_float<T>(g * grad_scale);
      for (k += 32; k >= per; k -= per) ++a;
    }
  }

  box_loss = block_sum(box_loss);
  obj_loss = block_sum(obj_loss);
  noobj_loss = block_sum(noobj_loss);
  class_loss = block_sum(class_loss);
  if (threadIdx.x == 0) {
    float* out = partials + 4 * (size_t(blockIdx.y) * gridDim.x + blockIdx.x);
    out[0] = box_loss, out[1] = obj_loss, out[2] = noobj_loss, out[3] = class_loss;
  }
}

// One block: per-thread sums over a fixed stride, then thread 0 adds the threads' sums in order.
__global__ void __launch_bounds__(kReduceThreads)
    reduce_stats_kernel(const ImageTruthSummary* summaries, int images, const float* partials, int blocks,
                        YoloLossStats* stats) {
  __shared__ float loss[4][kReduceThreads], iou[kReduceThreads];
  __shared__ int counts[4][kReduceThreads];
  int t = threadIdx.x;
  float l[4] = {0.0f, 0.0f, 0.0f, 0.0f}, iou_sum = 0.0f;
  int n[4] = {0, 0, 0, 0};
  for (int q = t; q < blocks; q += kReduceThreads)
    for (int k = 0; k < 4; ++k) l[k] += partials[4 * size_t(q) + k];
  for (int q = t; q < images; q += kReduceThreads) {
    const ImageTruthSummary& s = summaries[q];
    iou_sum += s.iou_sum;
    n[0] += s.assigned, n[1] += s.recall50, n[2] += s.dropped, n[3] += s.invalid;
  }
  for (int k = 0; k < 4; ++k) loss[k][t] = l[k], counts[k][t] = n[k];
  iou[t] = iou_sum;
  __syncthreads();
  if (t == 0) {
    YoloLossStats s{};
    for (int u = 0; u < kReduceThreads; ++u) {
      s.box_loss += loss[0][u], s.obj_loss += loss[1][u], s.noobj_loss += loss[2][u], s.class_loss += loss[3][u];
      s.iou_sum += iou[u];
      s.assigned += counts[0][u], s.recall50 += counts[1][u], s.truths_dropped += counts[2][u],
          s.truths_invalid += counts[3][u];
    }
    *stats = s;
  }
}

// ---- workspace layout -------------------------------------------------------------------------

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
int loss_pixels_per_block(const YoloLossConfig& c) { return std::max(1, kLossThreads / c.mask_count); }
int loss_tiles(int h, int w, const YoloLossConfig& c) { return int(ceil_div(size_t(h) * w, loss_pixels_per_block(c))); }

struct WorkspaceLayout {
  size_t prepared = 0, summaries = 0, partials = 0, total = 0;
};
WorkspaceLayout workspace_layout(int n, int h, int w, const YoloLossConfig& c) {
  WorkspaceLayout l;
  l.summaries = align_up(size_t(n) * kYoloMaxTruths * sizeof(PreparedTruth));
  l.partials = l.summaries + align_up(size_t(n) * sizeof(ImageTruthSummary));
  l.total = l.partials + align_up(size_t(n) * loss_tiles(h, w, c) * 4 * sizeof(float));
  return l;
}

// ---- reference helpers (type T) ---------------------------------------------------------------

template <typename T>
struct RefBox {
  T x, y, w, h;
};
template <typename T>
T ref_logistic(T z) {
  return T(1) / (T(1) + std::exp(-z));
}
// BCE(s(z), t) = -t ln s(z) - (1-t) ln(1 - s(z)) = ln(1 + e^z) - t z, written without overflow.
template <typename T>
T ref_bce(T z, T t) {
  return std::max(z, T(0)) + std::log1p(std::exp(-std::abs(z))) - t * z;
}
template <typename T>
T ref_iou(const RefBox<T>& a, const RefBox<T>& b) {
  T w = std::min(a.x + a.w / 2, b.x + b.w / 2) - std::max(a.x - a.w / 2, b.x - b.w / 2);
  T h = std::min(a.y + a.h / 2, b.y + b.h / 2) - std::max(a.y - a.h / 2, b.y - b.h / 2);
  T inter = (w < 0 || h < 0) ? T(0) : w * h;
  T uni = a.w * a.h + b.w * b.h - inter;
  return uni > 0 ? inter / uni : T(0);
}

}  // namespace

YoloLossConfig make_yolo_loss_config(const std::vector<float>& anchors, const std::vector<int>& mask, int classes,
                                     int net_w, int net_h, float ignore_thresh, float truth_thresh) {
  if (anchors.size() % 2 != 0) bad_argument("anchors must be (w, h) pairs; got " + std::to_string(anchors.size()) + " values");
  if (anchors.size() / 2 > size_t(kYoloMaxAnchors) || mask.size() > size_t(kYoloMaxAnchors))
    bad_argument("at most " + std::to_string(kYoloMaxAnchors) + " anchors and mask entries");
  YoloLossConfig c;
  c.num_anchors = int(anchors.size() / 2);
  std::copy(anchors.begin(), anchors.end(), c.anchors);
  c.mask_count = int(mask.size());
  std::copy(mask.begin(), mask.end(), c.mask);
  c.classes = classes;
  c.net_w = net_w, c.net_h = net_h;
  c.ignore_thresh = ignore_thresh, c.truth_thresh = truth_thresh;
  validate_config(c);
  return c;
}

template <typename T>
void yolo_loss_reference(NhwcView<const T> input, const YoloLossConfig& config, const YoloTruth* truths,
                         const int* truth_counts, int truth_stride, NhwcView<T> grad, YoloLossStatsT<T>* stats) {
  validate_arguments(input, config, truths, truth_counts, truth_stride, grad, stats);
  if (config.grad_scale != 1.0f || config.grad_scale_at)
    bad_argument("grad_scale (fp16 loss scaling) is a CUDA-path option; it must be 1 here");
  const int A = config.mask_count, K = config.classes, H = input.h, W = input.w;
  YoloLossStatsT<T> s{};
  auto anchor_size = [&](int n) {
    return std::pair<T, T>{T(config.anchors[2 * n]) / T(config.net_w), T(config.anchors[2 * n + 1]) / T(config.net_h)};
  };
  auto predicted_box = [&](int b, int j, int i, int a) {
    const T* p = input.data + input.at(b, j, i, a * (5 + K));
    auto [aw, ah] = anchor_size(config.mask[a]);
    return RefBox<T>{(i + ref_logistic(p[0])) / W, (j + ref_logistic(p[1])) / H, std::exp(p[2]) * aw,
                     std::exp(p[3]) * ah};
  };
  for (int b = 0; b < input.n; ++b) {
    int count = std::max(truth_counts[b], 0);
    int used = std::min({count, truth_stride, kYoloMaxTruths});
    s.truths_dropped += count - used;
    std::vector<YoloTruth> kept;
    for (int t = 0; t < used; ++t) {
      const YoloTruth& truth = truths[size_t(b) * truth_stride + t];
      bool finite = std::isfinite(truth.x) && std::isfinite(truth.y) && std::isfinite(truth.w) && std::isfinite(truth.h);
      bool inside = truth.x >= 0 && truth.x <= 1 && truth.y >= 0 && truth.y <= 1 && truth.w <= 1 && truth.h <= 1;
      if (finite && inside && truth.w > 0 && truth.h > 0 && truth.class_id >= 0 && truth.class_id < K) kept.push_back(truth);
      else ++s.truths_invalid;
    }
    auto truth_box = [&](int t) { return RefBox<T>{T(kept[t].x), T(kept[t].y), T(kept[t].w), T(kept[t].h)}; };

    // Darknet's order: objectness targets from the best IoU first, then the assigned truths.
    const int predictions = H * W * A;
    std::vector<int> obj_target(predictions, 0);     // 0, 1, or -1: no objectness term
    std::vector<int> target_truth(predictions, -1);  // truth giving box and class targets
    for (int j = 0; j < H; ++j)
      for (int i = 0; i < W; ++i)
        for (int a = 0; a < A; ++a) {
          int p = (j * W + i) * A + a;
          RefBox<T> box = predicted_box(b, j, i, a);
          T best = 0;
          int best_t = -1;
          for (int t = 0; t < int(kept.size()); ++t) {
            T iou = ref_iou(box, truth_box(t));
            if (iou > best) best = iou, best_t = t;
          }
          if (best > T(config.ignore_thresh)) obj_target[p] = -1;
          if (config.truth_thresh < 1 && best > T(config.truth_thresh)) obj_target[p] = 1, target_truth[p] = best_t;
        }
    for (int t = 0; t < int(kept.size()); ++t) {
      RefBox<T> truth = truth_box(t);
      // The cell from the float coordinate, as darknet, the CPU loss and the kernel find it: in
      // double, 0.9f * 10 is just below 9 (cell 8); in float it rounds to 9.
      int i = grid_cell(kept[t].x, W), j = grid_cell(kept[t].y, H);
      T best = 0;
      int best_n = 0;
      for (int n = 0; n < config.num_anchors; ++n) {
        auto [aw, ah] = anchor_size(n);
        T iou = ref_iou(RefBox<T>{0, 0, truth.w, truth.h}, RefBox<T>{0, 0, aw, ah});
        if (iou > best) best = iou, best_n = n;
      }
      int a = int(std::find(config.mask, config.mask + A, best_n) - config.mask);
      if (a == A) continue;  // another layer's anchor
      int p = (j * W + i) * A + a;
      T iou = ref_iou(predicted_box(b, j, i, a), truth);
      ++s.assigned;
      s.iou_sum += iou;
      if (iou > T(0.5)) ++s.recall50;
      obj_target[p] = 1;
      target_truth[p] = t;
    }

    for (int j = 0; j < H; ++j)
      for (int i = 0; i < W; ++i)
        for (int a = 0; a < A; ++a) {
          int p = (j * W + i) * A + a;
          const T* x = input.data + input.at(b, j, i, a * (5 + K));
          T* g = grad.data + grad.at(b, j, i, a * (5 + K));
          for (int ch = 0; ch < 5 + K; ++ch) g[ch] = 0;
          if (obj_target[p] >= 0) {
            g[4] = ref_logistic(x[4]) - obj_target[p];
            (obj_target[p] ? s.obj_loss : s.noobj_loss) += ref_bce(x[4], T(obj_target[p]));
          }
          if (target_truth[p] < 0) continue;
          RefBox<T> truth = truth_box(target_truth[p]);
          auto [aw, ah] = anchor_size(config.mask[a]);
          T k = 2 - truth.w * truth.h;
          T target[4] = {truth.x * W - i, truth.y * H - j, std::log(truth.w / aw), std::log(truth.h / ah)};
          g[0] = k * (ref_logistic(x[0]) - target[0]);
          g[1] = k * (ref_logistic(x[1]) - target[1]);
          g[2] = k * (x[2] - target[2]);
          g[3] = k * (x[3] - target[3]);
          s.box_loss += k * (ref_bce(x[0], target[0]) + ref_bce(x[1], target[1]) +
                             (x[2] - target[2]) * (x[2] - target[2]) / 2 + (x[3] - target[3]) * (x[3] - target[3]) / 2);
          for (int cls = 0; cls < K; ++cls) {
            T y = cls == kept[target_truth[p]].class_id ? T(1) : T(0);
            g[5 + cls] = ref_logistic(x[5 + cls]) - y;
            s.class_loss += ref_bce(x[5 + cls], y);
          }
        }
  }
  *stats = s;
}

template void yolo_loss_reference<float>(NhwcView<const float>, const YoloLossConfig&, const YoloTruth*, const int*,
                                         int, NhwcView<float>, YoloLossStatsT<float>*);
template void yolo_loss_reference<double>(NhwcView<const double>, const YoloLossConfig&, const YoloTruth*, const int*,
                                          int, NhwcView<double>, YoloLossStatsT<double>*);

void yolo_loss_cpu(ConstAct input, const YoloLossConfig& config, const YoloTruth* truths, const int* truth_counts,
                   int truth_stride, Act grad, YoloLossStats* stats) {
  validate_arguments(input, config, truths, truth_counts, truth_stride, grad, stats);
  if (config.grad_scale != 1.0f || config.grad_scale_at)
    bad_argument("grad_scale (fp16 loss scaling) is a CUDA-path option; it must be 1 here");
  const int A = config.mask_count, per = 5 + config.classes, H = input.h, W = input.w;
  struct ImageTruths {
    PreparedTruth prepared[kYoloMaxTruths];
    int valid = 0;
    ImageTruthSummary summary{};
  };
  std::vector<ImageTruths> images(size_t(input.n));
  parallel_for(size_t(input.n), [&](size_t image) {
    int b = int(image);
    ImageTruths& it = images[image];
    int count = std::max(truth_counts[b], 0);
    int used = std::min({count, truth_stride, kYoloMaxTruths});
    it.summary.dropped = count - used;
    for (int t = 0; t < used; ++t) {
      PreparedTruth& p = it.prepared[it.valid];
      if (!prepare_truth(truths[size_t(b) * truth_stride + t], config, W, H, &p)) {
        ++it.summary.invalid;
        continue;
      }
      ++it.valid;
      if (p.slot < 0) continue;
      int a = p.slot % A, pixel = p.slot / A, i = pixel % W, j = pixel / W;
      float iou = box_iou(decode(input.data + input.at(b, j, i, a * per), i, j, a, W, H, config), Box{p.x, p.y, p.w, p.h});
      ++it.summary.assigned;
      it.summary.iou_sum += iou;
      it.summary.recall50 += iou > 0.5f;
    }
  });

  // Work items: bands of rows of one image (a fixed split, whatever the thread count); each
  // band's sums run in a fixed order, then the bands in order.
  const int rows_per_band = std::max(1, 2048 / std::max(1, W * A));
  const int bands = (H + rows_per_band - 1) / rows_per_band;
  std::vector<std::array<double, 4>> band_loss(size_t(input.n) * bands);
  parallel_for(band_loss.size(), [&](size_t item) {
    int b = int(item / bands), band = int(item % bands);
    const ImageTruths& it = images[size_t(b)];
    std::array<double, 4> loss{0, 0, 0, 0};
    for (int j = band * rows_per_band; j < std::min(H, (band + 1) * rows_per_band); ++j)
      for (int i = 0; i < W; ++i)
        for (int a = 0; a < A; ++a) {
          const float* x = input.data + input.at(b, j, i, a * per);
          float* g = grad.data + grad.at(b, j, i, a * per);
          Resolved r = resolve_prediction(x, i, j, a, W, H, config, it.prepared, it.valid);
          for (int e = 0; e < 4; ++e) g[e] = r.box_grad[e];
          g[4] = r.obj_grad;
          loss[0] += r.box_loss;
          loss[1] += r.obj_loss;
          loss[2] += r.noobj_loss;
          if (r.positive_class < 0) {
            std::fill(g + 5, g + per, 0.0f);
            continue;
          }
          for (int cls = 0; cls < per - 5; ++cls) {
            float target = cls == r.positive_class ? 1.0f : 0.0f;
            g[5 + cls] = logistic(x[5 + cls]) - target;
            loss[3] += bce_logit(x[5 + cls], target);
          }
        }
    band_loss[item] = loss;
  });

  YoloLossStatsT<double> total{};
  for (const std::array<double, 4>& loss : band_loss)
    total.box_loss += loss[0], total.obj_loss += loss[1], total.noobj_loss += loss[2], total.class_loss += loss[3];
  for (const ImageTruths& it : images) {
    total.iou_sum += it.summary.iou_sum;
    total.assigned += it.summary.assigned, total.recall50 += it.summary.recall50,
        total.truths_dropped += it.summary.dropped, total.truths_invalid += it.summary.invalid;
  }
  *stats = YoloLossStats{float(total.box_loss), float(total.obj_loss), float(total.noobj_loss),
                         float(total.class_loss), float(total.iou_sum), total.assigned, total.recall50,
                         total.truths_dropped, total.truths_invalid};
}

size_t yolo_loss_workspace_bytes(int n, int h, int w, const YoloLossConfig& config) {
  validate_config(config);
  if (n < 1 || h < 1 || w < 1) bad_argument("workspace for an empty batch or grid");
  return workspace_layout(n, h, w, config).total;
}

template <typename T>
void yolo_loss_cuda(NhwcView<const T> input, const YoloLossConfig& config, const YoloTruth* truths,
                    const int* truth_counts, int truth_stride, NhwcView<T> grad, YoloLossStats* stats, void* workspace,
                    size_t workspace_bytes, cudaStream_t stream) {
  validate_arguments(input, config, truths, truth_counts, truth_stride, grad, stats);
  WorkspaceLayout layout = workspace_layout(input.n, input.h, input.w, config);
  if (!workspace || workspace_bytes < layout.total)
    bad_argument("workspace of " + std::to_string(workspace_bytes) + " bytes; yolo_loss_workspace_bytes says " +
                 std::to_string(layout.total));
  char* base = static_cast<char*>(workspace);
  auto* prepared = reinterpret_cast<PreparedTruth*>(base + layout.prepared);
  auto* summaries = reinterpret_cast<ImageTruthSummary*>(base + layout.summaries);
  auto* partials = reinterpret_cast<float*>(base + layout.partials);
  const int tiles = loss_tiles(input.h, input.w, config);
  if (input.n > 65535) bad_argument("batch " + std::to_string(input.n) + " exceeds the grid's y limit 65535");

  LAUNCH(prepare_truths_kernel<T>, dim3(unsigned(input.n)), dim3(kTruthThreads), 0, stream, input, config, truths,
         truth_counts, truth_stride, prepared, summaries);
  LAUNCH(loss_gradient_kernel<T>, dim3(unsigned(tiles), unsigned(input.n)), dim3(kLossThreads), 0, stream, input,
         config, prepared, summaries, loss_pixels_per_block(config), grad, partials);
  LAUNCH(reduce_stats_kernel, dim3(1), dim3(kReduceThreads), 0, stream, summaries, input.n, partials,
         tiles * input.n, stats);
}

#define YOLO_LOSS_CUDA(T)                                                                                           \
  template void yolo_loss_cuda<T>(NhwcView<const T>, const YoloLossConfig&, const YoloTruth*, const int*, int,     \
                                  NhwcView<T>, YoloLossStats*, void*, size_t, cudaStream_t);
YOLO_LOSS_CUDA(float)
YOLO_LOSS_CUDA(Bf16)
YOLO_LOSS_CUDA(Fp16)
#undef YOLO_LOSS_CUDA

}  // namespace yolo
