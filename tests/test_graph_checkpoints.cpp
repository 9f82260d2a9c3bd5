// Nothing lost by default (graph/checkpoint_saver.h, graph/train_loop_survivor.cpp):
// checkpoints written while training goes on hold the same bytes as a stop's; the time interval
// saves by itself; a rank that survives a lost or hung peer saves the last step every replica
// completed (the step under way dropped, not saved half done) and the run resumes on the same
// or another number of replicas; a save that fails for lack of space in the middle of a run
// leaves a checkpoint the run resumes from bit for bit; a crash (or a power cut) at any step of a
// save leaves last.ckpt whole or absent, and a checkpoint to resume from.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "graph/checkpoint_files.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::file_bytes;
using yolo::testing::TempDir;
using yolo::testing::tiny_detector_spec;
using yolo::testing::tiny_dp_options;

namespace {

const std::vector<float>& tensor(const Checkpoint& c, const std::string& name) {
  for (const auto& [n, values] : c.tensors)
    if (n == name) return values;
  FAIL("no tensor " << name);
  static const std::vector<float> none;
  return none;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// What the message says after `what` up to the next ';' ("" when absent).
bool says(const std::string& message, const std::string& what) { return message.find(what) != std::string::npos; }

// What `body` prints on stdout, through a pipe (not a file: a test may limit files' sizes); at
// most a pipe's buffer (64 KB), the rest dropped. `body` must not throw.
template <typename Body>
std::string stdout_of(Body body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO);
  dup2(fds[1], STDOUT_FILENO);
  body();
  std::fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  close(fds[1]);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) out.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  return out;
}

std::vector<Device> devices_of(DeviceKind kind, int world) { return yolo::testing::replica_devices(kind, world); }

// A checkpoint written in the background (every 3 steps) and one written synchronously at a stop
// after the same step hold the same bytes.
void check_background_save(DeviceKind kind) {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  for (int world : {1, 2}) {
    CAPTURE(world);
    const std::string tag = std::to_string(world);
    TrainOptions o = tiny_dp_options(dir / ("periodic" + tag), 5);
    o.checkpoint_every = 3;
    o.checkpoint_minutes = 0;
    TrainResult periodic = train_detector(tiny_detector_spec(), dataset, devices_of(kind, world), o);
    REQUIRE(periodic.stop == TrainStop::Finished);
    CHECK(read_checkpoint(o.out_dir + "/prev.ckpt").iteration == 3);  // written while steps 4 and 5 ran

    o.out_dir = dir / ("stopped" + tag);
    o.comm_timeout = 20;
    o.stop_requested = [](int rank, int64_t iteration) { return rank == 0 && iteration == 2; };
    TrainResult stopped = train_detector(tiny_detector_spec(), dataset, devices_of(kind, world), o);
    REQUIRE(stopped.stop == TrainStop::Signal);
    CHECK(file_bytes(dir / ("periodic" + tag + "/prev.ckpt")) == file_bytes(stopped.checkpoint_path));
  }
}

}  // namespace

TEST_CASE("a checkpoint written while training goes on = one written at a stop, byte for byte (CPU, 1 and 2)") {
  check_background_save(DeviceKind::Cpu);
}

TEST_CASE("a checkpoint written while training goes on = one written at a stop (emu:0 look-ahead, emu:0,1)") {
  if (!YOLO_EMULATED_KERNELS) return;  // emulated GPUs exist only in build/tests_emu
  check_background_save(DeviceKind::Emu);
}

TEST_CASE("the time interval saves by itself; --checkpoint-every 0 (both off) saves at the end only") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "timed", 4);
  o.checkpoint_minutes = 1e-9;  // due after every step
  train_detector(tiny_detector_spec(), dataset, devices_of(DeviceKind::Cpu, 1), o);
  CHECK(read_checkpoint(dir / "timed/prev.ckpt").iteration == 3);
  CHECK(read_checkpoint(dir / "timed/last.ckpt").iteration == 4);

  o.out_dir = dir / "end_only";
  o.checkpoint_minutes = 0;
  train_detector(tiny_detector_spec(), dataset, devices_of(DeviceKind::Cpu, 1), o);
  CHECK(read_checkpoint(dir / "end_only/last.ckpt").iteration == 4);
  CHECK_FALSE(std::filesystem::exists(dir / "end_only/prev.ckpt"));
}

