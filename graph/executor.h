// The executor: one replica of a graph on one device. It plans every buffer once (weights,
// gradients in one flat buffer in the order backward produces them, momentum, BatchNorm
// statistics, activations packed by liveness, workspace) into one arena, then runs forward,
// loss, backward and the optimizer without allocating. One code path for every device: each op
// is queued on the replica's compute stream through the op library (kernels/ops.h), which runs
// the CUDA kernels on a GPU or an emulated GPU and the fast CPU ops on the CPU; the host waits
// only where it reads results back (the loss, the non-finite check, downloads).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "graph/plan.h"
#include "graph/weights.h"
#include "kernels/precision.h"
#include "kernels/sgd.h"
#include "runtime/arena.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/stream.h"

namespace yolo {
class Communicator;
}

namespace yolo::graph {

// Each layer's weights, biases and BatchNorm scales start at a multiple of this many elements of
// the flat parameter buffers: 128 bytes of the 16-bit weight copy, 256 of the FP32 parameters.
constexpr size_t kParamAlignment = 64;

// Loss of one or more micro-batches, summed over their images (divide by images for a mean).
struct LossSums {
  double total = 0, box = 0, obj = 0, noobj = 0, cls = 0;
  double iou_sum = 0;
  int64_t assigned = 0, recall50 = 0, truths_invalid = 0, images = 0;
  int64_t correct = 0;  // classifier: argmax == label
  LossSums& operator+=(const LossSums& o);
};

// One timed layer phase, for --trace (milliseconds from the step's start).
struct TraceEvent {
  std::string name;  // "12 conv"
  const char* cat;   // "forward" or "backward"
  double start_ms, end_ms;
};

// Device time of forward and backward (each summed over micro-batches), of what the compute stream
// waited for between the last backward and the update (the all-reduces backward did not hide; host
// work between them with the eager calls), and of the update, for the step-time split.
struct PhaseTimes {
  double forward_ms = 0, backward_ms = 0, wait_ms = 0, update_ms = 0;
};

struct MemoryReport {
  Precision precision = Precision::Fp32;
  size_t parameters = 0, gradients = 0, optimizer = 0, statistics = 0;  // bytes
  size_t weight_copy = 0;                             // bf16/fp16: the 16-bit copy of the conv/connected weights
  size_t activations = 0, activations_unplanned = 0;  // packed by liveness / sum of all
  size_t staged_inputs = 0;  // GPUs: the fixed input buffers a captured step reads (stage_inputs)
  size_t bn_moments = 0;     // GPUs: BatchNorm's statistics from the conv epilogue (one layer's)
  size_t workspace = 0, total = 0;
  std::string text() const;
};

// The description a graph was built from (to rebuild it at another input size).
ModelSpec spec_of(const Graph& graph);

// The memory plan of a replica with `micro_batch` images in `precision` (bf16/fp16 store the
// activations, their gradients and the input images in 16 bits, plus a 16-bit weight copy),
// without allocating (workspace left out: it depends on the device). For --summary. The
// activations are the CPU backend's plan, which keeps every BatchNorm output for its backward: on
// GPUs the executor's own plan is smaller (executor_plan.cpp), and its memory() says so.
MemoryReport estimate_memory(const Graph& graph, int micro_batch, Precision precision = Precision::Fp32);

class Executor {
 public:
  // micro_batch: images per forward/backward on this device. Parameters are initialised from
  // `seed` (darknet's scheme: uniform, scaled by fan-in). Throws yolo::Error, with the numbers
  // and what to change, when the plan does not fit the device.
  // other_sizes: further input sizes (multi-scale training) the plan must also hold.
  // precision: what the step runs in (kernels/ops.h): fp32; tf32 (tensor cores, sm_80+); bf16
  // (sm_80+) or fp16 (sm_75+): activations and their gradients in 16 bits, FP32 master weights,
  // statistics and parameter gradients. It throws yolo::Error for what the device cannot run.
  // fold_shortcuts (GPUs; --no-fold turns it off): a residual block's shortcut is added in its
  // second conv's BatchNorm apply instead of a pass of its own. apply_in_loads (GPUs, tensor
  // cores; --no-fold and --no-load-fold turn it off): a BatchNorm read by convolutions alone is
  // applied where they load its input (kernels/conv.h NormalizedInput), its output never stored
  // (executor_plan.cpp).
  Executor(const Graph& graph, Device device, int micro_batch, uint64_t seed,
           std::vector<std::pair<int, int>> other_sizes = {}, Precision precision = Precision::Fp32,
           bool fold_shortcuts = true, bool apply_in_loads = true);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const Graph& graph() const { return graph_; }
  // Switches to another planned input size (multi-scale): shapes and the [yolo] losses follow.
  void set_input_size(int width, int height);
  Device device() const { return device_; }
  Precision precision() const { return precision_; }
  int micro_batch() const { return micro_batch_; }
  Stream& compute_stream() { return *stream_; }
  const MemoryReport& memory() const { return memory_; }
  const std::vector<PlannedBuffer>& plan() const { return plan_; }
  // The passes the plan folds away (GPUs): shortcuts added in a BatchNorm's apply, BatchNorm
  // applies done in the next convolutions' loads; "" when none.
  std::string folds_text() const;
  // The flat parameter buffers' length (gradients(), parameters()): the parameters and the
  // zero gaps that align each layer's weights (kParamAlignment).
  size_t parameter_count() const { return param_count_; }
  // The parameters alone: the length of download("params") and of a checkpoint's tensors.
  size_t packed_parameter_count() const { return packed_count_; }
  size_t stat_count() const;  // BatchNorm statistics: the length of download("stats")
  // Each layer's range [begin, end) of the flat buffers, gaps included, for the layers with
  // parameters in the order backward completes them (the graph's, reversed): back to back from 0
  // to parameter_count(), the `ready` prefixes set_gradients_ready reports.
  std::vector<std::pair<size_t, size_t>> layer_parameter_ranges() const;

