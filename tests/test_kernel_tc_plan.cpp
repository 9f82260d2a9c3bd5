// The tensor-core planner (kernels/tc_plan.h) without a GPU: blocks per SM from each kernel's
// launch bounds, shared memory and threads on the T4, A100 and H200 descriptions; the predicted
// time's parts; no split-K where the tiles alone fill a wave; forced tiles, splits and pipelines
// honoured; a pure function of (problem, device description); and the choices for every
// YOLOv3-416 conv pass at batch 16 pinned per device (tools/yolov3_convs.h).
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "kernels/tc_plan.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "tests/tc_tiling.h"
#include "tools/yolov3_convs.h"

#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#include "tests/emu_fixtures.h"
#endif

using namespace yolo;
using namespace yolo::tc;

using yolo::testing::TcTiling;

namespace {

Conv2dShape shape_of(const bench::YoloConv& layer, int batch) {
  Conv2dShape s;
  s.n = batch, s.h = layer.h, s.w = layer.w, s.c_in = layer.c_in, s.c_out = layer.c_out, s.k = layer.k;
  s.stride = layer.stride;
  return s;
}

constexpr TcPass kConvPasses[] = {TcPass::Forward, TcPass::BackwardData, TcPass::BackwardWeights};

// The precision a device trains YOLOv3 in by default (--precision auto).
Precision auto_precision(const GpuDesc& gpu) { return gpu.cc < 80 ? Precision::Fp16 : Precision::Bf16; }

// Each layer's plans, "fwd bwd-data bwd-weights", at batch 16 in the device's auto precision.
using Pinned = std::map<std::string, std::string>;
// "small": the forward or weight gradient of a few input channels, on CUDA cores.
std::string plans_of(const bench::YoloConv& layer, const GpuDesc& gpu) {
  std::string codes;
  for (TcPass pass : kConvPasses) {
    const Conv2dShape s = shape_of(layer, 16);
    const bool small = pass != TcPass::BackwardData && conv2d_tc_small_channels(s);
    codes += (codes.empty() ? "" : " ") +
             (small ? "small" : plan_code(choose_plan(conv2d_tc_problem(s, pass, auto_precision(gpu)), gpu)));
  }
  return codes;
}

// The choices as of 2026-12-04 (docs/perf.md, "The planner"). A change to the model or the kernels'
// launch bounds that moves them updates these tables in the same commit, saying why. Since then:
// backward data 128x128 cp.async gets 2 blocks per SM (was 1), so the A100 and H200 take it for
// 10 and 9 more layers. The H200 runs sm_90a code: the planner weighs the wgmma kernels ("128w",
// issue 36) at their predicted 70% of 790 TFLOP/s against mma.sync's measured fit, and takes them
// for every pass whose shape they take and where they save 5 us or more (backward data with c_out
// not a multiple of 64, weight gradients of 255 channels, and five small weight gradients stay on
// mma.sync; backward data at stride 2 moved to wgmma with its parity classes). A prediction until
// the GPU measures both.
const Pinned kT4 = {
    {"416x416 3->32 3x3 s1", "small 64r1 small"},
    {"416->208 32->64 3x3 s2", "64r1 64r1 64r16"},
    {"208x208 64->32 1x1 s1", "64r1 64r1 64r80"},
    {"208x208 32->64 3x3 s1", "64r1 64r1 64r16"},
    {"208->104 64->128 3x3 s2", "128r1 64r1 128r8"},
    {"104x104 128->64 1x1 s1", "64r1 128r1 64r40"},
    {"104x104 64->128 3x3 s1", "128r1 64r1 128r8"},
    {"104->52 128->256 3x3 s2", "128r1 128r1 128r11"},
    {"52x52 256->128 1x1 s1", "128r1 128r1 128r20"},
    {"52x52 128->256 3x3 s1", "128r1 128r1 128r11"},
    {"52->26 256->512 3x3 s2", "128r1 128r1 128r1"},
    {"26x26 512->256 1x1 s1", "64r1 128r1 128r5"},
    {"26x26 256->512 3x3 s1", "128r1 64r1 128r1"},
    {"26->13 512->1024 3x3 s2", "128r1 128r1 128r1"},
    {"13x13 1024->512 1x1 s1", "64r1 128r1 128r1"},
    {"13x13 512->1024 3x3 s1", "128r1 64r1 128r1"},
    {"13x13 1024->255 1x1 s1", "64r1 128r1 128r5"},
    {"13x13 512->256 1x1 s1", "64r1 64r1 128r5"},
    {"26x26 768->256 1x1 s1", "64r1 128r1 128r3"},
    {"26x26 512->255 1x1 s1", "64r1 128r1 128r5"},
    {"26x26 256->128 1x1 s1", "64r1 64r1 64r10"},
    {"52x52 384->128 1x1 s1", "128r1 128r1 128r13"},
    {"52x52 256->255 1x1 s1", "128r1 128r1 128r10"},
    {"13x13 1024->24 1x1 s1", "64r4 128r1 64r5"},
    {"26x26 512->24 1x1 s1", "64r1 128r1 64r10"},
    {"52x52 256->24 1x1 s1", "64r1 128r1 64r20"},
};
const Pinned kA100 = {
    {"416x416 3->32 3x3 s1", "small 64r1 small"},
    {"416->208 32->64 3x3 s2", "128a1 128a1 64a43"},
    {"208x208 64->32 1x1 s1", "128a1 128a1 64a213"},
    {"208x208 32->64 3x3 s1", "128a1 128a1 64a43"},
    {"208->104 64->128 3x3 s2", "128a1 128a1 128a43"},
    {"104x104 128->64 1x1 s1", "128a1 128a1 128a208"},
    {"104x104 64->128 3x3 s1", "128a1 128a1 128a43"},
    {"104->52 128->256 3x3 s2", "128a1 128a1 128a12"},
    {"52x52 256->128 1x1 s1", "128a1 128a1 128a104"},
    {"52x52 128->256 3x3 s1", "128a1 128a1 128a12"},
    {"52->26 256->512 3x3 s2", "128a1 128a1 128a3"},
    {"26x26 512->256 1x1 s1", "128a1 128a1 128a26"},
    {"26x26 256->512 3x3 s1", "128a1 128a3 128a3"},
    {"26->13 512->1024 3x3 s2", "128a3 128a1 128a1"},
    {"13x13 1024->512 1x1 s1", "128a2 128a1 128a6"},
    {"13x13 512->1024 3x3 s1", "128a3 128a6 128a1"},
    {"13x13 1024->255 1x1 s1", "128a4 128r1 64r5"},
    {"13x13 512->256 1x1 s1", "64a1 128a1 64a10"},
    {"26x26 768->256 1x1 s1", "128a1 128a1 128a18"},
    {"26x26 512->255 1x1 s1", "128a1 64r1 128r13"},
    {"26x26 256->128 1x1 s1", "128a1 128a1 64a26"},
    {"52x52 384->128 1x1 s1", "128a1 128a1 128a72"},
    {"52x52 256->255 1x1 s1", "128a1 128r1 128r26"},
    {"13x13 1024->24 1x1 s1", "64a4 128a1 64a11"},
    {"26x26 512->24 1x1 s1", "64a1 128a1 64a26"},
    {"52x52 256->24 1x1 s1", "64a1 128a1 128a104"},
};
// The H200 where the build has no sm_90a code (ARCH=80, say): mma.sync alone, the choices above.
const Pinned kH200MmaSync = {
    {"416x416 3->32 3x3 s1", "small 64r1 small"},
    {"416->208 32->64 3x3 s2", "128a1 128a1 64a52"},
    {"208x208 64->32 1x1 s1", "128a1 128a1 64a258"},
    {"208x208 32->64 3x3 s1", "128a1 128a1 64a52"},
    {"208->104 64->128 3x3 s2", "128a1 128a1 128a52"},
    {"104x104 128->64 1x1 s1", "128a1 128a1 128a258"},
    {"104x104 64->128 3x3 s1", "128a1 128a1 128a52"},
    {"104->52 128->256 3x3 s2", "128a1 128a1 128a14"},
    {"52x52 256->128 1x1 s1", "128a1 128a1 128a123"},
    {"52x52 128->256 3x3 s1", "128a1 128a1 128a14"},
    {"52->26 256->512 3x3 s2", "128a1 128a1 128a5"},
    {"26x26 512->256 1x1 s1", "128a1 128a1 128a31"},
    {"26x26 256->512 3x3 s1", "128a1 128a3 128a5"},
    {"26->13 512->1024 3x3 s2", "128a3 128a1 128a1"},
    {"13x13 1024->512 1x1 s1", "128a3 128a1 128a8"},
    {"13x13 512->1024 3x3 s1", "128a3 128a3 128a1"},
    {"13x13 1024->255 1x1 s1", "128a4 64r1 128r8"},
    {"13x13 512->256 1x1 s1", "64a1 64a1 64a8"},
    {"26x26 768->256 1x1 s1", "128a1 128a1 128a20"},
    {"26x26 512->255 1x1 s1", "128a1 128r1 128r16"},
    {"26x26 256->128 1x1 s1", "64a1 128a1 64a31"},
    {"52x52 384->128 1x1 s1", "128a1 128a1 128a85"},
    {"52x52 256->255 1x1 s1", "128a1 128r1 128r33"},
    {"13x13 1024->24 1x1 s1", "64a4 128a1 64a11"},
    {"26x26 512->24 1x1 s1", "64a1 128a1 64a31"},
    {"52x52 256->24 1x1 s1", "128a1 128a1 128a123"},
};
const Pinned kH200 = {
    {"416x416 3->32 3x3 s1", "small 64r1 small"},
    {"416->208 32->64 3x3 s2", "128w1 128w1 128w88"},
    {"208x208 64->32 1x1 s1", "128w1 128a1 64a258"},
    {"208x208 32->64 3x3 s1", "128w1 128w1 128w88"},
    {"208->104 64->128 3x3 s2", "128w1 128w1 128w52"},
    {"104x104 128->64 1x1 s1", "128w1 128w1 128w246"},
    {"104x104 64->128 3x3 s1", "128w1 128w1 128w52"},
    {"104->52 128->256 3x3 s2", "128w1 128w1 128w14"},
    {"52x52 256->128 1x1 s1", "128w1 128w1 128w113"},
    {"52x52 128->256 3x3 s1", "128w1 128w1 128w14"},
    {"52->26 256->512 3x3 s2", "128w1 128w1 128w3"},
    {"26x26 512->256 1x1 s1", "128w1 128w1 128w29"},
    {"26x26 256->512 3x3 s1", "128w1 128w1 128w3"},
    {"26->13 512->1024 3x3 s2", "128w1 128w1 128w1"},
    {"13x13 1024->512 1x1 s1", "128w1 128w1 128w8"},
    {"13x13 512->1024 3x3 s1", "128w1 128w1 128w1"},
    {"13x13 1024->255 1x1 s1", "128w1 64r1 128r8"},
    {"13x13 512->256 1x1 s1", "128w1 128w1 64a8"},
    {"26x26 768->256 1x1 s1", "128w1 128w1 128w22"},
    {"26x26 512->255 1x1 s1", "128w1 128r1 128r16"},
    {"26x26 256->128 1x1 s1", "128w1 128w1 64a31"},
    {"52x52 384->128 1x1 s1", "128w1 128w1 128w85"},
    {"52x52 256->255 1x1 s1", "128w1 128r1 128r33"},
    {"13x13 1024->24 1x1 s1", "128w1 128a1 64a11"},
    {"26x26 512->24 1x1 s1", "128w1 128a1 64a31"},
    {"52x52 256->24 1x1 s1", "128w1 128a1 128w113"},
};

}  // namespace

