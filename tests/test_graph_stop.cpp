// Nothing lost, nothing crashes (graph/checkpoint_files.h, graph/divergence.h): a stop request
// finishes the step under way and saves, and resuming gives the uninterrupted run's bits (1 and 2
// replicas; one rank asked is enough); --resume falls back to prev.ckpt when last.ckpt is damaged
// or missing; a save that hits the file size limit leaves the previous checkpoints intact; the output folder
// is checked before training; K non-finite steps in a row stop the run naming the layer.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "graph/checkpoint_files.h"
#include "graph/divergence.h"
#include "graph/executor.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "tests/child_process.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::file_bytes;
using yolo::testing::TempDir;
using yolo::testing::tiny_detector_spec;
using yolo::testing::tiny_dp_options;

namespace {

std::vector<Device> cpus(int world) { return std::vector<Device>(static_cast<size_t>(world), Device::cpu()); }

// Sets every weight of cfg layer `layer` to `value` (a planted fault), on this replica only.
void plant(Executor& executor, int layer, float value) {
  for (const LayerParams& l : executor.download_parameters())
    if (l.layer == layer)
      for (size_t i = 0; i < l.weight_count(); ++i) l.weights[i] = value;
  executor.upload_parameters();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

size_t temporary_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    n += entry.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

}  // namespace

namespace {

// A stop request to the last rank only, before step 3's collectives: every rank stops after step
// 3 and rank 0 saves; resumed, the run ends on the uninterrupted run's bits.
void check_stop_and_resume(DeviceKind kind) {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  for (int world : {1, 2}) {
    CAPTURE(world);
    const std::vector<Device> devices = yolo::testing::replica_devices(kind, world);
    const std::string tag = std::to_string(world);
    TrainOptions o = tiny_dp_options(dir / ("straight" + tag), 5);
    o.checkpoint_every = 1;
    o.comm_timeout = 20;  // a rank that stops alone leaves the other waiting in its next all-reduce
    TrainResult straight = train_detector(tiny_detector_spec(), dataset, devices, o);
    REQUIRE(straight.stop == TrainStop::Finished);

    o.out_dir = dir / ("stopped" + tag);
    o.stop_requested = [world](int rank, int64_t iteration) { return rank == world - 1 && iteration == 2; };
    TrainResult stopped = train_detector(tiny_detector_spec(), dataset, devices, o);
    CHECK(stopped.stop == TrainStop::Signal);
    CHECK(stopped.iterations == 3);
    CHECK(stopped.stop_message.find("after step 3") != std::string::npos);
    CHECK(read_checkpoint(o.out_dir + "/last.ckpt").iteration == 3);
    CHECK(read_checkpoint(o.out_dir + "/prev.ckpt").iteration == 2);  // the save before is kept

    o.stop_requested = {};
    o.resume = true;
    TrainResult resumed = train_detector(tiny_detector_spec(), dataset, devices, o);
    CHECK(resumed.stop == TrainStop::Finished);
    CHECK(resumed.iterations == 5);
    CHECK(file_bytes(resumed.weights_path) == file_bytes(straight.weights_path));
    CHECK(file_bytes(resumed.checkpoint_path) == file_bytes(straight.checkpoint_path));
  }
}

}  // namespace

TEST_CASE("a stop request finishes the step and saves; resumed, the uninterrupted bits (CPU, 1 and 2 replicas)") {
  check_stop_and_resume(DeviceKind::Cpu);
}

TEST_CASE("a stop request on emu:0 (graphs replayed) and emu:0,1 (carried in the all-reduce); resumed bit for bit") {
  if (!YOLO_EMULATED_KERNELS) return;  // emulated GPUs exist only in build/tests_emu
  check_stop_and_resume(DeviceKind::Emu);
}

TEST_CASE("--resume falls back to prev.ckpt when last.ckpt is damaged or missing, saying what it costs") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "straight", 5);
  TrainResult straight = train_detector(tiny_detector_spec(), dataset, cpus(1), o);
  o.out_dir = dir / "run";
  o.max_batches = 3;
  o.checkpoint_every = 1;
  train_detector(tiny_detector_spec(), dataset, cpus(1), o);  // last.ckpt at step 3, prev.ckpt at 2
  const std::string last = o.out_dir + "/last.ckpt", prev = o.out_dir + "/prev.ckpt";
  const std::string good_last = file_bytes(last), good_prev = file_bytes(prev);

  SUBCASE("a flipped byte: the checksum fails, prev.ckpt is taken, one step lost") {
    std::string bytes = good_last;
    bytes[bytes.size() / 2] ^= 0x10;
    write_bytes(last, bytes);
    ResumePoint point = find_resume_checkpoint(o.out_dir);
    CHECK(point.path == prev);
    CHECK(point.checkpoint.iteration == 2);
    CHECK(point.notice.find("checksum mismatch") != std::string::npos);
    CHECK(point.notice.find("which loses 1 step (last.ckpt was at step 3)") != std::string::npos);
    // And training resumed from it ends on the uninterrupted run's bits.
    o.resume = true;
    o.max_batches = 5;
    TrainResult resumed = train_detector(tiny_detector_spec(), dataset, cpus(1), o);
    CHECK(resumed.iterations == 5);
    CHECK(file_bytes(resumed.weights_path) == file_bytes(straight.weights_path));
  }
  SUBCASE("truncated inside its header: the lost steps are not known, and said so") {
    write_bytes(last, good_last.substr(0, 30));
    ResumePoint point = find_resume_checkpoint(o.out_dir);
    CHECK(point.path == prev);
    CHECK(point.notice.find("truncated") != std::string::npos);
    CHECK(point.notice.find("last.ckpt's own step count is unreadable") != std::string::npos);
  }
  SUBCASE("missing (a stop between the two renames of a save): prev.ckpt") {
    std::filesystem::remove(last);
    ResumePoint point = find_resume_checkpoint(o.out_dir);
    CHECK(point.path == prev);
    CHECK(point.notice.find("no " + last) != std::string::npos);
  }
  SUBCASE("both damaged, or none there: an error naming both") {
    write_bytes(last, good_last.substr(0, good_last.size() - 5));
    write_bytes(prev, "YOLOCKPT but not really");
    CHECK_THROWS_WITH_AS(find_resume_checkpoint(o.out_dir),
                         doctest::Contains(("neither checkpoint can be resumed: " + last).c_str()), yolo::Error);
    std::filesystem::remove(last);
    std::filesystem::remove(prev);
    CHECK_THROWS_WITH_AS(find_resume_checkpoint(o.out_dir), doctest::Contains("no checkpoint to resume from"),
                         yolo::Error);
  }
}

