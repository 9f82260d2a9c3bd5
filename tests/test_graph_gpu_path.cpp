// The trainer's GPU path (the executor, trainer and evaluator over the CUDA kernels) on the
// kernel device: emu:0 in build/tests_emu, gpu:0 in build/tests on a GPU machine. Against the
// CPU backend, bit-exact repeats (also under the adversarial schedule), a multi-scale switch,
// checkpoint + exact resume, --valid-every and --trace. Emulated GPUs only: the memory-fit check,
// a replica whose kernel fails mid-step, and the planted faults (runtime/fault.h), each caught by
// the adversarial schedule. Data parallel: test_graph_parallel.cpp; detect: test_graph_evaluate.cpp.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "graph/executor.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "kernels/precision.h"
#include "runtime/check.h"
#include "runtime/fault.h"
#include "tests/emu_fixtures.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif
#include "tests/graph_fixtures.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::AdversarialSchedule;
using yolo::testing::TempDir;
using yolo::testing::file_bytes;
using yolo::testing::worst_difference;

namespace {

// The tiny detector's single-device runs: its cfg's batch 4 in 2 micro-batches (gradients
// accumulated on the device), 3 steps.
TrainOptions single_options(const std::string& out_dir) {
  TrainOptions o;
  o.threads = 1;
  o.seed = 5;
  o.progress_in_place = false;
  o.max_batches = 3;
  o.out_dir = out_dir;
  return o;
}

}  // namespace

TEST_CASE("the GPU path trains the tiny detector as the CPU does, and repeats its own bits (emu:0: also adversarially)") {
  KERNEL_TEST_DEVICE(device);
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = single_options("");
  auto train = [&](Device on, const std::string& name) {
    o.out_dir = dir / name;
    TrainResult r = train_detector(yolo::testing::tiny_detector_spec(), dataset, on, o);
    REQUIRE(r.iterations == 3);
    return std::make_pair(r, read_checkpoint(r.checkpoint_path));
  };
  auto [cpu, cpu_ckpt] = train(Device::cpu(), "cpu");
  auto [emu, emu_ckpt] = train(device, "device");
  auto [again, again_ckpt] = train(device, "again");
  // The CUDA kernels sum in other orders than the CPU ops (tiles, split-K partials, warp and
  // block reductions), so the two backends agree to float rounding, grown over 3 steps of SGD.
  for (size_t t = 0; t < cpu_ckpt.tensors.size(); ++t) {
    CAPTURE(cpu_ckpt.tensors[t].first);
    double worst = worst_difference(emu_ckpt.tensors[t].second, cpu_ckpt.tensors[t].second);
    MESSAGE(cpu_ckpt.tensors[t].first << ": " << device.name() << " vs CPU, worst relative difference " << worst);
    CHECK(worst <= 1e-4);
  }
  MESSAGE("loss: CPU " << cpu.first_loss << " -> " << cpu.last_loss << ", " << device.name() << " " << emu.first_loss
                       << " -> " << emu.last_loss);
  CHECK(yolo::testing::close(emu.first_loss, cpu.first_loss, 0, 1e-5));
  CHECK(yolo::testing::close(emu.last_loss, cpu.last_loss, 0, 1e-4));
  CHECK(emu_ckpt.tensors[0].second != cpu_ckpt.tensors[0].second);  // really two implementations
  // The same device and seed: the same bits, whatever the schedule.
  CHECK(file_bytes(again.weights_path) == file_bytes(emu.weights_path));
  if (device.is_emu()) {
    AdversarialSchedule schedule(2026);
    auto [adversarial, adversarial_ckpt] = train(device, "adversarial");
    CHECK(file_bytes(adversarial.weights_path) == file_bytes(emu.weights_path));
    CHECK(adversarial.last_loss == emu.last_loss);
  }
}