TEST_CASE("tc plan: blocks per SM from launch bounds, shared memory and threads on the T4, A100 and H200") {
  auto blocks = [](const GpuDesc& gpu, TcPass pass, int elem, bool ak, bool bk, int tile, bool async) {
    TcProblem problem;
    problem.pass = pass, problem.elem = elem, problem.a_kmajor = ak, problem.b_kmajor = bk;
    TcPlan plan;
    plan.tile = tile, plan.async = async;
    return blocks_per_sm(problem, plan, gpu);
  };
  // H200 forward BF16 128x128 cp.async: 3 x 16 KiB of stages, 4 would fit; its launch bounds give 2.
  CHECK(blocks(gpu_h200(), TcPass::Forward, 2, true, true, 0, true) == 2);
  // T4 forward FP16 128x128 register-staged: 32 KiB of stages + 1 KiB: one in 64 KiB.
  CHECK(blocks(gpu_t4(), TcPass::Forward, 2, true, true, 0, false) == 1);
  // T4 64x64: 16 KiB + 1 KiB each: 3 fit (the launch bounds allow 3, the threads 4).
  CHECK(blocks(gpu_t4(), TcPass::Forward, 2, true, true, 1, false) == 3);
  // A100 backward weights BF16 64x64 cp.async: MN-major stages of 27 KiB: 5 fit, launch bounds 4.
  CHECK(blocks(gpu_a100(), TcPass::BackwardWeights, 2, false, false, 1, true) == 4);
  // Backward data 128x128 cp.async: 2 blocks since its loaders share one cursor (161 registers
  // before); register-staged, one.
  CHECK(blocks(gpu_h200(), TcPass::BackwardData, 2, true, false, 0, true) == 2);
  CHECK(blocks(gpu_h200(), TcPass::BackwardData, 2, true, false, 0, false) == 1);
  // A T4 backward weights 128x128 register-staged in FP16: 34 KiB of stages, one block.
  CHECK(blocks(gpu_t4(), TcPass::BackwardWeights, 2, false, false, 0, false) == 1);
  // TF32 rows are 64 bytes too (16 elements): 3 x 16 KiB a block, 3 would fit; the launch bounds
  // give the H200 2, the A100 1 (sm_80's TF32 128x128 main loop spilled at 128 registers).
  CHECK(blocks(gpu_h200(), TcPass::Forward, 4, true, true, 0, true) == 2);
  CHECK(blocks(gpu_a100(), TcPass::Forward, 4, true, true, 0, true) == 1);
  // A T4 runs no cp.async; an H200 128x128 register-staged forward: 2 x 16 KiB, one block (bounds).
  CHECK(blocks(gpu_h200(), TcPass::Forward, 2, true, true, 0, false) == 1);
}

