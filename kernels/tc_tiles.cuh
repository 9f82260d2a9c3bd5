// The tensor-core tiled main loop that kernels/conv_tc.cu and kernels/gemm_tc.cu share: block
// tiles, shared-memory layouts, the two pipelines (register-staged double buffering, and a
// 3-stage cp.async pipeline on sm_80+), fragment loads and MMAs per precision, and the fixed-order
// split-K second pass; the epilogue is kernels/tc_epilogue.cuh. Internal to those files.
//
// A block of 256 threads (8 warps, 2 along M x 4 along N) computes a BM x BN tile of
// C = A' * B' (A' is M x K, B' is K x N), marching along K one stage of BK at a time.
// Operands reach shared memory in one of two layouts (kernels/tc_layout.h), chosen by how they
// lie in global memory: K-major (rows contiguous along K: NHWC activations gathered for the
// forward pass, KRSC weights) or MN-major (contiguous along the tile's rows or columns: weights
// read for the backward-data pass, activations for the backward-weights pass). 16-bit fragments
// come out of shared memory with ldmatrix (.trans for MN-major); TF32 fragments with plain 32-bit
// loads (ldmatrix moves 16-bit elements only). Every stage store and fragment load is free of
// bank conflicts (tests/test_kernel_tc_banks.cpp holds them to the bank model).
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/common.cuh"
#include "kernels/half_types.h"
#include "kernels/mma.cuh"
#include "kernels/tc_plan.h"

namespace yolo::tc {

constexpr int kThreads = kTcThreads;

// The architecture being compiled, for the launch bounds (tc_min_blocks); the host pass and the
// emulation take the newest.
#if defined(__CUDA_ARCH__)
constexpr int kCodeArch = tc_code_arch(__CUDA_ARCH__ / 10);
#else
constexpr int kCodeArch = 90;
#endif
// A kernel's __launch_bounds__ minimum blocks per SM.
template <typename T>
constexpr int min_blocks(TcPass pass, int bm, bool async) {
  return tc_min_blocks(pass, bm, async, int(sizeof(T)), kCodeArch);
}

// Per element type: BK (K per stage: 64 bytes of each row), V (elements per 16-byte chunk),
// KStep (the MMA's k).
template <typename T>
struct Tc {
  static constexpr int BK = 32, V = 8, KStep = 16;
};
template <>
struct Tc<float> {
  static constexpr int BK = 16, V = 4, KStep = 8;
};

// A stage of one operand in shared memory (kernels/tc_layout.h). Thread t fills chunks t, t + 256,
// ...: R / 64 per thread.
template <typename T, bool KMajor, int R>
struct Smem {
  static constexpr int E = int(sizeof(T)), BK = Tc<T>::BK, V = Tc<T>::V;
  static constexpr int elements = tc_operand_elements(E, KMajor, R);
  static constexpr int chunks_per_thread = R / 64;
  static_assert(R % 64 == 0, "tile sides are multiples of 64");
  static_assert(BK == tc_bk(E) && V == tc_chunk_elements(E), "one stage layout");
  static_assert(tc_pitch(E, KMajor, R) * E % 16 == 0, "rows stay 16-byte aligned");

  // Elements from a row to the next: 16 rows on, the same place 16 * kRowStep further (the
  // K-major swizzle key, (row / 2) % 4, repeats every 8 rows), so sub-tiles add a constant.
  static constexpr int kRowStep = KMajor ? tc_pitch(E, true, R) : 1;

  // Position of this thread's chunk i: (row within the tile's R, k within the stage).
  __device__ static TcAt chunk(int i) { return tc_chunk_of(E, KMajor, R, int(threadIdx.x) + i * kThreads); }
  __device__ static int offset(int row, int k) { return tc_offset(E, KMajor, R, row, k); }
  __device__ static const T* at(const T* stage, int row, int k) { return stage + offset(row, k); }
};

// This thread's chunk offsets in a stage of one operand: loop-invariant, computed once (the
// swizzle's arithmetic stays out of the main loop).
template <typename T, bool KMajor, int R>
struct ChunkOffsets {
  using S = Smem<T, KMajor, R>;
  int at[S::chunks_per_thread];
  __device__ ChunkOffsets() {
#pragma unroll
    for (int i = 0; i < S::chunks_per_thread; ++i) {
      const TcAt ch = S::chunk(i);
      at[i] = S::offset(ch.row, ch.k);
    }
  }
};

// Plain matrices as operands. K-major: element (row, k) at data[row * pitch + k]; MN-major:
// element (k, row) at data[k * pitch + row]. Elements outside rows x K read as zero. `vec`
// (host-decided) promises 16-byte chunks: the contiguous extent and pitch multiples of V, data
// 16-byte aligned.
template <typename T, bool KMajor, int R>
struct MatrixLoader {
  using S = Smem<T, KMajor, R>;
  static constexpr int CP = S::chunks_per_thread, V = S::V;
  const T* data;
  int pitch, rows, k_size;
  int row[CP], k[CP];

