// The CUDA emulation (and, in a CUDA build with a GPU, the same kernels natively): shared
// memory tiling, warp-shuffle reductions, barriers with early-returning threads, atomics,
// votes and shuffles, 3D indexing, dynamic shared memory, determinism, and error reports.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "runtime/arena.h"
#include "runtime/check.h"
#include "tests/child_process.h"
#include "tests/emu_test_kernels.h"
#include "tests/kernel_harness.h"
#include "tests/op_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

TEST_CASE("kernel: tiled transpose of odd-sized matrices") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (auto [rows, cols] : {std::pair{37, 53}, {1, 70}, {65, 1}, {33, 32}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    std::vector<float> in = rng.floats(size_t(rows) * cols);
    DeviceArray<float> d_in(device, in), d_out(device, in.size());
    d_out.poison();
    launch_transpose_tiled(d_in.data(), d_out.data(), rows, cols);
    std::vector<float> out = d_out.download();
    long bad = -1;
    for (int r = 0; r < rows && bad < 0; ++r)
      for (int c = 0; c < cols; ++c)
        if (!(out[size_t(c) * rows + r] == in[size_t(r) * cols + c])) {
          bad = long(c) * rows + r;
          break;
        }
    CHECK(bad == -1);
  }
}

TEST_CASE("kernel: block reduction through warp shuffles") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 10007, blocks = 7;
  for (int threads : {32, 96, 256, 1024}) {
    CAPTURE(threads);
    std::vector<float> in = rng.floats(n);
    DeviceArray<float> d_in(device, in), d_partial(device, blocks);
    d_partial.poison();
    launch_block_sums(d_in.data(), n, d_partial.data(), blocks, threads);
    std::vector<float> partial = d_partial.download();
    std::vector<double> ref(blocks, 0.0);
    for (int i = 0; i < n; ++i) ref[size_t(i / threads) % blocks] += in[i];
    CHECK_CLOSE(partial, ref, 1e-4, 1e-4);

    // The same launch again: identical bits (no float atomics, fixed summation order).
    d_partial.poison();
    launch_block_sums(d_in.data(), n, d_partial.data(), blocks, threads);
    std::vector<float> again = d_partial.download();
    CHECK(std::memcmp(again.data(), partial.data(), partial.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("kernel: barrier phases with early-returning threads") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  for (auto [threads, active] : {std::pair{1024, 1000}, {77, 77}, {64, 5}, {33, 1}}) {
    CAPTURE(threads);
    CAPTURE(active);
    std::vector<float> in = rng.floats(size_t(threads));
    DeviceArray<float> d_in(device, in), d_out(device, size_t(threads));
    d_out.poison();
    launch_barrier_phases(d_in.data(), d_out.data(), threads, active);
    std::vector<float> out = d_out.download();
    int wrong = 0;
    for (int t = 0; t < active; ++t)
      if (!(out[t] == in[(t + 3) % active] * 2.0f + 1.0f)) ++wrong;
    CHECK(wrong == 0);
    for (int t = active; t < threads; ++t) CHECK(std::isnan(out[t]));  // never written
  }
}

TEST_CASE("kernel: atomics from many blocks") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 5003, bins = 13, blocks = 11;
  std::vector<int> in(n);
  for (int& v : in) v = rng.integer(0, 1000);
  std::vector<int> hist_ref(bins, 0);
  double total_ref = 0;
  for (int v : in) hist_ref[size_t(v % bins)]++, total_ref += v;
  DeviceArray<int> d_in(device, in), d_hist(device, std::vector<int>(bins, 0));
  DeviceArray<float> d_total(device, std::vector<float>{0.0f});
  DeviceArray<int> d_max(device, std::vector<int>{-1}), d_min(device, std::vector<int>{1 << 30}),
      d_cas(device, std::vector<int>{0});
  launch_atomics(d_in.data(), n, d_hist.data(), bins, d_total.data(), d_max.data(), d_min.data(),
                 d_cas.data(), blocks);
  CHECK(d_hist.download() == hist_ref);
  CHECK(d_total.download()[0] == float(total_ref));  // integers below 2^24: every order is exact
  CHECK(d_max.download()[0] == *std::max_element(in.begin(), in.end()));
  CHECK(d_min.download()[0] == *std::min_element(in.begin(), in.end()));
  CHECK(d_cas.download()[0] == n);
}

TEST_CASE("kernel: warp votes and shuffles") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int threads = 96;
  std::vector<int> in(threads);
  for (int& v : in) v = rng.integer(0, 100);
  DeviceArray<int> d_in(device, in), d_out(device, size_t(6 * threads));
  d_out.poison();
  launch_warp_ops(d_in.data(), d_out.data(), threads);
  std::vector<int> out = d_out.download();
  for (int t = 0; t < threads; ++t) {
    CAPTURE(t);
    int warp = t / 32 * 32, lane = t % 32, seg8 = t / 8 * 8, seg16 = lane / 16 * 16;
    unsigned ballot = 0;
    bool any = false, all = true;
    for (int l = 0; l < 32; ++l) {
      ballot |= unsigned(in[warp + l] & 1) << l;
      any = any || in[warp + l] > 90;
      all = all && in[warp + l] >= 0;
    }
    CHECK(unsigned(out[6 * t + 0]) == ballot);
    CHECK(out[6 * t + 1] == int(any));
    CHECK(out[6 * t + 2] == int(all));
    CHECK(out[6 * t + 3] == in[seg8 + (t - seg8 + 3) % 8]);
    CHECK(out[6 * t + 4] == (t - 2 >= seg8 ? in[t - 2] : in[t]));
    int down = lane + 3 < seg16 + 16 ? in[t + 3] : in[t];
    CHECK(out[6 * t + 5] == down + in[warp + (lane ^ 8)]);
  }
}

