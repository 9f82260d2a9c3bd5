// Data parallel on CPU replicas and on emulated GPUs (the same checks, each a function of the
// device kind): local gradients differ, the all-reduce makes the replicas' parameters identical
// bit for bit step after step; overlap proved with a latch; train_detector over 2 and 3 replicas
// with the parameter-hash check every step, overlapped and naive schedules giving the same bits;
// the MLP on N replicas with batch B/N as 1 with batch B; --sync-bn as the whole batch. Then
// ranks as processes (CPU).
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "data/json.h"
#include "data/mnist.h"
#include "data/synthetic.h"
#include "graph/executor.h"
#include "graph/train.h"
#include "graph/weights.h"
#include "runtime/communicator.h"
#include "runtime/emu_communicator.h"
#include "runtime/launch.h"
#include "runtime/stop_signal.h"
#include "tests/child_process.h"
#include "tests/graph_fixtures.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;
using yolo::testing::TempDir;
using yolo::testing::file_bytes;
using yolo::testing::kTinyDetectorCfg;
using yolo::testing::ChildProcess;
using yolo::testing::kSmallMlpCfg;
using yolo::testing::tiny_dp_options;



namespace {

bool emulated_gpus_here() { return YOLO_EMULATED_KERNELS; }
const char* const kNoEmulatedGpus = "emulated GPUs exist only in builds with emulated kernels (build/tests_emu)";

// Each replica trains 5 steps on its own images and all-reduces its gradients on a comm stream
// (after an event on its compute stream): the local gradients differ, the parameters do not.
void check_replicas_agree(DeviceKind kind, int world) {
  CAPTURE(world);
  Graph graph = build_graph(parse_model(parse_cfg_text(kTinyDetectorCfg, "tiny.cfg")));
  const int n = 2;
  std::vector<std::vector<float>> local_grads(world), params(world);
  std::vector<std::string> errors = yolo::testing::on_replicas(kind, world, 30, [&](int r, Device device, Communicator& comm) {
    Executor ex(graph, device, n, 5);
    Stream stream(device, StreamPriority::High, "comm");
    Event produced(device);
    for (int step = 0; step < 5; ++step) {
      std::vector<float> images;
      std::vector<YoloTruth> truths;
      std::vector<int> counts;
      yolo::testing::synthetic_batch(99, (step * world + r) * n, n, 64, 64, images, truths, counts);
      yolo::testing::UploadedBatch batch(device, images, truths, counts);
      ex.train_micro_batch(batch.image_data(), batch.truth_data(), batch.count_data(), nullptr, false);
      if (step == 0) local_grads[r] = ex.download("grads");
      ex.compute_stream().record(produced);
      stream.wait(produced);
      comm.all_reduce_sum(ex.gradients(), ex.parameter_count(), stream);
      comm.wait(stream);
      stream.synchronize();
      if (!ex.apply_update(0.01f, 0.9f, 0.0005f, 1.0f / (n * world))) throw Error("a step was skipped");
      ex.take_loss();
    }
    params[r] = ex.download("params");
  });
  for (int r = 0; r < world; ++r) CHECK(errors[r].empty());
  for (int r = 1; r < world; ++r) {
    CHECK(local_grads[r] != local_grads[0]);  // the replicas did see different data
    CHECK(params[r] == params[0]);            // and still agree bit for bit
  }
}

// Each replica holds its layer-0 backward (when it is queued) until its communication stream has
// started the first bucket's all-reduce (a latch with a timeout). Overlapped, the bucket of the
// last layer is queued long before, so the step completes; with all-reduce after backward, the
// latch can only time out.
void check_overlap_is_real(DeviceKind kind) {
  Graph graph = build_graph(parse_model(parse_cfg_text(kTinyDetectorCfg, "tiny.cfg")));
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    const int world = 2, n = 1;
    std::vector<int> held_ok(world, -1);
    std::vector<std::string> errors = yolo::testing::on_replicas(kind, world, 30, [&](int r, Device device, Communicator& comm) {
      Executor ex(graph, device, n, 5);
      Stream stream(device, StreamPriority::High, "comm");
      Event produced(device);
      testing::Latch started;
      bool first = true;
      auto start_all_reduce = [&](size_t begin, size_t end) {
        ex.compute_stream().record(produced);
        stream.wait(produced);
        stream.enqueue([&started] { started.release(); });
        comm.all_reduce_sum(ex.gradients() + begin, end - begin, stream);
      };
      if (overlap)
        ex.set_gradients_ready([&](size_t ready) {
          if (first) start_all_reduce(0, ready);  // the first bucket: the last layer's gradients
          first = false;
        });
      ex.set_before_backward([&](int layer) {
        if (layer == 0) held_ok[r] = started.wait(std::chrono::milliseconds(overlap ? 10000 : 300));
      });
      std::vector<float> images(64 * 64 * 3, 0.5f);
      std::vector<YoloTruth> truths(kYoloMaxTruths);
      std::vector<int> counts{1};
      truths[0] = YoloTruth{0.5f, 0.5f, 0.3f, 0.3f, 1};
      yolo::testing::UploadedBatch batch(device, images, truths, counts);
      ex.train_micro_batch(batch.image_data(), batch.truth_data(), batch.count_data(), nullptr, false);
      if (!overlap) start_all_reduce(0, ex.parameter_count());
      else comm.all_reduce_sum(ex.gradients(), 0, stream);
      comm.wait(stream);
      stream.synchronize();
    });
    for (int r = 0; r < world; ++r) {
      CHECK(errors[r].empty());
      CHECK(held_ok[r] == (overlap ? 1 : 0));
    }
  }
}

