// gemm_nt_wgmma, gemm_nn_wgmma and their references (kernels/gemm_wgmma.h), on the main loop of
// kernels/wgmma_tiles.cuh with both operands arriving by TMA.
#include "kernels/gemm_wgmma.h"

#include <string>

#include "kernels/common.cuh"
#include "kernels/hopper.h"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma_tiles.cuh"

namespace yolo {

namespace {

using namespace wgmma;

// One thread of the producer warpgroup: k-tile t's boxes into its stage once both math
// warpgroups released it. B K-major: one box of 128 rows; MN-major: two of 64 columns.
template <bool BMnMajor>
__device__ void produce(const tma::TensorMap* a_map, const tma::TensorMap* b_map, int k_tiles, const Ring& ring) {
  for (int t = 0; t < k_tiles; ++t) {
    const int st = stage_of(t);
    mbarrier_wait(&ring.empty[st], empty_parity(t));
    mbarrier_arrive_expect_tx(&ring.full[st], kStageBytes);
    tma::load_2d(ring.a_tile(st), a_map, t * kBlockK, int(blockIdx.y) * kBlockM, &ring.full[st]);
    if constexpr (BMnMajor) {
      for (int h = 0; h < 2; ++h)
        tma::load_2d(ring.b_tile(st) + h * kMnHalfBytes, b_map, int(blockIdx.x) * kBlockN + 64 * h, t * kBlockK,
                     &ring.full[st]);
    } else {
      tma::load_2d(ring.b_tile(st), b_map, t * kBlockK, int(blockIdx.x) * kBlockN, &ring.full[st]);
    }
  }
}

template <typename T, bool BMnMajor>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_kernel(const __grid_constant__ tma::TensorMap a_map,
                                                                 const __grid_constant__ tma::TensorMap b_map, T* c,
                                                                 int m, int n, int k) {
  const Ring ring = make_ring(1);
  const int k_tiles = (k + kBlockK - 1) / kBlockK;
  if (threadIdx.x < 128) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) produce<BMnMajor>(&a_map, &b_map, k_tiles, ring);
    return;
  }
  multiply_and_store<T, true, false, BMnMajor>(k_tiles, ring, OutRows<T>{c, n, m, n, nullptr});
}

template <typename T, bool BMnMajor>
void launch(const tma::TensorMap& a_map, const tma::TensorMap& b_map, T* c, int m, int n, int k,
            cudaStream_t stream) {
  tc::allow_shared(gemm_wgmma_kernel<T, BMnMajor>, kSharedBytes);
  LAUNCH((gemm_wgmma_kernel<T, BMnMajor>), dim3(ceil_div(size_t(n), kBlockN), ceil_div(size_t(m), kBlockM)),
         dim3(kThreads), kSharedBytes, stream, a_map, b_map, c, m, n, k);
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
  launch<T, false>(a_map, b_map, c, m, n, k, stream);
}

template <typename T>
void gemm_nn_wgmma(const T* a, const T* b, T* c, int m, int n, int k, cudaStream_t stream) {
  if (!current_device_runs_wgmma())
    throw Error("gemm_nn_wgmma: wgmma needs sm_90a code on an sm_90 device (H100, H200) and a build whose ARCH has 90");
  if (m < 1 || n < 8 || k < 8 || k % 8 != 0 || n % 8 != 0)
    throw Error("gemm_nn_wgmma: m must be positive and n and k positive multiples of 8 (m " + std::to_string(m) +
                ", n " + std::to_string(n) + ", k " + std::to_string(k) + ")");
  const tma::TensorMap a_map = tma::encode_2d(a, uint64_t(k), uint64_t(m), uint64_t(k) * 2, kBlockK, kBlockM, 1);
  const tma::TensorMap b_map = tma::encode_2d(b, uint64_t(n), uint64_t(k), uint64_t(n) * 2, 64, kBlockK, 1);
  launch<T, true>(a_map, b_map, c, m, n, k, stream);
}

template <typename T>
void gemm_nn_reference(const T* a, const T* b, T* c, int m, int n, int k) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int kk = 0; kk < k; ++kk)
        sum += double(to_float(a[size_t(i) * k + kk])) * double(to_float(b[size_t(kk) * n + j]));
      c[size_t(i) * n + j] = from_float<T>(float(sum));
    }
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
template void gemm_nn_wgmma<Bf16>(const Bf16*, const Bf16*, Bf16*, int, int, int, cudaStream_t);
template void gemm_nn_wgmma<Fp16>(const Fp16*, const Fp16*, Fp16*, int, int, int, cudaStream_t);
template void gemm_nn_reference<Bf16>(const Bf16*, const Bf16*, Bf16*, int, int, int);
template void gemm_nn_reference<Fp16>(const Fp16*, const Fp16*, Fp16*, int, int, int);
template void gemm_nt_reference<Bf16>(const Bf16*, const Bf16*, Bf16*, int, int, int);
template void gemm_nt_reference<Fp16>(const Fp16*, const Fp16*, Fp16*, int, int, int);

}  // namespace yolo
