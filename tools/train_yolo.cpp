// train_yolo: the command users run. Trains a darknet .cfg (YOLOv3, tiny, the demo net, the
// MNIST MLP) on a dataset in any supported format, prints a model summary, writes the
// synthetic dataset, or reads a dataset and runs the input pipeline over it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/anchors.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/mnist.h"
#include "data/problems.h"
#include "data/synthetic.h"
#include "data/verify.h"
#include "graph/evaluate.h"
#include "graph/executor.h"
#include "graph/heads.h"
#include "graph/run_record.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "kernels/cpu_isa.h"
#include "runtime/check.h"
#include "runtime/device.h"
#include "runtime/launch.h"
#include "runtime/plural.h"
#include "runtime/rendezvous.h"
#include "runtime/stop_signal.h"

namespace {

const char* kUsage =
    "usage: train_yolo [options]                   train (default: the demo net on the synthetic shapes)\n"
    "       train_yolo synth DIR [synth options]   write the synthetic shapes dataset\n"
    "       train_yolo data --data PATH [data options]   read a dataset, say what it is, run the loader\n"
    "       train_yolo map --cfg FILE --weights FILE --data PATH   per-class AP, mAP@0.5 and mAP@0.5:0.95\n"
    "       train_yolo anchors --data PATH [--num N] [--size S] [--cfg FILE]   k-means anchors for a dataset\n"
    "       train_yolo detect --cfg FILE --weights FILE --names FILE [--out DIR] [--json] IMAGE...\n"
    "                     (map, detect: without --cfg, the model.cfg beside --weights: the cfg a run trained;\n"
    "                     map --save-json FILE: the detections in COCO's results format, for pycocotools)\n"
    "options:\n"
    "  --cfg FILE         the network (models/demo.cfg)\n"
    "  --data PATH        the dataset (see data options); for a classifier: mnist or mnist:DIR (IDX files)\n"
    "                     default: runs/shapes/shapes.data, written on first use\n"
    "  --summary          print the layer table, FLOPs, parameters and memory plan, then exit\n"
    "  --weights FILE     start from darknet .weights; --load-layers N: only the first N layers\n"
    "  --anchors auto     the [yolo] anchors from the dataset's boxes (k-means, as 'anchors' prints them)\n"
    "  --batch B          images per optimizer step (the cfg's batch); --subdivisions S splits it\n"
    "  --max-batches N    optimizer steps to train (the cfg's max_batches); --epochs E instead\n"
    "  --size N           network input N x N (the cfg's width/height)\n"
    "  --out DIR          where last.weights and last.ckpt go (runs/<cfg name>)\n"
    "  --resume           continue exactly from DIR/last.ckpt (DIR/prev.ckpt if last.ckpt is damaged)\n"
    "  --checkpoint-minutes M  save DIR/last.ckpt every M minutes of training (10), written while training\n"
    "                     goes on; the save before it is kept as prev.ckpt\n"
    "  --checkpoint-every N   also save every N steps; --checkpoint-every 0: save at the end only\n"
    "  --max-skipped-steps K  stop after K steps in a row skipped for NaN/Inf gradients (10; 0: never)\n"
    "                     SIGTERM/SIGINT: the step under way finishes and is saved, exit status 75; a\n"
    "                     second request stops at once (the same signal from the same sender within 1 s,\n"
    "                     as timeout sends it to a process and its group, is one request)\n"
    "  --seed S           initial weights, shuffling and augmentation (1)\n"
    "  --cache-mb M       keep decoded training images in memory, at most M MiB (default: a quarter of\n"
    "                     the machine's memory, at most 4096); 0: decode each image every epoch\n"
    "  --trace FILE       Chrome-trace JSON of one step's layers (forward/backward)\n"
    "  --timeline FILE    Chrome-trace JSON of the device's kernels and copies in three steps as they\n"
    "                     run (replayed graphs included; the run's 4th to 6th), from CUPTI's records\n"
    "  --valid-every N    mAP@0.5 on the validation split every N epochs; keeps best.weights\n"
    "  --bucket-mb M      data parallel: gradient all-reduce buckets of at most M MiB (4, or a quarter of the\n"
    "                     gradients when smaller; 0 = one layer each)\n"
    "  --no-overlap       data parallel: all-reduce after backward instead of during it\n"
    "  --sync-bn          data parallel: BatchNorm statistics over all replicas (for small per-GPU batches)\n"
    "  --no-graph         GPUs: run every step eagerly instead of replaying it as CUDA Graphs\n"
    "  --no-look-ahead    GPUs: queue each step after the previous one's loss is read, not before\n"
    "  --no-fold          GPUs: run residual shortcuts and BatchNorm applies as passes of their own\n"
    "  --no-load-fold     GPUs: the BatchNorm applies only (not folded into the next convolutions' loads)\n"
    "  --no-idle          GPUs: do not record kernel activity (CUPTI) for the step split's device idle time\n"
    "  --precision P      auto (default; or the cfg's [net] precision=): bf16 on GPUs of sm_80 and newer,\n"
    "                     fp16 on sm_75, fp32 on the CPU. fp32; tf32 (tensor cores, FP32 tensors, sm_80+);\n"
    "                     bf16 (sm_80+) and fp16 (sm_75+, with dynamic loss scaling): activations in 16 bits\n"
    "  --check-every N    data parallel: compare the replicas' parameter hashes every N steps (100)\n"
    "  --comm-timeout S   data parallel: give up a collective after S seconds (300)\n"
    "  --rendezvous R     launched jobs (mpirun, srun, torchrun): where the ranks meet, tcp://HOST:PORT\n"
    "                     or file:///shared/path (default: tcp://MASTER_ADDR:MASTER_PORT)\n"
    "  --threshold T      detect: score threshold (0.25); --nms IOU (0.45); --json: JSON lines\n"
    "  --list-devices     print the GPUs, NCCL and CPU this machine offers, then exit\n"
    "  --devices SPEC     auto (default: every GPU, else the CPU), cpu, cpu:N (N replicas), gpu, gpu:I,J,...;\n"
    "                     build/train_yolo_emu: emu:I,J,... emulated GPUs (default emu:0; emu:0@sm75@mem=2G)\n"
    "  --help             this text\n"
    "synth options:\n"
    "  --train N  --valid N   images per split (200, 50)\n"
    "  --image-size WxH       image size (640x480)\n"
    "  --seed S  --png        seed (1); PNG instead of JPEG\n"
    "data options:\n"
    "  --data PATH            a darknet .data file, a COCO .json, or a folder (darknet, COCO, VOC, images+labels)\n"
    "  --data-format F        darknet, folders, voc or coco instead of detecting it\n"
    "  --names FILE           class names, one per line (fixes the class order)\n"
    "  --strict               stop at any dataset problem (default: unusable items are left out, listed in\n"
    "                         runs/<name>/dataset_problems.txt, unless over 5% of a split: then stop)\n"
    "  --size N  --batch B    (data command) network input (416) and images per batch (16)\n"
    "  --resize MODE          letterbox (default) or stretch\n"
    "  --threads T            loader threads (cores - 1)\n"
    "  --epochs E             epochs to run the loader for (1)\n"
    "  --no-augment           no jitter, flip or colour changes\n";

struct Options {
  std::string command;              // "", "synth", "data", "map", "detect" or "anchors"
  int anchors = 0;                  // anchors: how many (0: the cfg's, else 9)
  std::string save_json;            // map: COCO-format detections to this file
  bool anchors_auto = false;        // --anchors auto: training's cfg gets anchors from the dataset
  std::vector<std::string> images;  // detect
  float threshold = 0.25f, nms = 0.45f;
  bool json = false;
  int valid_every = 0;
  double bucket_mb = -1, comm_timeout = 300;
  std::string rendezvous;
  bool overlap = true, sync_bn = false, graphs = true, device_activity = true, look_ahead = true, fold = true,
       load_fold = true;
  bool precision_given = false;              // --precision (auto included) wins over the cfg's
  std::optional<yolo::Precision> precision;  // --precision; nullopt: auto
  int check_every = 100;
  bool list_devices = false;
  // The emulated-GPU build (build/train_yolo_emu) exists to run the GPU path: emu:0 by default.
  std::string devices = YOLO_EMU ? "emu:0" : "auto";
  std::string synth_dir;
  yolo::data::SyntheticOptions synth;
  std::string data;
  yolo::data::OpenOptions open;
  int size = 0, batch = 0, threads = 0, epochs = 0;
  std::string cfg, weights, out, trace, timeline;
  int load_layers = -1, subdivisions = 0, checkpoint_every = -1, max_skipped_steps = 10;  // -1: not given
  double checkpoint_minutes = -1;  // -1: not given (10, or 0 after --checkpoint-every 0)
  int64_t image_cache_mb = -1;    // --cache-mb; -1: the default
  std::vector<std::string> argv;  // as given, for the --resume command printed after a stop
  int64_t max_batches = 0;
  bool summary = false, resume = false;
  uint64_t seed = 1;
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

float to_float(const std::string& flag, const std::string& text, float lo, float hi) {
  char* end = nullptr;
  float v = std::strtof(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= lo && v <= hi))
    throw yolo::Error(flag + " expects a number in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
                      text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options options;
  options.argv.assign(argv, argv + argc);
  int i = 1;
  if (argc > 1 &&
      (std::strcmp(argv[1], "synth") == 0 || std::strcmp(argv[1], "data") == 0 || std::strcmp(argv[1], "map") == 0 ||
       std::strcmp(argv[1], "detect") == 0 || std::strcmp(argv[1], "anchors") == 0)) {
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
      options.seed = static_cast<uint64_t>(to_int(arg, value(), 0, 2000000000));
      if (options.command == "synth") options.synth.seed = options.seed;
    } else if (arg == "--cfg") {
      options.cfg = value();
    } else if (arg == "--summary") {
      options.summary = true;
    } else if (arg == "--weights") {
      options.weights = value();
    } else if (arg == "--load-layers") {
      options.load_layers = to_int(arg, value(), 0, 100000);
    } else if (arg == "--subdivisions") {
      options.subdivisions = to_int(arg, value(), 1, 4096);
    } else if (arg == "--max-batches") {
      options.max_batches = to_int(arg, value(), 1, 2000000000);
    } else if (arg == "--out") {
      options.out = value();
    } else if (arg == "--resume") {
      options.resume = true;
    } else if (arg == "--trace") {
      options.trace = value();
    } else if (arg == "--timeline") {
      options.timeline = value();
    } else if (arg == "--bucket-mb") {
      options.bucket_mb = to_float(arg, value(), 0, 4096);
    } else if (arg == "--no-overlap") {
      options.overlap = false;
    } else if (arg == "--no-graph") {
      options.graphs = false;
    } else if (arg == "--no-look-ahead") {
      options.look_ahead = false;
    } else if (arg == "--no-fold") {
      options.fold = false;
      options.load_fold = false;
    } else if (arg == "--no-load-fold") {
      options.load_fold = false;
    } else if (arg == "--no-idle") {
      options.device_activity = false;
    } else if (arg == "--sync-bn") {
      options.sync_bn = true;
    } else if (arg == "--precision") {
      options.precision = yolo::parse_precision_choice(value(), arg);
      options.precision_given = true;
    } else if (arg == "--check-every") {
      options.check_every = to_int(arg, value(), 0, 1000000000);
    } else if (arg == "--comm-timeout") {
      options.comm_timeout = to_float(arg, value(), 1, 86400);
    } else if (arg == "--rendezvous") {
      options.rendezvous = value();
      yolo::parse_rendezvous(options.rendezvous);  // a malformed value fails now, naming the forms
    } else if (arg == "--valid-every") {
      options.valid_every = to_int(arg, value(), 1, 1000000);
    } else if (arg == "--threshold") {
      options.threshold = to_float(arg, value(), 0, 1);
    } else if (arg == "--nms") {
      options.nms = to_float(arg, value(), 0, 1);
    } else if (arg == "--json") {
      options.json = true;
    } else if (options.command == "detect" && !arg.empty() && arg[0] != '-') {
      options.images.push_back(arg);
    } else if (arg == "--checkpoint-every") {
      options.checkpoint_every = to_int(arg, value(), 0, 2000000000);
    } else if (arg == "--checkpoint-minutes") {
      options.checkpoint_minutes = to_float(arg, value(), 0, 1e6);
    } else if (arg == "--max-skipped-steps") {
      options.max_skipped_steps = to_int(arg, value(), 0, 2000000000);
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
    } else if (arg == "--cache-mb") {
      options.image_cache_mb = to_int(arg, value(), 0, 1 << 30);
    } else if (arg == "--epochs") {
      options.epochs = to_int(arg, value(), 1, 1000000);
    } else if (arg == "--save-json") {
      options.save_json = value();
    } else if (arg == "--num") {
      options.anchors = to_int(arg, value(), 1, 100);
    } else if (arg == "--anchors") {
      if (value() != "auto") throw yolo::Error("--anchors takes 'auto' (k-means on the dataset's boxes)");
      options.anchors_auto = true;
    } else if (arg == "--resize") {
      options.resize = yolo::data::parse_resize_mode(value());
    } else if (arg == "--no-augment") {
      options.augment = false;
    } else {
      throw yolo::Error("unknown option '" + arg + "'\n" + kUsage);
    }
  }
  if (options.command == "anchors" && options.data.empty())
    throw yolo::Error("anchors needs --data PATH\n" + std::string(kUsage));
  if (options.command == "data" && options.data.empty()) throw yolo::Error("data needs --data PATH\n" + std::string(kUsage));
  if (options.max_batches && options.epochs) throw yolo::Error("--max-batches and --epochs: give one of them");
  if ((options.command == "map" || options.command == "detect") && options.cfg.empty() && !options.weights.empty()) {
    // A run's weights come with the cfg they were trained with (heads sized for the data).
    const std::string beside = (std::filesystem::path(options.weights).parent_path() / "model.cfg").string();
    if (std::filesystem::exists(beside)) options.cfg = beside;
  }
  if (options.command == "map" || options.command == "detect") {
    if (options.cfg.empty() || options.weights.empty())
      throw yolo::Error(options.command + " needs --cfg FILE and --weights FILE\n" + kUsage);
    if (options.command == "map" && options.data.empty()) throw yolo::Error("map needs --data PATH\n" + std::string(kUsage));
    if (options.command == "detect" && options.images.empty())
      throw yolo::Error("detect needs at least one image path\n" + std::string(kUsage));
  }
  return options;
}

// Opens the dataset, every image verified; its problems are reported (the first few of each
// kind here, all of them in PROBLEMS_DIR/dataset_problems.txt) and stop the run when they must
// (data/problems.h).
yolo::data::Dataset open_and_describe(const std::string& path, yolo::data::OpenOptions open,
                                      const std::string& problems_dir, int threads) {
  open.verify_images = true;
  open.threads = threads;
  // The verdicts' cache beside the dataset, or in the run's folder when that is read-only.
  if (open.cache_file.empty() && yolo::data::default_verify_cache(path).empty()) {
    std::filesystem::create_directories(problems_dir);
    open.cache_file = problems_dir + "/.train_yolo_images.cache";
  }
  auto t0 = std::chrono::steady_clock::now();
  yolo::data::Dataset dataset = yolo::data::open_dataset(path, open);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("train_yolo: --data %s: %s %s format: %s\n", path.c_str(), open.force_format ? "read as" : "detected",
              yolo::data::format_name(dataset.format), dataset.description.c_str());
  std::string names;
  for (size_t c = 0; c < dataset.class_names.size() && c < 20; ++c) names += (c ? ", " : "") + dataset.class_names[c];
  if (dataset.class_names.size() > 20) names += ", ...";
  std::printf("train_yolo: %s: %s\n",
              yolo::counted(static_cast<int64_t>(dataset.class_names.size()), "class", "classes").c_str(),
              names.c_str());
  std::printf("train_yolo: train: %s\n", dataset.train.counts.summary().c_str());
  std::printf("train_yolo: valid: %s\n",
              dataset.valid.samples.empty() ? "none" : dataset.valid.counts.summary().c_str());
  for (const std::string& w : dataset.warnings) std::fprintf(stderr, "train_yolo: warning: %s\n", w.c_str());
  const std::string cache = open.cache_file.empty() ? yolo::data::default_verify_cache(path) : open.cache_file;
  std::printf("train_yolo: every label read and every image verified in %.1f s (verdicts cached in %s)\n", seconds,
              cache.c_str());
  std::string list;
  if (yolo::data::problem_count(dataset) > 0) {
    list = problems_dir + "/dataset_problems.txt";
    yolo::data::write_problem_list(dataset, list);
    std::fflush(stdout);
    std::fprintf(stderr, "train_yolo: problems in --data %s (the first 3 of each kind; all of them in %s):\n%s",
                 path.c_str(), list.c_str(), yolo::data::problem_report(dataset, 3).c_str());
  }
  yolo::data::check_usable(dataset, open.strict, list);
  return dataset;
}

// Runs the loader over the training split as training would (the loader's default remainder, as
// graph/train.cpp's: the last partial batch of an epoch dropped), and reports what it delivered.
void run_loader(const yolo::data::Dataset& dataset, const Options& options) {
  yolo::data::LoaderOptions o;
  o.batch = options.batch ? options.batch : 16;
  o.net_w = o.net_h = options.size ? options.size : 416;
  o.resize = options.resize;
  o.augment = options.augment;
  o.augment_params.jitter = 0.3f;  // YOLOv3's cfg values until the cfg reader supplies them
  o.augment_params.hue = 0.1f;
  o.augment_params.saturation = 1.5f;
  o.augment_params.exposure = 1.5f;
  o.threads = options.threads;
  o.strict = options.open.strict;
  yolo::data::Loader loader(dataset.train, o);
  std::printf("train_yolo: loader: %s, batch %d at %dx%d (%s%s), %lld steps per epoch\n",
              yolo::counted(loader.threads(), "thread").c_str(), o.batch, o.net_w, o.net_h,
              yolo::data::resize_mode_name(o.resize), o.augment ? ", augmented" : "",
              static_cast<long long>(loader.steps_per_epoch()));
  auto t0 = std::chrono::steady_clock::now();
  int epochs = options.epochs ? options.epochs : 1;
  int64_t steps = loader.steps_per_epoch() * epochs;
  for (int64_t s = 0; s < steps; ++s) loader.next();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int e = 0; e < epochs; ++e)  // counted as training counts them: the first is epoch 1
    std::printf("train_yolo: epoch %d data: %s\n", e + 1, loader.epoch_stats(e).summary().c_str());
  std::printf("train_yolo: loader delivered %.1f images/s (%lld batches in %.2f s)\n", steps * o.batch / seconds,
              static_cast<long long>(steps), seconds);
}

