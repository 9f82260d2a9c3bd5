// The op library's one dispatch point (see ops.h): each entry point queues the fast CPU version
// on a CPU stream, or calls the CUDA launcher (real or emulated) with the stream's handle.
#include "kernels/ops.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/check.h"

namespace yolo {

namespace {

// cpu: a copyable callable run as host work of the CPU stream (it must own everything it
// reads: the call returns before it runs); gpu: called now with the stream's handle.
template <typename Cpu, typename Gpu>
void dispatch(const OpContext& c, const char* op, Cpu&& cpu, Gpu&& gpu) {
  if (!c.stream) throw Error(std::string(op) + ": the op context has no stream");
  if (c.stream->device().runs_kernels()) {
    gpu(c.stream->native());
  } else {
    if (stores_16_bits(c.precision))
      throw Error(std::string(op) + ": precision " + precision_name(c.precision) +
                  " keeps activations in 16 bits; the CPU backend computes fp32");
    c.stream->enqueue(std::forward<Cpu>(cpu));
  }
}

// The activation views (and the conv/connected weights) as the storage type T they hold (ops.h:
// with bf16/fp16 their float pointers point at 16-bit elements; counts and strides are elements).
template <typename T>
NhwcView<const T> as(ConstAct v) {
  return {reinterpret_cast<const T*>(v.data), v.n, v.h, v.w, v.c, v.stride};
}
template <typename T>
NhwcView<T> as(Act v) {
  return {reinterpret_cast<T*>(v.data), v.n, v.h, v.w, v.c, v.stride};
}
template <typename T>
const T* as(const float* p) {
  return reinterpret_cast<const T*>(p);
}
template <typename T>
T* as(float* p) {
  return reinterpret_cast<T*>(p);
}

// Calls f.template operator()<T>() with T the activations' storage type in c's precision.
template <typename F>
void with_storage(const OpContext& c, F&& f) {
  switch (c.precision) {
    case Precision::Bf16:
      return f.template operator()<Bf16>();
    case Precision::Fp16:
      return f.template operator()<Fp16>();
    default:
      return f.template operator()<float>();
  }
}

// Whether conv/gemm run on tensor cores (every precision but fp32); the CPU backend computes fp32.
bool tensor_cores(const OpContext& c, const char* op) {
  if (c.precision == Precision::Fp32) return false;
  if (c.stream && !c.stream->device().runs_kernels())
    throw Error(std::string(op) + ": precision " + precision_name(c.precision) +
                " runs on tensor cores; the CPU backend computes fp32");
  return true;
}

// The CPU backend's batchnorm backwards read a stored y; recomputing it is the GPUs' (batchnorm.h).
void cpu_keeps_y(const OpContext& c, const char* op, BatchNormAffine<float> recompute) {
  if ((recompute.gamma || recompute.beta) && c.stream && !c.stream->device().runs_kernels())
    throw Error(std::string(op) + ": the CPU backend reads the stored y; recomputing it from x is a GPU path");
}

// ... nor does it fold a shortcut into the BatchNorm apply (graph/executor_plan.cpp folds on GPUs).
void cpu_adds_no_residual(const OpContext& c, const char* op, ConstAct residual) {
  if (residual.data && c.stream && !c.stream->device().runs_kernels())
    throw Error(std::string(op) + ": the CPU backend adds no residual (a folded shortcut is a GPU path)");
}

}  // namespace

namespace {
template <typename T>
size_t conv2d_tc_workspace_bytes(const Conv2dShape& s) {
  return std::max({conv2d_forward_tc_workspace_bytes<T>(s), conv2d_backward_data_tc_workspace_bytes<T>(s),
                   conv2d_backward_weights_tc_workspace_bytes<T>(s)});
}
}  // namespace

size_t conv2d_workspace_bytes(Precision precision, const Conv2dShape& s) {
  switch (precision) {
    case Precision::Tf32:
      return conv2d_tc_workspace_bytes<float>(s);
    case Precision::Bf16:
      return conv2d_tc_workspace_bytes<Bf16>(s);
    case Precision::Fp16:
      return conv2d_tc_workspace_bytes<Fp16>(s);
    default:
      return std::max({conv2d_forward_workspace_bytes(s), conv2d_backward_data_workspace_bytes(s),
                       conv2d_backward_weights_workspace_bytes(s)});
  }
}

int conv2d_forward_moment_blocks(Precision precision, const Conv2dShape& s) {
  switch (precision) {
    case Precision::Tf32:
      return conv2d_forward_tc_moment_blocks<float>(s);
    case Precision::Bf16:
      return conv2d_forward_tc_moment_blocks<Bf16>(s);
    case Precision::Fp16:
      return conv2d_forward_tc_moment_blocks<Fp16>(s);
    default:
      return conv2d_forward_moment_blocks(s);
  }
}

size_t gemm_workspace_bytes(Precision precision, const GemmShape& s) {
  // 16-bit: A^T B is a weight gradient (FP32 out), the other layouts 16-bit out (ops.h).
  switch (precision) {
    case Precision::Tf32:
      return gemm_tc_workspace_bytes<float, float>(s);
    case Precision::Bf16:
      return s.trans_a ? gemm_tc_workspace_bytes<Bf16, float>(s) : gemm_tc_workspace_bytes<Bf16, Bf16>(s);
    case Precision::Fp16:
      return s.trans_a ? gemm_tc_workspace_bytes<Fp16, float>(s) : gemm_tc_workspace_bytes<Fp16, Fp16>(s);
    default:
      return gemm_workspace_bytes(s);
  }
}

void activation_forward(const OpContext& c, Activation kind, ConstAct x, Act y) {
  dispatch(
      c, "activation_forward", [=] { activation_forward_cpu(kind, x, y); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() { activation_forward_cuda<T>(kind, as<T>(x), as<T>(y), s); });
      });
}