namespace {

// Rank 1 fails before step 4 (iteration 3), once rank 0 waits in step 4's all-reduces: rank 0
// saves the state after step 3, whose parameters and momentum are those of a run stopped there,
// bit for bit; the run resumes on 1 and on 2 replicas.
void check_survivor_saves(DeviceKind kind) {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "reference", 6);
  o.checkpoint_minutes = 0;
  o.comm_timeout = 20;
  o.stop_requested = [](int rank, int64_t iteration) { return rank == 0 && iteration == 2; };
  train_detector(tiny_detector_spec(), dataset, devices_of(kind, 2), o);
  const Checkpoint reference = read_checkpoint(dir / "reference/last.ckpt");
  REQUIRE(reference.iteration == 3);

  o.out_dir = dir / "lost";
  o.stop_requested = {};
  o.resume_command = "./train_yolo --resume";
  o.before_step = [](Executor&, int rank, int64_t iteration) {
    if (rank != 1 || iteration != 3) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is in step 4's all-reduces by then
    throw Error("planted: rank 1 fails");
  };
  std::string message;
  try {
    train_detector(tiny_detector_spec(), dataset, devices_of(kind, 2), o);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(says(message, "rank 1: planted: rank 1 fails"));
  CHECK(says(message, "rank 0 saved the state after step 3, the last step every replica completed"));
  CHECK(says(message, "to continue, on this or another number of replicas: ./train_yolo --resume"));
  const Checkpoint saved = read_checkpoint(dir / "lost/last.ckpt");
  CHECK(saved.iteration == 3);
  CHECK(saved.seen == reference.seen);
  CHECK(saved.loader.step == reference.loader.step);
  CHECK(saved.loader.epoch == reference.loader.epoch);
  CHECK(same_bits(tensor(saved, "params"), tensor(reference, "params")));
  CHECK(same_bits(tensor(saved, "momentum"), tensor(reference, "momentum")));

  o.before_step = {};
  o.resume = true;
  for (int world : {1, 2}) {
    CAPTURE(world);
    std::filesystem::copy(dir / "lost", dir / ("resumed" + std::to_string(world)));
    o.out_dir = dir / ("resumed" + std::to_string(world));
    TrainResult resumed = train_detector(tiny_detector_spec(), dataset, devices_of(kind, world), o);
    CHECK(resumed.stop == TrainStop::Finished);
    CHECK(resumed.iterations == 6);
  }
}

}  // namespace

TEST_CASE("a lost peer: the survivor saves the last step every replica completed and the run resumes (CPU)") {
  check_survivor_saves(DeviceKind::Cpu);
}

TEST_CASE("a lost peer on emu:0,1: the survivor saves the last completed step, the step under way dropped") {
  if (!YOLO_EMULATED_KERNELS) return;
  check_survivor_saves(DeviceKind::Emu);
}

TEST_CASE("a peer that hangs past --comm-timeout: both ranks stop, one writes the checkpoint, the other finds it") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "hung", 6);
  o.checkpoint_minutes = 0;
  o.comm_timeout = 1;
  o.before_step = [](Executor&, int rank, int64_t iteration) {
    if (rank == 1 && iteration == 3) std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  };
  std::string message;
  try {
    train_detector(tiny_detector_spec(), dataset, devices_of(DeviceKind::Cpu, 2), o);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(says(message, "rank 0 waited 1 s in a collective that the other ranks never joined"));
  CHECK(says(message, "rank 0 saved the state after step 3"));
  CHECK(says(message, "rank 1 found the state after step 3 saved already"));
  CHECK(read_checkpoint(dir / "hung/last.ckpt").iteration == 3);
  CHECK_FALSE(std::filesystem::exists(dir / "hung/prev.ckpt"));  // written once
}

