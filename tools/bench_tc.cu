// conv_tc: the convolutions on tensor cores (conv2d_*_tc, kernels/conv_tc.cu) at every distinct
// 3x3 and 1x1 layer of YOLOv3-416 (models/yolov3.cfg), each pass (fwd, bwd data, bwd weights),
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
// On the CPU there are no rows (one line says so).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/conv.h"
#include "kernels/half_types.h"
#include "kernels/precision.h"
#include "runtime/memory.h"
#include "tools/bench.h"
#include "tools/cublas_loader.h"

namespace yolo::bench {
namespace {

constexpr const char* kFamily = "conv_tc";

struct TcLayer {
  const char* label;  // as bench_conv.cu writes shapes
  int h, w, c_in, c_out, k, stride;
  bool bias;  // the detection heads (no batchnorm) have a bias; the others none
};

// Every distinct [convolutional] of models/yolov3.cfg at 416x416, in the order they first
// appear (how many layers share the shape, and GFLOP per pass at batch 16, in the comments).
const TcLayer kTcLayers[] = {
    {"416x416 3->32 3x3 s1", 416, 416, 3, 32, 3, 1, false},          // x1   4.8
    {"416->208 32->64 3x3 s2", 416, 416, 32, 64, 3, 2, false},       // x1  25.5
    {"208x208 64->32 1x1 s1", 208, 208, 64, 32, 1, 1, false},        // x1   2.8
    {"208x208 32->64 3x3 s1", 208, 208, 32, 64, 3, 1, false},        // x1  25.5
    {"208->104 64->128 3x3 s2", 208, 208, 64, 128, 3, 2, false},     // x1  25.5
    {"104x104 128->64 1x1 s1", 104, 104, 128, 64, 1, 1, false},      // x2   2.8
    {"104x104 64->128 3x3 s1", 104, 104, 64, 128, 3, 1, false},      // x2  25.5
    {"104->52 128->256 3x3 s2", 104, 104, 128, 256, 3, 2, false},    // x1  25.5
    {"52x52 256->128 1x1 s1", 52, 52, 256, 128, 1, 1, false},        // x10  2.8
    {"52x52 128->256 3x3 s1", 52, 52, 128, 256, 3, 1, false},        // x11 25.5
    {"52->26 256->512 3x3 s2", 52, 52, 256, 512, 3, 2, false},       // x1  25.5
    {"26x26 512->256 1x1 s1", 26, 26, 512, 256, 1, 1, false},        // x10  2.8
    {"26x26 256->512 3x3 s1", 26, 26, 256, 512, 3, 1, false},        // x11 25.5
    {"26->13 512->1024 3x3 s2", 26, 26, 512, 1024, 3, 2, false},     // x1  25.5
    {"13x13 1024->512 1x1 s1", 13, 13, 1024, 512, 1, 1, false},      // x7   2.8
    {"13x13 512->1024 3x3 s1", 13, 13, 512, 1024, 3, 1, false},      // x7  25.5
    {"13x13 1024->255 1x1 s1", 13, 13, 1024, 255, 1, 1, true},       // x1   1.4 (head)
    {"13x13 512->256 1x1 s1", 13, 13, 512, 256, 1, 1, false},        // x1   0.7
    {"26x26 768->256 1x1 s1", 26, 26, 768, 256, 1, 1, false},        // x1   4.3
    {"26x26 512->255 1x1 s1", 26, 26, 512, 255, 1, 1, true},         // x1   2.8 (head)
    {"26x26 256->128 1x1 s1", 26, 26, 256, 128, 1, 1, false},        // x1   0.7
    {"52x52 384->128 1x1 s1", 52, 52, 384, 128, 1, 1, false},        // x1   4.3
    {"52x52 256->255 1x1 s1", 52, 52, 256, 255, 1, 1, true},         // x1   5.6 (head)
};

enum class Pass { Forward, BackwardData, BackwardWeights };
constexpr Pass kPasses[] = {Pass::Forward, Pass::BackwardData, Pass::BackwardWeights};
constexpr Precision kPrecisions[] = {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16};

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::Forward: return "conv fwd";
    case Pass::BackwardData: return "conv bwd data";
    case Pass::BackwardWeights: return "conv bwd weights";
  }
  return "?";
}

std::string op_name(Pass pass, Precision p) { return std::string(pass_name(pass)) + " " + precision_name(p); }

