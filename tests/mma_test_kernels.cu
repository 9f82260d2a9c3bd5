// Kernels that test kernels/mma.cuh one instruction at a time, emulated and natively (see the
// header). The fragment loads below are written from the PTX ISA's figures ("Matrix fragments
// for mma.m16n8k8 / mma.m16n8k16"), independently of the emulated twin's mapping in mma.cuh.
#include "tests/mma_test_kernels.h"

#include <algorithm>
#include <string>

#include "kernels/common.cuh"
#include "kernels/mma.cuh"
#include "kernels/precision.h"

namespace yolo::testing {

namespace {

// The launchers refuse what the device cannot run (a kernel would reach __trap).
void require_compute_capability(int need, const char* what) {
  const int cc = current_compute_capability();
  if (cc < need)
    throw Error(std::string(what) + " needs sm_" + std::to_string(need) + " or newer; this device is sm_" +
                std::to_string(cc));
}

__device__ __forceinline__ uint32_t pair16(const uint16_t* p, int first, int second) {
  return uint32_t(p[first]) | uint32_t(p[second]) << 16;
}

__device__ __forceinline__ void swap_registers(uint32_t& x, uint32_t& y) {
  const uint32_t t = x;
  x = y;
  y = t;
}

template <int N>
__device__ __forceinline__ void rotate_lanes(uint32_t (&r)[N], int by) {
  const int source = int(threadIdx.x % 32 + by) % 32;
  for (int i = 0; i < N; ++i) r[i] = __shfl_sync(0xffffffffu, r[i], source);
}

template <int NA, int NB>
__device__ __forceinline__ void permute_operands(uint32_t (&a)[NA], uint32_t (&b)[NB], int permute) {
  if (permute == kMmaSwapA01) swap_registers(a[0], a[1]);
  if constexpr (NA == 4)
    if (permute == kMmaSwapA02) swap_registers(a[0], a[2]);
  if (permute == kMmaSwapAHalves) a[0] = a[0] >> 16 | a[0] << 16;
  if (permute == kMmaRotateALanes) rotate_lanes(a, 4);
  if (permute == kMmaRotateBLanes) rotate_lanes(b, 1);
  if constexpr (NB == 2)
    if (permute == kMmaSwapB01) swap_registers(b[0], b[1]);
  if (permute == kMmaSwapBHalves) b[0] = b[0] >> 16 | b[0] << 16;
}

// g = lane / 4 ("groupID"), t = lane % 4 ("threadID_in_group").
template <MmaKind kind>
__global__ void mma_tile(const void* a_all, const void* b_all, const float* c_all, float* d_all,
                         float* d_in_place_all, int permute) {
  // (Not the header's constexpr helpers: host functions, which nvcc refuses in device code.)
  constexpr bool k8 = kind == MmaKind::Tf32M16n8k8 || kind == MmaKind::F16M16n8k8, f16_k8 = kind == MmaKind::F16M16n8k8;
  constexpr int K = k8 ? 8 : 16, NA = f16_k8 ? 2 : 4, NB = f16_k8 ? 1 : 2;
  const int lane = int(threadIdx.x % 32), tile = int(blockIdx.x);
  const int g = lane / 4, t = lane % 4;
  uint32_t a[NA], b[NB];
  if constexpr (kind == MmaKind::Tf32M16n8k8) {
    // a0:(g, t) a1:(g+8, t) a2:(g, t+4) a3:(g+8, t+4); b0:(t, g) b1:(t+4, g).
    const float* A = static_cast<const float*>(a_all) + tile * 16 * K;
    const float* B = static_cast<const float*>(b_all) + tile * K * 8;
    a[0] = mma::to_tf32(A[g * K + t]);
    a[1] = mma::to_tf32(A[(g + 8) * K + t]);
    a[2] = mma::to_tf32(A[g * K + t + 4]);
    a[3] = mma::to_tf32(A[(g + 8) * K + t + 4]);
    b[0] = mma::to_tf32(B[t * 8 + g]);
    b[1] = mma::to_tf32(B[(t + 4) * 8 + g]);
  } else if constexpr (K == 16) {
    // Halves a0..a7 (two per register, the lower index in the low 16 bits):
    //   row g for a0,a1,a4,a5 and g+8 for a2,a3,a6,a7; column 2t + (i & 1), +8 for a4..a7.
    //   b0..b3: row 2t + (i & 1), +8 for b2,b3; column g.
    const uint16_t* A = static_cast<const uint16_t*>(a_all) + tile * 16 * K;
    const uint16_t* B = static_cast<const uint16_t*>(b_all) + tile * K * 8;
    a[0] = pair16(A, g * K + 2 * t, g * K + 2 * t + 1);
    a[1] = pair16(A, (g + 8) * K + 2 * t, (g + 8) * K + 2 * t + 1);
    a[2] = pair16(A, g * K + 2 * t + 8, g * K + 2 * t + 9);
    a[3] = pair16(A, (g + 8) * K + 2 * t + 8, (g + 8) * K + 2 * t + 9);
    b[0] = pair16(B, (2 * t) * 8 + g, (2 * t + 1) * 8 + g);
    b[1] = pair16(B, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g);
  } else {
    // FP16 m16n8k8: a0,a1 row g, a2,a3 row g+8, column 2t + (i & 1); b0,b1 row 2t + (i & 1), column g.
    const uint16_t* A = static_cast<const uint16_t*>(a_all) + tile * 16 * K;
    const uint16_t* B = static_cast<const uint16_t*>(b_all) + tile * K * 8;
    a[0] = pair16(A, g * K + 2 * t, g * K + 2 * t + 1);
    a[1] = pair16(A, (g + 8) * K + 2 * t, (g + 8) * K + 2 * t + 1);
    b[0] = pair16(B, (2 * t) * 8 + g, (2 * t + 1) * 8 + g);
  }
  permute_operands(a, b, permute);

  // C and D, every shape: c0,c1 row g, c2,c3 row g+8; column 2t + (i & 1).
  const float* C = c_all + tile * 128;
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  if (permute == kMmaSwapC01) {
    const float x = c[0];
    c[0] = c[1];
    c[1] = x;
  }
  float d[4];
  if constexpr (kind == MmaKind::Tf32M16n8k8) mma::mma_tf32_m16n8k8(d, a, b, c);
  else if constexpr (kind == MmaKind::Bf16M16n8k16) mma::mma_bf16_m16n8k16(d, a, b, c);
  else if constexpr (kind == MmaKind::F16M16n8k16) mma::mma_f16_m16n8k16(d, a, b, c);
  else mma::mma_f16_m16n8k8(d, a, b[0], c);
  if (d_in_place_all) {
    if constexpr (kind == MmaKind::Tf32M16n8k8) mma::mma_tf32_m16n8k8(c, a, b, c);
    else if constexpr (kind == MmaKind::Bf16M16n8k16) mma::mma_bf16_m16n8k16(c, a, b, c);
    else if constexpr (kind == MmaKind::F16M16n8k16) mma::mma_f16_m16n8k16(c, a, b, c);
    else mma::mma_f16_m16n8k8(c, a, b[0], c);
  }
  if (permute == kMmaSwapD02) {
    const float x = d[0];
    d[0] = d[2];
    d[2] = x;
  }
  float* D = d_all + tile * 128;
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
  if (d_in_place_all) {
    float* E = d_in_place_all + tile * 128;
    for (int i = 0; i < 4; ++i) E[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = c[i];
  }
}

template <int N, bool Trans>
__global__ void ldmatrix_tile(const uint16_t* tile, const int* lane_offsets, uint32_t* out) {
  __align__(16) __shared__ uint16_t shared_tile[kLdmatrixTileElements];
  const int lane = int(threadIdx.x);
  for (int i = lane; i < kLdmatrixTileElements; i += 32) shared_tile[i] = tile[i];
  __syncthreads();
  uint32_t r[N];
  mma::ldmatrix<N, Trans>(r, shared_tile + lane_offsets[lane]);
  for (int j = 0; j < N; ++j) out[4 * lane + j] = r[j];
}

constexpr int kMaxCpAsyncChunks = 512;  // 8 KiB of shared memory

__global__ void cp_async_fill(const uint32_t* src, const int* fill, uint32_t* out, int chunks) {
  __align__(16) __shared__ uint32_t staged[kMaxCpAsyncChunks * 4];
  const int threads = int(blockDim.x);
  for (int i = int(threadIdx.x); i < chunks * 4; i += threads) staged[i] = kCpAsyncMarker;
  __syncthreads();  // the markers land before the copies (no ordering between st.shared and cp.async otherwise)
  for (int i = int(threadIdx.x); i < chunks; i += threads) mma::cp_async_16(&staged[4 * i], &src[4 * i], fill[i] != 0);
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  __syncthreads();
  for (int i = int(threadIdx.x); i < chunks * 4; i += threads) out[i] = staged[i];
}

__global__ void cp_async_groups(const uint32_t* src, uint32_t* out, bool observe_in_flight) {
  __align__(16) __shared__ uint32_t staged[kMaxCpAsyncChunks * 4];
  const int threads = int(blockDim.x), me = int(threadIdx.x), stage_words = 3 * threads * 4;
  for (int w = 0; w < 12; ++w) staged[12 * me + w] = kCpAsyncMarker;
  __syncthreads();
  for (int j = 0; j < 3; ++j) {
    mma::cp_async_16(&staged[12 * me + 4 * j], &src[12 * me + 4 * j], true);
    mma::cp_async_commit();
  }
  // Stage s (1, 2) sees groups 0..s-1 complete; the rest only where observed on purpose.
  auto record = [&](int stage, int complete_chunks) {
    for (int w = 0; w < 12; ++w)
      if (observe_in_flight || w / 4 < complete_chunks) out[stage * stage_words + 12 * me + w] = staged[12 * me + w];
  };
  if (observe_in_flight) record(0, 0);
  mma::cp_async_wait<2>();
  record(1, 1);
  mma::cp_async_wait<1>();
  record(2, 2);
  mma::cp_async_wait<0>();
  __syncthreads();
  const int other = (me + 1) % threads;
  for (int w = 0; w < 12; ++w) out[3 * stage_words + 12 * me + w] = staged[12 * other + w];
}

__global__ void to_tf32_each(const float* in, uint32_t* out, int n) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x))
    out[i] = mma::to_tf32(in[i]);
}
__global__ void to_tf32_patterns(uint32_t first, uint32_t step, uint32_t* out, int n) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x))
    out[i] = mma::to_tf32(bits_float(first + uint32_t(i) * step));
}
__global__ void pack_bf16x2_each(const float* in, uint32_t* out, int pairs) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < pairs; i += int(gridDim.x * blockDim.x))
    out[i] = mma::pack_bf16x2(in[2 * i], in[2 * i + 1]);
}
__global__ void pack_f16x2_each(const float* in, uint32_t* out, int pairs) {
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < pairs; i += int(gridDim.x * blockDim.x))
    out[i] = mma::pack_f16x2(in[2 * i], in[2 * i + 1]);
}