void activation_backward(const OpContext& c, Activation kind, ConstAct y, ConstAct grad_y, Act grad_x) {
  dispatch(
      c, "activation_backward", [=] { activation_backward_cpu(kind, y, grad_y, grad_x); },
      [&](cudaStream_t s) {
        with_storage(
            c, [&]<typename T>() { activation_backward_cuda<T>(kind, as<T>(y), as<T>(grad_y), as<T>(grad_x), s); });
      });
}

void batchnorm_activation_forward_training(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                           const float* beta, Act y, float* saved_mean, float* saved_var,
                                           float* running_mean, float* running_var, ConstAct residual) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  cpu_adds_no_residual(c, "batchnorm_activation_forward_training", residual);
  dispatch(
      c, "batchnorm_activation_forward_training",
      [=] {
        batchnorm_activation_forward_training_cpu(act, x, gamma, beta, y, saved_mean, saved_var, running_mean,
                                                  running_var, ws, wsb);
      },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_forward_training_cuda<T>(act, as<T>(x), gamma, beta, as<T>(y), saved_mean, saved_var,
                                                        running_mean, running_var, ws, wsb, s, as<T>(residual));
        });
      });
}

void batchnorm_activation_forward_from_moments(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                               const float* beta, Act y, const float* partials, const float* counts,
                                               int blocks, float* saved_mean, float* saved_var, float* running_mean,
                                               float* running_var, ConstAct residual) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "batchnorm_activation_forward_from_moments",
      [=] { throw Error("batchnorm_activation_forward_from_moments: the CPU backend has no convolution moments"); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_forward_from_moments_cuda<T>(act, as<T>(x), gamma, beta, as<T>(y), partials, counts,
                                                            blocks, saved_mean, saved_var, running_mean, running_var,
                                                            ws, wsb, s, as<T>(residual));
        });
      });
}

