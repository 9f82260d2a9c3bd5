// Checkpoints written on a thread of their own from a copy of the state (see checkpoint_saver.h).
#include "graph/checkpoint_saver.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "graph/checkpoint_files.h"
#include "runtime/check.h"

namespace yolo::graph {

CheckpointSaver::CheckpointSaver(Executor& executor, std::string out_dir)
    : executor_(executor), out_dir_(std::move(out_dir)) {}

CheckpointSaver::~CheckpointSaver() {
  if (const std::string failure = wait(); !failure.empty()) std::fprintf(stderr, "train_yolo: %s\n", failure.c_str());
}

void CheckpointSaver::queue_copy() {
  // The copy's buffers are the ones the writer reads.
  if (std::string failure = wait(); !failure.empty()) {
    std::lock_guard lock(mutex_);
    failure_ = std::move(failure);  // still reported by take_failure
  }
  executor_.queue_state_copy(copy_);
  copy_queued_ = true;
}

void CheckpointSaver::write(Checkpoint checkpoint, uint64_t seen) {
  if (!copy_queued_) throw Error("internal error: a checkpoint write without its state's copy");
  copy_queued_ = false;
  // The layers' views are made here: the executor's shapes may change on this thread (multi-scale).
  std::vector<LayerParams> layers =
      executor_.parameter_views(static_cast<float*>(copy_.params.data()), static_cast<float*>(copy_.stats.data()));
  writer_ = std::thread([this, checkpoint = std::move(checkpoint), layers = std::move(layers), seen]() mutable {
    write_now(std::move(checkpoint), std::move(layers), seen);
  });
}

void CheckpointSaver::write_now(Checkpoint checkpoint, std::vector<LayerParams> layers, uint64_t seen) {
  const int64_t step = checkpoint.iteration;
  try {
    copy_.done->synchronize();
    const auto begin = std::chrono::steady_clock::now();
    WeightsHeader header;
    header.seen = seen;
    write_darknet_weights(out_dir_ + "/last.weights", layers, header);
    const size_t stats = executor_.stat_count();
    std::vector<std::pair<std::string, std::vector<float>>> tensors;
    tensors.emplace_back("params", executor_.pack(static_cast<const float*>(copy_.params.data())));
    tensors.emplace_back("momentum", executor_.pack(static_cast<const float*>(copy_.momentum.data())));
    const float* s = static_cast<const float*>(copy_.stats.data());
    tensors.emplace_back("stats", std::vector<float>(s, s + stats));
    for (auto& extra : checkpoint.tensors) tensors.push_back(std::move(extra));
    checkpoint.tensors = std::move(tensors);
    save_checkpoint(out_dir_, checkpoint);
    std::lock_guard lock(mutex_);
    ++written_;
    write_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  } catch (const std::exception& e) {
    std::lock_guard lock(mutex_);
    failure_ = "the checkpoint of step " + std::to_string(step) + " was not saved (training goes on; the one before "
               "it is kept): " + e.what();
  }
}

std::string CheckpointSaver::wait() {
  if (writer_.joinable()) writer_.join();
  return take_failure();
}

int64_t CheckpointSaver::written() const {
  std::lock_guard lock(mutex_);
  return written_;
}

double CheckpointSaver::write_seconds() const {
  std::lock_guard lock(mutex_);
  return write_seconds_;
}

std::string CheckpointSaver::take_failure() {
  std::lock_guard lock(mutex_);
  return std::exchange(failure_, std::string());
}

}  // namespace yolo::graph
