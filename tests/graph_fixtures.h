// Shared pieces of the graph tests: a tiny detector cfg and batches of synthetic images.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "data/synthetic.h"
#include "graph/train.h"
#include "kernels/yolo_loss.h"
#include "runtime/communicator.h"
#include "runtime/emu_communicator.h"
#include "runtime/memory.h"

namespace yolo::testing {

// models/NAME from the repository root (where the tests run) or its build folder.
inline std::string model_path(const std::string& name) {
  for (const char* dir : {"models/", "../models/"})
    if (std::filesystem::exists(dir + name)) return dir + name;
  FAIL("models/" << name << " not found: run the tests from the repository root");
  return {};
}

// 64x64 input, two strided BN convs and a maxpool, one [yolo] head of 3 anchors and 3 classes
// (batch 4 in 2 subdivisions, 6 steps, burn-in 2, a rate step at 4).
inline const char* const kTinyDetectorCfg = R"(
[net]
batch=4
subdivisions=2
width=64
height=64
channels=3
learning_rate=0.01
burn_in=2
max_batches=6
policy=steps
steps=4
scales=.5
[convolutional]
batch_normalize=1
filters=8
size=3
stride=2
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
batch_normalize=1
filters=16
size=3
stride=2
pad=1
activation=leaky
[convolutional]
size=1
stride=1
pad=1
filters=24
activation=linear
[yolo]
mask=0,1,2
anchors=8,8, 16,16, 32,24
classes=3
num=3
jitter=.1
)";

// The tiny detector's data-parallel runs: batch 6, one micro-batch, one bucket per layer (the
// most all-reduces), the parameter hashes compared every step.
inline graph::TrainOptions tiny_dp_options(const std::string& out_dir, int64_t steps = 3) {
  graph::TrainOptions o;
  o.threads = 1;
  o.progress_in_place = false;
  o.check_every = 1;
  o.subdivisions = 1;
  o.batch = 6;
  o.max_batches = steps;
  o.bucket_mb = 0;
  o.out_dir = out_dir;
  return o;
}

// The tiny detector above as a model.
inline graph::ModelSpec tiny_detector_spec() {
  return graph::parse_model(graph::parse_cfg_text(kTinyDetectorCfg, "tiny.cfg"));
}

// A file's bytes ("" when it cannot be read).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// max over i of |a - b| / (|b| + 1e-2 max|b|): relative, with a floor for entries near zero.
inline double worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double norm = 0, worst = 0;
  for (float v : b) norm = std::max(norm, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / (std::fabs(b[i]) + 1e-2 * norm));
  return worst;
}

// The small MLP's data-parallel runs: every bucket its own layer, hashes compared every 5 steps.
inline graph::TrainOptions small_mlp_options() {
  graph::TrainOptions o;
  o.progress_in_place = false;
  o.check_every = 5;
  o.bucket_mb = 0;
  o.seed = 11;
  return o;
}

// A small MLP (the MNIST MLP's layer types, fewer units so the tests are quick).
inline const char* const kSmallMlpCfg = R"(
[net]
batch=12
subdivisions=1
inputs=784
learning_rate=0.05
momentum=0.9
decay=0.0005
max_batches=10

[connected]
output=48
activation=relu

[connected]
output=24
activation=relu

[connected]
output=10
activation=linear

[softmax]
groups=1
)";

// n synthetic images of w x h (stream `seed`, images first .. first + n - 1) as a network
// input batch (NHWC floats in [0, 1]) with their truths.
inline void synthetic_batch(uint64_t seed, int64_t first, int n, int w, int h, std::vector<float>& images,
                            std::vector<YoloTruth>& truths, std::vector<int>& counts) {
  images.assign(static_cast<size_t>(n) * w * h * 3, 0.0f);
  truths.assign(static_cast<size_t>(n) * kYoloMaxTruths, YoloTruth{});
  counts.assign(n, 0);
  for (int b = 0; b < n; ++b) {
    data::Image image;
    std::vector<data::Box> boxes;
    data::draw_synthetic_image(seed, first + b, w, h, 1, 3, image, boxes);
    for (size_t k = 0; k < image.rgb.size(); ++k) images[b * image.rgb.size() + k] = image.rgb[k] / 255.0f;
    counts[b] = static_cast<int>(boxes.size());
    for (size_t k = 0; k < boxes.size(); ++k)
      truths[b * kYoloMaxTruths + k] = YoloTruth{boxes[k].x, boxes[k].y, boxes[k].w, boxes[k].h, boxes[k].class_id};
  }
}

// A micro-batch of synthetic_batch() in device memory of `device` (host memory for the CPU): what
// Executor::train_micro_batch takes. Keep it until the micro-batch has been trained.
struct UploadedBatch {
  DeviceMemory images, truths, counts;
  UploadedBatch(Device device, const std::vector<float>& i, const std::vector<YoloTruth>& t, const std::vector<int>& c)
      : images(device, i.size() * sizeof(float)), truths(device, t.size() * sizeof(YoloTruth)),
        counts(device, c.size() * sizeof(int)) {
    copy_bytes(images.data(), i.data(), images.size());
    copy_bytes(truths.data(), t.data(), truths.size());
    copy_bytes(counts.data(), c.data(), counts.size());
  }
  const float* image_data() const { return static_cast<const float*>(images.data()); }
  const YoloTruth* truth_data() const { return static_cast<const YoloTruth*>(truths.data()); }
  const int* count_data() const { return static_cast<const int*>(counts.data()); }
};

// `world` replicas of one kind: the CPU (cpu:N), or emulated GPUs emu:0 .. emu:N-1.
inline std::vector<Device> replica_devices(DeviceKind kind, int world) {
  std::vector<Device> devices;
  for (int r = 0; r < world; ++r) devices.push_back(kind == DeviceKind::Emu ? Device::emu(r) : Device::cpu());
  return devices;
}

// Runs body(rank, device, communicator) for `world` in-process replicas of `kind`, a thread
// each, over one group (timeout in seconds); returns each rank's error ("" when none).
template <typename Body>
std::vector<std::string> on_replicas(DeviceKind kind, int world, double timeout, Body body) {
  const std::vector<Device> devices = replica_devices(kind, world);
  InProcessGroup group(world, timeout);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = replica_communicator(group, r, devices[r]);
        body(r, devices[r], *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// A training set of 12 images (or `train_images`; 80x60 PNGs, 1 validation image) written under
// `root` and opened.
inline data::Dataset small_shapes_dataset(const std::string& root, int train_images = 12) {
  data::SyntheticOptions options;
  options.train_images = train_images;
  options.valid_images = 1;
  options.width = 80;
  options.height = 60;
  options.png = true;
  return data::open_dataset(data::write_synthetic_dataset(root, options).data_file);
}

}  // namespace yolo::testing
