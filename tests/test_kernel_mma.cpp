// The tensor-core building blocks (kernels/mma.cuh) and the 16-bit and TF32 roundings
// (kernels/half_types.h): every mma.sync shape against an FP64 product of its rounded inputs,
// with deliberately broken fragment mappings shown to fail; ldmatrix against the PTX ISA's
// element placement; cp.async zero fill and wait_group; hand-computed and exhaustive conversion
// cases, and the device conversions bit for bit against the host ones (TF32: every FP32 pattern
// on a GPU, NaNs included, and a NaN made Inf still caught as non-finite). Emulated in tests_emu,
// natively on a GPU (TF32, BF16 and cp.async from sm_80, FP16 and ldmatrix from sm_75).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu_parallel.h"
#include "kernels/half_types.h"
#include "kernels/precision.h"
#include "kernels/sgd.h"
#include "runtime/check.h"
#include "tests/kernel_harness.h"
#include "tests/mma_test_kernels.h"
#include "tests/test_support.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

using namespace yolo;
using namespace yolo::testing;

// Skips the test on a device older than sm_`need` (under emulation the device is sm_90).
#define SKIP_BELOW_SM(need)                                                                          \
  if (const int cc_ = current_compute_capability(); cc_ < (need))                                     \
  SKIP_TEST("needs sm_" + std::to_string(need) + "; this device is sm_" + std::to_string(cc_))

namespace {

uint32_t random_bits(Rng& rng) { return uint32_t(rng.integer(0, 0xffff)) << 16 | uint32_t(rng.integer(0, 0xffff)); }
bool is_nan_fp16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }
std::string hex(uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", bits);
  return text;
}

// ---- mma ---------------------------------------------------------------------------------------

struct MmaCase {
  std::vector<float> a_float, b_float;      // TF32: the raw inputs (the kernel rounds them)
  std::vector<uint16_t> a_bits, b_bits;     // 16-bit kinds: the patterns
  std::vector<double> a, b;                 // the values the MMA multiplies (rounded)
  std::vector<float> c;
  std::vector<double> ref, magnitude;       // C + sum A*B in FP64; |C| + sum |A*B|
};

// Random operands for `tiles` tiles: A, B in [-1, 1] times 2^[-3, 3] (products and sums stay far
// from overflow and underflow in every precision), C in [-2, 2].
MmaCase random_mma_case(Rng& rng, MmaKind kind, int tiles) {
  const int K = mma_k(kind);
  MmaCase m;
  auto operand = [&](size_t n, std::vector<float>& raw, std::vector<uint16_t>& bits, std::vector<double>& value) {
    for (size_t i = 0; i < n; ++i) {
      const float x = std::ldexp(rng.uniform(-1.0f, 1.0f), rng.integer(-3, 3));
      if (kind == MmaKind::Tf32M16n8k8) {
        raw.push_back(x);
        value.push_back(round_to_tf32(x));
      } else if (kind == MmaKind::Bf16M16n8k16) {
        bits.push_back(to_bf16(x).bits);
        value.push_back(to_float(Bf16{bits.back()}));
      } else {
        bits.push_back(to_fp16(x).bits);
        value.push_back(to_float(Fp16{bits.back()}));
      }
    }
  };
  operand(size_t(tiles) * 16 * K, m.a_float, m.a_bits, m.a);
  operand(size_t(tiles) * K * 8, m.b_float, m.b_bits, m.b);
  m.c = rng.floats(size_t(tiles) * 128, -2.0f, 2.0f);
  for (int t = 0; t < tiles; ++t)
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        const size_t at = size_t(t) * 128 + row * 8 + col;
        double sum = m.c[at], magnitude = std::fabs(m.c[at]);
        for (int k = 0; k < K; ++k) {
          const double p = m.a[size_t(t) * 16 * K + row * K + k] * m.b[size_t(t) * K * 8 + k * 8 + col];
          sum += p;  // in the emulated twin's order; exact unless the terms span over 53 bits
          magnitude += std::fabs(p);
        }
        m.ref.push_back(sum);
        m.magnitude.push_back(magnitude);
      }
  return m;
}

struct MmaRun {
  std::vector<float> d, d_in_place;
};

MmaRun run_mma(Device device, MmaKind kind, const MmaCase& m, int tiles, int permute) {
  DeviceArray<float> c(device, m.c), d(device, m.c.size()), e(device, m.c.size());
  d.poison();
  e.poison();
  if (kind == MmaKind::Tf32M16n8k8) {
    DeviceArray<float> a(device, m.a_float), b(device, m.b_float);
    launch_mma(kind, a.data(), b.data(), c.data(), d.data(), e.data(), tiles, permute);
  } else {
    DeviceArray<uint16_t> a(device, m.a_bits), b(device, m.b_bits);
    launch_mma(kind, a.data(), b.data(), c.data(), d.data(), e.data(), tiles, permute);
  }
  return {d.download(), e.download()};
}

// How far an FP32-accumulating MMA may be from the exact result. A GPU adds the K products and C
// in FP32 in an order and with a rounding (truncation, on the tensor cores we know) it does not
// document: recursive FP32 summation of K + 1 terms with truncation is off by at most K ulps of
// the running magnitude, so K * 2^-23 * (|C| + sum |A*B|). The emulation rounds the FP64 sum
// once: half an ulp of the result (plus the FP64 sum's own error when it is inexact).
double mma_tolerance(MmaKind kind, double ref, double magnitude, bool emulated) {
  if (emulated)
    return std::ldexp(std::fabs(ref), -24) + std::ldexp(magnitude, -50) + std::numeric_limits<float>::denorm_min();
  return mma_k(kind) * std::ldexp(magnitude, -23);
}