TEST_CASE("a save that hits the file size limit fails clearly and leaves last.ckpt and prev.ckpt intact") {
  TempDir dir;
  Checkpoint small;
  small.cfg_digest = "0123456789abcdef";
  small.iteration = 7;
  small.tensors.emplace_back("params", std::vector<float>(1000, 0.5f));
  write_checkpoint(dir / "prev.ckpt", small);
  small.iteration = 8;
  write_checkpoint(dir / "last.ckpt", small);
  const std::string last_before = file_bytes(dir / "last.ckpt"), prev_before = file_bytes(dir / "prev.ckpt");
  Checkpoint big = small;
  big.iteration = 9;
  big.tensors[0].second.assign(200000, 1.0f);  // 800 KB, over the 64 KB limit below

  // In a forked child: RLIMIT_FSIZE makes write() fail with EFBIG once SIGXFSZ is ignored, as a
  // full disk (ENOSPC) would, without needing one.
  int status = 0;
  std::string output = yolo::testing::output_of_forked(
      [&] {
        struct rlimit limit {
          64 * 1024, 64 * 1024
        };
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(20);
        try {
          save_checkpoint(dir.path(), big);
          _exit(21);  // the save must fail
        } catch (const yolo::Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
        }
      },
      &status);
  INFO(output);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(output.find("File too large; the file size limit (ulimit -f) is reached") != std::string::npos);
  CHECK(output.find("last.ckpt itself is unchanged") != std::string::npos);
  CHECK(file_bytes(dir / "last.ckpt") == last_before);
  CHECK(file_bytes(dir / "prev.ckpt") == prev_before);
  CHECK(temporary_files(dir.path()) == 0);
  CHECK(read_checkpoint(dir / "last.ckpt").iteration == 8);
  // Without the limit the same save rotates: last becomes prev.
  save_checkpoint(dir.path(), big);
  CHECK(read_checkpoint(dir / "last.ckpt").iteration == 9);
  CHECK(file_bytes(dir / "prev.ckpt") == last_before);
}

