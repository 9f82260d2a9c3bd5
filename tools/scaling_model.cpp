// scaling_model: predicts data-parallel step time, exposed communication and efficiency on
// 1..N GPUs, with and without overlap, for several bucket sizes, and which resource binds.
//   scaling_model [--cfg FILE] [--size N] [--batch N]
//                 [--trace FILE | --device t4|h200 [--precision fp32|fp16|bf16] [--efficiency X]]
//                 [--compute-scale F] [--optimizer-ms X] [--link pcie3|nvlink4|custom] [--latency-us X] [--bandwidth-gbs X]
//                 [--loader-ips N | --loader-threads T] [--gpus N | --gpus 1,2,4,8] [--buckets 0,1,4,16,25,64]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "graph/cfg.h"
#include "graph/graph.h"
#include "graph/scaling.h"
#include "runtime/check.h"

using namespace yolo;
using namespace yolo::graph;

namespace {

// docs/perf.md, "Input pipeline": one loader thread decodes, augments and renders 315 images/s
// at 416 on the dev machine (640x480 JPEGs, YOLOv3's augmentation), linear in threads.
constexpr double kLoaderImagesPerThread = 315;

const char* kUsage =
    "usage: scaling_model [--cfg FILE] [--size N] [--batch N]\n"
    "                     [--trace FILE | --device t4|h200 [--precision fp32|fp16|bf16] [--efficiency X]]\n"
    "                     [--compute-scale F] [--optimizer-ms X]\n"
    "                     [--link pcie3|nvlink4|custom] [--latency-us X] [--bandwidth-gbs X]\n"
    "                     [--loader-ips N | --loader-threads T] [--gpus N | --gpus 1,2,4,8]\n"
    "                     [--buckets 0,1,4,16,25,64]   (bucket MB = 2^20 bytes; 0 = one layer each)\n";

double parse_number(const std::string& flag, const std::string& text, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi) {
    char range[64];
    std::snprintf(range, sizeof range, "%g to %g", lo, hi);
    throw Error(flag + " '" + text + "': expected a number from " + range);
  }
  return x;
}

int parse_int(const std::string& flag, const std::string& text, int lo, int hi) {
  double x = parse_number(flag, text, lo, hi);
  if (x != std::floor(x)) throw Error(flag + " " + text + ": expected a whole number");
  return static_cast<int>(x);
}

std::vector<double> parse_list(const std::string& flag, const std::string& text, double lo, double hi) {
  std::vector<double> values;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    values.push_back(parse_number(flag, text.substr(start, comma - start), lo, hi));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (values.size() > 64) throw Error(flag + ": at most 64 values");
  return values;
}

