// The tensor-core planner (tc_plan.h): device descriptions, occupancy, the time model and the
// choice among tiles, split counts and pipelines.
#include "kernels/tc_plan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "kernels/gemm.h"
#include "kernels/hopper.h"
#include "kernels/wgmma_check.h"
#include "runtime/check.h"

#if YOLO_CUDA
#include <cuda_runtime_api.h>
#else
#include "runtime/emu/device.h"
#endif

namespace yolo {

namespace {
std::atomic<int> g_tc_tile{-1}, g_tc_splits{0}, g_tc_pipeline{0};
}  // namespace

void set_tc_tiling_for_tests(int tile, int splits, int pipeline) {
  if (tile < -1 || tile > 1) throw Error("set_tc_tiling_for_tests: tile must be -1..1, got " + std::to_string(tile));
  if (splits < 0) throw Error("set_tc_tiling_for_tests: negative split count");
  if (pipeline < 0 || pipeline > 3) throw Error("set_tc_tiling_for_tests: pipeline must be 0..3");
  g_tc_tile = tile, g_tc_splits = splits, g_tc_pipeline = pipeline;
}

namespace tc {

// ---- devices -------------------------------------------------------------------------------------

GpuDesc gpu_t4() {
  GpuDesc g;
  g.name = "T4", g.cc = 75, g.sms = 40, g.threads_per_sm = 1024;
  g.smem_per_sm = 64 * 1024, g.smem_per_block = 64 * 1024;
  // 320 GB/s on paper; FP16 tensor cores 65 TFLOP/s on paper, held back by the 70 W limit.
  g.dram_gbs = 240, g.l2_gbs = 1200, g.l2_bytes = 4e6;
  g.mma_tflops_16 = 45, g.mma_tflops_tf32 = 0;
  g.rates_measured = false;
  return g;
}

GpuDesc gpu_a100() {
  GpuDesc g;
  g.name = "A100", g.cc = 80, g.sms = 108, g.threads_per_sm = 2048;
  g.smem_per_sm = 164 * 1024, g.smem_per_block = 163 * 1024;
  // 1555 GB/s and 312 / 156 TFLOP/s on paper (BF16 / TF32); mma.sync reaches about 90% of them.
  g.dram_gbs = 1400, g.l2_gbs = 4500, g.l2_bytes = 40e6;
  g.mma_tflops_16 = 280, g.mma_tflops_tf32 = 140;
  g.rates_measured = false;
  return g;
}

GpuDesc gpu_l4() {
  GpuDesc g;  // the 8.6 / 8.9 SM (A10, L4, RTX 30 and 40): 1536 threads and 100 KB of shared memory an SM
  g.name = "L4", g.cc = 89, g.sms = 58, g.threads_per_sm = 1536;
  g.smem_per_sm = 100 * 1024, g.smem_per_block = 99 * 1024;
  // 300 GB/s and 121 / 60 TFLOP/s dense on paper (FP16 / TF32); mma.sync assumed at 85% of them.
  g.dram_gbs = 250, g.l2_gbs = 2500, g.l2_bytes = 48e6;
  g.mma_tflops_16 = 103, g.mma_tflops_tf32 = 51;
  g.rates_measured = false;
  return g;
}

GpuDesc gpu_b200() {
  GpuDesc g;  // Blackwell's data-centre SM, running the build's compute_80 PTX (no wgmma: sm_90a only)
  g.name = "B200", g.cc = 100, g.sms = 148;
  g.dram_gbs = 6800, g.l2_gbs = 10000, g.l2_bytes = 126e6;  // 8 TB/s on paper
  // mma.sync's rate on Blackwell is not published: the H200's measured rate an SM, assumed.
  g.mma_tflops_16 = 644.0 * 148 / 132, g.mma_tflops_tf32 = 319.0 * 148 / 132;
  g.rates_measured = false;
  return g;
}

GpuDesc gpu_rtx5090() {
  GpuDesc g;  // Blackwell's consumer SM (12.0): the 8.9 SM's limits, through the compute_80 PTX
  g.name = "RTX 5090", g.cc = 120, g.sms = 170, g.threads_per_sm = 1536;
  g.smem_per_sm = 100 * 1024, g.smem_per_block = 99 * 1024;
  // 1.8 TB/s and about 210 TFLOP/s FP16 with FP32 accumulation dense on paper; 85% of it assumed.
  g.dram_gbs = 1500, g.l2_gbs = 5000, g.l2_bytes = 96e6;
  g.mma_tflops_16 = 178, g.mma_tflops_tf32 = 89;
  g.rates_measured = false;
  return g;
}

GpuDesc gpu_h200() {
  GpuDesc g;  // the defaults: measured on an H200 (copy, mma.sync ceilings); L2 bandwidth estimated
  g.name = "H200";
  g.wgmma = true;  // as `make` builds it (ARCH 90 emits sm_90a code)
  return g;
}

GpuDesc gpu_preset(int compute_capability) {
  if (compute_capability < 80) return gpu_t4();
  if (compute_capability < 86) return gpu_a100();
  if (compute_capability < 90) return gpu_l4();
  if (compute_capability < 100) return gpu_h200();
  if (compute_capability < 120) return gpu_b200();
  return gpu_rtx5090();
}

namespace {

// The family preset, resized to a device of `sms` SMs (rates scale with the SMs; DRAM does not).
GpuDesc resized_preset(int cc, int sms) {
  GpuDesc g = gpu_preset(cc);
  const double scale = double(sms) / g.sms;
  g.cc = cc, g.sms = sms;
  g.mma_tflops_16 *= scale, g.mma_tflops_tf32 *= scale, g.wgmma_tflops_16 *= scale, g.wgmma_tflops_tf32 *= scale;
  g.l2_gbs *= scale;
  return g;
}

#if YOLO_CUDA
GpuDesc describe_cuda_device(int device) {
  cudaDeviceProp p{};
  CHECKED(cudaGetDeviceProperties(&p, device));
  GpuDesc g = resized_preset(p.major * 10 + p.minor, p.multiProcessorCount);
  g.name = p.name;
  g.threads_per_sm = p.maxThreadsPerMultiProcessor;
  g.smem_per_sm = int(p.sharedMemPerMultiprocessor);
  g.smem_per_block = int(p.sharedMemPerBlockOptin);
  g.l2_bytes = double(p.l2CacheSize);
  g.wgmma = current_device_runs_wgmma();  // this device is current: the probe runs on it
  return g;
}
#endif

}  // namespace

namespace {

// The device as described once (CUDA: cached per device), before the environment's say.
GpuDesc described_current_gpu() {
#if YOLO_CUDA
  // Asked at every tensor-core launch: described once per device (its properties never change).
  constexpr int kDevices = 64;
  static std::atomic<const GpuDesc*> described[kDevices] = {};
  int device = 0;
  CHECKED(cudaGetDevice(&device));
  if (device < 0 || device >= kDevices) return describe_cuda_device(device);
  const GpuDesc* known = described[device].load(std::memory_order_acquire);
  if (known == nullptr) {
    const GpuDesc* fresh = new GpuDesc(describe_cuda_device(device));  // lives as long as the process
    if (!described[device].compare_exchange_strong(known, fresh)) delete fresh;
    else known = fresh;
  }
  return *known;
#else
  const int index = emu::current_device_index();
  if (index < 0) {
    GpuDesc g = resized_preset(emu::current_compute_capability(), emu::current_multiprocessors());
    g.name = "emulated default (4 SMs)";
    g.wgmma = emu::current_device_runs_sm90a_code();
    return g;
  }
  const emu::DeviceProps props = emu::device_props(index);
  GpuDesc g = resized_preset(props.cc_major * 10 + props.cc_minor, props.multiprocessors);
  g.name = props.name;
  g.l2_bytes = double(props.l2_bytes);
  g.threads_per_sm = props.threads_per_sm;  // the device's limits, as a GPU's properties give them
  g.smem_per_sm = props.shared_per_sm, g.smem_per_block = props.shared_per_block;
  g.wgmma = props.sm90a_code;
  return g;
#endif
}

}  // namespace

bool switch_from_environment(const char* variable, const char* off_effect) {
  const char* env = std::getenv(variable);
  if (env == nullptr || *env == 0) return true;
  const std::string value = env;
  if (value == "1" || value == "on" || value == "auto") return true;
  if (value == "0" || value == "off") return false;
  throw Error(std::string(variable) + "=" + value + ": expected off (or 0) " + off_effect + ", or on (1, auto)");
}

bool wgmma_allowed_by_environment() {
  return switch_from_environment("YOLO_WGMMA", "to keep the convolutions on mma.sync");
}

GpuDesc current_gpu() {
  GpuDesc g = described_current_gpu();
  // On a GPU the wgmma kernels of each pass are trusted once they pass their self-check there
  // (wgmma_check.h).
  g.wgmma = g.wgmma && wgmma_allowed_by_environment();
  if (g.wgmma) g.wgmma_passes = current_device_wgmma_passes();
  return g;
}

const char* pass_name(TcPass pass) {
  switch (pass) {
    case TcPass::Forward: return "fwd";
    case TcPass::BackwardData: return "bwd data";
    case TcPass::BackwardWeights: return "bwd weights";
    case TcPass::Gemm: return "gemm";
  }
  return "?";
}

// ---- occupancy and the time model ------------------------------------------------------------------

int wgmma_weight_splits(long long tiles, long long k_tiles, int sms) {
  if (k_tiles <= 0 || tiles <= 0) return 1;
  const long long wanted = std::clamp<long long>(2LL * sms / tiles, 1, k_tiles);
  const long long per_split = (k_tiles + wanted - 1) / wanted;
  return int((k_tiles + per_split - 1) / per_split);
}

int blocks_per_sm(const TcProblem& problem, const TcPlan& plan, const GpuDesc& gpu) {
  constexpr int kSystemSharedPerBlock = 1024;
  if (plan.wgmma) {  // launch bounds (384, 1): 168 registers a thread, one block's worth of the SM's
    if (kWgmmaSharedBytes > gpu.smem_per_block) return 0;
    return std::min({1, gpu.smem_per_sm / (kWgmmaSharedBytes + kSystemSharedPerBlock),
                     gpu.threads_per_sm / kWgmmaThreads});
  }
  const int smem =
      tc_launch_smem_bytes(problem.elem, problem.a_kmajor, problem.b_kmajor, plan.bm(), plan.bn(), plan.stages());
  if (smem > gpu.smem_per_block) return 0;
  const int by_smem = gpu.smem_per_sm / (smem + kSystemSharedPerBlock);
  const int by_threads = gpu.threads_per_sm / kTcThreads;
  const int by_registers = tc_min_blocks(problem.pass, plan.bm(), plan.async, problem.elem, tc_code_arch(gpu.cc));
  return std::max(0, std::min({by_smem, by_threads, by_registers}));
}

namespace {

long long ceil_div_ll(long long a, long long b) { return (a + b - 1) / b; }

// K per split-K slice: whole stages (as the kernels cut it: tc_split_chunk in tc_tiles.cuh).
long long slice_k(long long k, int splits, int bk) { return ceil_div_ll(ceil_div_ll(k, bk), splits) * bk; }

// Fraction of the mma.sync ceiling a main loop sustains while `resident` blocks share an SM,
// fitted to the 204 tensor-core rows the H200 measured (docs/perf.md, "The planner's model"):
// 128x128 tiles 0.30, 64x64 0.145, one resident block 0.55 of that; backward data 0.85, backward
// weights 1.4 (its operands are both MN-major, whose stores had no bank conflicts). Element-by-
// element gathers (channel counts that are not whole 16-byte chunks) and the register-staged
// pipeline ran together in every measured row (0.4 together); how that divides between them is a
// prediction: 0.8 for the pipeline, 0.5 for the gathers.
double loop_efficiency(const TcProblem& problem, const TcPlan& plan, int resident) {
  // The wgmma main loop (a producer warpgroup, 4 stages, two math warpgroups; of the wgmma rate):
  // a prediction until a GPU measures it (docs/perf.md, issue 36): about 2.9x mma.sync's 128x128
  // loop, between the 2.5x and 4x predicted per layer.
  if (plan.wgmma) return 0.7;
  double e = plan.tile == 0 ? 0.30 : 0.145;
  if (resident < 2) e *= 0.55;
  if (problem.pass == TcPass::BackwardData) e *= 0.85;
  if (problem.pass == TcPass::BackwardWeights) e *= 1.4;
  if (!plan.async) e *= 0.8;
  if (!problem.vec) e *= 0.5;
  return e;
}

}  // namespace

TcPrediction predict(const TcProblem& problem, const TcPlan& plan, const GpuDesc& gpu) {
  TcPrediction p;
  const int bk = plan.wgmma ? wgmma_bk(problem.elem) : tc_bk(problem.elem);
  const long long tiles = ceil_div_ll(problem.m, plan.bm()) * ceil_div_ll(problem.n, plan.bn()) * problem.groups;
  const long long chunk = std::max<long long>(slice_k(problem.k, plan.splits, bk), bk);
  p.blocks_per_sm = blocks_per_sm(problem, plan, gpu);
  p.blocks = tiles * plan.splits;
  if (p.blocks_per_sm == 0) {
    p.total_us = std::numeric_limits<double>::infinity();  // does not fit this GPU's shared memory
    return p;
  }
  p.waves = double(p.blocks) / (double(gpu.sms) * p.blocks_per_sm);
  const long long busiest_sm = ceil_div_ll(p.blocks, gpu.sms);  // blocks go round the SMs
  const int resident = int(std::min<long long>(busiest_sm, p.blocks_per_sm));
  p.efficiency = loop_efficiency(problem, plan, resident);
  const double tflops = plan.wgmma ? (problem.elem == 4 ? gpu.wgmma_tflops_tf32 : gpu.wgmma_tflops_16)
                                   : (problem.elem == 4 ? gpu.mma_tflops_tf32 : gpu.mma_tflops_16);
  const double sm_flops_per_us = tflops * 1e6 / gpu.sms;
  const double block_flops = 2.0 * plan.bm() * plan.bn() * double(chunk);
  p.mma_us = double(busiest_sm) * block_flops / (sm_flops_per_us * p.efficiency);
  const double operand_bytes = double(p.blocks) * (plan.bm() + plan.bn()) * double(chunk) * problem.elem;
  p.operand_us = operand_bytes / (gpu.l2_gbs * 1e3);
  const double outputs = double(problem.m) * double(problem.n) * problem.groups;
  const int out_elem = problem.pass == TcPass::BackwardWeights ? 4 : problem.elem;
  constexpr double kLaunchUs = 8.0;  // a launch and its ramp (the fit above: 9.6 us a kernel)
  p.launch_us = kLaunchUs;
  // The wgmma weight gradient always writes FP32 partials and sums them in a second kernel.
  if (plan.splits > 1 || (plan.wgmma && problem.pass == TcPass::BackwardWeights)) {
    p.partial_bytes = 4.0 * plan.splits * outputs;
    // Partials that fit in L2 are written and read there; larger ones go out to DRAM and back.
    const double bw = p.partial_bytes <= gpu.l2_bytes / 2 ? gpu.l2_gbs : gpu.dram_gbs;
    p.output_us = p.partial_bytes / (bw * 1e3);
    p.split_pass_us = (p.partial_bytes + outputs * out_elem) / (bw * 1e3);
    p.launch_us += kLaunchUs;
  } else {
    p.output_us = outputs * out_elem / (gpu.dram_gbs * 1e3);
  }
  // The TF32 backward data on wgmma first writes the weights transposed (K-major), a kernel more.
  if (plan.wgmma && problem.elem == 4 && problem.pass == TcPass::BackwardData) {
    p.output_us += 2.0 * 4 * double(problem.weight_elements) / (gpu.dram_gbs * 1e3);
    p.launch_us += kLaunchUs;
  }
  p.total_us = std::max(p.mma_us, p.operand_us) + p.output_us + p.split_pass_us + p.launch_us;
  return p;
}

namespace {

constexpr double kWgmmaMinGainUs = 5.0;

// 16-bit passes; TF32 only where both operands can be K-major (the forward, and backward data
// from the weights transposed), since TF32 wgmma cannot transpose. A pass whose self-check failed
// on the device, never.
bool wgmma_possible(const TcProblem& problem, const GpuDesc& gpu) {
  const bool type_ok = problem.elem == 2 || (problem.elem == 4 && problem.pass != TcPass::BackwardWeights);
  return gpu.wgmma && problem.wgmma_shape && type_ok && problem.pass != TcPass::Gemm &&
         (gpu.wgmma_passes & wgmma_pass_bit(problem.precision, problem.pass)) != 0;
}

TcPlan wgmma_plan(const TcProblem& problem, const GpuDesc& gpu) {
  TcPlan plan;
  plan.tile = 0, plan.async = true, plan.wgmma = true;
  if (problem.pass == TcPass::BackwardWeights)
    plan.splits = wgmma_weight_splits(ceil_div_ll(problem.m, kWgmmaTile) * ceil_div_ll(problem.n, kWgmmaTile),
                                      ceil_div_ll(problem.k, wgmma_bk(problem.elem)), gpu.sms);
  return plan;
}

}  // namespace

TcPlan choose_plan(const TcProblem& problem, const GpuDesc& gpu) {
  const int bk = tc_bk(problem.elem);
  const long long min_chunk = 8LL * bk;
  const int forced_tile = g_tc_tile.load(), forced_splits = g_tc_splits.load(), pipeline = g_tc_pipeline.load();
  // Pipeline 3 forces wgmma where it can run; any other forcing describes an mma.sync plan.
  const bool wgmma_allowed = pipeline == 3 || (pipeline == 0 && forced_tile < 0 && forced_splits == 0);
  if (pipeline == 3 && wgmma_possible(problem, gpu)) return wgmma_plan(problem, gpu);
  const bool async = problem.vec && gpu.cc >= 80 && pipeline != 1;
  const int split_limit = problem.k > 0 ? std::max(1, problem.max_splits) : 1;
  TcPlan best;
  best.async = async;
  double best_us = std::numeric_limits<double>::infinity();
  bool chosen = false;
  for (int tile = 0; tile < 2; ++tile) {
    if (forced_tile >= 0 && tile != forced_tile) continue;
    TcPlan candidate;
    candidate.tile = tile, candidate.async = async;
    const long long tiles =
        ceil_div_ll(problem.m, candidate.bm()) * ceil_div_ll(problem.n, candidate.bn()) * problem.groups;
    const long long wave = (long long)gpu.sms * std::max(1, blocks_per_sm(problem, candidate, gpu));
    for (int s = 1; s <= split_limit; ++s) {
      if (forced_splits > 0 && s != std::min(forced_splits, split_limit)) continue;
      if (forced_splits == 0 && s > 1 && (slice_k(problem.k, s, bk) < min_chunk || tiles >= wave)) break;
      candidate.splits = s;
      const double us = predict(problem, candidate, gpu).total_us;
      if (!chosen || us < best_us * 0.98) {
        best_us = us, best = candidate, chosen = true;
      }
    }
  }
  // wgmma where it is predicted to save 2% and kWgmmaMinGainUs: a change of kernel family for
  // less than a launch's jitter is within the model's error (its wgmma rate is not measured yet).
  if (wgmma_allowed && wgmma_possible(problem, gpu)) {
    const TcPlan candidate = wgmma_plan(problem, gpu);
    const double us = predict(problem, candidate, gpu).total_us;
    if (us < best_us * 0.98 && best_us - us >= kWgmmaMinGainUs) best = candidate;
  }
  return best;
}

std::string describe(const TcPlan& plan, const TcPrediction& p) {
  char text[256];
  std::snprintf(text, sizeof text,
                "%dx%d %s, %d split%s: %d blocks/SM, %.2f waves, %.0f us (mma %.0f at %.0f%%, operands %.0f, "
                "out %.0f, split pass %.0f)",
                plan.bm(), plan.bn(), plan.wgmma ? "wgmma" : plan.async ? "cp.async" : "registers", plan.splits,
                plan.splits == 1 ? "" : "s",
                p.blocks_per_sm, p.waves, p.total_us, p.mma_us, 100 * p.efficiency, p.operand_us, p.output_us,
                p.split_pass_us);
  return text;
}

std::string plan_code(const TcPlan& plan) {
  return std::to_string(plan.bm()) + (plan.wgmma ? "w" : plan.async ? "a" : "r") + std::to_string(plan.splits);
}

}  // namespace tc
}  // namespace yolo