TEST_CASE(
    "tf32 on the kernel device (emu0 or gpu0): the tiny detector trains within a band of fp32, repeats its bits; "
    "refusals") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("tf32 needs sm_80");
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = single_options("");
  auto train = [&](Precision precision, const std::string& name) {
    o.out_dir = dir / name;
    o.precision = precision;
    TrainResult r = train_detector(yolo::testing::tiny_detector_spec(), dataset, device, o);
    REQUIRE(r.iterations == 3);
    return std::make_pair(r, read_checkpoint(r.checkpoint_path));
  };
  auto [fp32, fp32_ckpt] = train(Precision::Fp32, "fp32");
  auto [tf32, tf32_ckpt] = train(Precision::Tf32, "tf32");
  auto [again, again_ckpt] = train(Precision::Tf32, "again");
  // The band: TF32 keeps 10 mantissa bits (relative rounding 2^-11 per input), so after 3 SGD
  // steps the losses agree within 1% and each checkpoint tensor within 1% in norm. (The band
  // first fixed, 2% element by element, was exceeded: params 3.3%, momentum 10%, at entries
  // near zero whose TF32 error scales with the magnitudes that cancelled there, not with the
  // entry. Norms measure what TF32 promises.)
  MESSAGE("loss: fp32 " << fp32.first_loss << " -> " << fp32.last_loss << ", tf32 " << tf32.first_loss << " -> "
                        << tf32.last_loss);
  CHECK(yolo::testing::close(tf32.first_loss, fp32.first_loss, 0, 1e-2));
  CHECK(yolo::testing::close(tf32.last_loss, fp32.last_loss, 0, 1e-2));
  bool differs = false;
  for (size_t t = 0; t < fp32_ckpt.tensors.size(); ++t) {
    CAPTURE(fp32_ckpt.tensors[t].first);
    const std::vector<float>& got = tf32_ckpt.tensors[t].second;
    const std::vector<float>& want = fp32_ckpt.tensors[t].second;
    REQUIRE(got.size() == want.size());
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff2 += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      ref2 += double(want[i]) * want[i];
    }
    const double relative = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    MESSAGE(fp32_ckpt.tensors[t].first << ": tf32 vs fp32, relative norm " << relative << ", worst element "
                                       << worst_difference(got, want));
    CHECK(relative <= 1e-2);
    differs = differs || got != want;
  }
  CHECK(differs);  // the tensor cores really ran
  CHECK(file_bytes(again.weights_path) == file_bytes(tf32.weights_path));

  o.out_dir = dir / "refused";
  o.precision = Precision::Tf32;
  CHECK_THROWS_WITH_AS(train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::cpu(), o),
                       doctest::Contains("precision tf32 (--precision, or the cfg's [net] precision=) runs on tensor cores, but cpu is the CPU backend"), Error);
  o.precision = Precision::Bf16;
  CHECK_THROWS_WITH_AS(train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::cpu(), o),
                       doctest::Contains("precision bf16 (--precision, or the cfg's [net] precision=) runs on tensor "
                                         "cores, but cpu is the CPU backend"),
                       Error);
#if YOLO_EMULATED_KERNELS
  yolo::testing::EmulatedDevicesReset reset;
  emu::configure_device(1, emu::preset_for(75));
  o.precision = Precision::Tf32;
  CHECK_THROWS_WITH_AS(train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::emu(1), o),
                       doctest::Contains("precision tf32 needs tensor cores of sm_80 or newer; this device is sm_75"),
                       Error);
#endif
}

TEST_CASE("the GPU path: a multi-scale switch equals an executor built for that size, bit for bit") {
  KERNEL_TEST_DEVICE(gpu);
  ModelSpec spec = yolo::testing::tiny_detector_spec();
  Graph at64 = build_graph(spec), at96 = build_graph(spec, 96, 96);
  const int n = 2;
  Executor both(at64, gpu, n, 11, {{96, 96}, {32, 32}});
  Executor only96(at96, gpu, n, 11);
  testing::Rng rng;
  std::vector<float> images = rng.floats(static_cast<size_t>(n) * 96 * 96 * 3, 0, 1);
  std::vector<YoloTruth> truths(static_cast<size_t>(n) * kYoloMaxTruths);
  std::vector<int> counts{1, 2};
  truths[0] = YoloTruth{0.3f, 0.4f, 0.2f, 0.3f, 1};
  truths[kYoloMaxTruths] = YoloTruth{0.6f, 0.5f, 0.1f, 0.1f, 0};
  truths[kYoloMaxTruths + 1] = YoloTruth{0.2f, 0.7f, 0.4f, 0.2f, 2};
  yolo::testing::UploadedBatch batch(gpu, images, truths, counts);
  both.train_micro_batch(batch.image_data(), batch.truth_data(), batch.count_data(), nullptr, false);  // at 64
  both.take_loss();
  both.set_input_size(96, 96);
  both.train_micro_batch(batch.image_data(), batch.truth_data(), batch.count_data(), nullptr, false);
  only96.train_micro_batch(batch.image_data(), batch.truth_data(), batch.count_data(), nullptr, false);
  CHECK(both.take_loss().total == only96.take_loss().total);
  CHECK(both.download("grads") == only96.download("grads"));
}

