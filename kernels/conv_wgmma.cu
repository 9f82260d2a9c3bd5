// conv2d_forward_wgmma (kernels/conv_wgmma.h).
#include "kernels/conv_wgmma.h"

#include <string>

#include "kernels/channel_moments.cuh"
#include "kernels/common.cuh"
#include "kernels/conv_wgmma_shared.h"
#include "kernels/normalized_input.cuh"
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

// Producer thread p (0..127) gathers row p of every A tile, 8 chunks of 16 bytes (8 channels, 4 in
// TF32) per k-tile; thread 0 also brings the weights' tile by TMA. A stage is announced full one
// k-tile late, once its copies landed (cp.async.wait_group 1) and were fenced for the async proxy.
// The weights' map counts 16-bit units (FP32 rows as pairs of them: TMA moves bytes, and the
// swizzle acts on 16-byte chunks), so a k-tile's box is 64 units wide in every precision. With
// `norm`, the thread applies BatchNorm to the chunks it read from the image (a bit each in
// `read`) once they landed, before the stage is announced.
template <typename T>
__device__ void produce(const Gather g, NhwcView<const T> in, NormalizedInput norm, const tma::TensorMap* w_map,
                        int k_tiles, const Ring& ring, Tile tile, int t0) {
  constexpr int V = 16 / int(sizeof(T));  // channels a 16-byte copy
  const int p = int(threadIdx.x), pixel = tile.row * kBlockM + p;
  uint32_t read = 0;  // the chunks of the k-tile before this one that came from the image
  auto normalize = [&](int t) {
    if (!norm) return;
    const uint32_t a_tile = ring.address + uint32_t(stage_of(t0 + t)) * kStageBytes;
    normalize_landed<T>(
        norm, read,
        [&](int q) {
          return ring.chunk(k_major_address(a_tile, Swizzle::B128, 0, kRowGroupBytes, uint32_t(p), uint32_t(16 * q)));
        },
        [&](int q) { return (t * kTileK<T> + V * q) % g.c_in; });
  };
  const bool row_valid = pixel < g.pixels;
  const int b = row_valid ? pixel / (g.out_h * g.out_w) : 0, rest = row_valid ? pixel % (g.out_h * g.out_w) : 0;
  const int y0 = rest / g.out_w * g.stride - g.pad, x0 = rest % g.out_w * g.stride - g.pad;
  for (int t = 0; t < k_tiles; ++t) {
    const int st = stage_of(t0 + t);
    mbarrier_wait(&ring.empty[st], empty_parity(t0 + t));
    if (p == 0) {
      mbarrier_arrive_expect_tx(&ring.full[st], kTileBytes);
      tma::load_2d(ring.b_tile(st), w_map, t * 64, tile.col * kBlockN, &ring.full[st]);
    }
    const uint32_t a_tile = ring.address + uint32_t(st) * kStageBytes;
    uint32_t reading = 0;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int kk = t * kTileK<T> + V * q, tap = kk / g.c_in, c = kk % g.c_in;
      const int iy = y0 + tap / g.k, ix = x0 + tap % g.k;
      const bool inside = row_valid && kk < g.k_total && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
      const T* src = inside ? in.data + in.at(b, iy, ix, c) : in.data;
      const uint32_t address = k_major_address(a_tile, Swizzle::B128, 0, kRowGroupBytes, uint32_t(p), uint32_t(16 * q));
      mma::cp_async_16(ring.smem + (address - ring.address), src, inside);
      reading |= uint32_t(inside) << q;
    }
    gathered(t, ring, normalize, t0);  // normalizes k-tile t - 1 (`read`)
    read = reading;
  }
  gathered_last(k_tiles, ring, normalize, t0);
}

// With TMA's im2col mode (Im2colA): thread 0 brings both operands, A as one im2col box a
// k-tile. c_in is a whole number of k-tiles, so k-tile t is tap t / groups, channels
// kTileK * (t % groups).. of it; the box's first pixel is the block's first output pixel's
// top-left tap (its coordinates in the traversal: conv_wgmma_shared.h), the tap its offsets.
// k-tile t's boxes go into its stage once the math warpgroups released it: the weights' counted
// on "full", A's there too, or on "landed" where the producers transform it first.
template <typename T>
__device__ void load_im2col_stage(const Gather& g, const tma::TensorMap* in_map, const tma::TensorMap* w_map, int t,
                                  const Ring& ring, bool to_landed, Tile tile, int t0) {
  const int groups = g.c_in / kTileK<T>, pixel = tile.row * kBlockM, st = stage_of(t0 + t), tap = t / groups;
  const int b = pixel / (g.out_h * g.out_w), rest = pixel % (g.out_h * g.out_w);
  const int y0 = rest / g.out_w * g.stride - g.pad, x0 = rest % g.out_w * g.stride - g.pad;
  mbarrier_wait(&ring.empty[st], empty_parity(t0 + t));
  uint64_t* a_bar = expect_stage(ring, st, to_landed);
  tma::load_im2col(ring.a_tile(st), in_map, (t % groups) * kTileK<T>, x0, y0, b, uint16_t(tap % g.k),
                   uint16_t(tap / g.k), a_bar);
  tma::load_2d(ring.b_tile(st), w_map, t * 64, tile.col * kBlockN, &ring.full[st]);
}

