// wgmma_self_check (kernels/wgmma_check.h): on a device that runs the wgmma kernels as the PTX ISA
// says (a GPU natively; the emulated H200's twins) every case passes and every (precision, pass,
// source) is trusted; under emulation, with a fact of TF32 alone planted wrong (the twin rounds its
// operands) and the im2col encoder refusing every map (as only a driver would), exactly those
// keys fail (the refusal as a failed case, not an abort), the check runs every case to the end,
// and the planner and the convolutions keep the other keys on wgmma. The TF32 probe tells
// truncation from rounding. The per-device cache (kernels/device_verdicts.h) runs one check.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kernels/conv.h"
#include "kernels/device_verdicts.h"
#include "kernels/hopper.h"
#include "kernels/tc_plan.h"
#include "kernels/wgmma_check.h"
#include "runtime/device.h"
#include "runtime/fault.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/tc_tiling.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

const Precision kPrecisions[] = {Precision::Bf16, Precision::Fp16, Precision::Tf32};
const tc::TcPass kPasses[] = {tc::TcPass::Forward, tc::TcPass::BackwardData, tc::TcPass::BackwardWeights};
const WgmmaSource kSources[] = {WgmmaSource::Gather, WgmmaSource::Im2col};

// Every key the wgmma convolutions have: each pass in 16 bits, and TF32's forward and backward data.
bool key_exists(Precision p, tc::TcPass pass) { return p != Precision::Tf32 || pass != tc::TcPass::BackwardWeights; }

#if YOLO_EMU
// Plants faults for the scope.
struct Planted {
  std::vector<Fault> faults;
  explicit Planted(std::vector<Fault> f) : faults(std::move(f)) {
    for (Fault fault : faults) inject_fault(fault, true);
  }
  ~Planted() {
    for (Fault fault : faults) inject_fault(fault, false);
  }
};
#endif

}  // namespace

TEST_CASE("kernel: the wgmma self-check passes every case where wgmma follows the ISA, and trusts every key") {
  KERNEL_TEST_DEVICE(device);  // the check runs on the current device: the harness's
  (void)device;
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  const WgmmaVerdicts v = wgmma_self_check();
  for (const WgmmaCheckCase& c : v.cases) {
#if !YOLO_EMULATED_KERNELS
    MESSAGE("self-check: " << c.name() << ": " << (c.failure.empty() ? "ok" : c.failure));  // for gpu_check's log
#endif
    CHECK_MESSAGE(c.failure.empty(), c.name() << ": " << c.failure);
  }
  unsigned expected_mask = 0;
  for (Precision p : kPrecisions)
    for (tc::TcPass pass : kPasses) {
      for (WgmmaSource source : kSources) {
        CAPTURE(precision_name(p));
        CAPTURE(tc::pass_name(pass));
        CAPTURE(wgmma_source_name(source));
        CHECK(v.trusts(p, pass, source) == key_exists(p, pass));
      }
      if (key_exists(p, pass)) expected_mask |= tc::wgmma_pass_bit(p, pass);
    }
  CHECK(v.gathered_passes() == expected_mask);
  CHECK(v.failed_keys().empty());
}

