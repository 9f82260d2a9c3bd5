// darknet's .weights files (what other tools read and write) and our checkpoints (.ckpt: all
// a run needs to resume exactly). Both are written to a temporary file beside the target and
// renamed, so a kill never leaves a half-written file under the real name.
//
// .weights: header int32 major, minor, revision, then `seen` (images trained on) as uint64
// when major*10 + minor >= 2, else uint32; then per layer with parameters, in layer order:
//   convolutional: biases[c_out]; if batch_normalize: scales[c_out], rolling_mean[c_out],
//                  rolling_variance[c_out]; weights[c_out][c_in][k][k]   (KCRS)
//   connected:     biases[out]; weights[out][in] (in in darknet's flattening order, channel-major
//                  C,H,W); if batch_normalize: scales, rolling_mean, rolling_variance
// all float32 little-endian. Our layouts differ (conv weights KRSC, connected inputs HWC) and are
// converted on load and save.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/loader.h"
#include "graph/cfg.h"

namespace yolo::graph {

// One layer's parameters in host memory, in OUR layouts.
struct LayerParams {
  int layer = 0;  // index in the cfg (for messages)
  LayerType type = LayerType::Convolutional;
  int c_out = 0, c_in = 0, k = 1;  // conv: filters, input channels, kernel size; connected: out, in, k = 1
  int in_h = 1, in_w = 1;          // connected: the input's spatial size (its in = in_h * in_w * in_c)
  bool batch_normalize = false;
  float* weights = nullptr;           // conv [c_out][k][k][c_in]; connected [out][in_h][in_w][in_c]
  float* biases = nullptr;            // c_out (BN's beta when batch_normalize)
  float* scales = nullptr;            // c_out (BN's gamma), or null without batch_normalize
  float* rolling_mean = nullptr;      // c_out, or null
  float* rolling_variance = nullptr;  // c_out, or null
  size_t weight_count() const { return static_cast<size_t>(c_out) * k * k * c_in * in_h * in_w; }
};

struct WeightsHeader {
  int32_t major = 0, minor = 2, revision = 0;
  uint64_t seen = 0;
};

// Bytes a .weights file for these layers has (header of version 0.2.0 included).
uint64_t darknet_weights_bytes(std::span<const LayerParams> layers);

// Loads the first `load_layers` cfg layers' parameters (all when < 0: the file must then hold
// exactly these layers; with a limit, trailing data is allowed, for backbones). Errors name
// the file and the layer where the data ran out, or the byte count when there is extra data.
WeightsHeader read_darknet_weights(const std::string& path, std::span<const LayerParams> layers, int load_layers = -1);
void write_darknet_weights(const std::string& path, std::span<const LayerParams> layers, const WeightsHeader& header);

// ---- checkpoints --------------------------------------------------------------------------
struct Checkpoint {
  std::string cfg_digest;     // identifies the architecture: a resume with another cfg is refused
  int64_t iteration = 0;      // optimizer steps done
  uint64_t seen = 0;          // images trained on
  data::LoaderState loader;   // where the training loader continues
  uint64_t seed = 0;
  // The step's shape: images per step over all replicas, and micro-batches it is split into (the
  // loader's position counts micro-batch rounds of batch / subdivisions images). 0: not recorded
  // (a version 1 file).
  int64_t batch = 0, subdivisions = 0;
  // Named float arrays: parameters, momentum, BatchNorm statistics (the executor names them).
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
};
// Our format: magic "YOLOCKPT", version, the fields above, each tensor (name, count, data), and
// a 64-bit checksum of everything before it. Errors name the file: bad magic, truncated,
// checksum mismatch, absurd sizes.
// A failed write (a full disk, a quota, the file size limit; errors of flush and close alike)
// throws, naming the cause, and leaves `path` as it was (the temporary file is removed).
// keep_previous_as: an existing `path` is renamed to it just before the new one takes its
// place (last.ckpt -> prev.ckpt).
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint, const std::string& keep_previous_as = "");
Checkpoint read_checkpoint(const std::string& path);
// The size write_checkpoint gives a checkpoint with this digest and these tensors (name, floats).
uint64_t checkpoint_bytes(const std::string& cfg_digest, std::span<const std::pair<std::string, uint64_t>> tensors);
// The step count in a checkpoint's header, read without checking the rest (a damaged file's
// messages); nullopt when even the header is unreadable.
std::optional<int64_t> peek_checkpoint_iteration(const std::string& path);

namespace test_hooks {
// Called at each step of a save, with "write TEMP" (its header written, before the bulk of its
// data), then "fsync TEMP", "rename FROM TO" and "fsync-dir DIR" (in the order done, before each
// is done); a hook that throws stops the save there, as a crash would. Empty: none.
// YOLO_TEST_SAVE_PAUSE_MS=N in the environment also prints "train_yolo: save step: STEP" on
// stderr before each and pauses N ms there: tools/checkpoint_check.sh kills the trainer inside
// each step of a save.
void set_save_step_hook(std::function<void(const std::string& step)> hook);
// A checkpoint as this program's version 1 wrote it (no batch and subdivisions).
void write_checkpoint_version1(const std::string& path, const Checkpoint& checkpoint);
}  // namespace test_hooks

}  // namespace yolo::graph
