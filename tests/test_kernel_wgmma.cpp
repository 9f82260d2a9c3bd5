// Hopper's building blocks (kernels/wgmma.cuh, tma.cuh) through a small warpgroup GEMM
// (tests/wgmma_test_kernels.h): wgmma m64nNk16 in BF16 and FP16 from shared memory in every
// swizzle mode, fed by a cp.async producer warp or by TMA boxes through a ring of
// mbarrier-guarded stages whose phases wrap, against an FP64 product of the same 16-bit inputs;
// the planted faults the emulation must catch (a missing mbarrier wait either way, a wrong
// swizzle, a missing proxy fence or wgmma.fence, a wrong expect_tx byte count); the tensor-map
// encoder's rules; and the run-time choice that refuses wgmma where no sm_90a code runs.
// Emulated in tests_emu; natively on an H100/H200 of a build with sm_90a code (skipped elsewhere).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/half_types.h"
#include "kernels/hopper.h"
#include "kernels/tma.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"
#include "tests/wgmma_test_kernels.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#include "tests/emu_fixtures.h"
#endif

using namespace yolo;
using namespace yolo::testing;

namespace {

struct GemmCase {
  WgmmaOperand type;
  int m, n, k;
  std::vector<uint16_t> a, b;     // 16-bit patterns, row-major, K contiguous
  std::vector<double> ref, size;  // C in FP64, and sum |a*b| per output (the tolerance's scale)
};

double value(WgmmaOperand type, uint16_t bits) {
  return type == WgmmaOperand::Bf16 ? double(to_float(Bf16{bits})) : double(to_float(Fp16{bits}));
}

GemmCase random_case(Rng& rng, WgmmaOperand type, int m, int n, int k) {
  GemmCase g{type, m, n, k, {}, {}, {}, {}};
  auto patterns = [&](size_t count) {
    std::vector<uint16_t> bits(count);
    for (uint16_t& h : bits) {
      const float x = rng.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, rng.integer(-3, 3));
      h = type == WgmmaOperand::Bf16 ? to_bf16(x).bits : to_fp16(x).bits;
    }
    return bits;
  };
  g.a = patterns(size_t(m) * k);
  g.b = patterns(size_t(n) * k);
  g.ref.assign(size_t(m) * n, 0.0);
  g.size.assign(size_t(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int kk = 0; kk < k; ++kk) {
        const double p = value(type, g.a[size_t(i) * k + kk]) * value(type, g.b[size_t(j) * k + kk]);
        g.ref[size_t(i) * n + j] += p;
        g.size[size_t(i) * n + j] += std::fabs(p);
      }
  return g;
}

std::vector<float> run(Device device, const GemmCase& g, WgmmaSwizzle swizzle, WgmmaFault fault,
                       WgmmaLoad load = WgmmaLoad::CpAsync) {
  DeviceArray<uint16_t> a(device, g.a), b(device, g.b);
  DeviceArray<float> c(device, size_t(g.m) * g.n);
  c.poison();
  launch_wgmma_gemm(g.type, swizzle, load, g.n, a.data(), b.data(), c.data(), g.m, g.k, fault);
  return c.download();
}

// Outputs off the FP64 product by more than FP32 accumulation over k explains (NaN counts).
int mismatches(const GemmCase& g, const std::vector<float>& c, std::string* first) {
  int wrong = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const double error = std::fabs(double(c[i]) - g.ref[i]);
    if (error <= 1e-5 * g.size[i] + 1e-30) continue;
    if (wrong++ == 0 && first)
      *first = "C[" + std::to_string(i / size_t(g.n)) + "][" + std::to_string(i % size_t(g.n)) + "] = " +
               std::to_string(c[i]) + ", expected " + std::to_string(g.ref[i]);
  }
  return wrong;
}

const WgmmaSwizzle kSwizzles[] = {WgmmaSwizzle::B128, WgmmaSwizzle::B64, WgmmaSwizzle::B32, WgmmaSwizzle::None};

// A K of one tile more than the ring holds, plus a partial tile: every stage's phase wraps.
int wrapping_k(WgmmaSwizzle s) { return wgmma_tile_k(s) * (kWgmmaStages + 1) + 8; }

}  // namespace

#define SKIP_WITHOUT_WGMMA() \
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)")