TEST_CASE("kernel: 3D grids of 3D blocks write every index once") {
  KERNEL_TEST_DEVICE(device);
  const unsigned gx = 3, gy = 2, gz = 5, bx = 7, by = 3, bz = 2;
  size_t total = size_t(gx) * gy * gz * bx * by * bz;
  DeviceArray<int> d_out(device, total);
  d_out.poison();
  launch_index_3d(d_out.data(), gx, gy, gz, bx, by, bz);
  std::vector<int> out = d_out.download();
  size_t i = 0, wrong = 0;
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x)
        for (unsigned tz = 0; tz < bz; ++tz)
          for (unsigned ty = 0; ty < by; ++ty)
            for (unsigned tx = 0; tx < bx; ++tx, ++i)
              wrong += out[i] != int(((z * 16 + y) * 16 + x) * 4096 + (tz * 16 + ty) * 16 + tx);
  CHECK(wrong == 0);
}

TEST_CASE("kernel: dynamic shared memory") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int n = 1000, threads = 192;
  std::vector<float> in = rng.floats(n);
  DeviceArray<float> d_in(device, in), d_out(device, size_t(n));
  d_out.poison();
  launch_reverse_dynamic_shared(d_in.data(), d_out.data(), n, threads);
  std::vector<float> out = d_out.download();
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    int base = i / threads * threads, count = std::min(threads, n - base);
    wrong += !(out[i] == in[base + count - 1 - (i - base)]);
  }
  CHECK(wrong == 0);
}

TEST_CASE("kernel: an invalid launch configuration is reported with the kernel and line") {
  KERNEL_TEST_DEVICE(device);
  DeviceArray<float> d_out(device, 2048);
  launch_with_block_size(d_out.data(), 1024);  // the limit itself is fine
  try {
    launch_with_block_size(d_out.data(), 1025);
    FAIL("a block of 1025 threads was accepted");
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK(what.find("write_index") != std::string::npos);
    CHECK(what.find("emu_test_kernels.cu:") != std::string::npos);
  }
}

TEST_CASE("emulation: a barrier that can never complete is reported, not hung") {
  if (!kernels_emulated()) SKIP_TEST("undefined behaviour on a GPU; only the emulation can report it");
  DeviceArray<float> d_out(Device::cpu(), 32);
  CHECK_THROWS_WITH_AS(launch_divergent_barrier(d_out.data()),
                       doctest::Contains("can never pass its barriers"), Error);
  // The emulation is usable again afterwards.
  Rng rng;
  std::vector<float> in = rng.floats(64);
  DeviceArray<float> d_in(Device::cpu(), in), d_t(Device::cpu(), 64);
  launch_transpose_tiled(d_in.data(), d_t.data(), 8, 8);
  CHECK(d_t.download()[1] == in[8]);
}

TEST_CASE("kernel: named barriers synchronise their own groups of warps") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int rounds = 5;
  const std::vector<float> in = rng.floats(128);
  DeviceArray<float> d_in(device, in), d_out(device, 128);
  d_out.poison();
  launch_named_barrier_groups(d_in.data(), d_out.data(), rounds);
  const std::vector<float> out = d_out.download();
  int wrong = 0;
  for (int t = 0; t < 128; ++t) {
    const int base = t / 64 * 64, r = rounds + t / 64;
    wrong += !(out[size_t(t)] == in[size_t(base + (t - base + r) % 64)]);
  }
  CHECK(wrong == 0);
}

TEST_CASE("emulation: named barriers used wrongly are reported") {
  if (!kernels_emulated()) SKIP_TEST("undefined behaviour on a GPU; only the emulation can report it");
  CHECK_THROWS_WITH_AS(launch_named_barrier_misuse(0), doctest::Contains("named barriers are 1..15"), Error);
  CHECK_THROWS_WITH_AS(launch_named_barrier_misuse(1), doctest::Contains("whole warps"), Error);
  CHECK_THROWS_WITH_AS(launch_named_barrier_misuse(2), doctest::Contains("with a count of 32"), Error);
  CHECK_THROWS_WITH_AS(launch_named_barrier_misuse(3), doctest::Contains("wait at named barrier 1"), Error);
}

