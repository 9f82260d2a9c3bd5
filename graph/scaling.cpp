// The data-parallel scaling model (see scaling.h): presets, profiles and the step arithmetic.
#include "graph/scaling.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "runtime/check.h"

namespace yolo::graph {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kMaxBatch = 1 << 20;
constexpr int kMaxGpus = 1 << 16;
constexpr double kMaxEventUs = 1e9;  // a layer over 1000 s is not a trace of a training step

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

void check_batch(int batch) {
  if (batch < 1 || batch > kMaxBatch)
    throw Error("scaling model: batch " + std::to_string(batch) + " is not in 1.." + std::to_string(kMaxBatch));
}

[[noreturn]] void trace_error(const std::string& file, int line, const std::string& message) {
  throw Error(file + ":" + std::to_string(line) + ": " + message);
}

// "12 conv" -> 12 and "conv"; false when the name has another form.
bool split_event_name(const std::string& name, int& index, std::string& type) {
  size_t space = name.find(' ');
  if (space == std::string::npos || space == 0) return false;
  auto [end, ec] = std::from_chars(name.data(), name.data() + space, index);
  if (ec != std::errc() || end != name.data() + space || index < 0) return false;
  type = name.substr(space + 1);
  return !type.empty();
}

struct TracedLayer {
  int node = 0;
  double ts = 0, dur_ms = 0;
};

}  // namespace

Link link_preset(const std::string& name) {
  // PCIe 3.0 x16 carries 15.75 GB/s per direction before packet overhead (8 GT/s x 16 lanes,
  // 128b/130b); device-to-device copies reach 11-13 GB/s, and NCCL's ring over PCIe (T4 boxes,
  // no NVLink, often through the CPU's root complex) reports about 10 GB/s bus bandwidth.
  if (name == "pcie3") return Link{"pcie3", 10, 10};
  // NVLink 4 (H100/H200 SXM, NVSwitch): 450 GB/s per direction per GPU; nccl-tests' all-reduce
  // bus bandwidth at 8 GPUs is about 370 GB/s without NVLink SHARP.
  if (name == "nvlink4") return Link{"nvlink4", 5, 370};
  throw Error("unknown link '" + name + "' (known: pcie3, nvlink4)");
}

double ring_allreduce_ms(double bytes, int ranks, const Link& link) {
  if (ranks < 1 || ranks > kMaxGpus) throw Error("all-reduce over " + std::to_string(ranks) + " ranks");
  if (!(bytes >= 0) || !std::isfinite(bytes)) throw Error("all-reduce of " + number_text(bytes) + " bytes");
  if (!(link.bus_bandwidth_GBs > 0) || !(link.latency_us >= 0) || !std::isfinite(link.bus_bandwidth_GBs) ||
      !std::isfinite(link.latency_us))
    throw Error("link '" + link.name + "': bandwidth must be > 0 and latency >= 0 (finite)");
  if (ranks == 1) return 0;
  double steps = 2.0 * (ranks - 1);
  return steps / ranks * bytes / (link.bus_bandwidth_GBs * 1e6) + steps * link.latency_us / 1000;
}

DevicePreset device_preset(const std::string& name) {
  if (name == "t4") return DevicePreset{"t4", 8.1, 320, 65};  // datasheet figures: no T4 was measured
  // Measured, docs/perf.md "Device ceilings"; bf16: cuBLAS's rate (gpu-results/2026-12-04-h200).
  if (name == "h200") return DevicePreset{"h200", 60.6, 4260, 790};
  throw Error("unknown device '" + name + "' (known: t4, h200)");
}

double Profile::backward_ms() const {
  double sum = 0;
  for (const LayerCost& layer : backward) sum += layer.backward_ms;
  return sum;
}

int64_t Profile::gradient_bytes() const {
  int64_t sum = 0;
  for (const LayerCost& layer : backward) sum += layer.grad_bytes;
  return sum;
}

double optimizer_ms_estimate(int64_t trainable, const DevicePreset& device) {
  if (!(device.memory_GBs > 0)) throw Error("device '" + device.name + "': memory bandwidth must be > 0");
  return 20.0 * static_cast<double>(trainable) / (device.memory_GBs * 1e6);
}

