// Hopper's first wgmma kernels beside cuBLAS, in bf16 at YOLOv3-416's layers (batch 16):
//   gemm_wgmma  gemm_nt_wgmma (kernels/gemm_wgmma.h), both operands by TMA, at every 1x1 stride-1
//               layer as the GEMM its forward pass is: m = the batch's pixels, n = c_out,
//               k = c_in (op "gemm fwd bf16"); gemm_nn_wgmma (B MN-major) as its backward data
//               pass: m = pixels, n = c_in, k = c_out (op "gemm bwd data bf16"; c_out of 255
//               is not a multiple of 8: no row);
//   conv_wgmma  conv2d_forward_wgmma (kernels/conv_wgmma.h), A gathered by cp.async, at every
//               layer whose c_in is a multiple of 8 (all but the first; op "wgmma fwd bf16"),
//               and A by TMA's im2col mode where c_in is a multiple of 64 (op "wgmma fwd bf16
//               im2col": which A source the forward should take where both can);
//               conv2d_backward_data_wgmma at the layers whose c_out is a multiple of 64 (op
//               "wgmma bwd data bf16": m = the output's pixels, n = c_in, k = taps * c_out, the
//               forward's product; at stride 2 the kernel runs it as 4 parity classes; grad_out
//               gathered, and by TMA's im2col mode: op "wgmma bwd data bf16 im2col");
//               conv2d_backward_weights_wgmma where c_in and c_out are multiples of 8 (op "wgmma
//               bwd weights bf16": m = c_out, n = taps * c_in, k = pixels; FP32 out, as cuBLAS's;
//               the im2col rows gathered), and with them by TMA's im2col mode where c_in is a
//               multiple of 64 (op "wgmma bwd weights bf16 im2col").
// Each row's cuBLAS column times cublasGemmEx at the same GEMM (the im2col form for 3x3: a dense
// A, so cuBLAS times the product alone), in one run; `--filter "fwd bf16"` puts them beside the
// mma.sync convolutions' rows (conv_tc "conv fwd bf16") at the same layers. The % column is
// against the measured mma.sync ceiling: wgmma's own is higher (cuBLAS reached 790 TFLOP/s on
// the H200), so a row may pass 100%. Rows only where sm_90a code runs (one line says so elsewhere).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "kernels/conv_wgmma.h"
#include "kernels/gemm_wgmma.h"
#include "kernels/hopper.h"
#include "tools/bench.h"
#include "tools/bench_tc_layer.cuh"
#include "tools/cublas_loader.h"

