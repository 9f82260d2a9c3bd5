// Dynamic loss scaling (graph/loss_scale.h): the policy step by step (halve and skip on an
// overflow, double after the growth interval of clean steps, the bounds), the disabled scaler,
// two scalers fed the same reduced answers staying identical, checkpoint state, and the device's
// copy of the scale following the host's.
#include <doctest/doctest.h>

#include "graph/loss_scale.h"
#include "kernels/sgd.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/test_support.h"

using yolo::Error;
using yolo::graph::LossScaler;

TEST_CASE("loss scale: overflow halves and skips, clean runs double, bounds hold") {
  LossScaler s(true, 65536.0f, 3);
  CHECK(s.scale() == 65536.0f);
  CHECK_FALSE(s.update(true));  // overflow: skipped
  CHECK(s.scale() == 32768.0f);
  CHECK(s.overflows() == 1);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 32768.0f);
  CHECK(s.clean_steps() == 2);
  CHECK(s.update(false));  // the third clean step in a row
  CHECK(s.scale() == 65536.0f);
  CHECK(s.clean_steps() == 0);
  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));  // an overflow resets the clean run
  CHECK(s.clean_steps() == 0);
  CHECK(s.scale() == 32768.0f);

  LossScaler low(true, LossScaler::kMin, 1);
  CHECK_FALSE(low.update(true));
  CHECK(low.scale() == LossScaler::kMin);  // never below 2^-24
  LossScaler high(true, LossScaler::kMax, 1);
  CHECK(high.update(false));
  CHECK(high.scale() == LossScaler::kMax);  // never above 2^24
  // Halving from 2^16 reaches a scale that fits a sum-of-batch loss in a few dozen skips at most.
  LossScaler settle(true);
  int skips = 0;
  while (settle.scale() > 1.0f && !settle.update(true)) ++skips;
  CHECK(skips == 16);
}

TEST_CASE("loss scale: disabled (bf16, tf32) it scales by 1 and only reports non-finite steps") {
  LossScaler s(false);
  CHECK(s.scale() == 1.0f);
  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1.0f);
  CHECK(s.overflows() == 0);
}

TEST_CASE("loss scale: replicas fed the same reduced answers stay identical; state round-trips") {
  LossScaler a(true, 65536.0f, 4), b(true, 65536.0f, 4);
  const bool answers[] = {true, true, false, false, false, false, false, true, false};
  for (bool nonfinite : answers) CHECK(a.update(nonfinite) == b.update(nonfinite));
  CHECK(a.scale() == b.scale());
  CHECK(a.clean_steps() == b.clean_steps());

  LossScaler c(true, 65536.0f, 4);
  c.restore(a.state(), "last.ckpt");
  CHECK(c.scale() == a.scale());
  CHECK(c.clean_steps() == a.clean_steps());
  CHECK(c.overflows() == a.overflows());
  for (bool nonfinite : answers) CHECK(c.update(nonfinite) == a.update(nonfinite));
  CHECK(c.scale() == a.scale());

  CHECK_THROWS_WITH_AS(c.restore({3.0f, 0, 0}, "last.ckpt"), doctest::Contains("last.ckpt: loss scale 3"), Error);
  CHECK_THROWS_WITH_AS(c.restore({1024.0f, 4, 0}, "last.ckpt"), doctest::Contains("step counts 4/0"), Error);
  CHECK_THROWS_AS(LossScaler(true, 0.0f), Error);
  CHECK_THROWS_AS(LossScaler(true, 1.0f, 0), Error);
}

// The device's copy of the scale (kernels/sgd.h: what a step queued ahead runs at) against the
// host's scaler, fed the same random overflows; from near each bound, so that the clamps come up.
TEST_CASE("loss scale: the device's copy (loss_scale_update_cuda) follows the host's scaler step for step") {
  KERNEL_TEST_DEVICE(device);
  yolo::testing::Rng rng;
  CAPTURE(rng.seed());
  for (float initial : {0x1p-22f, 0x1p22f, 1.0f}) {
    CAPTURE(initial);
    const int growth = rng.integer(1, 4);
    CAPTURE(growth);
    LossScaler host(true, initial, growth);
    yolo::testing::DeviceArray<yolo::LossScaleLive> live(device, std::vector<yolo::LossScaleLive>{{initial, 0}});
    yolo::testing::DeviceArray<int> flag(device, 1);
    for (int step = 0; step < 60; ++step) {
      CAPTURE(step);
      // Overflows in runs, at a rate that makes both bounds reachable from the start chosen.
      const int nonfinite = rng.integer(0, initial < 1.0f ? 9 : 2) == 0 ? rng.integer(1, 7) : 0;
      flag.upload({nonfinite});
      yolo::loss_scale_update_cuda(flag.data(), live.data(), growth, nullptr);
      host.update(nonfinite != 0);
      const yolo::LossScaleLive got = live.download()[0];
      REQUIRE(got.scale == host.scale());
      REQUIRE(got.clean == host.clean_steps());
    }
  }
  yolo::testing::DeviceArray<yolo::LossScaleLive> live(device, 1);
  yolo::testing::DeviceArray<int> flag(device, 1);
  CHECK_THROWS_WITH_AS(yolo::loss_scale_update_cuda(flag.data(), live.data(), 0, nullptr),
                       doctest::Contains("growth interval must be at least 1"), Error);
}