void batchnorm_sums_from_moments(const OpContext& c, int channels, const float* partials, const float* counts,
                                 int blocks, float* sums) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "batchnorm_sums_from_moments",
      [=] { throw Error("batchnorm_sums_from_moments: the CPU backend has no convolution moments"); },
      [&](cudaStream_t s) { batchnorm_sums_from_moments_cuda(channels, partials, counts, blocks, sums, ws, wsb, s); });
}

void batchnorm_centered_squares_from_moments(const OpContext& c, int channels, const float* partials,
                                             const float* counts, int blocks, const float* sums, double total_pixels,
                                             float* squares) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "batchnorm_centered_squares_from_moments",
      [=] { throw Error("batchnorm_centered_squares_from_moments: the CPU backend has no convolution moments"); },
      [&](cudaStream_t s) {
        batchnorm_centered_squares_from_moments_cuda(channels, partials, counts, blocks, sums, total_pixels, squares,
                                                     ws, wsb, s);
      });
}

void batchnorm_input_table(const OpContext& c, int channels, const float* mean, const float* var, const float* gamma,
                           const float* beta, float* table) {
  if (c.stream && !c.stream->device().runs_kernels())
    throw Error("batchnorm_input_table: BatchNorm applied at the convolutions' loads is a GPU path");
  dispatch(
      c, "batchnorm_input_table", [] {},
      [&](cudaStream_t s) { batchnorm_input_table_cuda(channels, mean, var, gamma, beta, table, s); });
}

void batchnorm_activation_forward_inference(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                            const float* beta, const float* running_mean, const float* running_var,
                                            Act y, ConstAct residual) {
  cpu_adds_no_residual(c, "batchnorm_activation_forward_inference", residual);
  dispatch(
      c, "batchnorm_activation_forward_inference",
      [=] { batchnorm_activation_forward_inference_cpu(act, x, gamma, beta, running_mean, running_var, y); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_forward_inference_cuda<T>(act, as<T>(x), gamma, beta, running_mean, running_var,
                                                         as<T>(y), s, as<T>(residual));
        });
      });
}

void batchnorm_activation_backward(const OpContext& c, Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                   const float* gamma, const float* saved_mean, const float* saved_var, Act grad_x,
                                   float* grad_gamma, float* grad_beta, BatchNormAffine<float> recompute) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  cpu_keeps_y(c, "batchnorm_activation_backward", recompute);
  dispatch(
      c, "batchnorm_activation_backward",
      [=] {
        batchnorm_activation_backward_cpu(act, y, grad_y, x, gamma, saved_mean, saved_var, grad_x, grad_gamma,
                                          grad_beta, ws, wsb);
      },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_backward_cuda<T>(act, as<T>(y), as<T>(grad_y), as<T>(x), gamma, saved_mean, saved_var,
                                                as<T>(grad_x), grad_gamma, grad_beta, ws, wsb, s, recompute);
        });
      });
}

void batchnorm_sums(const OpContext& c, ConstAct x, float* sums) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "batchnorm_sums", [=] { batchnorm_sums_cpu(x, sums, ws, wsb); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() { batchnorm_sums_cuda<T>(as<T>(x), sums, ws, wsb, s); });
      });
}

void batchnorm_centered_squares(const OpContext& c, ConstAct x, const float* sums, double total_pixels,
                                float* squares) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "batchnorm_centered_squares", [=] { batchnorm_centered_squares_cpu(x, sums, total_pixels, squares, ws, wsb); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_centered_squares_cuda<T>(as<T>(x), sums, total_pixels, squares, ws, wsb, s);
        });
      });
}