// The cfg to use: as given, else the demo net (found from the working directory or beside
// the program, so ./train_yolo works from anywhere).
std::string find_cfg(const std::string& given) {
  if (!given.empty()) return given;
  const std::string demo = "models/demo.cfg";
  if (std::filesystem::exists(demo)) return demo;
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(exe.parent_path() / demo)) return (exe.parent_path() / demo).string();
  throw yolo::Error("the demo net " + demo + " is not in the working directory or beside the program: pass --cfg FILE");
}

// A detector loaded from darknet weights, for inference.
std::unique_ptr<yolo::graph::Executor> load_for_inference(const yolo::graph::ModelSpec& spec, yolo::Device device,
                                                         const std::string& weights, int micro_batch) {
  yolo::graph::Graph graph = yolo::graph::build_graph(spec);
  auto executor = std::make_unique<yolo::graph::Executor>(graph, device, micro_batch, 1);
  std::vector<yolo::graph::LayerParams> layers = executor->download_parameters();
  yolo::graph::read_darknet_weights(weights, layers);
  executor->upload_parameters();
  return executor;
}

// The device of map and detect, said on stderr: their stdout is the results (detect's: only the
// TSV or JSON lines).
yolo::Device first_device(const Options& options, const yolo::GpuDiscovery& found) {
  yolo::DeviceChoice choice = yolo::choose_devices(options.devices, found);
  std::fprintf(stderr, "train_yolo: %s\n", choice.reason.c_str());
  return choice.devices.front();
}