struct Options {
  std::string cfg = "models/yolov3.cfg", trace, device = "h200", link;
  int size = 0, batch = 16;
  double efficiency = -1, optimizer_ms = -1, latency_us = -1, bandwidth_gbs = -1;
  double compute_scale = 1;
  std::string precision = "fp32";  // the FLOP-derived profile's arithmetic
  double loader_ips = -1;
  int loader_threads = 0;  // 0: not given
  std::vector<int> gpus = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<double> buckets = {0, 1, 4, 16, 25, 64};
  bool device_given = false;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--cfg") o.cfg = value();
    else if (arg == "--size") {
      o.size = parse_int(arg, value(), 32, 8192);
      if (o.size % 32) throw Error("--size " + std::to_string(o.size) + ": must be a multiple of 32");
    } else if (arg == "--batch") o.batch = parse_int(arg, value(), 1, 4096);
    else if (arg == "--trace") o.trace = value();
    else if (arg == "--device") {
      o.device = value();
      o.device_given = true;
    } else if (arg == "--efficiency") o.efficiency = parse_number(arg, value(), 0.001, 1);
    else if (arg == "--precision") {
      o.precision = value();
      if (o.precision != "fp32" && o.precision != "fp16" && o.precision != "bf16")
        throw Error("--precision '" + o.precision + "': expected fp32, fp16 or bf16");
    } else if (arg == "--compute-scale") o.compute_scale = parse_number(arg, value(), 0.001, 1000);
    else if (arg == "--optimizer-ms") o.optimizer_ms = parse_number(arg, value(), 0, 1e6);
    else if (arg == "--link") o.link = value();
    else if (arg == "--latency-us") o.latency_us = parse_number(arg, value(), 0, 1e6);
    else if (arg == "--bandwidth-gbs") o.bandwidth_gbs = parse_number(arg, value(), 0.001, 1e6);
    else if (arg == "--loader-ips") o.loader_ips = parse_number(arg, value(), 0.001, 1e9);
    else if (arg == "--loader-threads") o.loader_threads = parse_int(arg, value(), 1, 4096);
    else if (arg == "--gpus") {
      std::string text = value();
      std::vector<double> list = parse_list(arg, text, 1, 4096);
      for (double g : list)
        if (g != std::floor(g)) throw Error(arg + " " + text + ": GPU counts are whole numbers");
      o.gpus.clear();
      if (list.size() == 1)  // N means 1..N
        for (int g = 1; g <= static_cast<int>(list[0]); ++g) o.gpus.push_back(g);
      else
        for (double g : list) o.gpus.push_back(static_cast<int>(g));
    } else if (arg == "--buckets") o.buckets = parse_list(arg, value(), 0, 1e6);
    else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else throw Error("unknown option '" + arg + "'\n" + kUsage);
  }
  if (!o.trace.empty() && o.efficiency >= 0)
    throw Error("--efficiency applies to the FLOP-derived profile, not to --trace (a measured one)");
  if (!o.trace.empty() && o.precision != "fp32")
    throw Error("--precision applies to the FLOP-derived profile, not to --trace (measured in its own precision)");
  if (o.loader_ips >= 0 && o.loader_threads > 0) throw Error("--loader-ips and --loader-threads: give one");
  if (o.link == "custom" && (o.latency_us < 0 || o.bandwidth_gbs < 0))
    throw Error("--link custom needs --latency-us and --bandwidth-gbs");
  if (o.efficiency < 0) o.efficiency = 0.5;
  return o;
}

Link choose_link(const Options& o) {
  Link link;
  if (o.link == "custom") link.name = "custom";
  else {
    std::string name = !o.link.empty() ? o.link : o.device == "t4" ? "pcie3" : "nvlink4";
    try {
      link = link_preset(name);
    } catch (const Error& e) {
      throw Error(std::string("--link: ") + e.what());
    }
  }
  if (o.latency_us >= 0) link.latency_us = o.latency_us;
  if (o.bandwidth_gbs >= 0) link.bus_bandwidth_GBs = o.bandwidth_gbs;
  return link;
}