  // One micro-batch of training: forward, loss, backward. Device pointers: images (NHWC),
  // detector truths and counts (kMaxBoxes rows), or classifier labels. The parameter gradients
  // are written (first micro-batch of a step) or added to (accumulate).
  void train_micro_batch(const float* images, const YoloTruth* truths, const int* truth_counts, const int* labels,
                         bool accumulate);
  // Inference forward (BatchNorm with running statistics); outputs stay in the buffers.
  void infer(const float* images);
  // The optimizer over all parameters: u = m*u + g*grad_scale (+ decay*w); w -= lr*u.
  // Returns false, and leaves everything unchanged, when a gradient is NaN or infinite.
  bool apply_update(float learning_rate, float momentum, float decay, float grad_scale);
  // The loss read since the last call (read_micro_batch_loss and train_micro_batch read it from
  // the device; this does not wait).
  LossSums take_loss();

  // The same step in pieces that queue work without waiting for the host, so that a step can be
  // captured into a graph and replayed (CUDA Graphs; graph/step_graphs.h). train_micro_batch is
  // use_inputs + queue_micro_batch + read_micro_batch_loss; apply_update is set_step_values +
  // queue_update + update_applied.
  //   use_inputs: the queued work reads these buffers. stage_inputs (GPUs): copies them, on the
  //   compute stream, into fixed buffers of the largest planned size, which the work then reads
  //   (a replayed graph reads the addresses it was captured with).
  void use_inputs(const float* images, const YoloTruth* truths, const int* truth_counts, const int* labels);
  void stage_inputs(const float* images, const YoloTruth* truths, const int* truth_counts, const int* labels);
  //   queue_micro_batch: forward, loss, backward on the compute stream; no host wait.
  void queue_micro_batch(bool accumulate);
  //   read_micro_batch_loss: once it is queued (or launched): its loss to the host (waits; with
  //   --sync-bn first with the communicator's deadline), added to what take_loss returns.
  void read_micro_batch_loss();
  //   set_step_values: the learning rate and gradient scale to device memory, in stream order
  //   (outside a capture: the copy reads host memory). It opens the step's update: the update
  //   queued or replayed after it is the one update_applied times (take_phase_times).
  void set_step_values(float learning_rate, float grad_scale);
  //   queue_update: the non-finite check and the update, reading those values; no host wait.
  void queue_update(float momentum, float decay);
  //   update_applied: whether the last update ran (false: a gradient was NaN or infinite, and
  //   nothing changed); waits.
  bool update_applied();
  // Two steps in flight (the loop's look-ahead): set_result_slot(s), s 0 or 1, makes the work
  // queued from now on write its loss statistics, step values, update flag and timing marks to
  // slot s (a captured graph keeps the slot it was captured in). read_micro_batch_loss(s) and
  // update_applied(s) read slot s once the work that wrote it is done (its marks), not waiting for
  // what was queued after it. Detectors only (a softmax head's accuracy reads activations).
  void set_result_slot(int slot);
  void read_micro_batch_loss(int slot);
  bool update_applied(int slot);
  // What the compute stream reaches once slot s's update is done: data parallel waits for it with
  // the communicator's deadline (the step's collectives come before the update).
  const Event& update_done(int slot) const;

  // Parameters <-> host, in our layouts, for .weights files and checkpoints.
  std::vector<LayerParams> download_parameters();  // views into a host mirror, valid until the next call
  void upload_parameters();                        // writes the host mirror back
  // "params", "momentum", "grads" (packed: packed_parameter_count() values, without the gaps),
  // "stats".
  std::vector<float> download(const std::string& what);
  void upload(const std::string& what, const std::vector<float>& values);