int mma_mismatches(MmaKind kind, const MmaCase& m, const std::vector<float>& d, bool emulated, std::string* first) {
  int bad = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const double tol = mma_tolerance(kind, m.ref[i], m.magnitude[i], emulated);
    if (!(std::fabs(double(d[i]) - m.ref[i]) <= tol)) {
      if (bad++ == 0 && first)
        *first = "tile " + std::to_string(i / 128) + " D[" + std::to_string(i % 128 / 8) + "][" +
                 std::to_string(i % 8) + "] = " + std::to_string(d[i]) + ", exact " + std::to_string(m.ref[i]) +
                 ", tolerance " + std::to_string(tol);
    }
  }
  return bad;
}

constexpr MmaKind kAllKinds[] = {MmaKind::Tf32M16n8k8, MmaKind::Bf16M16n8k16, MmaKind::F16M16n8k16, MmaKind::F16M16n8k8};

int min_cc(MmaKind kind) { return kind == MmaKind::Tf32M16n8k8 || kind == MmaKind::Bf16M16n8k16 ? 80 : 75; }

}  // namespace

TEST_CASE("kernel: mma.sync of every shape matches the FP64 product of its rounded inputs") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(75);
  Rng rng;
  CAPTURE(rng.seed());
  const int tiles = 8;
  for (MmaKind kind : kAllKinds) {
    const std::string kind_name = mma_kind_name(kind);
    CAPTURE(kind_name);
    if (current_compute_capability() < min_cc(kind)) {
      MESSAGE("skipping " << mma_kind_name(kind) << ": needs sm_" << min_cc(kind));
      continue;
    }
    for (int repeat = 0; repeat < 3; ++repeat) {
      const MmaCase m = random_mma_case(rng, kind, tiles);
      const MmaRun run = run_mma(device, kind, m, tiles, kMmaExact);
      std::string first;
      CHECK_MESSAGE(mma_mismatches(kind, m, run.d, kernels_emulated(), &first) == 0, first);
      // D aliasing C computes the same bits.
      CHECK(std::memcmp(run.d.data(), run.d_in_place.data(), run.d.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("kernel: mma.sync with a broken fragment mapping gives wrong results") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(75);
  Rng rng;
  CAPTURE(rng.seed());
  const int tiles = 2;
  for (MmaKind kind : kAllKinds) {
    const std::string kind_name = mma_kind_name(kind);
    CAPTURE(kind_name);
    if (current_compute_capability() < min_cc(kind)) continue;
    const MmaCase m = random_mma_case(rng, kind, tiles);
    for (int permute = 1; permute < kMmaPermuteCount; ++permute) {
      if (!mma_permute_applies(kind, permute)) continue;
      CAPTURE(permute);
      const MmaRun run = run_mma(device, kind, m, tiles, permute);
      // Judged with the GPU's (looser) tolerance: the mapping is wrong, not merely inexact.
      CHECK(mma_mismatches(kind, m, run.d, false, nullptr) > 0);
    }
  }
  CHECK_THROWS_WITH_AS(launch_mma(MmaKind::F16M16n8k8, nullptr, nullptr, nullptr, nullptr, nullptr, 1, kMmaSwapB01),
                       doctest::Contains("does not apply"), Error);
}

// ---- ldmatrix --------------------------------------------------------------------------------------

TEST_CASE("kernel: ldmatrix x1/x2/x4, with and without .trans, places elements as the PTX ISA says") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(75);
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<uint16_t> tile(kLdmatrixTileElements);
  for (uint16_t& v : tile) v = uint16_t(rng.integer(0, 0xffff));
  DeviceArray<uint16_t> d_tile(device, tile);
  for (int matrices : {1, 2, 4})
    for (bool trans : {false, true}) {
      CAPTURE(matrices);
      CAPTURE(trans);
      // Each lane names a random 16-byte-aligned row (rows may repeat, as on the GPU).
      std::vector<int> offsets(32);
      for (int& o : offsets) o = 8 * rng.integer(0, kLdmatrixTileElements / 8 - 1);
      DeviceArray<int> d_offsets(device, offsets);
      DeviceArray<uint32_t> d_out(device, 4 * 32);
      d_out.poison();
      launch_ldmatrix(matrices, trans, d_tile.data(), d_offsets.data(), d_out.data());
      const std::vector<uint32_t> out = d_out.download();
      // Matrix j's row r is the 8 elements at the address lane 8j + r gave. The fragment figure:
      // element (row, col) of matrix j sits in register j of lane 4*row + col/2, in the low half
      // for even col; with .trans the fragment is the transpose: (row, col) is stored (col, row).
      int wrong = 0;
      for (int j = 0; j < matrices; ++j)
        for (int row = 0; row < 8; ++row)
          for (int col = 0; col < 8; ++col) {
            const int stored_row = trans ? col : row, stored_col = trans ? row : col;
            const uint16_t expected = tile[size_t(offsets[size_t(8 * j + stored_row)] + stored_col)];
            const int lane = 4 * row + col / 2;
            const uint16_t got = uint16_t(out[size_t(4 * lane + j)] >> (16 * (col % 2)));
            wrong += got != expected;
          }
      CHECK(wrong == 0);
      int written_beyond = 0;  // registers past `matrices` are not written
      for (int lane = 0; lane < 32; ++lane)
        for (int j = matrices; j < 4; ++j) written_beyond += out[size_t(4 * lane + j)] != 0xffffffffu;
      CHECK(written_beyond == 0);
    }
}

// ---- cp.async ---------------------------------------------------------------------------------------

TEST_CASE("kernel: cp.async copies 16 bytes, or zero-fills them without reading when fill is false") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(80);
  Rng rng;
  CAPTURE(rng.seed());
  for (auto [chunks, threads] : {std::pair{200, 64}, {32, 32}, {500, 96}}) {
    CAPTURE(chunks);
    CAPTURE(threads);
    std::vector<uint32_t> src(size_t(chunks) * 4);
    for (uint32_t& w : src) w = random_bits(rng) | 1u;  // never zero, so a zero-filled chunk shows
    std::vector<int> fill(static_cast<size_t>(chunks));
    for (int& f : fill) f = rng.integer(0, 1);
    fill[0] = 1;
    fill[1] = 0;
    DeviceArray<uint32_t> d_src(device, src), d_out(device, src.size());
    DeviceArray<int> d_fill(device, fill);
    d_out.poison();
    launch_cp_async_fill(d_src.data(), d_fill.data(), d_out.data(), chunks, threads);
    const std::vector<uint32_t> out = d_out.download();
    int wrong = 0;
    for (size_t i = 0; i < out.size(); ++i) wrong += out[i] != (fill[i / 4] ? src[i] : 0u);
    CHECK(wrong == 0);
  }
}

TEST_CASE("kernel: cp.async wait_group<N> completes all but the N newest groups") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(80);
  Rng rng;
  CAPTURE(rng.seed());
  const int threads = 96, stage_words = 3 * threads * 4;
  std::vector<uint32_t> src(static_cast<size_t>(stage_words));
  for (uint32_t& w : src) w = random_bits(rng);
  DeviceArray<uint32_t> d_src(device, src), d_out(device, size_t(4 * stage_words));
  d_out.poison();
  launch_cp_async_groups(d_src.data(), d_out.data(), threads, false);
  const std::vector<uint32_t> out = d_out.download();
  int wrong = 0;
  for (int t = 0; t < threads; ++t)
    for (int w = 0; w < 12; ++w) {
      const size_t at = size_t(12 * t + w);
      const int chunk = w / 4;  // = its group
      wrong += out[at] != 0xffffffffu;                                         // stage 0: not recorded
      wrong += out[stage_words + at] != (chunk < 1 ? src[at] : 0xffffffffu);   // after wait<2>
      wrong += out[2 * stage_words + at] != (chunk < 2 ? src[at] : 0xffffffffu);  // after wait<1>
      // After wait<0> and __syncthreads: the next thread's chunks, all copied.
      wrong += out[3 * stage_words + at] != src[size_t(12 * ((t + 1) % threads) + w)];
    }
  CHECK(wrong == 0);
}