// train_detector over 2 and 3 replicas, the hash check every step; a trace of the 2-replica
// run; the naive schedule gives the overlapped one's bits; validation on every rank.
void check_train_detector_replicas(DeviceKind kind) {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  ModelSpec spec = parse_model(parse_cfg_text(kTinyDetectorCfg, "tiny.cfg"));
  TrainOptions o = tiny_dp_options("", 4);
  for (int world : {2, 3}) {
    o.out_dir = dir / ("dp" + std::to_string(world));
    o.trace_file = world == 2 ? dir / "dp2.json" : "";
    TrainResult r = train_detector(spec, dataset, yolo::testing::replica_devices(kind, world), o);
    CHECK(r.iterations == 4);
    CHECK(std::isfinite(r.last_loss));
  }
  o.trace_file.clear();
  // The trace: a process per rank; all-reduce events on each rank's comm lane, host-thread
  // spans on its host lane.
  data::JsonValue trace = data::read_json_file(dir / "dp2.json");
  double backward_end = 0, first_comm = 1e300;
  int comm[2] = {0, 0}, host[2] = {0, 0}, copy[2] = {0, 0};
  for (const data::JsonValue& e : trace.find("traceEvents")->items) {
    const data::JsonValue* cat = e.find("cat");
    if (!cat) continue;
    int pid = static_cast<int>(e.find("pid")->number);
    REQUIRE((pid == 0 || pid == 1));
    double ts = e.find("ts")->number, dur = e.find("dur")->number;
    if (cat->string == "backward" && pid == 0) backward_end = std::max(backward_end, ts + dur);
    if (cat->string == "comm") {
      ++comm[pid];
      if (pid == 0) first_comm = std::min(first_comm, ts);
      CHECK(e.find("name")->string.rfind("allreduce bucket ", 0) == 0);
      CHECK(e.find("tid")->number == 1);
    }
    if (cat->string == "host") {
      ++host[pid];
      CHECK(e.find("tid")->number == 3);
    }
    if (cat->string == "copy") {
      ++copy[pid];
      CHECK(e.find("tid")->number == 2);
      CHECK(e.find("name")->string.rfind("copy batch (", 0) == 0);
    }
  }
  CHECK(comm[0] == 3);  // one bucket per layer with parameters
  CHECK(comm[1] == 3);
  CHECK(host[0] >= 3);  // data wait, forward + backward, wait for all-reduce, optimizer, hash check
  CHECK(host[1] >= 3);
  CHECK(copy[0] == 1);  // one micro-batch per step: the next step's, taken while this one runs
  CHECK(copy[1] == 1);
  MESSAGE("first all-reduce at " << first_comm << " us, backward ends at " << backward_end << " us");
  // The naive schedule gives the same parameters as the overlapped one (same sums, same order).
  o.out_dir = dir / "naive";
  o.overlap = false;
  train_detector(spec, dataset, yolo::testing::replica_devices(kind, 2), o);
  CHECK(file_bytes(dir / "naive/last.weights") == file_bytes(dir / "dp2/last.weights"));
  // Validation every epoch: every rank evaluates (rank 0 reports), none waits for another.
  o.out_dir = dir / "valid";
  o.overlap = true;
  o.valid_every = 1;
  TrainResult validated = train_detector(spec, dataset, yolo::testing::replica_devices(kind, 2), o);
  CHECK(validated.best_map50 >= 0);
  CHECK(std::filesystem::exists(dir / "valid/best.weights"));
  o.valid_every = 0;
  // A batch that does not split evenly over the replicas is refused with the numbers.
  o.batch = 5;
  CHECK_THROWS_WITH_AS(train_detector(spec, dataset, yolo::testing::replica_devices(kind, 2), o),
                       doctest::Contains("subdivisions x replicas = 1 x 2"), Error);
}