namespace yolo::bench {
namespace {

constexpr const char* kGemmFamily = "gemm_wgmma";
constexpr const char* kGemmOp = "gemm fwd bf16";
constexpr const char* kGemmBackOp = "gemm bwd data bf16";
constexpr const char* kConvFamily = "conv_wgmma";
constexpr const char* kConvOp = "wgmma fwd bf16";
constexpr const char* kConvIm2colOp = "wgmma fwd bf16 im2col";
constexpr const char* kConvBackOp = "wgmma bwd data bf16";
constexpr const char* kConvBackIm2colOp = "wgmma bwd data bf16 im2col";
constexpr const char* kConvWeightsOp = "wgmma bwd weights bf16";
constexpr const char* kConvWeightsIm2colOp = "wgmma bwd weights bf16 im2col";

bool matches(const Context& context, const char* family, const char* op, const YoloConv& layer) {
  return context.filter.empty() ||
         (std::string(family) + " " + op + " " + layer.label).find(context.filter) != std::string::npos;
}
bool gemm_row(const Context& context, const YoloConv& layer) {
  return layer.k == 1 && layer.stride == 1 && matches(context, kGemmFamily, kGemmOp, layer);
}
bool gemm_back_row(const Context& context, const YoloConv& layer) {
  return layer.k == 1 && layer.stride == 1 && layer.c_out % 8 == 0 && matches(context, kGemmFamily, kGemmBackOp, layer);
}
bool conv_row(const Context& context, const YoloConv& layer) {
  return layer.c_in % 8 == 0 && matches(context, kConvFamily, kConvOp, layer);
}
bool conv_im2col_row(const Context& context, const YoloConv& layer) {
  return layer.c_in % 64 == 0 && matches(context, kConvFamily, kConvIm2colOp, layer);
}
bool conv_weights_row(const Context& context, const YoloConv& layer) {
  return layer.c_in % 8 == 0 && layer.c_out % 8 == 0 && matches(context, kConvFamily, kConvWeightsOp, layer);
}
bool conv_weights_im2col_row(const Context& context, const YoloConv& layer) {
  return layer.c_in % 64 == 0 && layer.c_out % 8 == 0 && matches(context, kConvFamily, kConvWeightsIm2colOp, layer);
}
bool conv_back_row(const Context& context, const YoloConv& layer, const char* op = kConvBackOp) {
  return layer.c_in % 8 == 0 && layer.c_out % 64 == 0 && matches(context, kConvFamily, op, layer);
}

#if defined(__CUDACC__)
#if YOLO_HAVE_CUBLAS
// cublasGemmEx of the row-major product `rm` in bf16 (cublas_loader.h's mapping).
void cublas_gemm(cublasHandle_t handle, const void* a, const void* b, void* c, const RowMajorGemm& rm, bool fp32_out) {
  const ColumnMajorGemm g = to_column_major(rm);
  const float alpha = 1.0f, beta = 0.0f;
  CHECKED(cublas().GemmEx(handle, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
                          g.m, g.n, g.k, &alpha, b, CUDA_R_16BF, g.ld_first, a, CUDA_R_16BF, g.ld_second, &beta, c,
                          fp32_out ? CUDA_R_32F : CUDA_R_16BF, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
#endif

// One layer's row: ours timed by `run`, cuBLAS at the same product `g` with fresh operands (C in
// FP32 where ours writes FP32: the weight gradient).
template <typename Run>
Result time_row(const Context& context, const char* op, const YoloConv& layer, double bytes, const RowMajorGemm& g,
                CublasHandle* handle, Run run, bool fp32_out = false) {
  const int m = g.m, n = g.n, k = g.k;
  Result r{op, layer.label, 0, bytes, 2.0 * double(m) * n * k};
  r.ceiling = "bf16";
  r.ms = time_ms(context, run);
#if YOLO_HAVE_CUBLAS
  if (handle) {
    const DeviceMemory a(context.device, size_t(m) * k * 2), b(context.device, size_t(n) * k * 2),
        c(context.device, size_t(m) * n * 4);
    fill_as<Bf16>(a, size_t(m) * k, 11, context.stream);
    fill_as<Bf16>(b, size_t(n) * k, 12, context.stream);
    r.cublas_ms = time_ms(context, [&] { cublas_gemm(handle->get(), a.data(), b.data(), c.data(), g, fp32_out); });
  }
#else
  (void)handle;
#endif
  return r;
}

void run_gpu(const Context& context, std::vector<Result>& out) {
  bool any = false;
  for (const YoloConv& layer : kYoloConvs)
    any = any || gemm_row(context, layer) || gemm_back_row(context, layer) || conv_row(context, layer) ||
          conv_im2col_row(context, layer) || conv_back_row(context, layer) || conv_weights_row(context, layer) ||
          conv_weights_im2col_row(context, layer) || conv_back_row(context, layer, kConvBackIm2colOp);
  if (!any) return;
  if (!current_device_runs_wgmma()) {
    std::printf("%s, %s: no rows: this device runs no sm_90a code (an H100 or H200, and ARCH with 90)\n", kGemmFamily,
                kConvFamily);
    return;
  }
  const cudaStream_t stream = context.stream;
  CublasHandle* handle = nullptr;
#if YOLO_HAVE_CUBLAS
  std::unique_ptr<CublasHandle> owner;
  if (cublas_status().loaded) owner = std::make_unique<CublasHandle>(stream);
  handle = owner.get();
#endif
  for (const YoloConv& layer : kYoloConvs) {
    const Conv2dShape s{context.batch, layer.h, layer.w, layer.c_in, layer.c_out, layer.k, layer.stride};
    const int pixels = s.n * s.out_h() * s.out_w(), taps = s.k * s.k * s.c_in;
    const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(pixels) * s.c_out;
    const DeviceMemory x(context.device, in_n * 2), w(context.device, s.weight_count() * 2),
        y(context.device, out_n * 2);
    fill_as<Bf16>(x, in_n, 1, stream);
    fill_as<Bf16>(w, s.weight_count(), 2, stream);
    const double bytes = 2.0 * double(in_n + s.weight_count() + out_n);
    const auto* xd = static_cast<const Bf16*>(x.data());
    const auto* wd = static_cast<const Bf16*>(w.data());
    auto* yd = static_cast<Bf16*>(y.data());
    if (gemm_row(context, layer))
      out.push_back(time_row(context, kGemmOp, layer, bytes, RowMajorGemm{pixels, s.c_out, s.c_in, false, true}, handle,
                             [&] { gemm_nt_wgmma(xd, wd, yd, pixels, s.c_out, s.c_in, stream); }));
    if (gemm_back_row(context, layer)) {  // dX[pixels][c_in] = dY[pixels][c_out] * W[c_out][c_in]: y holds dY
      auto* dx = const_cast<Bf16*>(xd);
      out.push_back(time_row(context, kGemmBackOp, layer, bytes, RowMajorGemm{pixels, s.c_in, s.c_out, false, false},
                             handle, [&] { gemm_nn_wgmma(yd, wd, dx, pixels, s.c_in, s.c_out, stream); }));
    }
    if (conv_row(context, layer)) {
      const NhwcView<const Bf16> in{xd, s.n, s.h, s.w, s.c_in, s.c_in};
      const NhwcView<Bf16> o{yd, s.n, s.out_h(), s.out_w(), s.c_out, s.c_out};
      out.push_back(time_row(context, kConvOp, layer, bytes, RowMajorGemm{pixels, s.c_out, taps, false, true}, handle,
                             [&] { conv2d_forward_wgmma(s, in, wd, nullptr, o, stream, {}, {}, WgmmaInput::Gather); }));
    }
    if (conv_im2col_row(context, layer)) {
      const NhwcView<const Bf16> in{xd, s.n, s.h, s.w, s.c_in, s.c_in};
      const NhwcView<Bf16> o{yd, s.n, s.out_h(), s.out_w(), s.c_out, s.c_out};
      out.push_back(time_row(context, kConvIm2colOp, layer, bytes, RowMajorGemm{pixels, s.c_out, taps, false, true},
                             handle,
                             [&] { conv2d_forward_wgmma(s, in, wd, nullptr, o, stream, {}, {}, WgmmaInput::Im2col); }));
    }
    // y holds grad_out, x receives grad_in. The gather's rows, then im2col's.
    for (const auto& [op, input] : {std::pair{kConvBackOp, WgmmaInput::Gather},
                                    std::pair{kConvBackIm2colOp, WgmmaInput::Im2col}}) {
      if (!conv_back_row(context, layer, op)) continue;
      const NhwcView<const Bf16> grad_out{yd, s.n, s.out_h(), s.out_w(), s.c_out, s.c_out};
      const NhwcView<Bf16> grad_in{const_cast<Bf16*>(xd), s.n, s.h, s.w, s.c_in, s.c_in};
      out.push_back(time_row(context, op, layer, bytes, RowMajorGemm{pixels, s.c_in, s.k * s.k * s.c_out, false, false},
                             handle, [&, input = input] {
                               conv2d_backward_data_wgmma(s, grad_out, wd, grad_in, false, stream, nullptr, 0, input);
                             }));
    }
    // x holds the input, y grad_out; FP32 gradient and partials. The gather's rows, then im2col's.
    for (const auto& [op, input] : {std::pair{kConvWeightsOp, WgmmaInput::Gather},
                                    std::pair{kConvWeightsIm2colOp, WgmmaInput::Im2col}}) {
      if (input == WgmmaInput::Gather ? !conv_weights_row(context, layer) : !conv_weights_im2col_row(context, layer))
        continue;
      const size_t workspace = conv2d_backward_weights_wgmma_workspace_bytes(s);
      const DeviceMemory dw(context.device, s.weight_count() * 4), ws(context.device, std::max<size_t>(workspace, 16));
      const NhwcView<const Bf16> in{xd, s.n, s.h, s.w, s.c_in, s.c_in};
      const NhwcView<const Bf16> grad_out{yd, s.n, s.out_h(), s.out_w(), s.c_out, s.c_out};
      out.push_back(time_row(
          context, op, layer, bytes, RowMajorGemm{s.c_out, taps, pixels, true, false}, handle,
          [&, input = input] {
            auto* grad = static_cast<float*>(dw.data());
            conv2d_backward_weights_wgmma(s, in, grad_out, grad, ws.data(), workspace, stream, {}, input);
          },
          true));
    }
  }
}
#endif

BENCH_ENTRY(kGemmFamily, [](const Context& context, std::vector<Result>& out) {
  if (!context.plans.empty() || context.tune || !context.device.is_cuda()) return;
#if defined(__CUDACC__)
  run_gpu(context, out);
#else
  (void)out;
#endif
});

}  // namespace
}  // namespace yolo::bench
