// The training loop (see train.h).
#include "graph/train.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "data/feeder.h"
#include "data/loader.h"
#include "data/rng.h"
#include "data/transform.h"
#include "graph/checkpoint_files.h"
#include "graph/evaluate.h"
#include "graph/executor.h"
#include "graph/loss_scale.h"
#include "graph/scaling.h"
#include "graph/step_graphs.h"
#include "graph/train_loop.h"
#include "graph/weights.h"
#include "runtime/check.h"
#include "runtime/communicator.h"
#include "runtime/emu_communicator.h"
#include "runtime/fault.h"
#include "runtime/memory.h"
#include "runtime/nccl_communicator.h"
#include "runtime/plural.h"
#include "runtime/rendezvous.h"
#include "runtime/socket_communicator.h"

namespace yolo::graph {

StepSplit& StepSplit::operator+=(const StepSplit& o) {
  steps += o.steps;
  images += o.images;
  wall_ms += o.wall_ms;
  data_ms += o.data_ms;
  forward_ms += o.forward_ms;
  backward_ms += o.backward_ms;
  comm_ms += o.comm_ms;
  optimizer_ms += o.optimizer_ms;
  device_busy_ms += o.device_busy_ms;
  device_idle_ms += o.device_idle_ms;
  device_steps += o.device_steps;
  return *this;
}

std::string StepSplit::text() const {
  if (steps == 0) return "no steps";
  double n = static_cast<double>(steps);
  double other = wall_ms - data_ms - forward_ms - backward_ms - comm_ms - optimizer_ms;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%.4g img/s; a step %.1f ms = data wait %.1f + forward %.1f + backward %.1f + exposed comm %.1f + "
                "optimizer %.1f + other %.1f",
                images / std::max(wall_ms / 1000, 1e-9), wall_ms / n, data_ms / n, forward_ms / n, backward_ms / n,
                comm_ms / n, optimizer_ms / n, std::max(other, 0.0) / n);
  std::string text = buf;
  if (device_busy_ms > 0 && device_steps > 0) {
    const double d = static_cast<double>(device_steps);
    std::snprintf(buf, sizeof buf, "; device idle between kernels %.2f ms a step (%.1f%% of its %.1f ms)",
                  device_idle_ms / d, 100 * device_idle_ms / (device_busy_ms + device_idle_ms),
                  (device_busy_ms + device_idle_ms) / d);
    text += buf;
  }
  return text;
}

namespace {

// What the replicas (threads) of one process share: their traces, and which rank failed first
// (set before it aborts the communicators, so the ranks that fail because of it never win).
struct ReplicaGroup {
  TraceBook traces;
  std::atomic<int> first_failure{-1};
  void failed(int rank) {
    int none = -1;
    first_failure.compare_exchange_strong(none, rank);
  }
  // What the ranks that saved after a peer was lost said (TrainLoop::save_as_survivor).
  std::mutex notes_mutex;
  std::vector<std::string> survivor_notes;
};

struct Setup {
  int batch = 0, subdivisions = 0, micro = 0;
};

// --precision auto over every device of this process: the choice of the least capable one, so
// that every replica runs the same precision. `why` gets the reason.
Precision automatic_precision_of(const std::vector<Device>& devices, std::string* why) {
  Precision chosen = Precision::Bf16;
  int lowest = INT32_MAX;
  for (Device d : devices) {
    int cc = 0;
    if (d.runs_kernels()) {
      set_current_device(d);
      cc = current_compute_capability();
    }
    if (!d.runs_kernels() || cc < lowest) {
      chosen = automatic_precision(d.runs_kernels(), cc, why);
      lowest = d.runs_kernels() ? cc : -1;
    }
  }
  return chosen;
}

}  // namespace

TrainOptions resolve_precision(const TrainOptions& options, const std::vector<Device>& devices) {
  TrainOptions resolved = options;
  if (!options.precision) resolved.precision = automatic_precision_of(devices, &resolved.precision_reason);
  return resolved;
}

