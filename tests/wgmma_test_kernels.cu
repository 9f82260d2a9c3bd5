// The warpgroup GEMM of tests/wgmma_test_kernels.h. Its shared-memory layout is written from the
// PTX ISA's wgmma layout and descriptor sections (through kernels/wgmma.cuh's k_major_address),
// and its fragment placement from the ISA's D-fragment figure, independently of the emulated
// twin's arithmetic.
#include "tests/wgmma_test_kernels.h"

#include <string>

#include "kernels/common.cuh"
#include "kernels/hopper.h"
#include "kernels/mma.cuh"
#include "kernels/precision.h"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma.cuh"

namespace yolo::testing {

namespace {

using wgmma::Swizzle;

// Whether `fault` is planted. Natively never: the faults are for the emulation to catch, and a
// run-time branch around wgmma.fence would make ptxas serialise the warpgroup's wgmma.
__device__ __forceinline__ bool planted(WgmmaFault fault, WgmmaFault which) {
#if defined(__CUDACC__)
  (void)fault;
  (void)which;
  return false;
#else
  return fault == which;
#endif
}

struct StageLayout {
  uint32_t row_bytes;  // one operand row's bytes in a stage: the swizzle width (None: a k16 slice)
  uint32_t leading, stride;
  uint32_t a_bytes, stage_bytes;
};

__host__ __device__ inline StageLayout stage_layout(Swizzle s, int n) {
  StageLayout l{};
  l.row_bytes = s == Swizzle::None ? 32 : wgmma::swizzle_bytes(s);
  l.leading = s == Swizzle::None ? 128 : 0;  // None: core matrices 128 bytes apart along K
  l.stride = s == Swizzle::None ? 256 : 8 * l.row_bytes;
  l.a_bytes = 64 * l.row_bytes;
  l.stage_bytes = (64 + uint32_t(n)) * l.row_bytes;
  return l;
}

// The ring, then the mbarriers ("full", "empty"), after up to 1008 bytes to the first 1024-byte
// boundary (the planted UnalignedBase uses none of them, and stays inside).
size_t shared_bytes(Swizzle s, int n) {
  return 1024 + size_t(kWgmmaStages) * stage_layout(s, n).stage_bytes + 2 * kWgmmaStages * sizeof(uint64_t);
}

// One producer warp: tile t of K goes to stage t % kWgmmaStages once the warpgroup emptied it.
template <int N>
__device__ void produce(const uint16_t* a, const uint16_t* b, int m, int k, Swizzle s, uint32_t base,
                        unsigned char* smem, uint64_t* full, uint64_t* empty, WgmmaFault fault) {
  const StageLayout l = stage_layout(s, N);
  const unsigned lane = threadIdx.x - 128, chunks_per_row = l.row_bytes / 16;
  const int tile_k = int(l.row_bytes / 2), tiles = (k + tile_k - 1) / tile_k, m0 = int(blockIdx.x) * 64;
  for (int t = 0; t < tiles; ++t) {
    const int st = t % kWgmmaStages;
    const uint32_t round = uint32_t(t / kWgmmaStages);
    if (!planted(fault, WgmmaFault::SkipEmptyWait)) wgmma::mbarrier_wait(&empty[st], (round & 1) ^ 1);
    const uint32_t stage = base + uint32_t(st) * l.stage_bytes;
    for (unsigned i = lane; i < (64 + N) * chunks_per_row; i += 32) {
      const unsigned row = i / chunks_per_row, chunk = i % chunks_per_row;
      const bool is_a = row < 64;
      const unsigned r = is_a ? row : row - 64;
      const int kk = t * tile_k + int(chunk) * 8;
      const bool fill = (!is_a || m0 + int(r) < m) && kk < k;
      const uint16_t* src = fill ? (is_a ? a + size_t(m0 + int(r)) * k : b + size_t(r) * k) + kk : a;
      const uint32_t tile = stage + (is_a ? 0 : l.a_bytes);
      const uint32_t address = planted(fault, WgmmaFault::WrongSwizzle)
                                   ? tile + (r / 8) * l.stride + (r % 8) * l.row_bytes + chunk * 16
                                   : wgmma::k_major_address(tile, s, l.leading, l.stride, r, chunk * 16);
      mma::cp_async_16(smem + (address - base), src, fill);
    }
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
    if (!planted(fault, WgmmaFault::NoProxyFence)) wgmma::fence_proxy_async();
    wgmma::mbarrier_arrive(&full[st]);
  }
}

// B's tile t (N rows) copied by this thread alone, as produce's lanes copy it (the planted
// BWrittenAfterArrive: after the arrive, so only A's TMA box completes the phase).
template <int N>
__device__ void copy_b_alone(const uint16_t* b, int k, int t, Swizzle s, uint32_t base, unsigned char* smem,
                             uint32_t stage) {
  const StageLayout l = stage_layout(s, N);
  const unsigned chunks_per_row = l.row_bytes / 16;
  for (unsigned r = 0; r < unsigned(N); ++r) {  // a row at a time (the emulation holds 64 copies in flight)
    for (unsigned chunk = 0; chunk < chunks_per_row; ++chunk) {
      const int kk = t * int(l.row_bytes / 2) + int(chunk) * 8;
      const uint32_t address = wgmma::k_major_address(stage + l.a_bytes, s, l.leading, l.stride, r, chunk * 16);
      mma::cp_async_16(smem + (address - base), kk < k ? b + size_t(r) * k + kk : b, kk < k);
    }
    mma::cp_async_commit();
    mma::cp_async_wait<0>();
  }
  wgmma::fence_proxy_async();
}

// The same ring filled by TMA: one lane announces the stage's bytes and issues two boxes.
template <int N>
__device__ void produce_tma(const tma::TensorMap* a_map, const tma::TensorMap* b_map, const uint16_t* b, int k,
                            Swizzle s, uint32_t base, unsigned char* smem, uint64_t* full, uint64_t* empty,
                            WgmmaFault fault) {
  if (threadIdx.x != 128) return;
  const StageLayout l = stage_layout(s, N);
  const int tile_k = int(l.row_bytes / 2), tiles = (k + tile_k - 1) / tile_k;
  const bool b_alone = planted(fault, WgmmaFault::BWrittenAfterArrive);
  const uint32_t expected =
      (b_alone ? l.a_bytes : l.stage_bytes) - (planted(fault, WgmmaFault::WrongExpectTx) ? 16 : 0);
  for (int t = 0; t < tiles; ++t) {
    const int st = t % kWgmmaStages;
    wgmma::mbarrier_wait(&empty[st], (uint32_t(t / kWgmmaStages) & 1) ^ 1);
    wgmma::mbarrier_arrive_expect_tx(&full[st], expected);
    unsigned char* stage = smem + st * l.stage_bytes;
    if (b_alone) copy_b_alone<N>(b, k, t, s, base, smem, base + uint32_t(st) * l.stage_bytes);
    tma::load_2d(stage, a_map, t * tile_k, int(blockIdx.x) * 64, &full[st]);
    if (!b_alone) tma::load_2d(stage + l.a_bytes, b_map, t * tile_k, 0, &full[st]);
  }
}

// The warpgroup: wgmma over each stage's k16 slices, then the D fragment to C.
template <typename T, int N>
__device__ void consume(float* c, int m, int k, Swizzle s, uint32_t base, uint64_t* full, uint64_t* empty,
                        WgmmaFault fault) {
  const StageLayout l = stage_layout(s, N);
  const int tile_k = int(l.row_bytes / 2), tiles = (k + tile_k - 1) / tile_k;
  const uint32_t slices = l.row_bytes / 32;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  const bool wait_late = planted(fault, WgmmaFault::FullWaitAfterIssue);
  const bool release_early = planted(fault, WgmmaFault::ReleaseBeforeWait);
  for (int t = 0; t < tiles; ++t) {
    const int st = t % kWgmmaStages;
    const uint32_t parity = uint32_t(t / kWgmmaStages) & 1;
    if (!planted(fault, WgmmaFault::SkipFullWait) && !wait_late) wgmma::mbarrier_wait(&full[st], parity);
    const uint32_t stage = base + uint32_t(st) * l.stage_bytes;
    if (!planted(fault, WgmmaFault::NoWgmmaFence)) wgmma::fence(acc);
#pragma unroll 1
    for (uint32_t j = 0; j < slices; ++j) {
      const uint64_t a_desc = wgmma::descriptor(stage + 32 * j, s, l.leading, l.stride);
      const uint64_t b_desc = wgmma::descriptor(stage + l.a_bytes + 32 * j, s, l.leading, l.stride);
      wgmma::mma_async<T, N>(acc, a_desc, b_desc, t > 0 || j > 0);
    }
    wgmma::commit_group();
    if (wait_late) wgmma::mbarrier_wait(&full[st], parity);
    if (release_early) wgmma::mbarrier_arrive(&empty[st]);
    if (!planted(fault, WgmmaFault::NoWaitGroup)) wgmma::wait_group<0>(acc);
    if (!release_early) wgmma::mbarrier_arrive(&empty[st]);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (unsigned i = 0; i < unsigned(N) / 2; ++i) {
    const int row = int(blockIdx.x) * 64 + int(16 * warp + lane / 4 + 8 * ((i / 2) % 2));
    const unsigned col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    if (row < m) c[size_t(row) * N + col] = acc[i];
  }
}

// Threads 0..127: the warpgroup; 128..159: the producer warp.
template <typename T, int N>
__global__ void __launch_bounds__(160) wgmma_gemm_kernel(const uint16_t* a, const uint16_t* b,
                                                         const __grid_constant__ tma::TensorMap a_map,
                                                         const __grid_constant__ tma::TensorMap b_map, float* c, int m,
                                                         int k, int swizzle, WgmmaLoad load, WgmmaFault fault) {
  DYNAMIC_SHARED(unsigned char, raw);
  const uint32_t raw_address = wgmma::shared_address(raw);
  // Where every swizzle pattern starts (the dynamic shared memory itself is only 16-byte aligned).
  const uint32_t base = planted(fault, WgmmaFault::UnalignedBase) ? raw_address : (raw_address + 1023u) & ~1023u;
  unsigned char* smem = raw + (base - raw_address);
  const Swizzle s = Swizzle(swizzle);
  const uint32_t ring_bytes = kWgmmaStages * stage_layout(s, N).stage_bytes;
  const uint32_t full_at = ring_bytes - (planted(fault, WgmmaFault::BarrierInStage) ? 64 : 0);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + full_at);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + ring_bytes) + kWgmmaStages;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kWgmmaStages; ++st) {
      if (!planted(fault, WgmmaFault::NoFullInit)) wgmma::mbarrier_init(&full[st], load == WgmmaLoad::Tma ? 1 : 32);
      wgmma::mbarrier_init(&empty[st], 128);
    }
    if (!planted(fault, WgmmaFault::NoInitFence)) wgmma::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) consume<T, N>(c, m, k, s, base, full, empty, fault);
  else if (load == WgmmaLoad::Tma) produce_tma<N>(&a_map, &b_map, b, k, s, base, smem, full, empty, fault);
  else produce<N>(a, b, m, k, s, base, smem, full, empty, fault);
}