void batchnorm_activation_forward_from_sums(const OpContext& c, Activation act, ConstAct x, const float* gamma,
                                            const float* beta, Act y, const float* sums, const float* squares,
                                            double total_pixels, float* saved_mean, float* saved_var,
                                            float* running_mean, float* running_var, ConstAct residual) {
  cpu_adds_no_residual(c, "batchnorm_activation_forward_from_sums", residual);
  dispatch(
      c, "batchnorm_activation_forward_from_sums",
      [=] {
        batchnorm_activation_forward_from_sums_cpu(act, x, gamma, beta, y, sums, squares, total_pixels, saved_mean,
                                                   saved_var, running_mean, running_var);
      },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_forward_from_sums_cuda<T>(act, as<T>(x), gamma, beta, as<T>(y), sums, squares,
                                                         total_pixels, saved_mean, saved_var, running_mean, running_var,
                                                         s, as<T>(residual));
        });
      });
}

void batchnorm_activation_backward_sums(const OpContext& c, Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                        const float* saved_mean, const float* saved_var, float* grad_gamma,
                                        float* grad_beta, float* sums2, BatchNormAffine<float> recompute) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  cpu_keeps_y(c, "batchnorm_activation_backward_sums", recompute);
  dispatch(
      c, "batchnorm_activation_backward_sums",
      [=] {
        batchnorm_activation_backward_sums_cpu(act, y, grad_y, x, saved_mean, saved_var, grad_gamma, grad_beta, sums2,
                                               ws, wsb);
      },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_backward_sums_cuda<T>(act, as<T>(y), as<T>(grad_y), as<T>(x), saved_mean, saved_var,
                                                     grad_gamma, grad_beta, sums2, ws, wsb, s, recompute);
        });
      });
}

void batchnorm_activation_backward_apply(const OpContext& c, Activation act, ConstAct y, ConstAct grad_y, ConstAct x,
                                         const float* gamma, const float* saved_mean, const float* saved_var,
                                         const float* sums2, double total_pixels, Act grad_x,
                                         BatchNormAffine<float> recompute) {
  cpu_keeps_y(c, "batchnorm_activation_backward_apply", recompute);
  dispatch(
      c, "batchnorm_activation_backward_apply",
      [=] {
        batchnorm_activation_backward_apply_cpu(act, y, grad_y, x, gamma, saved_mean, saved_var, sums2, total_pixels,
                                                grad_x);
      },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          batchnorm_activation_backward_apply_cuda<T>(act, as<T>(y), as<T>(grad_y), as<T>(x), gamma, saved_mean,
                                                      saved_var, sums2, total_pixels, as<T>(grad_x), s, recompute);
        });
      });
}

bool conv2d_takes_normalized_input(const OpContext& c, const Conv2dShape& shape) {
  return c.precision != Precision::Fp32 && c.stream && c.stream->device().runs_kernels() &&
         !conv2d_tc_small_channels(shape);
}

// A normalized input (conv.h) is read by the tensor-core loaders only.
static void require_normalized_input_path(const OpContext& c, const char* op, const Conv2dShape& shape, NormalizedInput norm) {
  if (norm && !conv2d_takes_normalized_input(c, shape))
    throw Error(std::string(op) + ": a BatchNorm-normalized input is read by the tensor-core kernels only (bf16, fp16 "
                "or tf32 on a GPU, more than 4 input channels)");
}

void conv2d_forward(const OpContext& c, const Conv2dShape& shape, ConstAct in, const float* weights, const float* bias,
                    Act out, ConvMoments moments, NormalizedInput norm) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  const bool tc = tensor_cores(c, "conv2d_forward");
  if (moments.partials && !c.stream->device().runs_kernels())
    throw Error("conv2d_forward: the statistics from the epilogue (moments) are a CUDA-path option");
  require_normalized_input_path(c, "conv2d_forward", shape, norm);
  dispatch(
      c, "conv2d_forward", [=] { conv2d_forward_cpu(shape, in, weights, bias, out, ws, wsb); },
      [&](cudaStream_t s) {
        if (!tc) return conv2d_forward_cuda(shape, in, weights, bias, out, ws, wsb, s, moments);
        with_storage(c, [&]<typename T>() {
          conv2d_forward_tc<T>(shape, as<T>(in), as<T>(weights), bias, as<T>(out), ws, wsb, s, moments, norm);
        });
      });
}