  __device__ MatrixLoader(const T* matrix, int row_pitch, int row_count, int k_count, int r0, int k_begin)
      : data(matrix), pitch(row_pitch), rows(row_count), k_size(k_count) {
#pragma unroll
    for (int i = 0; i < CP; ++i) {
      const TcAt ch = S::chunk(i);
      row[i] = r0 + ch.row, k[i] = k_begin + ch.k;
    }
  }
  __device__ const T* element(int r, int kk) const {
    return KMajor ? data + size_t(r) * pitch + kk : data + size_t(kk) * pitch + r;
  }
  __device__ const T* base() const { return data; }
  __device__ const T* vec_ptr(int i) const { return row[i] < rows && k[i] < k_size ? element(row[i], k[i]) : nullptr; }
  __device__ void gather(int i, T (&v)[V]) const {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int r = KMajor ? row[i] : row[i] + e, kk = KMajor ? k[i] + e : k[i];
      v[e] = r < rows && kk < k_size ? *element(r, kk) : T{};
    }
  }
  __device__ void advance() {
#pragma unroll
    for (int i = 0; i < CP; ++i) k[i] += Tc<T>::BK;
  }
};

// ---- fragments and MMAs -------------------------------------------------------------------------

// The warp's 2 x 4 position in the block and its WM x WN sub-tile.
template <int BM, int BN>
struct WarpTile {
  static constexpr int WM = BM / 2, WN = BN / 4, MI = WM / 16, NI = WN / 8;
  static_assert(NI % 2 == 0, "16-bit B fragments load two n8 tiles at once");
  int m0, n0, lane;
  __device__ explicit WarpTile(int thread = int(threadIdx.x)) {
    const int warp = thread / 32;
    lane = thread % 32;
    m0 = tc_warp_row0(warp, BM), n0 = tc_warp_col0(warp, BN);
  }
};

// A lane's ldmatrix row offsets in a stage, for each k-step, at the warp's first 16 rows of A
// and columns of B (later sub-tiles add 16 rows: Smem::kRowStep). Loop-invariant, computed once.
template <typename T, bool AK, bool BKm, int BM, int BN>
struct FragmentOffsets {
  static constexpr int kSteps = Tc<T>::BK / Tc<T>::KStep;
  int a[kSteps], b[kSteps];
  __device__ explicit FragmentOffsets(const WarpTile<BM, BN>& w) {
    constexpr int E = int(sizeof(T));
    const TcAt fa = ldmatrix_a_at(w.lane, AK, E), fb = ldmatrix_b_at(w.lane, BKm, E);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      a[s] = Smem<T, AK, BM>::offset(w.m0 + fa.row, s * Tc<T>::KStep + fa.k);
      b[s] = Smem<T, BKm, BN>::offset(w.n0 + fb.row, s * Tc<T>::KStep + fb.k);
    }
  }
};

// acc += the stage's A' (rows of this warp) * B' (its columns), one MMA k-step after another.
template <typename T, bool AK, bool BKm, int BM, int BN>
__device__ __forceinline__ void compute_stage(const T* as, const T* bs, const WarpTile<BM, BN>& w,
                                              const FragmentOffsets<T, AK, BKm, BM, BN>& f,  // ldmatrix rows
                                              float (&acc)[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4]) {
  using SA = Smem<T, AK, BM>;
  using SB = Smem<T, BKm, BN>;
  constexpr int MI = WarpTile<BM, BN>::MI, NI = WarpTile<BM, BN>::NI, KS = Tc<T>::KStep;
  const int l = w.lane;
#pragma unroll
  for (int kk = 0; kk < Tc<T>::BK; kk += KS) {
    uint32_t a[MI][4], b[NI][2];
    if constexpr (std::is_same_v<T, float> && !AK) {  // MN-major TF32: element by element
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const TcAt e = tf32_a_at(l, r);
          a[i][r] = float_bits(*SA::at(as, w.m0 + i * 16 + e.row, kk + e.k));
        }
    } else {
#pragma unroll
      for (int i = 0; i < MI; ++i) mma::ldmatrix<4, !AK>(a[i], as + f.a[kk / KS] + i * 16 * SA::kRowStep);
    }
    if constexpr (std::is_same_v<T, float> && !BKm) {
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const TcAt e = tf32_b_at(l, r);
          b[j][r] = float_bits(*SB::at(bs, w.n0 + j * 8 + e.row, kk + e.k));
        }
    } else {
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        uint32_t r[4];
        mma::ldmatrix<4, !BKm>(r, bs + f.b[kk / KS] + j * 8 * SB::kRowStep);
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
      }
    }
    if constexpr (std::is_same_v<T, float>) {  // the MMA reads TF32: round the FP32 operands first
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[i][r] = mma::to_tf32(bits_float(a[i][r]));
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) b[j][r] = mma::to_tf32(bits_float(b[j][r]));
    }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        if constexpr (std::is_same_v<T, float>) mma::mma_tf32_m16n8k8(acc[i][j], a[i], b[j], acc[i][j]);
        else mma::mma_m16n8k16<T>(acc[i][j], a[i], b[j], acc[i][j]);
      }
  }
}

