// The machinery kernels/gemm.cu and kernels/conv.cu share: the CUDA tiled main loop, its
// loaders, the tile/split planner, the fixed-order split reduction, and the CPU micro-kernel.
// Internal to those two files (not part of the op API; include kernels/gemm.h for that).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/gemm.h"

namespace yolo::tiled {

constexpr int kThreads = 256;  // a 16 x 16 grid of threads; each owns a (BM/16) x (BN/16) block of C
constexpr int kBK = 8;         // reduction depth of one shared-memory stage
constexpr int kPad = 4;        // row padding: the transposed stores of K-major loads avoid bank conflicts

// A stage holds one operand's [kBK][R] slice, R = the tile's rows (BM) or columns (BN).
template <int R>
using Stage = float[kBK][R + kPad];


// Operands reach shared memory through loaders: each thread moves 4 floats per stage.
//  K-major (the operand's rows are contiguous along K): thread t loads row t/2, k (t%2)*4..+3,
//    and stores them transposed (threads past row R-1 idle when R = 64).
//  MN-major (contiguous along the tile's R dimension): thread t loads k row t/(R/4), columns
//    (t%(R/4))*4..+3, and stores them as they are.
// A loader offers fetch() (global -> registers, then advance by kBK along K) and stash(stage).
struct KMajorSlot {
  int row, kq;
  bool active;
  template <int R>
  __device__ __forceinline__ void init() {
    int t = int(threadIdx.x);
    row = t / 2, kq = (t % 2) * 4, active = row < R;
  }
  template <int R>
  __device__ __forceinline__ void stash(Stage<R>& stage, const float (&v)[4]) const {
    if (active) {
#pragma unroll
      for (int e = 0; e < 4; ++e) stage[kq + e][row] = v[e];
    }
  }
};

struct MnMajorSlot {
  int k_local, rq;
  bool active;
  template <int R>
  __device__ __forceinline__ void init() {
    int t = int(threadIdx.x);
    k_local = t / (R / 4), rq = (t % (R / 4)) * 4, active = k_local < kBK;
  }
  template <int R>
  __device__ __forceinline__ void stash(Stage<R>& stage, const float (&v)[4]) const {
    if (active) store_floats<4>(&stage[k_local][rq], v);
  }
};

// Operand rows contiguous along K: element (row, k) at data[row * pitch + k].
template <int R>
struct KMajorMatrixLoader {
  KMajorSlot slot;
  const float* row_ptr;
  int k_pos, k_size;
  bool row_ok, vec;
  float v[4];

  __device__ __forceinline__ void init(const float* data, int pitch, int rows, int k, int r0, int k_begin, bool vector) {
    slot.init<R>();
    int row = r0 + slot.row;
    row_ok = slot.active && row < rows;
    row_ptr = data + size_t(row_ok ? row : 0) * pitch;
    k_pos = k_begin + slot.kq, k_size = k, vec = vector;
  }
  __device__ __forceinline__ void fetch() {
    if (vec) {
      float4 t{0.0f, 0.0f, 0.0f, 0.0f};
      if (row_ok && k_pos < k_size) t = load_pack<4>(row_ptr + k_pos);
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = row_ok && k_pos + e < k_size ? row_ptr[k_pos + e] : 0.0f;
    }
    k_pos += kBK;
  }
  __device__ __forceinline__ void stash(Stage<R>& stage) { slot.stash<R>(stage, v); }
};

// Operand contiguous along the tile's rows/columns: element (k, col) at data[k * pitch + col].
template <int R>
struct MnMajorMatrixLoader {
  MnMajorSlot slot;
  const float* data;
  int pitch, cols, col, k_pos, k_size;
  bool vec;
  float v[4];

