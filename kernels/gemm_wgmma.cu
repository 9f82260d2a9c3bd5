// gemm_nt_wgmma and its reference (kernels/gemm_wgmma.h).
#include "kernels/gemm_wgmma.h"

#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/hopper.h"
#include "kernels/mma.cuh"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma.cuh"

namespace yolo {

namespace {

constexpr int kBlockM = 128, kBlockN = 128, kBlockK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kTileBytes = 128 * kBlockK * 2;  // one operand's 128 rows of 64 k: 128 bytes each
constexpr uint32_t kStageBytes = 2 * kTileBytes;
constexpr size_t kSharedBytes = 1024 + size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t);
constexpr uint32_t kRowGroupBytes = 8 * 128;  // 8 rows of the 128-byte swizzle: the descriptor's stride

// One thread of the producer warpgroup: stage t % kStages gets k-tile t once both math
// warpgroups released it.
__device__ void produce(const tma::TensorMap* a_map, const tma::TensorMap* b_map, int k, unsigned char* stages,
                        uint64_t* full, uint64_t* empty) {
  const int tiles = (k + kBlockK - 1) / kBlockK;
  for (int t = 0; t < tiles; ++t) {
    const int st = t % kStages;
    wgmma::mbarrier_wait(&empty[st], (uint32_t(t / kStages) & 1) ^ 1);
    wgmma::mbarrier_arrive_expect_tx(&full[st], kStageBytes);
    unsigned char* stage = stages + st * kStageBytes;
    tma::load_2d(stage, a_map, t * kBlockK, int(blockIdx.y) * kBlockM, &full[st]);
    tma::load_2d(stage + kTileBytes, b_map, t * kBlockK, int(blockIdx.x) * kBlockN, &full[st]);
  }
}

// Math warpgroup `half` (0, 1): rows 64*half.. of the block's A tile against all 128 of B's.
template <typename T>
__device__ void multiply(int k, int half, uint32_t stages, uint64_t* full, uint64_t* empty, float (&acc)[64]) {
  const int tiles = (k + kBlockK - 1) / kBlockK;
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  for (int t = 0; t < tiles; ++t) {
    const int st = t % kStages;
    wgmma::mbarrier_wait(&full[st], uint32_t(t / kStages) & 1);
    const uint32_t a_tile = stages + uint32_t(st) * kStageBytes + uint32_t(half) * 64 * 128;
    const uint32_t b_tile = stages + uint32_t(st) * kStageBytes + kTileBytes;
    wgmma::fence(acc);
#pragma unroll
    for (uint32_t j = 0; j < kBlockK / 16; ++j)
      wgmma::mma_async<T, 128>(acc, wgmma::descriptor(a_tile + 32 * j, wgmma::Swizzle::B128, 0, kRowGroupBytes),
                               wgmma::descriptor(b_tile + 32 * j, wgmma::Swizzle::B128, 0, kRowGroupBytes),
                               t > 0 || j > 0);
    wgmma::commit_group();
    wgmma::wait_group<1>(acc);  // the previous stage's batch is done: release that stage
    if (t > 0) wgmma::mbarrier_arrive(&empty[(t - 1) % kStages]);
  }
  wgmma::wait_group<0>(acc);
}

// The D fragment (wgmma.cuh) rounded to T, pairs of columns stored together where aligned.
template <typename T>
__device__ void store(const float (&acc)[64], T* c, int m, int n, int half) {
  const unsigned warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 64; i += 2) {
    const int row = int(blockIdx.y) * kBlockM + 64 * half + int(16 * warp + lane / 4) + 8 * ((i / 2) % 2);
    const int col = int(blockIdx.x) * kBlockN + 8 * (i / 4) + int(2 * (lane % 4));
    if (row >= m || col >= n) continue;
    T* out = c + size_t(row) * size_t(n) + size_t(col);
    if (n % 2 == 0) {
      *reinterpret_cast<uint32_t*>(out) = mma::pack2<T>(acc[i], acc[i + 1]);
    } else {
      out[0] = from_float<T>(acc[i]);
      if (col + 1 < n) out[1] = from_float<T>(acc[i + 1]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) gemm_nt_wgmma_kernel(const __grid_constant__ tma::TensorMap a_map,
                                                                    const __grid_constant__ tma::TensorMap b_map,
                                                                    T* c, int m, int n, int k) {
  DYNAMIC_SHARED(unsigned char, raw);
  const uint32_t raw_address = wgmma::shared_address(raw);
  const uint32_t stages = (raw_address + 1023u) & ~1023u;  // the 128-byte swizzle's pattern starts here
  unsigned char* smem = raw + (stages - raw_address);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0)
    for (int st = 0; st < kStages; ++st) {
      wgmma::mbarrier_init(&full[st], 1);
      wgmma::mbarrier_init(&empty[st], 256);  // every thread of both math warpgroups
    }
  __syncthreads();
  const int warpgroup = int(threadIdx.x / 128);
  if (warpgroup == 0) {
    wgmma::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) produce(&a_map, &b_map, k, smem, full, empty);
    return;
  }
  wgmma::setmaxnreg_inc<232>();
  float acc[64];
  multiply<T>(k, warpgroup - 1, stages, full, empty, acc);
  store<T>(acc, c, m, n, warpgroup - 1);
}

}  // namespace

template <typename T>
void gemm_nt_wgmma(const T* a, const T* b, T* c, int m, int n, int k, cudaStream_t stream) {
  if (!current_device_runs_wgmma())
    throw Error("gemm_nt_wgmma: wgmma needs sm_90a code on an sm_90 device (H100, H200) and a build whose ARCH has 90");
  if (m < 1 || n < 1 || k < 8 || k % 8 != 0)
    throw Error("gemm_nt_wgmma: m and n must be positive and k a positive multiple of 8 (m " + std::to_string(m) +
                ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  const tma::TensorMap a_map = tma::encode_2d(a, uint64_t(k), uint64_t(m), uint64_t(k) * 2, kBlockK, kBlockM, 1);
  const tma::TensorMap b_map = tma::encode_2d(b, uint64_t(k), uint64_t(n), uint64_t(k) * 2, kBlockK, kBlockN, 1);
  tc::allow_shared(gemm_nt_wgmma_kernel<T>, kSharedBytes);
  LAUNCH(gemm_nt_wgmma_kernel<T>, dim3(ceil_div(size_t(n), kBlockN), ceil_div(size_t(m), kBlockM)), dim3(kThreads),
         kSharedBytes, stream, a_map, b_map, c, m, n, k);
}

template <typename T>
void gemm_nt_reference(const T* a, const T* b, T* c, int m, int n, int k) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int kk = 0; kk < k; ++kk)
        sum += double(to_float(a[size_t(i) * k + kk])) * double(to_float(b[size_t(j) * k + kk]));
      c[size_t(i) * n + j] = from_float<T>(float(sum));
    }
}

template void gemm_nt_wgmma<Bf16>(const Bf16*, const Bf16*, Bf16*, int, int, int, cudaStream_t);
template void gemm_nt_wgmma<Fp16>(const Fp16*, const Fp16*, Fp16*, int, int, int, cudaStream_t);
template void gemm_nt_reference<Bf16>(const Bf16*, const Bf16*, Bf16*, int, int, int);
template void gemm_nt_reference<Fp16>(const Fp16*, const Fp16*, Fp16*, int, int, int);

}  // namespace yolo
