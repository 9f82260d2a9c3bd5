// Batchnorm (plain and fused with leaky) and leaky alone at YOLOv3-416 activation shapes, batch
// context.batch: the CUDA launchers on a GPU, the fast CPU versions otherwise.
//
// Bytes are the minimum traffic: every tensor read once and written once (E = n*h*w*c floats):
//   bn fwd (train or infer), bn+leaky fwd: x read + y written                 = 2E
//   bn bwd:                               grad_y, x read + grad_x written     = 3E
//   bn+leaky bwd:                         y, grad_y, x read + grad_x written  = 4E
//   bn+leaky bwd recompute (GPUs):        grad_y, x read + grad_x written     = 3E (y recomputed
//                                         from x: batchnorm.h, BatchNormAffine)
//   leaky fwd: 2E;  leaky bwd: y, grad_y read + grad_x written                = 3E
// The per-channel arrays (gamma, beta, statistics: a few c floats) are left out. The training
// passes cannot reach this minimum from DRAM: the statistics (forward) and the gradient sums
// (backward) must be complete before anything is written, so the inputs are read twice unless
// they fit in L2. At full copy bandwidth that caps %copy at 2/3 (fwd train), 3/5 (bn bwd) and
// 4/7 (bn+leaky bwd). "fwd train from moments" (GPUs, issue 15) is the training forward after a
// conv wrote the statistics in its epilogue (conv.h ConvMoments; one block per 128 pixels, as the
// large tiles make): x is read once, so its minimum 2E is reachable; the target is 80% of copy.
#include <algorithm>
#include <string>