  __device__ __forceinline__ void init(const float* matrix, int row_pitch, int count, int k, int c0, int k_begin,
                                       bool vector) {
    slot.init<R>();
    data = matrix, pitch = row_pitch, cols = count, col = c0 + slot.rq;
    k_pos = k_begin + slot.k_local, k_size = k, vec = vector;
  }
  __device__ __forceinline__ void fetch() {
    const bool ok = slot.active && k_pos < k_size;
    const float* p = data + size_t(ok ? k_pos : 0) * pitch + col;
    if (vec) {
      float4 t{0.0f, 0.0f, 0.0f, 0.0f};
      if (ok && col < cols) t = load_pack<4>(p);
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = ok && col + e < cols ? p[e] : 0.0f;
    }
    k_pos += kBK;
  }
  __device__ __forceinline__ void stash(Stage<R>& stage) { slot.stash<R>(stage, v); }
};

// Row (or column) within the tile of the thread's accumulator index i (t = ty or tx): groups of
// 4 that are 64 apart, so each shared read is one float4 and a warp reads without conflicts.
__device__ __forceinline__ int tile_offset(int i, int t) { return (i / 4) * 64 + t * 4 + i % 4; }

// acc = the block's A'[m0.., k_begin..k_end) * B'[k_begin..k_end), n0..] for this thread's
// elements. Double-buffered: the next stage's global loads are in flight during the FMAs.
// k_begin and k_end are block-uniform, k_begin a multiple of kBK; loaders mask k past their K.
template <int BM, int BN, class LoaderA, class LoaderB>
__device__ __forceinline__ void mainloop(LoaderA& la, LoaderB& lb, int k_begin, int k_end,
                                         float (&acc)[BM / 16][BN / 16], Stage<BM>* as, Stage<BN>* bs) {
  constexpr int TM = BM / 16, TN = BN / 16;
  const int tx = int(threadIdx.x) % 16, ty = int(threadIdx.x) / 16;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  if (k_begin >= k_end) return;

  la.fetch();
  lb.fetch();
  la.stash(as[0]);
  lb.stash(bs[0]);
  __syncthreads();
  int buf = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
    const bool more = k0 + kBK < k_end;
    if (more) {
      la.fetch();
      lb.fetch();
    }
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int q = 0; q < TM / 4; ++q) {
        float4 t = load_pack<4>(&as[buf][kk][q * 64 + ty * 4]);
        a[4 * q] = t.x, a[4 * q + 1] = t.y, a[4 * q + 2] = t.z, a[4 * q + 3] = t.w;
      }
#pragma unroll
      for (int q = 0; q < TN / 4; ++q) {
        float4 t = load_pack<4>(&bs[buf][kk][q * 64 + tx * 4]);
        b[4 * q] = t.x, b[4 * q + 1] = t.y, b[4 * q + 2] = t.z, b[4 * q + 3] = t.w;
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    if (more) {
      la.stash(as[buf ^ 1]);
      lb.stash(bs[buf ^ 1]);
    }
    __syncthreads();  // the stores above are visible, and nobody still reads `buf` when it is refilled
    buf ^= 1;
  }
}

// Hands the thread's results to epilogue.put(m, n, v[4]) in groups of 4 consecutive columns
// (m, n: tile origin + offsets; the epilogue checks bounds).
template <int BM, int BN, class Epilogue>
__device__ __forceinline__ void write_tile(const float (&acc)[BM / 16][BN / 16], int m0, int n0, Epilogue& epilogue) {
  constexpr int TM = BM / 16, TN = BN / 16;
  const int tx = int(threadIdx.x) % 16, ty = int(threadIdx.x) / 16;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int q = 0; q < TN / 4; ++q) {
      float v[4] = {acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]};
      epilogue.put(m0 + tile_offset(i, ty), n0 + q * 64 + tx * 4, v);
    }
}

// ---- host side: choosing the tile and the split count ------------------------------------------

struct TilePlan {
  int tile = 0;    // 0: 128x128, 1: 128x64, 2: 64x128, 3: 64x64
  int splits = 1;  // reduction chunks (1 = no second pass)
  int bm() const { return tile < 2 ? 128 : 64; }
  int bn() const { return tile % 2 == 0 ? 128 : 64; }
};

// SMs of the current device (a GPU's, cached; or the current emulated device's).
int multiprocessor_count();

// Split K into chunks of at least this much (16 stages: the prologue and the partial tile's
// store stay small next to the chunk's FMAs).
constexpr long long kMinSplitK = 128;
constexpr int kMaxSplits = 256;

// The plan for `groups` independent m x n x k products (conv backward-data parity classes),
// splitting K into at most max_splits chunks of at least min_chunk (a multiple of kBK).
// max_splits 1: the launcher has no workspace.
TilePlan plan_tiles(long long m, long long n, long long k, int groups, int max_splits, long long min_chunk);

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// K per split, a multiple of kBK, for k split `splits` ways (the last chunks may be short or empty).
__host__ __device__ inline long long split_chunk(long long k, int splits) {
  long long steps = (k + kBK - 1) / kBK;
  return (steps + splits - 1) / splits * kBK;
}

// Workspace sizes are rounded up to 256 bytes (so consecutive regions stay 16-byte aligned).
inline size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes of [splits][rows][cols] float partial sums (0 without a split).
inline size_t split_partials_bytes(const TilePlan& plan, long long rows, long long cols) {
  return plan.splits > 1 ? round_up_256(size_t(plan.splits) * size_t(rows) * size_t(cols) * sizeof(float)) : 0;
}

// Throws yolo::Error (naming `op`) unless workspace holds `need` bytes, 16-byte aligned.
void check_workspace(const char* op, size_t need, const void* workspace, size_t workspace_bytes);

// out[row][col] (row pitch out_pitch) = (accumulate ? out : 0) + sum over s < splits, in order,
// of parts[s][row][col] (dense rows x cols each) + (bias ? bias[col] : 0). The second pass of
// every split reduction: a fixed order, so the same bits every run.
void launch_sum_splits(const float* parts, int splits, int rows, int cols, float* out, int out_pitch, bool accumulate,
                       const float* bias, cudaStream_t stream);

}  // namespace yolo::tiled
