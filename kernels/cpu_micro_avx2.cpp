// AVX2 + FMA micro-kernels (compiled with -mavx2 -mfma; see cpu_micro.h for why this file
// includes nothing else): 6 x 16 blocks, two 8-wide accumulators per row (12 of the 16 ymm
// registers), each step two loads of the packed row, six broadcasts and twelve FMAs.
#include <immintrin.h>

#include "kernels/cpu_micro.h"

namespace yolo::cpu_micro {
namespace {

constexpr int kMr = 6, kNr = 16;

// The accumulators are one flat array: with sum[kMr][2], GCC 12 keeps them in registers but
// still stores every one to the stack on each step.
inline __attribute__((always_inline)) void steps(const float* const* a, const float* b, int depth, __m256* sum) {
  for (int t = 0; t < depth; ++t) {
    const __m256 b0 = _mm256_loadu_ps(b + size_t(t) * kNr), b1 = _mm256_loadu_ps(b + size_t(t) * kNr + 8);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m256 av = _mm256_broadcast_ss(a[i] + t);
      sum[2 * i] = _mm256_fmadd_ps(av, b0, sum[2 * i]);
      sum[2 * i + 1] = _mm256_fmadd_ps(av, b1, sum[2 * i + 1]);
    }
  }
}

void block(const float* const* a, const float* b, int depth, float* acc) {
  __m256 sum[2 * kMr];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kMr; ++i) sum[i] = _mm256_loadu_ps(acc + i * 8);
  steps(a, b, depth, sum);
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kMr; ++i) _mm256_storeu_ps(acc + i * 8, sum[i]);
}

void taps(const float* const* a, ptrdiff_t row_step, int rows, ptrdiff_t col_step, int cols, const float* b, int depth,
          float* acc) {
  __m256 sum[2 * kMr];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kMr; ++i) sum[i] = _mm256_loadu_ps(acc + i * 8);
  for (int r = 0; r < rows; ++r)
    for (int s = 0; s < cols; ++s, b += size_t(depth) * kNr) {
      const float* at[kMr];
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) at[i] = a[i] + r * row_step + s * col_step;
      steps(at, b, depth, sum);
    }
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kMr; ++i) _mm256_storeu_ps(acc + i * 8, sum[i]);
}

void outer(const float* g, size_t g_step, const float* x, size_t x_step, int count, float* acc) {
  __m256 sum[2 * kMr];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kMr; ++i) sum[i] = _mm256_loadu_ps(acc + i * 8);
  for (int p = 0; p < count; ++p, g += g_step, x += x_step) {
    const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m256 gv = _mm256_broadcast_ss(g + i);
      sum[2 * i] = _mm256_fmadd_ps(gv, x0, sum[2 * i]);
      sum[2 * i + 1] = _mm256_fmadd_ps(gv, x1, sum[2 * i + 1]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < 2 * kMr; ++i) _mm256_storeu_ps(acc + i * 8, sum[i]);
}

constexpr int kLanes = 8;  // the channel loops' vector width, in floats
#include "kernels/cpu_micro_channels.inc"
#include "kernels/cpu_micro_pool.inc"
#include "kernels/cpu_micro_peak.inc"
HalfD widen(HalfF v) { return HalfD(_mm256_cvtps_pd(__m128(v))); }

LanesF multiply_add(LanesF a, LanesF b, LanesF c) { return LanesF(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c))); }

}  // namespace

Tiles avx2_tiles() { return Tiles{1, kMr, kNr, block, taps, outer, kChannelLoops, kPoolLoops, peak, kLanes}; }

}  // namespace yolo::cpu_micro