void conv2d_backward_data(const OpContext& c, const Conv2dShape& shape, ConstAct grad_out, const float* weights,
                          Act grad_in, bool accumulate) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  const bool tc = tensor_cores(c, "conv2d_backward_data");
  dispatch(
      c, "conv2d_backward_data",
      [=] { conv2d_backward_data_cpu(shape, grad_out, weights, grad_in, accumulate, ws, wsb); },
      [&](cudaStream_t s) {
        if (!tc) return conv2d_backward_data_cuda(shape, grad_out, weights, grad_in, accumulate, ws, wsb, s);
        with_storage(c, [&]<typename T>() {
          conv2d_backward_data_tc<T>(shape, as<T>(grad_out), as<T>(weights), as<T>(grad_in), accumulate, ws, wsb, s);
        });
      });
}

void conv2d_backward_weights(const OpContext& c, const Conv2dShape& shape, ConstAct in, ConstAct grad_out,
                             float* grad_weights, float* grad_bias, NormalizedInput norm) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  const bool tc = tensor_cores(c, "conv2d_backward_weights");
  require_normalized_input_path(c, "conv2d_backward_weights", shape, norm);
  dispatch(
      c, "conv2d_backward_weights",
      [=] { conv2d_backward_weights_cpu(shape, in, grad_out, grad_weights, grad_bias, ws, wsb); },
      [&](cudaStream_t s) {
        if (!tc) return conv2d_backward_weights_cuda(shape, in, grad_out, grad_weights, grad_bias, ws, wsb, s);
        with_storage(c, [&]<typename T>() {
          conv2d_backward_weights_tc<T>(shape, as<T>(in), as<T>(grad_out), grad_weights, grad_bias, ws, wsb, s, norm);
        });
      });
}

void gemm(const OpContext& c, const GemmShape& shape, const float* a, const float* b, const float* bias, float* out,
          bool accumulate) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  const bool tc = tensor_cores(c, "gemm");
  dispatch(
      c, "gemm", [=] { gemm_cpu(shape, a, b, bias, out, accumulate, ws, wsb); },
      [&](cudaStream_t s) {
        if (!tc) return gemm_cuda(shape, a, b, bias, out, accumulate, ws, wsb, s);
        with_storage(c, [&]<typename T>() {
          if (shape.trans_a || std::is_same_v<T, float>)  // a weight gradient: FP32 out
            gemm_tc<T, float>(shape, as<T>(a), as<T>(b), bias, out, accumulate, ws, wsb, s);
          else
            gemm_tc<T, T>(shape, as<T>(a), as<T>(b), bias, as<T>(out), accumulate, ws, wsb, s);
        });
      });
}

void shortcut_forward(const OpContext& c, ConstAct a, ConstAct b, Act out) {
  dispatch(
      c, "shortcut_forward", [=] { shortcut_forward_cpu(a, b, out); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() { shortcut_forward_cuda<T>(as<T>(a), as<T>(b), as<T>(out), s); });
      });
}

void shortcut_backward(const OpContext& c, ConstAct grad_out, Act grad_a, Act grad_b, bool accumulate_a,
                       bool accumulate_b) {
  dispatch(
      c, "shortcut_backward", [=] { shortcut_backward_cpu(grad_out, grad_a, grad_b, accumulate_a, accumulate_b); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          shortcut_backward_cuda<T>(as<T>(grad_out), as<T>(grad_a), as<T>(grad_b), accumulate_a, accumulate_b, s);
        });
      });
}