TEST_CASE("emulation: cp.async copies land at the wait that covers their group, not before") {
  if (!kernels_emulated()) SKIP_TEST("on a GPU a copy may land any time before its wait");
  Rng rng;
  CAPTURE(rng.seed());
  KERNEL_TEST_DEVICE(device);
  const int threads = 64, stage_words = 3 * threads * 4;
  std::vector<uint32_t> src(static_cast<size_t>(stage_words));
  for (uint32_t& w : src) w = random_bits(rng);
  DeviceArray<uint32_t> d_src(device, src), d_out(device, size_t(4 * stage_words));
  d_out.poison();
  launch_cp_async_groups(d_src.data(), d_out.data(), threads, true);
  const std::vector<uint32_t> out = d_out.download();
  int wrong = 0;
  for (int t = 0; t < threads; ++t)
    for (int w = 0; w < 12; ++w) {
      const size_t at = size_t(12 * t + w);
      const int group = w / 4;
      for (int stage = 0; stage < 3; ++stage)  // stage s: groups below s done, the rest still the marker
        wrong += out[size_t(stage) * stage_words + at] != (group < stage ? src[at] : kCpAsyncMarker);
      wrong += out[3 * stage_words + at] != src[size_t(12 * ((t + 1) % threads) + w)];
    }
  CHECK(wrong == 0);
}

// ---- emulation-only error reports ---------------------------------------------------------------------

TEST_CASE("emulation: mma.sync or ldmatrix with a lane of the warp exited throws a clear error") {
  if (!kernels_emulated()) SKIP_TEST("undefined behaviour on a GPU; only the emulation can report it");
  for (int lane : {0, 13, 31}) {
    CAPTURE(lane);
    CHECK_THROWS_WITH_AS(launch_warp_op_with_exited_lane(lane, false),
                         doctest::Contains("mma.sync with lanes of the warp missing or exited"), Error);
    CHECK_THROWS_WITH_AS(launch_warp_op_with_exited_lane(lane, true),
                         doctest::Contains("ldmatrix with lanes of the warp missing or exited"), Error);
  }
  CHECK_NOTHROW(launch_warp_op_with_exited_lane(-1, false));  // the whole warp: fine
  CHECK_NOTHROW(launch_warp_op_with_exited_lane(-1, true));
}

