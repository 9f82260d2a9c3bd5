// The training loop (graph/train_loop.h) against a scripted data source: when it takes
// micro-batches (the next one before the current one's loss is read, where the source allows it,
// so that its copy overlaps the device's work), and that checkpoints, epochs and a stop report
// the micro-batches the steps consumed, not the one taken ahead.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <string>
#include <vector>

#include "graph/run_record.h"
#include "graph/train_loop.h"
#include "graph/weights.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::TempDir;

namespace {

// A step's device work held at its start until the host releases it (at most 5 s; then
// past_deadline() says the host waited for it first).
struct DeviceHold {
  std::shared_ptr<std::atomic<bool>> released = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<bool>> timed_out = std::make_shared<std::atomic<bool>>(false);
  void hold(Stream& stream) const {
    stream.enqueue([released = released, timed_out = timed_out] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!released->load())
        if (std::chrono::steady_clock::now() > deadline) return timed_out->store(true);
        else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  void release() const { released->store(true); }
  bool past_deadline() const { return timed_out->load(); }
};

struct ScriptedRun {
  Device device = Device::cpu();
  Precision precision = Precision::Fp32;
  float initial_loss_scale = 65536.0f;  // fp16
  bool look_ahead = true;
  int64_t checkpoint_every = 0;
  std::function<bool(int64_t iteration)> stop;  // the stop request hook (empty: stop_after)
  Start start;                                  // where it starts (a resume: with `restore`)
  std::vector<std::pair<std::string, std::vector<float>>> restore;  // tensors to upload first
  bool fetch_ahead = true;
  int subdivisions = 1;
  int64_t steps = 6;
  int64_t stop_after = 0;          // a stop request after this step (1-based; 0: none)
  int64_t epoch_micro_batches = 3;  // the source's epoch
  // The device work of step `hold` (0-based; -1: none) waits, at its start, until the host begins
  // step hold + 1, at most 5 s: a loop that waits for a step's device work before it queues the
  // step after it finds it held, and `held_past_deadline` says so.
  int64_t hold = -1;
  int64_t release_take = -1;  // >= 0: the hold ends instead when the source hands out this micro-batch
  bool held_past_deadline = false;
  std::vector<std::string> log;     // "step K" as each step begins, "take N" as the loop takes micro-batch N,
                                    // "read K" once its loss and update flag were read
  TrainResult result;

