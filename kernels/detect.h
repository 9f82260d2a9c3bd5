// Detection from the [yolo] layers' raw outputs: decode every (cell, anchor, class) whose
// score passes a threshold into a box, then per-class non-maximum suppression.
//
// Decode: for the input (N, H, W, A*(5+K)) of a [yolo] layer (the raw conv outputs; channels per
// mask anchor a: tx, ty, tw, th, to, c_1..c_K, as in yolo_loss.h) with s = logistic:
//   x = (i + s(tx)) / W, y = (j + s(ty)) / H, w = exp(tw) * anchor_w / net_w, h = exp(th) * anchor_h / net_h
//   (normalised to the NETWORK input), objectness = s(to), and for every class c with
//   score = s(to) * s(t_c) > threshold one Detection (so one box may appear under several classes,
//   as darknet's evaluation counts them).
// Order: detections are sorted by (image, class, score descending, then position index
// = ((b*H + j)*W + i)*A + a) so results are the same bits on every backend and run.
// NMS (greedy, per image and class): walk each (image, class) group by descending score; a box
// is removed when its IoU with a kept box of the group exceeds iou_threshold (0.45 default).
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/tensor.h"
#include "kernels/yolo_loss.h"

namespace yolo {

struct Detection {
  float x = 0, y = 0, w = 0, h = 0;  // centre and size, normalised to the network input
  float objectness = 0;
  float score = 0;                   // objectness * class probability
  int class_id = 0;
  int image = 0;                     // index in the batch
  int index = 0;                     // position index (see above), the tie-breaker
};

// IoU of two centre/size boxes (0 when either is empty).
YOLO_HOST_DEVICE inline float box_iou(const Detection& a, const Detection& b) {
  float ax0 = a.x - a.w / 2, ax1 = a.x + a.w / 2, ay0 = a.y - a.h / 2, ay1 = a.y + a.h / 2;
  float bx0 = b.x - b.w / 2, bx1 = b.x + b.w / 2, by0 = b.y - b.h / 2, by1 = b.y + b.h / 2;
  float iw = (ax1 < bx1 ? ax1 : bx1) - (ax0 > bx0 ? ax0 : bx0);
  float ih = (ay1 < by1 ? ay1 : by1) - (ay0 > by0 ? ay0 : by0);
  if (iw <= 0 || ih <= 0) return 0;
  float inter = iw * ih, uni = a.w * a.h + b.w * b.h - inter;
  return uni > 0 ? inter / uni : 0;
}

// Decodes one [yolo] layer's outputs, appending to `out` in the order above (sorted).
void yolo_decode_reference(ConstAct input, const YoloLossConfig& config, float threshold, std::vector<Detection>& out);
void yolo_decode_cpu(ConstAct input, const YoloLossConfig& config, float threshold, std::vector<Detection>& out);
// Writes at most `capacity` detections to `out` (device) and their number to *count (device;
// the number found, which may exceed capacity: then only `capacity` are written, the ones a
// larger buffer would have had first in the order above). Workspace: yolo_decode_workspace_bytes.
size_t yolo_decode_workspace_bytes(int n, int h, int w, const YoloLossConfig& config);
void yolo_decode_cuda(ConstAct input, const YoloLossConfig& config, float threshold, Detection* out, int capacity,
                      int* count, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Greedy per-(image, class) NMS over detections sorted as above: keep[i] = 1 for survivors.
void nms_reference(const Detection* detections, int count, float iou_threshold, int* keep);
void nms_cpu(const Detection* detections, int count, float iou_threshold, int* keep);
void nms_cuda(const Detection* detections, int count, float iou_threshold, int* keep, cudaStream_t stream);

}  // namespace yolo