TEST_CASE("emulation: ldmatrix with a row address that is not 16-byte aligned throws") {
  if (!kernels_emulated()) SKIP_TEST("a GPU faults; only the emulation reports it as an error");
  KERNEL_TEST_DEVICE(device);
  std::vector<uint16_t> tile(kLdmatrixTileElements, 1);
  DeviceArray<uint16_t> d_tile(device, tile);
  DeviceArray<uint32_t> d_out(device, 4 * 32);
  std::vector<int> offsets(32);
  for (int l = 0; l < 32; ++l) offsets[size_t(l)] = 8 * l;
  offsets[5] += 4;  // 8-byte aligned, not 16
  DeviceArray<int> d_offsets(device, offsets);
  for (int matrices : {1, 2, 4})
    for (bool trans : {false, true}) {
      CAPTURE(matrices);
      CAPTURE(trans);
      CHECK_THROWS_WITH_AS(launch_ldmatrix(matrices, trans, d_tile.data(), d_offsets.data(), d_out.data()),
                           doctest::Contains("lane 5's row address is not 16-byte aligned"), Error);
    }
  // A lane whose address the shape does not use (lane 20 for x1 and x2) may hold anything.
  offsets[5] -= 4;
  offsets[20] += 1;
  d_offsets.upload(offsets);
  CHECK_NOTHROW(launch_ldmatrix(1, false, d_tile.data(), d_offsets.data(), d_out.data()));
  CHECK_NOTHROW(launch_ldmatrix(2, true, d_tile.data(), d_offsets.data(), d_out.data()));
  CHECK_THROWS_WITH_AS(launch_ldmatrix(4, false, d_tile.data(), d_offsets.data(), d_out.data()),
                       doctest::Contains("lane 20's row address"), Error);
}

TEST_CASE("emulation: on an sm_75 device the launchers refuse TF32, BF16 and cp.async, and run FP16") {
#if YOLO_EMULATED_KERNELS
  Rng rng;
  CAPTURE(rng.seed());
  const int index = emu::kMaxDevices - 1;
  emu::configure_device(index, emu::preset_for(75));
  emu::set_current_device(index);
  struct Restore {
    int index;
    ~Restore() {
      emu::configure_device(index, emu::preset_for(90));
      emu::set_current_device(-1);
    }
  } restore{index};
  const Device device = Device::emu(index);
  CHECK(current_compute_capability() == 75);
  const MmaCase m = random_mma_case(rng, MmaKind::F16M16n8k8, 1);
  std::string first;
  CHECK_MESSAGE(mma_mismatches(MmaKind::F16M16n8k8, m, run_mma(device, MmaKind::F16M16n8k8, m, 1, kMmaExact).d, true, &first) == 0, first);
  for (MmaKind kind : {MmaKind::Tf32M16n8k8, MmaKind::Bf16M16n8k16}) {
    const std::string kind_name = mma_kind_name(kind);
    CAPTURE(kind_name);
    CHECK_THROWS_WITH_AS(run_mma(device, kind, random_mma_case(rng, kind, 1), 1, kMmaExact),
                         doctest::Contains("needs sm_80 or newer; this device is sm_75"), Error);
  }
  CHECK_THROWS_WITH_AS(launch_cp_async_fill(nullptr, nullptr, nullptr, 1, 32), doctest::Contains("cp.async needs sm_80"), Error);
#else
  SKIP_TEST("needs emulated devices of other architectures");
#endif
}

// ---- conversions on the host ------------------------------------------------------------------------

namespace {

float f(uint32_t bits) { return bits_float(bits); }

// The value of a non-negative 16-bit pattern up to and including Inf's, reading Inf's exponent
// as one more binade: Inf's pattern then sits one ulp above the largest finite value, which is
// where round-to-nearest puts the overflow threshold.
double nominal_fp16(uint32_t p) {
  const int e = int(p >> 10), m = int(p & 0x3ffu);
  return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
}
double nominal_bf16(uint32_t p) {
  const int e = int(p >> 7), m = int(p & 0x7fu);
  return e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
}

// An independent oracle: the nearest pattern by binary search over the ordered non-negative
// patterns, ties to the even one (Inf's pattern is even), for a finite or infinite float.
uint16_t nearest_even(float x, uint32_t inf_pattern, double (*nominal)(uint32_t)) {
  const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double m = std::fabs(double(x));
  if (m >= nominal(inf_pattern)) return uint16_t(sign | inf_pattern);
  uint32_t lo = 0, hi = inf_pattern;  // nominal(lo) <= m < nominal(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (nominal(mid) <= m ? lo : hi) = mid;
  }
  const double below = m - nominal(lo), above = nominal(hi) - m;
  return uint16_t(sign | (below < above ? lo : above < below ? hi : lo % 2 == 0 ? lo : hi));
}

// TF32 oracle: the two neighbours with 10 mantissa bits (the upper one 2^128 past the largest),
// the nearer one, ties away from zero.
uint32_t nearest_tf32_away(float x) {
  const uint32_t bits = float_bits(x), sign = bits & 0x80000000u, lo = bits & 0x7fffe000u, hi = lo + 0x2000u;
  if (lo == 0x7f800000u) return bits;  // Inf
  const double m = std::fabs(double(x)), lo_value = double(bits_float(lo));
  const double hi_value = hi == 0x7f800000u ? std::ldexp(1.0, 128) : double(bits_float(hi));
  return sign | (m - lo_value < hi_value - m ? lo : hi);
}

// Floats that stress a 16-bit rounding: random patterns, then for random 16-bit patterns p the
// midpoint between p and p + 1 and its float neighbours.
std::vector<float> rounding_inputs(Rng& rng, double (*nominal)(uint32_t), uint32_t inf_pattern) {
  std::vector<float> in;
  for (int i = 0; i < 100000; ++i) in.push_back(f(random_bits(rng)));
  for (int i = 0; i < 50000; ++i) {
    const uint32_t p = uint32_t(rng.integer(0, int(inf_pattern) - 1));
    const float mid = float((nominal(p) + nominal(p + 1)) / 2), sign = rng.integer(0, 1) ? -1.0f : 1.0f;
    in.push_back(sign * mid);
    in.push_back(sign * std::nextafter(mid, 0.0f));
    in.push_back(sign * std::nextafter(mid, std::numeric_limits<float>::infinity()));
  }
  return in;
}

}  // namespace

