// The tensor-core kernels' epilogue (kernels/conv_tc.cu, kernels/gemm_tc.cu): after the main loop
// of kernels/tc_tiles.cuh, each warp stages its accumulators through shared memory and writes them
// out as 16-byte chunks of rows (kernels/tc_layout.h: tc_out_offset), with the bias, accumulation
// and rounding of the destination its epilogue class describes. Internal to those files.
#pragma once
#include <cstdint>

#include "kernels/tc_tiles.cuh"

namespace yolo::tc {

// threadIdx.x and blockIdx read anew after the main loop: volatile reads the compiler neither
// hoists above the loop nor merges with those before it, so the epilogue's indices and pointers
// are not held in registers through the loop (held, they made ptxas spill in the kernels bound
// to 128 registers).
__device__ __forceinline__ int thread_index_anew() {
#if defined(__CUDA_ARCH__)
  unsigned t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return int(t);
#else
  return int(threadIdx.x);
#endif
}
__device__ __forceinline__ uint3 block_index_anew() {
#if defined(__CUDA_ARCH__)
  uint3 b;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(b.x));
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(b.y));
  asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(b.z));
  return b;
#else
  return blockIdx;
#endif
}

// Where a tile's values go. An epilogue class provides:
//   using OutType = ...;          the destination's element type (T, or FP32 for partial sums)
//   Out* row(int r) const;        row r's first element, or nullptr past the last row
//   int cols;                     columns in a row (later ones are not written)
//   bool vec() const;             every row pointer is 16-byte aligned (chunk stores allowed)
//   const float* bias;            added per column before rounding, or null
//   bool accumulate;              dst = dst + value (in FP32, rounded once) instead of dst = value
// Whether rows at base + r * pitch all start 16-byte aligned.
template <typename Out>
__device__ __forceinline__ bool rows_aligned(const Out* base, long long pitch) {
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && pitch * sizeof(Out) % 16 == 0;
}

template <typename Out>
struct TileRows {
  Out* base;
  long long pitch;  // elements from a row to the next
  int rows, cols;
  const float* bias = nullptr;
  bool accumulate = false;
  using OutType = Out;
  __device__ Out* row(int r) const { return r < rows ? base + r * pitch : nullptr; }
  __device__ bool vec() const { return rows_aligned(base, pitch); }
};

// 16-bit values from one 32-bit word (element 0 in the low half), to FP32.
template <typename Out>
__device__ __forceinline__ float half_of(uint32_t word, int h) {
  return to_float(Out{uint16_t(word >> (16 * h))});
}

// Writes N values of row r from column col: bias, then accumulate, then one rounding; one 16-byte
// store where the row allows it, element by element at the row's end or on an unaligned row.
template <typename Out, int N, class E>
__device__ __forceinline__ void put_chunk(const E& e, bool vec, int r, int col, float (&v)[N]) {
  Out* const row = e.row(r);
  if (row == nullptr || col >= e.cols) return;
  Out* const dst = row + col;
  const bool whole = vec && col + N <= e.cols;
#pragma unroll
  for (int n = 0; n < N; ++n)
    if (e.bias && col + n < e.cols) v[n] += e.bias[col + n];
  if (whole) {
    if constexpr (std::is_same_v<Out, float>) {
      if (e.accumulate) {
        const float4 old = *reinterpret_cast<const float4*>(dst);
        v[0] += old.x, v[1] += old.y, v[2] += old.z, v[3] += old.w;
      }
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      if (e.accumulate) {
        const uint4 old = *reinterpret_cast<const uint4*>(dst);
        const uint32_t words[4] = {old.x, old.y, old.z, old.w};
#pragma unroll
        for (int n = 0; n < N; ++n) v[n] += half_of<Out>(words[n / 2], n % 2);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(mma::pack2<Out>(v[0], v[1]), mma::pack2<Out>(v[2], v[3]),
                                                  mma::pack2<Out>(v[4], v[5]), mma::pack2<Out>(v[6], v[7]));
    }
    return;
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    if (col + n >= e.cols) break;
    float x = v[n];
    if (e.accumulate) x += to_float(dst[n]);
    dst[n] = from_float<Out>(x);
  }
}

// Hands the tile to the epilogue `e` (the block's tile: rows from blockIdx.x * BM, columns from
// blockIdx.y * BN). Each warp stages its accumulators as
// FP32, 16 rows at a time, in its own slice of the (now free) stage memory (kernels/tc_layout.h:
// tc_out_offset), then reads them back a 16-byte output chunk per lane and step.
template <int BM, int BN, class E>
__device__ __forceinline__ void write_tile(const float (&acc)[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4],
                                           const E& e) {
  using Out = typename E::OutType;
  using W = WarpTile<BM, BN>;
  constexpr int WN = W::WN, N = 16 / int(sizeof(Out)), steps = 16 * (WN / N) / 32;
  static_assert(steps >= 1 && 16 * (WN / N) % 32 == 0, "a warp's 16 rows are whole steps of 32 chunks");
  __syncthreads();  // every warp is past its last stage
  const int thread = thread_index_anew();
  const W w(thread);
  const uint3 block = block_index_anew();
  const int m0 = int(block.x) * BM, n0 = int(block.y) * BN;
  const bool vec = e.vec();
  DYNAMIC_SHARED(float, smem);
  float* const mine = smem + thread / 32 * 16 * WN;
#pragma unroll
  for (int i = 0; i < W::MI; ++i) {
#pragma unroll
    for (int j = 0; j < W::NI; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const TcAt at = tc_acc_at(w.lane, j, h);
        *reinterpret_cast<float2*>(mine + tc_out_offset(WN, at.row, at.k)) =
            make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    __syncwarp();
#pragma unroll
    for (int step = 0; step < steps; ++step) {
      const TcAt at = tc_out_chunk_at(WN, N, w.lane, step);
      const int r = at.row, c = at.k;
      float v[N];
      if constexpr (N == 4) {
        const float4 x = *reinterpret_cast<const float4*>(mine + tc_out_offset(WN, r, c));
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      } else {  // two float chunks; the first loaded alternates with the row (no bank conflicts)
        const int first = tc_out_first(WN, r);
        const float4 x = *reinterpret_cast<const float4*>(mine + tc_out_offset(WN, r, c + 4 * first));
        const float4 y = *reinterpret_cast<const float4*>(mine + tc_out_offset(WN, r, c + 4 * (1 - first)));
        const float4 lo = first ? y : x, hi = first ? x : y;
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      }
      put_chunk<Out, N>(e, vec, m0 + w.m0 + i * 16 + r, n0 + w.n0 + c, v);
    }
    __syncwarp();  // read before the next 16 rows overwrite
  }
}

}  // namespace yolo::tc