  // The training state copied to host memory in stream order, so that a checkpoint is written
  // while training goes on (graph/checkpoint_saver.h): the flat parameters and momentum (gaps
  // included) and the BatchNorm statistics, as the work queued before the copy leaves them.
  struct StateCopy {
    PinnedHostBuffer params, momentum, stats;
    std::unique_ptr<Event> done;  // reached once the copy is complete
  };
  // Queues the copy into `into` on the compute stream after the work queued so far (the buffers
  // are allocated on first use); work queued later runs after it.
  void queue_state_copy(StateCopy& into);
  // From flat host buffers (a completed StateCopy): the packed values, as download() gives them,
  // and the layers' parameters, as download_parameters() gives them (views into the buffers).
  std::vector<float> pack(const float* flat) const;
  std::vector<LayerParams> parameter_views(float* flat_params, float* stats) const;
  // The update's skip flag in result slot s (device memory, an int; kernels/sgd.h SgdLive): made
  // non-zero after set_step_values and before queue_update's work runs, the step's update leaves
  // the parameters, momentum and loss scale's clean count as they were, as for a non-finite gradient.
  int* update_skip_flag(int slot);

  // A node's output after forward (device pointer, NHWC view of the micro-batch), as FP32: with
  // bf16/fp16 a copy widened on the compute stream, valid until the next call.
  ConstAct output(int node) const;
  // fp16 loss scaling: the losses' gradients are multiplied by `scale` from the next micro-batch
  // on (the optimizer's grad_scale must divide it back out). 1 by default.
  void set_loss_scale(float scale);
  // fp16 loss scaling kept on the device (GPUs), so that a step queued before the previous one
  // was read runs at the scale that step left: the scale starts at `scale` (`clean` clean steps
  // counted) and each queued update, after its non-finite check, divides the gradient scale by it
  // and then adjusts it (kernels/sgd.h loss_scale_step; set_step_values then takes 1 / batch).
  // The host's LossScaler, told each step's flag as it reads it, follows the same sequence.
  // set_loss_scale is refused from then on.
  void keep_loss_scale_on_device(float scale, int clean, int growth_interval);
  LossScaleLive device_loss_scale();  // its current value (waits for the compute stream)

  // Data parallel: after each layer's backward, called with `ready`: the gradients of the flat
  // buffer's [0, ready) are final for this micro-batch (the buffer is in backward order, so
  // this prefix only grows). The work producing them is queued on compute_stream(), not
  // necessarily done: record an event there to order anything after it. Empty function: none.
  void set_gradients_ready(std::function<void(size_t ready)> callback) { gradients_ready_ = std::move(callback); }
  // Test hook: called before each layer's backward is queued, with the layer index (empty: none).
  void set_before_backward(std::function<void(int layer)> hook) { before_backward_ = std::move(hook); }
  // --sync-bn: training BatchNorm statistics over every replica's micro-batch, all-reduced by
  // `comm` on `comm_stream` (the replica's communication stream, so that these and the gradient
  // all-reduces are issued in one order on every rank). Null: per-replica statistics.
  void set_batchnorm_sync(Communicator* comm, Stream* comm_stream);
  float* gradients();  // the flat gradient buffer (device memory), parameter_count() floats
  float* parameters();  // the flat parameter buffer (device memory)

  // --trace: record per-layer events of the next train_micro_batch calls.
  void set_tracing(bool on);
  // The trace's clock: milliseconds since the compute stream reached the traced micro-batch (for
  // events other threads add to the same timeline, such as the all-reduces).
  double trace_now_ms() const;
  // The host clock trace_now_ms() counts from (milliseconds, steady).
  static double clock_ms();
  std::vector<TraceEvent> take_trace();
  // Device times since the last call: of the micro-batches' losses read and the updates applied.
  PhaseTimes take_phase_times();

 private:
  struct Impl;
  void bind_views();
  void forward(bool training);  // reads the inputs of use_inputs / stage_inputs
  void backward(bool accumulate);
  void sync_batchnorm_sums(float* data, int count);
  void read_loss(int slot, bool stream_order);
  bool read_update(int slot, bool stream_order);

  Graph graph_;
  Device device_;
  Precision precision_ = Precision::Fp32;
  int micro_batch_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Impl> impl_;
  std::vector<PlannedBuffer> plan_;
  MemoryReport memory_;
  size_t param_count_ = 0, packed_count_ = 0;
  bool tracing_ = false;
  std::function<void(size_t)> gradients_ready_;
  std::function<void(int)> before_backward_;
  std::vector<std::pair<int, int>> sizes_;  // planned input sizes (width, height)
};

}  // namespace yolo::graph
