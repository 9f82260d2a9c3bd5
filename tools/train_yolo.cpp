// train_yolo: the command users run. Today it discovers devices, chooses the backend, writes
// the synthetic dataset, reads any supported dataset and runs the input pipeline over it; the
// cfg -> graph -> executor path that trains YOLOv3 lands with the graph issue.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "runtime/check.h"
#include "runtime/device.h"

namespace {

const char* kUsage =
    "usage: train_yolo [options]                 default run: synthetic shapes -> input pipeline\n"
    "       train_yolo synth DIR [synth options]   write the synthetic shapes dataset\n"
    "       train_yolo data --data PATH [data options]\n"
    "                                              read a dataset, say what it is, run the loader\n"
    "options:\n"
    "  --list-devices     print the GPUs, NCCL and CPU this machine offers, then exit\n"
    "  --devices SPEC     auto (default: every GPU, else the CPU), cpu, cpu:N, gpu, gpu:I,J,...\n"
    "  --help             this text\n"
    "synth options:\n"
    "  --train N  --valid N   images per split (200, 50)\n"
    "  --image-size WxH       image size (640x480)\n"
    "  --seed S  --png        seed (1); PNG instead of JPEG\n"
    "data options:\n"
    "  --data PATH            a darknet .data file, a COCO .json, or a folder (darknet, COCO, VOC, images+labels)\n"
    "  --data-format F        darknet, folders, voc or coco instead of detecting it\n"
    "  --names FILE           class names, one per line (fixes the class order)\n"
    "  --strict               a missing or unreadable image or label file is an error\n"
    "  --size N  --batch B    network input (416) and images per batch (16)\n"
    "  --resize MODE          letterbox (default) or stretch\n"
    "  --threads T            loader threads (cores - 1)\n"
    "  --epochs E             epochs to run the loader for (1)\n"
    "  --no-augment           no jitter, flip or colour changes\n";

struct Options {
  std::string command;  // "", "synth" or "data"
  bool list_devices = false;
  std::string devices = "auto";
  std::string synth_dir;
  yolo::data::SyntheticOptions synth;
  std::string data;
  yolo::data::OpenOptions open;
  int size = 416, batch = 16, threads = 0, epochs = 1;
  yolo::data::ResizeMode resize = yolo::data::ResizeMode::Letterbox;
  bool augment = true;
};

int to_int(const std::string& flag, const std::string& text, int lo, int hi) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi)
    throw yolo::Error(flag + " expects a whole number in " + std::to_string(lo) + ".." + std::to_string(hi) +
                      ", got '" + text + "'");
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options options;
  int i = 1;
  if (argc > 1 && (std::strcmp(argv[1], "synth") == 0 || std::strcmp(argv[1], "data") == 0)) {
    options.command = argv[1];
    i = 2;
    if (options.command == "synth") {
      if (argc < 3 || argv[2][0] == '-') throw yolo::Error(std::string("synth needs a folder to write\n") + kUsage);
      options.synth_dir = argv[2];
      i = 3;
    }
  }
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw yolo::Error(arg + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg == "--list-devices") {
      options.list_devices = true;
    } else if (arg == "--devices") {
      options.devices = value();
    } else if (arg == "--train") {
      options.synth.train_images = to_int(arg, value(), 1, 10000000);
    } else if (arg == "--valid") {
      options.synth.valid_images = to_int(arg, value(), 0, 10000000);
    } else if (arg == "--image-size") {
      std::string v = value();
      size_t x = v.find('x');
      if (x == std::string::npos) throw yolo::Error("--image-size expects WxH, e.g. 640x480, got '" + v + "'");
      options.synth.width = to_int(arg, v.substr(0, x), 16, 8192);
      options.synth.height = to_int(arg, v.substr(x + 1), 16, 8192);
    } else if (arg == "--seed") {
      options.synth.seed = static_cast<uint64_t>(to_int(arg, value(), 0, 2000000000));
    } else if (arg == "--png") {
      options.synth.png = true;
    } else if (arg == "--data") {
      options.data = value();
    } else if (arg == "--data-format") {
      options.open.force_format = true;
      options.open.format = yolo::data::parse_format(value());
    } else if (arg == "--names") {
      options.open.names_file = value();
    } else if (arg == "--strict") {
      options.open.strict = true;
    } else if (arg == "--size") {
      options.size = to_int(arg, value(), 32, 8192);
    } else if (arg == "--batch") {
      options.batch = to_int(arg, value(), 1, 4096);
    } else if (arg == "--threads") {
      options.threads = to_int(arg, value(), 1, 1024);
    } else if (arg == "--epochs") {
      options.epochs = to_int(arg, value(), 1, 1000000);
    } else if (arg == "--resize") {
      options.resize = yolo::data::parse_resize_mode(value());
    } else if (arg == "--no-augment") {
      options.augment = false;
    } else {
      throw yolo::Error("unknown option '" + arg + "'\n" + kUsage);
    }
  }
  if (options.command == "data" && options.data.empty()) throw yolo::Error("data needs --data PATH\n" + std::string(kUsage));
  return options;
}

