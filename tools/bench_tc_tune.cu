// conv_tc_tune (`bench_kernels --tune`, tools/gpu_check.sh tune): every candidate plan of every
// YOLOv3-416 tensor-core conv pass (tools/yolov3_convs.h) timed beside its predicted time, so that
// one GPU call shows where the planner's model (kernels/tc_plan.h) is wrong. Candidates: both
// mma.sync tiles, split counts 1, 2, 3, 4, 6, 8, 12, 16, ... up to the pass's limit (while the
// FP32 partials stay under 1 GiB), the wgmma kernels where the GPU and the shape allow them
// ("128w"), and the planner's own choice; the mma.sync pipeline as the planner sets it.
// Lines, all starting "tune":
//   tune cand  OP SHAPE  PLAN  MS  PREDICTED_MS            each candidate
//   tune row   OP SHAPE  planner PLAN MS (pred P) | fastest PLAN MS (pred P) | planner/fastest R
//   tune summary: ...                                     rows, sums, how often the planner won
// bf16 by default; `--filter tf32` (or fp16) tunes that precision, other filter text picks rows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "tools/bench.h"
#include "tools/bench_tc_layer.cuh"

namespace yolo::bench {
namespace {

constexpr const char* kFamily = "conv_tc_tune";
constexpr double kMaxPartialBytes = double(1 << 30);

struct Candidate {
  tc::TcPlan plan;
  double ms = 0, predicted_ms = 0;
};

Precision tuned_precision(const Context& context) {
  for (Precision p : {Precision::Tf32, Precision::Fp16})
    if (context.filter.find(precision_name(p)) != std::string::npos) return p;
  return Precision::Bf16;
}

// The filter's text without the precision's name: what picks rows.
bool row_wanted(const Context& context, Precision p, Pass pass, const YoloConv& layer) {
  std::string filter = context.filter;
  const std::string name = precision_name(p);
  if (const size_t at = filter.find(name); at != std::string::npos) filter.erase(at, name.size());
  filter.erase(0, filter.find_first_not_of(' '));
  filter.erase(filter.find_last_not_of(' ') + 1);
  return filter.empty() || (op_name(pass, p) + " " + layer.label).find(filter) != std::string::npos;
}

// The forcing the tests use (set_tc_tiling_for_tests) that makes the launchers run `plan`.
void force(const tc::TcPlan& plan) {
  if (plan.wgmma) set_tc_tiling_for_tests(-1, 0, 3);
  else set_tc_tiling_for_tests(plan.tile, plan.splits, plan.async ? 2 : 1);
}

// The planner's choice under the forcing of pipeline `pipeline` (3: wgmma where possible).
tc::TcPlan chosen_with(const tc::TcProblem& problem, const tc::GpuDesc& gpu, int pipeline) {
  set_tc_tiling_for_tests(-1, 0, pipeline);
  const tc::TcPlan plan = tc::choose_plan(problem, gpu);
  set_tc_tiling_for_tests(-1, 0, 0);
  return plan;
}

std::vector<tc::TcPlan> candidates(const tc::TcProblem& problem, const tc::GpuDesc& gpu) {
  const tc::TcPlan chosen = tc::choose_plan(problem, gpu), wgmma = chosen_with(problem, gpu, 3);
  std::vector<tc::TcPlan> all{chosen};
  if (wgmma.wgmma && !chosen.wgmma) all.push_back(wgmma);
  // mma.sync's pipeline as the planner sets it when wgmma is ruled out (a forced tile does that).
  const tc::TcPlan mma = chosen.wgmma ? chosen_with(problem, gpu, 2) : chosen;
  for (int tile = 0; tile < 2; ++tile)
    for (int splits = 1; splits <= problem.max_splits; splits = splits < 4 ? splits + 1 : splits * 3 / 2 / 2 * 2) {
      tc::TcPlan plan = mma;
      plan.tile = tile, plan.splits = splits;
      const double partials = splits > 1 ? 4.0 * splits * double(problem.m) * double(problem.n) * problem.groups : 0;
      if (partials > kMaxPartialBytes) break;
      if (tc::plan_code(plan) != tc::plan_code(chosen)) all.push_back(plan);
    }
  return all;
}

#if defined(__CUDACC__)

// Runs `pass` with `plan` forced (the forcing the tests use: set_tc_tiling_for_tests).
template <typename T>
double time_plan(const Context& context, Pass pass, const Conv2dShape& s, const YoloConv& layer,
                 const LayerBuffers& buf, const tc::TcPlan& plan) {
  force(plan);
  try {
    const double ms = time_ms(context, [&] { run_tc<T>(pass, s, layer, buf, context.stream); });
    set_tc_tiling_for_tests(-1, 0, 0);
    return ms;
  } catch (...) {
    set_tc_tiling_for_tests(-1, 0, 0);
    throw;
  }
}

// The workspace the largest candidate needs (workspace sizes follow the forced plan).
template <typename T>
size_t candidate_workspace(Pass pass, const Conv2dShape& s, const tc::TcPlan& plan) {
  force(plan);
  size_t bytes = 0;
  switch (pass) {
    case Pass::Forward: bytes = conv2d_forward_tc_workspace_bytes<T>(s); break;
    case Pass::BackwardData: bytes = conv2d_backward_data_tc_workspace_bytes<T>(s); break;
    case Pass::BackwardWeights: bytes = conv2d_backward_weights_tc_workspace_bytes<T>(s); break;
  }
  set_tc_tiling_for_tests(-1, 0, 0);
  return bytes;
}

struct Totals {
  int rows = 0, planner_fastest = 0;
  double planner_ms = 0, fastest_ms = 0, log_error_sq = 0;
  int predictions = 0;
};

template <typename T>
void tune_layer(const Context& context, Precision p, const YoloConv& layer, Totals& totals) {
  const Conv2dShape s{context.batch, layer.h, layer.w, layer.c_in, layer.c_out, layer.k, layer.stride};
  const tc::GpuDesc gpu = tc::current_gpu();
  std::vector<std::pair<Pass, std::vector<Candidate>>> work;
  size_t workspace = 256;
  for (Pass pass : kPasses) {
    if (!row_wanted(context, p, pass, layer)) continue;
    if (pass != Pass::BackwardData && conv2d_tc_small_channels(s)) continue;  // CUDA cores: no plans to tune
    const tc::TcProblem problem = conv2d_tc_problem(s, tc_pass(pass), p);
    std::vector<Candidate> list;
    for (const tc::TcPlan& plan : candidates(problem, gpu)) {
      list.push_back({plan, 0, tc::predict(problem, plan, gpu).total_us / 1000});
      workspace = std::max(workspace, candidate_workspace<T>(pass, s, plan));
    }
    work.push_back({pass, list});
  }
  if (work.empty()) return;
  const LayerBuffers buf = layer_buffers(context.device, s, workspace);
  const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
  fill_precision(p, buf.in, in_n, 1, context.stream);
  fill_precision(p, buf.weights, s.weight_count(), 2, context.stream);
  fill_precision(p, buf.grad_out, out_n, 3, context.stream);
  fill_as<float>(buf.bias, size_t(s.c_out), 5, context.stream);
  for (auto& [pass, list] : work) {
    const std::string row = op_name(pass, p) + " " + layer.label;
    for (Candidate& c : list) {
      c.ms = time_plan<T>(context, pass, s, layer, buf, c.plan);
      std::printf("tune cand  %-45s %-7s %8.3f %8.3f\n", row.c_str(), tc::plan_code(c.plan).c_str(), c.ms,
                  c.predicted_ms);
      totals.log_error_sq += std::pow(std::log(c.predicted_ms / c.ms), 2.0);
      ++totals.predictions;
    }
    const Candidate& planner = list.front();
    const Candidate& fastest = *std::min_element(list.begin(), list.end(), [](auto& a, auto& b) { return a.ms < b.ms; });
    std::printf("tune row   %-45s planner %-7s %8.3f (pred %.3f) | fastest %-7s %8.3f (pred %.3f) | planner/fastest %.2f\n",
                row.c_str(), tc::plan_code(planner.plan).c_str(), planner.ms, planner.predicted_ms,
                tc::plan_code(fastest.plan).c_str(), fastest.ms, fastest.predicted_ms, planner.ms / fastest.ms);
    std::fflush(stdout);
    ++totals.rows;
    totals.planner_fastest += planner.ms <= fastest.ms * 1.05;
    totals.planner_ms += planner.ms;
    totals.fastest_ms += fastest.ms;
  }
}

void run_tune(const Context& context) {
  const Precision p = tuned_precision(context);
  const int cc = current_compute_capability();
  if (cc < min_compute_capability(p)) {
    std::printf("%s: %s needs sm_%d or newer, this GPU is sm_%d\n", kFamily, precision_name(p),
                min_compute_capability(p), cc);
    return;
  }
  const tc::GpuDesc gpu = tc::current_gpu();
  std::printf("tune: %s, %d SMs, sm_%d; %s, batch %d, median of %d; columns: plan, ms, predicted ms\n",
              gpu.name.c_str(), gpu.sms, gpu.cc, precision_name(p), context.batch, context.repeats);
  Totals totals;
  for (const YoloConv& layer : kYoloConvs) {
    if (p == Precision::Bf16) tune_layer<Bf16>(context, p, layer, totals);
    else if (p == Precision::Fp16) tune_layer<Fp16>(context, p, layer, totals);
    else tune_layer<float>(context, p, layer, totals);
  }
  if (totals.rows == 0) return;
  std::printf("tune summary: %d rows; the planner's choice within 5%% of the fastest in %d; sum planner %.3f ms, "
              "sum fastest %.3f ms (%.2fx); predictions: rms log error %.2f over %d candidates\n",
              totals.rows, totals.planner_fastest, totals.planner_ms, totals.fastest_ms,
              totals.planner_ms / totals.fastest_ms, std::sqrt(totals.log_error_sq / totals.predictions),
              totals.predictions);
}

#endif  // __CUDACC__

BENCH_ENTRY(kFamily, [](const Context& context, std::vector<Result>&) {
  if (!context.tune) return;
  if (!context.device.is_cuda()) {
    std::printf("%s: tuning times the kernels on a GPU: nothing to do here\n", kFamily);
    return;
  }
#if defined(__CUDACC__)
  run_tune(context);
#endif
});

}  // namespace
}  // namespace yolo::bench