// An H200 whose build has no sm_90a code: the mma.sync kernels alone.
static GpuDesc h200_without_sm90a() {
  GpuDesc gpu = gpu_h200();
  gpu.name = "H200 without sm_90a code";
  gpu.wgmma = false;
  return gpu;
}

TEST_CASE("tc plan: the choices for every YOLOv3-416 conv pass at batch 16 on the T4, A100 and H200 (pinned)") {
  const std::pair<GpuDesc, const Pinned*> devices[] = {
      {gpu_t4(), &kT4}, {gpu_a100(), &kA100}, {gpu_h200(), &kH200}, {h200_without_sm90a(), &kH200MmaSync}};
  for (const auto& [gpu, pinned] : devices) {
    CAPTURE(gpu.name);
    for (const bench::YoloConv& layer : bench::kYoloConvs) {
      CAPTURE(std::string(layer.label));
      REQUIRE(pinned->count(layer.label) == 1);
      CHECK(plans_of(layer, gpu) == pinned->at(layer.label));
    }
  }
}

TEST_CASE("tc plan: each architecture family its own preset; GPUs after Hopper run the sm_80 code, within their limits") {
  const std::pair<int, const char*> families[] = {{75, "T4"},  {80, "A100"}, {86, "L4"},      {89, "L4"},
                                                  {90, "H200"}, {100, "B200"}, {120, "RTX 5090"}};
  for (const auto& [cc, name] : families) {
    CAPTURE(cc);
    const GpuDesc gpu = gpu_preset(cc);
    CHECK(gpu.name == name);
    CHECK(gpu.wgmma == (cc == 90));  // sm_90a code loads on 9.0 alone (runtime/gpu_code.h)
    CHECK(gpu.smem_per_block <= gpu.smem_per_sm);
    CHECK(tc_code_arch(cc) == (cc == 90 ? 90 : cc >= 80 ? 80 : 75));
    // Every YOLOv3 pass gets a plan whose blocks fit the SM (shared memory, threads, registers).
    for (const bench::YoloConv& layer : bench::kYoloConvs)
      for (TcPass pass : kConvPasses) {
        const TcProblem problem = conv2d_tc_problem(shape_of(layer, 16), pass, auto_precision(gpu));
        const TcPlan plan = choose_plan(problem, gpu);
        CHECK(blocks_per_sm(problem, plan, gpu) >= 1);
        CHECK((!plan.wgmma || cc == 90));
      }
  }
  // The 100 KB SMs of 8.6, 8.9 and 12.0 hold fewer blocks than the A100's 164 KB where shared
  // memory limits them: BF16 backward weights 64x64 cp.async (27 KiB of MN-major stages).
  TcProblem weights;
  weights.pass = TcPass::BackwardWeights, weights.elem = 2, weights.a_kmajor = false, weights.b_kmajor = false;
  TcPlan small;
  small.tile = 1, small.async = true;
  CHECK(blocks_per_sm(weights, small, gpu_a100()) == 4);
  CHECK(blocks_per_sm(weights, small, gpu_rtx5090()) == 3);
}