yolo::data::Dataset open_and_describe(const std::string& path, const yolo::data::OpenOptions& open) {
  yolo::data::Dataset dataset = yolo::data::open_dataset(path, open);
  std::printf("train_yolo: --data %s: %s %s format: %s\n", path.c_str(), open.force_format ? "read as" : "detected",
              yolo::data::format_name(dataset.format), dataset.description.c_str());
  std::string names;
  for (size_t c = 0; c < dataset.class_names.size() && c < 20; ++c) names += (c ? ", " : "") + dataset.class_names[c];
  if (dataset.class_names.size() > 20) names += ", ...";
  std::printf("train_yolo: %zu classes: %s\n", dataset.class_names.size(), names.c_str());
  std::printf("train_yolo: train: %s\n", dataset.train.counts.summary().c_str());
  std::printf("train_yolo: valid: %s\n",
              dataset.valid.samples.empty() ? "none" : dataset.valid.counts.summary().c_str());
  for (const std::string& w : dataset.warnings) std::fprintf(stderr, "train_yolo: warning: %s\n", w.c_str());
  return dataset;
}

// Runs the loader over the training split as training would, and reports what it delivered.
void run_loader(const yolo::data::Dataset& dataset, const Options& options) {
  yolo::data::LoaderOptions o;
  o.batch = options.batch;
  o.net_w = o.net_h = options.size;
  o.resize = options.resize;
  o.augment = options.augment;
  o.augment_params.jitter = 0.3f;  // YOLOv3's cfg values until the cfg reader supplies them
  o.augment_params.hue = 0.1f;
  o.augment_params.saturation = 1.5f;
  o.augment_params.exposure = 1.5f;
  o.threads = options.threads;
  o.strict = options.open.strict;
  o.remainder = yolo::data::Remainder::Wrap;
  yolo::data::Loader loader(dataset.train, o);
  std::printf("train_yolo: loader: %d threads, batch %d at %dx%d (%s%s), %lld steps per epoch\n", loader.threads(),
              o.batch, o.net_w, o.net_h, yolo::data::resize_mode_name(o.resize),
              o.augment ? ", augmented" : "", static_cast<long long>(loader.steps_per_epoch()));
  auto t0 = std::chrono::steady_clock::now();
  int64_t steps = loader.steps_per_epoch() * options.epochs;
  for (int64_t s = 0; s < steps; ++s) loader.next();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int e = 0; e < options.epochs; ++e) std::printf("train_yolo: %s\n", loader.epoch_stats(e).summary().c_str());
  std::printf("train_yolo: loader delivered %.1f images/s (%lld batches in %.2f s)\n", steps * o.batch / seconds,
              static_cast<long long>(steps), seconds);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options options = parse(argc, argv);
    if (options.command == "synth") {
      yolo::data::SyntheticSet set = yolo::data::write_synthetic_dataset(options.synth_dir, options.synth);
      std::printf("train_yolo: wrote %zu training and %zu validation images to %s (darknet: %s)\n", set.train.size(),
                  set.valid.size(), set.root.c_str(), set.data_file.c_str());
      return 0;
    }
    if (options.command == "data") {
      yolo::data::Dataset dataset = open_and_describe(options.data, options.open);
      run_loader(dataset, options);
      return 0;
    }
    const yolo::GpuDiscovery& found = yolo::discover_gpus();
    if (options.list_devices) {
      std::fputs(yolo::describe_devices(found).c_str(), stdout);
      return 0;
    }
    yolo::DeviceChoice choice = yolo::choose_devices(options.devices, found);
    std::printf("train_yolo: %s\n", choice.reason.c_str());
    std::printf("train_yolo: devices:");
    for (const yolo::Device& d : choice.devices) std::printf(" %s", d.name().c_str());
    std::printf("\n");
    // The built-in default: the synthetic shapes set (written once), through the input pipeline.
    const std::string root = "runs/shapes";
    if (!std::filesystem::exists(root + "/shapes.data")) {
      std::printf("train_yolo: writing the synthetic shapes dataset to %s\n", root.c_str());
      yolo::data::write_synthetic_dataset(root, options.synth);
    }
    yolo::data::Dataset dataset = open_and_describe(root + "/shapes.data", options.open);
    run_loader(dataset, options);
    std::printf("train_yolo: training (cfg -> graph -> executor) is not built yet (see README.md, Status)\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_yolo: error: %s\n", e.what());
    return 2;
  }
}