TEST_CASE("saves that fail for lack of space mid-run say so and training goes on; the run resumes bit for bit") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "straight", 6);
  o.checkpoint_every = 1;
  TrainResult straight = train_detector(tiny_detector_spec(), dataset, devices_of(DeviceKind::Cpu, 1), o);

  // Once step 3's checkpoint is in place, this process's RLIMIT_FSIZE (the soft limit; SIGXFSZ
  // ignored) makes every write past 1 KB fail with EFBIG, as a full disk (ENOSPC) would: steps 4
  // and 5's saves fail, and the run's end. What the run prints goes to a pipe meanwhile (a file
  // would be limited too).
  o.out_dir = dir / "full";
  rlimit before{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &before) == 0);
  int checkpoints = 0;
  yolo::graph::test_hooks::set_save_step_hook([&](const std::string& what) {
    if (what.rfind("rename ", 0) == 0 && what.size() > 10 && what.substr(what.size() - 10) == "/last.ckpt") ++checkpoints;
    if (what.rfind("fsync-dir ", 0) != 0 || checkpoints != 3) return;
    rlimit limit = before;
    limit.rlim_cur = 1024;
    setrlimit(RLIMIT_FSIZE, &limit);
  });
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);
  std::string error;
  const std::string output = stdout_of([&] {
    try {
      train_detector(tiny_detector_spec(), dataset, devices_of(DeviceKind::Cpu, 1), o);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  setrlimit(RLIMIT_FSIZE, &before);
  signal(SIGXFSZ, old_handler);
  yolo::graph::test_hooks::set_save_step_hook({});
  INFO(output);
  INFO(error);
  CHECK(says(error, "File too large"));  // the run's end could not save either
  CHECK(says(output, "the checkpoint of step 4 was not saved (training goes on; the one before it is kept)"));
  CHECK(says(output, "the checkpoint of step 5 was not saved"));
  CHECK(says(output, "the file size limit (ulimit -f) is reached"));
  CHECK(read_checkpoint(dir / "full/last.ckpt").iteration == 3);
  CHECK(read_checkpoint(dir / "full/prev.ckpt").iteration == 2);

  o.resume = true;
  TrainResult resumed = train_detector(tiny_detector_spec(), dataset, devices_of(DeviceKind::Cpu, 1), o);
  CHECK(resumed.iterations == 6);
  CHECK(file_bytes(resumed.weights_path) == file_bytes(straight.weights_path));
  CHECK(file_bytes(resumed.checkpoint_path) == file_bytes(straight.checkpoint_path));
}

namespace {

// Stopped on `from` replicas after step 3, resumed on `to`: the same steps, images seen and
// loader position at the end as the run that never stopped (on `from`), and finite losses; another
// --subdivisions is refused, naming the one to keep.
void check_replicas_change(DeviceKind kind, int from, int to) {
  CAPTURE(from);
  CAPTURE(to);
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o = tiny_dp_options(dir / "straight", 6);
  o.checkpoint_minutes = 0;
  o.comm_timeout = 20;
  train_detector(tiny_detector_spec(), dataset, devices_of(kind, from), o);
  const Checkpoint straight = read_checkpoint(dir / "straight/last.ckpt");

  o.out_dir = dir / "moved";
  o.stop_requested = [](int rank, int64_t iteration) { return rank == 0 && iteration == 2; };
  train_detector(tiny_detector_spec(), dataset, devices_of(kind, from), o);
  o.stop_requested = {};
  o.resume = true;
  TrainOptions other = o;
  other.subdivisions = 3;
  std::string refused;
  try {
    train_detector(tiny_detector_spec(), dataset, devices_of(kind, to), other);
  } catch (const Error& e) {
    refused = e.what();
  }
  CHECK(says(refused, "was written with --batch 6 --subdivisions 1, this run has --batch 6 --subdivisions 3: resume "
                      "with those"));
  TrainResult resumed = train_detector(tiny_detector_spec(), dataset, devices_of(kind, to), o);
  CHECK(resumed.iterations == 6);
  for (double loss : resumed.losses) CHECK(std::isfinite(loss));
  const Checkpoint end = read_checkpoint(dir / "moved/last.ckpt");
  CHECK(end.iteration == straight.iteration);
  CHECK(end.seen == straight.seen);
  CHECK(end.loader.epoch == straight.loader.epoch);
  CHECK(end.loader.step == straight.loader.step);
}

}  // namespace

TEST_CASE("resumed on another number of replicas: 2 -> 1 and 1 -> 2 (CPU)") {
  check_replicas_change(DeviceKind::Cpu, 2, 1);
  check_replicas_change(DeviceKind::Cpu, 1, 2);
}

TEST_CASE("resumed on another number of replicas: 2 -> 1 and 1 -> 2 (emulated GPUs)") {
  if (!YOLO_EMULATED_KERNELS) return;
  check_replicas_change(DeviceKind::Emu, 2, 1);
  check_replicas_change(DeviceKind::Emu, 1, 2);
}

namespace {

struct Crash {};

// A power cut's model over one folder: data written but not flushed to disk (fsync) is lost
// with the power, so a name whose file was renamed into place before its data was flushed is
// left holding nothing. The save's steps are seen through the save-step hook.
class PowerCutModel {
 public:
  // The files in `dir` now are on disk.
  explicit PowerCutModel(const std::string& dir) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) durable_.insert(dir + "/" + entry.path().filename().string());
  }
  // Before step `what`: the crash comes at step `crash_at` (counted from 0), before it is done.
  void step(const std::string& what) {
    if (steps_++ == crash_at) throw Crash{};
    const size_t space = what.find(' ');
    const std::string verb = what.substr(0, space), rest = what.substr(space + 1);
    if (verb == "fsync") {
      durable_.insert(rest);
    } else if (verb == "rename") {
      const size_t second = rest.find(' ');
      const std::string from = rest.substr(0, second), to = rest.substr(second + 1);
      renamed_into_place_[to] = durable_.count(from) > 0;
      if (durable_.erase(from)) durable_.insert(to);
      // A later fsync of the same file descriptor (under its old name) still makes it durable.
      aliases_[from] = to;
    }
  }
  // The folder as the power cut leaves it: each name renamed into place whose data was not
  // flushed before the cut holds nothing.
  void cut() {
    for (const auto& [name, was_durable] : renamed_into_place_) {
      const bool durable_now = was_durable || durable_.count(name) > 0;
      if (!durable_now && std::filesystem::exists(name)) std::filesystem::resize_file(name, 0);
    }
  }
  void note_late_fsyncs() {
    for (const auto& [from, to] : aliases_)
      if (durable_.count(from)) durable_.insert(to);
  }
  int crash_at = -1;
  int steps() const { return steps_; }

 private:
  int steps_ = 0;
  std::set<std::string> durable_;
  std::map<std::string, bool> renamed_into_place_;
  std::map<std::string, std::string> aliases_;
};

Checkpoint small_checkpoint(int64_t iteration) {
  Checkpoint c;
  c.cfg_digest = "0123456789abcdef";
  c.iteration = iteration;
  c.tensors.emplace_back("params", std::vector<float>(300, static_cast<float>(iteration)));
  return c;
}

}  // namespace

