// The warp-specialised main loop the wgmma kernels share (kernels/gemm_wgmma.cu, conv_wgmma.cu),
// laid out as DeepGEMM's sm_90 GEMM: blocks of 128x128 outputs and 384 threads; warpgroup 0
// produces (fills a ring of 4 stages of 64 k, both operands K-major in the 128-byte swizzle,
// after giving its registers back with setmaxnreg), warpgroups 1 and 2 multiply (64 rows each,
// m64n128k16 wgmma, one batch in flight while the stage before it is released) and store.
// Each stage is guarded by a "full" mbarrier (the producer's arrivals and TMA bytes) and an
// "empty" one (the 256 math threads' arrivals). A block may work through several tiles
// (persistent blocks: TileOrder): its producers and math warpgroups then walk the same tiles, the
// ring's k-tile count running on from one tile to the next (t0), so the producers fill the next
// tile's stages while the math warpgroups finish and store the one before. Internal to those files.
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/mma.cuh"
#include "kernels/storage.cuh"
#include "kernels/tc_plan.h"
#include "kernels/wgmma.cuh"

namespace yolo::wgmma {

constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kTileBytes = 128 * kBlockK * 2;  // one operand's 128 rows of 64 k: 128 bytes each
constexpr uint32_t kStageBytes = 2 * kTileBytes;    // A's tile, then B's
// After the mbarriers: scratch for an epilogue's block-level reductions (the forward's BatchNorm
// moments, kernels/channel_moments.cuh: 520 floats), apart from the ring the producers refill.
constexpr uint32_t kScratchBytes = 2080;
constexpr size_t kSharedBytes =
    1024 + size_t(kStages) * kStageBytes + 3 * kStages * sizeof(uint64_t) + kScratchBytes;
constexpr uint32_t kRowGroupBytes = 8 * 128;  // 8 rows of the 128-byte swizzle: the descriptor's stride
// A k-tile is one 128-byte swizzle row of each operand row: 64 k in 16 bits (kBlockK), 32 in
// TF32; the math warpgroups multiply it as 4 slices of 32 bytes (k16, or k8 in TF32).
template <typename T>
constexpr int kTileK = 128 / int(sizeof(T));
constexpr uint32_t kSlicesPerTile = 4;
static_assert(kBlockM == tc::kWgmmaTile && kBlockN == tc::kWgmmaTile && kBlockK == tc::kWgmmaBk &&
                  kTileK<float> == tc::wgmma_bk(4) && kTileK<Bf16> == tc::wgmma_bk(2) &&
                  kThreads == tc::kWgmmaThreads && kSharedBytes == size_t(tc::kWgmmaSharedBytes),
              "the planner's description of the wgmma block (kernels/tc_plan.h) must match the kernels'");

// The ring in the block's dynamic shared memory: stages from the first 1024-byte boundary (where
// the 128-byte swizzle's pattern starts), then the mbarriers. "landed" (count 1: an expect_tx)
// serves producers that transform what TMA brought before they announce the stage on "full".
struct Ring {
  unsigned char* smem;  // stage 0's first byte
  uint32_t address;     // its shared address
  uint64_t* full;
  uint64_t* empty;
  uint64_t* landed;
  float* scratch;  // kScratchBytes, after the mbarriers
  __device__ unsigned char* a_tile(int stage) const { return smem + stage * kStageBytes; }
  __device__ unsigned char* b_tile(int stage) const { return smem + stage * kStageBytes + kTileBytes; }
  // The 16-byte chunk at shared address `at` (inside the ring), for the generic proxy.
  __device__ uint4* chunk(uint32_t at) const { return reinterpret_cast<uint4*>(smem + (at - address)); }
};

// Thread 0 makes the mbarriers ("full" expects `full_arrivals`) and fences them for the async
// proxy; every thread of the block must call it (it ends in __syncthreads).
__device__ __forceinline__ Ring make_ring(uint32_t full_arrivals) {
  DYNAMIC_SHARED(unsigned char, raw);
  const uint32_t raw_address = shared_address(raw);
  Ring ring;
  ring.address = (raw_address + 1023u) & ~1023u;
  ring.smem = raw + (ring.address - raw_address);
  ring.full = reinterpret_cast<uint64_t*>(ring.smem + kStages * kStageBytes);
  ring.empty = ring.full + kStages;
  ring.landed = ring.empty + kStages;
  ring.scratch = reinterpret_cast<float*>(ring.landed + kStages);
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(&ring.full[st], full_arrivals);
      mbarrier_init(&ring.empty[st], 256);  // every thread of both math warpgroups
      mbarrier_init(&ring.landed[st], 1);
    }
    fence_barrier_init();  // before any TMA copy completes on them
  }
  __syncthreads();
  return ring;
}

