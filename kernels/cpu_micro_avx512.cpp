// AVX-512 micro-kernels (compiled with -mavx512f; see cpu_micro.h for why this file includes
// nothing else): 12 x 16 blocks, one 16-wide accumulator per row, each step one load of the packed
// row, twelve broadcasts and twelve FMAs.
#include <immintrin.h>

#include "kernels/cpu_micro.h"

namespace yolo::cpu_micro {
namespace {

constexpr int kMr = 12, kNr = 16;

// The twelve row pointers advance every 4 steps and each step addresses them plainly (pointer +
// constant): indexed as a[i][t], with 12 pointers, the step counter and b more than the 15 usable
// registers, GCC kept some of them in xmm registers and moved them back every step; one 12 x 16
// block in L1 ran at 62% of the peak loop (Tiles::peak), and runs at 76% so (2026-12-04, Xeon).
// The sums are the same, in the same order.
inline __attribute__((always_inline)) void steps(const float* const* a_rows, const float* b, int depth, __m512* sum) {
  const float* a[kMr];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) a[i] = a_rows[i];
  int t = 0;
  for (; t + 4 <= depth; t += 4, b += 4 * kNr) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512 bv = _mm512_loadu_ps(b + u * kNr);
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) sum[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[i][u]), bv, sum[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) a[i] += 4;
  }
  for (; t < depth; ++t, b += kNr) {
    const __m512 bv = _mm512_loadu_ps(b);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) sum[i] = _mm512_fmadd_ps(_mm512_set1_ps(*a[i]++), bv, sum[i]);
  }
}

void block(const float* const* a, const float* b, int depth, float* acc) {
  __m512 sum[kMr];
  for (int i = 0; i < kMr; ++i) sum[i] = _mm512_loadu_ps(acc + i * kNr);
  steps(a, b, depth, sum);
  for (int i = 0; i < kMr; ++i) _mm512_storeu_ps(acc + i * kNr, sum[i]);
}

void taps(const float* const* a, ptrdiff_t row_step, int rows, ptrdiff_t col_step, int cols, const float* b, int depth,
          float* acc) {
  __m512 sum[kMr];
  for (int i = 0; i < kMr; ++i) sum[i] = _mm512_loadu_ps(acc + i * kNr);
  for (int r = 0; r < rows; ++r)
    for (int s = 0; s < cols; ++s, b += size_t(depth) * kNr) {
      const float* at[kMr];
#pragma GCC unroll 16
      for (int i = 0; i < kMr; ++i) at[i] = a[i] + r * row_step + s * col_step;
      steps(at, b, depth, sum);
    }
  for (int i = 0; i < kMr; ++i) _mm512_storeu_ps(acc + i * kNr, sum[i]);
}

void outer(const float* g, size_t g_step, const float* x, size_t x_step, int count, float* acc) {
  __m512 sum[kMr];
  for (int i = 0; i < kMr; ++i) sum[i] = _mm512_loadu_ps(acc + i * kNr);
  for (int p = 0; p < count; ++p, g += g_step, x += x_step) {
    const __m512 xv = _mm512_loadu_ps(x);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) sum[i] = _mm512_fmadd_ps(_mm512_set1_ps(g[i]), xv, sum[i]);
  }
  for (int i = 0; i < kMr; ++i) _mm512_storeu_ps(acc + i * kNr, sum[i]);
}

constexpr int kLanes = 16;  // the channel loops' vector width, in floats
#include "kernels/cpu_micro_channels.inc"
#include "kernels/cpu_micro_pool.inc"
#include "kernels/cpu_micro_peak.inc"
// (The masked form: the plain one trips GCC 12's uninitialized warning inside its own header.)
HalfD widen(HalfF v) { return HalfD(_mm512_maskz_cvtps_pd(__mmask8(0xff), __m256(v))); }

LanesF multiply_add(LanesF a, LanesF b, LanesF c) { return LanesF(_mm512_fmadd_ps(__m512(a), __m512(b), __m512(c))); }

}  // namespace

Tiles avx512_tiles() { return Tiles{2, kMr, kNr, block, taps, outer, kChannelLoops, kPoolLoops, peak, kLanes}; }

}  // namespace yolo::cpu_micro