TEST_CASE("kernel: wgmma from cp.async-filled, mbarrier-guarded stages matches the FP64 product in every swizzle") {
  KERNEL_TEST_DEVICE(device);
  SKIP_WITHOUT_WGMMA();
  Rng rng;
  CAPTURE(rng.seed());
  for (WgmmaOperand type : {WgmmaOperand::Bf16, WgmmaOperand::Fp16})
    for (WgmmaSwizzle s : kSwizzles) {
      const std::string swizzle = wgmma_swizzle_name(s);
      const bool bf16 = type == WgmmaOperand::Bf16;
      CAPTURE(bf16);
      CAPTURE(swizzle);
      const GemmCase g = random_case(rng, type, rng.integer(1, 140), 64, wrapping_k(s));
      CAPTURE(g.m);
      CAPTURE(g.k);
      std::string first;
      CHECK_MESSAGE(mismatches(g, run(device, g, s, WgmmaFault::None), &first) == 0, first);
      if (s != WgmmaSwizzle::None) {
        const int wrong = mismatches(g, run(device, g, s, WgmmaFault::None, WgmmaLoad::Tma), &first);
        CHECK_MESSAGE(wrong == 0, "TMA: " << first);
      }
    }
  for (WgmmaOperand type : {WgmmaOperand::Bf16, WgmmaOperand::Fp16}) {  // the wide tile, once each
    const GemmCase g = random_case(rng, type, rng.integer(65, 127), 128, 136);
    CAPTURE(g.m);
    std::string first;
    CHECK_MESSAGE(mismatches(g, run(device, g, WgmmaSwizzle::B128, WgmmaFault::None), &first) == 0, first);
    const int wrong = mismatches(g, run(device, g, WgmmaSwizzle::B128, WgmmaFault::None, WgmmaLoad::Tma), &first);
    CHECK_MESSAGE(wrong == 0, "TMA: " << first);
  }
}

TEST_CASE("emulation: planted faults in the wgmma warpgroup GEMM are caught (waits, init, swizzle, fences, wait_group)") {
#if YOLO_EMULATED_KERNELS
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const GemmCase g = random_case(rng, WgmmaOperand::Bf16, rng.integer(1, 64), 64, wrapping_k(WgmmaSwizzle::B64));
  CHECK(mismatches(g, run(device, g, WgmmaSwizzle::B64, WgmmaFault::None), nullptr) == 0);
  // The emulation orders threads by the mbarriers' happens-before: a read no wait covers is named
  // whichever thread happened to run first.
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::SkipFullWait),
                       doctest::Contains("with nothing ordering the write before the read"), Error);
  // A producer that never waits runs phases ahead of the warpgroup, which then waits for a parity
  // the "full" mbarrier has already passed (on a GPU: a hang, or stages overwritten while read).
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::SkipEmptyWait),
                       doctest::Contains("can never pass its barriers"), Error);
  for (WgmmaSwizzle s : {WgmmaSwizzle::B128, WgmmaSwizzle::B64, WgmmaSwizzle::B32}) {
    const std::string swizzle = wgmma_swizzle_name(s);
    CAPTURE(swizzle);
    const GemmCase small = random_case(rng, WgmmaOperand::Fp16, 64, 64, wgmma_tile_k(s));
    CHECK(mismatches(small, run(device, small, s, WgmmaFault::WrongSwizzle), nullptr) > 0);
  }
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::NoProxyFence),
                       doctest::Contains("with no fence.proxy.async after it"), Error);
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::NoWgmmaFence),
                       doctest::Contains("with no wgmma.fence"), Error);
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::NoWaitGroup),
                       doctest::Contains("no wgmma.wait_group covered"), Error);
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::NoFullInit),
                       doctest::Contains("where no mbarrier.init made an mbarrier"), Error);
  // With TMA: the right run, a read no wait covers, and a transaction count that never reaches
  // zero (the phase never completes: a hang on a GPU).
  CHECK(mismatches(g, run(device, g, WgmmaSwizzle::B64, WgmmaFault::None, WgmmaLoad::Tma), nullptr) == 0);
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::SkipFullWait, WgmmaLoad::Tma),
                       doctest::Contains("with nothing ordering the write before the read"), Error);
  CHECK_THROWS_WITH_AS(run(device, g, WgmmaSwizzle::B64, WgmmaFault::WrongExpectTx, WgmmaLoad::Tma),
                       doctest::Contains("can never pass its barriers"), Error);
#else
  SKIP_TEST("the faults are races or rules a GPU does not report; the emulation checks them");
#endif
}

