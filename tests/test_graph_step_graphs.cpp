// The training step as graphs (graph/step_graphs.h, issue 15) on emulated GPUs, where a graph is
// the capture of the streams' queues: replayed steps give the bits of eager ones (--no-graph) over
// burn-in learning-rate changes, fp16 overflow skips with their loss-scale changes, a multi-scale
// size switch and a checkpoint/resume, on emu:0 and on emu:0,1 (overlapped all-reduces, --sync-bn),
// so that any value baked into a graph fails; a capture that fails falls back to eager with the
// reason and the same bits; the CPU backend runs eagerly and says why.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "data/json.h"
#include "data/synthetic.h"
#include "data/transform.h"
#include "graph/cfg.h"
#include "graph/run_record.h"
#include "graph/train.h"
#include "runtime/fault.h"
#include "tests/emu_fixtures.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::file_bytes;
using yolo::testing::TempDir;

#if YOLO_EMULATED_KERNELS
namespace {

// The tiny detector at 96x32 with multi-scale training (random=1: 96x32 or 128x32, a new size every
// 10 steps), batch 2 in 2 micro-batches: graphs of two sizes, each a first and a last micro-batch.
std::string multiscale_tiny_cfg() {
  std::string cfg = yolo::testing::kTinyDetectorCfg;
  auto set = [&](const std::string& from, const std::string& to) {
    const size_t at = cfg.find(from);
    REQUIRE(at != std::string::npos);
    cfg.replace(at, from.size(), to);
  };
  set("batch=4", "batch=2");
  set("width=64", "width=96");
  set("height=64", "height=32");
  set("jitter=.1", "jitter=.1\nrandom=1");
  return cfg;
}

// A seed whose first two multi-scale sizes (steps 0-9 and 10-19) differ.
uint64_t seed_with_size_switch() {
  for (uint64_t seed = 1;; ++seed)
    if (data::multiscale_size(seed, 0, 96, 32, 10) != data::multiscale_size(seed, 10, 96, 32, 10)) return seed;
}

}  // namespace

namespace {

// The shared options of the runs below: fp16 from a loss scale of 2^13 (the first steps overflow,
// are skipped and halve the scale before it trains) while burn-in (2 steps) and the rate step (at 4)
// change the learning rate; data parallel: an all-reduce per layer, overlapped with backward.
TrainOptions graph_options() {
  TrainOptions o;
  o.threads = 1;
  o.progress_in_place = false;
  o.seed = seed_with_size_switch();
  o.precision = Precision::Fp16;
  o.initial_loss_scale = 0x1p13f;
  o.check_every = 1;
  o.bucket_mb = 0;
  return o;
}

struct GraphRuns {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  ModelSpec spec = parse_model(parse_cfg_text(multiscale_tiny_cfg(), "tiny_multiscale.cfg"));
  TrainOptions o = graph_options();
  TrainResult train(const std::vector<Device>& devices, const std::string& name, bool graphs, int64_t steps,
                    bool resume = false) {
    o.out_dir = dir / name;
    o.graphs = graphs;
    o.max_batches = steps;
    o.resume = resume;
    return train_detector(spec, dataset, devices, o);
  }
};

// Graphs against --no-graph: the same losses and checkpoint; `sizes` input sizes met, each a first
// and a last micro-batch kind run eagerly once and captured at its second run.
void check_replayed(const TrainResult& eager, const TrainResult& replayed, int64_t steps, size_t sizes,
                    const char* where) {
  MESSAGE(std::string(where) << ": " << replayed.graph_launches << " of " << 2 * steps
                             << " micro-batches launched as graphs, " << replayed.graphs_captured << " graphs; "
                             << replayed.overflow_skips << " overflow skips, loss scale " << replayed.loss_scale);
  CHECK(eager.graph_launches == 0);
  CHECK(eager.graphs_off == "--no-graph");
  CHECK(replayed.graphs_off.empty());
  CHECK(replayed.graphs_captured == 2 * sizes);
  CHECK(replayed.graph_launches == 2 * steps - 2 * static_cast<int64_t>(sizes));
  REQUIRE(eager.overflow_skips >= 1);  // skipped steps and scale changes were replayed
  CHECK(replayed.overflow_skips == eager.overflow_skips);
  CHECK(replayed.loss_scale == eager.loss_scale);
  CHECK(replayed.losses == eager.losses);  // bit for bit, every step
  CHECK(file_bytes(replayed.checkpoint_path) == file_bytes(eager.checkpoint_path));
  // The split's device time (runtime/activity.h): recorded, and inside the steps. (Not inside the
  // steps less their data wait: the next micro-batch is taken while the device works, and the
  // part of that wait after the device ran out of work is data wait inside its window.)
  for (const TrainResult* r : {&eager, &replayed}) {
    CHECK(r->split.device_busy_ms > 0);
    CHECK(r->split.device_idle_ms >= 0);
    CHECK(r->split.device_busy_ms + r->split.device_idle_ms <= r->split.wall_ms);
  }
}

// Two training images: with batch 2 (2 micro-batches of 1, the tiny cfg's subdivisions), an epoch
// is one step, so results.csv has a row per step.
data::Dataset two_image_dataset(const std::string& root) {
  data::SyntheticOptions shapes;
  shapes.train_images = 2;
  shapes.valid_images = 1;
  shapes.width = 80;
  shapes.height = 60;
  return data::open_dataset(data::write_synthetic_dataset(root, shapes).data_file);
}

TrainOptions one_step_epochs(const std::string& out_dir, int64_t steps) {
  TrainOptions o;
  o.threads = 1;
  o.progress_in_place = false;
  o.batch = 2;
  o.max_batches = steps;
  o.out_dir = out_dir;
  return o;
}

}  // namespace