void print_row(const Prediction& p, bool single) {
  char bucket[16], count[16];
  std::snprintf(bucket, sizeof bucket, "%g", p.bucket_mb);
  std::snprintf(count, sizeof count, "%d", p.buckets);
  std::printf("%4d %10s %8s %8s %10.2f %11.2f %9.1f %6.1f  %s\n", p.gpus, single ? "-" : bucket, single ? "-" : count,
              single ? "-" : p.overlap ? "yes" : "no", p.step_ms, p.exposed_comm_ms, p.images_per_s,
              100 * p.efficiency, binding_name(p.binding));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse_options(argc, argv);
    DevicePreset device;
    try {
      device = device_preset(o.device);
    } catch (const Error& e) {
      throw Error(std::string("--device: ") + e.what());
    }
    Graph graph = build_graph(read_model(o.cfg), o.size, o.size);
    const ProfileMath math = o.precision == "fp32" ? ProfileMath::Fp32 : ProfileMath::Tensor16;
    Profile profile = o.trace.empty()
                          ? profile_from_flops(graph, o.batch, device, o.efficiency, math)
                          : read_trace_profile(o.trace, graph, o.batch, optimizer_ms_estimate(graph.trainable, device));
    if (o.compute_scale != 1) profile = scale_compute(std::move(profile), o.compute_scale);
    std::string optimizer_note = "estimated: 20 bytes/parameter at " +
                                 std::to_string(static_cast<int>(device.memory_GBs)) + " GB/s (" + device.name + ")";
    if (o.optimizer_ms >= 0) {
      profile.optimizer_ms = o.optimizer_ms;
      optimizer_note = "as given";
    } else if (!o.trace.empty() && !o.device_given) {
      optimizer_note += "; the trace holds no optimizer time: pass --device or --optimizer-ms";
    }

    ScalingSetup setup;
    setup.link = choose_link(o);
    std::string loader_note;
    if (o.loader_ips > 0) {
      setup.loader_images_per_s = o.loader_ips;
      loader_note = "as given";
    } else {
      int threads = o.loader_threads > 0 ? o.loader_threads
                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      setup.loader_images_per_s = threads * kLoaderImagesPerThread;
      loader_note = std::to_string(threads) + " threads x 315 images/s per thread, measured at 416, docs/perf.md" +
                    (o.loader_threads > 0 ? "" : "; this machine's hardware threads");
      if (graph.input.w != 416)
        loader_note += "; NOTE: the input here is " + std::to_string(graph.input.w) + ", pass --loader-ips";
    }

    int layers_with_grads = 0;
    for (const LayerCost& layer : profile.backward) layers_with_grads += layer.grad_bytes > 0;
    std::printf("scaling_model: %s at %dx%d, batch %d per GPU\n", graph.path.c_str(), graph.input.w, graph.input.h,
                profile.batch);
    std::printf("profile: %s\n", profile.source.c_str());
    std::printf("  forward %.2f ms, backward %.2f ms (%d layers with gradients, %.1f MiB = %lld bytes), "
                "optimizer %.2f ms (%s)\n",
                profile.forward_ms, profile.backward_ms(), layers_with_grads,
                static_cast<double>(profile.gradient_bytes()) / (1024.0 * 1024.0),
                static_cast<long long>(profile.gradient_bytes()), profile.optimizer_ms, optimizer_note.c_str());
    std::printf("link: %s, latency %g us, all-reduce bus bandwidth %g GB/s (ring: 2(n-1)/n x bytes / bandwidth + "
                "2(n-1) x latency)\n",
                setup.link.name.c_str(), setup.link.latency_us, setup.link.bus_bandwidth_GBs);
    std::printf("loader: %.0f images/s (%s)\n", setup.loader_images_per_s, loader_note.c_str());
    std::printf("binds: loader when it needs longer than the GPUs' step; communication when exposed communication is "
                ">= %.0f%% of the step; else compute. Bucket MB = 2^20 bytes.\n\n",
                100 * kCommunicationBindsFraction);

    std::printf("%4s %10s %8s %8s %10s %11s %9s %6s  %s\n", "gpus", "bucket MB", "buckets", "overlap", "step ms",
                "exposed ms", "images/s", "eff %", "binds");
    for (int gpus : o.gpus) {
      if (gpus == 1) {
        print_row(predict_step(profile, setup, 1, 0, true), true);
        continue;
      }
      for (bool overlap : {true, false})
        for (double mb : o.buckets) print_row(predict_step(profile, setup, gpus, mb, overlap), false);
    }

    int most = o.gpus.back();
    for (int g : o.gpus) most = std::max(most, g);
    double best = best_bucket_mb(profile, setup, most, o.buckets);
    Prediction with = predict_step(profile, setup, most, best, true);
    double best_without = predict_step(profile, setup, most, o.buckets[0], false).step_ms;
    double best_without_mb = o.buckets[0];
    for (double mb : o.buckets) {
      double step = predict_step(profile, setup, most, mb, false).step_ms;
      if (step < best_without) {
        best_without = step;
        best_without_mb = mb;
      }
    }
    std::printf("\nrecommendation for %d GPUs: --bucket-mb %g with overlap: step %.2f ms, "
                "exposed communication %.2f ms, %.0f images/s, efficiency %.1f%% (%s binds); "
                "without overlap the best is %.2f ms (%g MB)\n",
                most, best, with.step_ms, with.exposed_comm_ms, with.images_per_s, 100 * with.efficiency,
                binding_name(with.binding), best_without, best_without_mb);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scaling_model: %s\n", e.what());
    return 1;
  }
}
