// The training loop (graph/train_loop.h) against a scripted data source: when it takes
// micro-batches (the next one before the current one's loss is read, where the source allows it,
// so that its copy overlaps the device's work), and that checkpoints, epochs and a stop report
// the micro-batches the steps consumed, not the one taken ahead.
#include <doctest/doctest.h>

#include <algorithm>
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

struct ScriptedRun {
  bool fetch_ahead = true;
  int subdivisions = 1;
  int64_t steps = 6;
  int64_t stop_after = 0;          // a stop request after this step (1-based; 0: none)
  int64_t epoch_micro_batches = 3;  // the source's epoch
  std::vector<std::string> log;     // "step K" as each step begins, "take N" as the loop takes micro-batch N
  TrainResult result;

  void run(const std::string& out_dir) {
    Graph graph = build_graph(yolo::testing::tiny_detector_spec());
    const int micro = 2;
    Executor executor(graph, Device::cpu(), micro, 1);
    std::vector<float> images;
    std::vector<YoloTruth> truths;
    std::vector<int> counts;
    yolo::testing::synthetic_batch(7, 0, micro, graph.input.w, graph.input.h, images, truths, counts);
    yolo::testing::UploadedBatch batch(Device::cpu(), images, truths, counts);
    int64_t taken = 0;
    Source source;
    source.steps_per_epoch = epoch_micro_batches;
    source.fetch_ahead = fetch_ahead;
    source.next = [&] {
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
    o.before_step = [&](Executor&, int, int64_t iteration) { log.push_back("step " + std::to_string(iteration)); };
    o.stop_requested = [&](int, int64_t iteration) { return iteration + 1 == stop_after; };
    result = run_loop(graph, executor, source, o, micro * subdivisions, subdivisions, Start{});
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
  CHECK(ahead.log == std::vector<std::string>{"step 0", "take 0", "take 1", "take 2", "step 1", "take 3", "take 4",
                                               "step 2", "take 5"});
  ScriptedRun in_turn;
  in_turn.fetch_ahead = false;  // a source that cannot (the MNIST one: one set of buffers)
  in_turn.subdivisions = 2;
  in_turn.steps = 3;
  in_turn.run(dir / "in_turn");
  CHECK(in_turn.log == std::vector<std::string>{"step 0", "take 0", "take 1", "step 1", "take 2", "take 3", "step 2",
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
