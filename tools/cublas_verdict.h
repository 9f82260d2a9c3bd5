// Issue 36's convolution targets, judged from bench_kernels' conv_tc rows of one precision
// (bf16 on an H100/H200): every YOLOv3-416 conv row within 1.25x of cuBLAS's time at the same
// GEMM, the median row within 1.1x, the sum of our times within 1.15x of the sum of cuBLAS's.
// The rows judged are the three passes at every shape of tools/yolov3_convs.h except the heads
// with COCO's 255 filters (the trainer builds 24) and the first layer's backward data (its
// 3-channel gradient, which the trainer never computes). A missing row, or one without a cuBLAS
// time, makes the verdict "incomplete", never "met". Header-only so that the test links it
// without the benchmark (tests/test_tool_cublas_verdict.cpp).
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/yolov3_convs.h"

namespace yolo::bench {

struct TimedRow {
  std::string op;     // "conv fwd bf16", "conv bwd data bf16", "conv bwd weights bf16"
  std::string shape;  // a tools/yolov3_convs.h label
  double ms = 0;
  double cublas_ms = 0;  // 0: no cuBLAS time
};

struct CublasTargets {
  double worst = 1.25, median = 1.10, sum = 1.15;
};

struct CublasVerdict {
  int expected = 0, judged = 0;   // rows the targets name; those found with both times
  double worst = 0, median = 0, sum = 0;
  std::string worst_row;          // "op shape" of the worst ratio
  bool complete = false, met = false;
  std::string line;               // one summary line
};

// The passes' op names in precision p ("bf16") and whether a shape's row counts.
inline std::vector<std::string> verdict_ops(const std::string& precision) {
  return {"conv fwd " + precision, "conv bwd data " + precision, "conv bwd weights " + precision};
}
inline bool verdict_counts(const std::string& op, const YoloConv& layer) {
  if (layer.c_out == 255) return false;
  return !(layer.c_in == 3 && op.rfind("conv bwd data ", 0) == 0);
}

inline CublasVerdict judge_against_cublas(const std::vector<TimedRow>& rows, const std::string& precision,
                                          const CublasTargets& targets = {}) {
  CublasVerdict v;
  std::vector<double> ratios;
  double ours = 0, theirs = 0;
  for (const std::string& op : verdict_ops(precision))
    for (const YoloConv& layer : kYoloConvs) {
      if (!verdict_counts(op, layer)) continue;
      ++v.expected;
      const auto found = std::find_if(rows.begin(), rows.end(), [&](const TimedRow& r) {
        return r.op == op && r.shape == layer.label && r.ms > 0 && r.cublas_ms > 0;
      });
      if (found == rows.end()) continue;
      ++v.judged;
      const double ratio = found->ms / found->cublas_ms;
      if (ratio > v.worst) v.worst = ratio, v.worst_row = op + " " + layer.label;
      ratios.push_back(ratio);
      ours += found->ms, theirs += found->cublas_ms;
    }
  v.complete = v.judged == v.expected;
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    const size_t n = ratios.size();
    v.median = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
    v.sum = ours / theirs;
  }
  v.met = v.complete && v.worst <= targets.worst && v.median <= targets.median && v.sum <= targets.sum;
  char text[512];
  if (ratios.empty()) {
    std::snprintf(text, sizeof text, "conv_tc %s against cuBLAS: incomplete, none of the %d rows has both times",
                  precision.c_str(), v.expected);
  } else {
    auto mark = [](bool ok) { return ok ? "ok" : "missed"; };
    std::snprintf(text, sizeof text,
                  "conv_tc %s against cuBLAS: %d of %d rows; worst %.2f (%s; target <= %.2f, %s); median %.2f "
                  "(target <= %.2f, %s); sum %.2f (target <= %.2f, %s): %s",
                  precision.c_str(), v.judged, v.expected, v.worst, v.worst_row.c_str(), targets.worst,
                  mark(v.worst <= targets.worst), v.median, targets.median, mark(v.median <= targets.median), v.sum,
                  targets.sum, mark(v.sum <= targets.sum),
                  v.met ? "targets met" : v.complete ? "targets not met" : "incomplete (rows missing)");
  }
  v.line = text;
  return v;
}

}  // namespace yolo::bench