// (Named without "emu:" or "emulated" so that tools/adversarial_tests.sh leaves it out: CI time; the data-parallel
// case below runs there too.)
TEST_CASE(
    "graphs on one device (emu0): replayed steps equal --no-graph bit for bit across lr changes, fp16 overflow skips "
    "and loss-scale changes, a size switch and a resume") {
  GraphRuns runs;
  const std::vector<Device> one{Device::emu(0)};
  runs.o.batch = 2;
  const TrainResult eager = runs.train(one, "eager", false, 12);  // the size switch at step 10
  check_replayed(eager, runs.train(one, "graphs", true, 12), 12, 2, "emu:0");
  // Resumed at step 6 (graphs captured afresh) equals the straight run.
  runs.train(one, "resumed", true, 6);
  runs.o.device_activity = false;  // --no-idle: nothing recorded, the same bits
  const TrainResult resumed = runs.train(one, "resumed", true, 12, true);
  CHECK(resumed.graph_launches > 0);
  CHECK(resumed.split.device_busy_ms == 0);
  CHECK(file_bytes(resumed.checkpoint_path) == file_bytes(eager.checkpoint_path));
}

TEST_CASE("graphs on emu:0,1 (overlapped all-reduces, --sync-bn): replayed steps equal --no-graph bit for bit") {
  GraphRuns runs;
  const std::vector<Device> two{Device::emu(0), Device::emu(1)};
  runs.o.batch = 4;
  runs.o.sync_bn = true;  // BatchNorm's all-reduces inside the graphs too
  check_replayed(runs.train(two, "eager", false, 6), runs.train(two, "graphs", true, 6), 6, 1, "emu:0,1");
}

TEST_CASE("replayed steps time their update: every step's optimizer time in results.csv is above 0") {
  // One step an epoch (2 images, batch 2), so results.csv has a row per step: step 1 runs eagerly,
  // step 2 is captured, steps 3-5 replay. The update's time came from host-side bookkeeping that
  // only queue_update did, and read 0 for every replayed step.
  TempDir dir;
  const data::Dataset dataset = two_image_dataset(dir / "shapes");
  TrainOptions o = one_step_epochs(dir / "run", 5);
  const TrainResult r = train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::emu(0), o);
  REQUIRE(r.graph_launches == 2 * 5 - 2);
  const std::vector<EpochRecord> rows = read_results(o.out_dir + "/results.csv");
  REQUIRE(rows.size() == 5);
  for (const EpochRecord& row : rows) {
    CAPTURE(row.iteration);
    CHECK(row.optimizer_ms > 0);
  }
}

namespace {

// The run's --timeline windows' names (their first 7 characters) after checking that every window
// holds device work and every device span kept overlaps a window.
std::vector<std::string> checked_timeline(const std::string& path);

}  // namespace