// The MLP (no BatchNorm) on N replicas with batch B/N ends with the weights of 1 with batch B.
void check_mlp_replicas(DeviceKind kind, std::vector<int> worlds) {
  TempDir dir;
  ModelSpec spec = parse_model(parse_cfg_text(kSmallMlpCfg, "mlp.cfg"));
  data::MnistSet mnist = data::synthetic_mnist(12 * 13, 3);
  TrainOptions o = yolo::testing::small_mlp_options();
  auto params_after = [&](int world) {
    o.out_dir = dir / ("mlp" + std::to_string(world));
    TrainResult r = train_classifier(spec, mnist, yolo::testing::replica_devices(kind, world), o);
    REQUIRE(r.iterations == 10);
    return read_checkpoint(r.checkpoint_path).tensors.at(0).second;  // "params"
  };
  std::vector<float> one = params_after(1);
  Executor fresh(build_graph(spec), Device::cpu(), 1, o.seed);
  std::vector<float> initial = fresh.download("params");
  double moved = 0, norm = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    moved = std::max(moved, static_cast<double>(std::fabs(one[i] - initial[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(one[i])));
  }
  CHECK(moved > 1e-3 * norm);  // training changed the weights far beyond the tolerance below
  for (int world : worlds) {
    CAPTURE(world);
    std::vector<float> many = params_after(world);
    REQUIRE(many.size() == one.size());
    double worst = 0;
    for (size_t i = 0; i < one.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(many[i]) - one[i]) / (std::fabs(one[i]) + 1e-2 * norm));
    MESSAGE("world " << world << ": worst relative difference " << worst);
    CHECK(worst <= 1e-5);
  }
}

// --sync-bn: N replicas with batch B/N train the BatchNorm detector as 1 replica with batch B;
// per-replica statistics are far further off.
void check_sync_bn(DeviceKind kind) {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  ModelSpec spec = parse_model(parse_cfg_text(kTinyDetectorCfg, "tiny.cfg"));
  TrainOptions o = tiny_dp_options("", 4);
  auto train = [&](int world, bool sync) {
    o.sync_bn = sync;
    o.out_dir = dir / ("w" + std::to_string(world) + (sync ? "sync" : ""));
    TrainResult r = train_detector(spec, dataset, yolo::testing::replica_devices(kind, world), o);
    REQUIRE(r.iterations == 4);
    Checkpoint ckpt = read_checkpoint(r.checkpoint_path);
    return std::make_pair(ckpt.tensors.at(0).second, ckpt.tensors.at(2).second);  // params, BN statistics
  };
  auto [one, one_stats] = train(1, false);
  double norm = 0;
  for (float v : one) norm = std::max(norm, static_cast<double>(std::fabs(v)));
  auto worst = [&](const std::vector<float>& a, const std::vector<float>& b, double scale) {
    REQUIRE(a.size() == b.size());
    double w = 0;
    for (size_t i = 0; i < a.size(); ++i)
      w = std::max(w, std::fabs(static_cast<double>(a[i]) - b[i]) / (std::fabs(b[i]) + 1e-2 * scale));
    return w;
  };
  for (int world : {2, 3}) {
    CAPTURE(world);
    auto [synced, synced_stats] = train(world, true);
    auto [local, local_stats] = train(world, false);
    double with_sync = worst(synced, one, norm), without = worst(local, one, norm);
    double stats_with_sync = worst(synced_stats, one_stats, 1), stats_without = worst(local_stats, one_stats, 1);
    MESSAGE("world " << world << ": parameters differ from 1 replica by " << with_sync << " with --sync-bn, "
                     << without << " without; running statistics " << stats_with_sync << " / " << stats_without);
    CHECK(with_sync <= 5e-4);  // CPU: measured 5e-5 (2 replicas), 3e-6 (3): sums in another order
    CHECK(stats_with_sync <= 1e-5);
    CHECK(without > 100 * with_sync);  // per-replica statistics really are different
    CHECK(stats_without > 100 * stats_with_sync);
  }
}

}  // namespace

