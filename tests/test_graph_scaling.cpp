// The data-parallel scaling model: ring all-reduce arithmetic, bucket cutting, step times with
// and without overlap on a hand profile, the loader bound, and profiles from a trace or FLOPs.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "graph/scaling.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::graph;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

doctest::Approx near(double x) { return doctest::Approx(x).epsilon(1e-9); }

// 1 MiB per ms through a two-rank ring (2(n-1)/n = 1), 10 us per ring step.
Link mib_per_ms_link() { return Link{"hand", 10, kMiB / 1e6}; }

// Backward order: A (2 ms, 2 MiB), S (1 ms, no parameters), B (2 ms, 1 MiB), C (1 ms, 3 MiB).
// Gradients ready at 2 (A), 5 (B), 6 (C) ms into backward, which takes 6 ms; forward 10 ms,
// optimizer 1 ms: 17 ms of compute.
Profile hand_profile() {
  Profile p;
  p.source = "hand";
  p.batch = 8;
  p.forward_ms = 10;
  p.optimizer_ms = 1;
  p.backward = {{"3 conv", 2, static_cast<int64_t>(2 * kMiB)},
                {"2 shortcut", 1, 0},
                {"1 conv", 2, static_cast<int64_t>(kMiB)},
                {"0 conv", 1, static_cast<int64_t>(3 * kMiB)}};
  return p;
}

// A classifier: conv 8x8x3 -> 8x8x4 (3x3, BN: 108 weights + 4 biases + 4 scales = 116
// parameters, 2 x 108 x 64 = 13,824 FLOPs per image), connected 256 -> 5 (1280 + 5 = 1285
// parameters, 2,560 FLOPs), softmax.
Graph tiny_graph() {
  return build_graph(parse_model(parse_cfg_text("[net]\nwidth=8\nheight=8\nchannels=3\n"
                                                "[convolutional]\nfilters=4\nsize=3\nstride=1\npad=1\n"
                                                "batch_normalize=1\nactivation=leaky\n"
                                                "[connected]\noutput=5\nactivation=linear\n"
                                                "[softmax]\n",
                                                "tiny.cfg")));
}

std::string event(const std::string& name, const std::string& cat, double ts, double dur) {
  return "{\"name\":\"" + name + "\",\"cat\":\"" + cat + "\",\"ph\":\"X\",\"pid\":0,\"tid\":0,\"ts\":" +
         std::to_string(ts) + ",\"dur\":" + std::to_string(dur) + "}";
}

// A trace of tiny_graph as train_yolo writes it (one event a line, line 1 the opening).
std::string tiny_trace(const std::string& last_event) {
  return "{\"traceEvents\":[\n"
         "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"cpu\"}},\n" +
         event("0 conv", "forward", 0, 100) + ",\n" + event("1 connected", "forward", 100, 50) + ",\n" +
         event("2 softmax", "forward", 150, 10) + ",\n" + last_event + ",\n" +
         event("1 connected", "backward", 200, 80) + "\n]}\n";
}

void profile_tiny(const std::string& trace_text) {
  profile_from_trace(data::parse_json(trace_text, "t.json"), "t.json", tiny_graph(), 2, 0);
}

}  // namespace

TEST_CASE("ring all-reduce: 2(n-1)/n x bytes / bandwidth + 2(n-1) x latency, zero on one rank") {
  Link link{"hand", 10, 2};  // 2 GB/s = 2e6 bytes per ms, 0.01 ms per ring step
  CHECK(ring_allreduce_ms(4e6, 1, link) == 0);
  CHECK(ring_allreduce_ms(4e6, 2, link) == near(2.02));  // 1 x 4e6 / 2e6 = 2 ms, 2 steps x 0.01
  CHECK(ring_allreduce_ms(4e6, 8, link) == near(3.64));  // 1.75 x 2 ms = 3.5, 14 steps x 0.01
  CHECK(ring_allreduce_ms(0, 8, link) == near(0.14));    // latency only
  // The presets: 1e9 bytes on 8 NVLink-4 GPUs: 1.75 x 1e9 / 370e6 ms + 14 x 0.005 ms.
  CHECK(ring_allreduce_ms(1e9, 8, link_preset("nvlink4")) == near(1.75e9 / 370e6 + 0.07));
  // 1e8 bytes on 2 PCIe-3 GPUs: 1e8 / 1e7 = 10 ms + 2 x 0.01.
  CHECK(ring_allreduce_ms(1e8, 2, link_preset("pcie3")) == near(10.02));
  CHECK_THROWS_WITH_AS(ring_allreduce_ms(1, 0, link), doctest::Contains("0 ranks"), Error);
  CHECK_THROWS_WITH_AS(ring_allreduce_ms(-1, 2, link), doctest::Contains("-1 bytes"), Error);
  CHECK_THROWS_WITH_AS(ring_allreduce_ms(1, 2, Link{"dead", 1, 0}), doctest::Contains("link 'dead'"), Error);
  CHECK_THROWS_WITH_AS(link_preset("nvlink9"), doctest::Contains("unknown link 'nvlink9'"), Error);
  CHECK_THROWS_WITH_AS(device_preset("a100"), doctest::Contains("unknown device 'a100'"), Error);
}

