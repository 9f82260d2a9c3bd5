// The small layers at YOLOv3-416 shapes (batch = context.batch): upsample, route, shortcut,
// maxpool (yolov3-tiny's two kinds), softmax cross-entropy (the MNIST MLP's head) and the
// optimizer step over all of YOLOv3's parameters as one bucket, with the gradient helpers.
// Bytes: every input read once and every output written once (an accumulating output counts
// as read and written).
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/maxpool.h"
#include "kernels/route.h"
#include "kernels/sgd.h"
#include "kernels/shortcut.h"
#include "kernels/softmax.h"
#include "kernels/upsample.h"
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {
namespace {

// Device (or host, for the CPU) floats filled with a non-zero pseudo-random pattern in [-1, 1).
class Floats {
 public:
  Floats(const Context& context, size_t count) : memory_(context.device, count * sizeof(float)), count_(count) {
    std::vector<float> host(count);
    uint32_t state = 0x9E3779B9u ^ uint32_t(count);
    for (float& v : host) {
      state = state * 1664525u + 1013904223u;
      v = float(int32_t(state >> 8) - (1 << 23)) / float(1 << 23);
      if (v == 0.0f) v = 0.5f;
    }
    copy_bytes(memory_.data(), host.data(), count * sizeof(float));
  }
  float* data() const { return static_cast<float*>(memory_.data()); }
  size_t bytes() const { return count_ * sizeof(float); }

 private:
  DeviceMemory memory_;
  size_t count_;
};

std::string hwc(int h, int w, int c) { return std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c); }

// Runs `cuda` on a GPU context, `cpu` otherwise, and returns the median milliseconds.
template <typename Cuda, typename Cpu>
double timed(const Context& context, const Cuda& cuda, const Cpu& cpu) {
  if (context.device.is_cuda()) return time_ms(context, cuda);
  return time_ms(context, cpu);
}

BENCH_ENTRY("upsample", [](const Context& context, std::vector<Result>& out) {
  const int n = context.batch;
  for (auto [h, c] : {std::pair{13, 256}, {26, 128}}) {
    Floats small(context, size_t(n) * h * h * c), big(context, size_t(n) * 4 * h * h * c);
    ConstAct in = nhwc<const float>(small.data(), n, h, h, c);
    Act up = nhwc(big.data(), n, 2 * h, 2 * h, c);
    std::string shape = "b x " + hwc(h, h, c) + " -> " + hwc(2 * h, 2 * h, c);
    double bytes = double(small.bytes() + big.bytes());
    Result fwd{"upsample fwd", shape, 0, bytes, 0}, bwd{"upsample bwd", shape, 0, bytes, 0};
    fwd.ms = timed(context, [&] { upsample_forward_cuda(in, up, 2, context.stream); },
                   [&] { upsample_forward_cpu(in, up, 2); });
    Act grad_in = nhwc(small.data(), n, h, h, c);
    bwd.ms = timed(context, [&] { upsample_backward_cuda(as_const(up), grad_in, 2, false, context.stream); },
                   [&] { upsample_backward_cpu(as_const(up), grad_in, 2, false); });
    out.push_back(fwd);
    out.push_back(bwd);
  }
});

BENCH_ENTRY("route", [](const Context& context, std::vector<Result>& out) {
  const int n = context.batch;
  for (auto [h, c0, c1] : {std::tuple{26, 256, 512}, {52, 128, 256}}) {
    Floats a(context, size_t(n) * h * h * c0), b(context, size_t(n) * h * h * c1), cat(context, size_t(n) * h * h * (c0 + c1));
    std::vector<ConstAct> inputs = {nhwc<const float>(a.data(), n, h, h, c0), nhwc<const float>(b.data(), n, h, h, c1)};
    std::vector<Act> grads = {nhwc(a.data(), n, h, h, c0), nhwc(b.data(), n, h, h, c1)};
    Act wide = nhwc(cat.data(), n, h, h, c0 + c1);
    std::string shape = "b x " + std::to_string(h) + "x" + std::to_string(h) + " " + std::to_string(c0) + "+" +
                        std::to_string(c1) + "->" + std::to_string(c0 + c1);
    double bytes = 2.0 * double(cat.bytes());
    Result fwd{"route fwd", shape, 0, bytes, 0}, bwd{"route bwd", shape, 0, bytes, 0};
    fwd.ms = timed(context, [&] { route_forward_cuda(inputs, wide, context.stream); },
                   [&] { route_forward_cpu(inputs, wide); });
    bwd.ms = timed(context, [&] { route_backward_cuda(as_const(wide), grads, false, context.stream); },
                   [&] { route_backward_cpu(as_const(wide), grads, false); });
    out.push_back(fwd);
    out.push_back(bwd);
  }
});

BENCH_ENTRY("shortcut", [](const Context& context, std::vector<Result>& out) {
  const int n = context.batch;
  for (auto [h, c] : {std::pair{208, 64}, {104, 128}, {52, 256}}) {
    size_t count = size_t(n) * h * h * c;
    Floats a(context, count), b(context, count), sum(context, count), grad_a(context, count);
    ConstAct va = nhwc<const float>(a.data(), n, h, h, c), vb = nhwc<const float>(b.data(), n, h, h, c);
    Act vs = nhwc(sum.data(), n, h, h, c), vga = nhwc(grad_a.data(), n, h, h, c), vgb = nhwc(b.data(), n, h, h, c);
    std::string shape = "b x " + hwc(h, h, c);
    Result fwd{"shortcut fwd", shape, 0, 3.0 * double(a.bytes()), 0};
    // grad_a written, grad_b accumulated (its layer has another consumer): 4 passes over memory.
    Result bwd{"shortcut bwd", shape + " (=, +=)", 0, 4.0 * double(a.bytes()), 0};
    fwd.ms = timed(context, [&] { shortcut_forward_cuda(va, vb, vs, context.stream); },
                   [&] { shortcut_forward_cpu(va, vb, vs); });
    bwd.ms = timed(context, [&] { shortcut_backward_cuda(as_const(vs), vga, vgb, false, true, context.stream); },
                   [&] { shortcut_backward_cpu(as_const(vs), vga, vgb, false, true); });
    out.push_back(fwd);
    out.push_back(bwd);
  }
});

BENCH_ENTRY("maxpool", [](const Context& context, std::vector<Result>& out) {
  const int n = context.batch;
  for (auto [h, c, size, stride] : {std::tuple{416, 16, 2, 2}, {13, 512, 2, 1}}) {
    int oh = maxpool_output_size(h, size, stride);
    size_t in_count = size_t(n) * h * h * c, out_count = size_t(n) * oh * oh * c;
    Floats in(context, in_count), pooled(context, out_count), grad_in(context, in_count);
    DeviceMemory argmax(context.device, out_count * sizeof(int));
    int* index = static_cast<int*>(argmax.data());
    ConstAct vin = nhwc<const float>(in.data(), n, h, h, c);
    Act vout = nhwc(pooled.data(), n, oh, oh, c), vgrad = nhwc(grad_in.data(), n, h, h, c);
    std::string shape = "b x " + hwc(h, h, c) + " k" + std::to_string(size) + " s" + std::to_string(stride);
    double bytes = double(in.bytes() + 2 * pooled.bytes());  // out and argmax are the same size
    Result fwd{"maxpool fwd", shape, 0, bytes, 0}, bwd{"maxpool bwd", shape, 0, bytes, 0};
    fwd.ms = timed(context, [&] { maxpool_forward_cuda(vin, vout, index, size, stride, context.stream); },
                   [&] { maxpool_forward_cpu(vin, vout, index, size, stride); });
    bwd.ms = timed(context, [&] { maxpool_backward_cuda(as_const(vout), index, vgrad, size, stride, false, context.stream); },
                   [&] { maxpool_backward_cpu(as_const(vout), index, vgrad, size, stride, false); });
    out.push_back(fwd);
    out.push_back(bwd);
  }
});

BENCH_ENTRY("softmax", [](const Context& context, std::vector<Result>& out) {
  const int n = 128, k = 10;  // the MNIST MLP's head: a launch-latency measurement
  Floats logits(context, size_t(n) * k), grad(context, size_t(n) * k), loss(context, 1);
  std::vector<int> labels(n);
  for (int i = 0; i < n; ++i) labels[size_t(i)] = (i * 7) % k;
  DeviceMemory d_labels(context.device, n * sizeof(int)), d_flag(context.device, sizeof(int));
  copy_bytes(d_labels.data(), labels.data(), n * sizeof(int));
  fill_bytes(d_flag.data(), 0, sizeof(int), context.device);
  const int* l = static_cast<const int*>(d_labels.data());
  Result r{"softmax_ce fwd+bwd", "N=128 K=10", 0, double(2 * logits.bytes() + n * sizeof(int) + sizeof(float)), 0};
  r.ms = timed(
      context,
      [&] {
        softmax_cross_entropy_cuda(logits.data(), l, n, k, loss.data(), grad.data(), nullptr,
                                   static_cast<int*>(d_flag.data()), context.stream);
      },
      [&] { softmax_cross_entropy_cpu(logits.data(), l, n, k, loss.data(), grad.data(), nullptr); });
  out.push_back(r);
});

BENCH_ENTRY("sgd", [](const Context& context, std::vector<Result>& out) {
  const size_t count = 61949149;  // YOLOv3's parameters, one bucket
  Floats w(context, count), g(context, count), u(context, count);
  // 75 layers' worth of segments: each a run of small no-decay parameters, then decayed weights.
  std::vector<SgdSegment> segments;
  const size_t layers = 75, per_layer = count / layers;
  for (size_t i = 0, next = 0; i < layers; ++i) {
    size_t end = i + 1 == layers ? count : next + per_layer;
    for (int s = 0; s < 4; ++s) segments.push_back({next + size_t(s) * 512, 512, false});
    segments.push_back({next + 2048, end - next - 2048, true});
    next = end;
  }
  sgd_check_segments(segments.data(), int(segments.size()), 0, count);
  DeviceMemory d_segments(context.device, segments.size() * sizeof(SgdSegment)), d_flag(context.device, sizeof(int));
  copy_bytes(d_segments.data(), segments.data(), segments.size() * sizeof(SgdSegment));
  fill_bytes(d_flag.data(), 0, sizeof(int), context.device);
  const auto* table = static_cast<const SgdSegment*>(d_segments.data());
  const SgdHyper hyper{1e-3f, 0.9f, 5e-4f, 1.0f / 64};
  int* flag = static_cast<int*>(d_flag.data());
  std::string shape = "61,949,149 floats, " + std::to_string(segments.size()) + " segments";
  Result update{"sgd update", shape, 0, 5.0 * double(w.bytes()), 0};
  update.ms = timed(
      context,
      [&] {
        sgd_update_cuda(w.data(), g.data(), u.data(), table, int(segments.size()), 0, count, hyper, context.stream);
      },
      [&] { sgd_update_cpu(w.data(), g.data(), u.data(), segments.data(), int(segments.size()), 0, count, hyper); });
  Result check{"grad nonfinite check", "61,949,149 floats", 0, double(g.bytes()), 0};
  check.ms = timed(context, [&] { grad_nonfinite_check_cuda(g.data(), count, flag, context.stream); },
                   [&] { grad_nonfinite_check_cpu(g.data(), count, flag); });
  Result scale{"grad scale", "61,949,149 floats", 0, 2.0 * double(g.bytes()), 0};
  scale.ms = timed(context, [&] { grad_scale_inplace_cuda(g.data(), count, 1.0f, context.stream); },
                   [&] { grad_scale_inplace_cpu(g.data(), count, 1.0f); });
  out.push_back(update);
  out.push_back(check);
  out.push_back(scale);
});

}  // namespace
}  // namespace yolo::bench
