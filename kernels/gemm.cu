// Dense matrix product: the reference loops and the CUDA kernels (the shared
// tiled main loop of gemm_tiles.cuh with plain-matrix loaders, K split when that fills the GPU
// better), plus the tile planner and the split reduction both gemm and conv use.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"
#include "kernels/gemm.h"
#include "kernels/gemm_checks.h"
#include "kernels/gemm_tiles.cuh"

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


// ---- CUDA: loaders and epilogue for plain matrices ---------------------------------------------

using namespace tiled;

struct GemmParams {
  int m, n, k, lda, ldb;
  bool vec_a, vec_b;
};

// Writes C (= or +=, plus bias) or, when K is split, this split's dense m x n partial sums.
struct GemmEpilogue {
  float* dst;
  const float* bias;
  int m, n, pitch;
  bool accumulate, vec;
  __device__ __forceinline__ void put(int row, int col, const float (&v)[4]) {
    if (row >= m || col >= n) return;
    float* out = dst + size_t(row) * pitch + col;
    if (vec && col + 3 < n) {
      float r[4] = {v[0], v[1], v[2], v[3]};
      if (accumulate) {
        float4 old = load_pack<4>(out);
        r[0] = old.x + r[0], r[1] = old.y + r[1], r[2] = old.z + r[2], r[3] = old.w + r[3];
      }
      if (bias) {
#pragma unroll
        for (int e = 0; e < 4; ++e) r[e] += bias[col + e];
      }
      store_floats<4>(out, r);
    } else {
      for (int e = 0; e < 4 && col + e < n; ++e)
        out[e] = (accumulate ? out[e] + v[e] : v[e]) + (bias ? bias[col + e] : 0.0f);
    }
  }
};

// grid: (m tiles, n tiles, splits). With splits > 1 each block sums its chunk of K into
// partials[split] (no bias, no accumulate: the second pass adds those).
template <int BM, int BN, bool TRANS_A, bool TRANS_B>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(GemmParams p, const float* a, const float* b, const float* bias, float* c, int ldc, bool accumulate,
                bool vec_c, float* partials, int splits) {
  __align__(16) __shared__ float as[2][kBK][BM + kPad];
  __align__(16) __shared__ float bs[2][kBK][BN + kPad];
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN, split = int(blockIdx.z);
  const int chunk = int(split_chunk(p.k, splits));
  const int k_begin = min(p.k, split * chunk), k_end = min(p.k, k_begin + chunk);
  // A' rows are A's rows (K-major) or A's columns (A stored k x m: MN-major); B' alike.
  std::conditional_t<TRANS_A, MnMajorMatrixLoader<BM>, KMajorMatrixLoader<BM>> la;
  std::conditional_t<TRANS_B, KMajorMatrixLoader<BN>, MnMajorMatrixLoader<BN>> lb;
  la.init(a, p.lda, p.m, p.k, m0, k_begin, p.vec_a);
  lb.init(b, p.ldb, p.n, p.k, n0, k_begin, p.vec_b);
  float acc[BM / 16][BN / 16];
  mainloop<BM, BN>(la, lb, k_begin, k_end, acc, as, bs);
  GemmEpilogue epilogue = splits == 1
                              ? GemmEpilogue{c, bias, p.m, p.n, ldc, accumulate, vec_c}
                              : GemmEpilogue{partials + size_t(split) * p.m * p.n, nullptr, p.m, p.n, p.n, false,
                                             p.n % 4 == 0};
  write_tile<BM, BN>(acc, m0, n0, epilogue);
}

template <int BM, int BN>
void launch_gemm(const GemmParams& p, bool ta, bool tb, const float* a, const float* b, const float* bias, float* c,
                 int ldc, bool accumulate, bool vec_c, float* partials, int splits, cudaStream_t stream) {
  dim3 grid(ceil_div(p.m, BM), ceil_div(p.n, BN), unsigned(splits));
  const dim3 block(kThreads);
  if (!ta && !tb)
    LAUNCH((gemm_kernel<BM, BN, false, false>), grid, block, 0, stream, p, a, b, bias, c, ldc, accumulate, vec_c,
           partials, splits);
  else if (!ta && tb)
    LAUNCH((gemm_kernel<BM, BN, false, true>), grid, block, 0, stream, p, a, b, bias, c, ldc, accumulate, vec_c,
           partials, splits);
  else if (ta && !tb)
    LAUNCH((gemm_kernel<BM, BN, true, false>), grid, block, 0, stream, p, a, b, bias, c, ldc, accumulate, vec_c,
           partials, splits);
  else
    LAUNCH((gemm_kernel<BM, BN, true, true>), grid, block, 0, stream, p, a, b, bias, c, ldc, accumulate, vec_c,
           partials, splits);
}