TEST_CASE("emulation: an out-of-bounds write in a kernel is caught by AddressSanitizer") {
  if (!kernels_emulated() || !asan_enabled())
    SKIP_TEST("needs the emulated build under AddressSanitizer (build/tests_emu)");
  // The bad write runs in a child process: AddressSanitizer reports it there and exits non-zero.
  int status = 0;
  std::string report = output_of_forked(
      [] {
        Arena arena(Device::cpu(), 1 << 16, "oob-test");
        float* out = arena.allocate_array<float>(100, "out");
        launch_write_range(out, 100, 1);  // writes out[100]
      },
      &status);
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(report.find("AddressSanitizer") != std::string::npos);
  CHECK(report.find("write_index") != std::string::npos);  // the report names the kernel
}

TEST_CASE("emulation: launches from several host threads run one at a time and stay correct") {
  if (!kernels_emulated()) SKIP_TEST("a property of the emulation");
  Rng rng;
  CAPTURE(rng.seed());
  const int rows = 45, cols = 77;
  std::vector<float> in = rng.floats(size_t(rows) * cols);
  std::vector<std::vector<float>> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      DeviceArray<float> d_in(Device::cpu(), in), d_out(Device::cpu(), in.size());
      for (int repeat = 0; repeat < 3; ++repeat) launch_transpose_tiled(d_in.data(), d_out.data(), rows, cols);
      results[size_t(t)] = d_out.download();
    });
  for (std::thread& t : threads) t.join();
  for (const auto& r : results) {
    REQUIRE(r.size() == in.size());
    CHECK(r[size_t(5) * rows + 3] == in[size_t(3) * cols + 5]);
    CHECK(std::memcmp(r.data(), results[0].data(), r.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("kernel: warp operations with different masks in sequence") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<int> in(32);
  for (int& v : in) v = rng.integer(-50, 50);
  DeviceArray<int> d_in(device, in), d_out(device, 32);
  d_out.poison();
  launch_mixed_masks(d_in.data(), d_out.data());
  int low = 0, high = 0;
  for (int i = 0; i < 16; ++i) low += in[size_t(i)], high += in[size_t(i) + 16];
  CHECK(d_out.download() == std::vector<int>(32, 16 * low + high));
}

TEST_CASE("kernel: votes and __syncwarp after some lanes have exited") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  const int threads = 64, active = 41;  // warp 1 keeps 9 lanes
  std::vector<int> in(threads);
  for (int& v : in) v = rng.integer(0, 100);
  DeviceArray<int> d_in(device, in), d_out(device, size_t(2 * threads));
  d_out.poison();
  launch_votes_after_exit(d_in.data(), d_out.data(), threads, active);
  std::vector<int> out = d_out.download();
  for (int t = 0; t < active; ++t) {
    CAPTURE(t);
    unsigned ballot = 0;
    for (int l = t / 32 * 32; l < std::min(t / 32 * 32 + 32, active); ++l) ballot |= unsigned(in[size_t(l)] & 1) << (l % 32);
    CHECK(unsigned(out[size_t(2 * t)]) == ballot);
    CHECK(out[size_t(2 * t + 1)] == 1);
  }
  for (int t = active; t < threads; ++t) CHECK(out[size_t(2 * t)] == -1);  // still poisoned
}

TEST_CASE("emulation: kernels run in the launching thread's floating-point environment") {
  if (!kernels_emulated()) SKIP_TEST("the host rounding mode does not reach a GPU");
  std::vector<float> in{1.0f, 3.0f, 2.0f, 7.0f, -1.0f, 3.0f};
  std::vector<float> nearest(3), upward(3);
  std::vector<float> host_nearest(3), host_upward(3);
  volatile const float* v = in.data();  // volatile: divide at run time, in the current mode
  launch_divide_pairs(in.data(), nearest.data(), 3);
  for (int i = 0; i < 3; ++i) host_nearest[size_t(i)] = v[2 * i] / v[2 * i + 1];
  int saved = std::fegetround();
  std::fesetround(FE_UPWARD);
  launch_divide_pairs(in.data(), upward.data(), 3);
  for (int i = 0; i < 3; ++i) host_upward[size_t(i)] = v[2 * i] / v[2 * i + 1];
  std::fesetround(saved);
  CHECK(nearest == host_nearest);
  CHECK(upward == host_upward);
  CHECK(upward != nearest);  // the quotients are inexact: the two modes give different bits
}

TEST_CASE("emulation: after a deadlock every suspended thread unwinds (locals destroyed)") {
  if (!kernels_emulated()) SKIP_TEST("a property of the emulation");
  CHECK(launch_deadlock_counting_destructors() == 32);
  CHECK(launch_deadlock_counting_destructors() == 32);  // and the fiber pool is reusable
}

TEST_CASE("emulation: an exception in a kernel thread names the kernel, launch site and thread") {
  if (!kernels_emulated()) SKIP_TEST("device code cannot throw on a GPU");
  try {
    launch_throwing_kernel();
    FAIL("no exception");
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK(what.find("throwing_kernel") != std::string::npos);
    CHECK(what.find("emu_test_kernels.cu:") != std::string::npos);
    CHECK(what.find("thread (5,0,0)") != std::string::npos);
    CHECK(what.find("boom from thread 5") != std::string::npos);
  }
}