namespace {

// The precision the step runs in: the one asked for (resolve_precision filled in auto's); the
// leader says which and why.
Precision chosen_precision(const TrainOptions& options, Device device, bool leader) {
  if (!options.precision) return chosen_precision(resolve_precision(options, {device}), device, leader);
  const Precision p = *options.precision;
  if (!leader) return p;
  const std::string how =
      options.precision_reason.empty() ? "" : " (auto: " + options.precision_reason + "; --precision to choose)";
  switch (p) {
    case Precision::Fp32:
      std::printf("train_yolo: precision fp32%s\n", how.c_str());
      break;
    case Precision::Tf32:
      std::printf(
          "train_yolo: precision tf32: convolutions and connected layers on tensor cores (FP32 tensors, "
          "inputs rounded to TF32)%s\n",
          how.c_str());
      break;
    default:
      std::printf(
          "train_yolo: precision %s: activations and their gradients in %s, convolutions on tensor cores; "
          "FP32 master weights, statistics and parameter gradients%s%s\n",
          precision_name(p), precision_name(p), p == Precision::Fp16 ? "; dynamic loss scaling from 2^16" : "",
          how.c_str());
  }
  return p;
}

// The global batch, split over `world` replicas and `subdivisions` micro-batches each.
Setup batch_setup(const ModelSpec& spec, const TrainOptions& options, int world = 1) {
  Setup s;
  s.batch = options.batch ? options.batch : spec.net.batch;
  s.subdivisions = options.subdivisions ? options.subdivisions : spec.net.subdivisions;
  if (s.batch % (s.subdivisions * world))
    throw Error("batch " + std::to_string(s.batch) + " is not a multiple of subdivisions x replicas = " +
                std::to_string(s.subdivisions) + " x " + std::to_string(world) + " (--batch, --subdivisions, or [net] in " +
                spec.path + ")");
  s.micro = s.batch / (s.subdivisions * world);
  return s;
}

// A checkpoint's step shape against this run's. The number of replicas may change: the loader's
// position counts rounds of batch / subdivisions images over all replicas, which it keeps.
void check_step_shape(const std::string& path, const Checkpoint& ckpt, const Setup& setup) {
  if (ckpt.batch == 0) return;  // not recorded (version 1)
  if (ckpt.batch != setup.batch || ckpt.subdivisions != setup.subdivisions)
    throw Error(path + " was written with --batch " + std::to_string(ckpt.batch) + " --subdivisions " +
                std::to_string(ckpt.subdivisions) + ", this run has --batch " + std::to_string(setup.batch) +
                " --subdivisions " + std::to_string(setup.subdivisions) +
                ": resume with those (the data's order and position, the learning rate's schedule and the "
                "multi-scale sizes follow them; the number of replicas may change)");
}

Start prepare_start(const Graph& graph, Executor& executor, const TrainOptions& options, const Setup& setup,
                    bool leader) {
  Start start;
  if (options.resume) {
    // last.ckpt, or prev.ckpt when last.ckpt is missing or damaged (graph/checkpoint_files.h).
    ResumePoint point = find_resume_checkpoint(options.out_dir);
    if (!point.notice.empty() && leader) std::printf("train_yolo: %s\n", point.notice.c_str());
    const std::string& path = point.path;
    const Checkpoint& ckpt = point.checkpoint;
    if (ckpt.cfg_digest != cfg_digest(graph))
      throw Error(path + " was written for another architecture or input size than " + graph.path +
                  ": resume with the same --cfg and --size");
    if (ckpt.seed != options.seed)
      throw Error(path + " was written with --seed " + std::to_string(ckpt.seed) + ": resume with the same seed");
    check_step_shape(path, ckpt, setup);
    for (const auto& [name, values] : ckpt.tensors) {
      if (name != kLossScaleTensor) {
        executor.upload(name, values);
        continue;
      }
      if (values.size() != 3)
        throw Error(path + ": the loss_scale entry holds " + std::to_string(values.size()) +
                    " values, not 3 (scale, clean steps, overflows)");
      start.loss_scale = LossScaler::State{values[0], static_cast<int64_t>(values[1]), static_cast<int64_t>(values[2])};
    }
    start.iteration = ckpt.iteration;
    start.seen = ckpt.seen;
    start.loader = ckpt.loader;
    if (leader)
      std::printf("train_yolo: resuming %s at step %lld\n", path.c_str(), static_cast<long long>(start.iteration));
  } else if (!options.weights.empty()) {
    std::vector<LayerParams> layers = executor.download_parameters();
    WeightsHeader header = read_darknet_weights(options.weights, layers, options.load_layers);
    executor.upload_parameters();
    std::printf("train_yolo: loaded %s%s (trained on %llu images)\n", options.weights.c_str(),
                options.load_layers >= 0 ? (" (layers 0.." + std::to_string(options.load_layers - 1) + ")").c_str() : "",
                static_cast<unsigned long long>(header.seen));
  }
  return start;
}

}  // namespace

