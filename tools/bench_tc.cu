// conv_tc: the convolutions on tensor cores (conv2d_*_tc, kernels/conv_tc.cu) at every distinct
// 3x3 and 1x1 layer of YOLOv3-416 (tools/yolov3_convs.h; the heads with 255 and 24 filters), each pass (fwd, bwd data, bwd weights),
// each precision the device runs, next to the FP32 CUDA-core kernels (conv2d_*_cuda) at the
// same shape. Shapes are labelled as in bench_conv.cu, so `--filter "52x52 128->256 3x3 s1"`
// lists one layer's rows from both files; `--filter conv_tc` runs only these, `--filter bf16`
// one precision.
//
// Each row's %peak is against its precision's measured ceiling (mma.sync for tf32, bf16, fp16;
// the FMA ceiling for fp32; bench.h) and its cuBLAS columns time cublasGemmEx (cuBLAS loaded at
// run time: tools/cublas_loader.h) at the GEMM the pass amounts to, in the same precision:
//   tf32: FP32 A, B, C with CUBLAS_COMPUTE_32F_FAST_TF32;  fp32: the same with CUBLAS_COMPUTE_32F;
//   bf16, fp16: CUDA_R_16BF / CUDA_R_16F A and B with CUBLAS_COMPUTE_32F; C in the pass's
//   output type: 16-bit for fwd and bwd data, FP32 for bwd weights (as conv2d_*_tc store them).
// The GEMMs, row-major, with P = n * out_h * out_w pixels and kk = k * k (the im2col forms, so
// the operand A is a dense im2col matrix, not the activation: cuBLAS times the product alone;
// each has exactly the pass's 2 * P * kk * c_in * c_out flops, stride 2 included):
//   fwd          C[P][c_out]      = A[P][kk c_in] * W[c_out][kk c_in]^T      (m, n, k) = (P, c_out, kk c_in)
//   bwd data     C[P][c_in]       = A[P][kk c_out] * W[kk c_out][c_in]       (P, c_in, kk c_out)
//   bwd weights  C[c_out][kk c_in] = dOut[P][c_out]^T * A[P][kk c_in]         (c_out, kk c_in, P)
// mapped to cuBLAS's column-major call by to_column_major (cublas_loader.h, where the mapping is
// written out). The operands hold pseudo-random values in [-1, 1) of the row's type (not zeros:
// the tensor cores' power, and so the clocks, depend on the data).
// With --normalized, rows ending "+bn": the same forward or weight gradient reading its input through BatchNorm's
// apply (kernels/conv.h, NormalizedInput: what the trainer does for a BatchNorm read by
// convolutions alone), beside the plain row, for the loads' transform's cost; their cuBLAS
// column is the plain GEMM's.
// On the CPU there are no rows (one line says so).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tools/bench.h"
#include "tools/bench_tc_layer.cuh"
#include "tools/cublas_loader.h"