TEST_CASE("the output folder is checked before training: writable, room for a save, dead saves' leftovers removed") {
  TempDir dir;
  const std::string run = dir / "run";
  check_output_folder(run, 1000, 500, 1);  // creates it
  CHECK(std::filesystem::is_directory(run));
  CHECK_THROWS_WITH_AS(check_output_folder(run, uint64_t{1} << 60, 500, 1),
                       doctest::Contains("not enough disk space for saving"), yolo::Error);
  yolo::testing::write_text_file(dir / "file", "x");
  CHECK_THROWS_WITH_AS(check_output_folder(dir / "file", 1000, 500, 1), doctest::Contains("; --out)"), yolo::Error);
  // /proc takes no new files, even from root (CI runs as root, to which permissions do not apply).
  CHECK_THROWS_WITH_AS(check_output_folder("/proc", 1000, 500, 1), doctest::Contains("is not writable"), yolo::Error);
  // A temporary file of a process that is gone goes; this process's stays.
  pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  waitpid(child, nullptr, 0);
  const std::string dead = run + "/last.ckpt.tmp." + std::to_string(child);
  const std::string ours = run + "/last.ckpt.tmp." + std::to_string(getpid());
  yolo::testing::write_text_file(dead, "half a checkpoint");
  yolo::testing::write_text_file(ours, "being written");
  check_output_folder(run, 1000, 500, 1);
  CHECK_FALSE(std::filesystem::exists(dead));
  CHECK(std::filesystem::exists(ours));
}

TEST_CASE("K steps in a row with non-finite gradients stop the run, naming the layer and the rank") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    int world;
    float value;
    const char* where;
  };
  // NaN weights are found as parameters; weights of 3e38 are finite but overflow layer 2's output.
  for (Case c : {Case{1, nan, "layer 2 (conv)'s parameters"}, Case{1, 3e38f, "layer 2 (conv)'s output"},
                 Case{2, 3e38f, "on rank 1, was in layer 2 (conv)'s output"}}) {
    CAPTURE(c.world);
    CAPTURE(c.where);
    TrainOptions o = tiny_dp_options(dir / ("run" + std::to_string(c.world) + c.where), 12);
    o.checkpoint_every = 1;
    o.check_every = 0;  // the planted replica's parameters differ on purpose
    o.max_skipped_steps = 3;
    o.before_step = [&c](Executor& executor, int rank, int64_t iteration) {
      if (iteration == 2 && rank == c.world - 1) plant(executor, 2, c.value);
    };
    TrainResult result = train_detector(tiny_detector_spec(), dataset, cpus(c.world), o);
    INFO(result.stop_message);
    CHECK(result.stop == TrainStop::Diverged);
    CHECK(result.iterations == 5);
    CHECK(result.stop_message.find("3 steps in a row (3 to 5) were skipped") != std::string::npos);
    CHECK(result.stop_message.find(c.where) != std::string::npos);
    CHECK(result.stop_message.find("at step 4 (the per-layer check runs on the second skipped step)") !=
          std::string::npos);
    CHECK(result.stop_message.find("lower learning_rate") != std::string::npos);
    if (c.world == 1) {
      // The running state is not finite: the checkpoint of step 2 stays on disk.
      CHECK(result.stop_message.find("was kept") != std::string::npos);
      CHECK(read_checkpoint(o.out_dir + "/last.ckpt").iteration == 2);
    } else {
      // Rank 0 saves its own state, which the planted fault on rank 1 did not reach.
      CHECK(result.stop_message.find("is saved in") != std::string::npos);
      CHECK(read_checkpoint(o.out_dir + "/last.ckpt").iteration == 5);
    }
  }
}

TEST_CASE("fp16 (simulated GPU): overflow skips are loss-scale adjustments until the scale's floor, then divergence") {
  if (!YOLO_EMULATED_KERNELS) return;  // emulated GPUs exist only in build/tests_emu
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "fp16", 12);
  o.precision = Precision::Fp16;
  o.batch = 2;  // emulated fp16 is slow
  o.graphs = false;
  o.initial_loss_scale = 0x1p-22f;  // two halvings above the floor, 2^-24
  o.max_skipped_steps = 2;
  o.before_step = [](Executor& executor, int, int64_t iteration) {
    if (iteration == 1) plant(executor, 2, std::numeric_limits<float>::quiet_NaN());
  };
  TrainResult result = train_detector(tiny_detector_spec(), dataset, {Device::emu(0)}, o);
  INFO(result.stop_message);
  // Step 2 at 2^-22 and step 3 at 2^-23 are adjustments; steps 4 and 5 at 2^-24 count.
  CHECK(result.stop == TrainStop::Diverged);
  CHECK(result.iterations == 5);
  CHECK(result.stop_message.find("2 steps in a row (4 to 5)") != std::string::npos);
  CHECK(result.loss_scale == 0x1p-24f);
}