#if !defined(__CUDACC__)
__global__ void warp_op_after_exit(int exited_lane, bool use_ldmatrix) {
  __align__(16) __shared__ uint16_t zeros[32 * 8];  // static storage under emulation: zeros
  if (int(threadIdx.x) == exited_lane) return;
  if (use_ldmatrix) {
    uint32_t r[4];
    mma::ldmatrix<4, false>(r, &zeros[threadIdx.x * 8]);
  } else {
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4];
    const float c[4] = {0, 0, 0, 0};
    mma::mma_bf16_m16n8k16(d, a, b, c);
  }
}
#endif

}  // namespace

const char* mma_kind_name(MmaKind kind) {
  switch (kind) {
    case MmaKind::Tf32M16n8k8: return "tf32 m16n8k8";
    case MmaKind::Bf16M16n8k16: return "bf16 m16n8k16";
    case MmaKind::F16M16n8k16: return "f16 m16n8k16";
    case MmaKind::F16M16n8k8: return "f16 m16n8k8";
  }
  return "?";
}

bool mma_permute_applies(MmaKind kind, int permute) {
  switch (permute) {
    case kMmaSwapA02: return mma_a_registers(kind) == 4;
    case kMmaSwapB01: return mma_b_registers(kind) == 2;
    case kMmaSwapAHalves:
    case kMmaSwapBHalves: return kind != MmaKind::Tf32M16n8k8;
    default: return permute >= 0 && permute < kMmaPermuteCount;
  }
}

