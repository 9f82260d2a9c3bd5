// conv (forward, backward data, backward weights) at YOLOv3-416 layer shapes, and gemm in the
// three forms a 1x1 convolution (or a [connected] layer) takes: CUDA launchers on a GPU, the fast
// CPU versions otherwise. flops = 2 x multiply-adds; bytes = each input read once + each output
// written once.
#include <algorithm>
#include <string>

#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {
namespace {

struct ConvLayer {
  const char* label;
  int h, w, c_in, c_out, k, stride;
};

// The first layer, the first downsampling layer, then the 3x3 layer of each resolution and the
// 1x1 reduction at 13x13.
const ConvLayer kLayers[] = {
    {"416x416 3->32 3x3 s1", 416, 416, 3, 32, 3, 1},     {"416->208 32->64 3x3 s2", 416, 416, 32, 64, 3, 2},
    {"104x104 64->128 3x3 s1", 104, 104, 64, 128, 3, 1}, {"52x52 128->256 3x3 s1", 52, 52, 128, 256, 3, 1},
    {"26x26 256->512 3x3 s1", 26, 26, 256, 512, 3, 1},   {"13x13 512->1024 3x3 s1", 13, 13, 512, 1024, 3, 1},
    {"13x13 1024->512 1x1 s1", 13, 13, 1024, 512, 1, 1},
};

// Device (or host) floats filled with a small non-zero value.
DeviceMemory filled(Device device, size_t floats) {
  DeviceMemory m(device, std::max<size_t>(floats, 1) * sizeof(float));
  fill_bytes(m.data(), 0x3c, m.size(), device);  // 0x3c3c3c3c = 0.0115f
  return m;
}

float* f(const DeviceMemory& m) { return static_cast<float*>(m.data()); }

BENCH_ENTRY("conv", [](const Context& context, std::vector<Result>& out) {
  const bool gpu = context.device.is_cuda();
  for (const ConvLayer& layer : kLayers) {
    const std::string shape = layer.label;
    bool wanted = context.filter.empty();  // skip layers whose every line the filter would hide
    for (const char* op : {"conv fwd", "conv bwd data", "conv bwd weights"})
      wanted = wanted || ("conv " + std::string(op) + " " + shape).find(context.filter) != std::string::npos;
    if (!wanted) continue;
    const Conv2dShape s{context.batch, layer.h, layer.w, layer.c_in, layer.c_out, layer.k, layer.stride};
    const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    const size_t w_n = s.weight_count(), b_n = size_t(s.c_out);
    DeviceMemory in = filled(context.device, in_n), weights = filled(context.device, w_n),
                 bias = filled(context.device, b_n);
    DeviceMemory result = filled(context.device, out_n), grad_out = filled(context.device, out_n);
    DeviceMemory grad_in = filled(context.device, in_n), grad_w = filled(context.device, w_n);
    DeviceMemory grad_b = filled(context.device, b_n);
    const size_t ws_forward = gpu ? conv2d_forward_workspace_bytes(s) : 0;
    const size_t ws_data = gpu ? conv2d_backward_data_workspace_bytes(s) : 0;
    const size_t ws_weights = gpu ? conv2d_backward_weights_workspace_bytes(s) : 0;
    DeviceMemory workspace(context.device, std::max<size_t>({ws_forward, ws_data, ws_weights, 256}));
    ConstAct in_v = nhwc<const float>(f(in), s.n, s.h, s.w, s.c_in);
    ConstAct grad_out_v = nhwc<const float>(f(grad_out), s.n, s.out_h(), s.out_w(), s.c_out);
    Act out_v = nhwc(f(result), s.n, s.out_h(), s.out_w(), s.c_out);
    Act grad_in_v = nhwc(f(grad_in), s.n, s.h, s.w, s.c_in);
    const double flops = 2.0 * double(out_n) * s.k * s.k * s.c_in;

    Result fwd{"conv fwd", shape, 0, 4.0 * double(in_n + w_n + b_n + out_n), flops};
    Result data{"conv bwd data", shape, 0, 4.0 * double(out_n + w_n + in_n), flops};
    Result wts{"conv bwd weights", shape, 0, 4.0 * double(in_n + out_n + w_n + b_n), flops};
    if (gpu) {
      fwd.ms = time_ms(context, [&] {
        conv2d_forward_cuda(s, in_v, f(weights), f(bias), out_v, workspace.data(), workspace.size(), context.stream);
      });
      data.ms = time_ms(context, [&] {
        conv2d_backward_data_cuda(s, grad_out_v, f(weights), grad_in_v, false, workspace.data(), workspace.size(),
                                  context.stream);
      });
      wts.ms = time_ms(context, [&] {
        conv2d_backward_weights_cuda(s, in_v, grad_out_v, f(grad_w), f(grad_b), workspace.data(), workspace.size(),
                                     context.stream);
      });
    } else {
      fwd.ms = time_ms(context, [&] { conv2d_forward_cpu(s, in_v, f(weights), f(bias), out_v, nullptr, 0); });
      data.ms =
          time_ms(context, [&] { conv2d_backward_data_cpu(s, grad_out_v, f(weights), grad_in_v, false, nullptr, 0); });
      wts.ms =
          time_ms(context, [&] { conv2d_backward_weights_cpu(s, in_v, grad_out_v, f(grad_w), f(grad_b), nullptr, 0); });
    }
    out.push_back(fwd);
    out.push_back(data);
    out.push_back(wts);
  }
});

// The three forms of a [connected] layer with `rows` samples (or a 1x1 conv with `rows` pixels):
// forward in * W^T (NT), backward data d_out * W (NN), backward weights d_out^T * in (TN).
void time_gemm_forms(const Context& context, const char* what, int pixels, int c_in, int c_out,
                     std::vector<Result>& out) {
  DeviceMemory in = filled(context.device, size_t(pixels) * c_in), w = filled(context.device, size_t(c_out) * c_in);
  DeviceMemory bias = filled(context.device, c_out), act = filled(context.device, size_t(pixels) * c_out);
  DeviceMemory grad_in = filled(context.device, size_t(pixels) * c_in),
               grad_w = filled(context.device, size_t(c_out) * c_in);
  struct Form {
    const char* op;
    GemmShape shape;
    const DeviceMemory *a, *b, *bias, *c;
  };
  const Form forms[] = {
      {"NT (fwd)", GemmShape{pixels, c_out, c_in, false, true}, &in, &w, &bias, &act},
      {"NN (bwd data)", GemmShape{pixels, c_in, c_out, false, false}, &act, &w, nullptr, &grad_in},
      {"TN (bwd wts)", GemmShape{c_out, c_in, pixels, true, false}, &act, &in, nullptr, &grad_w},
  };
  size_t ws_bytes = 256;
  if (context.device.is_cuda())
    for (const Form& form : forms) ws_bytes = std::max(ws_bytes, gemm_workspace_bytes(form.shape));
  DeviceMemory workspace(context.device, ws_bytes);
  for (const Form& form : forms) {
    const GemmShape& g = form.shape;
    const float* bias_ptr = form.bias ? f(*form.bias) : nullptr;
    Result r{std::string("gemm ") + what + " " + form.op,
             std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k), 0,
             4.0 * (double(g.m) * g.k + double(g.k) * g.n + double(g.m) * g.n), 2.0 * g.m * double(g.n) * g.k};
    if (context.device.is_cuda())
      r.ms = time_ms(context, [&] {
        gemm_cuda(g, f(*form.a), f(*form.b), bias_ptr, f(*form.c), false, workspace.data(), workspace.size(),
                  context.stream);
      });
    else
      r.ms = time_ms(context, [&] { gemm_cpu(g, f(*form.a), f(*form.b), bias_ptr, f(*form.c), false, nullptr, 0); });
    out.push_back(r);
  }
}

// YOLOv3's 13x13 1x1 layer (1024 -> 512), and the MNIST MLP's largest layer (models/mnist-mlp.cfg:
// 4096 -> 2048 at its batch of 128, whatever --batch says).
BENCH_ENTRY("gemm", [](const Context& context, std::vector<Result>& out) {
  time_gemm_forms(context, "1x1", context.batch * 13 * 13, 1024, 512, out);
  time_gemm_forms(context, "mlp", 128, 4096, 2048, out);
});

}  // namespace
}  // namespace yolo::bench
