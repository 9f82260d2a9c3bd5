// gemm on tensor cores (kernels/gemm_tc.cu) in TF32, BF16 and FP16, against the FP64 reference
// of the stored inputs, with the per-element and norm bounds of tests/tc_check.h: the three
// layouts the [connected] layer runs (A * B^T, A * B, A^T * B with an FP32 C), odd sizes, row
// pitches longer than the rows, bias, accumulate, every tile, split counts and both pipelines;
// nothing written outside C's rows; the same bits on a second run; unsupported layouts refused.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "runtime/check.h"
#include "tests/gemm_case.h"
#include "tests/kernel_harness.h"
#include "tests/tc_check.h"
#include "tests/tc_tiling.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::testing;

namespace {

// A gemm case and the tensor-core tiling it forces.
struct TcGemmCase : GemmCase {
  int tile = -1, splits = 0, pipeline = 0;
  std::string describe() const {
    return GemmCase::describe() + " tile " + std::to_string(tile) + " splits " + std::to_string(splits) +
           " pipeline " + std::to_string(pipeline);
  }
};

// Inputs T, C as Out (T, or float for A^T * B).
template <typename T, typename Out>
void check_gemm_tc(Device device, const TcGemmCase& c) {
  CAPTURE(c.describe());
  CAPTURE(precision_name(tc_precision<T>()));
  const GemmShape& s = c.s;
  Rng rng;
  CAPTURE(rng.seed());
  TcTiling tiling(c.tile, c.splits, c.pipeline);
  const std::vector<T> a = stored<T>(rng.floats(c.a_size())), b = stored<T>(rng.floats(c.b_size()));
  const std::vector<float> bias = rng.floats(size_t(s.n));
  std::vector<Out> start(c.c_size());
  std::memset(start.data(), 0xff, start.size() * sizeof(Out));
  for (size_t i = 0; i < start.size(); ++i)
    if (c.in_c(i) && c.accumulate) start[i] = from_float<Out>(rng.uniform(-1.0f, 1.0f));

  DeviceArray<T> d_a(device, a), d_b(device, b);
  DeviceArray<float> d_bias(device, bias);
  DeviceArray<Out> d_c(device, start);
  const size_t ws_bytes = gemm_tc_workspace_bytes<T, Out>(s);
  DeviceArray<unsigned char> ws(device, ws_bytes + 16);
  auto run = [&] {
    d_c.upload(start);
    gemm_tc<T, Out>(s, d_a.data(), d_b.data(), c.bias ? d_bias.data() : nullptr, d_c.data(), c.accumulate,
                    ws_bytes ? ws.data() : nullptr, ws_bytes, nullptr);
    return d_c.download();
  };
  const std::vector<Out> got = run();

  const std::vector<double> a64 = exact(a), b64 = exact(b), bias64(bias.begin(), bias.end());
  std::vector<double> ref = exact(start), mag;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!c.in_c(i)) ref[i] = 0.0;
  mag = absolute(ref);
  gemm_reference<double>(s, a64.data(), b64.data(), c.bias ? bias64.data() : nullptr, ref.data(), c.accumulate,
                         nullptr, 0);
  const std::vector<double> a_abs = absolute(a64), b_abs = absolute(b64), bias_abs = absolute(bias64);
  gemm_reference<double>(s, a_abs.data(), b_abs.data(), c.bias ? bias_abs.data() : nullptr, mag.data(), c.accumulate,
                         nullptr, 0);
  std::vector<Out> got_c;
  std::vector<double> ref_c, mag_c;
  size_t gap_writes = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (c.in_c(i)) {
      got_c.push_back(got[i]), ref_c.push_back(ref[i]), mag_c.push_back(mag[i]);
    } else {
      gap_writes += !poisoned(got[i]);
    }
  }
  check_tc_output<Out, T>(got_c, ref_c, mag_c, s.k);
  CHECK(gap_writes == 0);
  CHECK(same_bits(got, run()));
}

GemmShape shape(int m, int n, int k, bool ta, bool tb, int lda = 0, int ldb = 0, int ldc = 0) {
  GemmShape s;
  s.m = m, s.n = n, s.k = k, s.trans_a = ta, s.trans_b = tb, s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  return s;
}

// The forward (A * B^T) and backward-data (A * B) layouts, C in T.
std::vector<TcGemmCase> activation_cases() {
  return {
      TcGemmCase{{shape(37, 29, 45, false, true)}},
      TcGemmCase{{shape(70, 33, 64, false, true, 72, 0, 40), false, true}, 0, 2, 0},
      TcGemmCase{{shape(19, 150, 100, false, false), true, false}, 1, 3, 1},
      TcGemmCase{{shape(64, 64, 48, false, false, 0, 0, 0), true, true}, -1, 0, 2},
      TcGemmCase{{shape(5, 7, 3, false, true, 9, 11, 13)}},
  };
}
// The weight-gradient layout (A^T * B), C in FP32.
std::vector<TcGemmCase> weight_cases() {
  return {
      TcGemmCase{{shape(29, 45, 37, true, false), false}},
      TcGemmCase{{shape(64, 40, 130, true, false, 72, 48, 0), false, true}, 1, 4, 0},
      TcGemmCase{{shape(17, 9, 5, true, false), false, false}, 0, 0, 1},
  };
}

template <typename T>
void check_all(Device device) {
  for (const TcGemmCase& c : activation_cases()) check_gemm_tc<T, T>(device, c);
  for (const TcGemmCase& c : weight_cases()) check_gemm_tc<T, float>(device, c);
}

}  // namespace

TEST_CASE("kernel: gemm on tensor cores, TF32 and BF16, every layout against the FP64 reference") {
  KERNEL_TEST_DEVICE(device);
  if (current_compute_capability() < 80) SKIP_TEST("TF32 and BF16 need sm_80");
  check_all<float>(device);
  check_all<Bf16>(device);
}

TEST_CASE("kernel: gemm on tensor cores, FP16, every layout against the FP64 reference") {
  KERNEL_TEST_DEVICE(device);
  check_all<Fp16>(device);
}

TEST_CASE("kernel: gemm on tensor cores refuses layouts no layer uses") {
  KERNEL_TEST_DEVICE(device);
  DeviceArray<Fp16> a(device, 64), b(device, 64), c(device, 64);
  DeviceArray<float> cf(device, 64);
  auto half_c = [&] {
    gemm_tc<Fp16, Fp16>(shape(4, 4, 4, true, false), a.data(), b.data(), nullptr, c.data(), false, nullptr, 0, nullptr);
  };
  auto both_transposed = [&] {
    gemm_tc<Fp16, float>(shape(4, 4, 4, true, true), a.data(), b.data(), nullptr, cf.data(), false, nullptr, 0, nullptr);
  };
  CHECK_THROWS_WITH_AS(half_c(), doctest::Contains("C is FP32 exactly for trans_a"), Error);
  CHECK_THROWS_WITH_AS(both_transposed(), doctest::Contains("trans_a with trans_b is not supported"), Error);
}