void route_forward(const OpContext& c, std::span<const ConstAct> inputs, Act out) {
  std::vector<ConstAct> owned(inputs.begin(), inputs.end());
  dispatch(
      c, "route_forward", [owned, out] { route_forward_cpu(owned, out); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          std::vector<NhwcView<const T>> typed;
          for (const ConstAct& v : inputs) typed.push_back(as<T>(v));
          route_forward_cuda(std::span<const NhwcView<const T>>(typed), as<T>(out), s);
        });
      });
}

void route_backward(const OpContext& c, ConstAct grad_out, std::span<const Act> grad_inputs, bool accumulate) {
  std::vector<Act> owned(grad_inputs.begin(), grad_inputs.end());
  dispatch(
      c, "route_backward", [grad_out, owned, accumulate] { route_backward_cpu(grad_out, owned, accumulate); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          std::vector<NhwcView<T>> typed;
          for (const Act& v : grad_inputs) typed.push_back(as<T>(v));
          route_backward_cuda(as<T>(grad_out), std::span<const NhwcView<T>>(typed), accumulate, s);
        });
      });
}

void upsample_forward(const OpContext& c, ConstAct in, Act out, int factor) {
  dispatch(
      c, "upsample_forward", [=] { upsample_forward_cpu(in, out, factor); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() { upsample_forward_cuda<T>(as<T>(in), as<T>(out), factor, s); });
      });
}

void upsample_backward(const OpContext& c, ConstAct grad_out, Act grad_in, int factor, bool accumulate) {
  dispatch(
      c, "upsample_backward", [=] { upsample_backward_cpu(grad_out, grad_in, factor, accumulate); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          upsample_backward_cuda<T>(as<T>(grad_out), as<T>(grad_in), factor, accumulate, s);
        });
      });
}

void maxpool_forward(const OpContext& c, ConstAct in, Act out, int* argmax, int size, int stride) {
  dispatch(
      c, "maxpool_forward", [=] { maxpool_forward_cpu(in, out, argmax, size, stride); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() { maxpool_forward_cuda<T>(as<T>(in), as<T>(out), argmax, size, stride, s); });
      });
}

void maxpool_backward(const OpContext& c, ConstAct grad_out, const int* argmax, Act grad_in, int size, int stride,
                      bool accumulate) {
  dispatch(
      c, "maxpool_backward", [=] { maxpool_backward_cpu(grad_out, argmax, grad_in, size, stride, accumulate); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          maxpool_backward_cuda<T>(as<T>(grad_out), argmax, as<T>(grad_in), size, stride, accumulate, s);
        });
      });
}

void yolo_loss(const OpContext& c, ConstAct input, const YoloLossConfig& config, const YoloTruth* truths,
               const int* truth_counts, int truth_stride, Act grad, YoloLossStats* stats) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "yolo_loss", [=] { yolo_loss_cpu(input, config, truths, truth_counts, truth_stride, grad, stats); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          yolo_loss_cuda<T>(as<T>(input), config, truths, truth_counts, truth_stride, as<T>(grad), stats, ws, wsb, s);
        });
      });
}

void softmax_cross_entropy(const OpContext& c, const float* logits, const int* labels, int n, int k, float* loss,
                           float* grad_logits, float* probabilities, int* bad_label, float grad_scale,
                           const float* grad_scale_at) {
  if ((grad_scale != 1.0f || grad_scale_at) && !c.stream->device().runs_kernels())
    throw Error("softmax_cross_entropy: loss scaling (fp16) runs on the CUDA path only");
  dispatch(
      c, "softmax_cross_entropy",
      [=] { softmax_cross_entropy_cpu(logits, labels, n, k, loss, grad_logits, probabilities); },
      [&](cudaStream_t s) {
        with_storage(c, [&]<typename T>() {
          softmax_cross_entropy_cuda<T>(as<T>(logits), labels, n, k, loss, as<T>(grad_logits), probabilities, bad_label,
                                        s, grad_scale, grad_scale_at);
        });
      });
}