namespace yolo::bench {
namespace {

constexpr const char* kFamily = "conv_tc";

constexpr Precision kPrecisions[] = {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16};

// The filter as bench_kernels applies it to the rows (family, op and shape), so entries skip
// the work of rows it would hide.
bool wanted(const Context& context, Pass pass, Precision p, const YoloConv& layer) {
  return context.filter.empty() ||
         (std::string(kFamily) + " " + op_name(pass, p) + " " + layer.label).find(context.filter) != std::string::npos;
}
bool any_wanted(const Context& context, Precision p) {
  for (const YoloConv& layer : kYoloConvs)
    for (Pass pass : kPasses)
      if (wanted(context, pass, p, layer)) return true;
  return false;
}

#if defined(__CUDACC__)

// The pass as a dense row-major GEMM (see the top of the file).
RowMajorGemm gemm_of(const Conv2dShape& s, Pass pass) {
  const int pixels = s.n * s.out_h() * s.out_w(), kk = s.k * s.k;
  switch (pass) {
    case Pass::Forward: return RowMajorGemm{pixels, s.c_out, kk * s.c_in, false, true};
    case Pass::BackwardData: return RowMajorGemm{pixels, s.c_in, kk * s.c_out, false, false};
    case Pass::BackwardWeights: return RowMajorGemm{s.c_out, kk * s.c_in, pixels, true, false};
  }
  return RowMajorGemm{};
}

#if YOLO_HAVE_CUBLAS
// cublasGemmEx at the pass's GEMM in precision p; a, b, c hold the row-major A, B and C.
void run_cublas(cublasHandle_t handle, Precision p, Pass pass, const Conv2dShape& s, const LayerBuffers& buf) {
  const cudaDataType in_type = p == Precision::Bf16 ? CUDA_R_16BF : p == Precision::Fp16 ? CUDA_R_16F : CUDA_R_32F;
  const cudaDataType out_type = pass == Pass::BackwardWeights ? CUDA_R_32F : in_type;
  const cublasComputeType_t compute = p == Precision::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const ColumnMajorGemm g = to_column_major(gemm_of(s, pass));
  const float alpha = 1.0f, beta = 0.0f;  // host scalars in the compute type (CUBLAS_POINTER_MODE_HOST)
  CHECKED(cublas().GemmEx(handle, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
                          g.m, g.n, g.k, &alpha, buf.gemm_b.data(), in_type, g.ld_first, buf.gemm_a.data(), in_type,
                          g.ld_second, &beta, buf.gemm_c.data(), out_type, g.ldc, compute, CUBLAS_GEMM_DEFAULT));
}
#endif

void run_gpu(const Context& context, std::vector<Result>& out) {
  const cudaStream_t stream = context.stream;
  // The precisions this device runs; one line for each it cannot (when its rows are wanted).
  const int cc = current_compute_capability();
  std::vector<Precision> precisions;
  for (Precision p : kPrecisions) {
    if (!any_wanted(context, p)) continue;
    if (cc >= min_compute_capability(p)) precisions.push_back(p);  // what require_precision accepts
    else
      std::printf("%s: no %s rows: %s needs tensor cores of sm_%d or newer, this GPU is sm_%d\n", kFamily,
                  precision_name(p), precision_name(p), min_compute_capability(p), cc);
  }
  if (precisions.empty()) return;

  // The cuBLAS yardstick, when it loads (bench_kernels' header says why when it does not).
#if YOLO_HAVE_CUBLAS
  std::unique_ptr<CublasHandle> handle;
  if (cublas_status().loaded) {
    try {
      handle = std::make_unique<CublasHandle>(stream);
    } catch (const Error& e) {
      std::printf("%s: cuBLAS loaded but unusable, the cuBLAS columns show -: %s\n", kFamily, e.what());
    }
  }
#endif

  for (const YoloConv& layer : kYoloConvs) {
    bool layer_wanted = false;
    for (Precision p : precisions)
      for (Pass pass : kPasses) layer_wanted = layer_wanted || wanted(context, pass, p, layer);
    if (!layer_wanted) continue;
    const Conv2dShape s{context.batch, layer.h, layer.w, layer.c_in, layer.c_out, layer.k, layer.stride};
    const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const size_t w_n = s.weight_count(), b_n = size_t(s.c_out);
    const Device device = context.device;
    LayerBuffers buf = layer_buffers(device, s, layer_workspace_bytes(s));
    bool yardstick = false;
#if YOLO_HAVE_CUBLAS
    yardstick = handle != nullptr;
#endif
    size_t a_n = 0, b_count = 0, c_n = 0;  // the largest A, B, C of the three passes' GEMMs
    for (Pass pass : kPasses) {
      const RowMajorGemm g = gemm_of(s, pass);
      a_n = std::max(a_n, size_t(g.m) * size_t(g.k));
      b_count = std::max(b_count, size_t(g.k) * size_t(g.n));
      c_n = std::max(c_n, size_t(g.m) * size_t(g.n));
    }
    if (yardstick) {  // C is only written (beta = 0), as every pass's output is
      buf.gemm_a = floats(device, a_n);
      buf.gemm_b = floats(device, b_count);
      buf.gemm_c = floats(device, c_n);
    }
    fill_as<float>(buf.bias, b_n, 5, stream);

    // rows[pass][precision], pushed pass by pass so a layer's precisions stand side by side.
    std::vector<Result> rows[3];
    for (Precision p : precisions) {
      bool filled = false;
      for (Pass pass : kPasses) {
        if (!wanted(context, pass, p, layer)) continue;
        if (!filled) {  // the inputs in this precision's storage type
          fill_precision(p, buf.in, in_n, 1, stream);
          fill_precision(p, buf.weights, w_n, 2, stream);
          fill_precision(p, buf.grad_out, out_n, 3, stream);
          if (yardstick) {
            fill_precision(p, buf.gemm_a, a_n, 12, stream);
            fill_precision(p, buf.gemm_b, b_count, 13, stream);
          }
          filled = true;
        }
        Result r{op_name(pass, p), layer.label, 0, pass_bytes(p, pass, s, layer.bias),
                 2.0 * double(out_n) * s.k * s.k * s.c_in};
        r.ceiling = precision_name(p);
        if (p != Precision::Fp32 && pass != Pass::BackwardData && conv2d_tc_small_channels(s)) {
          r.plan = "small";  // CUDA cores (kernels/conv_small_c.h): no plan, no prediction
        } else if (p != Precision::Fp32) {
          const tc::TcProblem problem = conv2d_tc_problem(s, tc_pass(pass), p);
          const tc::TcPlan plan = tc::choose_plan(problem, tc::current_gpu());
          r.plan = tc::plan_code(plan);
          r.predicted_ms = tc::predict(problem, plan, tc::current_gpu()).total_us / 1000;
        }
        r.ms = time_ms(context, [&] { run_ours(p, pass, s, layer, buf, stream); });
#if YOLO_HAVE_CUBLAS
        if (yardstick) {
          try {
            r.cublas_ms = time_ms(context, [&] { run_cublas(handle->get(), p, pass, s, buf); });
          } catch (const Error& e) {
            std::printf("%s: cuBLAS yardstick failed for %s %s: %s\n", kFamily, r.op.c_str(), layer.label, e.what());
            r.cublas_ms = 0;
          }
        }
#endif
        rows[int(pass)].push_back(r);
        if (context.normalized && p != Precision::Fp32 && pass != Pass::BackwardData && !conv2d_tc_small_channels(s)) {
          Result normalized = r;
          normalized.op += " +bn";
          fill_as<float>(buf.norm_table, 4 * size_t(s.c_in), 14, stream);
          normalized.ms = time_ms(context, [&] { run_ours(p, pass, s, layer, buf, stream, true); });
          rows[int(pass)].push_back(normalized);
        }
      }
    }
    for (const std::vector<Result>& pass_rows : rows) out.insert(out.end(), pass_rows.begin(), pass_rows.end());
  }
}

#endif  // __CUDACC__

// --plans DEVICE: the planner's choice and predicted time, with their parts, for every pass at
// the context's batch, in the device's default 16-bit precision (fp16 on sm_75, else bf16) and in
// tf32 where it has one; a device description (t4, a100, l4, h200, b200, rtx5090; h200-mma: an H200
// whose build has no sm_90a code, mma.sync alone) or this machine's GPU ("this"). Each precision ends with the sum
// of the predicted times.
tc::GpuDesc gpu_by_name(const std::string& name) {
  if (name == "t4") return tc::gpu_t4();
  if (name == "a100") return tc::gpu_a100();
  if (name == "l4") return tc::gpu_l4();
  if (name == "h200") return tc::gpu_h200();
  if (name == "b200") return tc::gpu_b200();
  if (name == "rtx5090") return tc::gpu_rtx5090();
  if (name == "h200-mma") {
    tc::GpuDesc gpu = tc::gpu_h200();
    gpu.name = "H200 without sm_90a code", gpu.wgmma = false;
    return gpu;
  }
  if (name == "this") {
    const GpuDiscovery& found = discover_gpus();
    if (found.gpus.empty()) throw Error("--plans this: no GPU here (" + found.why_no_gpu + "); name t4, a100, l4, h200, b200 or rtx5090");
    return tc::current_gpu();
  }
  throw Error("--plans: unknown device '" + name + "' (t4, a100, l4, h200, h200-mma, b200, rtx5090, or this for this machine's GPU)");
}

void print_plans(const tc::GpuDesc& gpu, int batch, const std::string& filter) {
  std::printf("tensor-core plans for %s (sm_%d, %d SMs, %d KiB shared memory per SM; rates %s), batch %d\n",
              gpu.name.c_str(), gpu.cc, gpu.sms, gpu.smem_per_sm / 1024,
              gpu.rates_measured ? "measured on an H200" : "predicted from the datasheet", batch);
  const Precision sixteen = gpu.cc < 80 ? Precision::Fp16 : Precision::Bf16;
  for (Precision p : {sixteen, Precision::Tf32}) {
    if (min_compute_capability(p) > gpu.cc) continue;
    double sum_us = 0;
    int rows = 0;
    for (const YoloConv& layer : kYoloConvs)
      for (tc::TcPass pass : {tc::TcPass::Forward, tc::TcPass::BackwardData, tc::TcPass::BackwardWeights}) {
        const std::string row = std::string(precision_name(p)) + " " + tc::pass_name(pass) + " " + layer.label;
        if (!filter.empty() && row.find(filter) == std::string::npos) continue;
        const Conv2dShape s{batch, layer.h, layer.w, layer.c_in, layer.c_out, layer.k, layer.stride};
        if (pass != tc::TcPass::BackwardData && conv2d_tc_small_channels(s)) {
          std::printf("%-42s %-7s CUDA cores: an input of %d channels (kernels/conv_small_c.h)\n", row.c_str(), "small",
                      s.c_in);
          continue;
        }
        const tc::TcProblem problem = conv2d_tc_problem(s, pass, p);
        const tc::TcPlan plan = tc::choose_plan(problem, gpu);
        const tc::TcPrediction prediction = tc::predict(problem, plan, gpu);
        sum_us += prediction.total_us, ++rows;
        std::printf("%-42s %-7s %s\n", row.c_str(), tc::plan_code(plan).c_str(),
                    tc::describe(plan, prediction).c_str());
      }
    std::printf("%s: %d tensor-core rows, predicted sum %.0f us\n", precision_name(p), rows, sum_us);
  }
}

BENCH_ENTRY(kFamily, [](const Context& context, std::vector<Result>& out) {
  if (!context.plans.empty()) return print_plans(gpu_by_name(context.plans), context.batch, context.filter);
  if (context.tune) return;  // tools/bench_tc_tune.cu's turn
  bool any = false;
  for (Precision p : kPrecisions) any = any || any_wanted(context, p);
  if (!any) return;
  if (!context.device.is_cuda()) {
    std::printf("%s: the tensor-core convolutions and their cuBLAS yardstick need a GPU: no rows\n", kFamily);
    return;
  }
#if defined(__CUDACC__)
  run_gpu(context, out);
#else
  (void)out;
#endif
});

}  // namespace
}  // namespace yolo::bench