// k-tile t's stage and the parity its "full" phase completes with (t / kStages is the round).
__device__ __forceinline__ int stage_of(int t) { return t % kStages; }
__device__ __forceinline__ uint32_t full_parity(int t) { return uint32_t(t / kStages) & 1; }
// What the producer waits for before refilling: the previous round's release (passes at once in
// the first round: a fresh mbarrier counts its phase "-1" of parity 1 as complete).
__device__ __forceinline__ uint32_t empty_parity(int t) { return full_parity(t) ^ 1; }

// A block of outputs: its 128-row and 128-column block indices, and a third index (the backward
// data's parity class, the weight gradient's pixel split).
struct Tile {
  int row, col, z;
};
// Tiles numbered columns first, then rows, then z (consecutive tiles share A's rows in L2). A
// persistent grid's block b takes tiles b, b + gridDim.x, ...; a grid of one block a tile, its own
// (wgmma_conv_blocks, kernels/conv_wgmma.h, sizes the grid).
struct TileOrder {
  int cols, rows, zs;
  __host__ __device__ long long count() const { return (long long)cols * rows * zs; }
  __device__ Tile operator()(long long i) const {
    return {int(i / cols % rows), int(i % cols), int(i / ((long long)cols * rows))};
  }
};

// A TMA producer's expect_tx for stage st, before it issues the stage's boxes: both operands'
// bytes on "full"; or, where the producers transform one operand before announcing the stage
// (to_landed), that operand's on "landed" and the other's on "full". Returns the mbarrier the
// transformed operand's boxes complete ("full" when there is none).
__device__ __forceinline__ uint64_t* expect_stage(const Ring& ring, int st, bool to_landed) {
  uint64_t* bar = to_landed ? &ring.landed[st] : &ring.full[st];
  if (to_landed) mbarrier_arrive_expect_tx(bar, kTileBytes);
  mbarrier_arrive_expect_tx(&ring.full[st], to_landed ? kTileBytes : kStageBytes);
  return bar;
}

// A gathering producer thread (cp.async into the ring) after issuing k-tile t's copies: commits
// them, and announces k-tile t - 1 on its stage's "full" mbarrier once those copies landed and
// were fenced for the async proxy (one k-tile late, so two stay in flight). gathered_last
// announces the final k-tile.
// landed(t) runs between the wait and the fence: the thread's copies of k-tile t are in shared
// memory, visible to it alone, and what it writes there now is fenced with them (a convolution's
// input normalized in place: kernels/normalized_input.cuh).
struct NothingToDo {
  __device__ void operator()(int) const {}
};
// t counts the tile's k-tiles; t0 is the ring's count at its first (persistent blocks: TileOrder).
template <class Landed = NothingToDo>
__device__ __forceinline__ void gathered(int t, const Ring& ring, const Landed& landed = {}, int t0 = 0) {
  mma::cp_async_commit();
  if (t == 0) return;
  mma::cp_async_wait<1>();
  landed(t - 1);
  fence_proxy_async();
  mbarrier_arrive(&ring.full[stage_of(t0 + t - 1)]);
}
template <class Landed = NothingToDo>
__device__ __forceinline__ void gathered_last(int k_tiles, const Ring& ring, const Landed& landed = {}, int t0 = 0) {
  mma::cp_async_wait<0>();
  landed(k_tiles - 1);
  fence_proxy_async();
  mbarrier_arrive(&ring.full[stage_of(t0 + k_tiles - 1)]);
}

// An operand's tile when it is MN-major: two 64-element halves of its 128 rows or columns (one
// TMA box, or 64 gathered k-rows, each: 64 k-rows of 128 bytes), kMnHalfBytes apart; k-blocks of
// 8 rows are one swizzle pattern apart.
constexpr uint32_t kMnHalfBytes = kBlockK * 128;

// The descriptor of the k16 slice j of a tile: K-major slices are 32 bytes apart in each row;
// MN-major ones two k-blocks (16 rows) apart.
template <bool MnMajor>
__device__ __forceinline__ uint64_t slice(uint32_t tile, uint32_t j) {
  if constexpr (MnMajor) return descriptor(tile + 2 * kRowGroupBytes * j, Swizzle::B128, kMnHalfBytes, kRowGroupBytes);
  else return descriptor(tile + 32 * j, Swizzle::B128, 0, kRowGroupBytes);
}

// Math warpgroup `half` (0, 1): the 64 rows of A's tile from row 64*half (K-major: 64 rows of
// 128 bytes in; MN-major: the half's box) against all 128 of B's, over `k_tiles` stages, the
// ring's k-tiles t0.. (every stage released once its batch is done, the last one included).
template <typename T, bool AMnMajor, bool BMnMajor>
__device__ void multiply(int k_tiles, int half, const Ring& ring, float (&acc)[64], int t0 = 0) {
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  for (int t = t0; t < t0 + k_tiles; ++t) {
    const int st = stage_of(t);
    mbarrier_wait(&ring.full[st], full_parity(t));
    const uint32_t a_tile = ring.address + uint32_t(st) * kStageBytes +
                            uint32_t(half) * (AMnMajor ? kMnHalfBytes : 64 * 128);
    const uint32_t b_tile = ring.address + uint32_t(st) * kStageBytes + kTileBytes;
    fence(acc);
#pragma unroll
    for (uint32_t j = 0; j < kSlicesPerTile; ++j)
      mma_async<T, 128, AMnMajor, BMnMajor>(acc, slice<AMnMajor>(a_tile, j), slice<BMnMajor>(b_tile, j),
                                            t > t0 || j > 0);
    commit_group();
    wait_group<1>(acc);  // the previous stage's batch is done: release that stage
    if (t > t0) mbarrier_arrive(&ring.empty[stage_of(t - 1)]);
  }
  wait_group<0>(acc);
  if (k_tiles > 0) mbarrier_arrive(&ring.empty[stage_of(t0 + k_tiles - 1)]);
}