  void run(const std::string& out_dir) {
    Graph graph = build_graph(yolo::testing::tiny_detector_spec());
    const int micro = 2;
    Executor executor(graph, device, micro, 1, {}, precision);
    for (const auto& [what, values] : restore) executor.upload(what, values);
    std::vector<float> images;
    std::vector<YoloTruth> truths;
    std::vector<int> counts;
    yolo::testing::synthetic_batch(7, 0, micro, graph.input.w, graph.input.h, images, truths, counts);
    yolo::testing::UploadedBatch batch(device, images, truths, counts);
    int64_t taken = start.loader.epoch * epoch_micro_batches + start.loader.step;
    Source source;
    source.steps_per_epoch = epoch_micro_batches;
    source.fetch_ahead = fetch_ahead;
    DeviceHold held;
    source.next = [&] {
      if (taken == release_take) held.release();
      log.push_back("take " + std::to_string(taken++));
      return MicroBatch{batch.image_data(), batch.truth_data(), batch.count_data(), nullptr};
    };
    source.state = [&] { return data::LoaderState{taken / epoch_micro_batches, taken % epoch_micro_batches, 1}; };
    source.epoch_summary = [](int64_t) { return std::string(); };
    TrainOptions o;
    o.out_dir = out_dir;
    o.max_batches = steps;
    o.progress_in_place = false;
    o.seed = 1;
    o.look_ahead = look_ahead;
    o.initial_loss_scale = initial_loss_scale;
    o.checkpoint_every = checkpoint_every;
    o.before_step = [&](Executor& e, int, int64_t iteration) {
      log.push_back("step " + std::to_string(iteration));
      if (iteration == hold + 1 && release_take < 0) held.release();
      if (iteration == hold) held.hold(e.compute_stream());
    };
    o.step_read = [&](int, int64_t iteration) { log.push_back("read " + std::to_string(iteration)); };
    o.stop_requested = [&](int, int64_t iteration) { return stop ? stop(iteration) : iteration + 1 == stop_after; };
    result = run_loop(graph, executor, source, o, micro * subdivisions, subdivisions, start);
    held_past_deadline = held.past_deadline();
  }
  // The log without its "read" entries.
  std::vector<std::string> takes() const {
    std::vector<std::string> out;
    for (const std::string& e : log)
      if (e.rfind("read ", 0) != 0) out.push_back(e);
    return out;
  }
  // Where `entry` stands in the log (the log's size when absent).
  size_t at(const std::string& entry) const { return std::find(log.begin(), log.end(), entry) - log.begin(); }
};

}  // namespace

TEST_CASE("the loop takes the next micro-batch before the current one's loss is read, and none past the last") {
  TempDir dir;
  ScriptedRun ahead;
  ahead.subdivisions = 2;
  ahead.steps = 3;
  ahead.run(dir / "ahead");
  // Step 0 takes 0, then 1 while 0 runs, then 2 (step 1's first) while 1 runs; and so on.
  CHECK(ahead.takes() == std::vector<std::string>{"step 0", "take 0", "take 1", "take 2", "step 1", "take 3", "take 4",
                                               "step 2", "take 5"});
  ScriptedRun in_turn;
  in_turn.fetch_ahead = false;  // a source that cannot (the MNIST one: one set of buffers)
  in_turn.subdivisions = 2;
  in_turn.steps = 3;
  in_turn.run(dir / "in_turn");
  CHECK(in_turn.takes() == std::vector<std::string>{"step 0", "take 0", "take 1", "step 1", "take 2", "take 3", "step 2",
                                                 "take 4", "take 5"});
  // The same data in the same order: the same losses.
  CHECK(ahead.result.losses == in_turn.result.losses);
}

TEST_CASE("taken ahead, a micro-batch is not consumed: epochs, checkpoints and a stop count what the steps trained on") {
  TempDir dir;
  // One micro-batch a step, three a step epoch: epochs end after steps 3 and 6 (not 2 and 5, as
  // the source's own position, one ahead, would say).
  ScriptedRun run;
  run.run(dir / "epochs");
  REQUIRE(run.at("take 1") < run.at("step 1"));  // it did take ahead
  std::vector<int64_t> epoch_ends;
  for (const EpochRecord& row : read_results(dir / "epochs/results.csv")) epoch_ends.push_back(row.iteration);
  CHECK(epoch_ends == std::vector<int64_t>{3, 6});
  const Checkpoint end = read_checkpoint(dir / "epochs/last.ckpt");
  CHECK(end.iteration == 6);
  CHECK(end.loader.epoch == 2);
  CHECK(end.loader.step == 0);

  // A stop after step 4: micro-batch 4 was taken ahead, but the checkpoint resumes at it.
  ScriptedRun stopped;
  stopped.stop_after = 4;
  stopped.run(dir / "stopped");
  CHECK(stopped.result.stop == TrainStop::Signal);
  CHECK(stopped.at("take 4") < stopped.log.size());
  const Checkpoint at_stop = read_checkpoint(dir / "stopped/last.ckpt");
  CHECK(at_stop.iteration == 4);
  CHECK(at_stop.loader.epoch == 1);
  CHECK(at_stop.loader.step == 1);
}

#if YOLO_EMULATED_KERNELS
TEST_CASE("look-ahead (emu:0): the next step is queued before this one is read, except where the host needs it") {
  TempDir dir;
  // 7 steps of one micro-batch, an epoch of 4, a checkpoint every 3: no step is queued ahead of
  // the reads of steps 3 and 6 (a save after each), of step 4's (an epoch ends) or past the last.
  ScriptedRun ahead;
  ahead.device = Device::emu(0);
  ahead.steps = 7;
  ahead.epoch_micro_batches = 4;
  ahead.checkpoint_every = 3;
  ahead.run(dir / "ahead");
  for (int64_t k : {0, 1, 4}) {
    CAPTURE(k);
    CHECK(ahead.at("step " + std::to_string(k + 1)) < ahead.at("read " + std::to_string(k)));
  }
  for (int64_t k : {2, 3, 5}) {
    CAPTURE(k);
    CHECK(ahead.at("read " + std::to_string(k)) < ahead.at("step " + std::to_string(k + 1)));
  }
  CHECK(ahead.result.graphs_captured == 2);  // one kind of micro-batch, two result slots
  ScriptedRun in_turn = ahead;
  in_turn.log.clear();
  in_turn.look_ahead = false;
  in_turn.run(dir / "in_turn");
  for (int64_t k = 0; k + 1 < 7; ++k)
    CHECK(in_turn.at("read " + std::to_string(k)) < in_turn.at("step " + std::to_string(k + 1)));
  CHECK(in_turn.result.graphs_captured == 1);
  // The same steps, the same results: losses and the state saved, bit for bit.
  CHECK(ahead.result.losses == in_turn.result.losses);
  CHECK(yolo::testing::file_bytes(dir / "ahead/last.ckpt") == yolo::testing::file_bytes(dir / "in_turn/last.ckpt"));
}

TEST_CASE("look-ahead (emu:0): the host never waits for a step queued ahead before queueing the next") {
  TempDir dir;
  // Step 2's device work is held until the host begins step 3: reading step 1 (loss, update
  // flag, phase times) must not wait for step 2, which was queued ahead of that read.
  ScriptedRun run;
  run.device = Device::emu(0);
  run.steps = 5;
  run.epoch_micro_batches = 100;
  run.hold = 2;
  run.run(dir / "held");
  CHECK(run.at("step 3") < run.at("read 2"));
  CHECK_FALSE(run.held_past_deadline);
  CHECK(run.result.iterations == 5);
}

TEST_CASE("look-ahead (emu:0): with micro-batches, each is queued before the one before it is read; the bits of --no-look-ahead") {
  TempDir dir;
  for (int subdivisions : {2, 3}) {
    CAPTURE(subdivisions);
    const std::string tag = std::to_string(subdivisions);
    // Step 2's first micro-batch (number 2S) is held until the source hands out micro-batch
    // 2S + 2, which the loop takes only after queueing micro-batch 2S + 1: its read must come
    // after that, and the step after it is queued before the step's last micro-batch is read.
    ScriptedRun ahead;
    ahead.device = Device::emu(0);
    ahead.subdivisions = subdivisions;
    ahead.steps = 4;
    ahead.epoch_micro_batches = 100;
    ahead.hold = 2;
    ahead.release_take = 2 * subdivisions + 2;
    ahead.run(dir / ("ahead" + tag));
    CHECK_FALSE(ahead.held_past_deadline);
    for (int64_t k = 0; k + 1 < 4; ++k) CHECK(ahead.at("step " + std::to_string(k + 1)) < ahead.at("read " + std::to_string(k)));
    CHECK(ahead.result.graphs_captured <= 6);  // first, accumulating, last: by slot
    ScriptedRun in_turn = ahead;
    in_turn.log.clear();
    in_turn.look_ahead = false;
    in_turn.hold = -1;
    in_turn.run(dir / ("in_turn" + tag));
    CHECK(ahead.result.losses == in_turn.result.losses);
    CHECK(yolo::testing::file_bytes(dir / ("ahead" + tag + "/last.ckpt")) ==
          yolo::testing::file_bytes(dir / ("in_turn" + tag + "/last.ckpt")));
  }
}

TEST_CASE("look-ahead (emu:0), fp16: each step runs at the loss scale the step before left; the bits of --no-look-ahead") {
  TempDir dir;
  // A first scale of 2^15 overflows the first steps' gradients: each halves the scale on the
  // device, and the step queued ahead of its read must run at the halved scale.
  ScriptedRun ahead;
  ahead.device = Device::emu(0);
  ahead.precision = Precision::Fp16;
  ahead.initial_loss_scale = 0x1p15f;
  ahead.steps = 8;
  ahead.epoch_micro_batches = 100;
  ahead.run(dir / "ahead");
  for (int64_t k = 0; k + 1 < 8; ++k) CHECK(ahead.at("step " + std::to_string(k + 1)) < ahead.at("read " + std::to_string(k)));
  MESSAGE("fp16 from 2^15: " << ahead.result.overflow_skips << " skipped, scale " << ahead.result.loss_scale);
  CHECK(ahead.result.overflow_skips >= 2);  // overflows in a row, each step queued before the last was read
  CHECK(ahead.result.overflow_skips < 8);   // and then it trains
  ScriptedRun in_turn = ahead;
  in_turn.log.clear();
  in_turn.look_ahead = false;
  in_turn.run(dir / "in_turn");
  CHECK(ahead.result.losses == in_turn.result.losses);
  CHECK(ahead.result.overflow_skips == in_turn.result.overflow_skips);
  CHECK(ahead.result.loss_scale == in_turn.result.loss_scale);
  CHECK(yolo::testing::file_bytes(dir / "ahead/last.ckpt") == yolo::testing::file_bytes(dir / "in_turn/last.ckpt"));
}

TEST_CASE("look-ahead (emu:0): a stop asked for while the next step is queued comes after that step, and resumes exactly") {
  TempDir dir;
  ScriptedRun straight;
  straight.device = Device::emu(0);
  straight.steps = 6;
  straight.epoch_micro_batches = 100;
  straight.run(dir / "straight");
  REQUIRE(straight.result.stop == TrainStop::Finished);

  // Asked after step 2 was queued ahead of step 1's read (the hook's first call, before queueing
  // ahead, says no; its second, after the read, yes): step 2 runs, then the run stops and saves.
  ScriptedRun stopped = straight;
  stopped.log.clear();
  int calls = 0;
  stopped.stop = [&calls](int64_t iteration) { return iteration == 1 && ++calls == 2; };
  stopped.run(dir / "stopped");
  REQUIRE(stopped.at("step 2") < stopped.at("read 1"));
  CHECK(stopped.result.stop == TrainStop::Signal);
  CHECK(stopped.result.iterations == 3);
  CHECK(stopped.result.stop_message.find("after step 3") != std::string::npos);
  const Checkpoint at_stop = read_checkpoint(dir / "stopped/last.ckpt");
  CHECK(at_stop.iteration == 3);
  CHECK(at_stop.loader.step == 3);

  // Resumed from it: the straight run's last state, bit for bit.
  ScriptedRun resumed = straight;
  resumed.log.clear();
  resumed.start.iteration = at_stop.iteration;
  resumed.start.seen = at_stop.seen;
  resumed.start.loader = at_stop.loader;
  resumed.restore = at_stop.tensors;
  resumed.run(dir / "resumed");
  CHECK(resumed.result.iterations == 6);
  CHECK(yolo::testing::file_bytes(dir / "resumed/last.weights") ==
        yolo::testing::file_bytes(dir / "straight/last.weights"));
}
#endif

#if YOLO_EMULATED_KERNELS
namespace {

// Data parallel on emu:0,1 (train_detector, a thread a rank): each rank's log of "step K" as it
// begins and "read K" once it read step K's results. 36 images, 6 images a step: an epoch of 6
// steps; the replicas' hash check after steps 3 and 6.
struct ParallelRun {
  bool look_ahead = true;
  bool sync_bn = false;
  int subdivisions = 1;  // 2: a batch of 12 (3 images a micro-batch, an epoch of 3 steps)
  int64_t steps = 6;
  int hold_rank = -1;  // this rank's step `hold` waits until the rank begins step hold + 1 (5 s at most)
  int64_t hold = -1;
  std::function<bool(int rank, int64_t iteration)> stop;
  bool resume = false;
  std::vector<std::string> log[2];
  bool held_past_deadline = false;
  TrainResult result;