TEST_CASE("a crash or a power cut at any step of a save leaves last.ckpt whole or absent, and a checkpoint to resume") {
  // The steps of one save, counted.
  int steps = 0;
  {
    TempDir dir;
    save_checkpoint(dir.path(), small_checkpoint(7));
    save_checkpoint(dir.path(), small_checkpoint(8));
    PowerCutModel count(dir.path());
    yolo::graph::test_hooks::set_save_step_hook([&](const std::string& what) { count.step(what); });
    save_checkpoint(dir.path(), small_checkpoint(9));
    yolo::graph::test_hooks::set_save_step_hook({});
    steps = count.steps();
  }
  CHECK(steps == 5);  // write, fsync, rename last -> prev, rename temp -> last, fsync the folder
  for (int crash_at = 0; crash_at <= steps; ++crash_at) {
    CAPTURE(crash_at);
    TempDir dir;
    save_checkpoint(dir.path(), small_checkpoint(7));
    save_checkpoint(dir.path(), small_checkpoint(8));  // last 8, prev 7, both on disk
    PowerCutModel model(dir.path());
    model.crash_at = crash_at;  // == steps: no crash; the power goes just after the save
    yolo::graph::test_hooks::set_save_step_hook([&](const std::string& what) { model.step(what); });
    bool crashed = false;
    try {
      save_checkpoint(dir.path(), small_checkpoint(9));
    } catch (const Crash&) {
      crashed = true;
    }
    yolo::graph::test_hooks::set_save_step_hook({});
    CHECK(crashed == (crash_at < steps));
    model.note_late_fsyncs();
    model.cut();
    const std::string last = dir / "last.ckpt";
    if (std::filesystem::exists(last)) CHECK_NOTHROW(read_checkpoint(last));  // whole, never damaged
    const ResumePoint point = find_resume_checkpoint(dir.path());
    CHECK(point.checkpoint.iteration >= 8);  // the last completed save is never lost
    if (!crashed) CHECK(point.checkpoint.iteration == 9);
  }
}
