// The baseline (SSE2) micro-kernels: 4 x 8 blocks in GCC's 4-wide vector extension (with plain
// arrays GCC keeps the accumulators in memory at -O2). See cpu_micro.h.
#include <emmintrin.h>  // SSE2: the baseline

#include <cstring>

#include "kernels/cpu_micro.h"

namespace yolo::cpu_micro {
namespace {

constexpr int kMr = 4, kNr = 8;

typedef float Float4 __attribute__((vector_size(16)));
Float4 load4(const float* p) {
  Float4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline __attribute__((always_inline)) void steps(const float* const* a, const float* b, int depth,
                                                 Float4 (&sum)[kMr][2]) {
  for (int t = 0; t < depth; ++t) {
    const Float4 b0 = load4(b + size_t(t) * kNr), b1 = load4(b + size_t(t) * kNr + 4);
    for (int i = 0; i < kMr; ++i) {
      const float av = a[i][t];
      sum[i][0] += av * b0;
      sum[i][1] += av * b1;
    }
  }
}

void block(const float* const* a, const float* b, int depth, float* acc) {
  Float4 sum[kMr][2];
  std::memcpy(sum, acc, sizeof sum);
  steps(a, b, depth, sum);
  std::memcpy(acc, sum, sizeof sum);
}

void taps(const float* const* a, ptrdiff_t row_step, int rows, ptrdiff_t col_step, int cols, const float* b, int depth,
          float* acc) {
  Float4 sum[kMr][2];
  std::memcpy(sum, acc, sizeof sum);
  for (int r = 0; r < rows; ++r)
    for (int s = 0; s < cols; ++s, b += size_t(depth) * kNr) {
      const float* at[kMr];
      for (int i = 0; i < kMr; ++i) at[i] = a[i] + r * row_step + s * col_step;
      steps(at, b, depth, sum);
    }
  std::memcpy(acc, sum, sizeof sum);
}

void outer(const float* g, size_t g_step, const float* x, size_t x_step, int count, float* acc) {
  Float4 sum[kMr][2];
  std::memcpy(sum, acc, sizeof sum);
  for (int p = 0; p < count; ++p, g += g_step, x += x_step) {
    const Float4 x0 = load4(x), x1 = load4(x + 4);
    for (int i = 0; i < kMr; ++i) {
      const float gv = g[i];
      sum[i][0] += gv * x0;
      sum[i][1] += gv * x1;
    }
  }
  std::memcpy(acc, sum, sizeof sum);
}

constexpr int kLanes = 4;  // the channel loops' vector width, in floats
#include "kernels/cpu_micro_channels.inc"
#include "kernels/cpu_micro_pool.inc"
#include "kernels/cpu_micro_peak.inc"
HalfD widen(HalfF v) {  // the two floats into the low half of an SSE register
  __m128 wide = _mm_setzero_ps();
  std::memcpy(&wide, &v, sizeof v);
  return HalfD(_mm_cvtps_pd(wide));
}

LanesF multiply_add(LanesF a, LanesF b, LanesF c) { return a * b + c; }  // no FMA in SSE2

}  // namespace

Tiles baseline_tiles() { return Tiles{0, kMr, kNr, block, taps, outer, kChannelLoops, kPoolLoops, peak, kLanes}; }

}  // namespace yolo::cpu_micro
