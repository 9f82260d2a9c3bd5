// Inference, decoding, NMS, mAP and drawing over a trained executor (see evaluate.h).
#include "graph/evaluate.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "data/draw.h"
#include "data/feeder.h"
#include "data/image.h"
#include "data/json.h"
#include "data/loader.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/memory.h"

namespace yolo::graph {

namespace {

// (image, class, score descending, layer, index): one order for every backend.
bool detection_before(const Detection& a, const Detection& b) {
  if (a.image != b.image) return a.image < b.image;
  if (a.class_id != b.class_id) return a.class_id < b.class_id;
  return a.score > b.score;
}

}  // namespace

std::vector<ImageDetections> detect_samples(Executor& executor, const std::vector<data::Sample>& samples,
                                            const DetectOptions& options) {
  const Graph& graph = executor.graph();
  if (!graph.detection) throw Error(graph.path + ": not a detector (no [yolo] layers)");
  std::vector<ImageDetections> results(samples.size());
  if (samples.empty()) return results;
  data::Split split;
  split.name = "detect";
  split.samples = samples;
  data::LoaderOptions lo;
  lo.batch = executor.micro_batch();
  lo.net_w = graph.input.w;
  lo.net_h = graph.input.h;
  lo.resize = options.resize;
  lo.augment = false;
  lo.shuffle = false;
  lo.remainder = data::Remainder::Wrap;  // every image; the repeats of the last batch are skipped
  lo.threads = options.threads;
  data::Loader loader(split, lo);
  data::DeviceFeeder feeder(loader, executor.device());

  std::vector<int> yolo_nodes;
  for (const Node& node : graph.nodes)
    if (node.spec.type == LayerType::Yolo) yolo_nodes.push_back(node.index);
  // Decoded on the device; the candidates (above the threshold only) copied back, sorted and
  // suppressed on the device again.
  DeviceMemory device_dets, device_count, workspace, device_keep;
  size_t workspace_bytes = 0, total_capacity = 0;
  std::vector<int> capacity;  // per head
  // Room for every (prediction, class) of every head: early in training nearly all pass 0.005.
  // Workspace: the CUDA decode's, sized for the current GPU (the CPU decode needs none).
  for (int i : yolo_nodes) {
    const Node& node = graph.nodes[i];
    if (executor.device().runs_kernels())
      workspace_bytes = std::max(workspace_bytes, yolo_decode_workspace_bytes(lo.batch, node.in.h, node.in.w, node.yolo));
    size_t pairs = static_cast<size_t>(lo.batch) * node.in.h * node.in.w * node.yolo.mask_count * node.yolo.classes;
    capacity.push_back(static_cast<int>(std::min<size_t>(pairs, INT32_MAX)));
    total_capacity += pairs;
  }
  device_dets = DeviceMemory(executor.device(), total_capacity * sizeof(Detection));
  device_count = DeviceMemory(executor.device(), sizeof(int));
  device_keep = DeviceMemory(executor.device(), total_capacity * sizeof(int));
  if (workspace_bytes) workspace = DeviceMemory(executor.device(), workspace_bytes);
  Stream& stream = executor.compute_stream();
  const OpContext ops{&stream, workspace.data(), workspace_bytes};
  auto* dets = static_cast<Detection*>(device_dets.data());
  std::vector<bool> done(samples.size(), false);
  std::vector<Detection> candidates, layer_dets;
  std::vector<int> keep;
  for (int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    const data::DeviceBatch& batch = feeder.next(stream);
    executor.infer(batch.images);
    candidates.clear();
    for (size_t head = 0; head < yolo_nodes.size(); ++head) {
      const int i = yolo_nodes[head];
      const Node& node = graph.nodes[i];
      yolo_decode(ops, executor.output(i), node.yolo, options.threshold, dets, capacity[head],
                  static_cast<int*>(device_count.data()));
      int found = 0;
      copy_and_wait(&found, device_count.data(), sizeof found, stream);
      layer_dets.resize(static_cast<size_t>(std::min(found, capacity[head])));
      copy_and_wait(layer_dets.data(), dets, layer_dets.size() * sizeof(Detection), stream);
      candidates.insert(candidates.end(), layer_dets.begin(), layer_dets.end());
    }
    // All heads together, per (image, class) by descending score, then NMS.
    std::stable_sort(candidates.begin(), candidates.end(), detection_before);
    keep.assign(candidates.size(), 0);
    if (!candidates.empty()) {
      size_t count = candidates.size();  // at most total_capacity
      copy_bytes(dets, candidates.data(), count * sizeof(Detection), &stream);
      nms(ops, dets, static_cast<int>(count), options.nms, static_cast<int*>(device_keep.data()));
      copy_and_wait(keep.data(), device_keep.data(), count * sizeof(int), stream);
    }

    const data::Batch& host = *batch.host;
    for (int b = 0; b < host.count; ++b) {
      const data::SampleInfo& info = host.samples[b];
      size_t index = static_cast<size_t>(info.index);
      if (done[index]) continue;  // the last batch wraps around to the first images
      done[index] = true;
      ImageDetections& result = results[index];
      result.image = samples[index].image;
      result.ok = info.ok;
      result.width = info.placement.image_w;
      result.height = info.placement.image_h;
      if (!info.ok) continue;
      for (size_t k = 0; k < candidates.size(); ++k) {
        const Detection& d = candidates[k];
        if (d.image != b || !keep[k]) continue;
        data::Box box = info.placement.to_image(data::Box{d.x, d.y, d.w, d.h, d.class_id, false});
        PixelDetection p;
        p.class_id = d.class_id;
        p.score = d.score;
        float w = static_cast<float>(result.width), h = static_cast<float>(result.height);
        p.x0 = std::clamp((box.x - box.w / 2) * w, 0.0f, w);
        p.x1 = std::clamp((box.x + box.w / 2) * w, 0.0f, w);
        p.y0 = std::clamp((box.y - box.h / 2) * h, 0.0f, h);
        p.y1 = std::clamp((box.y + box.h / 2) * h, 0.0f, h);
        if (p.x1 > p.x0 && p.y1 > p.y0) result.detections.push_back(p);
      }
    }
  }
  return results;
}

data::MapResult evaluate_split(Executor& executor, const data::Split& split, int classes, DetectOptions options,
                               std::vector<ImageDetections>* found_out) {
  options.threshold = 0.005f;
  std::vector<ImageDetections> found = detect_samples(executor, split.samples, options);
  std::vector<data::EvalBox> detections, truths;
  for (size_t i = 0; i < found.size(); ++i) {
    const ImageDetections& image = found[i];
    if (!image.ok) continue;  // unreadable: warned about by the loader, left out
    float w = static_cast<float>(image.width), h = static_cast<float>(image.height);
    for (const PixelDetection& d : image.detections)
      detections.push_back(data::EvalBox{static_cast<int>(i), d.class_id, d.x0, d.y0, d.x1, d.y1, d.score, false});
    for (const data::Box& b : split.samples[i].boxes)
      truths.push_back(data::EvalBox{static_cast<int>(i), b.class_id, (b.x - b.w / 2) * w, (b.y - b.h / 2) * h,
                                     (b.x + b.w / 2) * w, (b.y + b.h / 2) * h, 0, b.difficult});
  }
  if (found_out) *found_out = found;
  return data::evaluate_map(detections, truths, classes);
}

void write_coco_detections(const std::string& path, const std::vector<ImageDetections>& found, const data::Split& split,
                           const std::vector<int64_t>& category_ids) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "[";
    const char* sep = "\n";
    for (size_t i = 0; i < found.size() && i < split.samples.size(); ++i) {
      if (!found[i].ok) continue;
      const int64_t image_id = split.samples[i].image_id;
      if (image_id < 0)
        throw Error(split.samples[i].image + ": no image id (the dataset readers give every image one)");
      for (const PixelDetection& d : found[i].detections) {
        const int64_t category =
            category_ids.empty() ? d.class_id + 1 : category_ids.at(static_cast<size_t>(d.class_id));
        char line[256];
        std::snprintf(
            line, sizeof line,
            "{\"image_id\": %lld, \"category_id\": %lld, \"bbox\": [%.3f, %.3f, %.3f, %.3f], \"score\": %.6f}",
            static_cast<long long>(image_id), static_cast<long long>(category), d.x0, d.y0, d.x1 - d.x0, d.y1 - d.y0,
            d.score);
        out << sep << line;
        sep = ",\n";
      }
    }
    out << "\n]\n";
    if (!out) throw Error("cannot write the detections file " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

std::string detection_json(const std::string& image, const std::string& class_name, const PixelDetection& d) {
  char numbers[160];
  std::snprintf(numbers, sizeof numbers, ", \"score\": %.4f, \"box\": [%.1f, %.1f, %.1f, %.1f]}", d.score, d.x0, d.y0,
                d.x1, d.y1);
  return "{\"image\": " + data::json_string(image) + ", \"class\": " + data::json_string(class_name) + numbers;
}

void write_detections_image(const ImageDetections& detections, const std::vector<std::string>& names,
                            const std::string& path) {
  data::Image image;
  std::string error;
  if (!data::read_image(detections.image, image, error)) throw Error(error);
  std::vector<data::DrawnBox> boxes;
  for (const PixelDetection& d : detections.detections)
    boxes.push_back(data::DrawnBox{d.x0, d.y0, d.x1, d.y1, d.class_id, d.score});
  data::draw_detections(image, boxes, names);
  data::write_image(path, image);
}

}  // namespace yolo::graph