// out[row][col] = (accumulate ? out : 0) + sum over s, in order, of parts[s][row][col]
// + bias[col]. 4 columns per thread when vec.
__global__ void sum_splits_kernel(const float* parts, int splits, int rows, int cols, float* out, int out_pitch,
                                  bool accumulate, const float* bias, bool vec) {
  const int width = vec ? 4 : 1, units = cols / width;
  const size_t total = size_t(rows) * units, part = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / units, col = (i % units) * width;
    const float* src = parts + row * cols + col;
    float* dst = out + row * out_pitch + col;
    if (vec) {
      float sum[4];
      float4 t = accumulate ? load_pack<4>(dst) : float4{0.0f, 0.0f, 0.0f, 0.0f};
      sum[0] = t.x, sum[1] = t.y, sum[2] = t.z, sum[3] = t.w;
      for (int s = 0; s < splits; ++s) {
        float4 x = load_pack<4>(src + s * part);
        sum[0] += x.x, sum[1] += x.y, sum[2] += x.z, sum[3] += x.w;
      }
      if (bias) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e] += bias[col + e];
      }
      store_floats<4>(dst, sum);
    } else {
      float sum = accumulate ? *dst : 0.0f;
      for (int s = 0; s < splits; ++s) sum += src[s * part];
      *dst = sum + (bias ? bias[col] : 0.0f);
    }
  }
}

// ---- tile planning -------------------------------------------------------------------------------

std::atomic<int> g_forced_tile{-1}, g_forced_splits{0};

}  // namespace

void set_gemm_tiling_for_tests(int tile, int splits) {
  if (tile < -1 || tile > 3) throw Error("set_gemm_tiling_for_tests: tile must be -1..3, got " + std::to_string(tile));
  if (splits < 0) throw Error("set_gemm_tiling_for_tests: negative split count");
  g_forced_tile = tile;
  g_forced_splits = splits;
}

namespace tiled {

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
  return emu::current_multiprocessors();  // the emulated GPU's, or 4 when none is current
#endif
}

TilePlan plan_tiles(long long m, long long n, long long k, int groups, int max_splits, long long min_chunk) {
  // Relative throughput of a tile shape (smaller tiles re-read more shared memory per FMA;
  // 128x64 measured at ~0.76 of 128x128 on an H200).
  static const double kEfficiency[4] = {1.0, 0.78, 0.78, 0.6};
  // Two blocks are resident per SM (__launch_bounds__(kThreads, 2)) and share it: a wave of
  // 2 x SMs blocks takes two block-times. A last wave of at most one block per SM runs faster
  // per block than a pair, but not twice as fast: 1.5 block-times.
  constexpr double kTailWave = 1.5;
  // Second pass of a split: ~0.4 block-FMA-times per partial element (written, then read
  // back; SM FMA rate vs memory bandwidth), plus a launch (~5 us of one SM's FMAs).
  constexpr double kPassPerElement = 0.4, kPassLaunch = 6e5;
  const int forced_tile = g_forced_tile.load(), forced_splits = g_forced_splits.load();
  const long long sms = multiprocessor_count(), pair_wave = 2 * sms;
  TilePlan best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int tile = 0; tile < 4; ++tile) {
    if (forced_tile >= 0 && tile != forced_tile) continue;
    TilePlan plan{tile, 1};
    const long long tiles = (m + plan.bm() - 1) / plan.bm() * ((n + plan.bn() - 1) / plan.bn()) * groups;
    const int split_limit = k > 0 ? std::max(1, max_splits) : 1;
    for (int s = 1; s <= split_limit; ++s) {
      if (forced_splits > 0 && s != std::min(forced_splits, split_limit)) continue;
      const long long chunk = split_chunk(k, s);
      if (forced_splits == 0 && s > 1 && chunk < min_chunk) break;
      const long long blocks = tiles * s, tail = blocks % pair_wave;
      const double block_times = 2.0 * double(blocks / pair_wave) + (tail == 0 ? 0.0 : tail <= sms ? kTailWave : 2.0);
      double cost = block_times * plan.bm() * plan.bn() * double(std::max<long long>(chunk, 1)) / kEfficiency[tile];
      if (s > 1) cost += kPassPerElement * s * double(m) * double(n) * groups + kPassLaunch;
      if (cost < best_cost * 0.98) {  // near ties: the earlier (bigger tile, fewer splits) plan
        best_cost = cost;
        best = TilePlan{tile, s};
      }
    }
  }
  return best;
}