TEST_CASE("buckets: 0 = one layer each, a cap in MiB groups consecutive layers, a big cap one bucket") {
  Profile p;
  p.batch = 1;
  // Backward order: 1, 2, (none), 1, 3 MiB, each 1 ms: ready at 1, 2, 4, 5 ms.
  for (double mib : {1.0, 2.0, 0.0, 1.0, 3.0}) p.backward.push_back({"x", 1, static_cast<int64_t>(mib * kMiB)});
  auto sizes = [&](double cap) {
    std::vector<double> out;
    for (const Bucket& b : cut_buckets(p, cap)) out.push_back(b.bytes / kMiB);
    return out;
  };
  CHECK(sizes(0) == std::vector<double>{1, 2, 1, 3});
  CHECK(sizes(0.5) == std::vector<double>{1, 2, 1, 3});  // each layer over the cap: alone
  CHECK(sizes(3) == std::vector<double>{3, 1, 3});       // 1+2 fits; +1 would be 4
  CHECK(sizes(4) == std::vector<double>{4, 3});
  CHECK(sizes(100) == std::vector<double>{7});
  std::vector<Bucket> three = cut_buckets(p, 3);
  REQUIRE(three.size() == 3);
  CHECK(three[0].ready_ms == 2);
  CHECK(three[0].layers == 2);
  CHECK(three[1].ready_ms == 4);  // the layer without gradients delays it
  CHECK(three[2].ready_ms == 5);
  CHECK(cut_buckets(p, 100)[0].ready_ms == 5);
  CHECK_THROWS_WITH_AS(cut_buckets(p, -1), doctest::Contains("bucket size -1 MB"), Error);
}

TEST_CASE("the trainer's buckets follow the same rule, and the default gives a small net several") {
  CHECK(group_layers({5, 5, 5}, 0) == std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}, {2, 3}});
  const int64_t mib = static_cast<int64_t>(kMiB);
  CHECK(group_layers({mib, 2 * mib, mib, 3 * mib}, 3) == std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 3}, {3, 4}});
  CHECK(group_layers({}, 4).empty());
  CHECK(default_bucket_mb(236 * mib) == 4);
  CHECK(default_bucket_mb(2 * mib) == 0.5);  // a quarter: the demo net's 1.5 MiB get several buckets
  // The demo net, as the trainer cuts it by default: more than one bucket, so backward can hide one.
  Graph demo = build_graph(read_model("models/demo.cfg"));
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (int i = static_cast<int>(demo.nodes.size()) - 1; i >= 0; --i)
    if (int64_t n = demo.nodes[i].trainable(); n > 0) {
      bytes.push_back(n * 4);
      total += n * 4;
    }
  CHECK(group_layers(bytes, default_bucket_mb(total)).size() >= 3);
}