// With BatchNorm applied in the loads (norm): each of the 128 producer threads applies the table
// to its own row of A once it landed (its output pixel's channels at this k-tile's tap, where
// that tap lies in the image: the padding's zeros stay), fences it for the async proxy and
// arrives on "full". One k-tile behind the loads, which thread 0 issues, as the gather announces
// its stages.
template <typename T>
__device__ void produce_im2col_normalized(const Gather g, NormalizedInput norm, const tma::TensorMap* in_map,
                                          const tma::TensorMap* w_map, int k_tiles, const Ring& ring, Tile tile,
                                          int t0) {
  constexpr int V = 16 / int(sizeof(T));  // channels a 16-byte chunk
  const int p = int(threadIdx.x), groups = g.c_in / kTileK<T>, pixel = tile.row * kBlockM + p;
  const bool row_valid = pixel < g.pixels;
  const int rest = row_valid ? pixel % (g.out_h * g.out_w) : 0;
  const int ry = rest / g.out_w * g.stride - g.pad, rx = rest % g.out_w * g.stride - g.pad;
  auto finish = [&](int u) {
    const int st = stage_of(t0 + u), tap = u / groups, iy = ry + tap / g.k, ix = rx + tap % g.k;
    mbarrier_wait(&ring.landed[st], full_parity(t0 + u));
    const bool inside = row_valid && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
    const uint32_t a_tile = ring.address + uint32_t(st) * kStageBytes;
    normalize_landed<T>(
        norm, inside ? 0xffu : 0u,
        [&](int q) {
          return ring.chunk(k_major_address(a_tile, Swizzle::B128, 0, kRowGroupBytes, uint32_t(p), uint32_t(16 * q)));
        },
        [&](int q) { return (u % groups) * kTileK<T> + V * q; });
    fence_proxy_async();
    mbarrier_arrive(&ring.full[st]);
  };
  for (int t = 0; t < k_tiles; ++t) {
    if (p == 0) load_im2col_stage<T>(g, in_map, w_map, t, ring, true, tile, t0);
    if (t > 0) finish(t - 1);
  }
  if (k_tiles > 0) finish(k_tiles - 1);
}

// No register handoff: the math warpgroups' 64 accumulators fit the 168 registers a thread
// launches with, and the gathering producer needs more than the 40 a handoff would leave it.
// Persistent blocks over the tiles (TileOrder: c_out tiles, pixel tiles), each walking its share.
// With moments, the math warpgroups read each tile back once stored, for BatchNorm's statistics
// (as conv2d_forward_tc does), meeting at named barrier 1 (the producers are not there: they
// fill the next tile's stages meanwhile) with the ring's scratch for the reduction.
constexpr unsigned kMathBarrier = 1;
template <typename T, bool Im2colA>
__global__ void __launch_bounds__(kThreads, 1)
    conv_forward_wgmma_kernel(Gather g, NhwcView<const T> in, NormalizedInput norm,
                              const __grid_constant__ tma::TensorMap in_map,
                              const __grid_constant__ tma::TensorMap w_map, const float* bias, NhwcView<T> out,
                              ConvMoments moments, TileOrder order) {
  static_assert(moments::kScratchFloats * sizeof(float) <= kScratchBytes, "the moments' scratch");
  // Full: thread 0's expect_tx, and where the producers gather or normalize each of its 128.
  const Ring ring = make_ring(Im2colA && !norm ? 1 : 128 + 1);
  const int k_tiles = (g.k_total + kTileK<T> - 1) / kTileK<T>;
  int t0 = 0;  // the ring's k-tiles before this tile's
  for (long long i = blockIdx.x; i < order.count(); i += gridDim.x, t0 += k_tiles) {
    const Tile tile = order(i);
    if (threadIdx.x >= 128) {
      multiply_and_store<T, false, false, false>(k_tiles, ring, OutRows<T>{out.data, out.stride, g.pixels, out.c, bias},
                                                 tile, t0);
      if (moments.partials == nullptr) continue;
      named_barrier_sync(kMathBarrier, 256);  // the tile is stored
      const int row0 = tile.row * kBlockM, col0 = tile.col * kBlockN;
      moments::tile_moments<T>(out.data, out.stride, row0, min(kBlockM, g.pixels - row0), col0,
                               min(kBlockN, out.c - col0), out.c, tile.row, ring.scratch, moments.partials,
                               moments.counts, int(threadIdx.x) - 128, moments::NamedSync<kMathBarrier>{});
    } else if constexpr (Im2colA) {
      if (norm) produce_im2col_normalized<T>(g, norm, &in_map, &w_map, k_tiles, ring, tile, t0);
      else if (threadIdx.x == 0)
        for (int t = 0; t < k_tiles; ++t) load_im2col_stage<T>(g, &in_map, &w_map, t, ring, false, tile, t0);
    } else {
      produce<T>(g, in, norm, &w_map, k_tiles, ring, tile, t0);
    }
  }
}

}  // namespace