TEST_CASE("the GPU path: a resumed run equals an uninterrupted one bit for bit; --valid-every; --trace") {
  KERNEL_TEST_DEVICE(device);
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = single_options(dir / "straight");
  o.max_batches = 4;
  TrainResult straight = train_detector(yolo::testing::tiny_detector_spec(), dataset, device, o);
  o.out_dir = dir / "split";
  o.max_batches = 2;
  train_detector(yolo::testing::tiny_detector_spec(), dataset, device, o);
  o.max_batches = 4;
  o.resume = true;
  TrainResult resumed = train_detector(yolo::testing::tiny_detector_spec(), dataset, device, o);
  CHECK(resumed.iterations == 4);
  CHECK(file_bytes(resumed.weights_path) == file_bytes(straight.weights_path));
  // Validation (the CUDA decode and NMS) every epoch, and a trace of one step's layers.
  o.resume = false;
  o.out_dir = dir / "valid";
  o.valid_every = 1;
  o.trace_file = dir / "trace.json";
  TrainResult validated = train_detector(yolo::testing::tiny_detector_spec(), dataset, device, o);
  CHECK(validated.best_map50 >= 0);
  CHECK(std::filesystem::exists(dir / "valid/best.weights"));
  std::string trace = file_bytes(dir / "trace.json");
  CHECK(trace.find("\"2 conv\"") != std::string::npos);
  CHECK(trace.find(device.name()) != std::string::npos);
}

#if YOLO_EMULATED_KERNELS

namespace {

// How a run ended: its error, or its weights file and losses.
struct Outcome {
  std::string error, weights;
  double first_loss = 0, last_loss = 0;
  bool same_as(const Outcome& o) const {
    return error.empty() && o.error.empty() && weights == o.weights && first_loss == o.first_loss;
  }
};

Outcome run(const data::Dataset& dataset, const std::vector<Device>& devices, const TrainOptions& o) {
  Outcome out;
  try {
    TrainResult r = train_detector(yolo::testing::tiny_detector_spec(), dataset, devices, o);
    out.weights = file_bytes(r.weights_path);
    out.first_loss = r.first_loss;
    out.last_loss = r.last_loss;
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

// Kernels rank 1 launches in one data-parallel step on emu:0,1 (to place an injected failure).
int64_t kernels_per_step(const data::Dataset& dataset, const std::filesystem::path& out_dir) {
  TrainOptions probe = yolo::testing::tiny_dp_options(out_dir, 1);
  int64_t before = emu::kernel_launches(1);
  train_detector(yolo::testing::tiny_detector_spec(), dataset, std::vector<Device>{Device::emu(0), Device::emu(1)}, probe);
  int64_t per_step = emu::kernel_launches(1) - before;
  REQUIRE(per_step > 10);
  return per_step;
}

#if YOLO_EMU
// Switches a planted fault on for the scope.
struct PlantedFault {
  Fault fault;
  explicit PlantedFault(Fault f) : fault(f) { inject_fault(f, true); }
  ~PlantedFault() { inject_fault(fault, false); }
};
#endif

}  // namespace


TEST_CASE("emulated GPU memory: the executor's plan must fit the device, with the numbers") {
  yolo::testing::EmulatedDevicesReset reset;
  Graph graph = build_graph(yolo::testing::tiny_detector_spec());
  emu::DeviceProps tiny = emu::preset_for(90);
  tiny.memory_bytes = size_t(64) << 10;
  emu::configure_device(2, tiny);
  CHECK_THROWS_WITH_AS(Executor(graph, Device::emu(2), 2, 1), doctest::Contains("the model does not fit on emu:2"), Error);
  CHECK_THROWS_WITH_AS(Executor(graph, Device::emu(2), 2, 1), doctest::Contains("MiB are free"), Error);
}

TEST_CASE("emu:0,1: a replica whose kernel fails mid-step stops the other within --comm-timeout, naming it") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const int64_t per_step = kernels_per_step(dataset, dir / "probe");  // to fail rank 1 mid-step 3
  TrainOptions o = yolo::testing::tiny_dp_options(dir / "run", 5);
  o.checkpoint_every = 1;
  o.comm_timeout = 20;
  emu::fail_kernel_launch(1, 2 * per_step + per_step / 2);
  auto start = std::chrono::steady_clock::now();
  Outcome failed = run(dataset, {Device::emu(0), Device::emu(1)}, o);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  emu::fail_kernel_launch(1, 0);
  MESSAGE("the run stopped after " << seconds << " s: " << failed.error);
  // Rank 1 named as the one that failed: by its own error, or by rank 0's (its failed collective
  // aborted the group, which rank 0 may report first).
  CHECK((failed.error.rfind("rank 1: ", 0) == 0 || failed.error.find("rank 1 failed") != std::string::npos));
  CHECK(failed.error.find("an illegal memory access in") != std::string::npos);
  CHECK(seconds < o.comm_timeout);
  // Nothing half-written: rank 1's context is lost mid-step 3, so its step-3 all-reduces never
  // contribute, rank 0's step 3 is dropped (its update gated), and rank 0, surviving, saves step
  // 2 (graph/train_loop_survivor.cpp). The checkpoint is whole, and no temporary file is left.
  Checkpoint saved = read_checkpoint(dir / "run/last.ckpt");
  CHECK(saved.iteration == 2);
  // Rank 0 saved it, or found it saved (the save after step 2, or rank 1's own: it survives its
  // device's fault as a process, its state gated like rank 0's).
  CHECK(failed.error.find("the state after step 2") != std::string::npos);
  for (const auto& entry : std::filesystem::directory_iterator(dir / "run"))
    CHECK(entry.path().extension() != ".tmp");
}

#if YOLO_EMU
// A replica failing anywhere in a step unwinds cleanly under the adversarial schedule too, the
// other stopped with it. (The adversarial pass once caught a replica's buffers freed while its
// comm stream still had the stop-request copy queued, in the planted-faults case below; this
// sweep did not reproduce that timing, so it guards the unwinding paths, not that race.)
TEST_CASE("emu:0,1, adversarial schedule: a replica failing with collectives queued unwinds cleanly") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const int64_t per_step = kernels_per_step(dataset, dir / "probe");
  AdversarialSchedule schedule(11);
  // Failure points across step 2: in forward (rank 0's stop-request all-reduce then waits for
  // rank 1, which never joins it) and in backward (rank 1's own collectives queued).
  for (int tenth : {2, 4, 6, 8}) {
    CAPTURE(tenth);
    TrainOptions o = yolo::testing::tiny_dp_options(dir / ("run" + std::to_string(tenth)), 3);
    o.comm_timeout = 20;
    emu::fail_kernel_launch(1, per_step + per_step * tenth / 10);
    Outcome failed = run(dataset, {Device::emu(0), Device::emu(1)}, o);
    emu::fail_kernel_launch(1, 0);
    CHECK((failed.error.rfind("rank 1: ", 0) == 0 || failed.error.find("rank 1 failed") != std::string::npos));
    CHECK(failed.error.find("an illegal memory access in") != std::string::npos);
  }
}