namespace {

// Buckets of the flat gradient buffer (backward order: layers reversed, each layer's weights,
// biases, scales; see executor.h) as [begin, end) float ranges: whole layers, grouped by the
// rule the scaling model uses (group_layers).
std::vector<std::pair<size_t, size_t>> bucket_plan(const Executor& executor, double bucket_mb) {
  const std::vector<std::pair<size_t, size_t>> layers = executor.layer_parameter_ranges();
  std::vector<int64_t> bytes;
  for (const auto& [begin, end] : layers) bytes.push_back(static_cast<int64_t>((end - begin) * sizeof(float)));
  std::vector<std::pair<size_t, size_t>> buckets;
  for (auto [first, end] : group_layers(bytes, bucket_mb))
    buckets.emplace_back(layers[first].first, layers[end - 1].second);
  return buckets;
}

// Runs the loop on this replica; with a communicator, data parallel: identical starting
// parameters (rank 0's), then bucketed all-reduces.
TrainResult run_replica(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options,
                        const Setup& setup, const Start& start, Communicator* comm, ReplicaGroup* group) {
  if (!comm) return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start);
  // dp before the stream: the stream is destroyed first, which runs what is still queued on it
  // (after an error: the stop-request copies, the collectives) while dp's buffers still exist.
  DataParallel dp;
  Stream comm_stream(executor.device(), StreamPriority::High, "comm");
  dp.comm = comm;
  dp.stream = &comm_stream;
  dp.gradients_done = std::make_unique<Event>(executor.device());
  dp.reduced = std::make_unique<Event>(executor.device());
  dp.stop_device = DeviceMemory(executor.device(), 2 * sizeof(float));
  dp.stop_host = PinnedHostBuffer(4 * sizeof(float));
  dp.gate_host = PinnedHostBuffer(2 * sizeof(int));
  static_cast<int*>(dp.gate_host.data())[0] = static_cast<int*>(dp.gate_host.data())[1] = -1;
  if (group)
    dp.survivor_saved = [group](const std::string& note) {
      std::lock_guard lock(group->notes_mutex);
      group->survivor_notes.push_back(note);
    };
  // NCCL's documentation: several GPUs per process with graph-captured collectives may deadlock
  // (a cudaGraphLaunch can block until the other GPUs' kernels launch).
  if (executor.device().is_cuda() && group && comm->size() > 1)
    dp.graphs_off =
        "NCCL warns that graph-captured collectives of several GPUs in one process may deadlock in "
        "cudaGraphLaunch; one process per GPU (started by a launcher: torchrun, mpirun, srun) replays the step as "
        "graphs";
  // The parameters were initialised or loaded on the compute stream.
  executor.compute_stream().record(*dp.gradients_done);
  comm_stream.wait(*dp.gradients_done);
  comm->broadcast(executor.parameters(), executor.parameter_count(), 0, comm_stream);
  comm->wait(comm_stream);
  const double bucket_mb = options.bucket_mb >= 0 ? options.bucket_mb
                                                 : default_bucket_mb(static_cast<int64_t>(executor.parameter_count() * sizeof(float)));
  dp.buckets = bucket_plan(executor, bucket_mb);
  dp.overlap = options.overlap;
  dp.check_every = options.check_every;
  dp.traces = group ? &group->traces : nullptr;
  if (options.sync_bn) executor.set_batchnorm_sync(comm, &comm_stream);
  // The executor's hooks point into this frame: cleared however it is left.
  struct Unhook {
    Executor& executor;
    ~Unhook() {
      executor.set_gradients_ready({});
      executor.set_batchnorm_sync(nullptr, nullptr);
    }
  } unhook{executor};
  if (comm->rank() == 0)
    std::printf("train_yolo: data parallel over %d replicas: %zu gradient buckets (--bucket-mb %.3g), %s; BatchNorm "
                "statistics %s\n",
                comm->size(), dp.buckets.size(), bucket_mb,
                dp.overlap ? "all-reduce overlapped with backward" : "all-reduce after backward (--no-overlap)",
                options.sync_bn ? "over all replicas (--sync-bn)" : "per replica (rank 0's are saved)");
  try {
    return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start, &dp);
  } catch (const std::exception& e) {
    // Stop the other ranks now, before unwinding waits for this replica's streams.
    if (group) group->failed(comm->rank());
    comm->abort(e.what());
    throw;
  }
}