TEST_CASE("tc plan: split-K only where the tiles alone fill less than a wave; T4 never gets cp.async") {
  for (const GpuDesc& gpu : {gpu_t4(), gpu_a100(), gpu_h200()})
    for (const bench::YoloConv& layer : bench::kYoloConvs)
      for (TcPass pass : kConvPasses) {
        CAPTURE(gpu.name);
        CAPTURE(std::string(layer.label));
        CAPTURE(pass_name(pass));
        const TcProblem problem = conv2d_tc_problem(shape_of(layer, 16), pass, auto_precision(gpu));
        const TcPlan plan = choose_plan(problem, gpu);
        const TcPrediction p = predict(problem, plan, gpu);
        const long long tiles = p.blocks / plan.splits;
        if (plan.splits > 1) CHECK(tiles < (long long)gpu.sms * p.blocks_per_sm);
        CHECK(p.blocks_per_sm >= 1);
        if (gpu.cc < 80) CHECK_FALSE(plan.async);
        if (!problem.vec) CHECK_FALSE(plan.async);
      }
}

TEST_CASE("tc plan: the prediction's parts: partials only with splits; the H200's old 3-way split predicted slower") {
  const bench::YoloConv layer{"52x52 128->256 3x3 s1", 52, 52, 128, 256, 3, 1, false};
  const TcProblem problem = conv2d_tc_problem(shape_of(layer, 16), TcPass::Forward, Precision::Bf16);
  TcPlan one, three;
  one.async = three.async = true;
  three.splits = 3;
  const TcPrediction p1 = predict(problem, one, gpu_h200()), p3 = predict(problem, three, gpu_h200());
  CHECK(p1.partial_bytes == 0);
  CHECK(p1.split_pass_us == 0);
  CHECK(p3.partial_bytes == doctest::Approx(4.0 * 3 * 43264 * 256));
  CHECK(p3.split_pass_us > 0);
  CHECK(p3.blocks == 3 * p1.blocks);
  CHECK(p1.waves == doctest::Approx(676.0 / (132 * 2)));
  // What ncu found (L2 71% busy with the partials, 2.56 waves of tiles): no split is faster.
  CHECK(p3.total_us > p1.total_us);
}

