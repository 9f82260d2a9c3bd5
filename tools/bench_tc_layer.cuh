// The tensor-core convolution benchmarks' shared pieces (tools/bench_tc.cu: the conv_tc rows;
// tools/bench_tc_tune.cu: every candidate plan per row): the passes, one layer's device buffers,
// random fills in each precision's storage type, and our kernel for a pass and precision.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/conv.h"
#include "kernels/half_types.h"
#include "kernels/precision.h"
#include "runtime/memory.h"
#include "tools/yolov3_convs.h"

namespace yolo::bench {
namespace {

enum class Pass { Forward, BackwardData, BackwardWeights };
constexpr Pass kPasses[] = {Pass::Forward, Pass::BackwardData, Pass::BackwardWeights};

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::Forward: return "conv fwd";
    case Pass::BackwardData: return "conv bwd data";
    case Pass::BackwardWeights: return "conv bwd weights";
  }
  return "?";
}

std::string op_name(Pass pass, Precision p) { return std::string(pass_name(pass)) + " " + precision_name(p); }

tc::TcPass tc_pass(Pass pass) {
  switch (pass) {
    case Pass::Forward: return tc::TcPass::Forward;
    case Pass::BackwardData: return tc::TcPass::BackwardData;
    case Pass::BackwardWeights: return tc::TcPass::BackwardWeights;
  }
  return tc::TcPass::Gemm;
}

#if defined(__CUDACC__)

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
  DeviceMemory norm_table;  // a NormalizedInput's table for `in` (kernels/conv.h), random values
  DeviceMemory gemm_a, gemm_b, gemm_c;  // the cuBLAS yardstick's operands (empty without cuBLAS)
};

DeviceMemory floats(Device device, size_t count) { return DeviceMemory(device, std::max<size_t>(count, 1) * 4); }

// The workspace every pass of every precision needs at its automatic plan.
size_t layer_workspace_bytes(const Conv2dShape& s) {
  size_t ws = std::max({size_t(256), conv2d_forward_workspace_bytes(s), conv2d_backward_data_workspace_bytes(s),
                        conv2d_backward_weights_workspace_bytes(s)});
  ws = std::max({ws, conv2d_forward_tc_workspace_bytes<float>(s), conv2d_backward_data_tc_workspace_bytes<float>(s),
                 conv2d_backward_weights_tc_workspace_bytes<float>(s)});
  ws = std::max({ws, conv2d_forward_tc_workspace_bytes<Bf16>(s), conv2d_backward_data_tc_workspace_bytes<Bf16>(s),
                 conv2d_backward_weights_tc_workspace_bytes<Bf16>(s)});
  return std::max({ws, conv2d_forward_tc_workspace_bytes<Fp16>(s), conv2d_backward_data_tc_workspace_bytes<Fp16>(s),
                   conv2d_backward_weights_tc_workspace_bytes<Fp16>(s)});
}

// The layer's activations, weights and gradients (not the cuBLAS operands), and `workspace` bytes.
LayerBuffers layer_buffers(Device device, const Conv2dShape& s, size_t workspace) {
  const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
  const size_t w_n = s.weight_count(), b_n = size_t(s.c_out);
  LayerBuffers buf;
  buf.in = floats(device, in_n);
  buf.weights = floats(device, w_n);
  buf.bias = floats(device, b_n);
  buf.out = floats(device, out_n);
  buf.grad_out = floats(device, out_n);
  buf.grad_in = floats(device, in_n);
  buf.grad_weights = floats(device, w_n);
  buf.grad_bias = floats(device, b_n);
  buf.workspace = DeviceMemory(device, workspace);
  buf.norm_table = floats(device, 4 * size_t(s.c_in));
  return buf;
}

template <typename T>
const T* cp(const DeviceMemory& m) {
  return static_cast<const T*>(m.data());
}
template <typename T>
T* mp(const DeviceMemory& m) {
  return static_cast<T*>(m.data());
}

// Our kernel for one pass: the tensor-core version in T's precision; `normalized`: the forward and
// the weight gradient read `in` through BatchNorm's apply (leaky), as the trainer's readers of a
// BatchNorm applied in their loads do.
template <typename T>
void run_tc(Pass pass, const Conv2dShape& s, const YoloConv& layer, const LayerBuffers& b, cudaStream_t stream,
            bool normalized = false) {
  const NhwcView<const T> in = nhwc<const T>(cp<T>(b.in), s.n, s.h, s.w, s.c_in);
  const NormalizedInput norm = normalized ? NormalizedInput{cp<float>(b.norm_table), Activation::Leaky}
                                          : NormalizedInput{};
  const NhwcView<const T> grad_out = nhwc<const T>(cp<T>(b.grad_out), s.n, s.out_h(), s.out_w(), s.c_out);
  switch (pass) {
    case Pass::Forward:
      conv2d_forward_tc<T>(s, in, cp<T>(b.weights), layer.bias ? cp<float>(b.bias) : nullptr,
                           nhwc<T>(mp<T>(b.out), s.n, s.out_h(), s.out_w(), s.c_out), b.workspace.data(),
                           b.workspace.size(), stream, {}, norm);
      return;
    case Pass::BackwardData:
      conv2d_backward_data_tc<T>(s, grad_out, cp<T>(b.weights), nhwc<T>(mp<T>(b.grad_in), s.n, s.h, s.w, s.c_in),
                                 false, b.workspace.data(), b.workspace.size(), stream);
      return;
    case Pass::BackwardWeights:
      conv2d_backward_weights_tc<T>(s, in, grad_out, mp<float>(b.grad_weights),
                                    layer.bias ? mp<float>(b.grad_bias) : nullptr, b.workspace.data(),
                                    b.workspace.size(), stream, norm);
      return;
  }
}

// The FP32 CUDA-core kernels (kernels/conv.cu) for the fp32 rows.
void run_fp32(Pass pass, const Conv2dShape& s, const YoloConv& layer, const LayerBuffers& b, cudaStream_t stream) {
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

void run_ours(Precision p, Pass pass, const Conv2dShape& s, const YoloConv& layer, const LayerBuffers& b,
              cudaStream_t stream, bool normalized = false) {
  switch (p) {
    case Precision::Fp32: return run_fp32(pass, s, layer, b, stream);
    case Precision::Tf32: return run_tc<float>(pass, s, layer, b, stream, normalized);
    case Precision::Bf16: return run_tc<Bf16>(pass, s, layer, b, stream, normalized);
    case Precision::Fp16: return run_tc<Fp16>(pass, s, layer, b, stream, normalized);
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

#endif  // __CUDACC__

}  // namespace
}  // namespace yolo::bench
