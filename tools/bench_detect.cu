// Detection at the three YOLOv3-416 heads (13x13, 26x26, 52x52; 3 anchors, 80 classes): decode
// at darknet's evaluation threshold 0.005, then NMS (IoU 0.45) on what it found. Inputs look like
// a trained net's: objectness and class logits mostly low, so a few percent of the pairs pass.
// Bytes: decode reads the input and writes the detections; NMS reads them and writes keep.
#include <random>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/detect.h"
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {
namespace {

BENCH_ENTRY("detect", [](const Context& context, std::vector<Result>& out) {
  const std::vector<float>& anchors = yolov3_anchors();
  const std::vector<YoloHead>& layers = yolov3_heads_416();
  const float threshold = 0.005f, iou_threshold = 0.45f;
  const int n = context.batch, classes = 80;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> box(-1.0f, 1.0f);
  std::normal_distribution<float> objectness(-6.0f, 2.0f), class_logit(-4.0f, 2.0f);
  for (const YoloHead& layer : layers) {
    YoloLossConfig config = make_yolo_loss_config(anchors, layer.mask, classes, 416, 416);
    const int c = yolo_loss_channels(config), g = layer.grid;
    const size_t elements = size_t(n) * g * g * c;
    std::vector<float> input(elements);
    for (size_t e = 0; e < elements; ++e) {
      size_t channel = e % (5 + classes);
      input[e] = channel < 4 ? box(rng) : channel == 4 ? objectness(rng) : class_logit(rng);
    }
    DeviceMemory d_input(context.device, elements * sizeof(float));
    copy_bytes(d_input.data(), input.data(), elements * sizeof(float));
    ConstAct in = nhwc<const float>(static_cast<const float*>(d_input.data()), n, g, g, c);
    const std::string shape = "b x " + std::to_string(g) + "x" + std::to_string(g) + "x255";

    Result decode{"detect decode", shape, 0, 0, 0}, nms{"detect nms 0.45", "", 0, 0, 0};
    int found = 0;
    if (context.device.is_cuda()) {
      size_t bytes = yolo_decode_workspace_bytes(n, g, g, config);
      DeviceMemory workspace(context.device, bytes), d_count(context.device, sizeof(int));
      auto* count = static_cast<int*>(d_count.data());
      yolo_decode_cuda(in, config, threshold, nullptr, 0, count, workspace.data(), bytes, context.stream);
#if YOLO_CUDA
      CHECKED(cudaStreamSynchronize(context.stream));  // the bench's stream does not wait for the null stream
#endif
      copy_bytes(&found, count, sizeof(int));
      DeviceMemory d_detections(context.device, size_t(found + 1) * sizeof(Detection)),
          d_keep(context.device, size_t(found + 1) * sizeof(int));
      auto* detections = static_cast<Detection*>(d_detections.data());
      decode.ms = time_ms(context, [&] {
        yolo_decode_cuda(in, config, threshold, detections, found, count, workspace.data(), bytes, context.stream);
      });
      nms.ms = time_ms(context, [&] {
        nms_cuda(detections, found, iou_threshold, static_cast<int*>(d_keep.data()), context.stream);
      });
    } else {
      std::vector<Detection> detections;
      decode.ms = time_ms(context, [&] {
        detections.clear();
        yolo_decode_cpu(in, config, threshold, detections);
      });
      found = int(detections.size());
      std::vector<int> keep(detections.size());
      nms.ms = time_ms(context, [&] { nms_cpu(detections.data(), found, iou_threshold, keep.data()); });
    }
    decode.shape += ", " + std::to_string(found) + " found";
    nms.shape = shape + ", " + std::to_string(found) + " boxes";
    decode.bytes = double(elements) * sizeof(float) + double(found) * sizeof(Detection);
    nms.bytes = double(found) * (sizeof(Detection) + sizeof(int));
    out.push_back(decode);
    out.push_back(nms);
  }
});

}  // namespace
}  // namespace yolo::bench