TEST_CASE("step times of a hand profile on two GPUs, with and without overlap") {
  Profile p = hand_profile();
  ScalingSetup setup{mib_per_ms_link(), 0};
  CHECK(p.backward_ms() == 6);
  CHECK(p.gradient_bytes() == static_cast<int64_t>(6 * kMiB));

  // One GPU: no communication, 17 ms.
  Prediction one = predict_step(p, setup, 1, 0, true);
  CHECK(one.step_ms == near(17));
  CHECK(one.exposed_comm_ms == near(0));
  CHECK(one.efficiency == near(1));
  CHECK(one.images_per_s == near(8 / 0.017));

  // Per layer: all-reduces of 2, 1, 3 MiB take 2.02, 1.02, 3.02 ms. A runs 2 -> 4.02; B is
  // ready at 5: 5 -> 6.02; C is ready at 6 but the stream is busy: 6.02 -> 9.04.
  // Overlap: 10 + max(6, 9.04) + 1 = 20.04, exposed 3.04 (15% of the step: communication binds).
  Prediction layer = predict_step(p, setup, 2, 0, true);
  CHECK(layer.buckets == 3);
  CHECK(layer.allreduce_ms == near(6.06));
  CHECK(layer.step_ms == near(20.04));
  CHECK(layer.exposed_comm_ms == near(3.04));
  CHECK(layer.efficiency == near(17 / 20.04));
  CHECK(layer.images_per_s == near(16 / 0.02004));
  CHECK(layer.binding == Binding::Communication);
  // Without overlap: 17 + 6.06 = 23.06.
  Prediction serial = predict_step(p, setup, 2, 0, false);
  CHECK(serial.step_ms == near(23.06));
  CHECK(serial.exposed_comm_ms == near(6.06));

  // 3 MiB buckets: [A, B] ready at 5 -> 8.02, [C] ready at 6, starts 8.02 -> 11.04.
  // Overlap: 10 + 11.04 + 1 = 22.04; without: 17 + 2 x 3.02 = 23.04.
  CHECK(predict_step(p, setup, 2, 3, true).step_ms == near(22.04));
  CHECK(predict_step(p, setup, 2, 3, true).exposed_comm_ms == near(5.04));
  CHECK(predict_step(p, setup, 2, 3, false).step_ms == near(23.04));
  // One bucket: 6 MiB ready at 6 -> 12.02: 23.02 either way.
  CHECK(predict_step(p, setup, 2, 64, true).step_ms == near(23.02));
  CHECK(predict_step(p, setup, 2, 64, false).step_ms == near(23.02));
  CHECK(best_bucket_mb(p, setup, 2, {64, 3, 0, 1}) == 0);  // 20.04 is the shortest (1 MiB: the same 3 buckets)
  CHECK(best_bucket_mb(p, setup, 2, {64, 3}) == 3);         // 22.04 < 23.02

  // Four GPUs: factor 2 x 3/4 = 1.5, 6 ring steps x 0.01: 3.06, 1.56, 4.56 ms.
  // A 2 -> 5.06; B 5.06 -> 6.62; C 6.62 -> 11.18: step 10 + 11.18 + 1 = 22.18.
  CHECK(predict_step(p, setup, 4, 0, true).step_ms == near(22.18));

  // A link so fast that only a sliver of the last all-reduce shows: compute binds.
  ScalingSetup fast{Link{"fast", 0, 1e6}, 0};
  Prediction quick = predict_step(p, fast, 8, 0, true);
  CHECK(quick.step_ms == doctest::Approx(17).epsilon(1e-6));
  CHECK(quick.binding == Binding::Compute);
  // All steps within 0.1% of each other: the fewest buckets wins (64 MiB: one).
  CHECK(best_bucket_mb(p, fast, 8, {0, 3, 64, 100}) == 64);
  CHECK_THROWS_WITH_AS(predict_step(p, setup, 0, 0, true), doctest::Contains("GPU count 0"), Error);
}

TEST_CASE("a loader slower than the GPUs sets the step") {
  Profile p = hand_profile();
  // 400 images/s: one GPU's 8 images take 20 ms (> 17), two GPUs' 16 take 40 ms (> 20.04).
  ScalingSetup setup{mib_per_ms_link(), 400};
  Prediction two = predict_step(p, setup, 2, 0, true);
  CHECK(two.loader_ms == near(40));
  CHECK(two.step_ms == near(40));
  CHECK(two.images_per_s == near(400));
  CHECK(two.binding == Binding::Loader);
  CHECK(two.exposed_comm_ms == near(3.04));  // still what the network adds to the GPUs' step
  CHECK(two.efficiency == near(0.5));        // 20 / 40
  // 10,000 images/s: 1.6 ms for 16 images, the GPUs bind again.
  ScalingSetup plenty{mib_per_ms_link(), 10000};
  CHECK(predict_step(p, plenty, 2, 0, true).step_ms == near(20.04));
  CHECK(predict_step(p, plenty, 2, 0, true).binding == Binding::Communication);
  ScalingSetup broken{mib_per_ms_link(), -1};
  CHECK_THROWS_WITH_AS(predict_step(p, broken, 2, 0, true), doctest::Contains("loader throughput"), Error);
}