// ---- the two pipelines -------------------------------------------------------------------------

constexpr int kAsyncStages = kTcAsyncStages;
// Dynamic shared memory of a launch: the pipeline's stages (or the epilogue's staging, if larger).
template <typename T, bool AK, bool BKm, int BM, int BN, bool Async>
constexpr size_t launch_smem_bytes() {
  return size_t(tc_launch_smem_bytes(int(sizeof(T)), AK, BKm, BM, BN, Async ? kAsyncStages : 2));
}

// V gathered elements as one 16-byte chunk, built in registers (a memcpy of the array would go
// through local memory).
__device__ __forceinline__ uint4 pack_chunk(const float (&v)[4]) {
  return make_uint4(float_bits(v[0]), float_bits(v[1]), float_bits(v[2]), float_bits(v[3]));
}
template <typename T>
__device__ __forceinline__ uint4 pack_chunk(const T (&v)[8]) {
  auto pair = [&](int i) { return uint32_t(v[i].bits) | uint32_t(v[i + 1].bits) << 16; };
  return make_uint4(pair(0), pair(2), pair(4), pair(6));
}

// Moves one stage's chunks of a loader into registers (16 bytes each), vector or gathered. A
// loader with normalize() transforms the chunks it read (a convolution's input read through
// BatchNorm's apply: kernels/normalized_input.cuh), not the zeros; its gather does it itself.
template <typename T, bool Vec, class Loader, int CP>
__device__ __forceinline__ void fetch_chunks(const Loader& loader, uint4 (&regs)[CP]) {
#pragma unroll
  for (int i = 0; i < CP; ++i) {
    if constexpr (Vec) {
      const T* p = loader.vec_ptr(i);
      regs[i] = p ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
      if constexpr (requires { loader.normalize(i, regs[i]); })
        if (p) loader.normalize(i, regs[i]);
    } else {
      T v[Tc<T>::V];
      loader.gather(i, v);
      regs[i] = pack_chunk(v);
    }
  }
}
template <typename T, bool KMajor, int R, int CP>
__device__ __forceinline__ void stash_chunks(T* stage, const ChunkOffsets<T, KMajor, R>& to, const uint4 (&regs)[CP]) {
#pragma unroll
  for (int i = 0; i < CP; ++i) *reinterpret_cast<uint4*>(stage + to.at[i]) = regs[i];
}