void print_result(const yolo::graph::TrainResult& result) {
  std::printf("train_yolo: %lld steps, loss %.3f -> %.3f per image, %.4g images/s\n",
              static_cast<long long>(result.iterations), result.first_loss, result.last_loss, result.images_per_second);
  std::printf("train_yolo: weights saved to %s (darknet format); checkpoint %s (--resume)\n",
              result.weights_path.c_str(), result.checkpoint_path.c_str());
}

// Validation mAP of a trained detector (into the run's results.csv and chart.png as the last
// step's) and one validation image with its detections drawn.
void report_detector(const yolo::graph::ModelSpec& spec, const yolo::data::Dataset& dataset, yolo::Device device,
                     const yolo::graph::TrainResult& trained, const std::string& out_dir) {
  const yolo::data::Split& split = dataset.valid.samples.empty() ? dataset.train : dataset.valid;
  auto executor = load_for_inference(spec, device, trained.weights_path, 8);
  yolo::data::MapResult result =
      yolo::graph::evaluate_split(*executor, split, static_cast<int>(dataset.class_names.size()), {});
  std::fputs(result.table(dataset.class_names).c_str(), stdout);
  std::printf("train_yolo: mAP@0.5 = %.4f on the %s split (%zu images)\n", result.map50, split.name.c_str(),
              split.samples.size());
  if (&split == &dataset.valid && yolo::graph::record_final_map(out_dir, trained.iterations, result.map50))
    std::printf("train_yolo: mAP@0.5 recorded as step %lld's in %s/results.csv and chart.png\n",
                static_cast<long long>(trained.iterations), out_dir.c_str());
  std::vector<yolo::data::Sample> one{split.samples.front()};
  std::vector<yolo::graph::ImageDetections> found = yolo::graph::detect_samples(*executor, one, {});
  std::string drawn = out_dir + "/detections.jpg";
  yolo::graph::write_detections_image(found.front(), dataset.class_names, drawn);
  std::printf("train_yolo: %s: %s drawn on %s\n", drawn.c_str(),
              yolo::counted(static_cast<int64_t>(found.front().detections.size()), "detection").c_str(),
              one.front().image.c_str());
}