TEST_CASE("profile from a trace: forward summed, backward in time order with gradient bytes") {
  // The conv's backward comes first in the file but later in time.
  std::string text = tiny_trace(event("0 conv", "backward", 300, 250));
  Profile p = profile_from_trace(data::parse_json(text, "t.json"), "t.json", tiny_graph(), 2, 0.5);
  CHECK(p.batch == 2);
  CHECK(p.forward_ms == near(0.16));
  CHECK(p.optimizer_ms == 0.5);
  REQUIRE(p.backward.size() == 2);
  CHECK(p.backward[0].name == "1 connected");
  CHECK(p.backward[0].backward_ms == near(0.08));
  CHECK(p.backward[0].grad_bytes == 4 * 1285);
  CHECK(p.backward[1].name == "0 conv");
  CHECK(p.backward[1].backward_ms == near(0.25));
  CHECK(p.backward[1].grad_bytes == 4 * 116);
  CHECK(p.source.find("measured") != std::string::npos);

  // The same through a file.
  testing::TempDir dir;
  testing::write_text_file(dir / "trace.json", text);
  CHECK(read_trace_profile(dir / "trace.json", tiny_graph(), 2, 0).backward_ms() == near(0.33));
  testing::write_text_file(dir / "cut.json", text.substr(0, text.size() / 2));
  CHECK_THROWS_WITH_AS(read_trace_profile(dir / "cut.json", tiny_graph(), 2, 0), doctest::Contains("cut.json"), Error);
}

TEST_CASE("profile from a trace: errors name the file and the event's line") {
  // Line 6 holds the event under test.
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("7 conv", "backward", 300, 1))),
                       doctest::Contains("t.json:6: layer 7 is not in tiny.cfg"), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("0 max", "backward", 300, 1))),
                       doctest::Contains("t.json:6: layer 0 is a max here but a conv"), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("1 connected", "forward", 300, 1))),
                       doctest::Contains("t.json:6: a second forward event for layer 1"), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("0 conv", "backward", 300, -4))),
                       doctest::Contains("t.json:6: event \"0 conv\" needs a \"dur\""), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("0 conv", "backward", 300, 1e300))),
                       doctest::Contains("t.json:6: event \"0 conv\" needs a \"dur\""), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("conv", "backward", 300, 1))),
                       doctest::Contains("t.json:6: a backward event needs a \"name\""), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("99999999999 conv", "backward", 300, 1))),
                       doctest::Contains("t.json:6: a backward event needs a \"name\""), Error);
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace("[1]")),
                       doctest::Contains("t.json:6: a trace event must be an object, not an array"), Error);
  // Without the conv's backward (an event of another category instead): a layer with parameters is missing.
  CHECK_THROWS_WITH_AS(profile_tiny(tiny_trace(event("2 softmax", "instant", 0, 0))),
                       doctest::Contains("t.json:1: layer 0 (conv) has parameters but no backward event"), Error);
  CHECK_THROWS_WITH_AS(profile_tiny("{\"events\":[]}"), doctest::Contains("t.json:1: a Chrome trace is"), Error);
  CHECK_THROWS_WITH_AS(profile_tiny("[]"), doctest::Contains("t.json:1: no forward events"), Error);
}

TEST_CASE("profile from FLOPs: a tiny cfg by hand, YOLOv3's gradient bytes and presets") {
  // 1 GFLOP/s x efficiency 0.5 = 5e5 FLOPs per ms; batch 2. Memory 1 GB/s = 1e6 bytes per ms.
  DevicePreset device{"hand", 0.001, 1};
  Profile p = profile_from_flops(tiny_graph(), 2, device, 0.5);
  CHECK(p.forward_ms == near((13824 + 2560) * 2 / 5e5));  // 0.065536 ms
  REQUIRE(p.backward.size() == 2);                        // softmax: no FLOPs, no parameters
  CHECK(p.backward[0].name == "1 connected");
  CHECK(p.backward[0].backward_ms == near(2 * 2560 * 2 / 5e5));  // 0.02048
  CHECK(p.backward[0].grad_bytes == 4 * 1285);
  CHECK(p.backward[1].name == "0 conv");
  CHECK(p.backward[1].backward_ms == near(2 * 13824 * 2 / 5e5));  // 0.110592
  CHECK(p.backward[1].grad_bytes == 4 * 116);
  CHECK(p.optimizer_ms == near(20.0 * 1401 / 1e6));  // 20 bytes per parameter: 0.02802
  CHECK(p.source.find("FLOP-derived (not measured)") != std::string::npos);

  // YOLOv3-416 on the H200 preset: 61,949,149 parameters, 60.6 TFLOP/s x 0.5, 4260 GB/s.
  Graph yolo = build_graph(read_model("models/yolov3.cfg"));
  Profile h200 = profile_from_flops(yolo, 16, device_preset("h200"), 0.5);
  CHECK(h200.gradient_bytes() == 4 * 61949149LL);
  CHECK(h200.forward_ms == near(yolo.total_flops * 16 / (0.5 * 60.6e9)));
  CHECK(h200.backward_ms() == near(2 * h200.forward_ms));
  CHECK(h200.optimizer_ms == near(20.0 * 61949149 / 4260e6));
  CHECK(device_preset("t4").peak_tflops == 8.1);
  CHECK_THROWS_WITH_AS(profile_from_flops(yolo, 16, device, 0), doctest::Contains("efficiency 0 "), Error);
  CHECK_THROWS_WITH_AS(profile_from_flops(yolo, 0, device, 0.5), doctest::Contains("batch 0"), Error);
}

