// gemm_wgmma: Hopper's first wgmma kernel (gemm_nt_wgmma, kernels/gemm_wgmma.h) at every 1x1,
// stride-1 layer of YOLOv3-416 (tools/yolov3_convs.h) as the GEMM its forward pass is: m = the
// batch's pixels, n = c_out, k = c_in, BF16 in and out, FP32 accumulation. Its cuBLAS column
// times cublasGemmEx at the same GEMM in one run; `--filter "fwd bf16"` puts these rows beside
// the mma.sync convolutions' (conv_tc) at the same layers. The % column is against the measured
// mma.sync ceiling: wgmma's own is higher (cuBLAS reached 790 TFLOP/s on the H200), so a row may
// pass 100%. Rows only where sm_90a code runs (one line says so elsewhere).
#include <cstdio>
#include <memory>
#include <string>

#include "kernels/gemm_wgmma.h"
#include "kernels/hopper.h"
#include "tools/bench.h"
#include "tools/bench_tc_layer.cuh"
#include "tools/cublas_loader.h"

namespace yolo::bench {
namespace {

constexpr const char* kFamily = "gemm_wgmma";
constexpr const char* kOp = "gemm fwd bf16";

bool wanted(const Context& context, const YoloConv& layer) {
  return layer.k == 1 && layer.stride == 1 &&
         (context.filter.empty() ||
          (std::string(kFamily) + " " + kOp + " " + layer.label).find(context.filter) != std::string::npos);
}

#if defined(__CUDACC__)
void run_gpu(const Context& context, std::vector<Result>& out) {
  bool any = false;
  for (const YoloConv& layer : kYoloConvs) any = any || wanted(context, layer);
  if (!any) return;
  if (!current_device_runs_wgmma()) {
    std::printf("%s: no rows: this device runs no sm_90a code (an H100 or H200, and ARCH with 90)\n", kFamily);
    return;
  }
  const cudaStream_t stream = context.stream;
#if YOLO_HAVE_CUBLAS
  std::unique_ptr<CublasHandle> handle;
  if (cublas_status().loaded) handle = std::make_unique<CublasHandle>(stream);
#endif
  for (const YoloConv& layer : kYoloConvs) {
    if (!wanted(context, layer)) continue;
    const int m = context.batch * layer.h * layer.w, n = layer.c_out, k = layer.c_in;
    const DeviceMemory a(context.device, size_t(m) * k * 2), b(context.device, size_t(n) * k * 2),
        c(context.device, size_t(m) * n * 2);
    fill_as<Bf16>(a, size_t(m) * k, 1, stream);
    fill_as<Bf16>(b, size_t(n) * k, 2, stream);
    Result r{kOp, layer.label, 0, 2.0 * (double(m) * k + double(n) * k + double(m) * n), 2.0 * m * n * k};
    r.ceiling = "bf16";
    const auto* a_data = static_cast<const Bf16*>(a.data());
    const auto* b_data = static_cast<const Bf16*>(b.data());
    r.ms = time_ms(context, [&] { gemm_nt_wgmma(a_data, b_data, static_cast<Bf16*>(c.data()), m, n, k, stream); });
#if YOLO_HAVE_CUBLAS
    if (handle) {
      // Row-major C[m][n] = A[m][k] * B[n][k]^T, as cuBLAS's column-major call (cublas_loader.h).
      const ColumnMajorGemm g = to_column_major(RowMajorGemm{m, n, k, false, true});
      const float alpha = 1.0f, beta = 0.0f;
      r.cublas_ms = time_ms(context, [&] {
        CHECKED(cublas().GemmEx(handle->get(), g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                                g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &alpha, b.data(), CUDA_R_16BF,
                                g.ld_first, a.data(), CUDA_R_16BF, g.ld_second, &beta, c.data(), CUDA_R_16BF, g.ldc,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
    }
#endif
    out.push_back(r);
  }
}
#endif

BENCH_ENTRY(kFamily, [](const Context& context, std::vector<Result>& out) {
  if (!context.plans.empty() || context.tune || !context.device.is_cuda()) return;
#if defined(__CUDACC__)
  run_gpu(context, out);
#else
  (void)out;
#endif
});

}  // namespace
}  // namespace yolo::bench