void check_workspace(const char* op, size_t need, const void* workspace, size_t workspace_bytes) {
  if (need == 0) return;
  if (workspace == nullptr || workspace_bytes < need)
    throw Error(std::string(op) + ": needs " + std::to_string(need) + " bytes of workspace, got " +
                std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  if (!aligned16(workspace)) throw Error(std::string(op) + ": workspace is not 16-byte aligned");
}

void launch_sum_splits(const float* parts, int splits, int rows, int cols, float* out, int out_pitch, bool accumulate,
                       const float* bias, cudaStream_t stream) {
  const bool vec = cols % 4 == 0 && out_pitch % 4 == 0 && aligned16(out) && aligned16(parts);
  const size_t units = size_t(rows) * (vec ? cols / 4 : cols);
  if (units == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>(ceil_div(units, 256), 8192));
  LAUNCH(sum_splits_kernel, dim3(blocks), dim3(256), 0, stream, parts, splits, rows, cols, out, out_pitch, accumulate,
         bias, vec);
}

}  // namespace tiled

// ---- public entry points --------------------------------------------------------------------------

template <typename T>
void gemm_reference(const GemmShape& s, const T* a, const T* b, const T* bias, T* c, bool accumulate, void*, size_t) {
  gemm_detail::check_gemm_args("gemm_reference", s, a, b, c);
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

namespace {

TilePlan gemm_plan(const GemmShape& s) {
  return plan_tiles(s.m, s.n, s.k, 1, kMaxSplits, kMinSplitK);
}

}  // namespace

size_t gemm_workspace_bytes(const GemmShape& s) {
  s.validate("gemm_workspace_bytes");
  if (s.m == 0 || s.n == 0) return 0;
  return split_partials_bytes(gemm_plan(s), s.m, s.n);
}

void gemm_cuda(const GemmShape& s, const float* a, const float* b, const float* bias, float* c, bool accumulate,
               void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "gemm_cuda";
  gemm_detail::check_gemm_args(op, s, a, b, c);
  if (s.m == 0 || s.n == 0) return;
  if ((s.n + 63) / 64 > 65535) throw Error("gemm_cuda: n " + std::to_string(s.n) + " is too large");
  const TilePlan plan = gemm_plan(s);
  check_workspace(op, split_partials_bytes(plan, s.m, s.n), workspace, workspace_bytes);
  GemmParams p{s.m, s.n, s.k, s.a_pitch(), s.b_pitch(), false, false};
  // float4 loads where the contiguous extent, the pitch and the base allow them.
  p.vec_a = (s.trans_a ? s.m : s.k) % 4 == 0 && p.lda % 4 == 0 && aligned16(a);
  p.vec_b = (s.trans_b ? s.k : s.n) % 4 == 0 && p.ldb % 4 == 0 && aligned16(b);
  const int ldc = s.c_pitch();
  const bool vec_c = ldc % 4 == 0 && aligned16(c);
  float* partials = static_cast<float*>(workspace);
  auto launch = [&]<int BM, int BN>() {
    launch_gemm<BM, BN>(p, s.trans_a, s.trans_b, a, b, bias, c, ldc, accumulate, vec_c, partials, plan.splits, stream);
  };
  switch (plan.tile) {
    case 0: launch.template operator()<128, 128>(); break;
    case 1: launch.template operator()<128, 64>(); break;
    case 2: launch.template operator()<64, 128>(); break;
    default: launch.template operator()<64, 64>(); break;
  }
  if (plan.splits > 1) launch_sum_splits(partials, plan.splits, s.m, s.n, c, ldc, accumulate, bias, stream);
}

template void gemm_reference<float>(const GemmShape&, const float*, const float*, const float*, float*, bool, void*,
                                    size_t);
template void gemm_reference<double>(const GemmShape&, const double*, const double*, const double*, double*, bool,
                                     void*, size_t);

}  // namespace yolo