// acc = A'[m0.., k_begin..k_end) * B'[.., n0..] for this thread's fragment elements; `smem`
// holds 2 stages. Register-staged double buffering: the next stage's global loads are in
// flight during this stage's MMAs. Works on every architecture and with gathered loads.
template <typename T, bool AK, bool BKm, int BM, int BN, bool VecA, bool VecB, class LA, class LB>
__device__ __forceinline__ void mainloop_registers(LA& la, LB& lb, int k_begin, int k_end, unsigned char* smem,
                                                   float (&acc)[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4]) {
  using SA = Smem<T, AK, BM>;
  using SB = Smem<T, BKm, BN>;
  // Stage s at base + s * per_stage (arithmetic, not an array of pointers indexed at run time,
  // which would live in local memory).
  constexpr int per_stage = SA::elements + SB::elements;
  T* const base = reinterpret_cast<T*>(smem);
  const WarpTile<BM, BN> w;
  const FragmentOffsets<T, AK, BKm, BM, BN> fragments(w);
  const ChunkOffsets<T, AK, BM> a_to;
  const ChunkOffsets<T, BKm, BN> b_to;
  if (k_begin >= k_end) return;
  uint4 ra[SA::chunks_per_thread], rb[SB::chunks_per_thread];
  fetch_chunks<T, VecA>(la, ra);
  fetch_chunks<T, VecB>(lb, rb);
  la.advance(), lb.advance();
  stash_chunks(base, a_to, ra);
  stash_chunks(base + SA::elements, b_to, rb);
  __syncthreads();
  int buf = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += Tc<T>::BK) {
    const bool more = k0 + Tc<T>::BK < k_end;
    if (more) {
      fetch_chunks<T, VecA>(la, ra);
      fetch_chunks<T, VecB>(lb, rb);
      la.advance(), lb.advance();
    }
    const T* stage = base + buf * per_stage;
    compute_stage<T, AK, BKm>(stage, stage + SA::elements, w, fragments, acc);
    if (more) {
      T* next = base + (buf ^ 1) * per_stage;
      stash_chunks(next, a_to, ra);
      stash_chunks(next + SA::elements, b_to, rb);
    }
    __syncthreads();  // the stores are visible, and nobody still reads `buf` when it is refilled
    buf ^= 1;
  }
}

// Issues one stage's cp.async copies (16-byte chunks; null chunks zero-filled, with the
// operand's base address as the unread source: cp.async wants a global address even then).
template <typename T, bool KMajor, int R, class Loader>
__device__ __forceinline__ void issue_stage(const Loader& loader, T* stage, const ChunkOffsets<T, KMajor, R>& to) {
#pragma unroll
  for (int i = 0; i < Smem<T, KMajor, R>::chunks_per_thread; ++i) {
    const T* p = loader.vec_ptr(i);
    mma::cp_async_16(stage + to.at[i], p ? p : loader.base(), p != nullptr);
  }
}

// The same product with a kAsyncStages-deep cp.async pipeline (sm_80+, vector loaders only):
// stage s + 2 is in flight while stage s is multiplied. `smem` holds kAsyncStages stages.
template <typename T, bool AK, bool BKm, int BM, int BN, class LA, class LB>
__device__ __forceinline__ void mainloop_async(LA& la, LB& lb, int k_begin, int k_end, unsigned char* smem,
                                               float (&acc)[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4]) {
  using SA = Smem<T, AK, BM>;
  using SB = Smem<T, BKm, BN>;
  constexpr int S = kAsyncStages, per_stage = SA::elements + SB::elements;
  T* base = reinterpret_cast<T*>(smem);
  const WarpTile<BM, BN> w;
  const FragmentOffsets<T, AK, BKm, BM, BN> fragments(w);
  const ChunkOffsets<T, AK, BM> a_to;
  const ChunkOffsets<T, BKm, BN> b_to;
  const int tiles = (k_end - k_begin + Tc<T>::BK - 1) / Tc<T>::BK;
  if (tiles <= 0) return;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < tiles) {
      issue_stage<T, AK, BM>(la, base + s * per_stage, a_to);
      issue_stage<T, BKm, BN>(lb, base + s * per_stage + SA::elements, b_to);
      la.advance(), lb.advance();
    }
    mma::cp_async_commit();  // empty groups keep the count uniform
  }
  // The buffers stage kt and stage kt + S - 1 use, as element offsets stepped round the ring (a
  // modulo by 3 every stage would cost the loop a multiply-high and its fix-ups).
  int read_at = 0, write_at = (S - 1) * per_stage;
  for (int kt = 0; kt < tiles; ++kt) {
    mma::cp_async_wait<S - 2>();  // this thread's copies of stage kt have landed
    __syncthreads();              // everyone's have; and stage kt - 1's buffer is free again
    if (kt + S - 1 < tiles) {
      T* stage = base + write_at;
      issue_stage<T, AK, BM>(la, stage, a_to);
      issue_stage<T, BKm, BN>(lb, stage + SA::elements, b_to);
      la.advance(), lb.advance();
    }
    mma::cp_async_commit();
    const T* stage = base + read_at;
    compute_stage<T, AK, BKm>(stage, stage + SA::elements, w, fragments, acc);
    write_at = read_at;  // stage kt's buffer takes stage kt + S
    read_at = read_at == (S - 1) * per_stage ? 0 : read_at + per_stage;
  }
  mma::cp_async_wait<0>();
}