  void run(const data::Dataset& dataset, const std::string& out_dir) {
    TrainOptions o = yolo::testing::tiny_dp_options(out_dir, steps);
    o.check_every = 3;
    o.comm_timeout = 20;  // a rank left alone in a collective fails the test, not hangs it
    o.look_ahead = look_ahead;
    o.sync_bn = sync_bn;
    o.subdivisions = subdivisions;
    if (subdivisions > 1) o.batch = 6 * subdivisions;
    o.resume = resume;
    o.stop_requested = [this](int rank, int64_t iteration) { return stop && stop(rank, iteration); };
    DeviceHold held;
    o.before_step = [&](Executor& e, int rank, int64_t iteration) {
      log[rank].push_back("step " + std::to_string(iteration));
      if (rank != hold_rank) return;
      if (iteration == hold + 1) held.release();
      if (iteration == hold) held.hold(e.compute_stream());
    };
    o.step_read = [&](int rank, int64_t iteration) { log[rank].push_back("read " + std::to_string(iteration)); };
    result = train_detector(yolo::testing::tiny_detector_spec(), dataset,
                            yolo::testing::replica_devices(DeviceKind::Emu, 2), o);
    held_past_deadline = held.past_deadline();
  }
  size_t at(int rank, const std::string& entry) const {
    return std::find(log[rank].begin(), log[rank].end(), entry) - log[rank].begin();
  }
};

data::Dataset parallel_dataset(const std::string& root) { return yolo::testing::small_shapes_dataset(root, 36); }

}  // namespace

TEST_CASE("look-ahead (emu:0,1): every rank queues the next step before reading this one, and never waits for it") {
  TempDir dir;
  const data::Dataset dataset = parallel_dataset(dir / "data");
  // Rank 1's step 4 (a replayed graph) is held until rank 1 begins step 5: neither the step's
  // collectives nor its reads on rank 1 may wait for the step queued ahead.
  ParallelRun ahead;
  ahead.hold_rank = 1;
  ahead.hold = 4;
  ahead.run(dataset, dir / "ahead");
  REQUIRE(ahead.result.stop == TrainStop::Finished);
  CHECK_FALSE(ahead.held_past_deadline);
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    for (int64_t k : {0, 1, 3, 4}) {
      CAPTURE(k);
      CHECK(ahead.at(rank, "step " + std::to_string(k + 1)) < ahead.at(rank, "read " + std::to_string(k)));
    }
    // After step 3 the replicas' hashes are compared: nothing is queued ahead of that read.
    CHECK(ahead.at(rank, "read 2") < ahead.at(rank, "step 3"));
  }
  // In turn: the same bits.
  ParallelRun in_turn;
  in_turn.look_ahead = false;
  in_turn.run(dataset, dir / "in_turn");
  for (int64_t k = 0; k + 1 < 6; ++k)
    CHECK(in_turn.at(0, "read " + std::to_string(k)) < in_turn.at(0, "step " + std::to_string(k + 1)));
  CHECK(ahead.result.losses == in_turn.result.losses);
  CHECK(yolo::testing::file_bytes(dir / "ahead/last.ckpt") == yolo::testing::file_bytes(dir / "in_turn/last.ckpt"));