void launch_mma(MmaKind kind, const void* a, const void* b, const float* c, float* d, float* d_in_place, int tiles,
                int permute) {
  if (!mma_permute_applies(kind, permute))
    throw Error("launch_mma: permute code " + std::to_string(permute) + " does not apply to " + mma_kind_name(kind));
  const bool needs_sm80 = kind == MmaKind::Tf32M16n8k8 || kind == MmaKind::Bf16M16n8k16;
  require_compute_capability(needs_sm80 ? 80 : 75, mma_kind_name(kind));
  switch (kind) {
    case MmaKind::Tf32M16n8k8:
      LAUNCH(mma_tile<MmaKind::Tf32M16n8k8>, dim3(tiles), dim3(32), 0, 0, a, b, c, d, d_in_place, permute);
      break;
    case MmaKind::Bf16M16n8k16:
      LAUNCH(mma_tile<MmaKind::Bf16M16n8k16>, dim3(tiles), dim3(32), 0, 0, a, b, c, d, d_in_place, permute);
      break;
    case MmaKind::F16M16n8k16:
      LAUNCH(mma_tile<MmaKind::F16M16n8k16>, dim3(tiles), dim3(32), 0, 0, a, b, c, d, d_in_place, permute);
      break;
    case MmaKind::F16M16n8k8:
      LAUNCH(mma_tile<MmaKind::F16M16n8k8>, dim3(tiles), dim3(32), 0, 0, a, b, c, d, d_in_place, permute);
      break;
  }
}