TEST_CASE("planted faults: the adversarial schedule catches each, the same runs without them reproduce their bits") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const std::vector<Device> one{Device::emu(0)}, two{Device::emu(0), Device::emu(1)};
  TrainOptions single = single_options(dir / "single"), dp = yolo::testing::tiny_dp_options(dir / "dp", 3);
  Outcome single_normal = run(dataset, one, single), dp_normal = run(dataset, two, dp);
  REQUIRE(single_normal.error.empty());
  REQUIRE(dp_normal.error.empty());
  AdversarialSchedule schedule(77);
  // Without a fault the adversarial schedule changes nothing.
  CHECK(run(dataset, one, single).same_as(single_normal));
  CHECK(run(dataset, two, dp).same_as(dp_normal));
  struct Case {
    Fault fault;
    const char* what;
    bool data_parallel;
  };
  for (Case c : {Case{Fault::CommSkipsComputeWait, "the all-reduce does not wait for the gradients", true},
                 Case{Fault::AllReduceBeforeLastKernel, "the all-reduce is queued before the layer's kernels", true},
                 Case{Fault::LossReadWithoutSync, "the loss is read without synchronising", false}}) {
    const std::string what = c.what;
    CAPTURE(what);
    PlantedFault planted(c.fault);
    Outcome faulty = c.data_parallel ? run(dataset, two, dp) : run(dataset, one, single);
    const Outcome& good = c.data_parallel ? dp_normal : single_normal;
    MESSAGE(what << ": " << (faulty.error.empty() ? "loss " + std::to_string(faulty.first_loss) + " -> " +
                                                          std::to_string(faulty.last_loss) + " (correct: " +
                                                          std::to_string(good.first_loss) + " -> " +
                                                          std::to_string(good.last_loss) + ")"
                                                    : "error: " + faulty.error));
    CHECK_FALSE(faulty.same_as(good));
  }
}

#endif  // YOLO_EMU

#endif  // YOLO_EMULATED_KERNELS