TEST_CASE("emulation: a wgmma self-check case that fails or throws fails its own key alone; the planner and convolutions follow") {
#if YOLO_EMU
  KERNEL_TEST_DEVICE(device);
  WgmmaVerdicts v;
  {
    const Planted planted({Fault::Tf32RoundsOperands, Fault::TmaEncoderRefuses});
    v = wgmma_self_check();  // throws nothing: the refusals are failed cases
  }
  int tf32_gathered = 0, im2col = 0;
  for (const WgmmaCheckCase& c : v.cases) {
    CAPTURE(c.name());
    if (c.source == WgmmaSource::Im2col) {
      ++im2col;
      CHECK(c.failure.find("threw: im2col tensor map: cuTensorMapEncodeIm2col failed") == 0);
    } else if (c.precision == Precision::Tf32) {
      ++tf32_gathered;
      CHECK(c.failure.find("element ") == 0);  // the reference truncates: rounded operands are off
    } else {
      CHECK(c.failure.empty());
    }
  }
  CHECK(tf32_gathered == 4);  // forward and backward data at strides 1 and 2: every case ran
  CHECK(im2col == 21);
  for (Precision p : kPrecisions)
    for (tc::TcPass pass : kPasses) {
      CAPTURE(precision_name(p));
      CAPTURE(tc::pass_name(pass));
      CHECK(v.trusts(p, pass, WgmmaSource::Gather) == (key_exists(p, pass) && p != Precision::Tf32));
      CHECK_FALSE(v.trusts(p, pass, WgmmaSource::Im2col));
    }
  const std::vector<std::string> lines = v.failed_keys();
  REQUIRE(lines.size() == 2 + 8);  // tf32's two gathered keys, and every im2col key
  CHECK(lines[0].find("tf32 fwd, gathered: 2 of 2 cases failed (3x3 s1: element ") == 0);
  CHECK(lines[0].find("it runs on mma.sync instead") != std::string::npos);
  CHECK(lines[2].find("bf16 fwd, im2col: 5 of 5 cases failed") == 0);
  CHECK(lines[2].find("it runs on its gather instead") != std::string::npos);

  // The device answering with these verdicts: bf16 on wgmma (gathered, though im2col fits), tf32
  // on mma.sync.
  const EmulatedWgmmaVerdicts answering(v);
  CHECK(tc::current_gpu().wgmma_passes == v.gathered_passes());
  CHECK(current_device_trusts_wgmma(Precision::Bf16, tc::TcPass::Forward, WgmmaSource::Gather));
  CHECK_FALSE(current_device_trusts_wgmma(Precision::Bf16, tc::TcPass::Forward, WgmmaSource::Im2col));
  const TcTiling on_wgmma(-1, 0, 3);  // wgmma wherever the planner may put it
  const Conv2dShape s{1, 6, 5, 64, 128, 3, 1};
  CHECK(tc::choose_plan(conv2d_tc_problem(s, tc::TcPass::Forward, Precision::Bf16), tc::current_gpu()).wgmma);
  CHECK_FALSE(tc::choose_plan(conv2d_tc_problem(s, tc::TcPass::Forward, Precision::Tf32), tc::current_gpu()).wgmma);
  auto forward = [&]<typename T>(T) {
    const size_t in_n = size_t(s.n) * s.h * s.w * s.c_in, out_n = size_t(s.n) * s.out_h() * s.out_w() * s.c_out;
    DeviceArray<T> x(device, in_n), w(device, s.weight_count()), y(device, out_n);
    DeviceArray<unsigned char> ws(device, conv2d_forward_tc_workspace_bytes<T>(s) + 16);
    const WgmmaRan wgmma;
    const Im2colRan loads;
    conv2d_forward_tc<T>(s, NhwcView<const T>{x.data(), s.n, s.h, s.w, s.c_in, s.c_in}, w.data(), nullptr,
                         NhwcView<T>{y.data(), s.n, s.out_h(), s.out_w(), s.c_out, s.c_out}, ws.data(), ws.size(),
                         nullptr);
    wgmma.check(std::is_same_v<T, Bf16>);
    loads.check(false);
  };
  forward(Bf16{});
  forward(0.0f);
#else
  SKIP_TEST("the faults are planted in the emulation's twins");
#endif
}

TEST_CASE("kernel: the wgmma TF32 probe reads 32 where the tensor cores drop an FP32 operand's low 13 bits") {
  KERNEL_TEST_DEVICE(device);
  (void)device;
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  const double probe = wgmma_tf32_probe();
#if !YOLO_EMULATED_KERNELS
  MESSAGE("tf32 probe: " << probe << (probe == 32.0 ? " (truncates)" : probe == 32.03125 ? " (rounds)" : " (neither)"));
#endif
  CHECK(probe == 32.0);
#if YOLO_EMU
  const Planted planted({Fault::Tf32RoundsOperands});
  CHECK(wgmma_tf32_probe() == 32.03125);  // the probe tells the two apart
#endif
}

TEST_CASE("wgmma self-check cache: one check a device; asked from inside it, nothing; other threads wait; a throw fails the device") {
  DeviceVerdicts<int> cache("Run with YOLO_WGMMA=off");
  int runs = 0;
  const int* nested = reinterpret_cast<const int*>(&runs);  // anything but null until asked
  std::atomic<bool> other_started{false};
  const int* others = nullptr;
  std::thread other;
  const int* first = cache.get(3, [&] {
    ++runs;
    // The check's own kernels ask the planner, which asks again on this thread: no second check.
    if (runs == 1) nested = cache.get(3, [&] { return ++runs, 7; });
    other = std::thread([&] {
      other_started = true;
      others = cache.get(3, [&] { return ++runs, 8; });  // waits for this check, or finds its verdict
    });
    while (!other_started) std::this_thread::yield();
    return 5;
  });
  other.join();
  REQUIRE(first != nullptr);
  CHECK(*first == 5);
  CHECK(runs == 1);
  CHECK(nested == nullptr);
  REQUIRE(others != nullptr);
  CHECK(*others == 5);
  CHECK(cache.get(3, [] { return 9; }) == first);  // known: no check
  CHECK(cache.get(64, [] { return 9; }) == nullptr);
  // A check that throws: its caller gets the exception, every later question an error naming the advice.
  CHECK_THROWS_WITH_AS(cache.get(1, []() -> int { throw Error("hang"); }), "hang", Error);
  CHECK_THROWS_WITH_AS(cache.get(1, [] { return 1; }), doctest::Contains("could not finish there"), Error);
  CHECK_THROWS_WITH_AS(cache.get(1, [] { return 1; }), doctest::Contains("YOLO_WGMMA=off"), Error);
}
