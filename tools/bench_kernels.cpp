// bench_kernels: times every op (forward and backward) at YOLOv3-416 shapes and prints achieved
// GB/s and TFLOP/s next to this device's measured ceilings (copy, FP32 FMA, and mma.sync per
// tensor-core precision: %peak is against the ceiling named in the next column), and for the
// rows that have one, a cuBLAS yardstick (cuBLAS loaded at run time, tools/cublas_loader.h):
// its median ms at the equivalent GEMM and our time / its time. CUDA kernels on gpu:0 when
// there is a GPU, the fast CPU versions otherwise (with a smaller batch, printed). After the
// table, where conv_tc's bf16 rows ran, one line judges them against issue 36's cuBLAS targets
// (tools/cublas_verdict.h).
//   bench_kernels [--filter TEXT] [--batch N] [--repeats N] [--cpu] [--ceilings-only] [--normalized]
//                 (--normalized: conv_tc also times each forward and weight gradient reading its
//                 input through BatchNorm's apply, rows "+bn")
//   bench_kernels --plans t4|a100|l4|h200|h200-mma|b200|rtx5090|this [--batch N] [--filter TEXT]   the tensor-core planner's
//                 choices and predicted times per YOLOv3 conv pass (no GPU needed for the presets)
//   bench_kernels --tune [--filter TEXT]   every candidate tensor-core plan timed beside its
//                 prediction (tools/bench_tc_tune.cu; bf16, or the precision the filter names)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/check.h"
#include "runtime/device.h"
#include "tools/bench.h"
#include "tools/cublas_loader.h"
#include "tools/cublas_verdict.h"

using namespace yolo;