TEST_CASE("tc plan: forced tiles, splits and pipelines are honoured, splits up to the pass's limit") {
  const bench::YoloConv layer{"26x26 256->512 3x3 s1", 26, 26, 256, 512, 3, 1, false};
  const TcProblem problem = conv2d_tc_problem(shape_of(layer, 16), TcPass::Forward, Precision::Bf16);
  {
    TcTiling forced(1, 3, 1);
    const TcPlan plan = choose_plan(problem, gpu_h200());
    CHECK(plan.tile == 1);
    CHECK(plan.splits == 3);
    CHECK_FALSE(plan.async);  // pipeline 1: register-staged
  }
  {
    TcTiling forced(0, 1000, 0);
    const TcPlan plan = choose_plan(problem, gpu_h200());
    CHECK(plan.tile == 0);
    CHECK(plan.splits == problem.max_splits);
    CHECK(plan.async);
  }
  const TcPlan automatic = choose_plan(problem, gpu_h200());
  CHECK(plan_code(automatic) == plan_code(choose_plan(problem, gpu_h200())));  // no state left behind
}

TEST_CASE("tc plan: a pure function of the problem and the description, not of the current device") {
  const bench::YoloConv layer{"52x52 128->256 3x3 s1", 52, 52, 128, 256, 3, 1, false};
  const TcProblem problem = conv2d_tc_problem(shape_of(layer, 16), TcPass::BackwardWeights, Precision::Bf16);
  const std::string before = plan_code(choose_plan(problem, gpu_t4()));
#if YOLO_EMULATED_KERNELS
  // The current device described from the emulated sm_75 (a T4): what the launchers plan with.
  yolo::testing::EmulatedDevicesReset reset;
  emu::configure_device(1, emu::preset_for(75));
  emu::set_current_device(1);
  CHECK(current_gpu().cc == 75);
  CHECK(current_gpu().sms == 40);
  CHECK(current_gpu().smem_per_sm == 64 * 1024);
  CHECK(current_gpu().threads_per_sm == 1024);
#endif
  CHECK(plan_code(choose_plan(problem, gpu_t4())) == before);
}