  // --sync-bn: the loss read waits for the BatchNorm all-reduces of its own step only.
  ParallelRun synced = ahead;
  synced.sync_bn = true;
  synced.log[0].clear(), synced.log[1].clear();
  synced.run(dataset, dir / "synced");
  CHECK(synced.result.stop == TrainStop::Finished);
  CHECK_FALSE(synced.held_past_deadline);
  CHECK(synced.at(1, "step 5") < synced.at(1, "read 4"));
}

TEST_CASE("look-ahead (emu:0,1): two micro-batches a step, the second queued before the first is read; the bits of --no-look-ahead") {
  TempDir dir;
  const data::Dataset dataset = parallel_dataset(dir / "data");
  // (That no micro-batch waits for the one queued after it is shown on emu:0 above; here the
  // step's collectives and stop request ride in its last micro-batch's result slot.)
  ParallelRun ahead;
  ahead.subdivisions = 2;
  ahead.steps = 3;
  ahead.run(dataset, dir / "ahead");
  REQUIRE(ahead.result.stop == TrainStop::Finished);
  for (int rank : {0, 1}) CHECK(ahead.at(rank, "step 2") < ahead.at(rank, "read 1"));
  ParallelRun in_turn = ahead;
  in_turn.look_ahead = false;
  in_turn.log[0].clear(), in_turn.log[1].clear();
  in_turn.run(dataset, dir / "in_turn");
  CHECK(ahead.result.losses == in_turn.result.losses);
  CHECK(yolo::testing::file_bytes(dir / "ahead/last.ckpt") == yolo::testing::file_bytes(dir / "in_turn/last.ckpt"));
  // A stop asked of rank 1 at step 1 comes after step 2 (queued ahead), on both ranks.
  ParallelRun stopped = ahead;
  stopped.log[0].clear(), stopped.log[1].clear();
  stopped.stop = [](int rank, int64_t iteration) { return rank == 1 && iteration == 0; };
  stopped.run(dataset, dir / "stopped");
  CHECK(stopped.result.stop == TrainStop::Signal);
  CHECK(stopped.result.iterations == 2);
}

