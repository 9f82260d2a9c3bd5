// Dense matrix product's fast CPU version: register-blocked mr x nr blocks of C, the
// micro-kernels of the instruction set in use (kernels/cpu_micro.h, cpu_isa.h), in cache-sized
// blocks threaded over work items. The reference loops and the CUDA kernels are in gemm.cu.
#include <xmmintrin.h>  // SSE: part of baseline x86-64

#include <algorithm>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"
#include "kernels/gemm.h"
#include "kernels/gemm_checks.h"

namespace yolo {

namespace {

// The blocking, in the manner of BLIS: C in groups of nc columns x mc rows (the work items), the
// depth in slices of kc. A slice of the group's B' columns is packed into nr-wide panels (kc x nr,
// 16 KB with AVX2/AVX-512: L1) that serve every row block of the group, the group's A' rows
// (mc x kc) stay in L2, and the sums carry from slice to slice in the group's mc x nc buffer.
// Every element still sums its k products in order, in float: the blocking changes no bit, so it
// may follow the thread count (enough items for every thread) and the results still do not.
struct GemmBlocking {
  size_t kc, panels, row_blocks;  // depth slice; nr-wide panels and mr-row blocks per work item
  size_t col_groups, row_groups;  // the work items: col_groups x row_groups
};

GemmBlocking gemm_blocking(const GemmShape& s, size_t mr, size_t nr) {
  GemmBlocking g;
  const size_t k = size_t(s.k), slices = std::max<size_t>(1, (k + 255) / 256);
  g.kc = std::max<size_t>(1, (k + slices - 1) / slices);  // at most 256, the slices balanced
  const size_t all_panels = (size_t(s.n) + nr - 1) / nr, all_row_blocks = (size_t(s.m) + mr - 1) / mr;
  const size_t want = 2 * size_t(cpu_pool_threads());  // items, at least
  // At most 128 columns (B' slice 128 KB) and about 128 rows (A' slice 128 KB) per item.
  g.panels = std::clamp<size_t>(all_panels / want, 1, std::max<size_t>(1, 128 / nr));
  g.col_groups = (all_panels + g.panels - 1) / g.panels;
  const size_t row_splits = std::max<size_t>((want + g.col_groups - 1) / g.col_groups, 1);
  g.row_blocks = std::clamp<size_t>((all_row_blocks + row_splits - 1) / row_splits, 1, (128 + mr - 1) / mr);
  g.row_groups = (all_row_blocks + g.row_blocks - 1) / g.row_blocks;
  return g;
}

// panel[t * nr + j] = rows[j][t] for t < depth, j < nr (a null row: zeros), in 4 x 4 tiles
// transposed in SSE registers (baseline x86-64): scattering each row down a panel column instead
// took 30% of the samples of a 128-row gemm.
void transpose_into_panel(const float* const* rows, size_t depth, size_t nr, float* panel) {
  size_t t = 0;
  for (; t + 4 <= depth; t += 4)
    for (size_t j = 0; j < nr; j += 4) {
      __m128 r[4];
      for (size_t q = 0; q < 4; ++q) r[q] = rows[j + q] ? _mm_loadu_ps(rows[j + q] + t) : _mm_setzero_ps();
      _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
      for (size_t q = 0; q < 4; ++q) _mm_storeu_ps(panel + (t + q) * nr + j, r[q]);
    }
  for (; t < depth; ++t)
    for (size_t j = 0; j < nr; ++j) panel[t * nr + j] = rows[j] ? rows[j][t] : 0.0f;
}

// Rows [t0, t0 + depth) x columns [j0, j0 + panels * nr) of B' packed as [panel][t][nr], columns
// past n zero.
void pack_b_slice(const GemmShape& s, const float* b, size_t t0, size_t depth, size_t j0, size_t panels, size_t nr,
                  float* dst) {
  const size_t ldb = size_t(s.b_pitch()), n = size_t(s.n);
  if (s.trans_b) {  // B is n x k: column c of B' is row c of B, contiguous along t
    for (size_t p = 0; p < panels; ++p) {
      const size_t c0 = j0 + p * nr, cols = std::min(nr, n - c0);
      const float* src[cpu_micro::kMaxNr];
      for (size_t j = 0; j < nr; ++j) src[j] = j < cols ? b + (c0 + j) * ldb + t0 : nullptr;
      transpose_into_panel(src, depth, nr, dst + p * depth * nr);
    }
    return;
  }
  // Row t of B' is row t of B: each row's span is read whole, and the rows kAhead further on are
  // fetched meanwhile. These reads jump a whole B row at each step (16 KB in a 4096-wide B); on
  // their own they ran at memory latency, 40% of the samples of a 128-row gemm.
  constexpr size_t kAhead = 8;
  const size_t width = std::min(panels * nr, n - j0);
  for (size_t t = 0; t < depth; ++t) {
    const float* row = b + (t0 + t) * ldb + j0;
    if (t + kAhead < depth)  // 64-byte lines
      for (size_t c = 0; c < width; c += 16) __builtin_prefetch(row + kAhead * ldb + c);
    for (size_t p = 0; p < panels; ++p) {
      float* out = dst + (p * depth + t) * nr;
      const size_t c = p * nr;
      if (c + nr <= width)
        for (size_t j = 0; j < nr; ++j) out[j] = row[c + j];
      else
        for (size_t j = 0; j < nr; ++j) out[j] = c + j < width ? row[c + j] : 0.0f;
    }
  }
}

// out = (accumulate ? out : 0) + sums + (bias ? bias : 0), over `cols` columns: a loop per case,
// which the vectoriser takes (-O3, Makefile), where one loop testing both per element is scalar.
void write_row(const float* sums, const float* bias, bool accumulate, size_t cols, float* out) {
  if (accumulate && bias)
    for (size_t j = 0; j < cols; ++j) out[j] = out[j] + sums[j] + bias[j];
  else if (accumulate)
    for (size_t j = 0; j < cols; ++j) out[j] += sums[j];
  else if (bias)
    for (size_t j = 0; j < cols; ++j) out[j] = sums[j] + bias[j];
  else
    std::copy_n(sums, cols, out);
}

// A^T (stored k x m) packed as m contiguous rows of k.
void pack_a_transposed(const GemmShape& s, const float* a, std::vector<float>& packed) {
  const size_t lda = size_t(s.a_pitch()), k = size_t(s.k);
  parallel_for(size_t(s.m + 63) / 64, [&](size_t chunk) {
    const size_t i0 = chunk * 64, i1 = std::min(size_t(s.m), i0 + 64);
    for (size_t t = 0; t < k; ++t)
      for (size_t i = i0; i < i1; ++i) packed[i * k + t] = a[t * lda + i];
  });
}

}  // namespace

void gemm_cpu(const GemmShape& s, const float* a, const float* b, const float* bias, float* c, bool accumulate, void*,
              size_t) {
  gemm_detail::check_gemm_args("gemm_cpu", s, a, b, c);
  if (s.m == 0 || s.n == 0) return;
  // The micro-kernels of the instruction set in use (kernels/cpu_isa.h): mr x nr blocks.
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  count_cpu_kernel(CpuKernel::Gemm, static_cast<CpuIsa>(tiles.variant));
  const size_t mr = size_t(tiles.mr), nr = size_t(tiles.nr), k = size_t(s.k), ldc = size_t(s.c_pitch());
  const GemmBlocking g = gemm_blocking(s, mr, nr);
  const float* a_rows = a;  // A' rows, contiguous along k
  size_t a_pitch = size_t(s.a_pitch());
  if (s.trans_a && k > 0) {
    std::vector<float>& packed_a = cpu_scratch(1, size_t(s.m) * k);
    pack_a_transposed(s, a, packed_a);
    a_rows = packed_a.data(), a_pitch = k;
  }
  parallel_for(g.col_groups * g.row_groups, [&](size_t item) {
    const size_t j0 = item / g.row_groups * g.panels * nr, i0 = item % g.row_groups * g.row_blocks * mr;
    const size_t panels = std::min(g.panels, (size_t(s.n) - j0 + nr - 1) / nr);
    const size_t row_blocks = std::min(g.row_blocks, (size_t(s.m) - i0 + mr - 1) / mr);
    thread_local std::vector<float> packed_b, sums, zeros;
    packed_b.resize(g.kc * panels * nr);
    sums.assign(panels * row_blocks * mr * nr, 0.0f);  // [panel][row block][mr][nr]
    zeros.assign(g.kc, 0.0f);                          // the rows past m
    for (size_t t0 = 0; t0 < k; t0 += g.kc) {
      const size_t depth = std::min(g.kc, k - t0);
      pack_b_slice(s, b, t0, depth, j0, panels, nr, packed_b.data());
      for (size_t p = 0; p < panels; ++p)
        for (size_t rb = 0; rb < row_blocks; ++rb) {
          const float* rows_ptr[cpu_micro::kMaxMr];
          for (size_t i = 0; i < mr; ++i) {
            const size_t row = i0 + rb * mr + i;
            rows_ptr[i] = row < size_t(s.m) ? a_rows + row * a_pitch + t0 : zeros.data();
          }
          tiles.block(rows_ptr, packed_b.data() + p * depth * nr, int(depth),
                      sums.data() + (p * row_blocks + rb) * mr * nr);
        }
    }
    // Row by row, each row's panels in turn: C's rows are far apart (16 KB in a 4096-wide C), and
    // writing one 64-byte span of every row before the next span of the first (panel by panel) took
    // a third of a 2048 x 4096 x 128 product.
    for (size_t rb = 0; rb < row_blocks; ++rb)
      for (size_t i = 0; i < mr && i0 + rb * mr + i < size_t(s.m); ++i)
        for (size_t p = 0; p < panels; ++p) {
          const float* acc = sums.data() + ((p * row_blocks + rb) * mr + i) * nr;
          const size_t c0 = j0 + p * nr, cols = std::min(nr, size_t(s.n) - c0);
          write_row(acc, bias ? bias + c0 : nullptr, accumulate, cols, c + (i0 + rb * mr + i) * ldc + c0);
        }
  });
}

}  // namespace yolo