// One replica's training, on `device`, as rank comm->rank() (comm: null with one device).
using ReplicaFn = std::function<TrainResult(Device device, Communicator* comm, ReplicaGroup* group)>;

// This process is one rank of a job started by a launcher (mpirun, srun, torchrun): it meets
// the others at the rendezvous, then trains on its one device.
TrainResult run_as_process_rank(const std::vector<Device>& devices, const TrainOptions& options,
                                const ReplicaFn& replica) {
  const int rank = options.process_rank, world = options.process_world;
  if (devices.size() != 1)
    throw Error("--devices: this process is rank " + std::to_string(rank) + " of " + std::to_string(world) +
                " and trains on one device, not " + std::to_string(devices.size()) +
                " (one process per GPU; the default picks gpu:LOCAL_RANK)");
  const Device device = devices[0];
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<InProcessGroup> alone;
  if (world == 1) {
    // Nobody to meet: the communicator of a job of one (NCCL still runs its collectives).
    if (device.is_cuda()) {
      comm = nccl_communicator(device, 0, 1, nccl_unique_id(), options.comm_timeout);
    } else {
      alone = std::make_unique<InProcessGroup>(1, options.comm_timeout);
      comm = replica_communicator(*alone, 0, device);
    }
  } else {
    if (device.is_emu())
      throw Error("rank " + std::to_string(rank) + " of " + std::to_string(world) +
                  ": emulated GPUs train as threads of one process (--devices emu:0,1,...), not as launched ranks");
    if (options.rendezvous.empty())
      throw Error("rank " + std::to_string(rank) + " of " + std::to_string(world) +
                  ": the ranks need a meeting point: set MASTER_ADDR and MASTER_PORT, or pass "
                  "--rendezvous tcp://HOST:PORT or --rendezvous file:///shared/path");
    Rendezvous meeting = Rendezvous::join(options.rendezvous, rank, world, options.comm_timeout);
    if (device.is_cuda()) {
      std::vector<uint8_t> id = meeting.broadcast_bytes(rank == 0 ? nccl_unique_id() : std::vector<uint8_t>{});
      comm = nccl_communicator(device, rank, world, id, options.comm_timeout);
    } else {
      comm = socket_communicator(std::move(meeting), options.comm_timeout);
    }
  }
  try {
    return replica(device, comm.get(), nullptr);
  } catch (const std::exception& e) {
    comm->abort(e.what());
    throw Error("rank " + std::to_string(rank) + ": " + e.what());
  }
}

// Runs `replica` on every device: one device directly; several in this process as threads
// (CPU replicas over the in-process group, GPUs over NCCL); or as one rank of a launched job.
// A rank that fails aborts the others' communicators; the first failure is reported.
TrainResult run_replicas(const std::vector<Device>& devices, const TrainOptions& options, const ReplicaFn& replica) {
  if (devices.empty()) throw Error("no device to train on");
  if (options.launched) return run_as_process_rank(devices, options, replica);
  if (devices.size() == 1) return replica(devices[0], nullptr, nullptr);
  const DeviceKind kind = devices[0].kind;
  for (const Device& d : devices)
    if (d.kind != kind) throw Error("--devices: replicas must be all GPUs, all emulated GPUs or all CPU, not a mix");
  const bool cuda = kind == DeviceKind::Cuda;
  const int world = static_cast<int>(devices.size());
  std::unique_ptr<InProcessGroup> group;
  std::vector<uint8_t> nccl_id;
  auto nccl_local = std::make_shared<NcclLocalGroup>();
  if (cuda) nccl_id = nccl_unique_id();
  else group = std::make_unique<InProcessGroup>(world, options.comm_timeout);
  // GPUs: NCCL; emulated GPUs: their stream-ordered collectives; CPU replicas: the in-process group.
  auto communicator = [&](int r) {
    if (cuda) return nccl_communicator(devices[r], r, world, nccl_id, options.comm_timeout, nccl_local);
    return replica_communicator(*group, r, devices[r]);
  };
  ReplicaGroup shared;
  std::vector<TrainResult> results(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      try {
        comm = communicator(r);
        results[r] = replica(devices[r], comm.get(), &shared);
      } catch (const std::exception& e) {
        shared.failed(r);
        errors[r] = e.what();
        if (comm) comm->abort(e.what());
        else nccl_local->failed_rank = r;  // its communicator never formed: the others stop waiting
      }
    });
  for (std::thread& t : threads) t.join();
  if (int r = shared.first_failure.load(); r >= 0) {
    std::string message = "rank " + std::to_string(r) + ": " + errors[r];
    for (const std::string& note : shared.survivor_notes)
      if (errors[r].find(note) == std::string::npos) message += "; " + note;
    throw Error(message);
  }
  std::vector<RankTrace>& traces = shared.traces.ranks;
  if (!traces.empty()) {
    std::sort(traces.begin(), traces.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
    write_trace(options.trace_file, traces);
  }
  return results[0];
}