TEST_CASE("replicas (CPU): different local gradients, identical parameters after each all-reduced step") {
  for (int world : {2, 3}) check_replicas_agree(DeviceKind::Cpu, world);
}

TEST_CASE("replicas (emu:0,1 and emu:0,1,2): different local gradients, identical parameters after each step") {
  if (!emulated_gpus_here()) SKIP_TEST(kNoEmulatedGpus);
  for (int world : {2, 3}) check_replicas_agree(DeviceKind::Emu, world);
}

TEST_CASE("overlap is real (CPU): backward of layer 0 can wait for the first bucket's all-reduce to start") {
  check_overlap_is_real(DeviceKind::Cpu);
}

TEST_CASE("overlap is real (emulated GPUs): layer 0's backward can wait for the first bucket's all-reduce") {
  if (!emulated_gpus_here()) SKIP_TEST(kNoEmulatedGpus);
  check_overlap_is_real(DeviceKind::Emu);
}

TEST_CASE("train_detector on cpu:2 and cpu:3: hash-checked every step, overlapped buckets and the naive schedule") {
  check_train_detector_replicas(DeviceKind::Cpu);
}

TEST_CASE("train_detector on emu:0,1 and emu:0,1,2: hash-checked every step, overlapped and naive schedules") {
  if (!emulated_gpus_here()) SKIP_TEST(kNoEmulatedGpus);
  check_train_detector_replicas(DeviceKind::Emu);
}

TEST_CASE("MLP (CPU): N replicas with batch B/N give the weights of 1 replica with batch B (10 steps)") {
  check_mlp_replicas(DeviceKind::Cpu, {2, 3, 4});
}

TEST_CASE("MLP (emulated GPUs): emu:0..N-1 with batch B/N give the weights of emu:0 with batch B") {
  if (!emulated_gpus_here()) SKIP_TEST(kNoEmulatedGpus);
  check_mlp_replicas(DeviceKind::Emu, {2, 3});
}

TEST_CASE("--sync-bn (CPU): N replicas with batch B/N train the BatchNorm detector as 1 replica with batch B") {
  check_sync_bn(DeviceKind::Cpu);
}

TEST_CASE("--sync-bn (emulated GPUs): N replicas with batch B/N train as 1 replica with batch B") {
  if (!emulated_gpus_here()) SKIP_TEST(kNoEmulatedGpus);
  check_sync_bn(DeviceKind::Emu);
}

// ---- ranks as processes (a launched job over the file:// rendezvous and sockets) -----------

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