TEST_CASE("half_types: bf16 rounds to nearest even, keeps NaN, Inf and signed zero") {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // tie, 0x3f80 even: down
      {0x3f818000u, 0x3f82},  // tie, 0x3f81 odd: up
      {0x3f808001u, 0x3f81},  // just above the tie
      {0x3f807fffu, 0x3f80},  // just below
      {0xbf818000u, 0xbf82},  // negative tie: magnitude to even
      {0x3fff8000u, 0x4000},  // the carry bumps the exponent
      {0x7f7f7fffu, 0x7f7f},  // below the top tie: the largest finite
      {0x7f7f8000u, 0x7f80},  // the top tie: to even = Inf
      {0x7f7fffffu, 0x7f80},  // FLT_MAX overflows to Inf
      {0xff7fffffu, 0xff80},
      {0x7f800000u, 0x7f80},  // Inf
      {0xff800000u, 0xff80},
      {0x00000000u, 0x0000},
      {0x80000000u, 0x8000},  // -0 keeps its sign
      {0x00000001u, 0x0000},  // FP32 subnormals: bf16 has the same exponent range
      {0x00008000u, 0x0000},  // subnormal tie to even
      {0x00018000u, 0x0002},
      {0x00008001u, 0x0001},
      {0x00400000u, 0x0040},
      {0x807fffffu, 0x8080},  // the largest subnormal rounds up into the smallest normal
  };
  for (auto [in, expected] : cases) {
    CAPTURE(hex(in));
    CHECK(to_bf16(f(in)).bits == expected);
  }
  // NaN stays NaN, quiet, with its sign: plain rounding would turn 0x7f800001 into Inf and carry
  // 0x7fffffff into the sign bit.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0xffc00000u}) {
    CAPTURE(hex(nan));
    const uint16_t h = to_bf16(f(nan)).bits;
    CHECK(is_nan_bf16(h));
    CHECK((h & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
  CHECK(to_float(Bf16{0x3f80}) == 1.0f);
  CHECK(to_float(Bf16{0x0001}) == std::ldexp(1.0f, -133));
  CHECK(to_float(Bf16{0xff80}) == -std::numeric_limits<float>::infinity());
  CHECK(std::signbit(to_float(Bf16{0x8000})));
  CHECK(std::isnan(to_float(Bf16{0x7fc1})));
}

TEST_CASE("half_types: fp16 rounds to nearest even, with subnormals and overflow to Inf") {
  const float two24 = std::ldexp(1.0f, -24), two25 = std::ldexp(1.0f, -25);
  const std::pair<float, uint16_t> cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},  // tie, 0x3c00 even: down
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},  // tie, 0x3c01 odd: up
      {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23), 0x3c01},  // just above the tie
      {-(1.0f + 3 * std::ldexp(1.0f, -11)), 0xbc02},
      {2049.0f, 0x6800},  // spacing 2 from 2048: tie to 2048
      {2051.0f, 0x6802},  // tie to 2052
      {2047.5f, 0x6800},  // the carry bumps the exponent
      {65504.0f, 0x7bff},  // the largest finite
      {65519.99f, 0x7bff},  // just below the overflow threshold
      {65520.0f, 0x7c00},  // the threshold itself: a tie, to even = Inf
      {-65520.0f, 0xfc00},
      {1e6f, 0x7c00},
      {f(0x7f7fffffu), 0x7c00},
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {std::ldexp(1.0f, -14), 0x0400},  // the smallest normal
      {std::ldexp(1.0f, -14) * (1.0f + std::ldexp(1.0f, -11)), 0x0400},  // tie at the smallest normal
      {std::ldexp(1.0f, -15), 0x0200},  // subnormal results
      {two24, 0x0001},  // the smallest subnormal
      {-two24, 0x8001},
      {two25, 0x0000},  // half the smallest subnormal: tie to even = 0
      {-two25, 0x8000},
      {two25 * (1.0f + std::ldexp(1.0f, -23)), 0x0001},  // just above half: up
      {std::ldexp(1.0f, -26), 0x0000},
      {3 * two25, 0x0002},  // 1.5 units: tie, up to even 2
      {5 * two25, 0x0002},  // 2.5 units: tie, down to even 2
      {7 * two25, 0x0004},  // 3.5 units: up to 4
      {1023 * two24, 0x03ff},  // the largest subnormal
      {1023.25f * two24, 0x03ff},
      {1023.5f * two24, 0x0400},  // tie, 0x3ff odd: up into the smallest normal
      {1023.75f * two24, 0x0400},
      {std::nextafter(std::ldexp(1.0f, -14), 0.0f), 0x0400},  // just below the smallest normal
      {f(0x00000001u), 0x0000},  // FP32 subnormals are far below fp16's range
      {f(0x80000001u), 0x8000},
      {f(0x007fffffu), 0x0000},
  };
  for (auto [in, expected] : cases) {
    CAPTURE(in);
    CAPTURE(hex(float_bits(in)));
    CHECK(to_fp16(in).bits == expected);
  }
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0xffc00000u}) {
    CAPTURE(hex(nan));
    const uint16_t h = to_fp16(f(nan)).bits;
    CHECK(is_nan_fp16(h));
    CHECK((h & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
  CHECK(to_float(Fp16{0x0001}) == two24);
  CHECK(to_float(Fp16{0x03ff}) == 1023 * two24);
  CHECK(to_float(Fp16{0x0400}) == std::ldexp(1.0f, -14));
  CHECK(to_float(Fp16{0x3555}) == 0.333251953125f);
  CHECK(to_float(Fp16{0x7bff}) == 65504.0f);
  CHECK(to_float(Fp16{0xfbff}) == -65504.0f);
  CHECK(to_float(Fp16{0x7c00}) == std::numeric_limits<float>::infinity());
  CHECK(to_float(Fp16{0xfc00}) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(to_float(Fp16{0x7e00})));
  CHECK(std::isnan(to_float(Fp16{0x7c01})));
  CHECK(std::signbit(to_float(Fp16{0x8000})));
  CHECK(to_float(Fp16{0x8000}) == 0.0f);
}

TEST_CASE("half_types: tf32 rounds to nearest, ties away from zero (cvt.rna)") {
  const std::pair<uint32_t, uint32_t> cases[] = {
      {0x3f800000u, 0x3f800000u},
      {0x3f801000u, 0x3f802000u},  // tie: away (nearest-even would give 0x3f800000)
      {0xbf801000u, 0xbf802000u},  // negative tie: away from zero
      {0x3f803000u, 0x3f804000u},
      {0x3f800fffu, 0x3f800000u},
      {0x3f801001u, 0x3f802000u},
      {0x3fffffffu, 0x40000000u},  // the carry bumps the exponent
      {0x7f7fefffu, 0x7f7fe000u},
      {0x7f7ff000u, 0x7f800000u},  // the top tie and beyond overflow to Inf
      {0x7f7fffffu, 0x7f800000u},
      {0xff7fffffu, 0xff800000u},
      {0x7f800000u, 0x7f800000u},
      {0xff800000u, 0xff800000u},
      {0x00000000u, 0x00000000u},
      {0x80000000u, 0x80000000u},
      {0x00001000u, 0x00002000u},  // subnormal tie: away
      {0x00000fffu, 0x00000000u},
      {0x80001000u, 0x80002000u},
  };
  for (auto [in, expected] : cases) {
    CAPTURE(hex(in));
    CHECK(float_bits(round_to_tf32(f(in))) == expected);
  }
}

TEST_CASE("half_types: tf32 truncates Inf and NaN as the GPU does: a payload in the low 13 bits leaves Inf") {
  // ptxas lowers cvt.rna.tf32.f32 to "add 0x1000 unless |x| >= Inf or NaN, then clear the low 13
  // bits" (kernels/half_types.h). The first three are what the H200 returned; plain rounding
  // would keep 0x7f801000 a NaN (0x7f802000) and carry 0x7fffffff (CUDA's NaN) into -0.
  const std::pair<uint32_t, uint32_t> cases[] = {
      {0xff801e21u, 0xff800000u}, {0x7f800001u, 0x7f800000u}, {0x7f801c40u, 0x7f800000u},
      // payload in the low 13 bits only, both signs, the tie and the largest: Inf
      {0x7f801000u, 0x7f800000u}, {0x7f801fffu, 0x7f800000u}, {0xff800001u, 0xff800000u}, {0xff801fffu, 0xff800000u},
      // in the high 10 bits only: unchanged (no quiet bit is set: 0x7f802000 stays signalling)
      {0x7fc00000u, 0x7fc00000u}, {0xffc00000u, 0xffc00000u}, {0x7f802000u, 0x7f802000u}, {0xffffe000u, 0xffffe000u},
      // in both: the low bits dropped, never rounded up
      {0x7fffffffu, 0x7fffe000u}, {0xffffffffu, 0xffffe000u}, {0x7fc01000u, 0x7fc00000u}, {0x7f803fffu, 0x7f802000u},
      // Inf, and the finite values next to it (the top tie and beyond round up to Inf)
      {0x7f800000u, 0x7f800000u}, {0xff800000u, 0xff800000u}, {0x7f7ff000u, 0x7f800000u}, {0xff7ff000u, 0xff800000u},
      {0x7f7fefffu, 0x7f7fe000u}, {0xff7fefffu, 0xff7fe000u},
  };
  for (auto [in, expected] : cases) {
    CAPTURE(hex(in));
    CHECK(hex(float_bits(round_to_tf32(f(in)))) == hex(expected));
  }
  // Every exponent-255 pattern: a NaN stays a NaN, with its sign and top 10 payload bits, exactly
  // when those bits are not all zero; otherwise (Inf included) the result is Inf of its sign.
  int wrong = 0;
  for (uint32_t payload = 0; payload < 0x800000u; ++payload)
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t in = sign | 0x7f800000u | payload, got = float_bits(round_to_tf32(f(in)));
      const bool ok = payload >> 13 ? std::isnan(f(got)) && got >> 13 == in >> 13 && (got & 0x1fffu) == 0
                                    : got == (sign | 0x7f800000u);
      wrong += !ok;
    }
  CHECK(wrong == 0);
}

TEST_CASE("half_types: bf16, fp16 and tf32 roundings agree with a search-based oracle") {
  Rng rng;
  CAPTURE(rng.seed());
  int wrong_fp16 = 0, wrong_bf16 = 0, wrong_tf32 = 0;
  std::string first;
  for (float x : rounding_inputs(rng, nominal_fp16, 0x7c00)) {
    if (std::isnan(x)) continue;
    if (to_fp16(x).bits != nearest_even(x, 0x7c00, nominal_fp16) && wrong_fp16++ == 0) first = "fp16 " + hex(float_bits(x));
  }
  for (float x : rounding_inputs(rng, nominal_bf16, 0x7f80)) {
    if (std::isnan(x)) continue;
    if (to_bf16(x).bits != nearest_even(x, 0x7f80, nominal_bf16) && wrong_bf16++ == 0) first = "bf16 " + hex(float_bits(x));
    // TF32 ties sit 0x1000 above a multiple of 0x2000: the bf16 midpoints include many of them.
    const uint32_t tie = (float_bits(x) & ~0x1fffu) | 0x1000u;
    for (float y : {x, f(tie)})
      if (!std::isnan(y) && float_bits(round_to_tf32(y)) != nearest_tf32_away(y) && wrong_tf32++ == 0)
        first = "tf32 " + hex(float_bits(y));
  }
  CHECK_MESSAGE(wrong_fp16 == 0, first);
  CHECK_MESSAGE(wrong_bf16 == 0, first);
  CHECK_MESSAGE(wrong_tf32 == 0, first);
}

TEST_CASE("half_types: every fp16 and bf16 pattern survives to_float and back (NaNs stay NaN)") {
  int wrong_fp16 = 0, wrong_bf16 = 0;
  for (uint32_t p = 0; p < 65536; ++p) {
    const uint16_t h = uint16_t(p);
    const float x = to_float(Fp16{h}), y = to_float(Bf16{h});
    if (is_nan_fp16(h)) wrong_fp16 += !(std::isnan(x) && is_nan_fp16(to_fp16(x).bits));
    else wrong_fp16 += to_fp16(x).bits != h;
    if (is_nan_bf16(h)) wrong_bf16 += !(std::isnan(y) && is_nan_bf16(to_bf16(y).bits));
    else wrong_bf16 += to_bf16(y).bits != h;
  }
  CHECK(wrong_fp16 == 0);
  CHECK(wrong_bf16 == 0);
}

// ---- conversions on the device ---------------------------------------------------------------------

TEST_CASE("kernel: to_tf32, pack_bf16x2 and pack_f16x2 on the device equal the host roundings") {
  KERNEL_TEST_DEVICE(device);
  Rng rng;
  CAPTURE(rng.seed());
  // Random patterns (NaN, Inf and subnormals included), the stressed midpoints of both 16-bit
  // formats, and the special values.
  std::vector<float> in = rounding_inputs(rng, nominal_fp16, 0x7c00);
  const std::vector<float> bf16_inputs = rounding_inputs(rng, nominal_bf16, 0x7f80);
  in.insert(in.end(), bf16_inputs.begin(), bf16_inputs.end());
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0x7f7fffffu,
                        0x477ff000u, 0x477fefffu, 0x00000001u, 0x3f801000u, 0x3f808000u, 0xff801e21u, 0x7f801c40u,
                        0x7f801000u, 0x7fffffffu, 0xffffffffu, 0x7f802000u})
    in.push_back(f(bits));
  if (in.size() % 2) in.push_back(1.0f);
  const int n = int(in.size()), pairs = n / 2;
  DeviceArray<float> d_in(device, in);
  DeviceArray<uint32_t> d_tf32(device, size_t(n)), d_bf16(device, size_t(pairs)), d_f16(device, size_t(pairs));
  d_tf32.poison();
  d_bf16.poison();
  d_f16.poison();
  launch_to_tf32(d_in.data(), d_tf32.data(), n);
  launch_pack_bf16x2(d_in.data(), d_bf16.data(), pairs);
  launch_pack_f16x2(d_in.data(), d_f16.data(), pairs);
  const std::vector<uint32_t> tf32 = d_tf32.download(), bf16 = d_bf16.download(), f16 = d_f16.download();
  int wrong_tf32 = 0, wrong_bf16 = 0, wrong_f16 = 0;
  std::string first;
  for (int i = 0; i < n; ++i) {
    // The PTX ISA leaves a TF32 register's low 13 bits implementation-defined: compare the 19 that
    // hold the value (sign, exponent, 10 mantissa bits), NaNs' included.
    const uint32_t expected = float_bits(round_to_tf32(in[size_t(i)])) & 0xffffe000u;
    const bool ok = (tf32[size_t(i)] & 0xffffe000u) == expected;
    if (!ok && wrong_tf32++ == 0) first = "tf32 of " + hex(float_bits(in[size_t(i)])) + ": " + hex(tf32[size_t(i)]);
  }
  for (int i = 0; i < pairs; ++i)
    for (int half = 0; half < 2; ++half) {
      const float x = in[size_t(2 * i + half)];
      const uint16_t got_bf16 = uint16_t(bf16[size_t(i)] >> (16 * half)), got_f16 = uint16_t(f16[size_t(i)] >> (16 * half));
      const bool ok_bf16 = std::isnan(x) ? is_nan_bf16(got_bf16) : got_bf16 == to_bf16(x).bits;
      const bool ok_f16 = std::isnan(x) ? is_nan_fp16(got_f16) : got_f16 == to_fp16(x).bits;
      if (!ok_bf16 && wrong_bf16++ == 0) first = "bf16 of " + hex(float_bits(x));
      if (!ok_f16 && wrong_f16++ == 0) first = "fp16 of " + hex(float_bits(x));
    }
  CHECK_MESSAGE(wrong_tf32 == 0, first);
  CHECK_MESSAGE(wrong_bf16 == 0, first);
  CHECK_MESSAGE(wrong_f16 == 0, first);
}