// Zeroes the accumulators (before either main loop).
template <int BM, int BN>
__device__ __forceinline__ void clear(float (&acc)[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4]) {
#pragma unroll
  for (int i = 0; i < WarpTile<BM, BN>::MI; ++i)
#pragma unroll
    for (int j = 0; j < WarpTile<BM, BN>::NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// K per split: a multiple of bk, so splits fall on stage boundaries.
__host__ __device__ inline long long tc_split_chunk(long long k, int splits, int bk) {
  const long long stages = (k + bk - 1) / bk;
  return (stages + splits - 1) / splits * bk;
}

// The K range [k_begin, k_end) of split `split` of `splits` (chunks of whole stages).
struct KRange {
  int k_begin, k_end;
};
__device__ __forceinline__ KRange split_range(int k_size, int splits, int split, int bk) {
  const int chunk = int(tc_split_chunk(k_size, splits, bk));
  const int begin = min(k_size, split * chunk);
  return {begin, min(k_size, begin + chunk)};
}

// Runs the main loop the launcher chose: cp.async (Async; vector loads) or register-staged.
template <typename T, bool AK, bool BKm, int BM, int BN, bool Async, class LA, class LB>
__device__ __forceinline__ void run_mainloop(LA& la, LB& lb, KRange k, bool vec_a, bool vec_b,
                                             float (&acc)[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4]) {
  DYNAMIC_SHARED(unsigned char, smem);
  clear<BM, BN>(acc);
  if constexpr (Async) {
    mainloop_async<T, AK, BKm, BM, BN>(la, lb, k.k_begin, k.k_end, smem, acc);
  } else {
    if (vec_a && vec_b) mainloop_registers<T, AK, BKm, BM, BN, true, true>(la, lb, k.k_begin, k.k_end, smem, acc);
    else if (vec_a) mainloop_registers<T, AK, BKm, BM, BN, true, false>(la, lb, k.k_begin, k.k_end, smem, acc);
    else if (vec_b) mainloop_registers<T, AK, BKm, BM, BN, false, true>(la, lb, k.k_begin, k.k_end, smem, acc);
    else mainloop_registers<T, AK, BKm, BM, BN, false, false>(la, lb, k.k_begin, k.k_end, smem, acc);
  }
}

// ---- host side: tiles, splits, pipelines --------------------------------------------------------

// Calls launch.template operator()<BM, BN, Async>() for the plan.
template <typename F>
void with_plan(const TcPlan& plan, F&& launch) {
  if (plan.tile == 0) {
    if (plan.async) return launch.template operator()<128, 128, true>();
    return launch.template operator()<128, 128, false>();
  }
  if (plan.async) return launch.template operator()<64, 64, true>();
  return launch.template operator()<64, 64, false>();
}


// out[row][col] (pitch out_pitch; rows mapped through row_of when given) = (accumulate ? out : 0)
// + sum over s < splits, in order, of parts[s][row][col] + (bias ? bias[col] : 0), as Out.
template <typename Out>
__global__ void sum_splits_kernel(const float* parts, int splits, int rows, int cols, Out* out, int out_pitch,
                                  bool accumulate, const float* bias) {
  const size_t total = size_t(rows) * cols, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int row = int(i / cols), col = int(i % cols);
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += parts[size_t(s) * total + i];
    if (bias) sum += bias[col];
    Out* dst = out + size_t(row) * out_pitch + col;
    if (accumulate) sum += to_float(*dst);
    *dst = from_float<Out>(sum);
  }
}
template <typename Out>
void launch_sum_splits_tc(const float* parts, int splits, int rows, int cols, Out* out, int out_pitch, bool accumulate,
                          const float* bias, cudaStream_t stream) {
  const size_t total = size_t(rows) * cols;
  if (total == 0) return;
  const unsigned blocks = unsigned(std::min<size_t>((total + 255) / 256, 4096));
  LAUNCH(sum_splits_kernel<Out>, dim3(blocks), dim3(256), 0, stream, parts, splits, rows, cols, out, out_pitch,
         accumulate, bias);
}

// Lets `kernel` use `bytes` of dynamic shared memory (beyond 48 KiB needs the opt-in), once per
// kernel and device (the attribute persists; setting it at every launch would cost host time).
bool shared_opt_in_needed(const void* kernel, size_t bytes);  // true the first time per (device, kernel, bytes)
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024 || !shared_opt_in_needed(reinterpret_cast<const void*>(kernel), bytes)) return;
#if defined(__CUDACC__)
  CHECKED(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
#else
  emu::allow_dynamic_shared(reinterpret_cast<const void*>(kernel), bytes);
#endif
}

}  // namespace yolo::tc