// One rank of the tiny detector's training, configured by the environment the test sets.
TEST_ROLE(train_rank) {
  LaunchInfo launch = detect_launch([](const char* name) { return std::getenv(name); });
  if (env_or("YOLO_TEST_QUIT_EARLY", "0") == "1") {
    std::fprintf(stderr, "rank %d: quitting before the rendezvous\n", launch.rank);
    return 3;
  }
  try {
    TrainOptions o = tiny_dp_options(env_or("YOLO_TEST_OUT", ""));
    o.launched = true;
    o.process_rank = launch.rank;
    o.process_world = launch.world;
    o.rendezvous = env_or("YOLO_TEST_RDV", "");
    o.comm_timeout = std::stod(env_or("YOLO_TEST_TIMEOUT", "30"));
    o.strict = env_or("YOLO_TEST_STRICT", "0") == "1";
    o.resume = env_or("YOLO_TEST_RESUME", "0") == "1";
    // A real SIGTERM, sent by rank 1 to itself before step TERM_AT + 1 (the handler the CLI installs).
    const int term_at = std::stoi(env_or("YOLO_TEST_TERM_AT", "-1"));
    install_stop_handlers();
    o.before_step = [term_at](Executor&, int rank, int64_t iteration) {
      if (rank == 1 && iteration == term_at) raise(SIGTERM);
    };
    ModelSpec spec = parse_model(parse_cfg_text(kTinyDetectorCfg, "tiny.cfg"));
    data::Dataset dataset = data::open_dataset(env_or("YOLO_TEST_DATA", ""));
    TrainResult result = train_detector(spec, dataset, {Device::cpu()}, o);
    if (result.stop == TrainStop::Signal) {
      std::fprintf(stderr, "rank %d: %s\n", launch.rank, result.stop_message.c_str());
      return kStoppedExitCode;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}

TEST_CASE("ranks as processes: 2 processes train as the in-process cpu:2 does, bit for bit; failures name the rank") {
  TempDir dir;
  data::Dataset dataset = yolo::testing::small_shapes_dataset(dir / "shapes");
  ModelSpec spec = parse_model(parse_cfg_text(kTinyDetectorCfg, "tiny.cfg"));
  train_detector(spec, dataset, std::vector<Device>(2, Device::cpu()), tiny_dp_options(dir / "threads"));
  auto read_log = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto rank_env = [&](int rank, const std::string& data, const std::string& rdv) {
    return std::vector<std::string>{"RANK=" + std::to_string(rank), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(rank),
                                    "YOLO_RENDEZVOUS_HOST=127.0.0.1", "YOLO_TEST_DATA=" + data,
                                    "YOLO_TEST_OUT=" + (dir / "mp"), "YOLO_TEST_RDV=" + rdv, "YOLO_TEST_TIMEOUT=20"};
  };
  const std::string data_file = dir / "shapes/shapes.data";

  SUBCASE("both ranks train; rank 0's weights equal the threads' bit for bit") {
    std::string rdv = "file://" + (dir / "job1.rdv");
    ChildProcess rank1("train_rank", rank_env(1, data_file, rdv), dir / "rank1.log");
    ChildProcess rank0("train_rank", rank_env(0, data_file, rdv), dir / "rank0.log");
    int code0 = rank0.wait(120), code1 = rank1.wait(30);
    INFO("rank 0 log:\n" << read_log(dir / "rank0.log") << "\nrank 1 log:\n" << read_log(dir / "rank1.log"));
    REQUIRE(code0 == 0);
    REQUIRE(code1 == 0);
    CHECK(read_log(dir / "mp/last.weights") == read_log(dir / "threads/last.weights"));
    CHECK_FALSE(std::filesystem::exists(dir / "job1.rdv"));  // rank 0 removed the meeting point
  }

  SUBCASE("SIGTERM to rank 1 only: both ranks stop after the same step, rank 0 saves; resumed, the threads' bits") {
    std::string rdv = "file://" + (dir / "job5.rdv");
    std::vector<std::string> env1 = rank_env(1, data_file, rdv);
    env1.push_back("YOLO_TEST_TERM_AT=1");
    ChildProcess rank1("train_rank", env1, dir / "rank1.log");
    ChildProcess rank0("train_rank", rank_env(0, data_file, rdv), dir / "rank0.log");
    int code0 = rank0.wait(120), code1 = rank1.wait(30);
    std::string log0 = read_log(dir / "rank0.log"), log1 = read_log(dir / "rank1.log");
    INFO("rank 0 log:\n" << log0 << "\nrank 1 log:\n" << log1);
    CHECK(code0 == kStoppedExitCode);
    CHECK(code1 == kStoppedExitCode);
    CHECK(log1.find("SIGTERM received: stopping after the step under way") != std::string::npos);
    CHECK(log1.find("rank 1: stopped by SIGTERM after step 2") != std::string::npos);
    CHECK(log0.find("rank 0: stopped: another rank was asked to after step 2") != std::string::npos);
    REQUIRE(read_checkpoint(dir / "mp/last.ckpt").iteration == 2);
    rdv = "file://" + (dir / "job6.rdv");
    std::vector<std::string> again1 = rank_env(1, data_file, rdv), again0 = rank_env(0, data_file, rdv);
    again1.push_back("YOLO_TEST_RESUME=1");
    again0.push_back("YOLO_TEST_RESUME=1");
    ChildProcess resumed1("train_rank", again1, dir / "rank1b.log");
    ChildProcess resumed0("train_rank", again0, dir / "rank0b.log");
    code0 = resumed0.wait(120), code1 = resumed1.wait(30);
    INFO("resumed rank 0 log:\n" << read_log(dir / "rank0b.log"));
    CHECK(code0 == 0);
    CHECK(code1 == 0);
    CHECK(read_log(dir / "mp/last.weights") == read_log(dir / "threads/last.weights"));
  }

  SUBCASE("a rank that fails mid-training (an unreadable image, --strict) stops the other, naming it") {
    // Rank 1 reads its own copy of the dataset, whose images are all garbage.
    std::filesystem::copy(dir / "shapes", dir / "bad", std::filesystem::copy_options::recursive);
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir / "bad"))
      if (entry.path().extension() == ".png") yolo::testing::write_text_file(entry.path().string(), "not a png");
    std::string rdv = "file://" + (dir / "job2.rdv");
    std::vector<std::string> env1 = rank_env(1, dir / "bad/shapes.data", rdv);
    env1.push_back("YOLO_TEST_STRICT=1");
    ChildProcess rank1("train_rank", env1, dir / "rank1.log");
    ChildProcess rank0("train_rank", rank_env(0, data_file, rdv), dir / "rank0.log");
    auto start = std::chrono::steady_clock::now();
    int code0 = rank0.wait(120), code1 = rank1.wait(30);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string log0 = read_log(dir / "rank0.log"), log1 = read_log(dir / "rank1.log");
    INFO("rank 0 log:\n" << log0 << "\nrank 1 log:\n" << log1);
    MESSAGE("rank 0: " << log0.substr(log0.rfind("error:")) << "rank 1: " << log1.substr(log1.rfind("error:")));
    CHECK(code1 == 3);
    CHECK(code0 == 3);
    CHECK(log1.find("not a png") == std::string::npos);  // the file's content is not echoed...
    CHECK(log1.find("(--strict)") != std::string::npos);  // ...its failure is reported, under --strict
    CHECK(log0.find("rank 1") != std::string::npos);       // rank 0 names the rank that failed
    CHECK(seconds < 20);                                   // and does not wait out its timeout
    CHECK_FALSE(std::filesystem::exists(dir / "mp/last.weights.tmp"));
  }

  SUBCASE("ranks whose datasets kept different items stop before the first step, saying so") {
    // Rank 1's copy lists one image fewer (as if a file had changed between the two scans).
    std::filesystem::copy(dir / "shapes", dir / "fewer", std::filesystem::copy_options::recursive);
    std::string list = read_log(dir / "fewer/train.txt");
    list.erase(list.rfind('\n', list.size() - 2) + 1);
    yolo::testing::write_text_file(dir / "fewer/train.txt", list);
    std::string rdv = "file://" + (dir / "job4.rdv");
    ChildProcess rank1("train_rank", rank_env(1, dir / "fewer/shapes.data", rdv), dir / "rank1.log");
    ChildProcess rank0("train_rank", rank_env(0, data_file, rdv), dir / "rank0.log");
    int code0 = rank0.wait(120), code1 = rank1.wait(30);
    std::string log0 = read_log(dir / "rank0.log");
    INFO("rank 0 log:\n" << log0);
    CHECK(code0 == 3);
    CHECK(code1 == 3);
    CHECK(log0.find("rank 1's training items differ from rank 0's") != std::string::npos);
  }

  SUBCASE("a rank that dies before the rendezvous: the other gives up within its timeout, naming it") {
    std::string rdv = "file://" + (dir / "job3.rdv");
    std::vector<std::string> env1 = rank_env(1, data_file, rdv), env0 = rank_env(0, data_file, rdv);
    env1.push_back("YOLO_TEST_QUIT_EARLY=1");
    env0.back() = "YOLO_TEST_TIMEOUT=3";
    ChildProcess rank1("train_rank", env1, dir / "rank1.log");
    ChildProcess rank0("train_rank", env0, dir / "rank0.log");
    auto start = std::chrono::steady_clock::now();
    int code0 = rank0.wait(60);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string log0 = read_log(dir / "rank0.log");
    INFO("rank 0 log:\n" << log0);
    MESSAGE("rank 0: " << log0.substr(log0.rfind("error:")) << " after " << seconds << " s");
    CHECK(rank1.wait(10) == 3);
    CHECK(code0 == 3);
    CHECK(log0.find("1") != std::string::npos);
    CHECK(log0.find("did not join") != std::string::npos);
    CHECK(seconds < 30);
  }
}
