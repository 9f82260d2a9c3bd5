// conv2d_backward_weights_wgmma (kernels/conv_wgmma.h): grad_weights[c_out][taps * c_in] =
// sum over pixels p of grad_out[p][c_out] * im2col(in)[p][taps * c_in], on the main loop of
// kernels/wgmma_tiles.cuh with both operands MN-major (the reduction runs over their rows).
#include <algorithm>
#include <string>

#include "kernels/common.cuh"
#include "kernels/conv_wgmma.h"
#include "kernels/conv_wgmma_shared.h"
#include "kernels/hopper.h"
#include "kernels/normalized_input.cuh"
#include "kernels/tc_plan.h"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma_tiles.cuh"

namespace yolo {

namespace {

using namespace wgmma;

// Blocks the pixel sum is split into (tc::wgmma_weight_splits, as the planner predicts it): enough
// for two waves of the current device's SMs over the output tiles, each split at least one k-tile
// (so the workspace depends on the device too).
struct Split {
  int tiles_m, tiles_n, k_tiles, splits, per_split;
};
Split split_of(const Conv2dShape& s) {
  Split p{};
  p.tiles_m = int(ceil_div(size_t(s.c_out), kBlockM));
  p.tiles_n = int(ceil_div(size_t(s.k) * s.k * s.c_in, kBlockN));
  p.k_tiles = int(ceil_div(size_t(s.n) * s.out_h() * s.out_w(), kBlockK));
  if (p.k_tiles == 0) return p;  // no pixels: no splits, the gradient is zero
  p.splits = tc::wgmma_weight_splits((long long)p.tiles_m * p.tiles_n, p.k_tiles, tc::current_gpu().sms);
  p.per_split = int(ceil_div(size_t(p.k_tiles), size_t(p.splits)));
  return p;
}

struct WeightsGather {
  int pixels, out_h, out_w, h, w, c_in, k, stride, pad, n_total;  // n_total = taps * c_in
};

// Producer thread p: k-row p % 64 (a pixel of this split's k-tile) of B's tile, chunks of 8
// (tap, channel) columns 8 * (p / 64).. (two threads a row, 8 chunks each); thread 0 also brings
// grad_out's 64 pixels by 128 channels as two TMA boxes. Announced a k-tile late, as forward,
// and normalized as forward's gather is (`norm`: each thread its own chunks, once they landed).
template <typename T>
__device__ void produce(const WeightsGather g, NhwcView<const T> in, NormalizedInput norm, const tma::TensorMap* dy_map,
                        int first_tile, int k_tiles, const Ring& ring, Tile tile, int t0) {
  const int p = int(threadIdx.x), row = p % 64, column0 = 8 * (p / 64) * 8;
  uint32_t read = 0;  // the chunks of the k-tile before this one that came from the image
  auto normalize = [&](int t) {
    if (!norm) return;
    const uint32_t b_tile = ring.address + uint32_t(stage_of(t0 + t)) * kStageBytes + kTileBytes;
    normalize_landed<T>(
        norm, read,
        [&](int q) {
          return ring.chunk(mn_major_address(b_tile, Swizzle::B128, kMnHalfBytes, kRowGroupBytes,
                                             uint32_t(column0 + 8 * q), uint32_t(row)));
        },
        [&](int q) { return (tile.col * kBlockN + column0 + 8 * q) % g.c_in; });
  };
  for (int t = 0; t < k_tiles; ++t) {
    const int st = stage_of(t0 + t), pixel = (first_tile + t) * kBlockK + row;
    mbarrier_wait(&ring.empty[st], empty_parity(t0 + t));
    if (p == 0) {
      mbarrier_arrive_expect_tx(&ring.full[st], kTileBytes);
      for (int h = 0; h < 2; ++h)
        tma::load_2d(ring.a_tile(st) + h * kMnHalfBytes, dy_map, tile.row * kBlockM + 64 * h, (first_tile + t) * kBlockK,
                     &ring.full[st]);
    }
    const bool pixel_valid = pixel < g.pixels;
    const int b = pixel_valid ? pixel / (g.out_h * g.out_w) : 0, rest = pixel_valid ? pixel % (g.out_h * g.out_w) : 0;
    const int y0 = rest / g.out_w * g.stride - g.pad, x0 = rest % g.out_w * g.stride - g.pad;
    const uint32_t b_tile = ring.address + uint32_t(st) * kStageBytes + kTileBytes;
    uint32_t reading = 0;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int local = column0 + 8 * q, column = tile.col * kBlockN + local;
      const int tap = column / g.c_in, c = column % g.c_in;
      const int iy = y0 + tap / g.k, ix = x0 + tap % g.k;
      const bool inside = pixel_valid && column < g.n_total && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
      const T* src = inside ? in.data + in.at(b, iy, ix, c) : in.data;
      const uint32_t address =
          mn_major_address(b_tile, Swizzle::B128, kMnHalfBytes, kRowGroupBytes, uint32_t(local), uint32_t(row));
      mma::cp_async_16(ring.smem + (address - ring.address), src, inside);
      reading |= uint32_t(inside) << q;
    }
    gathered(t, ring, normalize, t0);  // normalizes k-tile t - 1 (`read`)
    read = reading;
  }
  if (k_tiles > 0) gathered_last(k_tiles, ring, normalize, t0);
}

// With TMA's im2col mode (Im2colB): thread 0 brings both operands. c_in is a whole number of
// 64-channel halves, so each half of B's tile (64 columns: one tap's channels c..c + 63) is one
// im2col box of the k-tile's 64 pixels, which lands as the MN-major half it is (64 k-rows of 128
// bytes). A half past the taps (the last column tile) reads channels past c_in: zeros.
// k-tile t's boxes go into its stage once the math warpgroups released it: grad_out's counted
// on "full", B's there too, or on "landed" where the producers transform them first.
template <typename T>
__device__ void load_im2col_stage(const WeightsGather& g, const tma::TensorMap* in_map, const tma::TensorMap* dy_map,
                                  int first_tile, int t, const Ring& ring, bool to_landed, Tile tile, int t0) {
  const int st = stage_of(t0 + t), pixel = (first_tile + t) * kBlockK;
  const int b = pixel / (g.out_h * g.out_w), rest = pixel % (g.out_h * g.out_w);
  const int y0 = rest / g.out_w * g.stride - g.pad, x0 = rest % g.out_w * g.stride - g.pad;
  mbarrier_wait(&ring.empty[st], empty_parity(t0 + t));
  uint64_t* b_bar = expect_stage(ring, st, to_landed);
  for (int h = 0; h < 2; ++h) {
    tma::load_2d(ring.a_tile(st) + h * kMnHalfBytes, dy_map, tile.row * kBlockM + 64 * h, pixel, &ring.full[st]);
    const int column = tile.col * kBlockN + 64 * h, past = column >= g.n_total;
    const int tap = past ? g.k * g.k - 1 : column / g.c_in, c = past ? g.c_in : column % g.c_in;
    tma::load_im2col(ring.b_tile(st) + h * kMnHalfBytes, in_map, c, x0, y0, b, uint16_t(tap % g.k),
                     uint16_t(tap / g.k), b_bar);
  }
}

// With BatchNorm applied in the loads (norm): producer thread p applies the table to its own 128
// bytes of B once they landed (k-row p % 64 of half p / 64: one pixel's 64 channels at one tap,
// where the pixel and the tap lie in the image), fences them and arrives on "full". One k-tile
// behind the loads, which thread 0 issues.
template <typename T>
__device__ void produce_im2col_normalized(const WeightsGather g, NormalizedInput norm, const tma::TensorMap* in_map,
                                          const tma::TensorMap* dy_map, int first_tile, int k_tiles,
                                          const Ring& ring, Tile tile, int t0) {
  const int p = int(threadIdx.x), row = p % 64, half = p / 64, column = tile.col * kBlockN + 64 * half;
  const int tap = column / g.c_in, c0 = column % g.c_in;
  auto finish = [&](int u) {
    const int st = stage_of(t0 + u), pixel = (first_tile + u) * kBlockK + row;
    mbarrier_wait(&ring.landed[st], full_parity(t0 + u));
    const int rest = pixel % (g.out_h * g.out_w);
    const int iy = rest / g.out_w * g.stride - g.pad + tap / g.k, ix = rest % g.out_w * g.stride - g.pad + tap % g.k;
    const bool inside = pixel < g.pixels && column < g.n_total && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
    const uint32_t b_tile = ring.address + uint32_t(st) * kStageBytes + kTileBytes;
    normalize_landed<T>(
        norm, inside ? 0xffu : 0u,
        [&](int q) {
          return ring.chunk(mn_major_address(b_tile, Swizzle::B128, kMnHalfBytes, kRowGroupBytes,
                                             uint32_t(64 * half + 8 * q), uint32_t(row)));
        },
        [&](int q) { return c0 + 8 * q; });
    fence_proxy_async();
    mbarrier_arrive(&ring.full[st]);
  };
  for (int t = 0; t < k_tiles; ++t) {
    if (p == 0) load_im2col_stage<T>(g, in_map, dy_map, first_tile, t, ring, true, tile, t0);
    if (t > 0) finish(t - 1);
  }
  if (k_tiles > 0) finish(k_tiles - 1);
}

// Persistent blocks over the tiles (TileOrder: column tiles, row tiles (output channels), splits
// of the pixels), each walking its share; a tile of split z writes its partial sums to
// partials[z].
template <typename T, bool Im2colB>
__global__ void __launch_bounds__(kThreads, 1)
    conv_backward_weights_wgmma_kernel(WeightsGather g, NhwcView<const T> in, NormalizedInput norm,
                                       const __grid_constant__ tma::TensorMap in_map,
                                       const __grid_constant__ tma::TensorMap dy_map, int c_out, int per_split,
                                       int k_tiles_total, float* partials, TileOrder order) {
  // Full: thread 0's expect_tx, and where the producers gather or normalize each of its 128.
  const Ring ring = make_ring(Im2colB && !norm ? 1 : 128 + 1);
  int t0 = 0;  // the ring's k-tiles before this tile's
  for (long long i = blockIdx.x; i < order.count(); i += gridDim.x) {
    const Tile tile = order(i);
    const int first = tile.z * per_split, k_tiles = max(0, min(per_split, k_tiles_total - first));
    if (threadIdx.x >= 128) {
      const OutRows<float> out{partials + size_t(tile.z) * c_out * g.n_total, g.n_total, c_out, g.n_total, nullptr};
      multiply_and_store<T, false, true, true>(k_tiles, ring, out, tile, t0);
    } else if constexpr (Im2colB) {
      if (norm) produce_im2col_normalized<T>(g, norm, &in_map, &dy_map, first, k_tiles, ring, tile, t0);
      else if (threadIdx.x == 0)
        for (int t = 0; t < k_tiles; ++t) load_im2col_stage<T>(g, &in_map, &dy_map, first, t, ring, false, tile, t0);
    } else {
      produce<T>(g, in, norm, &dy_map, first, k_tiles, ring, tile, t0);
    }
    t0 += k_tiles;
  }
}

// grad_weights[i] = the splits' partial sums in order.
__global__ void sum_partials_kernel(const float* partials, int splits, size_t count, float* grad_weights) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    float sum = 0;
    for (int z = 0; z < splits; ++z) sum += partials[size_t(z) * count + i];
    grad_weights[i] = sum;
  }
}

}  // namespace