int run_map(const Options& options, const yolo::GpuDiscovery& found) {
  yolo::graph::ModelSpec spec = yolo::graph::read_model(options.cfg);
  if (options.size) spec.net.width = spec.net.height = options.size;
  yolo::Device device = first_device(options, found);
  yolo::data::Dataset dataset =
      open_and_describe(options.data, options.open, options.out.empty() ? "runs/map" : options.out, options.threads);
  const yolo::data::Split& split = dataset.valid.samples.empty() ? dataset.train : dataset.valid;
  int classes = yolo::graph::build_graph(spec).classes;
  if (classes != static_cast<int>(dataset.class_names.size()))
    throw yolo::Error(options.cfg + " detects " + std::to_string(classes) + " classes but " + options.data + " has " +
                      std::to_string(dataset.class_names.size()));
  auto executor = load_for_inference(spec, device, options.weights, options.batch ? options.batch : 8);
  yolo::graph::DetectOptions detect;
  detect.threads = options.threads;
  detect.resize = options.resize;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<yolo::graph::ImageDetections> detections;
  yolo::data::MapResult result =
      yolo::graph::evaluate_split(*executor, split, static_cast<int>(dataset.class_names.size()), detect, &detections);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fputs(result.table(dataset.class_names).c_str(), stdout);
  std::printf("train_yolo: %s split, %zu images in %.1f s (detections above 0.005, NMS 0.45)\n", split.name.c_str(),
              split.samples.size(), seconds);
  if (!options.save_json.empty()) {
    yolo::graph::write_coco_detections(options.save_json, detections, split, dataset.category_ids);
    size_t n = 0;
    for (const auto& image : detections) n += image.detections.size();
    std::printf("train_yolo: %zu detection%s in COCO's results format -> %s (%s)\n", n, n == 1 ? "" : "s",
                options.save_json.c_str(),
                dataset.category_ids.empty()
                    ? "image ids: the 1-based position as listed; category ids: the class index + 1"
                    : "the dataset's image and category ids");
  }
  return 0;
}