#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/common.cuh"
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {
namespace {

struct Shape {
  int h, w, c;
};
constexpr Shape kShapes[] = {{416, 416, 32}, {104, 104, 128}, {52, 52, 256}, {13, 13, 1024}};

std::string shape_name(const Shape& s) {
  return "b x " + std::to_string(s.h) + "x" + std::to_string(s.w) + "x" + std::to_string(s.c);
}

bool wanted(const Context& context, const char* family, const std::string& op, const std::string& shape) {
  return context.filter.empty() || (std::string(family) + " " + op + " " + shape).find(context.filter) != std::string::npos;
}

// The tensors one shape needs, filled with non-zero bytes (0x3c: +0.0115, 0xbc: -0.0115).
struct Buffers {
  DeviceMemory x, y, grad_y, grad_x, gamma, beta, mean, var, running_mean, running_var, grad_gamma, grad_beta,
      workspace;
  size_t workspace_bytes = 0;
  Buffers(Device device, int n, const Shape& s) {
    size_t elements = size_t(n) * s.h * s.w * s.c, bytes = elements * sizeof(float), cb = size_t(s.c) * sizeof(float);
    workspace_bytes = batchnorm_workspace_bytes(n, s.h, s.w, s.c);
    x = DeviceMemory(device, bytes), y = DeviceMemory(device, bytes), grad_y = DeviceMemory(device, bytes),
    grad_x = DeviceMemory(device, bytes), workspace = DeviceMemory(device, workspace_bytes);
    for (DeviceMemory* m : {&gamma, &beta, &mean, &var, &running_mean, &running_var, &grad_gamma, &grad_beta})
      *m = DeviceMemory(device, cb);
    for (DeviceMemory* m : {&x, &y, &gamma, &beta, &mean, &var, &running_mean, &running_var})
      fill_bytes(m->data(), 0x3c, m->size(), device);
    fill_bytes(grad_y.data(), 0xbc, bytes, device);
  }
  static float* f(const DeviceMemory& m) { return static_cast<float*>(m.data()); }
};

void add_batchnorm(const Context& context, std::vector<Result>& out, const char* family, Activation act,
                   const std::string& prefix) {
  const bool gpu = context.device.is_cuda();
  for (const Shape& s : kShapes) {
    const std::string shape = shape_name(s);
    const std::string ops[] = {prefix + " fwd train", prefix + " fwd infer", prefix + " bwd",
                               prefix + " fwd train from moments", prefix + " bwd recompute"};
    const bool recompute = gpu && act != Activation::Linear && wanted(context, family, ops[4], shape);
    if (!wanted(context, family, ops[0], shape) && !wanted(context, family, ops[1], shape) &&
        !wanted(context, family, ops[2], shape) && !(gpu && wanted(context, family, ops[3], shape)) && !recompute)
      continue;
    Buffers b(context.device, context.batch, s);
    using F = Buffers;
    const int n = context.batch;
    const double e_bytes = double(n) * s.h * s.w * s.c * sizeof(float);
    ConstAct x = nhwc<const float>(F::f(b.x), n, s.h, s.w, s.c), y_in = nhwc<const float>(F::f(b.y), n, s.h, s.w, s.c),
             grad_y = nhwc<const float>(F::f(b.grad_y), n, s.h, s.w, s.c);
    Act y = nhwc(F::f(b.y), n, s.h, s.w, s.c), grad_x = nhwc(F::f(b.grad_x), n, s.h, s.w, s.c);

    if (wanted(context, family, ops[0], shape))
      out.push_back({ops[0], shape, time_ms(context, [&] {
                       if (gpu)
                         batchnorm_activation_forward_training_cuda(
                             act, x, F::f(b.gamma), F::f(b.beta), y, F::f(b.mean), F::f(b.var), F::f(b.running_mean),
                             F::f(b.running_var), b.workspace.data(), b.workspace_bytes, context.stream);
                       else
                         batchnorm_activation_forward_training_cpu(act, x, F::f(b.gamma), F::f(b.beta), y, F::f(b.mean),
                                                                   F::f(b.var), F::f(b.running_mean),
                                                                   F::f(b.running_var), nullptr, 0);
                     }),
                     2 * e_bytes, 0});
    if (gpu && wanted(context, family, ops[3], shape)) {
      const int blocks = int((size_t(n) * s.h * s.w + 127) / 128);
      DeviceMemory partials(context.device, size_t(blocks) * s.c * 2 * sizeof(float)),
          counts(context.device, size_t(blocks) * sizeof(float));
      fill_bytes(partials.data(), 0x3c, partials.size(), context.device);
      fill_bytes(counts.data(), 0x3c, counts.size(), context.device);
      const size_t merge_bytes = batchnorm_from_moments_workspace_bytes(blocks, s.c);
      DeviceMemory merge(context.device, std::max<size_t>(merge_bytes, 1));
      out.push_back({ops[3], shape,
                     time_ms(context,
                             [&] {
                               batchnorm_activation_forward_from_moments_cuda<float>(
                                   act, x, F::f(b.gamma), F::f(b.beta), y, F::f(partials), F::f(counts), blocks,
                                   F::f(b.mean), F::f(b.var), F::f(b.running_mean), F::f(b.running_var), merge.data(),
                                   merge_bytes, context.stream);
                             }),
                     2 * e_bytes, 0});
    }
    if (wanted(context, family, ops[1], shape))
      out.push_back({ops[1], shape, time_ms(context, [&] {
                       if (gpu)
                         batchnorm_activation_forward_inference_cuda(act, x, F::f(b.gamma), F::f(b.beta),
                                                                     F::f(b.running_mean), F::f(b.running_var), y,
                                                                     context.stream);
                       else
                         batchnorm_activation_forward_inference_cpu(act, x, F::f(b.gamma), F::f(b.beta),
                                                                    F::f(b.running_mean), F::f(b.running_var), y);
                     }),
                     2 * e_bytes, 0});
    if (wanted(context, family, ops[2], shape)) {
      // Linear reads no y.
      const double tensors = act == Activation::Linear ? 3 : 4;
      out.push_back({ops[2], shape, time_ms(context, [&] {
                       if (gpu)
                         batchnorm_activation_backward_cuda(act, y_in, grad_y, x, F::f(b.gamma), F::f(b.mean),
                                                            F::f(b.var), grad_x, F::f(b.grad_gamma),
                                                            F::f(b.grad_beta), b.workspace.data(), b.workspace_bytes,
                                                            context.stream);
                       else
                         batchnorm_activation_backward_cpu(act, y_in, grad_y, x, F::f(b.gamma), F::f(b.mean),
                                                           F::f(b.var), grad_x, F::f(b.grad_gamma), F::f(b.grad_beta),
                                                           nullptr, 0);
                     }),
                     tensors * e_bytes, 0});
    }
    if (recompute)
      out.push_back({ops[4], shape, time_ms(context, [&] {
                       batchnorm_activation_backward_cuda(act, ConstAct{}, grad_y, x, F::f(b.gamma), F::f(b.mean),
                                                          F::f(b.var), grad_x, F::f(b.grad_gamma), F::f(b.grad_beta),
                                                          b.workspace.data(), b.workspace_bytes, context.stream,
                                                          {F::f(b.gamma), F::f(b.beta)});
                     }),
                     3 * e_bytes, 0});
  }
}

BENCH_ENTRY("batchnorm", [](const Context& context, std::vector<Result>& out) {
  add_batchnorm(context, out, "batchnorm", Activation::Linear, "bn");
  add_batchnorm(context, out, "batchnorm", Activation::Leaky, "bn+leaky");
});

BENCH_ENTRY("activation", [](const Context& context, std::vector<Result>& out) {
  const bool gpu = context.device.is_cuda();
  const int n = context.batch;
  for (const Shape& s : kShapes) {
    const std::string shape = shape_name(s);
    if (!wanted(context, "activation", "leaky fwd", shape) && !wanted(context, "activation", "leaky bwd", shape))
      continue;
    const size_t bytes = size_t(n) * s.h * s.w * s.c * sizeof(float);
    DeviceMemory x(context.device, bytes), y(context.device, bytes), grad_y(context.device, bytes),
        grad_x(context.device, bytes);
    fill_bytes(x.data(), 0x3c, bytes, context.device);
    fill_bytes(grad_y.data(), 0xbc, bytes, context.device);
    auto view = [&](const DeviceMemory& m) { return nhwc(static_cast<float*>(m.data()), n, s.h, s.w, s.c); };
    if (wanted(context, "activation", "leaky fwd", shape))
      out.push_back({"leaky fwd", shape, time_ms(context, [&] {
                       if (gpu) activation_forward_cuda(Activation::Leaky, as_const(view(x)), view(y), context.stream);
                       else activation_forward_cpu(Activation::Leaky, as_const(view(x)), view(y));
                     }),
                     2.0 * double(bytes), 0});
    if (wanted(context, "activation", "leaky bwd", shape))
      out.push_back({"leaky bwd", shape, time_ms(context, [&] {
                       if (gpu)
                         activation_backward_cuda(Activation::Leaky, as_const(view(y)), as_const(view(grad_y)),
                                                  view(grad_x), context.stream);
                       else
                         activation_backward_cpu(Activation::Leaky, as_const(view(y)), as_const(view(grad_y)),
                                                 view(grad_x));
                     }),
                     3.0 * double(bytes), 0});
  }
});

}  // namespace
}  // namespace yolo::bench