// FP32 patterns through the device's to_tf32 (cvt.rna.tf32.f32 from sm_80) against round_to_tf32
// on the host, in the 19 value bits: with YOLO_TF32_SWEEP=all every one of the 2^32, 2^28 per
// chunk (seconds on a GPU: tools/gpu_check.sh's step); otherwise a sample spread by an odd step
// (every exponent and payload class is hit), 2^26 natively (cheap under compute-sanitizer too) and
// 2^18 emulated. The message gives the count of mismatches and the first few.
TEST_CASE("kernel: to_tf32 on the device equals round_to_tf32 on FP32 patterns (all 2^32: YOLO_TF32_SWEEP=all)") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(80);  // below, to_tf32 is round_to_tf32 itself
  const char* sweep = std::getenv("YOLO_TF32_SWEEP");
  const bool all = sweep && std::string(sweep) == "all";
  const uint64_t total = uint64_t(1) << (all ? 32 : kernels_emulated() ? 18 : 26);
  const uint32_t step = all ? 1u : 0x9e3779b1u;
  const size_t chunk = size_t(std::min<uint64_t>(total, uint64_t(1) << 28));
  constexpr size_t kBlock = size_t(1) << 16;  // host comparison work items
  constexpr size_t kShown = 4;
  DeviceArray<uint32_t> d_out(device, chunk);
  std::vector<uint32_t> got(chunk);
  uint64_t mismatches = 0, low_bits_set = 0;
  std::vector<std::string> shown;
  for (uint64_t start = 0; start < total; start += chunk) {
    const uint32_t first = uint32_t(start) * step;
    d_out.poison();
    launch_to_tf32_patterns(first, step, d_out.data(), int(chunk));
    copy_bytes(got.data(), d_out.data(), chunk * sizeof(uint32_t));
    // Per work item: its mismatch count and first few, merged in order (the same report however
    // the pool schedules them).
    const size_t blocks = (chunk + kBlock - 1) / kBlock;
    std::vector<uint64_t> wrong(blocks), low(blocks);
    std::vector<std::vector<std::string>> examples(blocks);
    parallel_for(blocks, [&](size_t b) {
      for (size_t i = b * kBlock; i < std::min(chunk, (b + 1) * kBlock); ++i) {
        const uint32_t in = first + uint32_t(i) * step, want = float_bits(round_to_tf32(f(in)));
        low[b] += (got[i] & 0x1fffu) != 0;
        if ((got[i] & 0xffffe000u) == (want & 0xffffe000u)) continue;
        if (wrong[b]++ < kShown) examples[b].push_back(hex(in) + " -> " + hex(got[i]) + " (twin " + hex(want) + ")");
      }
    });
    for (size_t b = 0; b < blocks; ++b) {
      mismatches += wrong[b], low_bits_set += low[b];
      for (const std::string& e : examples[b])
        if (shown.size() < kShown) shown.push_back(e);
    }
  }
  std::string text = "to_tf32 sweep: " + std::to_string(total) + " patterns" + (all ? "" : " (a sample)") + ", " +
                     std::to_string(mismatches) + " mismatches in the value bits";
  for (const std::string& e : shown) text += "; " + e;
  text += "; low 13 bits set in " + std::to_string(low_bits_set);
  MESSAGE(text);
  CHECK(mismatches == 0);
}