// Where a block's outputs go: row r (of the whole problem) at base + map(r) * pitch, `cols`
// columns, an FP32 bias per column (or none), rounded to Out (16-bit, or FP32 for partial sums);
// accumulate: added to what the output holds (in FP32, after the bias, rounded once). The map
// places rows that do not lie in order (the backward data's parity classes); PlainRows: r itself.
struct PlainRows {
  __device__ long long operator()(int row) const { return row; }
};
template <typename Out, class RowMap = PlainRows>
struct OutRows {
  Out* base;
  long long pitch;
  int rows, cols;
  const float* bias;
  bool accumulate = false;
  RowMap map = {};
};

// The D fragment (wgmma.cuh) of math warpgroup `half` plus the bias, as Out; pairs of columns
// stored together where the rows allow it. A thread holds two rows, 8 apart: elements 4j + 2h and
// 4j + 2h + 1 are row `h`'s columns 8j + 2 (lane % 4) and the one after.
template <typename Out, class RowMap>
__device__ void store(const float (&acc)[64], const OutRows<Out, RowMap>& out, int half, Tile tile) {
  const unsigned warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const bool pairs = out.pitch % 2 == 0 && reinterpret_cast<uintptr_t>(out.base) % (2 * sizeof(Out)) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = tile.row * kBlockM + 64 * half + int(16 * warp + lane / 4) + 8 * h;
    if (row >= out.rows) continue;
    Out* const row_base = out.base + out.map(row) * out.pitch;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int i = 4 * j + 2 * h, col = tile.col * kBlockN + 8 * j + int(2 * (lane % 4));
      if (col >= out.cols) continue;
      float lo = acc[i], hi = acc[i + 1];
      if (out.bias) {
        lo += out.bias[col];
        if (col + 1 < out.cols) hi += out.bias[col + 1];
      }
      Out* dst = row_base + col;
      if (out.accumulate) {
        lo += to_float(dst[0]);
        if (col + 1 < out.cols) hi += to_float(dst[1]);
      }
      if constexpr (std::is_same_v<Out, float>) {
        if (pairs && col + 1 < out.cols) {
          *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);
        } else {
          dst[0] = lo;
          if (col + 1 < out.cols) dst[1] = hi;
        }
      } else if (pairs && col + 1 < out.cols) {
        *reinterpret_cast<uint32_t*>(dst) = mma::pack2<Out>(lo, hi);
      } else {
        dst[0] = from_float<Out>(lo);
        if (col + 1 < out.cols) dst[1] = from_float<Out>(hi);
      }
    }
  }
}

// The math warpgroups' part of a kernel: multiply, store. TakeRegisters: the producer warpgroup
// gave its registers back with setmaxnreg_dec<40> (a 384-thread block launches at 168 each:
// 128 * 40 + 256 * 232 is exactly what the block holds, so the math warpgroups' inc never waits
// for registers that are not coming).
// AMnMajor, BMnMajor: how the operands lie in their stages (see multiply).
// tile: the outputs' block (the block's own grid position unless given); t0: the ring's count at
// its first k-tile (persistent blocks, which give up no registers: they call this once a tile).
template <typename T, bool TakeRegisters, bool AMnMajor, bool BMnMajor, typename Out, class RowMap>
__device__ void multiply_and_store(int k_tiles, const Ring& ring, const OutRows<Out, RowMap>& out, Tile tile,
                                   int t0 = 0) {
  if constexpr (TakeRegisters) setmaxnreg_inc<232>();
  const int half = int(threadIdx.x / 128) - 1;
  float acc[64];
  multiply<T, AMnMajor, BMnMajor>(k_tiles, half, ring, acc, t0);
  store(acc, out, half, tile);
}
template <typename T, bool TakeRegisters, bool AMnMajor, bool BMnMajor, typename Out, class RowMap>
__device__ void multiply_and_store(int k_tiles, const Ring& ring, const OutRows<Out, RowMap>& out) {
  multiply_and_store<T, TakeRegisters, AMnMajor, BMnMajor>(k_tiles, ring, out,
                                                           Tile{int(blockIdx.y), int(blockIdx.x), int(blockIdx.z)});
}

}  // namespace yolo::wgmma