template <typename T, int N>
void launch(Swizzle s, WgmmaLoad load, const uint16_t* a, const uint16_t* b, float* c, int m, int k,
            WgmmaFault fault) {
  const size_t bytes = shared_bytes(s, N);
  tma::TensorMap a_map{}, b_map{};
  if (load == WgmmaLoad::Tma) {
    const uint32_t tile_k = stage_layout(s, N).row_bytes / 2;
    a_map = tma::encode_2d(a, uint64_t(k), uint64_t(m), uint64_t(k) * 2, tile_k, 64, int(s));
    b_map = tma::encode_2d(b, uint64_t(k), uint64_t(N), uint64_t(k) * 2, tile_k, N, int(s));
  }
  tc::allow_shared(wgmma_gemm_kernel<T, N>, bytes);
  LAUNCH((wgmma_gemm_kernel<T, N>), dim3(ceil_div(size_t(m), 64)), dim3(160), bytes, 0, a, b, a_map, b_map, c, m, k,
         int(s), load, fault);
}

// Thread 0 loads the box; after the mbarrier's phase completes, every thread copies bytes of
// it out, each read at its swizzled address (TMA wrote row p's 16-byte chunk j at chunk
// j ^ (p % 8) of a 128-byte swizzle, wgmma.cuh's swizzled).
__global__ void im2col_box_kernel(const __grid_constant__ tma::TensorMap map, int c, int w, int h, int n, int off_w,
                                  int off_h, int swizzle, uint32_t box_bytes, unsigned char* out) {
  DYNAMIC_SHARED(unsigned char, raw);
  const uint32_t raw_address = wgmma::shared_address(raw);
  const uint32_t base = (raw_address + 1023u) & ~1023u;
  unsigned char* box = raw + (base - raw_address);
  uint64_t* full = reinterpret_cast<uint64_t*>(box + box_bytes);
  if (threadIdx.x == 0) {
    wgmma::mbarrier_init(full, 1);
    wgmma::fence_barrier_init();  // TMA completes on it
    wgmma::mbarrier_arrive_expect_tx(full, box_bytes);
    tma::load_im2col(box, &map, c, w, h, n, uint16_t(off_w), uint16_t(off_h), full);
  }
  __syncthreads();  // the mbarrier is initialized before anyone waits on it
  wgmma::mbarrier_wait(full, 0);
  for (uint32_t i = threadIdx.x; i < box_bytes; i += blockDim.x) {
    const uint32_t at = swizzle == 0 ? base + i : wgmma::swizzled(base + i, Swizzle(swizzle));
    out[i] = box[at - base];
  }
}

}  // namespace

