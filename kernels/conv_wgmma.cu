// conv2d_forward_wgmma (kernels/conv_wgmma.h).
#include "kernels/conv_wgmma.h"

#include <string>

#include "kernels/common.cuh"
#include "kernels/hopper.h"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma_tiles.cuh"

namespace yolo {

namespace {

using namespace wgmma;

// The gathering's geometry: output pixel r of the batch is (b, oy, ox); its k-th im2col element
// is channel k % c_in of tap k / c_in = (kh, kw).
struct Gather {
  int pixels, out_h, out_w;
  int h, w, c_in, k, stride, pad;
  int k_total;  // k * k * c_in
};

// Producer thread p (0..127) gathers row p of every A tile, 8 chunks of 8 channels per k-tile;
// thread 0 also brings the weights' tile by TMA. A stage is announced full one k-tile late, once
// its copies landed (cp.async.wait_group 1) and were fenced for the async proxy.
template <typename T>
__device__ void produce(const Gather g, NhwcView<const T> in, const tma::TensorMap* w_map, int k_tiles,
                        const Ring& ring) {
  const int p = int(threadIdx.x), pixel = int(blockIdx.y) * kBlockM + p;
  const bool row_valid = pixel < g.pixels;
  const int b = row_valid ? pixel / (g.out_h * g.out_w) : 0, rest = row_valid ? pixel % (g.out_h * g.out_w) : 0;
  const int y0 = rest / g.out_w * g.stride - g.pad, x0 = rest % g.out_w * g.stride - g.pad;
  for (int t = 0; t < k_tiles; ++t) {
    const int st = stage_of(t);
    mbarrier_wait(&ring.empty[st], empty_parity(t));
    if (p == 0) {
      mbarrier_arrive_expect_tx(&ring.full[st], kTileBytes);
      tma::load_2d(ring.b_tile(st), w_map, t * kBlockK, int(blockIdx.x) * kBlockN, &ring.full[st]);
    }
    const uint32_t a_tile = ring.address + uint32_t(st) * kStageBytes;
#pragma unroll
    for (int q = 0; q < kBlockK / 8; ++q) {
      const int kk = t * kBlockK + 8 * q, tap = kk / g.c_in, c = kk % g.c_in;
      const int iy = y0 + tap / g.k, ix = x0 + tap % g.k;
      const bool inside = row_valid && kk < g.k_total && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
      const T* src = inside ? in.data + in.at(b, iy, ix, c) : in.data;
      const uint32_t address = k_major_address(a_tile, Swizzle::B128, 0, kRowGroupBytes, uint32_t(p), uint32_t(16 * q));
      mma::cp_async_16(ring.smem + (address - ring.address), src, inside);
    }
    mma::cp_async_commit();
    if (t > 0) {
      mma::cp_async_wait<1>();
      fence_proxy_async();
      mbarrier_arrive(&ring.full[stage_of(t - 1)]);
    }
  }
  mma::cp_async_wait<0>();
  fence_proxy_async();
  mbarrier_arrive(&ring.full[stage_of(k_tiles - 1)]);
}

// No register handoff: the math warpgroups' 64 accumulators fit the 168 registers a thread
// launches with, and the gathering producer needs more than the 40 a handoff would leave it.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    conv_forward_wgmma_kernel(Gather g, NhwcView<const T> in, const __grid_constant__ tma::TensorMap w_map,
                              const float* bias, NhwcView<T> out) {
  const Ring ring = make_ring(128 + 1);  // the 128 gatherers, and thread 0's expect_tx
  const int k_tiles = (g.k_total + kBlockK - 1) / kBlockK;
  if (threadIdx.x < 128) {
    produce<T>(g, in, &w_map, k_tiles, ring);
    return;
  }
  multiply_and_store<T, false>(k_tiles, ring, OutRows<T>{out.data, out.stride, g.pixels, out.c, bias});
}

}  // namespace

template <typename T>
void conv2d_forward_wgmma(const Conv2dShape& s, NhwcView<const T> in, const T* weights, const float* bias,
                          NhwcView<T> out, cudaStream_t stream) {
  s.validate();
  if (!current_device_runs_wgmma())
    throw Error("conv2d_forward_wgmma: wgmma needs sm_90a code on an sm_90 device (H100, H200) and a build whose "
                "ARCH has 90");
  if (s.c_in % 8 != 0 || in.stride % 8 != 0 || reinterpret_cast<uintptr_t>(in.data) % 16 != 0)
    throw Error("conv2d_forward_wgmma: the input's channels (" + std::to_string(s.c_in) + ") and pixel stride (" +
                std::to_string(in.stride) + ") must be multiples of 8 and its data 16-byte aligned");
  if (in.n != s.n || in.h != s.h || in.w != s.w || in.c != s.c_in || out.n != s.n || out.h != s.out_h() ||
      out.w != s.out_w() || out.c != s.c_out)
    throw Error("conv2d_forward_wgmma: the views do not match the shape");
  if (s.n == 0) return;
  const Gather g{s.n * s.out_h() * s.out_w(), s.out_h(), s.out_w(), s.h, s.w, s.c_in, s.k, s.stride, s.pad(),
                 s.k * s.k * s.c_in};
  const tma::TensorMap w_map =
      tma::encode_2d(weights, uint64_t(g.k_total), uint64_t(s.c_out), uint64_t(g.k_total) * 2, kBlockK, kBlockN, 1);
  tc::allow_shared(conv_forward_wgmma_kernel<T>, kSharedBytes);
  LAUNCH(conv_forward_wgmma_kernel<T>, dim3(ceil_div(size_t(s.c_out), kBlockN), ceil_div(size_t(g.pixels), kBlockM)),
         dim3(kThreads), kSharedBytes, stream, g, in, w_map, bias, out);
}

template void conv2d_forward_wgmma<Bf16>(const Conv2dShape&, NhwcView<const Bf16>, const Bf16*, const float*,
                                         NhwcView<Bf16>, cudaStream_t);
template void conv2d_forward_wgmma<Fp16>(const Conv2dShape&, NhwcView<const Fp16>, const Fp16*, const float*,
                                         NhwcView<Fp16>, cudaStream_t);

}  // namespace yolo