int run_detect(const Options& options, const yolo::GpuDiscovery& found) {
  yolo::graph::ModelSpec spec = yolo::graph::read_model(options.cfg);
  if (options.size) spec.net.width = spec.net.height = options.size;
  std::vector<std::string> names;
  if (!options.open.names_file.empty()) names = yolo::data::read_names_file(options.open.names_file);
  yolo::Device device = first_device(options, found);
  auto executor = load_for_inference(spec, device, options.weights, 1);
  std::vector<yolo::data::Sample> samples;
  for (const std::string& image : options.images) {
    if (!std::filesystem::is_regular_file(image)) {
      if (options.open.strict) throw yolo::Error(image + ": no such file (--strict)");
      std::fprintf(stderr, "train_yolo: warning: %s: no such file, skipped\n", image.c_str());
      continue;
    }
    samples.push_back(yolo::data::Sample{image, {}});
  }
  if (samples.empty()) throw yolo::Error("detect: none of the images given exists");
  yolo::graph::DetectOptions detect;
  detect.threshold = options.threshold;
  detect.nms = options.nms;
  detect.resize = options.resize;
  detect.threads = options.threads;
  std::vector<yolo::graph::ImageDetections> results = yolo::graph::detect_samples(*executor, samples, detect);
  std::string out_dir = options.out.empty() ? "runs/detect" : options.out;
  std::filesystem::create_directories(out_dir);
  auto name_of = [&](int c) { return c < static_cast<int>(names.size()) ? names[c] : std::to_string(c); };
  if (!options.json) std::printf("image\tclass\tscore\tx1\ty1\tx2\ty2\n");
  for (const yolo::graph::ImageDetections& r : results) {
    if (!r.ok) continue;  // the loader warned, naming the file
    for (const yolo::graph::PixelDetection& d : r.detections) {
      if (options.json)
        std::printf("%s\n", yolo::graph::detection_json(r.image, name_of(d.class_id), d).c_str());
      else
        std::printf("%s\t%s\t%.4f\t%.1f\t%.1f\t%.1f\t%.1f\n", r.image.c_str(), name_of(d.class_id).c_str(), d.score,
                    d.x0, d.y0, d.x1, d.y1);
    }
    std::filesystem::path source(r.image);
    std::string ext = source.extension() == ".png" ? ".png" : ".jpg";
    std::string drawn = out_dir + "/" + source.stem().string() + ext;
    yolo::graph::write_detections_image(r, names, drawn);
    std::fprintf(stderr, "train_yolo: %s: %s -> %s\n", r.image.c_str(),
                 yolo::counted(static_cast<int64_t>(r.detections.size()), "detection").c_str(), drawn.c_str());
  }
  return 0;
}