TEST_CASE("--timeline: the device's activity in the run's 4th to 6th steps, replayed, inside their windows") {
  TempDir dir;
  const data::Dataset dataset = two_image_dataset(dir / "shapes");
  TrainOptions o = one_step_epochs(dir / "run", 6);
  o.timeline_file = dir / "timeline.json";
  // The tiny cfg's 2 micro-batches a step, queued back to back (look-ahead): one window a step.
  // (A window a micro-batch was the moments between two launches, empty when the device had not
  // started yet: flaky, and counted as "no device activity recorded".)
  const TrainResult r = train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::emu(0), o);
  REQUIRE(r.graph_launches == 2 * 6 - 2);  // steps 3-6 replayed
  CHECK(checked_timeline(o.timeline_file) == std::vector<std::string>{"step 4:", "step 5:", "step 6:"});
  // --no-look-ahead: a window a micro-batch, from its queueing to its loss read.
  o.look_ahead = false;
  o.out_dir = dir / "in_turn";
  o.timeline_file = dir / "in_turn.json";
  train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::emu(0), o);
  CHECK(checked_timeline(o.timeline_file) ==
        std::vector<std::string>{"step 4:", "step 4:", "step 5:", "step 5:", "step 6:", "step 6:"});

  // The CPU backend has no device activity: it says so and writes nothing. (The planted fault:
  // kept windows counted from the run's first step, not its 4th: the names read step 1 to 3.)
  o.out_dir = dir / "cpu";
  o.timeline_file = dir / "cpu_timeline.json";
  train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::cpu(), o);
  CHECK(!std::filesystem::exists(o.timeline_file));
}

namespace {

std::vector<std::string> checked_timeline(const std::string& path) {
  const data::JsonValue trace = data::read_json_file(path);
  std::vector<std::pair<double, double>> windows;
  std::vector<std::string> window_names;
  std::vector<std::pair<double, double>> spans;
  for (const data::JsonValue& e : trace.find("traceEvents")->items) {
    const data::JsonValue* cat = e.find("cat");
    if (!cat) continue;
    const double ts = e.find("ts")->number, end = ts + e.find("dur")->number;
    if (cat->string == "host") {
      windows.emplace_back(ts, end);
      window_names.push_back(e.find("name")->string.substr(0, 7));
      CHECK(e.find("tid")->number == 3);
    } else {
      REQUIRE(cat->string == "device");
      CHECK(e.find("tid")->number == 4);
      CHECK(e.find("name")->string.rfind("emu ", 0) == 0);  // emulated spans are named by their queue
      spans.emplace_back(ts, end);
    }
  }
  REQUIRE(!spans.empty());
  // Every window holds device work, and every span kept overlaps a window.
  for (const auto& [begin, end] : windows)
    CHECK(std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return s.first < end && s.second > begin; }));
  for (const auto& [begin, end] : spans)
    CHECK(std::any_of(windows.begin(), windows.end(), [&](const auto& w) { return begin < w.second && end > w.first; }));
  return window_names;
}

}  // namespace

#if YOLO_EMU
TEST_CASE("a capture that fails: the trainer says why, runs eagerly from then on, and gives --no-graph's bits") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  const ModelSpec spec = yolo::testing::tiny_detector_spec();
  TrainOptions o;
  o.threads = 1;
  o.progress_in_place = false;
  o.max_batches = 4;
  o.out_dir = dir / "eager";
  o.graphs = false;
  const TrainResult eager = train_detector(spec, dataset, Device::emu(0), o);
  TrainResult fallback;
  {
    inject_fault(Fault::CaptureFails, true);
    struct Off {
      ~Off() { inject_fault(Fault::CaptureFails, false); }
    } off;
    o.out_dir = dir / "fallback";
    o.graphs = true;
    fallback = train_detector(spec, dataset, Device::emu(0), o);
  }
  CHECK(fallback.graph_launches == 0);
  CHECK(fallback.graphs_captured == 0);
  CHECK(fallback.graphs_off.find("capturing the step failed") != std::string::npos);
  CHECK(fallback.graphs_off.find("cudaErrorStreamCaptureUnsupported") != std::string::npos);
  CHECK(fallback.losses == eager.losses);
  CHECK(file_bytes(fallback.checkpoint_path) == file_bytes(eager.checkpoint_path));
}
#endif

#endif

TEST_CASE("the CPU backend runs its steps eagerly and says why") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  TrainOptions o;
  o.threads = 1;
  o.progress_in_place = false;
  o.max_batches = 2;
  o.out_dir = dir / "cpu";
  const TrainResult r = train_detector(yolo::testing::tiny_detector_spec(), dataset, Device::cpu(), o);
  CHECK(r.graph_launches == 0);
  CHECK(r.graphs_off.find("CPU backend") != std::string::npos);
}