TEST_CASE("tc plan: wgmma only on devices that run sm_90a code, in 16 bits (TF32: no weight gradient), for shapes it takes") {
  const bench::YoloConv wide{"26x26 256->512 3x3 s1", 26, 26, 256, 512, 3, 1, false};
  const Conv2dShape s = shape_of(wide, 16);
  for (TcPass pass : kConvPasses) {
    CAPTURE(pass_name(pass));
    const TcProblem bf16 = conv2d_tc_problem(s, pass, Precision::Bf16);
    CHECK(bf16.wgmma_shape);
    CHECK(choose_plan(bf16, gpu_h200()).wgmma);
    CHECK_FALSE(choose_plan(bf16, h200_without_sm90a()).wgmma);
    CHECK_FALSE(choose_plan(bf16, gpu_a100()).wgmma);
    // TF32 wgmma reads K-major operands only: the forward, and backward data from the weights
    // transposed; not the weight gradient.
    CHECK(choose_plan(conv2d_tc_problem(s, pass, Precision::Tf32), gpu_h200()).wgmma ==
          (pass != TcPass::BackwardWeights));
    CHECK_FALSE(choose_plan(conv2d_tc_problem(s, pass, Precision::Tf32), h200_without_sm90a()).wgmma);
    // Forcing an mma.sync tile rules wgmma out; pipeline 3 forces it where it can run.
    {
      TcTiling forced(0, 0, 0);
      CHECK_FALSE(choose_plan(bf16, gpu_h200()).wgmma);
    }
    {
      TcTiling forced(-1, 0, 3);
      CHECK(choose_plan(bf16, gpu_h200()).wgmma);
      CHECK_FALSE(choose_plan(bf16, h200_without_sm90a()).wgmma);
    }
  }
  // Backward data at stride 2 runs by parity classes (a grid z of 4).
  Conv2dShape stride2 = s;
  stride2.stride = 2;
  CHECK(conv2d_tc_problem(stride2, TcPass::BackwardData, Precision::Bf16).wgmma_shape);
  // Shapes the kernels do not take: backward data with a 5x5 kernel (a tensor map a tap, 9 at
  // most) or c_out not a multiple of 64, a forward of 12 input channels, a weight gradient of 255
  // outputs.
  Conv2dShape five = s, narrow = s, twelve = s, heads = s;
  five.k = 5, narrow.c_out = 96, twelve.c_in = 12, heads.c_out = 255;
  CHECK_FALSE(conv2d_tc_problem(five, TcPass::BackwardData, Precision::Bf16).wgmma_shape);
  CHECK_FALSE(conv2d_tc_problem(narrow, TcPass::BackwardData, Precision::Bf16).wgmma_shape);
  CHECK_FALSE(conv2d_tc_problem(twelve, TcPass::Forward, Precision::Bf16).wgmma_shape);
  CHECK_FALSE(conv2d_tc_problem(heads, TcPass::BackwardWeights, Precision::Bf16).wgmma_shape);
  TcTiling forced(-1, 0, 3);
  CHECK_FALSE(choose_plan(conv2d_tc_problem(five, TcPass::BackwardData, Precision::Bf16), gpu_h200()).wgmma);
  // More than 65535 row tiles of 128 pixels (the grid's y): batch 64 at 416x416.
  Conv2dShape big{64, 416, 416, 32, 32, 3, 1};
  CHECK_FALSE(conv2d_tc_problem(big, TcPass::Forward, Precision::Bf16).wgmma_shape);
  big.n = 16;
  CHECK(conv2d_tc_problem(big, TcPass::Forward, Precision::Bf16).wgmma_shape);
}