// The device of one rank of a launched job: --devices names one, or by default the GPU of the
// rank's local index (the CPU on a machine without GPUs).
yolo::DeviceChoice rank_device(const Options& options, const yolo::LaunchInfo& launch, const yolo::GpuDiscovery& found) {
  std::string where = "rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world) + " (" +
                      launch.launcher + ", local rank " + std::to_string(launch.local_rank) + ")";
  if (options.devices != "auto") {
    yolo::DeviceChoice choice = yolo::choose_devices(options.devices, found);
    if (choice.devices.size() != 1)
      throw yolo::Error("--devices " + options.devices + ": " + where +
                        " trains on one device; start one process per device");
    choice.reason = where + " on " + choice.devices[0].name();
    return choice;
  }
  if (found.gpus.empty()) return {{yolo::Device::cpu()}, where + " on the CPU (" + found.why_no_gpu + ")"};
  if (launch.local_rank >= static_cast<int>(found.gpus.size()))
    throw yolo::Error(where + ": this node has " + std::to_string(found.gpus.size()) +
                      " GPUs, so local rank " + std::to_string(launch.local_rank) +
                      " has none: start at most one process per GPU, or pass --devices");
  return {{yolo::Device::cuda(launch.local_rank)}, where + " on gpu:" + std::to_string(launch.local_rank)};
}

// The built-in default's dataset, runs/shapes: written once, into a temporary folder renamed
// into place, so an interrupted run never leaves half a dataset. In a launched job rank 0
// writes it and the other ranks wait for it (the folder appears whole).
void ensure_default_dataset(const Options& options, bool leader) {
  const std::filesystem::path dir = "runs/shapes";
  if (std::filesystem::exists(dir / "shapes.data")) return;
  if (!leader) {
    auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.comm_timeout);
    while (!std::filesystem::exists(dir / "shapes.data")) {
      if (std::chrono::steady_clock::now() > give_up)
        throw yolo::Error("rank 0 did not write runs/shapes within --comm-timeout; pass --data");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return;
  }
  std::printf("train_yolo: writing the synthetic shapes dataset to runs/shapes\n");
  std::filesystem::path tmp = "runs/shapes.tmp" + std::to_string(getpid());
  std::filesystem::remove_all(tmp);
  yolo::data::write_synthetic_dataset(tmp.string(), options.synth);
  if (std::filesystem::exists(dir)) std::filesystem::remove_all(dir);  // an unfinished older attempt
  std::filesystem::rename(tmp, dir);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw yolo::Error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The model as it will train on `dataset`: a detector's [yolo] heads resized to the dataset's
// classes when their weights are not loaded (an error naming --load-layers when they would be);
// the cfg as trained is written to OUT/model.cfg, which map, detect and --resume read.
yolo::graph::ModelSpec heads_for_dataset(const yolo::graph::ModelSpec& spec, const yolo::data::Dataset& dataset,
                                         const yolo::graph::TrainOptions& to, const Options& options, bool leader) {
  const int classes = static_cast<int>(dataset.class_names.size());
  const int cfg_classes = yolo::graph::build_graph(spec).classes;
  const std::string trained = to.out_dir + "/model.cfg";
  std::string text = file_text(spec.path);
  yolo::graph::ModelSpec out = spec;
  if (cfg_classes != classes) {
    const std::vector<int> heads = yolo::graph::yolo_head_layers(spec);
    const int first = heads.empty() ? 0 : heads.front();
    if (!to.weights.empty() && (to.load_layers < 0 || to.load_layers > first))
      throw yolo::Error(to.weights + " includes the [yolo] heads (layer " + std::to_string(first) + " on), made for " +
                        std::to_string(cfg_classes) + " classes, but " + dataset.source + " has " +
                        std::to_string(classes) + ": pass --load-layers " + std::to_string(first) +
                        " to load layers 0.." + std::to_string(first - 1) + " (the backbone) and train new heads");
    yolo::graph::ResizedHeads resized = yolo::graph::resize_yolo_heads(text, spec.path, classes);
    text = resized.cfg_text;
    out = yolo::graph::parse_model(yolo::graph::parse_cfg_text(text, trained));
    out.net = spec.net;  // with the command line's overrides (--size)
    if (leader)
      std::printf("train_yolo: the [yolo] heads resized from %d to %d classes (the dataset's): %s\n", cfg_classes,
                  classes, trained.c_str());
  }
  if (options.anchors_auto) {
    const std::vector<yolo::data::BoxSize> boxes =
        yolo::data::network_box_sizes(dataset.train, spec.net.width, spec.net.height, options.resize);
    int k = 0;
    std::vector<yolo::data::BoxSize> old;
    for (const yolo::graph::LayerSpec& layer : out.layers)
      if (layer.type == yolo::graph::LayerType::Yolo) {
        k = layer.num;
        old.clear();
        for (size_t a = 0; a + 1 < layer.anchors.size(); a += 2)
          old.push_back({layer.anchors[a], layer.anchors[a + 1]});
      }
    const std::vector<yolo::data::BoxSize> anchors = yolo::data::kmeans_anchors(boxes, k, options.seed);
    text = yolo::graph::set_yolo_anchors(text, trained, yolo::data::anchors_text(anchors));
    yolo::graph::NetParams net = out.net;
    out = yolo::graph::parse_model(yolo::graph::parse_cfg_text(text, trained));
    out.net = net;
    if (leader)
      std::printf("train_yolo: --anchors auto: %s (k-means over %zu boxes; mean best IoU %.3f, the cfg's %.3f): %s\n",
                  yolo::data::anchors_text(anchors).c_str(), boxes.size(), yolo::data::mean_best_iou(boxes, anchors),
                  yolo::data::mean_best_iou(boxes, old), trained.c_str());
  }
  if (leader) {
    std::filesystem::create_directories(to.out_dir);
    std::ofstream(trained, std::ios::binary) << text;
  }
  return out;
}

// train_yolo anchors: k-means anchors for a dataset at the network's input size, and how well
// they (and, with --cfg, the cfg's) fit its boxes.
int run_anchors(const Options& options) {
  std::optional<yolo::graph::ModelSpec> spec;
  if (!options.cfg.empty()) spec = yolo::graph::read_model(options.cfg);
  std::vector<yolo::data::BoxSize> cfg_anchors;
  int k = options.anchors;
  if (spec)
    for (const yolo::graph::LayerSpec& layer : spec->layers)
      if (layer.type == yolo::graph::LayerType::Yolo) {
        if (!options.anchors) k = layer.num;
        cfg_anchors.clear();
        for (size_t a = 0; a + 1 < layer.anchors.size(); a += 2)
          cfg_anchors.push_back({layer.anchors[a], layer.anchors[a + 1]});
      }
  if (k == 0) k = 9;
  const int w = options.size ? options.size : spec ? spec->net.width : 416;
  const int h = options.size ? options.size : spec ? spec->net.height : 416;
  yolo::data::Dataset dataset = open_and_describe(options.data, options.open,
                                                  options.out.empty() ? "runs/anchors" : options.out, options.threads);
  int64_t unreadable = 0;
  const std::vector<yolo::data::BoxSize> boxes =
      yolo::data::network_box_sizes(dataset.train, w, h, options.resize, &unreadable);
  if (unreadable)
    std::printf("train_yolo: %lld images without a readable size left out\n", static_cast<long long>(unreadable));
  const std::vector<yolo::data::BoxSize> anchors = yolo::data::kmeans_anchors(boxes, k, options.seed);
  std::printf("train_yolo: %d anchors for %dx%d (%s), k-means with 1 - IoU over the %zu training boxes (seed %llu):\n",
              k, w, h, yolo::data::resize_mode_name(options.resize), boxes.size(),
              static_cast<unsigned long long>(options.seed));
  std::printf("anchors = %s\n", yolo::data::anchors_text(anchors).c_str());
  std::printf("train_yolo: mean best IoU of the boxes: %.3f with these", yolo::data::mean_best_iou(boxes, anchors));
  if (!cfg_anchors.empty())
    std::printf(", %.3f with %s's", yolo::data::mean_best_iou(boxes, cfg_anchors), options.cfg.c_str());
  std::printf("\ntrain_yolo: train with them: --anchors auto (they go into the run's model.cfg)\n");
  return 0;
}

// The command that continues a stopped run: this one, quoted for a POSIX shell, with --resume.
std::string resume_command(const std::vector<std::string>& argv) {
  std::string command;
  bool resumes = false;
  for (const std::string& arg : argv) {
    resumes |= arg == "--resume";
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789_-+=.,/:@%") == std::string::npos;
    std::string quoted = "'";
    for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    command += (command.empty() ? "" : " ") + (plain ? arg : quoted + "'");
  }
  return resumes ? command : command + " --resume";
}

// A run that ended early: a signal's stop (saved; exit kStoppedExitCode) or divergence (an error).
int early_stop(const yolo::graph::TrainResult& result, const Options& options, bool leader) {
  if (result.stop == yolo::graph::TrainStop::Diverged) {
    if (leader) std::fprintf(stderr, "error: %s\n", result.stop_message.c_str());
    return 1;
  }
  if (leader)
    std::printf("train_yolo: %s\ntrain_yolo: to continue: %s\n", result.stop_message.c_str(),
                resume_command(options.argv).c_str());
  return yolo::kStoppedExitCode;
}

// --summary's tensor-core plans per conv layer: for this machine's first GPU in the precision it
// would train in, or without a GPU for the H200 in bf16 (`bench_kernels --plans t4|a100|h200`
// prints every YOLOv3 shape for a named GPU).
void print_tc_plans(const yolo::graph::Graph& graph, int micro, std::optional<yolo::Precision> asked,
                    const yolo::GpuDiscovery& found) {
  if (asked == yolo::Precision::Fp32) return;
  yolo::tc::GpuDesc gpu = yolo::tc::gpu_h200();
  if (!found.gpus.empty()) gpu = yolo::tc::current_gpu();
  else std::printf("no GPU here: the plans an H200 would run (bench_kernels --plans t4|a100|h200 for others)\n");
  gpu.wgmma = gpu.wgmma && yolo::tc::wgmma_allowed_by_environment();  // YOLO_WGMMA=off: as the H200 would run
  const yolo::Precision p = asked ? *asked : gpu.cc < 80 ? yolo::Precision::Fp16 : yolo::Precision::Bf16;
  if (yolo::min_compute_capability(p) > gpu.cc) return;
  std::fputs(yolo::graph::tc_plan_table(graph, micro, p, gpu).c_str(), stdout);
}

int train(const Options& options, const yolo::GpuDiscovery& found) {
  yolo::graph::ModelSpec spec = yolo::graph::read_model(find_cfg(options.cfg));
  for (const std::string& w : spec.warnings) std::fprintf(stderr, "train_yolo: warning: %s\n", w.c_str());
  if (options.size) spec.net.width = spec.net.height = options.size;
  if (options.summary) {
    yolo::graph::Graph graph = yolo::graph::build_graph(spec);
    std::fputs(yolo::graph::summary_table(graph).c_str(), stdout);
    int batch = options.batch ? options.batch : spec.net.batch;
    int subdivisions = options.subdivisions ? options.subdivisions : spec.net.subdivisions;
    int micro = std::max(1, batch / subdivisions);
    // The precision asked for (flag, else cfg); auto depends on the device: show fp32 and bf16.
    const std::optional<yolo::Precision> asked = options.precision_given ? options.precision : spec.net.precision;
    if (!asked) std::printf("precision auto: bf16 on GPUs of sm_80 and newer, fp16 on sm_75, fp32 on the CPU\n");
    for (yolo::Precision p : asked ? std::vector{*asked} : std::vector{yolo::Precision::Fp32, yolo::Precision::Bf16})
      std::printf("%s (micro-batch %d; plus the device's workspace)\n",
                  yolo::graph::estimate_memory(graph, micro, p).text().c_str(), micro);
    print_tc_plans(graph, micro, asked, found);
    return 0;
  }
  // A launched job (mpirun, srun, torchrun): this process is one rank, on one device.
  const yolo::LaunchInfo launch = yolo::detect_launch([](const char* name) { return std::getenv(name); });
  const bool leader = launch.rank == 0;
  yolo::DeviceChoice choice = !launch.launcher.empty() ? rank_device(options, launch, found)
                                               : yolo::choose_devices(options.devices, found);
  std::printf("train_yolo: %s\n", choice.reason.c_str());
  yolo::Device device = choice.devices.front();
  // Only rank 0 talks; the others' errors and warnings still reach stderr.
  if (!leader && !std::freopen("/dev/null", "w", stdout))
    throw yolo::Error("rank " + std::to_string(launch.rank) + ": cannot silence stdout");

  yolo::graph::TrainOptions to;
  to.max_batches = options.max_batches;
  to.batch = options.batch;
  to.subdivisions = options.subdivisions;
  to.threads = options.threads;
  to.image_cache_mb = options.image_cache_mb;
  to.strict = options.open.strict;
  to.seed = options.seed;
  to.weights = options.weights;
  to.load_layers = options.load_layers;
  to.resume = options.resume;
  to.trace_file = options.trace;
  to.timeline_file = options.timeline;
  // Saved every 10 minutes unless asked otherwise: a run killed (OOM, a preempted machine, a lost
  // peer) loses at most that; --checkpoint-every 0 alone means "at the end only", as before.
  to.checkpoint_every = std::max(options.checkpoint_every, 0);
  to.checkpoint_minutes = options.checkpoint_minutes >= 0 ? options.checkpoint_minutes
                          : options.checkpoint_every == 0 ? 0
                                                          : 10;
  to.resume_command = resume_command(options.argv);
  to.max_skipped_steps = options.max_skipped_steps;
  to.valid_every = options.valid_every;
  to.bucket_mb = options.bucket_mb;
  to.overlap = options.overlap;
  to.sync_bn = options.sync_bn;
  to.graphs = options.graphs;
  to.look_ahead = options.look_ahead;
  to.fold_shortcuts = options.fold;
  to.apply_in_loads = options.load_fold;
  to.device_activity = options.device_activity;
  to.precision = options.precision_given ? options.precision : spec.net.precision;  // nullopt: auto
  to.check_every = options.check_every;
  to.comm_timeout = options.comm_timeout;
  to.launched = !launch.launcher.empty();
  to.process_rank = launch.rank;
  to.process_world = launch.world;
  to.rendezvous = options.rendezvous.empty() ? yolo::default_rendezvous(launch) : options.rendezvous;
  std::string name = std::filesystem::path(spec.path).stem().string();
  to.out_dir = options.out.empty() ? "runs/" + name : options.out;
  // A resumed run continues the cfg it trained (its heads may have been resized for the data).
  if (const std::string trained = to.out_dir + "/model.cfg"; options.resume && std::filesystem::exists(trained)) {
    spec = yolo::graph::read_model(trained);
    if (options.size) spec.net.width = spec.net.height = options.size;  // as for the cfg given
    std::printf("train_yolo: --resume: the run's own cfg, %s\n", trained.c_str());
  }

  yolo::graph::Graph probe = yolo::graph::build_graph(spec);
  yolo::graph::TrainResult result;
  if (probe.detection) {
    std::string data = options.data;
    if (data.empty()) {
      data = "runs/shapes/shapes.data";
      ensure_default_dataset(options, leader);
    }
    yolo::data::Dataset dataset = open_and_describe(data, options.open, to.out_dir, options.threads);
    spec = heads_for_dataset(spec, dataset, to, options, leader);
    if (options.epochs) {
      int batch = options.batch ? options.batch : spec.net.batch;
      int64_t per_epoch = static_cast<int64_t>(dataset.train.samples.size()) / batch;
      to.max_batches = std::max<int64_t>(1, per_epoch * options.epochs);
    }
    yolo::install_stop_handlers();
    result = yolo::graph::train_detector(spec, dataset, choice.devices, to);
    yolo::remove_stop_handlers();  // the evaluation below stops at the first Ctrl-C
    if (result.stop != yolo::graph::TrainStop::Finished) return early_stop(result, options, leader);
    print_result(result);
    if (leader && (options.cfg.empty() || options.valid_every))
      report_detector(spec, dataset, device, result, to.out_dir);
    return 0;
  } else {
    std::string data = options.data.empty() ? "mnist" : options.data;
    if (data != "mnist" && data.rfind("mnist:", 0) != 0)
      throw yolo::Error("--data " + data + ": a classifier trains on MNIST: --data mnist (synthetic) or mnist:DIR");
    yolo::data::MnistSet mnist = yolo::data::load_mnist(data == "mnist" ? "" : data.substr(6), true, options.seed);
    if (options.epochs) {
      int batch = options.batch ? options.batch : spec.net.batch;
      to.max_batches = std::max<int64_t>(1, static_cast<int64_t>(mnist.count) / batch * options.epochs);
    }
    yolo::install_stop_handlers();
    result = yolo::graph::train_classifier(spec, mnist, choice.devices, to);
    yolo::remove_stop_handlers();
    if (result.stop != yolo::graph::TrainStop::Finished) return early_stop(result, options, leader);
  }
  print_result(result);
  return 0;
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
      yolo::data::Dataset dataset = open_and_describe(options.data, options.open,
                                                      options.out.empty() ? "runs/data" : options.out, options.threads);
      run_loader(dataset, options);
      return 0;
    }
    const yolo::GpuDiscovery& found = yolo::discover_gpus();
    if (options.list_devices) {
      std::fputs(yolo::describe_devices(found).c_str(), stdout);
      std::printf("CPU ops: %s\n", yolo::cpu_isa_text().c_str());
      return 0;
    }
    if (options.command == "map") return run_map(options, found);
    if (options.command == "anchors") return run_anchors(options);
    if (options.command == "detect") return run_detect(options, found);
    return train(options, found);
  } catch (const std::exception& e) {
    std::fflush(stdout);  // what was printed comes before the error
    std::fprintf(stderr, "train_yolo: error: %s\n", e.what());
    return 2;
  }
}