bool conv2d_forward_wgmma_takes(const Conv2dShape& s) {
  return s.c_in % 8 == 0 && ceil_div(size_t(s.n) * s.out_h() * s.out_w(), size_t(kBlockM)) <= kMaxRowTiles;
}

template <typename T>
bool conv2d_forward_wgmma_im2col_takes(const Conv2dShape& s, NhwcView<const T> in) {
  return conv2d_forward_wgmma_takes(s) && s.c_in % kTileK<T> == 0 && conv_im2col_geometry_fits(s) &&
         (size_t(in.stride) * sizeof(T)) % 16 == 0 && tma::swizzled_base_fits(in.data);
}

template <typename T>
void conv2d_forward_wgmma(const Conv2dShape& s, NhwcView<const T> in, const T* weights, const float* bias,
                          NhwcView<T> out, cudaStream_t stream, ConvMoments moments, NormalizedInput norm,
                          WgmmaInput input) {
  s.validate();
  require_wgmma("conv2d_forward_wgmma");
  constexpr int V = 16 / int(sizeof(T));  // elements a 16-byte copy
  if (!conv2d_forward_wgmma_takes(s) || in.stride % V != 0 || reinterpret_cast<uintptr_t>(in.data) % 16 != 0)
    throw Error("conv2d_forward_wgmma: the input's channels (" + std::to_string(s.c_in) +
                ") must be a multiple of 8 and its pixel stride (" + std::to_string(in.stride) + ") of " +
                std::to_string(V) + ", its data 16-byte aligned, and the output at most 65535 * 128 pixels");
  if (in.n != s.n || in.h != s.h || in.w != s.w || in.c != s.c_in || out.n != s.n || out.h != s.out_h() ||
      out.w != s.out_w() || out.c != s.c_out)
    throw Error("conv2d_forward_wgmma: the views do not match the shape");
  if (s.n == 0) return;
  const Gather g{s.n * s.out_h() * s.out_w(), s.out_h(), s.out_w(), s.h, s.w, s.c_in, s.k, s.stride, s.pad(),
                 s.k * s.k * s.c_in};
  const uint64_t units = sizeof(T) / 2;  // 16-bit units an element (see produce)
  const tma::TensorMap w_map = tma::encode_2d(weights, uint64_t(g.k_total) * units, uint64_t(s.c_out),
                                              uint64_t(g.k_total) * sizeof(T), 64, kBlockN, 1);
  const TileOrder order{int(ceil_div(size_t(s.c_out), kBlockN)), int(ceil_div(size_t(g.pixels), kBlockM)), 1};
  const dim3 grid(wgmma_conv_blocks(order.count()));
  const std::string needs = "c_in a multiple of " + std::to_string(kTileK<T>) + " (" + std::to_string(s.c_in) +
                            "), a stride of at most 8 and a 16-byte pixel stride";
  if (uses_im2col(conv2d_forward_wgmma_im2col_takes(s, in), input, "conv2d_forward_wgmma", needs, tc_precision<T>(),
                  tc::TcPass::Forward)) {
    const tma::TensorMap in_map =
        conv_im2col_map(s, in.data, uint64_t(in.stride) * sizeof(T), sizeof(T), kTileK<T>, kBlockM);
    tc::allow_shared(conv_forward_wgmma_kernel<T, true>, kSharedBytes);
    LAUNCH((conv_forward_wgmma_kernel<T, true>), grid, dim3(kThreads), kSharedBytes, stream, g, in, norm, in_map,
           w_map, bias, out, moments, order);
  } else {
    tc::allow_shared(conv_forward_wgmma_kernel<T, false>, kSharedBytes);
    LAUNCH((conv_forward_wgmma_kernel<T, false>), grid, dim3(kThreads), kSharedBytes, stream, g, in, norm,
           tma::TensorMap{}, w_map, bias, out, moments, order);
  }
}

template void conv2d_forward_wgmma<float>(const Conv2dShape&, NhwcView<const float>, const float*, const float*,
                                          NhwcView<float>, cudaStream_t, ConvMoments, NormalizedInput, WgmmaInput);
template void conv2d_forward_wgmma<Bf16>(const Conv2dShape&, NhwcView<const Bf16>, const Bf16*, const float*,
                                         NhwcView<Bf16>, cudaStream_t, ConvMoments, NormalizedInput, WgmmaInput);
template void conv2d_forward_wgmma<Fp16>(const Conv2dShape&, NhwcView<const Fp16>, const Fp16*, const float*,
                                         NhwcView<Fp16>, cudaStream_t, ConvMoments, NormalizedInput, WgmmaInput);
template bool conv2d_forward_wgmma_im2col_takes<float>(const Conv2dShape&, NhwcView<const float>);
template bool conv2d_forward_wgmma_im2col_takes<Bf16>(const Conv2dShape&, NhwcView<const Bf16>);
template bool conv2d_forward_wgmma_im2col_takes<Fp16>(const Conv2dShape&, NhwcView<const Fp16>);

}  // namespace yolo