TEST_CASE("look-ahead (emu:0,1): a stop asked of one rank while the next step is queued: every rank runs it, stops, resumes exactly") {
  TempDir dir;
  const data::Dataset dataset = parallel_dataset(dir / "data");
  ParallelRun straight;
  straight.run(dataset, dir / "run");
  REQUIRE(straight.result.stop == TrainStop::Finished);
  const std::string straight_weights = yolo::testing::file_bytes(dir / "run/last.weights");

  // Rank 1 asks as it begins step 4 (0-based 3); step 5 is queued on every rank before step 4's
  // all-reduced request is read, so both run step 5, then stop and save.
  ParallelRun stopped;
  stopped.stop = [](int rank, int64_t iteration) { return rank == 1 && iteration == 3; };
  stopped.run(dataset, dir / "run");
  CHECK(stopped.result.stop == TrainStop::Signal);
  CHECK(stopped.result.iterations == 5);
  CHECK(stopped.result.stop_message.find("after step 5") != std::string::npos);
  for (int rank : {0, 1}) {
    CHECK(stopped.at(rank, "step 4") < stopped.at(rank, "read 3"));
    CHECK(stopped.at(rank, "step 5") == stopped.log[rank].size());  // nothing after step 5
  }
  CHECK(read_checkpoint(dir / "run/last.ckpt").iteration == 5);

  ParallelRun resumed;
  resumed.resume = true;
  resumed.run(dataset, dir / "run");
  CHECK(resumed.result.iterations == 6);
  CHECK(yolo::testing::file_bytes(dir / "run/last.weights") == straight_weights);

  // --no-look-ahead: a stop asked at step 3 (0-based 2, replayed by a graph captured at step 2)
  // stops both ranks right after it.
  ParallelRun in_turn;
  in_turn.look_ahead = false;
  in_turn.stop = [](int rank, int64_t iteration) { return rank == 1 && iteration == 2; };
  in_turn.run(dataset, dir / "in_turn");
  CHECK(in_turn.result.stop == TrainStop::Signal);
  CHECK(in_turn.result.iterations == 3);
}
#endif