int main(int argc, char** argv) {
  try {
    bench::Context context;
    bool force_cpu = false, ceilings_only = false;
    int batch = 0;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw Error(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--filter") context.filter = value();
      else if (arg == "--batch") batch = std::atoi(value().c_str());
      else if (arg == "--repeats") context.repeats = std::atoi(value().c_str());
      else if (arg == "--cpu") force_cpu = true;
      else if (arg == "--ceilings-only") ceilings_only = true;
      else if (arg == "--plans") context.plans = value();
      else if (arg == "--tune") context.tune = true;
      else if (arg == "--normalized") context.normalized = true;
      else throw Error("unknown option '" + arg +
                       "' (try --filter, --batch, --repeats, --cpu, --ceilings-only, --plans, --tune, --normalized)");
    }
    if (context.repeats < 1) throw Error("--repeats must be at least 1");
    // --plans and --tune are one family's own output (tools/bench_tc.cu, tools/bench_tc_tune.cu).
    auto run_family = [&](const std::string& name) {
      for (const auto& [family, entry] : bench::entries()) {
        std::vector<bench::Result> ignored;
        if (family == name) entry(context, ignored);
      }
    };
    if (!context.plans.empty()) {  // the planner's tables: no device is used
      context.batch = batch > 0 ? batch : 16;
      run_family("conv_tc");
      return 0;
    }
    const GpuDiscovery& found = discover_gpus();
    bool gpu = !force_cpu && !found.gpus.empty();
    context.device = gpu ? Device::cuda(0) : Device::cpu();
    // 16 is the YOLOv3 training batch per GPU; the CPU gets 1 so a run finishes in minutes.
    context.batch = batch > 0 ? batch : (gpu ? 16 : 1);
#if YOLO_CUDA
    if (gpu) {
      CHECKED(cudaSetDevice(0));
      CHECKED(cudaStreamCreateWithFlags(&context.stream, cudaStreamNonBlocking));
    }
#endif
    if (!gpu) std::printf("bench_kernels: no GPU used (%s): timing the fast CPU ops\n",
                          force_cpu ? "--cpu" : found.why_no_gpu.c_str());
    bench::Ceilings ceilings = bench::measure_ceilings(context.device);
    std::printf("device: %s   ceilings: copy %.0f GB/s, FP32 %.3f TFLOP/s   batch %d, median of %d\n",
                ceilings.where.c_str(), ceilings.copy_gbs, ceilings.fp32_tflops, context.batch, context.repeats);
    auto mma = [](double tflops) { return tflops > 0 ? std::to_string(int(tflops + 0.5)) : std::string("-"); };
    std::string mma_line = "mma.sync ceilings: tf32 " + mma(ceilings.tf32_mma_tflops) + ", bf16 " +
                           mma(ceilings.bf16_mma_tflops) + ", fp16 " + mma(ceilings.fp16_mma_tflops) + " TFLOP/s";
    if (!ceilings.mma_note.empty()) mma_line += " (" + ceilings.mma_note + ")";
    std::printf("%s\n", mma_line.c_str());
    if (gpu) {
      const bench::CublasStatusInfo& cublas = bench::cublas_status();
      if (cublas.loaded) std::printf("cuBLAS yardstick: %s (cuBLAS %s)\n", cublas.path.c_str(), cublas.version.c_str());
      else std::printf("cuBLAS yardstick: not loaded, the cuBLAS columns show -: %s\n", cublas.why_not.c_str());
    }
    if (ceilings_only) return 0;
    if (context.tune) {
      run_family("conv_tc_tune");
      return 0;
    }
    std::vector<bench::TimedRow> judged;  // conv_tc's bf16 rows, for issue 36's verdict (cublas_verdict.h)
    const std::vector<std::string> verdict_ops = bench::verdict_ops("bf16");
    std::printf("%-22s %-34s %10s %9s %6s %9s %6s %-4s %10s %7s  %-7s %8s %6s\n", "op", "shape", "ms", "GB/s", "%copy",
                "TFLOP/s", "%peak", "peak", "cuBLAS ms", "/cuBLAS", "plan", "pred ms", "/pred");
    for (const auto& [family, entry] : bench::entries()) {
      std::vector<bench::Result> results;
      entry(context, results);
      for (const bench::Result& r : results) {
        if (!context.filter.empty() && (family + " " + r.op + " " + r.shape).find(context.filter) == std::string::npos)
          continue;
        double gbs = r.bytes / r.ms / 1e6, tflops = r.flops / r.ms / 1e9;
        std::printf("%-22s %-34s %10.3f %9.1f %5.0f%% ", r.op.c_str(), r.shape.c_str(), r.ms, gbs,
                    100.0 * gbs / ceilings.copy_gbs);
        const double peak = ceilings.tflops(r.ceiling);
        if (r.flops > 0 && peak > 0) std::printf("%9.2f %5.0f%% %-4s ", tflops, 100.0 * tflops / peak, r.ceiling.c_str());
        else if (r.flops > 0) std::printf("%9.2f %6s %-4s ", tflops, "-", r.ceiling.c_str());
        else std::printf("%9s %6s %-4s ", "-", "-", "-");
        if (r.cublas_ms > 0) std::printf("%10.3f %7.2f", r.cublas_ms, r.ms / r.cublas_ms);
        else std::printf("%10s %7s", "-", "-");
        if (r.predicted_ms > 0) std::printf("  %-7s %8.3f %6.2f", r.plan.c_str(), r.predicted_ms, r.ms / r.predicted_ms);
        else if (!r.plan.empty()) std::printf("  %-7s %8s %6s", r.plan.c_str(), "-", "-");
        std::printf("\n");
        if (family == "conv_tc" && std::find(verdict_ops.begin(), verdict_ops.end(), r.op) != verdict_ops.end())
          judged.push_back({r.op, r.shape, r.ms, r.cublas_ms});
      }
      std::fflush(stdout);
    }
    if (!judged.empty())
      std::printf("%s%s\n", bench::judge_against_cublas(judged, "bf16").line.c_str(),
                  context.batch == 16 ? "" : (" (batch " + std::to_string(context.batch) + "; the targets are at 16)").c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: error: %s\n", e.what());
    return 1;
  }
}