void launch_im2col_box(const tma::TensorMap& map, int c, int w, int h, int n, int off_w, int off_h, int swizzle,
                       uint32_t box_bytes, unsigned char* out_box) {
  if (!current_device_runs_wgmma())
    throw Error("launch_im2col_box: TMA's im2col loads run here with the sm_90a code this device does not run");
  const size_t bytes = 1024 + size_t(box_bytes) + 16;
  tc::allow_shared(im2col_box_kernel, bytes);
  LAUNCH(im2col_box_kernel, dim3(1), dim3(128), bytes, 0, map, c, w, h, n, off_w, off_h, swizzle, box_bytes, out_box);
}

const char* wgmma_swizzle_name(WgmmaSwizzle s) {
  switch (s) {
    case WgmmaSwizzle::None: return "none";
    case WgmmaSwizzle::B128: return "128B";
    case WgmmaSwizzle::B64: return "64B";
    case WgmmaSwizzle::B32: return "32B";
  }
  return "?";
}

int wgmma_tile_k(WgmmaSwizzle s) { return int(stage_layout(Swizzle(int(s)), 64).row_bytes / 2); }

void launch_wgmma_gemm(WgmmaOperand type, WgmmaSwizzle swizzle, WgmmaLoad load, int n, const uint16_t* a,
                       const uint16_t* b, float* c, int m, int k, WgmmaFault fault) {
  if (!current_device_runs_wgmma()) {
    const int cc = current_compute_capability();
    throw Error("launch_wgmma_gemm: wgmma needs sm_90a code on an sm_90 device; this device is sm_" +
                std::to_string(cc) + (cc == 90 ? " without it" : ""));
  }
  if ((n != 64 && n != 128) || m < 1 || k < 8 || k % 8 != 0)
    throw Error("launch_wgmma_gemm: n must be 64 or 128, m positive, k a positive multiple of 8 (n " +
                std::to_string(n) + ", m " + std::to_string(m) + ", k " + std::to_string(k) + ")");
#if defined(__CUDACC__)
  if (fault != WgmmaFault::None) throw Error("launch_wgmma_gemm: planted faults exist under emulation only");
#endif
  if (load == WgmmaLoad::Tma && swizzle == WgmmaSwizzle::None)
    throw Error("launch_wgmma_gemm: TMA writes boxes as dense rows; the unswizzled layout is core matrices");
  const Swizzle s = Swizzle(int(swizzle));
  if (type == WgmmaOperand::Bf16) {
    if (n == 64) launch<Bf16, 64>(s, load, a, b, c, m, k, fault);
    else launch<Bf16, 128>(s, load, a, b, c, m, k, fault);
  } else {
    if (n == 64) launch<Fp16, 64>(s, load, a, b, c, m, k, fault);
    else launch<Fp16, 128>(s, load, a, b, c, m, k, fault);
  }
}

}  // namespace yolo::testing
