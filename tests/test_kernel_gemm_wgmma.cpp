// gemm_nt_wgmma and gemm_nn_wgmma (kernels/gemm_wgmma.h), Hopper's first GEMMs (B K-major, and
// MN-major through wgmma's transpose): against the FP64 reference of the same 16-bit inputs at
// odd sizes (edges in m, n and k; a K that wraps the 4-stage ring), in BF16 and FP16, outputs
// poisoned first; their refusals. Emulated in tests_emu (the twins of
// runtime/emu/warpgroup.cpp also check its synchronisation on every run); natively on an
// H100/H200 of a build with sm_90a code, skipped elsewhere.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/gemm_wgmma.h"
#include "kernels/hopper.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/storage_check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// Outputs further from the reference (itself rounded to T) than two roundings of T and FP32
// accumulation over k explain. b_rows_k: B is [k][n] (gemm_nn_wgmma), else [n][k].
template <typename T>
void check_gemm(Device device, Rng& rng, int m, int n, int k, bool b_rows_k = false) {
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(b_rows_k);
  const std::vector<T> a = random_storage<T>(rng, size_t(m) * k, -4.0f, 4.0f, false);
  const std::vector<T> b = random_storage<T>(rng, size_t(n) * k, -4.0f, 4.0f, false);
  std::vector<T> want(size_t(m) * n);
  if (b_rows_k) gemm_nn_reference(a.data(), b.data(), want.data(), m, n, k);
  else gemm_nt_reference(a.data(), b.data(), want.data(), m, n, k);
  DeviceArray<T> d_a(device, a), d_b(device, b), d_c(device, want.size());
  d_c.poison();
  if (b_rows_k) gemm_nn_wgmma(d_a.data(), d_b.data(), d_c.data(), m, n, k, nullptr);
  else gemm_nt_wgmma(d_a.data(), d_b.data(), d_c.data(), m, n, k, nullptr);
  const std::vector<T> got = d_c.download();
  const double unit = std::is_same_v<T, Bf16> ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  int wrong = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = to_float(got[i]), w = to_float(want[i]);
    const double size = 4.0 * k;  // a scale for FP32 accumulation over k
    if (std::fabs(g - w) <= 2 * unit * std::fabs(w) + 1e-6 * size) continue;
    if (wrong++ == 0)
      first = "C[" + std::to_string(i / size_t(n)) + "][" + std::to_string(i % size_t(n)) + "] = " + std::to_string(g) +
              ", expected " + std::to_string(w);
  }
  CHECK_MESSAGE(wrong == 0, first);
}

}  // namespace

TEST_CASE("kernel: gemm_nt_wgmma matches the FP64 reference at odd sizes (bf16, fp16)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  check_gemm<Bf16>(device, rng, rng.integer(129, 200), rng.integer(1, 60) * 2, 64 * 4 + 8 * rng.integer(1, 7));
  check_gemm<Fp16>(device, rng, rng.integer(1, 100), 2 * rng.integer(65, 70) + 1, 8 * rng.integer(1, 12));
}

TEST_CASE("kernel: gemm_nn_wgmma (B MN-major) matches the FP64 reference at odd sizes (bf16, fp16)") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) SKIP_TEST("this device runs no sm_90a code (wgmma)");
  Rng rng;
  CAPTURE(rng.seed());
  check_gemm<Bf16>(device, rng, rng.integer(129, 200), 8 * rng.integer(17, 30), 64 * 4 + 8 * rng.integer(1, 7), true);
  check_gemm<Fp16>(device, rng, rng.integer(1, 100), 8 * rng.integer(1, 8), 8 * rng.integer(1, 12), true);
}

TEST_CASE("kernel: gemm_nt_wgmma refuses what TMA cannot describe, and devices without sm_90a code") {
  KERNEL_TEST_DEVICE(device);
  if (!current_device_runs_wgmma()) {
    CHECK_THROWS_WITH_AS(gemm_nt_wgmma<Bf16>(nullptr, nullptr, nullptr, 1, 1, 8, nullptr),
                         doctest::Contains("wgmma needs sm_90a code"), Error);
    return;
  }
  DeviceArray<Bf16> a(device, 64 * 16), c(device, 64);
  CHECK_THROWS_WITH_AS(gemm_nt_wgmma(a.data(), a.data(), c.data(), 8, 8, 12, nullptr),
                       doctest::Contains("k a positive multiple of 8"), Error);
  CHECK_THROWS_WITH_AS(gemm_nt_wgmma(a.data() + 1, a.data(), c.data(), 8, 8, 16, nullptr),
                       doctest::Contains("16-byte aligned"), Error);
}
