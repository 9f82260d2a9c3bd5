// The YOLO layer's loss, darknet's YOLOv3 formulation: forward (loss and statistics) and
// backward (gradient w.r.t. the raw outputs of the preceding 1x1 conv) in one op.
//
// Input: NHWC view (N, H, W, A*(5+K)), possibly a channel slice; for mask anchor a the channels
// a*(5+K) + [tx, ty, tw, th, to, c_1..c_K]. With s = logistic, prediction (b, j, i, a) decodes to
// the box (normalised image coordinates, centre and size)
//   bx = (i + s(tx))/W, by = (j + s(ty))/H, bw = exp(tw)*anchor_w/net_w, bh = exp(th)*anchor_h/net_h,
// where anchor = anchors[mask[a]] in network pixels.
//
// Truths: per image the first min(count, truth_stride, kYoloMaxTruths) boxes of its row of
// `truth_stride` boxes are used; the rest of `count` are dropped and counted. A truth is invalid
// (skipped entirely, counted) unless 0 <= x, y <= 1, 0 < w, h <= 1 (all finite) and
// 0 <= class_id < K. Unlike darknet, a truth at x == 0 is a real box, not the end of the list:
// the loader passes exact counts.
//
// Assignment: truth (x, y, w, h, class) goes to cell i = floor(x*W), j = floor(y*H) (clamped to the
// grid) and to the anchor, among ALL the model's anchors, whose width/height IoU with (w, h) is
// highest (centres aligned; the first on ties). The layer trains it only if that anchor is in the
// mask (at mask index a). Targets: tx* = x*W - i, ty* = y*H - j, tw* = ln(w*net_w/anchor_w),
// th* = ln(h*net_h/anchor_h), box weight k = 2 - w*h; class target 1 for its class, 0 for the rest.
// Two truths in one (cell, anchor): truths are processed in order and the later one overwrites
// the earlier one's box and class targets (darknet's order; unlike darknet's delta_yolo_class, the
// earlier class is NOT kept as a second positive class).
//
// Objectness: target 0 for every prediction, except (in this order, later wins)
//   - no objectness term at all where the prediction's best IoU with any truth of its image
//     exceeds ignore_thresh;
//   - where the best IoU exceeds truth_thresh, target 1, and box and class targets from that best
//     truth (the first of equal IoUs) at the prediction's own cell and anchor (darknet; a
//     truth_thresh >= 1 disables this rule, also where rounding puts an IoU above 1);
//   - target 1 at assigned predictions (above), whose box and class targets come from the truth.
// A prediction with target 1 is "positive" and has box and class terms.
//
// Loss (the function whose gradient is the op's output; BCE(p, t) = -t ln p - (1-t) ln(1-p)):
//   L = sum over positive predictions of k*[BCE(s(tx),tx*) + BCE(s(ty),ty*) + (tw-tw*)^2/2 + (th-th*)^2/2]
//     + sum over predictions with an objectness term of BCE(s(to), target)
//     + sum over positive predictions and classes c of BCE(s(t_c), [c == class]).
// Gradient: k*(s(t) - t*) for x, y; k*(t - t*) for w, h; s(to) - target; s(t_c) - target; 0 where no
// term. Every element of `grad` is written. Loss and gradient are SUMS over the images of the batch,
// not averages: the optimizer divides by the global batch.
//
// Statistics follow darknet: each truth assigned to this layer counts once (also one that a later
// truth overwrote), with the IoU of the prediction at its (cell, anchor) and the truth; recall50
// counts those IoUs > 0.5. All sums are in a fixed order (deterministic bits).
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/half_types.h"
#include "kernels/tensor.h"

