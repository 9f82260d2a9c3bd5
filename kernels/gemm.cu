// Dense matrix product: the reference loops, the fast CPU version (row x column blocks on the
// pool, the k loop outside a contiguous axpy over columns) and the CUDA kernels (the shared
// tiled main loop of gemm.h with plain-matrix loaders), plus the tile planner both gemm and
// conv use.
#define YOLO_GEMM_TILE_KERNELS 1
#include "kernels/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

namespace yolo {

void GemmShape::validate(const char* op) const {
  auto fail = [&](const std::string& why) { throw Error(std::string(op) + ": " + why); };
  if (m < 0 || n < 0 || k < 0)
    fail("negative size (m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  if (lda < 0 || ldb < 0 || ldc < 0) fail("negative pitch");
  int a_row = trans_a ? m : k, b_row = trans_b ? k : n;
  if (a_pitch() < a_row) fail("A pitch " + std::to_string(a_pitch()) + " < its row length " + std::to_string(a_row));
  if (b_pitch() < b_row) fail("B pitch " + std::to_string(b_pitch()) + " < its row length " + std::to_string(b_row));
  if (c_pitch() < n) fail("C pitch " + std::to_string(c_pitch()) + " < n " + std::to_string(n));
}

namespace {

template <typename T>
void check_gemm_args(const char* op, const GemmShape& s, const T* a, const T* b, T* c) {
  s.validate(op);
  bool reads = size_t(s.m) * size_t(s.n) * size_t(s.k) > 0;
  if (reads && (a == nullptr || b == nullptr)) throw Error(std::string(op) + ": A or B is null");
  if (size_t(s.m) * size_t(s.n) > 0 && c == nullptr) throw Error(std::string(op) + ": C is null");
}

// ---- CPU --------------------------------------------------------------------------------------

using cpu_tiles::cpu_scratch;
using cpu_tiles::kMr;
using cpu_tiles::kNr;
using cpu_tiles::micro_kernel;

// B' packed as [n / kNr][k][kNr], columns past n zero.
void pack_b(const GemmShape& s, const float* b, std::vector<float>& packed) {
  const size_t blocks = size_t(s.n + kNr - 1) / kNr, k = size_t(s.k);
  const size_t ldb = size_t(s.b_pitch());
  parallel_for(blocks, [&](size_t cb) {
    float* dst = packed.data() + cb * k * kNr;
    for (int j = 0; j < kNr; ++j) {
      const size_t col = cb * kNr + j;
      if (col >= size_t(s.n)) {
        for (size_t t = 0; t < k; ++t) dst[t * kNr + j] = 0.0f;
      } else if (s.trans_b) {  // B is n x k: column col of B' is row col of B
        for (size_t t = 0; t < k; ++t) dst[t * kNr + j] = b[col * ldb + t];
      } else {
        for (size_t t = 0; t < k; ++t) dst[t * kNr + j] = b[t * ldb + col];
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

// ---- CUDA: loaders and epilogue for plain matrices ---------------------------------------------

using namespace tiled;

struct GemmParams {
  int m, n, k, lda, ldb, ldc;
  bool accumulate, vec_a, vec_b, vec_c;
};

struct GemmEpilogue {
  float* c;
  const float* bias;
  const GemmParams& p;
  __device__ __forceinline__ void put(int row, int col, const float (&v)[4]) {
    if (row >= p.m || col >= p.n) return;
    float* out = c + size_t(row) * p.ldc + col;
    if (p.vec_c && col + 3 < p.n) {
      float r[4] = {v[0], v[1], v[2], v[3]};
      if (p.accumulate) {
        Vec4 old = load4(out);
        r[0] = old.x + r[0], r[1] = old.y + r[1], r[2] = old.z + r[2], r[3] = old.w + r[3];
      }
      if (bias) {
#pragma unroll
        for (int e = 0; e < 4; ++e) r[e] += bias[col + e];
      }
      store4(out, r);
    } else {
      for (int e = 0; e < 4 && col + e < p.n; ++e)
        out[e] = (p.accumulate ? out[e] + v[e] : v[e]) + (bias ? bias[col + e] : 0.0f);
    }
  }
};

template <int BM, int BN, bool TRANS_A, bool TRANS_B>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(GemmParams p, const float* a, const float* b, const float* bias, float* c) {
  __align__(16) __shared__ float as[2][kBK][BM + kPad];
  __align__(16) __shared__ float bs[2][kBK][BN + kPad];
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN;
  // A' rows are A's rows (K-major) or A's columns (A stored k x m: MN-major); B' alike.
  std::conditional_t<TRANS_A, MnMajorMatrixLoader<BM>, KMajorMatrixLoader<BM>> la;
  std::conditional_t<TRANS_B, KMajorMatrixLoader<BN>, MnMajorMatrixLoader<BN>> lb;
  la.init(a, p.lda, p.m, p.k, m0, 0, p.vec_a);
  lb.init(b, p.ldb, p.n, p.k, n0, 0, p.vec_b);
  float acc[BM / 16][BN / 16];
  mainloop<BM, BN>(la, lb, 0, p.k, acc, as, bs);
  GemmEpilogue epilogue{c, bias, p};
  write_tile<BM, BN>(acc, m0, n0, epilogue);
}

template <int BM, int BN>
void launch_gemm(const GemmParams& p, bool ta, bool tb, const float* a, const float* b, const float* bias, float* c,
                 cudaStream_t stream) {
  dim3 grid(ceil_div(p.m, BM), ceil_div(p.n, BN));
  if (!ta && !tb) LAUNCH((gemm_kernel<BM, BN, false, false>), grid, dim3(kThreads), 0, stream, p, a, b, bias, c);
  else if (!ta && tb) LAUNCH((gemm_kernel<BM, BN, false, true>), grid, dim3(kThreads), 0, stream, p, a, b, bias, c);
  else if (ta && !tb) LAUNCH((gemm_kernel<BM, BN, true, false>), grid, dim3(kThreads), 0, stream, p, a, b, bias, c);
  else LAUNCH((gemm_kernel<BM, BN, true, true>), grid, dim3(kThreads), 0, stream, p, a, b, bias, c);
}

// ---- tile planning -------------------------------------------------------------------------------

std::atomic<int> g_forced_tile{-1}, g_forced_splits{0};

int multiprocessor_count() {
#if defined(__CUDACC__)
  static std::atomic<int> cached[64] = {};
  int device = 0;
  CHECKED(cudaGetDevice(&device));
  if (device < 0 || device >= 64) return 1;
  int count = cached[device].load();
  if (count == 0) {
    CHECKED(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached[device].store(count);
  }
  return count;
#else
  return 4;  // emulation: a small "GPU", so small test problems still use several blocks
#endif
}

}  // namespace

void set_gemm_tiling_for_tests(int tile, int splits) {
  if (tile < -1 || tile > 3) throw Error("set_gemm_tiling_for_tests: tile must be -1..3, got " + std::to_string(tile));
  if (splits < 0) throw Error("set_gemm_tiling_for_tests: negative split count");
  g_forced_tile = tile;
  g_forced_splits = splits;
}

namespace tiled {

TilePlan plan_tiles(long long m, long long n, long long k, int groups, int max_splits, long long min_chunk) {
  // Relative throughput of a tile shape (smaller tiles re-read more per FMA).
  static const double kEfficiency[4] = {1.0, 0.85, 0.85, 0.7};
  const int forced_tile = g_forced_tile.load(), forced_splits = g_forced_splits.load();
  const double sms = multiprocessor_count();
  TilePlan best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int tile = 0; tile < 4; ++tile) {
    if (forced_tile >= 0 && tile != forced_tile) continue;
    TilePlan plan{tile, 1};
    double tiles = double((m + plan.bm() - 1) / plan.bm()) * double((n + plan.bn() - 1) / plan.bn()) * groups;
    int split_limit = k > 0 ? max_splits : 1;
    for (int s = 1; s <= split_limit; ++s) {
      if (forced_splits > 0 && s != std::min(forced_splits, split_limit)) continue;
      long long chunk = split_chunk(k, s);
      if (forced_splits == 0 && s > 1 && chunk < min_chunk) break;
      // Time ~ waves of blocks (one block per SM at a time) x one block's work, plus the
      // second pass over s partial sums.
      double waves = std::ceil(tiles * s / sms);
      double cost = waves * plan.bm() * plan.bn() * double(std::max<long long>(chunk, 1)) / kEfficiency[tile];
      if (s > 1) cost += 0.4 * s * double(m) * double(n) * groups;
      if (cost < best_cost * 0.98) {  // near ties: the earlier (bigger tile, fewer splits) plan
        best_cost = cost;
        best = TilePlan{tile, s};
      }
    }
  }
  return best;
}

}  // namespace tiled

// ---- public entry points --------------------------------------------------------------------------

template <typename T>
void gemm_reference(const GemmShape& s, const T* a, const T* b, const T* bias, T* c, bool accumulate) {
  check_gemm_args("gemm_reference", s, a, b, c);
  const int lda = s.a_pitch(), ldb = s.b_pitch(), ldc = s.c_pitch();
  for (int i = 0; i < s.m; ++i)
    for (int j = 0; j < s.n; ++j) {
      T sum = 0;
      for (int kk = 0; kk < s.k; ++kk) {
        T av = s.trans_a ? a[size_t(kk) * lda + i] : a[size_t(i) * lda + kk];
        T bv = s.trans_b ? b[size_t(j) * ldb + kk] : b[size_t(kk) * ldb + j];
        sum += av * bv;
      }
      T& out = c[size_t(i) * ldc + j];
      out = (accumulate ? out : T(0)) + sum + (bias ? bias[j] : T(0));
    }
}

void gemm_cpu(const GemmShape& s, const float* a, const float* b, const float* bias, float* c, bool accumulate) {
  check_gemm_args("gemm_cpu", s, a, b, c);
  if (s.m == 0 || s.n == 0) return;
  const size_t k = size_t(s.k), ldc = size_t(s.c_pitch());
  const size_t col_blocks = size_t(s.n + kNr - 1) / kNr, row_blocks = size_t(s.m + kMr - 1) / kMr;
  std::vector<float>& packed_b = cpu_scratch(0, col_blocks * k * kNr);
  pack_b(s, b, packed_b);
  const float* a_rows = a;  // A' rows, contiguous along k
  size_t a_pitch = size_t(s.a_pitch());
  if (s.trans_a && k > 0) {
    std::vector<float>& packed_a = cpu_scratch(1, size_t(s.m) * k);
    pack_a_transposed(s, a, packed_a);
    a_rows = packed_a.data(), a_pitch = k;
  }
  const std::vector<float> zeros(k, 0.0f);
  // Work item: one kNr-column block x up to 16 row blocks. Each element sums k in order.
  constexpr size_t kRowBlocksPerItem = 16;
  const size_t row_items = (row_blocks + kRowBlocksPerItem - 1) / kRowBlocksPerItem;
  parallel_for(col_blocks * row_items, [&](size_t item) {
    const size_t cb = item / row_items, rb_end = std::min(row_blocks, (item % row_items + 1) * kRowBlocksPerItem);
    const int j0 = int(cb) * kNr, cols = std::min(kNr, s.n - j0);
    for (size_t rb = item % row_items * kRowBlocksPerItem; rb < rb_end; ++rb) {
      const int i0 = int(rb) * kMr, rows = std::min(kMr, s.m - i0);
      const float* rows_ptr[kMr];
      for (int i = 0; i < kMr; ++i) rows_ptr[i] = i < rows ? a_rows + size_t(i0 + i) * a_pitch : zeros.data();
      float acc[kMr][kNr] = {};
      micro_kernel(rows_ptr, packed_b.data() + cb * k * kNr, s.k, acc);
      for (int i = 0; i < rows; ++i) {
        float* out = c + size_t(i0 + i) * ldc + j0;
        for (int j = 0; j < cols; ++j) out[j] = (accumulate ? out[j] : 0.0f) + acc[i][j] + (bias ? bias[j0 + j] : 0.0f);
      }
    }
  });
}

void gemm_cuda(const GemmShape& s, const float* a, const float* b, const float* bias, float* c, bool accumulate,
               cudaStream_t stream) {
  check_gemm_args("gemm_cuda", s, a, b, c);
  if (s.m == 0 || s.n == 0) return;
  if ((s.n + 63) / 64 > 65535) throw Error("gemm_cuda: n " + std::to_string(s.n) + " is too large");
  GemmParams p{s.m, s.n, s.k, s.a_pitch(), s.b_pitch(), s.c_pitch(), accumulate, false, false, false};
  // float4 loads where the contiguous extent, the pitch and the base allow them.
  p.vec_a = (s.trans_a ? s.m : s.k) % 4 == 0 && p.lda % 4 == 0 && aligned16(a);
  p.vec_b = (s.trans_b ? s.k : s.n) % 4 == 0 && p.ldb % 4 == 0 && aligned16(b);
  p.vec_c = p.ldc % 4 == 0 && aligned16(c);
  // No workspace here, so K is never split.
  TilePlan plan = plan_tiles(s.m, s.n, s.k, 1, 1, 0);
  switch (plan.tile) {
    case 0: return launch_gemm<128, 128>(p, s.trans_a, s.trans_b, a, b, bias, c, stream);
    case 1: return launch_gemm<128, 64>(p, s.trans_a, s.trans_b, a, b, bias, c, stream);
    case 2: return launch_gemm<64, 128>(p, s.trans_a, s.trans_b, a, b, bias, c, stream);
    default: return launch_gemm<64, 64>(p, s.trans_a, s.trans_b, a, b, bias, c, stream);
  }
}

template void gemm_reference<float>(const GemmShape&, const float*, const float*, const float*, float*, bool);
template void gemm_reference<double>(const GemmShape&, const double*, const double*, const double*, double*, bool);

}  // namespace yolo