void launch_ldmatrix(int matrices, bool trans, const uint16_t* tile, const int* lane_offsets, uint32_t* out) {
  require_compute_capability(75, "ldmatrix");
  if (matrices == 1 && !trans) LAUNCH((ldmatrix_tile<1, false>), dim3(1), dim3(32), 0, 0, tile, lane_offsets, out);
  else if (matrices == 1) LAUNCH((ldmatrix_tile<1, true>), dim3(1), dim3(32), 0, 0, tile, lane_offsets, out);
  else if (matrices == 2 && !trans) LAUNCH((ldmatrix_tile<2, false>), dim3(1), dim3(32), 0, 0, tile, lane_offsets, out);
  else if (matrices == 2) LAUNCH((ldmatrix_tile<2, true>), dim3(1), dim3(32), 0, 0, tile, lane_offsets, out);
  else if (matrices == 4 && !trans) LAUNCH((ldmatrix_tile<4, false>), dim3(1), dim3(32), 0, 0, tile, lane_offsets, out);
  else if (matrices == 4) LAUNCH((ldmatrix_tile<4, true>), dim3(1), dim3(32), 0, 0, tile, lane_offsets, out);
  else throw Error("launch_ldmatrix: " + std::to_string(matrices) + " matrices (1, 2 or 4)");
}

void launch_cp_async_fill(const uint32_t* src, const int* fill, uint32_t* out, int chunks, int threads) {
  require_compute_capability(80, "cp.async");
  if (chunks > kMaxCpAsyncChunks) throw Error("launch_cp_async_fill: more than 512 chunks");
  LAUNCH(cp_async_fill, dim3(1), dim3(threads), 0, 0, src, fill, out, chunks);
}

void launch_cp_async_groups(const uint32_t* src, uint32_t* out, int threads, bool observe_in_flight) {
  require_compute_capability(80, "cp.async");
  if (3 * threads > kMaxCpAsyncChunks) throw Error("launch_cp_async_groups: more than 170 threads");
  LAUNCH(cp_async_groups, dim3(1), dim3(threads), 0, 0, src, out, observe_in_flight);
}

void launch_to_tf32(const float* in, uint32_t* out, int n) {
  LAUNCH(to_tf32_each, dim3(ceil_div(size_t(n), 256)), dim3(256), 0, 0, in, out, n);
}
void launch_to_tf32_patterns(uint32_t first, uint32_t step, uint32_t* out, int n) {
  constexpr unsigned kMaxBlocks = 65536;  // 16M threads: grid-stride beyond (a 2^28 chunk: 16 each)
  LAUNCH(to_tf32_patterns, dim3(std::min(ceil_div(size_t(n), 256), kMaxBlocks)), dim3(256), 0, 0, first, step, out,
         n);
}
void launch_pack_bf16x2(const float* in, uint32_t* out, int pairs) {
  LAUNCH(pack_bf16x2_each, dim3(ceil_div(size_t(pairs), 256)), dim3(256), 0, 0, in, out, pairs);
}
void launch_pack_f16x2(const float* in, uint32_t* out, int pairs) {
  LAUNCH(pack_f16x2_each, dim3(ceil_div(size_t(pairs), 256)), dim3(256), 0, 0, in, out, pairs);
}

#if defined(__CUDACC__)
void launch_warp_op_with_exited_lane(int, bool) { throw Error("launch_warp_op_with_exited_lane: emulation only"); }
#else
void launch_warp_op_with_exited_lane(int exited_lane, bool ldmatrix) {
  LAUNCH(warp_op_after_exit, dim3(1), dim3(32), 0, 0, exited_lane, ldmatrix);
}
#endif

}  // namespace yolo::testing