Profile profile_from_flops(const Graph& graph, int batch, const DevicePreset& device, double efficiency,
                           ProfileMath math) {
  check_batch(batch);
  if (!(efficiency > 0 && efficiency <= 1))
    throw Error("scaling model: efficiency " + number_text(efficiency) + " is not in (0, 1]");
  const bool tensor = math == ProfileMath::Tensor16;
  const double peak = tensor ? device.tensor_tflops : device.peak_tflops;
  if (!(peak > 0))
    throw Error("device '" + device.name + "': " + (tensor ? "16-bit tensor-core" : "peak") +
                " TFLOP/s must be > 0");
  if (tensor && !(device.memory_GBs > 0)) throw Error("device '" + device.name + "': memory bandwidth must be > 0");
  const double flops_per_ms = efficiency * peak * 1e9, bytes_per_ms = device.memory_GBs * 1e6;
  // A layer's forward time: its FLOPs; with Tensor16, at least its 16-bit bytes' time.
  auto forward_ms = [&](const Node& node) {
    const double compute = node.flops * batch / flops_per_ms;
    if (!tensor) return compute;
    const double bytes =
        2.0 * (static_cast<double>(batch) * static_cast<double>(node.in.elements() + node.out.elements()) +
               static_cast<double>(node.weights));
    return std::max(compute, bytes / bytes_per_ms);
  };
  Profile profile;
  profile.batch = batch;
  char source[240];
  if (tensor)
    std::snprintf(source, sizeof source,
                  "FLOP-derived (not measured): %s, %.0f TFLOP/s 16-bit tensor cores x efficiency %.2f, at least "
                  "16-bit bytes at %.0f GB/s, backward = 2 x forward",
                  device.name.c_str(), peak, efficiency, device.memory_GBs);
  else
    std::snprintf(source, sizeof source,
                  "FLOP-derived (not measured): %s, %.1f TFLOP/s FP32 x efficiency %.2f, backward = 2 x forward",
                  device.name.c_str(), peak, efficiency);
  profile.source = source;
  for (const Node& node : graph.nodes)
    if (node.flops > 0 || node.trainable() > 0) profile.forward_ms += forward_ms(node);
  for (auto it = graph.nodes.rbegin(); it != graph.nodes.rend(); ++it) {
    if (it->flops <= 0 && it->trainable() == 0) continue;
    profile.backward.push_back(LayerCost{std::to_string(it->index) + " " + layer_type_name(it->spec.type),
                                         2 * forward_ms(*it), 4 * it->trainable()});
  }
  profile.optimizer_ms = optimizer_ms_estimate(graph.trainable, device);
  return profile;
}

Profile scale_compute(Profile profile, double factor) {
  if (!(factor > 0) || !std::isfinite(factor))
    throw Error("scaling model: compute scale " + number_text(factor) + " is not a positive factor");
  profile.forward_ms *= factor;
  for (LayerCost& layer : profile.backward) layer.backward_ms *= factor;
  char note[96];
  std::snprintf(note, sizeof note, "; forward and backward x %g (--compute-scale)", factor);
  profile.source += note;
  return profile;
}