TrainResult train_detector_replica(const ModelSpec& spec, const data::Dataset& dataset, data::ImageCache* images,
                                   Device device, const TrainOptions& options, Communicator* comm,
                                   ReplicaGroup* group) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const bool leader = rank == 0;
  Graph graph = build_graph(spec);
  if (!graph.detection) throw Error(spec.path + ": this net has no [yolo] layers: it cannot train on a detection dataset");
  if (static_cast<int>(dataset.class_names.size()) != graph.classes)
    throw Error(spec.path + ": the [yolo] layers have classes=" + std::to_string(graph.classes) + " but the dataset " +
                dataset.source + " has " + std::to_string(dataset.class_names.size()) + " classes");
  Setup setup = batch_setup(spec, options, world);
  // Every rank must train on the same items: each process opened (and verified) the dataset
  // itself, so a file that changed between their scans would make the shards differ.
  if (comm && world > 1) {
    // Paths relative to the dataset's folder: ranks may see the same data at different mounts.
    std::error_code ec;
    const std::filesystem::path source(dataset.source);
    const std::filesystem::path root = std::filesystem::is_directory(source, ec) ? source : source.parent_path();
    std::string paths;
    for (const data::Sample& sample : dataset.train.samples)
      paths += std::filesystem::path(sample.image).lexically_relative(root).string() + ' ' +
               std::to_string(sample.boxes.size()) + '\n';
    const std::vector<uint64_t> digests = comm->all_gather(fnv1a64(paths.data(), paths.size()));
    for (int r = 1; r < world; ++r)
      if (digests[r] != digests[0])
        throw Error("rank " + std::to_string(r) + "'s training items differ from rank 0's (" + dataset.source +
                    " changed between their scans?): every rank must leave out the same items");
  }
  // [yolo] random=1: multi-scale training, every size planned for up front.
  bool multiscale = false;
  float jitter = 0;
  for (const Node& node : graph.nodes)
    if (node.spec.type == LayerType::Yolo) {
      multiscale |= node.spec.random;
      jitter = node.spec.jitter;
    }
  std::vector<std::pair<int, int>> sizes;
  if (multiscale) sizes = data::multiscale_sizes(graph.net.width, graph.net.height);
  const Precision precision = chosen_precision(options, device, leader);
  Executor executor(graph, device, setup.micro, options.seed, sizes, precision, options.fold_shortcuts,
                    options.apply_in_loads);
  if (leader) std::printf("train_yolo: %s\n", executor.memory().text().c_str());
  if (const std::string folds = executor.folds_text(); leader && !folds.empty())
    std::printf("train_yolo: %s\n", folds.c_str());
  if (multiscale && leader)
    std::printf("train_yolo: multi-scale training (random=1): %dx%d .. %dx%d, a new size every 10 steps\n",
                sizes.front().first, sizes.front().second, sizes.back().first, sizes.back().second);
  Start start = prepare_start(graph, executor, options, setup, leader);

  data::LoaderOptions lo;
  lo.batch = setup.micro;
  lo.net_w = graph.net.width;
  lo.net_h = graph.net.height;
  lo.augment = true;
  lo.augment_params.hue = spec.net.hue;
  lo.augment_params.saturation = spec.net.saturation;
  lo.augment_params.exposure = spec.net.exposure;
  lo.augment_params.jitter = jitter;
  lo.multiscale = multiscale;
  lo.threads = options.threads;
  lo.strict = options.strict;
  lo.seed = options.seed;
  lo.batches_per_iteration = setup.subdivisions;
  lo.rank = rank;
  lo.world = world;
  lo.cache = images;
  data::Loader loader(dataset.train, lo, start.loader);
  data::DeviceFeeder feeder(loader, device);
  Source source;
  source.steps_per_epoch = loader.steps_per_epoch();
  source.next = [&]() {
    const data::DeviceBatch& db = feeder.next(executor.compute_stream());
    return MicroBatch{db.images, db.truths, db.truth_counts, nullptr, db.host->net_w, db.host->net_h};
  };
  source.fetch_ahead = true;  // the feeder's two buffers (data/feeder.h)
  source.state = [&]() { return loader.state(); };
  // --trace: the copies' spans, timed on the copy stream by host functions (shared: the feeder's
  // queued host functions may outlive this frame's other locals).
  struct CopyTrace {
    std::mutex mutex;
    bool on = false;
    double start = 0;
    std::vector<TraceEvent> events;
  };
  auto copies = std::make_shared<CopyTrace>();
  feeder.set_copy_observer([copies](bool begin, size_t bytes) {
    std::lock_guard lock(copies->mutex);
    if (!copies->on) return;
    if (begin) {
      copies->start = Executor::clock_ms();
      return;
    }
    char name[64];
    std::snprintf(name, sizeof name, "copy batch (%.1f MB)", bytes / 1048576.0);
    copies->events.push_back(TraceEvent{name, "copy", copies->start, Executor::clock_ms()});
  });
  source.trace_copies = [copies](bool on) {
    std::lock_guard lock(copies->mutex);
    copies->on = on;
  };
  source.take_copy_events = [copies, &feeder]() {
    feeder.copy_stream().synchronize();
    std::lock_guard lock(copies->mutex);
    return std::exchange(copies->events, {});
  };
  source.epoch_summary = [&](int64_t epoch) { return loader.epoch_stats(epoch).summary(); };
  if (options.valid_every > 0 && !dataset.valid.samples.empty())
    source.validate = [&]() {
      executor.set_input_size(graph.net.width, graph.net.height);
      DetectOptions detect;
      detect.threads = options.threads;
      return evaluate_split(executor, dataset.valid, graph.classes, detect).map50;
    };
  if (leader)
    std::printf("train_yolo: training %s on %d x %s: batch %d (%s x %s x %d), %dx%d, %s, %s per epoch\n",
                spec.path.c_str(), world, device.name().c_str(), setup.batch, counted(world, "replica").c_str(),
                counted(setup.subdivisions, "micro-batch", "micro-batches").c_str(), setup.micro, graph.net.width,
                graph.net.height, counted(static_cast<int64_t>(dataset.train.samples.size()), "training image").c_str(),
                counted(loader.steps_per_epoch() / setup.subdivisions, "step").c_str());
  return run_replica(graph, executor, source, options, setup, start, comm, group);
}

}  // namespace

TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, const std::vector<Device>& devices,
                           const TrainOptions& options) {
  const TrainOptions resolved = resolve_precision(options, devices);
  // One cache for the process: its replicas' shards cover every image over the epochs.
  const size_t cache_bytes = options.image_cache_mb < 0 ? data::default_image_cache_bytes()
                                                        : size_t(options.image_cache_mb) << 20;
  std::unique_ptr<data::ImageCache> images;
  if (cache_bytes > 0) images = std::make_unique<data::ImageCache>(cache_bytes);
  TrainResult result = run_replicas(devices, resolved, [&](Device device, Communicator* comm, ReplicaGroup* group) {
    return train_detector_replica(spec, dataset, images.get(), device, resolved, comm, group);
  });
  if (images)
    std::printf("train_yolo: %zu of %zu training images were kept decoded in memory (%.0f MiB of --cache-mb %.0f)\n",
                images->cached_images(), dataset.train.samples.size(), double(images->cached_bytes()) / (1 << 20),
                double(images->budget_bytes()) / (1 << 20));
  return result;
}

TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                           const TrainOptions& options) {
  return train_detector(spec, dataset, std::vector<Device>{device}, options);
}

namespace {

// Rank `rank` of `world` trains on micro-batch k of each of its steps with images
// order[(k * world + rank) * n ...]: together the replicas see what one replica with the
// whole batch would (the same images, the same order within the step).
TrainResult train_classifier_replica(const ModelSpec& spec, const data::MnistSet& mnist, Device device,
                                     const TrainOptions& options, Communicator* comm, ReplicaGroup* group) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  Graph graph = build_graph(spec);
  if (graph.detection) throw Error(spec.path + ": a detector cannot train on MNIST");
  int pixels = mnist.rows * mnist.cols;
  if (graph.input.elements() != pixels)
    throw Error(spec.path + ": the net takes " + std::to_string(graph.input.elements()) + " inputs, MNIST images have " +
                std::to_string(pixels));
  int classes = graph.nodes.back().out.c;
  if (classes < 10) throw Error(spec.path + ": the last layer has " + std::to_string(classes) + " outputs; MNIST has 10 classes");
  Setup setup = batch_setup(spec, options, world);
  Executor executor(graph, device, setup.micro, options.seed, {}, chosen_precision(options, device, rank == 0),
                    options.fold_shortcuts, options.apply_in_loads);
  Start start = prepare_start(graph, executor, options, setup, rank == 0);
  // MNIST batches are cheap: built on the host per micro-batch and copied synchronously.
  const int n = setup.micro;
  const int64_t steps = mnist.count / (static_cast<int64_t>(n) * world);  // micro-batches per epoch and rank
  if (steps == 0) throw Error("the MNIST set has fewer images than one micro-batch on every replica");
  DeviceMemory images(device, static_cast<size_t>(n) * pixels * sizeof(float));
  DeviceMemory labels(device, static_cast<size_t>(n) * sizeof(int));
  std::vector<float> host_images(static_cast<size_t>(n) * pixels);
  std::vector<int> host_labels(static_cast<size_t>(n));
  data::LoaderState position = start.loader;
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  Source source;
  source.steps_per_epoch = steps;
  source.next = [&]() {
    if (order_epoch != position.epoch) {
      order.resize(static_cast<size_t>(mnist.count));
      std::iota(order.begin(), order.end(), 0);
      data::KeyedRng rng(options.seed, 0x4D4E495354ull, static_cast<uint64_t>(position.epoch));
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
      order_epoch = position.epoch;
    }
    const int64_t first = (position.step * world + rank) * n;
    for (int b = 0; b < n; ++b) {
      int64_t index = order[static_cast<size_t>(first + b)];
      const uint8_t* src = mnist.pixels.data() + index * pixels;
      for (int k = 0; k < pixels; ++k) host_images[static_cast<size_t>(b) * pixels + k] = src[k] / 255.0f;
      host_labels[b] = mnist.labels[static_cast<size_t>(index)];
    }
    executor.compute_stream().synchronize();  // the previous micro-batch is done with the buffers
    // On the compute stream: a copy from pageable memory may still be landing when the call
    // returns, and the kernels that read it must come after it.
    copy_bytes(images.data(), host_images.data(), host_images.size() * sizeof(float), &executor.compute_stream());
    copy_bytes(labels.data(), host_labels.data(), host_labels.size() * sizeof(int), &executor.compute_stream());
    if (++position.step == steps) {
      position.step = 0;
      ++position.epoch;
    }
    return MicroBatch{static_cast<const float*>(images.data()), nullptr, nullptr, static_cast<const int*>(labels.data())};
  };
  source.state = [&]() {
    data::LoaderState s = position;
    s.seed = options.seed;
    return s;
  };
  source.epoch_summary = [](int64_t) { return std::string(); };
  if (rank == 0)
    std::printf("train_yolo: training %s on %d x %s: batch %d (%d replicas x %d micro-batches x %d), %d MNIST images "
                "(%s)\n",
                spec.path.c_str(), world, device.name().c_str(), setup.batch, world, setup.subdivisions, setup.micro,
                mnist.count, mnist.source.c_str());
  return run_replica(graph, executor, source, options, setup, start, comm, group);
}

}  // namespace

TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, const std::vector<Device>& devices,
                             const TrainOptions& options) {
  const TrainOptions resolved = resolve_precision(options, devices);
  return run_replicas(devices, resolved, [&](Device device, Communicator* comm, ReplicaGroup* group) {
    return train_classifier_replica(spec, mnist, device, resolved, comm, group);
  });
}

TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, Device device,
                             const TrainOptions& options) {
  return train_classifier(spec, mnist, std::vector<Device>{device}, options);
}

}  // namespace yolo::graph