// The filter as bench_kernels applies it to the rows (family, op and shape), so entries skip
// the work of rows it would hide.
bool wanted(const Context& context, Pass pass, Precision p, const TcLayer& layer) {
  return context.filter.empty() ||
         (std::string(kFamily) + " " + op_name(pass, p) + " " + layer.label).find(context.filter) != std::string::npos;
}
bool any_wanted(const Context& context, Precision p) {
  for (const TcLayer& layer : kTcLayers)
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

size_t element_bytes(Precision p) { return p == Precision::Bf16 || p == Precision::Fp16 ? 2 : 4; }

// Pseudo-random values in [-1, 1) (a hash of the index and seed), stored as T.
template <typename T>
__global__ void fill_random(T* data, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = ((uint32_t(i) ^ (uint32_t(i >> 32) * 0x27d4eb2fu)) * 0x9e3779b1u) ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    data[i] = from_float<T>(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

template <typename T>
void fill_as(const DeviceMemory& m, size_t count, uint32_t seed, cudaStream_t stream) {
  if (count == 0) return;
  const size_t max_count = m.size() / sizeof(T);
  if (count > max_count) throw Error("conv_tc: buffer of " + std::to_string(m.size()) + " bytes is too small");
  const unsigned blocks = unsigned(std::min<size_t>((count + 255) / 256, 4096));
  LAUNCH(fill_random<T>, dim3(blocks), dim3(256), 0, stream, static_cast<T*>(m.data()), count, seed);
}

void fill_precision(Precision p, const DeviceMemory& m, size_t count, uint32_t seed, cudaStream_t stream) {
  if (p == Precision::Bf16) fill_as<Bf16>(m, count, seed, stream);
  else if (p == Precision::Fp16) fill_as<Fp16>(m, count, seed, stream);
  else fill_as<float>(m, count, seed, stream);
}

// One layer's device buffers, each large enough for FP32 elements (every precision reuses them).
struct LayerBuffers {
  DeviceMemory in, weights, bias, out, grad_out, grad_in, grad_weights, grad_bias, workspace;
  DeviceMemory gemm_a, gemm_b, gemm_c;  // the cuBLAS yardstick's operands (empty without cuBLAS)
};

DeviceMemory floats(Device device, size_t count) { return DeviceMemory(device, std::max<size_t>(count, 1) * 4); }

template <typename T>
const T* cp(const DeviceMemory& m) {
  return static_cast<const T*>(m.data());
}
template <typename T>
T* mp(const DeviceMemory& m) {
  return static_cast<T*>(m.data());
}

// Our kernel for one pass: the tensor-core version in T's precision.
template <typename T>
void run_tc(Pass pass, const Conv2dShape& s, const TcLayer& layer, const LayerBuffers& b, cudaStream_t stream) {
  const NhwcView<const T> in = nhwc<const T>(cp<T>(b.in), s.n, s.h, s.w, s.c_in);
  const NhwcView<const T> grad_out = nhwc<const T>(cp<T>(b.grad_out), s.n, s.out_h(), s.out_w(), s.c_out);
  switch (pass) {
    case Pass::Forward:
      conv2d_forward_tc<T>(s, in, cp<T>(b.weights), layer.bias ? cp<float>(b.bias) : nullptr,
                           nhwc<T>(mp<T>(b.out), s.n, s.out_h(), s.out_w(), s.c_out), b.workspace.data(),
                           b.workspace.size(), stream);
      return;
    case Pass::BackwardData:
      conv2d_backward_data_tc<T>(s, grad_out, cp<T>(b.weights), nhwc<T>(mp<T>(b.grad_in), s.n, s.h, s.w, s.c_in),
                                 false, b.workspace.data(), b.workspace.size(), stream);
      return;
    case Pass::BackwardWeights:
      conv2d_backward_weights_tc<T>(s, in, grad_out, mp<float>(b.grad_weights),
                                    layer.bias ? mp<float>(b.grad_bias) : nullptr, b.workspace.data(),
                                    b.workspace.size(), stream);
      return;
  }
}

// The FP32 CUDA-core kernels (kernels/conv.cu) for the fp32 rows.
void run_fp32(Pass pass, const Conv2dShape& s, const TcLayer& layer, const LayerBuffers& b, cudaStream_t stream) {
  const ConstAct in = nhwc<const float>(cp<float>(b.in), s.n, s.h, s.w, s.c_in);
  const ConstAct grad_out = nhwc<const float>(cp<float>(b.grad_out), s.n, s.out_h(), s.out_w(), s.c_out);
  switch (pass) {
    case Pass::Forward:
      conv2d_forward_cuda(s, in, cp<float>(b.weights), layer.bias ? cp<float>(b.bias) : nullptr,
                          nhwc(mp<float>(b.out), s.n, s.out_h(), s.out_w(), s.c_out), b.workspace.data(),
                          b.workspace.size(), stream);
      return;
    case Pass::BackwardData:
      conv2d_backward_data_cuda(s, grad_out, cp<float>(b.weights), nhwc(mp<float>(b.grad_in), s.n, s.h, s.w, s.c_in),
                                false, b.workspace.data(), b.workspace.size(), stream);
      return;
    case Pass::BackwardWeights:
      conv2d_backward_weights_cuda(s, in, grad_out, mp<float>(b.grad_weights),
                                   layer.bias ? mp<float>(b.grad_bias) : nullptr, b.workspace.data(),
                                   b.workspace.size(), stream);
      return;
  }
}

void run_ours(Precision p, Pass pass, const Conv2dShape& s, const TcLayer& layer, const LayerBuffers& b,
              cudaStream_t stream) {
  switch (p) {
    case Precision::Fp32: return run_fp32(pass, s, layer, b, stream);
    case Precision::Tf32: return run_tc<float>(pass, s, layer, b, stream);
    case Precision::Bf16: return run_tc<Bf16>(pass, s, layer, b, stream);
    case Precision::Fp16: return run_tc<Fp16>(pass, s, layer, b, stream);
  }
}

// Minimum bytes: each input read once, each output written once, in the pass's storage types.
double pass_bytes(Precision p, Pass pass, const Conv2dShape& s, bool bias) {
  const double e = double(element_bytes(p));
  const double in_n = double(s.n) * s.h * s.w * s.c_in, out_n = double(s.n) * s.out_h() * s.out_w() * s.c_out;
  const double w_n = double(s.weight_count()), b_n = bias ? double(s.c_out) : 0.0;
  switch (pass) {
    case Pass::Forward: return e * (in_n + w_n + out_n) + 4.0 * b_n;
    case Pass::BackwardData: return e * (out_n + w_n + in_n);
    case Pass::BackwardWeights: return e * (in_n + out_n) + 4.0 * (w_n + b_n);
  }
  return 0;
}

#if YOLO_HAVE_CUBLAS
// One cuBLAS handle on the benchmark's stream, for one run of the entry.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    const CublasApi& api = cublas();
    CHECKED(api.Create(&handle_));
    try {
      CHECKED(api.SetStream(handle_, stream));
      // Tensor cores where the compute type allows them (never TF32 for CUBLAS_COMPUTE_32F), and
      // 16-bit outputs' split-K reductions in FP32, as ours are.
      CHECKED(api.SetMathMode(handle_, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    } catch (...) {
      api.Destroy(handle_);
      throw;
    }
  }
  ~CublasHandle() {
    const cublasStatus_t status = cublas().Destroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "conv_tc: cublasDestroy failed (status %d)\n", int(status));
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

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

  for (const TcLayer& layer : kTcLayers) {
    bool layer_wanted = false;
    for (Precision p : precisions)
      for (Pass pass : kPasses) layer_wanted = layer_wanted || wanted(context, pass, p, layer);
    if (!layer_wanted) continue;
    const Conv2dShape s{context.batch, layer.h, layer.w, layer.c_in, layer.c_out, layer.k, layer.stride};
    const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const size_t w_n = s.weight_count(), b_n = size_t(s.c_out);
    LayerBuffers buf;
    const Device device = context.device;
    buf.in = floats(device, in_n);
    buf.weights = floats(device, w_n);
    buf.bias = floats(device, b_n);
    buf.out = floats(device, out_n);
    buf.grad_out = floats(device, out_n);
    buf.grad_in = floats(device, in_n);
    buf.grad_weights = floats(device, w_n);
    buf.grad_bias = floats(device, b_n);
    size_t ws = std::max({size_t(256), conv2d_forward_workspace_bytes(s), conv2d_backward_data_workspace_bytes(s),
                          conv2d_backward_weights_workspace_bytes(s)});
    ws = std::max({ws, conv2d_forward_tc_workspace_bytes<float>(s), conv2d_backward_data_tc_workspace_bytes<float>(s),
                   conv2d_backward_weights_tc_workspace_bytes<float>(s)});
    ws = std::max({ws, conv2d_forward_tc_workspace_bytes<Bf16>(s), conv2d_backward_data_tc_workspace_bytes<Bf16>(s),
                   conv2d_backward_weights_tc_workspace_bytes<Bf16>(s)});
    ws = std::max({ws, conv2d_forward_tc_workspace_bytes<Fp16>(s), conv2d_backward_data_tc_workspace_bytes<Fp16>(s),
                   conv2d_backward_weights_tc_workspace_bytes<Fp16>(s)});
    buf.workspace = DeviceMemory(device, ws);
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
      }
    }
    for (const std::vector<Result>& pass_rows : rows) out.insert(out.end(), pass_rows.begin(), pass_rows.end());
  }
}

#endif  // __CUDACC__

BENCH_ENTRY(kFamily, [](const Context& context, std::vector<Result>& out) {
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