Profile profile_from_trace(const data::JsonValue& trace, const std::string& file, const Graph& graph, int batch,
                           double optimizer_ms) {
  check_batch(batch);
  if (!(optimizer_ms >= 0) || !std::isfinite(optimizer_ms))
    throw Error("scaling model: optimizer time " + number_text(optimizer_ms) + " ms is not a time");
  const data::JsonValue* events = &trace;
  if (trace.kind == data::JsonKind::Object) events = trace.find("traceEvents");
  if (!events || events->kind != data::JsonKind::Array)
    trace_error(file, trace.line, "a Chrome trace is an array of events or an object with a \"traceEvents\" array");

  std::vector<TracedLayer> forward, backward;
  std::vector<char> seen(2 * graph.nodes.size(), 0);
  for (const data::JsonValue& event : events->items) {
    if (event.kind != data::JsonKind::Object)
      trace_error(file, event.line, std::string("a trace event must be an object, not ") + json_kind_name(event.kind));
    const data::JsonValue* ph = event.find("ph");
    const data::JsonValue* cat = event.find("cat");
    if (!ph || ph->kind != data::JsonKind::String || ph->string != "X") continue;  // metadata, instants
    if (!cat || cat->kind != data::JsonKind::String || (cat->string != "forward" && cat->string != "backward"))
      continue;
    bool is_backward = cat->string == "backward";
    const data::JsonValue* name = event.find("name");
    int index = 0;
    std::string type;
    if (!name || name->kind != data::JsonKind::String || !split_event_name(name->string, index, type))
      trace_error(file, event.line,
                  "a " + cat->string + " event needs a \"name\" \"<layer> <type>\", e.g. \"12 conv\"");
    if (index >= static_cast<int>(graph.nodes.size()))
      trace_error(file, event.line,
                  "layer " + std::to_string(index) + " is not in " + graph.path + " (" +
                      std::to_string(graph.nodes.size()) + " layers): is the trace from another cfg?");
    const Node& node = graph.nodes[index];
    if (type != layer_type_name(node.spec.type))
      trace_error(file, event.line,
                  "layer " + std::to_string(index) + " is a " + type + " here but a " +
                      layer_type_name(node.spec.type) + " in " + graph.path + ": is the trace from another cfg?");
    char& flag = seen[2 * index + (is_backward ? 1 : 0)];
    if (flag)
      trace_error(file, event.line, "a second " + cat->string + " event for layer " + std::to_string(index) +
                                        ": the trace must hold one step (as train_yolo --trace writes)");
    flag = 1;
    const data::JsonValue* ts = event.find("ts");
    const data::JsonValue* dur = event.find("dur");
    if (!ts || ts->kind != data::JsonKind::Number || !std::isfinite(ts->number) ||
        std::fabs(ts->number) > kMaxEventUs * 1e3)
      trace_error(file, event.line, "event \"" + name->string + "\" needs a \"ts\" (microseconds)");
    if (!dur || dur->kind != data::JsonKind::Number || !(dur->number >= 0) || dur->number > kMaxEventUs)
      trace_error(file, event.line,
                  "event \"" + name->string + "\" needs a \"dur\" in microseconds, from 0 to " +
                      number_text(kMaxEventUs));
    (is_backward ? backward : forward).push_back(TracedLayer{index, ts->number, dur->number / 1000});
  }
  if (forward.empty()) trace_error(file, trace.line, "no forward events (\"cat\":\"forward\", \"ph\":\"X\")");
  for (const Node& node : graph.nodes)
    if (node.trainable() > 0 && !seen[2 * node.index + 1])
      trace_error(file, trace.line,
                  "layer " + std::to_string(node.index) + " (" + layer_type_name(node.spec.type) +
                      ") has parameters but no backward event: is the trace from " + graph.path + "?");

  std::stable_sort(backward.begin(), backward.end(),
                   [](const TracedLayer& a, const TracedLayer& b) { return a.ts < b.ts; });
  Profile profile;
  profile.batch = batch;
  profile.source = "measured: trace " + file + " (batch " + std::to_string(batch) + " as given)";
  for (const TracedLayer& layer : forward) profile.forward_ms += layer.dur_ms;
  for (const TracedLayer& layer : backward) {
    const Node& node = graph.nodes[layer.node];
    profile.backward.push_back(LayerCost{std::to_string(node.index) + " " + layer_type_name(node.spec.type),
                                         layer.dur_ms, 4 * node.trainable()});
  }
  profile.optimizer_ms = optimizer_ms;
  return profile;
}

Profile read_trace_profile(const std::string& path, const Graph& graph, int batch, double optimizer_ms) {
  return profile_from_trace(data::read_json_file(path), path, graph, batch, optimizer_ms);
}

std::vector<std::pair<size_t, size_t>> group_layers(const std::vector<int64_t>& layer_bytes, double bucket_mb) {
  if (!(bucket_mb >= 0) || !std::isfinite(bucket_mb))
    throw Error("bucket size " + number_text(bucket_mb) + " MB: it must be >= 0 (0 = one layer each)");
  const double cap = bucket_mb * kMiB;
  std::vector<std::pair<size_t, size_t>> groups;
  double bytes = 0;  // of the open group
  for (size_t i = 0; i < layer_bytes.size(); ++i) {
    if (groups.empty() || bucket_mb == 0 || bytes + static_cast<double>(layer_bytes[i]) > cap) {
      groups.emplace_back(i, i);
      bytes = 0;
    }
    bytes += static_cast<double>(layer_bytes[i]);
    groups.back().second = i + 1;
  }
  return groups;
}

double default_bucket_mb(int64_t gradient_bytes) { return std::min(4.0, static_cast<double>(gradient_bytes) / 4 / kMiB); }