TEST_CASE("profile from FLOPs on 16-bit tensor cores: the tensor rate, floored by the layer's 16-bit bytes") {
  // Tensor rate 0.002 TFLOP/s x 0.5 = 1e6 FLOPs per ms; 1 GB/s = 1e6 bytes per ms; batch 2.
  DevicePreset device{"hand", 0.001, 1, 0.002};
  Profile p = profile_from_flops(tiny_graph(), 2, device, 0.5, ProfileMath::Tensor16);
  REQUIRE(p.backward.size() == 2);
  // The conv: 2 x 13,824 FLOPs = 0.027648 ms; bytes 2 x (2 x (192 + 256) + 108) = 2,008: 0.002008 ms.
  CHECK(p.backward[1].name == "0 conv");
  CHECK(p.backward[1].backward_ms == near(2 * 0.027648));
  // The connected layer: 2 x 2,560 FLOPs = 0.00512 ms; bytes 2 x (2 x (256 + 5) + 1,280) = 3,604:
  // 0.003604 ms: FLOPs bind both at this rate; at a 10x faster tensor rate the bytes bind it.
  CHECK(p.backward[0].backward_ms == near(2 * 0.00512));
  CHECK(p.forward_ms == near(0.027648 + 0.00512));
  device.tensor_tflops = 0.02;
  Profile fast = profile_from_flops(tiny_graph(), 2, device, 0.5, ProfileMath::Tensor16);
  CHECK(fast.backward[0].backward_ms == near(2 * 0.003604));   // bytes bind
  CHECK(fast.backward[1].backward_ms == near(2 * 0.0027648));  // FLOPs still bind the conv
  CHECK(fast.source.find("16-bit tensor cores") != std::string::npos);
  // FP32 on the same device ignores the tensor rate and the bytes.
  CHECK(profile_from_flops(tiny_graph(), 2, device, 0.5).forward_ms == near((13824 + 2560) * 2 / 5e5));
  CHECK(device_preset("t4").tensor_tflops == 65);
  CHECK_THROWS_WITH_AS(profile_from_flops(tiny_graph(), 2, DevicePreset{"none", 1, 1, 0}, 0.5, ProfileMath::Tensor16),
                       doctest::Contains("16-bit tensor-core TFLOP/s must be > 0"), Error);
}

TEST_CASE("a faster step: scale_compute multiplies forward and backward, not the optimizer or the gradients") {
  const Profile p = hand_profile();
  const Profile half = scale_compute(p, 0.5);
  CHECK(half.forward_ms == near(5));
  CHECK(half.backward_ms() == near(3));
  CHECK(half.optimizer_ms == near(1));
  CHECK(half.gradient_bytes() == p.gradient_bytes());
  REQUIRE(half.backward.size() == p.backward.size());
  for (size_t i = 0; i < p.backward.size(); ++i)
    CHECK(half.backward[i].backward_ms == near(p.backward[i].backward_ms / 2));
  CHECK(half.source.find("x 0.5") != std::string::npos);
  CHECK_THROWS_WITH_AS(scale_compute(p, 0), doctest::Contains("compute scale 0 "), Error);
  CHECK_THROWS_WITH_AS(scale_compute(p, std::nan("")), doctest::Contains("not a positive factor"), Error);
}
