// The training loop's inside, shared by the detector's and the classifier's setup (train.cpp):
// what a data source gives the loop, one replica's data-parallel state, where training starts,
// and the loop itself (train_loop.cpp): steps, graphs, the split, printing, validation, saving.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "graph/executor.h"
#include "graph/loss_scale.h"
#include "graph/trace_file.h"
#include "graph/train.h"
#include "runtime/communicator.h"
#include "runtime/memory.h"

namespace yolo::graph {

// What the loop needs from a data source: the next micro-batch's device pointers.
struct MicroBatch {
  const float* images = nullptr;
  const YoloTruth* truths = nullptr;
  const int* truth_counts = nullptr;
  const int* labels = nullptr;
  int width = 0, height = 0;  // the input size it was made at (multi-scale); 0: the graph's
};

struct Source {
  std::function<MicroBatch()> next;
  // The loop may take the next micro-batch before it reads the current one's loss (its copy then
  // overlaps the device's work): the source keeps a micro-batch's buffers until the call after the
  // next one, and reads nothing of the previous one's host state.
  bool fetch_ahead = false;
  std::function<data::LoaderState()> state;
  std::function<std::string(int64_t epoch)> epoch_summary;  // "" when there is nothing to say
  std::function<double()> validate;                         // mAP@0.5 on the validation split (optional)
  // --trace: record the host-to-device copies (Executor::clock_ms times) while on; take them
  // once the step is done (optional: sources that copy synchronously have none).
  std::function<void(bool on)> trace_copies;
  std::function<std::vector<TraceEvent>()> take_copy_events;
  int64_t steps_per_epoch = 1;  // in micro-batches
};

// One replica's part in data-parallel training (absent with one device).
struct DataParallel {
  Communicator* comm = nullptr;
  Stream* stream = nullptr;                        // the replica's communication stream
  std::unique_ptr<Event> gradients_done;           // on the compute stream: the comm stream waits on it
  std::unique_ptr<Event> reduced;                  // on the comm stream: the update waits on it
  std::vector<std::pair<size_t, size_t>> buckets;  // [begin, end) of the flat gradients, backward order
  bool overlap = true;
  int check_every = 100;
  TraceBook* traces = nullptr;  // in-process ranks: rank 0 writes them all
  std::string graphs_off;       // why this kind of group runs its steps eagerly ("": it need not)
  // The stop request, all-reduced with the step's collectives: this rank's (1 or 0) goes from
  // stop_host[2s] to stop_device[s] ahead of the first gradient bucket, the sum comes back to
  // stop_host[2s + 1], s the step's result slot (iteration % 2: with look-ahead a step is queued
  // while the one before is still in flight). Device memory and a pinned host buffer, so that a
  // CUDA Graph of the step replays it.
  DeviceMemory stop_device;
  PinnedHostBuffer stop_host;
  // The update's gate, one int per result slot (pinned host memory): after the step's last
  // collective a host function on the comm stream writes 1 when the communicator has failed, else
  // 0, and a copy takes it to the slot's skip flag, so a step whose all-reduces did not complete
  // leaves the parameters unchanged. -1: not written yet. (TrainLoop::save_as_survivor reads it.)
  PinnedHostBuffer gate_host;
  // In-process replicas: what a rank that saved after a peer was lost says (the group's error
  // names the failing rank; this is added to it). Empty: nothing to tell.
  std::function<void(const std::string& note)> survivor_saved;
};

// Where training starts: step, images seen, the loader's position and (fp16) the loss scale.
struct Start {
  int64_t iteration = 0;
  uint64_t seen = 0;
  data::LoaderState loader;
  std::optional<LossScaler::State> loss_scale;  // from a checkpoint written with fp16
};

// The checkpoint tensor holding the loss scaler's state: scale, clean steps, overflows (exact as
// floats: the clean count stays below the growth interval, overflows below 2^24 in practice).
constexpr const char* kLossScaleTensor = "loss_scale";

// 64-bit FNV-1a of a byte range (parameter hashes, digests).
uint64_t fnv1a64(const void* data, size_t bytes);

// Identifies the architecture (and input size) a checkpoint belongs to.
std::string cfg_digest(const Graph& graph);

// Trains from `start` to max_batches (options.max_batches or the cfg's), saving last.weights and
// last.ckpt in options.out_dir; dp: this replica's part in data-parallel training.
TrainResult run_loop(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options, int batch,
                     int subdivisions, const Start& start, DataParallel* dp = nullptr);

}  // namespace yolo::graph