TEST_CASE("emulation: the wgmma twins are no kinder than the hardware (operands read at issue, TMA publishes its own bytes, mbarriers in shared memory, fenced inits, an unaligned base)") {
#if YOLO_EMULATED_KERNELS
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const WgmmaSwizzle s = WgmmaSwizzle::B128;
  const GemmCase g = random_case(rng, WgmmaOperand::Bf16, rng.integer(1, 64), 64, wrapping_k(s));
  CHECK(mismatches(g, run(device, g, s, WgmmaFault::None), nullptr) == 0);
  CHECK(mismatches(g, run(device, g, s, WgmmaFault::None, WgmmaLoad::Tma), nullptr) == 0);
  // An mbarrier.init the async proxy may not see yet: a TMA copy completing on it is reported
  // (where only threads use the barriers, nothing is).
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::NoInitFence, WgmmaLoad::Tma),
                       doctest::Contains("was not made visible to the async proxy"), Error);
  CHECK(mismatches(g, run(device, g, s, WgmmaFault::NoInitFence), nullptr) == 0);
  // wgmma reads its operands from its issue on: a stage released before the wait_group that
  // retires the reads is refilled under them; a "full" wait after the issue comes too late.
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::ReleaseBeforeWait),
                       doctest::Contains("the bytes changed before the wgmma.wait_group that covers it"), Error);
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::FullWaitAfterIssue),
                       doctest::Contains("with nothing ordering the write before the read"), Error);
  // A TMA copy's completion publishes the bytes it moved, not what its issuing thread wrote after
  // arriving (here B, copied by the producer itself).
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::BWrittenAfterArrive, WgmmaLoad::Tma),
                       doctest::Contains("written by thread 128 with nothing ordering the write before the read"), Error);
  // The mbarriers live in shared memory: a stage laid over them is caught at their next use.
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::BarrierInStage),
                       doctest::Contains("whose 8 bytes were overwritten since its last mbarrier operation"), Error);
  // The dynamic shared memory is only 16-byte aligned: a ring that does not find its 1024-byte
  // boundary puts descriptors and TMA boxes off their swizzle patterns.
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::UnalignedBase), doctest::Contains("swizzle"), Error);
  CHECK_THROWS_WITH_AS(run(device, g, s, WgmmaFault::UnalignedBase, WgmmaLoad::Tma),
                       doctest::Contains("where its swizzle pattern starts"), Error);
#else
  SKIP_TEST("the faults are races or rules a GPU does not report; the emulation checks them");
#endif
}

TEST_CASE("emulation: wgmma is chosen only where sm_90a code runs; the launcher refuses elsewhere") {
#if YOLO_EMULATED_KERNELS
  EmulatedDevicesReset reset;
  const int index = emu::kMaxDevices - 1;
  CHECK(current_device_runs_wgmma());  // no device current: the H200 preset
  emu::set_current_device(index);
  CHECK(current_device_runs_wgmma());
  emu::DeviceProps generic = emu::preset_for(90);
  generic.sm90a_code = false;
  for (const emu::DeviceProps& props : {emu::preset_for(80), emu::preset_for(75), generic}) {
    CAPTURE(props.name);
    emu::configure_device(index, props);
    CHECK_FALSE(current_device_runs_wgmma());
    CHECK_THROWS_WITH_AS(launch_wgmma_gemm(WgmmaOperand::Bf16, WgmmaSwizzle::B128, WgmmaLoad::CpAsync, 64, nullptr,
                                           nullptr, nullptr, 1, 8, WgmmaFault::None),
                         doctest::Contains("wgmma needs sm_90a code on an sm_90 device"), Error);
  }
#else
  SKIP_TEST("needs emulated devices of other architectures");
#endif
}

TEST_CASE("tensor maps: the encoder refuses what cuTensorMapEncodeTiled refuses, naming the rule") {
  alignas(128) static uint16_t data[64 * 64];
  const void* base = data;
  auto refused = [&](const void* p, uint64_t cols, uint64_t rows, uint64_t stride, uint32_t box_cols,
                     uint32_t box_rows, int swizzle) {
    try {
      tma::encode_2d(p, cols, rows, stride, box_cols, box_rows, swizzle);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const char* misaligned = static_cast<const char*>(base) + 8;
  CHECK(refused(misaligned, 64, 64, 128, 64, 64, 1).find("16-byte aligned") != std::string::npos);
  CHECK(refused(base, 60, 64, 120, 56, 64, 0).find("multiple of 16") != std::string::npos);
  CHECK(refused(base, 64, 64, 64, 64, 64, 0).find("hold a row") != std::string::npos);
  CHECK(refused(base, 64, 64, 128, 64, 257, 1).find("1..256") != std::string::npos);
  CHECK(refused(base, 64, 64, 128, 12, 64, 0).find("multiple of 16 bytes") != std::string::npos);
  CHECK(refused(base, 64, 64, 128, 64, 64, 2).find("wider than its 64-byte swizzle") != std::string::npos);
  CHECK(refused(base, 64, 64, 128, 64, 64, 4).find("not 0..3") != std::string::npos);
  // A swizzled map's base 128-byte aligned (the Programming Guide's rule), an unswizzled one's 16;
  // under the driver's rule (DriverBaseRule, the GPU check's probe) 16 for both.
  // (Natively a map the rules accept goes on to the driver's encoder, which may refuse host
  // memory, or be missing: there only the rule's own refusal is checked.)
  const char* off_128 = static_cast<const char*>(base) + 16;
  auto passes_rules = [&](int swizzle) {
    const std::string why = refused(off_128, 64, 63, 128, 64, 64, swizzle);
    return YOLO_EMULATED_KERNELS ? why == "accepted" : why.find("128-byte aligned") == std::string::npos;
  };
  CHECK(refused(off_128, 64, 63, 128, 64, 64, 1).find("must be 128-byte aligned") != std::string::npos);
  CHECK(passes_rules(0));
  const tma::DriverBaseRule driver_rule;
  CHECK(passes_rules(1));
}