TEST_CASE("tc plan: the wgmma block: one per SM; the weight gradient's pixel splits fill two waves, none empty") {
  TcProblem problem;
  problem.pass = TcPass::Forward;
  TcPlan plan;
  plan.wgmma = true, plan.async = true;
  CHECK(blocks_per_sm(problem, plan, gpu_h200()) == 1);
  GpuDesc small = gpu_h200();
  small.smem_per_block = 100 * 1024;  // the 132 KiB ring does not fit
  CHECK(blocks_per_sm(problem, plan, small) == 0);
  CHECK(wgmma_weight_splits(264, 1000, 132) == 1);  // the tiles fill two waves alone
  CHECK(wgmma_weight_splits(8, 1000, 132) == 33);   // 2 * 132 / 8
  CHECK(wgmma_weight_splits(8, 20, 132) == 20);     // at least one 64-pixel step each
  for (long long k_tiles : {1LL, 7LL, 50LL, 51LL, 1000LL})
    for (long long tiles : {1LL, 3LL, 40LL}) {
      const long long splits = wgmma_weight_splits(tiles, k_tiles, 132);
      const long long per_split = (k_tiles + splits - 1) / splits;
      CAPTURE(k_tiles);
      CAPTURE(tiles);
      CHECK(splits >= 1);
      CHECK((splits - 1) * per_split < k_tiles);  // the last split has pixels
    }
}

#if YOLO_EMULATED_KERNELS
TEST_CASE("tc plan: YOLO_WGMMA=off keeps the current device on mma.sync; a value it does not know is refused") {
  struct RestoreEnvironment {
    ~RestoreEnvironment() { ::unsetenv("YOLO_WGMMA"); }
  } restore;
  ::unsetenv("YOLO_WGMMA");
  CHECK(current_gpu().wgmma);  // the emulated default: an sm_90 running sm_90a code
  for (const char* off : {"off", "0"}) {
    ::setenv("YOLO_WGMMA", off, 1);
    CHECK_FALSE(current_gpu().wgmma);
  }
  for (const char* on : {"on", "1", "auto", ""}) {
    ::setenv("YOLO_WGMMA", on, 1);
    CHECK(current_gpu().wgmma);
  }
  ::setenv("YOLO_WGMMA", "maybe", 1);
  CHECK_THROWS_WITH_AS(current_gpu(), doctest::Contains("YOLO_WGMMA=maybe"), Error);
}
#endif
