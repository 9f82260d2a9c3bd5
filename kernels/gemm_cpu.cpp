// Dense matrix product's fast CPU version: register-blocked mr x nr blocks of C, the
// micro-kernels of the instruction set in use (kernels/cpu_micro.h, cpu_isa.h), threaded over
// fixed work items. The reference loops and the CUDA kernels are in gemm.cu.
#include <algorithm>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"
#include "kernels/gemm.h"
#include "kernels/gemm_checks.h"

namespace yolo {
namespace {

// B' packed as [n / nr][k][nr], columns past n zero.
void pack_b(const GemmShape& s, const float* b, size_t nr, std::vector<float>& packed) {
  const size_t blocks = (size_t(s.n) + nr - 1) / nr, k = size_t(s.k);
  const size_t ldb = size_t(s.b_pitch());
  parallel_for(blocks, [&](size_t cb) {
    float* dst = packed.data() + cb * k * nr;
    for (size_t j = 0; j < nr; ++j) {
      const size_t col = cb * nr + j;
      if (col >= size_t(s.n)) {
        for (size_t t = 0; t < k; ++t) dst[t * nr + j] = 0.0f;
      } else if (s.trans_b) {  // B is n x k: column col of B' is row col of B
        for (size_t t = 0; t < k; ++t) dst[t * nr + j] = b[col * ldb + t];
      } else {
        for (size_t t = 0; t < k; ++t) dst[t * nr + j] = b[t * ldb + col];
      }
    }
  });
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
  const int mr = tiles.mr, nr = tiles.nr;
  const size_t k = size_t(s.k), ldc = size_t(s.c_pitch());
  const size_t col_blocks = size_t(s.n + nr - 1) / nr, row_blocks = size_t(s.m + mr - 1) / mr;
  std::vector<float>& packed_b = cpu_scratch(0, col_blocks * k * nr);
  pack_b(s, b, size_t(nr), packed_b);
  const float* a_rows = a;  // A' rows, contiguous along k
  size_t a_pitch = size_t(s.a_pitch());
  if (s.trans_a && k > 0) {
    std::vector<float>& packed_a = cpu_scratch(1, size_t(s.m) * k);
    pack_a_transposed(s, a, packed_a);
    a_rows = packed_a.data(), a_pitch = k;
  }
  const std::vector<float> zeros(k, 0.0f);
  // Work item: one nr-column block x up to 16 row blocks. Each element sums k in order.
  constexpr size_t kRowBlocksPerItem = 16;
  const size_t row_items = (row_blocks + kRowBlocksPerItem - 1) / kRowBlocksPerItem;
  parallel_for(col_blocks * row_items, [&](size_t item) {
    const size_t cb = item / row_items, rb_end = std::min(row_blocks, (item % row_items + 1) * kRowBlocksPerItem);
    const int j0 = int(cb) * nr, cols = std::min(nr, s.n - j0);
    for (size_t rb = item % row_items * kRowBlocksPerItem; rb < rb_end; ++rb) {
      const int i0 = int(rb) * mr, rows = std::min(mr, s.m - i0);
      const float* rows_ptr[cpu_micro::kMaxMr];
      for (int i = 0; i < mr; ++i) rows_ptr[i] = i < rows ? a_rows + size_t(i0 + i) * a_pitch : zeros.data();
      float acc[cpu_micro::kMaxMr * cpu_micro::kMaxNr] = {};
      tiles.block(rows_ptr, packed_b.data() + cb * k * nr, s.k, acc);
      for (int i = 0; i < rows; ++i) {
        float* out = c + size_t(i0 + i) * ldc + j0;
        for (int j = 0; j < cols; ++j)
          out[j] = (accumulate ? out[j] : 0.0f) + acc[i * nr + j] + (bias ? bias[j0 + j] : 0.0f);
      }
    }
  });
}

}  // namespace yolo