namespace yolo {

constexpr int kYoloMaxTruths = 90;   // boxes per image the op uses (darknet's max_boxes)
constexpr int kYoloMaxAnchors = 16;  // model anchors, and mask entries, at most

// One ground-truth box: centre and size normalised to [0, 1] by the image size.
struct YoloTruth {
  float x = 0, y = 0, w = 0, h = 0;
  int class_id = 0;
};

struct YoloLossConfig {
  int num_anchors = 0;                      // all the model's anchors (YOLOv3: 9)
  float anchors[2 * kYoloMaxAnchors] = {};  // (w, h) pairs in network pixels
  int mask_count = 0;                       // A: this layer's anchors
  int mask[kYoloMaxAnchors] = {};           // indices into the anchors
  int classes = 0;                          // K
  int net_w = 0, net_h = 0;                 // network input size in pixels
  float ignore_thresh = 0.7f;
  float truth_thresh = 1.0f;                // >= 1 disables
  // The gradient (not the loss or its statistics) is multiplied by this before it is stored:
  // --precision fp16's loss scale, so small gradients survive FP16. _cuda only (1 elsewhere).
  float grad_scale = 1.0f;
  // When set (device memory), the scale is read from here when the kernel runs and grad_scale is
  // not used: a replayed CUDA Graph then applies the current loss scale. _cuda only.
  const float* grad_scale_at = nullptr;
};

// Builds a config (anchors as w0,h0,w1,h1,...) and validates it; throws yolo::Error.
YoloLossConfig make_yolo_loss_config(const std::vector<float>& anchors, const std::vector<int>& mask, int classes,
                                     int net_w, int net_h, float ignore_thresh = 0.7f, float truth_thresh = 1.0f);
inline int yolo_loss_channels(const YoloLossConfig& config) { return config.mask_count * (5 + config.classes); }

// Sums over the batch. Losses are the four parts of L: box (x, y, w, h terms), obj (objectness of
// positives), noobj (objectness with target 0), class. avg IoU = iou_sum / assigned.
template <typename T>
struct YoloLossStatsT {
  T box_loss = 0, obj_loss = 0, noobj_loss = 0, class_loss = 0;
  T iou_sum = 0;           // IoU of prediction and truth over assigned truths
  int assigned = 0;        // truths assigned to this layer's anchors
  int recall50 = 0;        // assigned truths whose prediction IoU > 0.5
  int truths_dropped = 0;  // beyond kYoloMaxTruths (or beyond truth_stride)
  int truths_invalid = 0;  // skipped: bad class, size outside (0,1], centre outside [0,1], non-finite
  T total() const { return box_loss + obj_loss + noobj_loss + class_loss; }
};
using YoloLossStats = YoloLossStatsT<float>;

// Arguments shared by all three (host pointers, device pointers for _cuda):
//   input: (N, H, W, A*(5+K)) raw conv outputs; grad: the same shape, must not overlap input;
//   truths: N rows of truth_stride boxes (may be null when truth_stride is 0);
//   truth_counts: N counts (a negative count reads as 0); stats: one struct (written).
// Throws yolo::Error for bad shapes, null pointers or a bad config.
template <typename T>
void yolo_loss_reference(NhwcView<const T> input, const YoloLossConfig& config, const YoloTruth* truths,
                         const int* truth_counts, int truth_stride, NhwcView<T> grad, YoloLossStatsT<T>* stats);
// Threaded over images.
void yolo_loss_cpu(ConstAct input, const YoloLossConfig& config, const YoloTruth* truths, const int* truth_counts,
                   int truth_stride, Act grad, YoloLossStats* stats);

// Device workspace yolo_loss_cuda needs for a batch of n images of h x w cells.
size_t yolo_loss_workspace_bytes(int n, int h, int w, const YoloLossConfig& config);
// Everything on the device, no host copies: 3 launches on `stream` (truth table per image,
// per-prediction gradient and loss partials, final ordered reduction into *stats).
// T: float, or the 16-bit storage types Bf16/Fp16 (--precision bf16/fp16): the loss and its
// statistics in FP32, each gradient element computed in FP32 and rounded once to T.
template <typename T>
void yolo_loss_cuda(NhwcView<const T> input, const YoloLossConfig& config, const YoloTruth* truths,
                    const int* truth_counts, int truth_stride, NhwcView<T> grad, YoloLossStats* stats, void* workspace,
                    size_t workspace_bytes, cudaStream_t stream);

}  // namespace yolo
