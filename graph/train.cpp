// The training loop (see train.h).
#include "graph/train.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <thread>

#include "data/feeder.h"
#include "data/loader.h"
#include "data/rng.h"
#include "data/transform.h"
#include "graph/evaluate.h"
#include "graph/executor.h"
#include "graph/weights.h"
#include "runtime/check.h"
#include "runtime/communicator.h"
#include "runtime/memory.h"

namespace yolo::graph {

float learning_rate_at(const NetParams& net, int64_t iteration) {
  if (net.burn_in > 0 && iteration < net.burn_in)
    return net.learning_rate * static_cast<float>(std::pow(static_cast<double>(iteration) / net.burn_in, 4.0));
  float rate = net.learning_rate;
  if (net.policy == NetParams::Policy::Steps)
    for (size_t k = 0; k < net.steps.size(); ++k)
      if (iteration >= net.steps[k]) rate *= net.scales[k];
  return rate;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string duration_text(double seconds) {
  char buf[32];
  int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", s / 3600, s / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", s / 60, s % 60);
  return buf;
}

// 64-bit FNV-1a of a byte range.
uint64_t fnv1a64(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Identifies the architecture (and input size) a checkpoint belongs to.
std::string cfg_digest(const Graph& graph) {
  std::string table = summary_table(graph);
  uint64_t h = fnv1a64(table.data(), table.size());
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void write_trace(const std::string& path, const std::vector<TraceEvent>& events, const std::string& device) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"traceEvents\":[\n";
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"" << device << "\"}},\n";
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n";
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"comm\"}}";
    for (const TraceEvent& e : events) {
      char buf[256];
      int lane = std::strcmp(e.cat, "comm") == 0 ? 1 : 0;
      std::snprintf(buf, sizeof buf,
                    ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                    e.name.c_str(), e.cat, lane, e.start_ms * 1000, (e.end_ms - e.start_ms) * 1000);
      out << buf;
    }
    out << "\n]}\n";
    if (!out) throw Error("cannot write the trace file " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

// What the loop needs from a data source: the next micro-batch's device pointers.
struct MicroBatch {
  const float* images = nullptr;
  const YoloTruth* truths = nullptr;
  const int* truth_counts = nullptr;
  const int* labels = nullptr;
};

struct Source {
  std::function<MicroBatch()> next;
  std::function<data::LoaderState()> state;
  std::function<std::string(int64_t epoch)> epoch_summary;  // "" when there is nothing to say
  std::function<double()> validate;                         // mAP@0.5 on the validation split (optional)
  int64_t steps_per_epoch = 1;                               // in micro-batches
};

// One replica's part in data-parallel training (absent with one device).
struct DataParallel {
  Communicator* comm = nullptr;
  Stream* stream = nullptr;                          // the replica's communication stream
  std::vector<std::pair<size_t, size_t>> buckets;   // [begin, end) of the flat gradients, backward order
  bool overlap = true;
  int check_every = 100;
};

// A hash of the parameters' bytes (replicas must agree bit for bit).
uint64_t parameter_hash(Executor& executor) {
  std::vector<float> params = executor.download("params");
  return fnv1a64(params.data(), params.size() * sizeof(float));
}

TrainResult run_loop(const Graph& graph, Executor& executor, Source& source, const TrainOptions& options, int batch,
                     int subdivisions, int64_t start_iteration, uint64_t seen, DataParallel* dp = nullptr) {
  const bool leader = !dp || dp->comm->rank() == 0;  // prints, validates and saves
  const NetParams& net = graph.net;
  int64_t max_batches = options.max_batches ? options.max_batches : net.max_batches;
  if (max_batches <= 0) throw Error(graph.path + ": max_batches is 0: set it in [net] or pass --max-batches");
  std::filesystem::create_directories(options.out_dir);
  TrainResult result;
  result.weights_path = options.out_dir + "/last.weights";
  result.checkpoint_path = options.out_dir + "/last.ckpt";
  bool tty = options.progress_in_place && isatty(fileno(stdout));
  auto t_start = std::chrono::steady_clock::now();
  auto t_print = t_start;
  int64_t images_this_run = 0;
  int64_t last_epoch_reported = source.state().epoch;

  auto save = [&](int64_t iteration) {
    std::vector<LayerParams> layers = executor.download_parameters();
    WeightsHeader header;
    header.seen = seen;
    write_darknet_weights(result.weights_path, layers, header);
    Checkpoint ckpt;
    ckpt.cfg_digest = cfg_digest(graph);
    ckpt.iteration = iteration;
    ckpt.seen = seen;
    ckpt.loader = source.state();
    ckpt.seed = options.seed;
    ckpt.tensors.emplace_back("params", executor.download("params"));
    ckpt.tensors.emplace_back("momentum", executor.download("momentum"));
    ckpt.tensors.emplace_back("stats", executor.download("stats"));
    write_checkpoint(result.checkpoint_path, ckpt);
  };

  for (int64_t iteration = start_iteration; iteration < max_batches; ++iteration) {
    bool trace_this = !options.trace_file.empty() && iteration == start_iteration + std::min<int64_t>(1, max_batches - start_iteration - 1);
    size_t next_bucket = 0;
    std::vector<TraceEvent> comm_events;  // filled on the comm stream, read after it synchronized
    for (int s = 0; s < subdivisions; ++s) {
      executor.set_tracing(trace_this && s == 0);  // the step's first micro-batch
      // Overlap: in the step's last micro-batch, each bucket's all-reduce starts on the
      // communication stream as soon as backward has produced its last gradient.
      if (dp && dp->overlap && s == subdivisions - 1)
        executor.set_gradients_ready([&](size_t ready) {
          while (next_bucket < dp->buckets.size() && dp->buckets[next_bucket].second <= ready) {
            auto [begin, end] = dp->buckets[next_bucket++];
            // --trace: the all-reduce's span on the comm lane, timed on the comm stream itself.
            auto span = std::make_shared<TraceEvent>();
            if (trace_this && leader) {
              char name[64];
              std::snprintf(name, sizeof name, "allreduce bucket %zu (%.1f MB)", next_bucket - 1,
                            (end - begin) * sizeof(float) / 1048576.0);
              *span = TraceEvent{name, "comm", 0, 0};
              dp->stream->enqueue([&executor, span] { span->start_ms = executor.trace_now_ms(); });
            }
            dp->comm->all_reduce_sum(executor.gradients() + begin, end - begin, *dp->stream);
            if (trace_this && leader)
              dp->stream->enqueue([&executor, &comm_events, span] {
                span->end_ms = executor.trace_now_ms();
                comm_events.push_back(*span);
              });
          }
        });
      else
        executor.set_gradients_ready({});
      MicroBatch mb = source.next();
      executor.train_micro_batch(mb.images, mb.truths, mb.truth_counts, mb.labels, s > 0);
    }
    if (dp) {
      if (!dp->overlap) dp->comm->all_reduce_sum(executor.gradients(), executor.parameter_count(), *dp->stream);
      dp->stream->synchronize();
    }
    float lr = learning_rate_at(net, iteration);
    bool updated = executor.apply_update(lr, net.momentum, net.decay, 1.0f / static_cast<float>(batch));
    LossSums loss = executor.take_loss();
    if (dp && dp->check_every > 0 && (iteration + 1) % dp->check_every == 0) {
      std::vector<uint64_t> hashes = dp->comm->all_gather(parameter_hash(executor));
      for (size_t r = 1; r < hashes.size(); ++r)
        if (hashes[r] != hashes[0])
          throw Error("replicas diverged at step " + std::to_string(iteration + 1) + ": rank " + std::to_string(r) +
                      "'s parameters differ from rank 0's");
    }
    if (trace_this && leader) {
      std::vector<TraceEvent> events = executor.take_trace();
      events.insert(events.end(), comm_events.begin(), comm_events.end());
      write_trace(options.trace_file, events, executor.device().name());
    }
    seen += static_cast<uint64_t>(batch);
    images_this_run += batch;
    double mean = loss.images ? loss.total / static_cast<double>(loss.images) : 0;
    if (iteration == start_iteration) result.first_loss = mean;
    result.last_loss = mean;
    result.iterations = iteration + 1;
    if (!updated && leader)
      std::printf("%strain_yolo: step %lld skipped: a gradient was NaN or infinite (the parameters are unchanged)\n",
                  tty ? "\n" : "", static_cast<long long>(iteration + 1));

    double elapsed = seconds_since(t_start);
    double rate = images_this_run / std::max(elapsed, 1e-9);
    bool last = iteration + 1 == max_batches;
    if (leader && (seconds_since(t_print) >= (tty ? 0.25 : 2.0) || last || iteration == start_iteration)) {
      t_print = std::chrono::steady_clock::now();
      double eta = (max_batches - iteration - 1) * static_cast<double>(batch) / std::max(rate, 1e-9);
      data::LoaderState st = source.state();
      double epoch = st.epoch + static_cast<double>(st.step) / std::max<int64_t>(source.steps_per_epoch, 1);
      char line[400];
      if (graph.detection) {
        std::snprintf(line, sizeof line,
                      "iter %lld/%lld  epoch %.2f  loss %.3f (box %.3f obj %.3f noobj %.3f cls %.3f)  IoU %.2f  "
                      "recall %.2f  lr %.2e  %.1f img/s  ETA %s",
                      static_cast<long long>(iteration + 1), static_cast<long long>(max_batches), epoch, mean,
                      loss.box / loss.images, loss.obj / loss.images, loss.noobj / loss.images,
                      loss.cls / loss.images, loss.assigned ? loss.iou_sum / loss.assigned : 0.0,
                      loss.assigned ? static_cast<double>(loss.recall50) / loss.assigned : 0.0, lr, rate,
                      duration_text(eta).c_str());
      } else {
        std::snprintf(line, sizeof line, "iter %lld/%lld  epoch %.2f  loss %.4f  accuracy %.3f  lr %.2e  %.1f img/s  ETA %s",
                      static_cast<long long>(iteration + 1), static_cast<long long>(max_batches), epoch, mean,
                      static_cast<double>(loss.correct) / std::max<int64_t>(loss.images, 1), lr, rate,
                      duration_text(eta).c_str());
      }
      std::printf(tty ? "\r%s\033[K" : "%s\n", line);
      std::fflush(stdout);
    }
    int64_t epoch_now = source.state().epoch;
    if (epoch_now != last_epoch_reported && leader) {
      std::string summary = source.epoch_summary(last_epoch_reported);
      if (!summary.empty()) std::printf("%strain_yolo: %s\n", tty ? "\n" : "", summary.c_str());
      last_epoch_reported = epoch_now;
      if (source.validate && options.valid_every > 0 && epoch_now % options.valid_every == 0) {
        double map50 = source.validate();
        bool best = map50 > result.best_map50;
        std::printf("train_yolo: epoch %lld: validation mAP@0.5 = %.4f%s\n", static_cast<long long>(epoch_now), map50,
                    best ? " (best so far: best.weights)" : "");
        if (best) {
          result.best_map50 = map50;
          WeightsHeader header;
          header.seen = seen;
          write_darknet_weights(options.out_dir + "/best.weights", executor.download_parameters(), header);
        }
      }
    }
    if (leader && options.checkpoint_every > 0 && (iteration + 1) % options.checkpoint_every == 0 && !last)
      save(iteration + 1);
  }
  if (tty && leader) std::printf("\n");
  result.images_per_second = images_this_run / std::max(seconds_since(t_start), 1e-9);
  if (leader) save(result.iterations);
  return result;
}

struct Setup {
  int batch = 0, subdivisions = 0, micro = 0;
};

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

// Loads --weights or the checkpoint of --resume into the executor; returns (iteration, seen, loader state).
struct Start {
  int64_t iteration = 0;
  uint64_t seen = 0;
  data::LoaderState loader;
};

Start prepare_start(const Graph& graph, Executor& executor, const TrainOptions& options) {
  Start start;
  if (options.resume) {
    std::string path = options.out_dir + "/last.ckpt";
    Checkpoint ckpt = read_checkpoint(path);
    if (ckpt.cfg_digest != cfg_digest(graph))
      throw Error(path + " was written for another architecture or input size than " + graph.path +
                  ": resume with the same --cfg and --size");
    if (ckpt.seed != options.seed)
      throw Error(path + " was written with --seed " + std::to_string(ckpt.seed) + ": resume with the same seed");
    for (const auto& [name, values] : ckpt.tensors) executor.upload(name, values);
    start.iteration = ckpt.iteration;
    start.seen = ckpt.seen;
    start.loader = ckpt.loader;
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
// biases, scales; see executor.h): whole layers, closed once at least bucket_mb is collected
// (0: one layer each).
std::vector<std::pair<size_t, size_t>> bucket_plan(const Graph& graph, double bucket_mb) {
  std::vector<std::pair<size_t, size_t>> buckets;
  size_t begin = 0, end = 0;
  for (int i = static_cast<int>(graph.nodes.size()) - 1; i >= 0; --i) {
    end += static_cast<size_t>(graph.nodes[i].trainable());
    if (end > begin && (end - begin) * sizeof(float) >= bucket_mb * 1048576.0) {
      buckets.emplace_back(begin, end);
      begin = end;
    }
  }
  if (end > begin) buckets.emplace_back(begin, end);
  return buckets;
}

TrainResult train_detector_replica(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                                   const TrainOptions& options, Communicator* comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  const bool leader = rank == 0;
  Graph graph = build_graph(spec);
  if (!graph.detection) throw Error(spec.path + ": this net has no [yolo] layers: it cannot train on a detection dataset");
  if (static_cast<int>(dataset.class_names.size()) != graph.classes)
    throw Error(spec.path + ": the [yolo] layers have classes=" + std::to_string(graph.classes) + " but the dataset " +
                dataset.source + " has " + std::to_string(dataset.class_names.size()) + " classes");
  Setup setup = batch_setup(spec, options, world);
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
  Executor executor(graph, device, setup.micro, options.seed, sizes);
  if (leader) std::printf("train_yolo: %s\n", executor.memory().text().c_str());
  if (multiscale && leader)
    std::printf("train_yolo: multi-scale training (random=1): %dx%d .. %dx%d, a new size every 10 steps\n",
                sizes.front().first, sizes.front().second, sizes.back().first, sizes.back().second);
  Start start = prepare_start(graph, executor, options);

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
  lo.seed = options.seed;
  lo.batches_per_iteration = setup.subdivisions;
  lo.rank = rank;
  lo.world = world;
  data::Loader loader(dataset.train, lo, start.loader);
  data::DeviceFeeder feeder(loader, device);
  Source source;
  source.steps_per_epoch = loader.steps_per_epoch();
  source.next = [&]() {
    const data::DeviceBatch& db = feeder.next(executor.compute_stream());
    executor.set_input_size(db.host->net_w, db.host->net_h);
    return MicroBatch{db.images, db.truths, db.truth_counts, nullptr};
  };
  source.state = [&]() { return loader.state(); };
  source.epoch_summary = [&](int64_t epoch) { return loader.epoch_stats(epoch).summary(); };
  if (options.valid_every > 0 && !dataset.valid.samples.empty())
    source.validate = [&]() {
      executor.set_input_size(graph.net.width, graph.net.height);
      DetectOptions detect;
      detect.threads = options.threads;
      return evaluate_split(executor, dataset.valid, graph.classes, detect).map50;
    };
  if (leader)
    std::printf("train_yolo: training %s on %d x %s: batch %d (%d replicas x %d micro-batches x %d), %dx%d, %zu "
                "training images, %lld steps per epoch\n",
                spec.path.c_str(), world, device.name().c_str(), setup.batch, world, setup.subdivisions, setup.micro,
                graph.net.width, graph.net.height, dataset.train.samples.size(),
                static_cast<long long>(loader.steps_per_epoch() / setup.subdivisions));
  if (!comm) return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start.iteration, start.seen);

  // Data parallel: identical starting parameters (rank 0's), then bucketed all-reduces.
  Stream comm_stream(device, StreamPriority::High, "comm");
  comm->broadcast(executor.parameters(), executor.parameter_count(), 0, comm_stream);
  comm_stream.synchronize();
  DataParallel dp;
  dp.comm = comm;
  dp.stream = &comm_stream;
  dp.buckets = bucket_plan(graph, options.bucket_mb);
  dp.overlap = options.overlap;
  dp.check_every = options.check_every;
  if (leader)
    std::printf("train_yolo: data parallel over %d replicas: %zu gradient buckets (--bucket-mb %g), %s\n", world,
                dp.buckets.size(), options.bucket_mb,
                dp.overlap ? "all-reduce overlapped with backward" : "all-reduce after backward (--no-overlap)");
  return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start.iteration, start.seen, &dp);
}

}  // namespace

TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, const std::vector<Device>& devices,
                           const TrainOptions& options) {
  if (devices.empty()) throw Error("no device to train on");
  if (devices.size() == 1) return train_detector_replica(spec, dataset, devices[0], options, nullptr);
  for (const Device& d : devices)
    if (d.is_cuda())
      throw Error("data-parallel training over several GPUs needs the NCCL communicator, which is not built yet: "
                  "use one GPU (--devices gpu:0) or CPU replicas (--devices cpu:N)");
  const int world = static_cast<int>(devices.size());
  InProcessGroup group(world, options.comm_timeout);
  std::vector<TrainResult> results(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = group.communicator(r);
      try {
        results[r] = train_detector_replica(spec, dataset, devices[r], options, comm.get());
      } catch (const std::exception& e) {
        errors[r] = e.what();
        comm->abort(e.what());
      }
    });
  for (std::thread& t : threads) t.join();
  // The first rank that failed on its own (the others report the abort).
  for (int r = 0; r < world; ++r)
    if (!errors[r].empty() && errors[r].find(" failed: ") == std::string::npos)
      throw Error("rank " + std::to_string(r) + ": " + errors[r]);
  for (int r = 0; r < world; ++r)
    if (!errors[r].empty()) throw Error(errors[r]);
  return results[0];
}

TrainResult train_detector(const ModelSpec& spec, const data::Dataset& dataset, Device device,
                           const TrainOptions& options) {
  return train_detector(spec, dataset, std::vector<Device>{device}, options);
}

TrainResult train_classifier(const ModelSpec& spec, const data::MnistSet& mnist, Device device,
                             const TrainOptions& options) {
  Graph graph = build_graph(spec);
  if (graph.detection) throw Error(spec.path + ": a detector cannot train on MNIST");
  int pixels = mnist.rows * mnist.cols;
  if (graph.input.elements() != pixels)
    throw Error(spec.path + ": the net takes " + std::to_string(graph.input.elements()) + " inputs, MNIST images have " +
                std::to_string(pixels));
  int classes = graph.nodes.back().out.c;
  if (classes < 10) throw Error(spec.path + ": the last layer has " + std::to_string(classes) + " outputs; MNIST has 10 classes");
  Setup setup = batch_setup(spec, options);
  Executor executor(graph, device, setup.micro, options.seed);
  Start start = prepare_start(graph, executor, options);
  // MNIST batches are cheap: built on the host per micro-batch and copied synchronously.
  const int n = setup.micro;
  const int64_t steps = mnist.count / n;
  if (steps == 0) throw Error("MNIST set has fewer images than one micro-batch");
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
    for (int b = 0; b < n; ++b) {
      int64_t index = order[static_cast<size_t>(position.step * n + b)];
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
  std::printf("train_yolo: training %s on %s: batch %d (%d x %d), %d MNIST images (%s)\n", spec.path.c_str(),
              device.name().c_str(), setup.batch, setup.subdivisions, setup.micro, mnist.count, mnist.source.c_str());
  return run_loop(graph, executor, source, options, setup.batch, setup.subdivisions, start.iteration, start.seen);
}

}  // namespace yolo::graph