void sgd_update(const OpContext& c, float* w, const float* g, float* u, const SgdSegment* segments, int segment_count,
                size_t begin, size_t end, SgdHyper hyper, void* copy16) {
  if (copy16 && !stores_16_bits(c.precision))
    throw Error("sgd_update: a 16-bit weight copy needs precision bf16 or fp16");
  dispatch(
      c, "sgd_update", [=] { sgd_update_cpu(w, g, u, segments, segment_count, begin, end, hyper); },
      [&](cudaStream_t s) {
        if (c.precision == Precision::Bf16 && copy16)
          sgd_update_cuda(w, g, u, segments, segment_count, begin, end, hyper, static_cast<Bf16*>(copy16), s);
        else if (c.precision == Precision::Fp16 && copy16)
          sgd_update_cuda(w, g, u, segments, segment_count, begin, end, hyper, static_cast<Fp16*>(copy16), s);
        else
          sgd_update_cuda(w, g, u, segments, segment_count, begin, end, hyper, s);
      });
}

void to_storage(const OpContext& c, const float* src, void* dst, size_t count) {
  if (!stores_16_bits(c.precision)) throw Error("to_storage: precision fp32/tf32 stores floats; nothing to convert");
  dispatch(
      c, "to_storage", [] {},
      [&](cudaStream_t s) {
        if (c.precision == Precision::Bf16)
          convert_cuda<float, Bf16>(src, static_cast<Bf16*>(dst), count, s);
        else
          convert_cuda<float, Fp16>(src, static_cast<Fp16*>(dst), count, s);
      });
}

void from_storage(const OpContext& c, const void* src, float* dst, size_t count) {
  if (!stores_16_bits(c.precision)) throw Error("from_storage: precision fp32/tf32 stores floats; nothing to convert");
  dispatch(
      c, "from_storage", [] {},
      [&](cudaStream_t s) {
        if (c.precision == Precision::Bf16)
          convert_cuda<Bf16, float>(static_cast<const Bf16*>(src), dst, count, s);
        else
          convert_cuda<Fp16, float>(static_cast<const Fp16*>(src), dst, count, s);
      });
}

void grad_nonfinite_check(const OpContext& c, const float* g, size_t count, int* flag) {
  dispatch(c, "grad_nonfinite_check", [=] { grad_nonfinite_check_cpu(g, count, flag); },
           [&](cudaStream_t s) { grad_nonfinite_check_cuda(g, count, flag, s); });
}

void loss_scale_update(const OpContext& c, const int* nonfinite, LossScaleLive* s, int growth_interval) {
  dispatch(c, "loss_scale_update", [] { throw Error("loss_scale_update: loss scaling (fp16) runs on GPUs only"); },
           [&](cudaStream_t stream) { loss_scale_update_cuda(nonfinite, s, growth_interval, stream); });
}

void yolo_decode(const OpContext& c, ConstAct input, const YoloLossConfig& config, float threshold, Detection* out,
                 int capacity, int* count) {
  void* ws = c.workspace;
  size_t wsb = c.workspace_bytes;
  dispatch(
      c, "yolo_decode",
      [=] {
        // The CPU version appends, sorted: keep the first `capacity` as the CUDA version does.
        std::vector<Detection> found;
        yolo_decode_cpu(input, config, threshold, found);
        *count = static_cast<int>(std::min<size_t>(found.size(), INT32_MAX));
        std::copy_n(found.begin(), std::min<size_t>(found.size(), static_cast<size_t>(std::max(capacity, 0))), out);
      },
      [&](cudaStream_t s) { yolo_decode_cuda(input, config, threshold, out, capacity, count, ws, wsb, s); });
}

void nms(const OpContext& c, const Detection* detections, int count, float iou_threshold, int* keep) {
  dispatch(c, "nms", [=] { nms_cpu(detections, count, iou_threshold, keep); },
           [&](cudaStream_t s) { nms_cuda(detections, count, iou_threshold, keep, s); });
}

}  // namespace yolo