std::vector<Bucket> cut_buckets(const Profile& profile, double bucket_mb) {
  std::vector<int64_t> bytes;
  std::vector<double> ready;  // each gradient layer's backward end
  double clock = 0;
  for (const LayerCost& layer : profile.backward) {
    clock += layer.backward_ms;
    if (layer.grad_bytes <= 0) continue;
    bytes.push_back(layer.grad_bytes);
    ready.push_back(clock);
  }
  std::vector<Bucket> buckets;
  for (auto [first, end] : group_layers(bytes, bucket_mb)) {
    Bucket b;
    for (size_t i = first; i < end; ++i) b.bytes += bytes[i];
    b.ready_ms = ready[end - 1];
    b.layers = static_cast<int>(end - first);
    buckets.push_back(b);
  }
  return buckets;
}

const char* binding_name(Binding binding) {
  switch (binding) {
    case Binding::Compute: return "compute";
    case Binding::Communication: return "communication";
    case Binding::Loader: return "loader";
  }
  return "?";
}

namespace {

// Everything but the efficiency, which needs the one-GPU step.
Prediction predict_without_efficiency(const Profile& profile, const ScalingSetup& setup, int gpus, double bucket_mb,
                                      bool overlap) {
  if (gpus < 1 || gpus > kMaxGpus)
    throw Error("GPU count " + std::to_string(gpus) + " is not in 1.." + std::to_string(kMaxGpus));
  check_batch(profile.batch);
  if (!(setup.loader_images_per_s >= 0) || !std::isfinite(setup.loader_images_per_s))
    throw Error("loader throughput " + number_text(setup.loader_images_per_s) + " images/s: must be >= 0");
  Prediction p;
  p.gpus = gpus;
  p.bucket_mb = bucket_mb;
  p.overlap = overlap;
  double backward = profile.backward_ms();
  p.compute_ms = profile.forward_ms + backward + profile.optimizer_ms;

  std::vector<Bucket> buckets = cut_buckets(profile, bucket_mb);
  p.buckets = static_cast<int>(buckets.size());
  double comm_end = 0;  // on the comm stream, from the start of backward
  for (const Bucket& bucket : buckets) {
    double t = ring_allreduce_ms(static_cast<double>(bucket.bytes), gpus, setup.link);
    p.allreduce_ms += t;
    comm_end = std::max(bucket.ready_ms, comm_end) + t;
  }
  double gpu_step = overlap ? profile.forward_ms + std::max(backward, comm_end) + profile.optimizer_ms
                            : p.compute_ms + p.allreduce_ms;
  p.exposed_comm_ms = gpu_step - p.compute_ms;
  double images = static_cast<double>(gpus) * profile.batch;
  p.loader_ms = setup.loader_images_per_s > 0 ? images / setup.loader_images_per_s * 1000 : 0;
  p.step_ms = std::max(gpu_step, p.loader_ms);
  p.images_per_s = p.step_ms > 0 ? images / p.step_ms * 1000 : 0;
  if (p.loader_ms > gpu_step) p.binding = Binding::Loader;
  else if (p.exposed_comm_ms >= kCommunicationBindsFraction * p.step_ms && p.exposed_comm_ms > 0)
    p.binding = Binding::Communication;
  return p;
}

}  // namespace

Prediction predict_step(const Profile& profile, const ScalingSetup& setup, int gpus, double bucket_mb, bool overlap) {
  Prediction p = predict_without_efficiency(profile, setup, gpus, bucket_mb, overlap);
  double one = predict_without_efficiency(profile, setup, 1, bucket_mb, overlap).step_ms;
  p.efficiency = p.step_ms > 0 ? one / p.step_ms : 1;
  return p;
}

double best_bucket_mb(const Profile& profile, const ScalingSetup& setup, int gpus,
                      const std::vector<double>& candidates) {
  if (candidates.empty()) throw Error("no bucket sizes to choose from");
  std::vector<Prediction> predictions;
  double shortest = 0;
  for (double mb : candidates) {
    predictions.push_back(predict_step(profile, setup, gpus, mb, true));
    shortest = predictions.size() == 1 ? predictions[0].step_ms : std::min(shortest, predictions.back().step_ms);
  }
  const Prediction* best = nullptr;
  for (const Prediction& p : predictions)
    if (p.step_ms <= shortest * (1 + kBucketTieFraction) && (!best || p.buckets < best->buckets)) best = &p;
  return best->bucket_mb;
}

}  // namespace yolo::graph
