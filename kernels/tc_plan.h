// The tensor-core planner (kernels/conv_tc.cu, kernels/gemm_tc.cu): which block tile, how many
// split-K slices and which pipeline a pass runs with, as a pure function of the problem and a
// description of the GPU, never of timings (runs stay deterministic, and split-K stays a
// fixed-order second pass). Its choice minimises a predicted time built from what can be known
// without running: the blocks each kernel gets per SM (its __launch_bounds__, shared memory and
// the SM's limits), waves, the bytes each choice moves (FP32 split-K partials included) and the
// measured mma.sync ceilings. predict() returns that time with its parts, so the prediction can
// be printed beside what a GPU measures (bench_kernels --plans, tools/gpu_check.sh tune).
// Host code only; the kernels include it for their launch bounds and shared-memory sizes.
#pragma once
#include <string>

#include "kernels/precision.h"
#include "kernels/tc_layout.h"

namespace yolo::tc {

// What the planner knows of a GPU. The presets' rates are the H200's as measured
// (../shared/gpu-results/2026-12-04-h200) and datasheet-based predictions for the others.
struct GpuDesc {
  std::string name;
  int cc = 90;                  // compute capability, 10 * major + minor
  int sms = 132;
  int threads_per_sm = 2048;
  int smem_per_sm = 228 * 1024;  // shared memory an SM shares among its blocks
  int smem_per_block = 227 * 1024;
  double dram_gbs = 4196;        // device copy bandwidth, GB/s
  double l2_gbs = 9000;          // L2 bandwidth (operand re-reads, small partials)
  double l2_bytes = 50e6;
  double mma_tflops_16 = 644;    // mma.sync ceilings: BF16/FP16 and TF32, FP32 accumulation
  double mma_tflops_tf32 = 319;
  // Hopper's wgmma (kernels/wgmma_tiles.cuh): whether the device runs the build's sm_90a code, and
  // the rates it can reach: BF16/FP16 cuBLAS's best on the H200, 790 TFLOP/s (80% of the dense
  // peak); TF32 the same share of its dense peak (494), not measured.
  bool wgmma = false;
  double wgmma_tflops_16 = 790;
  double wgmma_tflops_tf32 = 395;
  // The (precision, pass) pairs whose wgmma kernels passed the device's self-check
  // (kernels/wgmma_check.h), a bit each (wgmma_pass_bit): a failed pair stays on mma.sync alone.
  // Every pair where no check runs (the presets, emulated devices).
  unsigned wgmma_passes = ~0u;
  bool rates_measured = true;    // false: the rates are predictions for this GPU
};
GpuDesc gpu_t4();
GpuDesc gpu_a100();
GpuDesc gpu_l4();
GpuDesc gpu_h200();
GpuDesc gpu_b200();
GpuDesc gpu_rtx5090();
// The preset of an architecture family: 7.5 the T4, 8.0 the A100, 8.6-8.9 the L4, 9.0 the H200,
// 10.x-11.x the B200, 12.0 on the RTX 5090. A GPU's own SM count, threads and shared memory
// replace the preset's (current_gpu); its rates scale with the SMs.
GpuDesc gpu_preset(int compute_capability);
// The current device (CUDA, or the emulated one): its compute capability, SM count, shared
// memory and threads per SM, whether it runs the build's sm_90a code (wgmma) and which passes
// passed its wgmma self-check there (wgmma_passes: the check runs at the first question, on a
// GPU); the rates of its family's preset. Without a current emulated device, the emulation's small
// default (4 SMs of sm_90), so small tests still use many blocks. The environment variable
// YOLO_WGMMA=off (or 0) keeps the convolutions on mma.sync (wgmma false, and no check runs); on,
// 1, auto or unset leave the choice to the planner; anything else throws yolo::Error naming it.
GpuDesc current_gpu();
bool wgmma_allowed_by_environment();
// An on/off environment variable as YOLO_WGMMA is read: unset, empty, on, 1 or auto: true; off
// or 0: false; anything else throws yolo::Error naming the variable, the value and `off_effect`
// (what off does, e.g. "to keep the convolutions on mma.sync").
bool switch_from_environment(const char* variable, const char* off_effect);

// The kernel families; each has its own loaders, so its own registers and launch bounds.
enum class TcPass { Forward, BackwardData, BackwardWeights, Gemm };
const char* pass_name(TcPass pass);
// GpuDesc::wgmma_passes's bit for `pass` in `precision`.
constexpr unsigned wgmma_pass_bit(Precision precision, TcPass pass) {
  return 1u << (4 * int(precision) + int(pass));
}

// One tensor-core pass as the planner sees it: `groups` independent m x n x k products
// (backward data's stride parity classes), elements of `elem` bytes (4: TF32, 2: BF16/FP16),
// operands K-major or MN-major in shared memory, `vec`: both operands come in 16-byte chunks
// (the cp.async pipeline is possible), at most `max_splits` split-K slices. `wgmma_shape`: the
// wgmma kernels take this shape (kernels/conv_wgmma.h lists what each pass needs).
struct TcProblem {
  TcPass pass = TcPass::Gemm;
  long long m = 0, n = 0, k = 0;
  int groups = 1;
  int max_splits = 64;
  bool vec = true;
  int elem = 2;
  bool a_kmajor = true, b_kmajor = true;
  bool wgmma_shape = false;
  long long weight_elements = 0;  // the convolution's weights (the TF32 backward data transposes them)
  Precision precision = Precision::Bf16;  // the operands' type (elem: its bytes)
};

struct TcPlan {
  int tile = 0;        // 0: 128x128, 1: 64x64
  int splits = 1;      // K chunks (1: no second pass)
  bool async = false;  // the cp.async pipeline (sm_80+, vector loaders)
  // Hopper's wgmma kernels instead of mma.sync (kernels/conv_wgmma.h): always 128x128 tiles; no
  // split-K, except the weight gradient's pixel split (splits: wgmma_weight_splits).
  bool wgmma = false;
  int bm() const { return tile == 0 ? 128 : 64; }
  int bn() const { return tile == 0 ? 128 : 64; }
  int stages() const { return async ? 3 : 2; }
};

// ---- what the kernels are built with (shared-memory layouts: kernels/tc_layout.h) -------------

// The architecture whose machine code a GPU of compute capability `cc` runs (the build's targets:
// 75, 80, 90; an sm_86 or sm_89 runs the sm_80 code, and 10.0 and newer its PTX:
// runtime/gpu_code.h).
constexpr int tc_code_arch(int cc) { return cc == 90 ? 90 : cc >= 80 ? 80 : 75; }

// The blocks per SM each kernel is compiled for (its __launch_bounds__ minimum, so ptxas keeps
// its registers within 65536 / (blocks * 256): every GPU here has 64K registers per SM), which
// the planner takes as the register limit. tools/occupancy_check.sh holds them against the
// registers ptxas gave each kernel, per architecture: exactly these many blocks fit, and no local
// memory (spills). Two 128x128 blocks fit with cp.async (the K-major loaders share one cursor
// among a thread's chunks; backward data spilled at 128 registers before), except sm_80's TF32
// main loop; the register-staged pipeline holds a stage in registers too: one block.
constexpr int tc_min_blocks(TcPass pass, int bm, bool async, int elem, int code_arch) {
  if (bm == 128) return async && !(elem == 4 && code_arch == 80) ? 2 : 1;
  switch (pass) {
    case TcPass::Forward: return async ? 4 : 3;
    case TcPass::BackwardData: return async ? 3 : 2;
    case TcPass::BackwardWeights: return async ? 4 : 3;
    case TcPass::Gemm: return async ? 4 : 3;
  }
  return 1;
}

// ---- the plan and its prediction ------------------------------------------------------------------

// The wgmma kernels' block (kernels/wgmma_tiles.cuh: 128x128 tiles of 64 k in 16 bits, 32 in
// TF32 (a 128-byte row either way), 4 stages, 384 threads; one block per SM), for the planner.
// wgmma_tiles.cuh checks its own against these.
constexpr int kWgmmaTile = 128, kWgmmaBk = 64, kWgmmaThreads = 384;
constexpr int wgmma_bk(int elem) { return 128 / elem; }
constexpr int kWgmmaSharedBytes = 1024 + 4 * 2 * kWgmmaTile * kWgmmaBk * 2 + 3 * 4 * 8 + 2080;
// The pixel split of the wgmma weight gradient over `tiles` output tiles and `k_tiles` 64-pixel
// steps: enough blocks for two waves of `sms` SMs, at least one step each, no empty split.
int wgmma_weight_splits(long long tiles, long long k_tiles, int sms);

// Blocks of `plan`'s kernel resident per SM: the launch bounds, the shared memory (with the 1 KiB
// each block costs the system) and the threads, whichever binds first.
int blocks_per_sm(const TcProblem& problem, const TcPlan& plan, const GpuDesc& gpu);

// The predicted time of `plan` and what it is made of.
struct TcPrediction {
  int blocks_per_sm = 0;
  long long blocks = 0;       // of the main kernel
  double waves = 0;           // blocks / (SMs * blocks_per_sm)
  double efficiency = 0;      // of the mma.sync ceiling the main loop reaches at this occupancy
  double mma_us = 0;          // the busiest SM's share of the MMAs at that efficiency
  double operand_us = 0;      // operand bytes from L2 (each block reads its rows and columns)
  double output_us = 0;       // the output (or the FP32 partials) written
  double split_pass_us = 0;   // the second pass over the partials (0 without splits)
  double launch_us = 0;
  double partial_bytes = 0;   // FP32 partials written and read back
  double total_us = 0;
};
TcPrediction predict(const TcProblem& problem, const TcPlan& plan, const GpuDesc& gpu);

// The plan with the least predicted time (near ties: the bigger tile, then fewer splits). Split-K
// only where the tiles alone fill less than one wave, and every slice gets 8 stages or more.
// Honours set_tc_tiling_for_tests (kernels/gemm.h).
TcPlan choose_plan(const TcProblem& problem, const GpuDesc& gpu);

// "128x128 cp.async, 3 splits: 2 blocks/SM, 2.56 waves, 104 us (mma 90, operands 40, ...)".
std::string describe(const TcPlan& plan, const TcPrediction& prediction);
// The plan in a few characters: "128a1" (128x128, cp.async, 1 split), "64r3" (64x64,
// register-staged, 3 splits), "128w1" (wgmma; the weight gradient's pixel splits after the w).
std::string plan_code(const TcPlan& plan);

}  // namespace yolo::tc