bool conv2d_backward_weights_wgmma_takes(const Conv2dShape& s) { return s.c_in % 8 == 0 && s.c_out % 8 == 0; }

template <typename T>
bool conv2d_backward_weights_wgmma_im2col_takes(const Conv2dShape& s, NhwcView<const T> in) {
  return conv2d_backward_weights_wgmma_takes(s) && s.c_in % 64 == 0 && conv_im2col_geometry_fits(s) &&
         in.stride % 8 == 0 && tma::swizzled_base_fits(in.data);
}

size_t conv2d_backward_weights_wgmma_workspace_bytes(const Conv2dShape& s) {
  return size_t(split_of(s).splits) * s.weight_count() * sizeof(float);
}

template <typename T>
void conv2d_backward_weights_wgmma(const Conv2dShape& s, NhwcView<const T> in, NhwcView<const T> grad_out,
                                   float* grad_weights, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                   NormalizedInput norm, WgmmaInput input) {
  s.validate();
  if (!current_device_runs_wgmma())
    throw Error("conv2d_backward_weights_wgmma: wgmma needs sm_90a code on an sm_90 device (H100, H200) and a build "
                "whose ARCH has 90");
  if (!conv2d_backward_weights_wgmma_takes(s) || grad_out.stride != s.c_out || in.stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(in.data) % 16 != 0)
    throw Error("conv2d_backward_weights_wgmma: needs c_in (" + std::to_string(s.c_in) + ") and c_out (" +
                std::to_string(s.c_out) + ") multiples of 8, a dense grad_out and the input's pixel stride a "
                "multiple of 8 with 16-byte aligned data");
  if (in.n != s.n || in.h != s.h || in.w != s.w || in.c != s.c_in || grad_out.n != s.n || grad_out.h != s.out_h() ||
      grad_out.w != s.out_w() || grad_out.c != s.c_out)
    throw Error("conv2d_backward_weights_wgmma: the views do not match the shape");
  const size_t need = conv2d_backward_weights_wgmma_workspace_bytes(s);
  if (workspace_bytes < need || (need > 0 && reinterpret_cast<uintptr_t>(workspace) % 16 != 0))
    throw Error("conv2d_backward_weights_wgmma: needs " + std::to_string(need) +
                " bytes of 16-byte aligned workspace, given " + std::to_string(workspace_bytes));
  const Split p = split_of(s);
  const int pixels = s.n * s.out_h() * s.out_w();
  const size_t count = s.weight_count();
  auto* partials = static_cast<float*>(workspace);
  if (p.splits > 0) {
    const WeightsGather g{pixels, s.out_h(), s.out_w(), s.h, s.w, s.c_in, s.k, s.stride, s.pad(), s.k * s.k * s.c_in};
    const tma::TensorMap dy_map =
        tma::encode_2d(grad_out.data, uint64_t(s.c_out), uint64_t(pixels), uint64_t(s.c_out) * 2, 64, kBlockK, 1);
    const TileOrder order{p.tiles_n, p.tiles_m, p.splits};
    const dim3 grid(wgmma_conv_blocks(order.count()));
    const std::string needs = "c_in a multiple of 64 (" + std::to_string(s.c_in) +
                              ") and a stride of at most 8";
    if (uses_im2col(conv2d_backward_weights_wgmma_im2col_takes(s, in), input, "conv2d_backward_weights_wgmma",
                    needs, tc_precision<T>(), tc::TcPass::BackwardWeights)) {
      const tma::TensorMap in_map = conv_im2col_map(s, in.data, uint64_t(in.stride) * 2, 2, 64, kBlockK);
      tc::allow_shared(conv_backward_weights_wgmma_kernel<T, true>, kSharedBytes);
      LAUNCH((conv_backward_weights_wgmma_kernel<T, true>), grid, dim3(kThreads), kSharedBytes, stream, g, in, norm,
             in_map, dy_map, s.c_out, p.per_split, p.k_tiles, partials, order);
    } else {
      tc::allow_shared(conv_backward_weights_wgmma_kernel<T, false>, kSharedBytes);
      LAUNCH((conv_backward_weights_wgmma_kernel<T, false>), grid, dim3(kThreads), kSharedBytes, stream, g, in, norm,
             tma::TensorMap{}, dy_map, s.c_out, p.per_split, p.k_tiles, partials, order);
    }
  }
  LAUNCH(sum_partials_kernel, dim3(std::min<unsigned>(ceil_div(count, 256), 1024)), dim3(256), 0, stream, partials,
         p.splits, count, grad_weights);
}

template void conv2d_backward_weights_wgmma<Bf16>(const Conv2dShape&, NhwcView<const Bf16>, NhwcView<const Bf16>,
                                                  float*, void*, size_t, cudaStream_t, NormalizedInput, WgmmaInput);
template void conv2d_backward_weights_wgmma<Fp16>(const Conv2dShape&, NhwcView<const Fp16>, NhwcView<const Fp16>,
                                                  float*, void*, size_t, cudaStream_t, NormalizedInput, WgmmaInput);
template bool conv2d_backward_weights_wgmma_im2col_takes<Bf16>(const Conv2dShape&, NhwcView<const Bf16>);
template bool conv2d_backward_weights_wgmma_im2col_takes<Fp16>(const Conv2dShape&, NhwcView<const Fp16>);

}  // namespace yolo
