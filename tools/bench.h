// The kernel benchmark's shared pieces: measured ceilings, a timer, and a registry that each
// op family's tools/bench_NAME.cu adds its entries to (BENCH_ENTRY). tools/bench_kernels.cpp
// runs them all and prints one table with achieved GB/s and TFLOP/s next to the ceilings.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "runtime/device.h"

namespace yolo::bench {

struct Ceilings {
  double copy_gbs = 0;      // bytes read + written per second, large copy
  double fp32_tflops = 0;   // FMA-bound FP32 rate
  // mma.sync throughput (FP32 accumulators; 2*M*N*K flops per MMA): TF32 m16n8k8, BF16 and FP16
  // m16n8k16 (on sm_75 FP16 issues two m16n8k8). 0 where not measured; mma_note says why.
  double tf32_mma_tflops = 0, bf16_mma_tflops = 0, fp16_mma_tflops = 0;
  std::string mma_note;     // empty when all three were measured
  std::string where;        // "gpu:0 NVIDIA H200" or "cpu (2 threads)"

  // The ceiling a Result names ("fp32", "tf32", "bf16", "fp16"); 0 when unknown or not measured.
  double tflops(const std::string& name) const {
    if (name == "fp32") return fp32_tflops;
    if (name == "tf32") return tf32_mma_tflops;
    if (name == "bf16") return bf16_mma_tflops;
    if (name == "fp16") return fp16_mma_tflops;
    return 0;
  }
};
Ceilings measure_ceilings(Device device);

struct Context {
  Device device;            // gpu:0 when there is a GPU (CUDA kernels), else cpu (fast CPU ops)
  cudaStream_t stream = nullptr;
  int batch = 16;           // YOLOv3-416 training batch on a GPU; smaller on the CPU (stated)
  int repeats = 10;
  std::string filter;       // run only entries whose name contains this
  bool tune = false;        // --tune: the tensor-core entries time every candidate plan instead (bench_tc_tune.cu)
  std::string plans;        // --plans DEVICE: the tensor-core entry prints the planner's choices instead (bench_tc.cu)
  bool normalized = false;  // --normalized: conv_tc adds its "+bn" rows (bench_tc.cu)
};

struct Result {
  std::string op;           // e.g. "conv fwd"
  std::string shape;        // e.g. "52x52 128->256 3x3 s1"
  double ms = 0;            // median
  double bytes = 0;         // minimum bytes moved through memory (each input read, output written once)
  double flops = 0;         // 0 for memory-bound ops
  std::string ceiling = "fp32";  // the TFLOP/s ceiling the % column compares with (Ceilings::tflops)
  double cublas_ms = 0;     // median of the cuBLAS yardstick at the equivalent GEMM (0: none, "-")
  std::string plan{};       // tensor-core rows: the planner's choice (tc::plan_code) ...
  double predicted_ms = 0;  // ... and its predicted time (kernels/tc_plan.h), printed beside the measured
};

// Median milliseconds of `run` (after one warm-up): CUDA events on a GPU, a steady clock on
// the CPU.
double time_ms(const Context& context, const std::function<void()>& run);

using Entry = std::function<void(const Context&, std::vector<Result>&)>;
int register_entry(const char* family, Entry entry);
const std::vector<std::pair<std::string, Entry>>& entries();

}  // namespace yolo::bench

namespace yolo::bench {

// YOLOv3's nine anchors (network pixels) and its three heads at 416: grid size and mask.
struct YoloHead {
  int grid;
  std::vector<int> mask;
};
inline const std::vector<float>& yolov3_anchors() {
  static const std::vector<float> anchors = {10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326};
  return anchors;
}
inline const std::vector<YoloHead>& yolov3_heads_416() {
  static const std::vector<YoloHead> heads = {{13, {6, 7, 8}}, {26, {3, 4, 5}}, {52, {0, 1, 2}}};
  return heads;
}

}  // namespace yolo::bench

#define BENCH_CONCAT_(a, b) a##b
#define BENCH_CONCAT(a, b) BENCH_CONCAT_(a, b)
// At namespace scope in tools/bench_NAME.cu: BENCH_ENTRY("conv", [](const Context& c, std::vector<Result>& out) {...});
#define BENCH_ENTRY(family, ...) \
  static const int BENCH_CONCAT(bench_entry_, __LINE__) = ::yolo::bench::register_entry(family, __VA_ARGS__)
