// The YOLO loss at the three YOLOv3-416 detection layers (13x13, 26x26, 52x52; 3 anchors each,
// 80 classes -> 255 channels), 20 random truths per image. Bytes: input read + grad written.
#include <random>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/yolo_loss.h"
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {
namespace {

BENCH_ENTRY("yolo_loss", [](const Context& context, std::vector<Result>& out) {
  const std::vector<float>& anchors = yolov3_anchors();
  const std::vector<YoloHead>& layers = yolov3_heads_416();
  const int truths_per_image = 20, n = context.batch;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), unit(0.02f, 0.98f), size(0.02f, 0.6f);
  for (const YoloHead& layer : layers) {
    YoloLossConfig config = make_yolo_loss_config(anchors, layer.mask, 80, 416, 416);
    const int c = yolo_loss_channels(config), g = layer.grid;
    const size_t elements = size_t(n) * g * g * c;
    std::vector<float> input(elements);
    for (float& v : input) v = uniform(rng);
    std::vector<YoloTruth> truths(size_t(n) * truths_per_image);
    for (YoloTruth& t : truths) t = YoloTruth{unit(rng), unit(rng), size(rng), size(rng), int(rng() % 80)};
    std::vector<int> counts(size_t(n), truths_per_image);
    YoloLossStats host_stats;

    DeviceMemory d_input(context.device, elements * 4), d_grad(context.device, elements * 4),
        d_truths(context.device, truths.size() * sizeof(YoloTruth)), d_counts(context.device, counts.size() * 4),
        d_stats(context.device, sizeof(YoloLossStats));
    copy_bytes(d_input.data(), input.data(), elements * 4);
    copy_bytes(d_truths.data(), truths.data(), truths.size() * sizeof(YoloTruth));
    copy_bytes(d_counts.data(), counts.data(), counts.size() * 4);
    ConstAct in = nhwc<const float>(static_cast<const float*>(d_input.data()), n, g, g, c);
    Act grad = nhwc(static_cast<float*>(d_grad.data()), n, g, g, c);
    const auto* t = static_cast<const YoloTruth*>(d_truths.data());
    const auto* k = static_cast<const int*>(d_counts.data());

    Result r{"yolo_loss fwd+bwd", "b x " + std::to_string(g) + "x" + std::to_string(g) + "x255", 0,
             2.0 * double(elements) * 4, 0};
    if (context.device.is_cuda()) {
      size_t bytes = yolo_loss_workspace_bytes(n, g, g, config);
      DeviceMemory workspace(context.device, bytes);
      r.ms = time_ms(context, [&] {
        yolo_loss_cuda(in, config, t, k, truths_per_image, grad, static_cast<YoloLossStats*>(d_stats.data()),
                       workspace.data(), bytes, context.stream);
      });
    } else {
      r.ms = time_ms(context, [&] { yolo_loss_cpu(in, config, t, k, truths_per_image, grad, &host_stats); });
    }
    out.push_back(r);
  }
});

}  // namespace
}  // namespace yolo::bench