// A NaN that to_tf32 turns into an infinity (its payload only in the low 13 bits) must still be
// caught: the MMA's outputs that read it are non-finite (Inf times a nonzero B), which both the
// optimizer's skip (grad_nonfinite_check) and the divergence report (std::isfinite,
// graph/divergence.cpp) see. The same MMA without the planted NaNs is finite and not flagged.
TEST_CASE("kernel: a NaN that to_tf32 turns into Inf still leaves the MMA's outputs non-finite, and flagged") {
  KERNEL_TEST_DEVICE(device);
  SKIP_BELOW_SM(80);
  Rng rng;
  CAPTURE(rng.seed());
  constexpr int kK = 8;
  std::vector<float> a = rng.floats(16 * kK), b(kK * 8), c = rng.floats(128);
  for (float& x : b) x = (rng.integer(0, 1) ? 1.0f : -1.0f) * rng.uniform(0.5f, 1.0f);  // no zero: Inf * B stays Inf
  const std::pair<int, uint32_t> planted[] = {{3 * kK + 5, 0x7f800001u}, {10 * kK + 2, 0xff801e21u}};
  for (bool with_nan : {false, true}) {
    CAPTURE(with_nan);
    std::vector<float> a_in = a;
    if (with_nan)
      for (auto [index, bits] : planted) a_in[size_t(index)] = f(bits);
    DeviceArray<float> d_a(device, a_in), d_b(device, b), d_c(device, c), d_d(device, 128);
    DeviceArray<uint32_t> d_tf32(device, a_in.size());
    DeviceArray<int> flag(device, std::vector<int>{0});
    d_d.poison();
    launch_to_tf32(d_a.data(), d_tf32.data(), int(a_in.size()));
    launch_mma(MmaKind::Tf32M16n8k8, d_a.data(), d_b.data(), d_c.data(), d_d.data(), nullptr, 1, kMmaExact);
    grad_nonfinite_check_cuda(d_d.data(), 128, flag.data(), nullptr);
    const std::vector<uint32_t> tf32 = d_tf32.download();
    const std::vector<float> d = d_d.download();
    if (with_nan)
      for (auto [index, bits] : planted) CHECK(hex(tf32[size_t(index)]) == hex((bits & 0x80000000u) | 0x7f800000u));
    int wrong = 0;
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col)
        wrong += std::isfinite(d[size_t(row * 8 + col)]) == (with_nan && (row == 3 || row == 10));
    CHECK(wrong == 0);
    CHECK(flag.download()[0] == int(with_nan));
  }
}
