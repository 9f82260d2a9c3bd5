// The data-parallel scaling model (issue 7): from a per-layer backward profile, the loader's
// throughput and a link model, predicts step time, exposed communication and efficiency on
// 1..N GPUs, with and without overlapping the gradient all-reduce with backward.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/json.h"
#include "graph/graph.h"

namespace yolo::graph {

// An interconnect as NCCL's all-reduce sees it. bus_bandwidth_GBs is nccl-tests' "busbw"
// (algorithm bandwidth x 2(n-1)/n), the figure that stays flat as ranks are added.
struct Link {
  std::string name;
  double latency_us = 0;         // per ring step
  double bus_bandwidth_GBs = 0;  // 1 GB = 1e9 bytes
};
// "pcie3" (T4 class, 10 us, 10 GB/s) or "nvlink4" (H100/H200, 5 us, 370 GB/s); else throws.
Link link_preset(const std::string& name);

// Ring all-reduce of `bytes` over `ranks`, in ms: 2(n-1)/n x bytes / bandwidth plus 2(n-1)
// steps of latency; 0 for one rank.
double ring_allreduce_ms(double bytes, int ranks, const Link& link);

// What the FLOP-derived profile assumes of a GPU.
struct DevicePreset {
  std::string name;
  double peak_tflops = 0;    // FP32
  double memory_GBs = 0;     // the optimizer's pass over the parameters; 16-bit layers' floor
  double tensor_tflops = 0;  // 16-bit (fp16/bf16) on tensor cores; 0: none
};
// "t4" (8.1 TFLOP/s FP32, 65 fp16 on tensor cores, 320 GB/s: datasheet, no T4 was measured) or
// "h200" (60.6 TFLOP/s FP32, 4260 GB/s, 790 bf16: cuBLAS's, all measured, docs/perf.md); else
// throws.
DevicePreset device_preset(const std::string& name);

// The arithmetic a FLOP-derived profile assumes.
enum class ProfileMath {
  Fp32,      // a layer's time: its FLOPs at the FP32 rate x efficiency
  Tensor16,  // fp16/bf16 on tensor cores: the larger of its FLOPs at the tensor rate x efficiency
             // and its bytes (16-bit activations and weights) at the memory bandwidth
};

// One layer's backward, in the order backward runs.
struct LayerCost {
  std::string name;        // "12 conv"
  double backward_ms = 0;
  int64_t grad_bytes = 0;  // 4 x trainable parameters (0 for layers without)
};

// One GPU's training step at `batch` images.
struct Profile {
  std::string source;  // where the times come from, for the output
  int batch = 1;       // images per GPU per step
  double forward_ms = 0, optimizer_ms = 0;
  std::vector<LayerCost> backward;  // backward order
  double backward_ms() const;
  int64_t gradient_bytes() const;
};

// The optimizer's pass: SGD with momentum reads weight, gradient and momentum and writes
// weight and momentum (20 bytes per parameter) at the device's memory bandwidth.
double optimizer_ms_estimate(int64_t trainable, const DevicePreset& device);

// Forward ms of a layer = flops x batch / (efficiency x peak); backward = 2 x forward.
// Tensor16: forward ms = max(flops x batch / (efficiency x tensor peak), bytes / bandwidth) with
// bytes = 2 x (batch x (input + output elements) + weights), backward = 2 x forward.
// Throws for efficiency outside (0, 1], batch < 1, or Tensor16 on a device without tensor cores.
Profile profile_from_flops(const Graph& graph, int batch, const DevicePreset& device, double efficiency,
                           ProfileMath math = ProfileMath::Fp32);

// The same step with its forward and backward times multiplied by `factor` (> 0): a step that
// kernels made faster (0.5: twice as fast). The optimizer and the gradient bytes stay.
Profile scale_compute(Profile profile, double factor);

// From a Chrome trace of one step as `train_yolo --trace` writes it (complete events "ph":"X",
// "cat" "forward"/"backward", "name" "<layer> <type>", "dur" in us) of `graph` at `batch`.
// Backward order is the order of the events' "ts". Errors name `file` and the event's line: a
// layer index outside the graph or of another type (a trace of another cfg), a repeated event,
// a missing or negative duration, a layer with parameters and no backward event.
Profile profile_from_trace(const data::JsonValue& trace, const std::string& file, const Graph& graph, int batch,
                           double optimizer_ms);
Profile read_trace_profile(const std::string& path, const Graph& graph, int batch, double optimizer_ms);

// A group of consecutive gradient layers all-reduced together.
struct Bucket {
  int64_t bytes = 0;
  double ready_ms = 0;  // from the start of backward: its last layer's backward has finished
  int layers = 0;
};
// The bucket rule, shared by the trainer and this model: consecutive layers (their gradient
// bytes in backward order, all > 0) grouped into buckets of at most bucket_mb MiB (2^20 bytes,
// as PyTorch's bucket_cap_mb); a layer larger than that is a bucket alone; 0 = one layer each.
// Returns each bucket's [first, last + 1) layer index. Throws for a negative or non-finite size.
std::vector<std::pair<size_t, size_t>> group_layers(const std::vector<int64_t>& layer_bytes, double bucket_mb);

// The trainer's default bucket size: 4 MiB, or a quarter of all gradients when that is smaller
// (a model whose gradients fit one bucket could not overlap anything).
double default_bucket_mb(int64_t gradient_bytes);

// Cuts the profile's gradients into buckets by group_layers. Layers without gradients join no
// bucket (their time still delays the next ones).
std::vector<Bucket> cut_buckets(const Profile& profile, double bucket_mb);

enum class Binding { Compute, Communication, Loader };
const char* binding_name(Binding binding);  // "compute", "communication", "loader"

// Communication binds when the GPUs wait for the network for at least this part of the step.
constexpr double kCommunicationBindsFraction = 0.1;

struct ScalingSetup {
  Link link;
  double loader_images_per_s = 0;  // the whole machine's loader; 0 = unlimited
};

struct Prediction {
  int gpus = 1;
  double bucket_mb = 0;
  bool overlap = true;
  int buckets = 0;
  double compute_ms = 0;       // forward + backward + optimizer
  double allreduce_ms = 0;     // sum of the buckets' all-reduces (the comm stream's busy time)
  double exposed_comm_ms = 0;  // what communication adds to the GPUs' step
  double loader_ms = 0;        // the loader's time for gpus x batch images
  double step_ms = 0;          // max(GPU step, loader time)
  double images_per_s = 0;
  double efficiency = 1;       // step(1 GPU) / step(gpus): per-GPU throughput relative to one GPU
  Binding binding = Binding::Compute;
};

// All-reduces run one at a time in bucket order, each from max(its bucket ready, the previous
// one's end). With overlap: step = forward + max(backward end, last all-reduce end) + optimizer;
// without: forward + backward + all all-reduces + optimizer. The step is loader-bound when the
// loader needs longer than that for gpus x batch images.
Prediction predict_step(const Profile& profile, const ScalingSetup& setup, int gpus, double bucket_mb, bool overlap);

// Overlapped steps within this part of the shortest count as equal when choosing a bucket size:
// the model cannot resolve smaller differences (it leaves out NCCL's per-call launch cost).
constexpr double kBucketTieFraction = 0.001;

// The bucket size from `candidates` for the shortest overlapped step; among those within
// kBucketTieFraction of it, the one with the fewest buckets (each all-reduce call has fixed
// costs), the first listed on ties.
double best_bucket_mb(const Profile& profile, const ScalingSetup& setup, int gpus,
                      const std::vector<double>& candidates);

}  // namespace yolo::graph
