// conv2d_backward_data_wgmma (kernels/conv_wgmma.h): an implicit GEMM per parity class of the
// input's pixels, on the main loop of kernels/wgmma_tiles.cuh.
#include <string>

#include "kernels/common.cuh"
#include "kernels/conv_geometry.cuh"
#include "kernels/conv_wgmma.h"
#include "kernels/conv_wgmma_shared.h"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.cuh"
#include "kernels/wgmma_tiles.cuh"

namespace yolo {

namespace {

using namespace wgmma;

// One parity class of input pixels a grid z (kernels/conv_geometry.cuh): at stride S the input pixels (py + S yq, px + S xq) of class (py, px) are reached by the taps
// (ry0 + S jr, rx0 + S js) only: a class is a product of its own, over nr * ns taps. Stride 1 is
// one class of every tap.

constexpr int kMaxTaps = 9;  // 3x3

// With TMA's im2col mode (stride at most 2): one map of grad_out per class. Class row m = (b, yq,
// xq) at tap (jr, js) reads grad_out (b, yq + dy - jr, xq + dx - js): a traversal of the class's
// hc x wc grid placed at (dy - (nr - 1), dx - (ns - 1)) in grad_out, the tap as the offsets
// (nr - 1 - jr, ns - 1 - js), so every offset is at least 0.
constexpr int kMaxIm2colClasses = 4;
struct ClassMaps {
  tma::TensorMap cls[kMaxIm2colClasses];
};

// Class row m's input pixel, for the epilogue (wgmma_tiles.cuh: OutRows).
struct ClassPixels {
  ConvGeom g;
  ParityClass pc;
  __device__ long long operator()(int m) const { return pc.input_pixel(g, m); }
};

// B of a k-tile: 16-bit weights are read MN-major from W itself, [c_out][taps * c_in] (two TMA
// boxes of 64 c_in by 64 c_out at one tap's columns); TF32 cannot transpose, so its weights are
// first transposed to [tap][c_in][c_out] (transpose_taps_kernel) and read K-major, one box of 128
// rows (c_in at one tap) by 32 c_out (64 16-bit units: see produce). One map over all the taps,
// based where the weights start (a swizzled map's base must be 128-byte aligned: one a tap would
// start at tap * c_in elements, 48 bytes apart at a c_in of 24): a box reaching past its tap's
// c_in reads the next tap's weights into B's columns past c_in, whose outputs are never stored
// (past the last tap, TMA's zeros).
template <typename T>
constexpr bool kBackwardBKMajor = std::is_same_v<T, float>;

// The weights' part of a k-tile (output channels c0.., the tile's 128 input channels at tap
// `tap`, c_in a tap) into stage st (its bytes counted on "full" by the caller).
template <typename T>
__device__ void load_weights_tile(const Ring& ring, int st, const tma::TensorMap* map, int tap, int c_in,
                                  int col_tile, int c0) {
  const int ci = tap * c_in + col_tile * kBlockN;
  if constexpr (kBackwardBKMajor<T>) {
    tma::load_2d(ring.b_tile(st), map, 2 * c0, ci, &ring.full[st]);
  } else {
    for (int h = 0; h < 2; ++h) tma::load_2d(ring.b_tile(st) + h * kMnHalfBytes, map, ci + 64 * h, c0, &ring.full[st]);
  }
}

// Producer thread p gathers row p of A (class row m0 + p) of `tile`, whose first k-tile is the
// ring's t0: k-tile t covers the class's tap t / groups, (jr, js), and output channels
// kTileK * (t % groups).. (groups = c_out / kTileK); thread 0 brings that tap's weights.
template <typename T>
__device__ void produce_backward(const ConvGeom& g, const ParityClass& pc, NhwcView<const T> grad_out,
                                 const tma::TensorMap* w_map, int k_tiles, const Ring& ring, Tile tile, int t0) {
  constexpr int V = 16 / int(sizeof(T));  // channels a 16-byte copy
  const int p = int(threadIdx.x), m = tile.row * kBlockM + p, groups = g.c_out / kTileK<T>;
  const bool row_valid = m < pc.rows(g);
  const int q = row_valid ? m : 0, xq = q % pc.wc, rest = q / pc.wc, yq = rest % pc.hc, b = rest / pc.hc;
  const int oy0 = yq + pc.dy, ox0 = xq + pc.dx;  // the output pixel of tap (0, 0)
  for (int t = 0; t < k_tiles; ++t) {
    const int st = stage_of(t0 + t), tap = t / groups, c0 = (t % groups) * kTileK<T>, jr = tap / pc.ns,
              js = tap % pc.ns;
    mbarrier_wait(&ring.empty[st], empty_parity(t0 + t));
    if (p == 0) {
      mbarrier_arrive_expect_tx(&ring.full[st], kTileBytes);
      load_weights_tile<T>(ring, st, w_map, (pc.ry0 + g.stride * jr) * g.k + pc.rx0 + g.stride * js, g.c_in, tile.col,
                           c0);
    }
    const int oy = oy0 - jr, ox = ox0 - js;
    const bool inside = row_valid && oy >= 0 && oy < g.oh && ox >= 0 && ox < g.ow;
    const uint32_t a_tile = ring.address + uint32_t(st) * kStageBytes;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const T* src = inside ? grad_out.data + grad_out.at(b, oy, ox, c0 + V * c) : grad_out.data;
      const uint32_t address = k_major_address(a_tile, Swizzle::B128, 0, kRowGroupBytes, uint32_t(p), uint32_t(16 * c));
      mma::cp_async_16(ring.smem + (address - ring.address), src, inside);
    }
    gathered(t, ring, NothingToDo{}, t0);
  }
  if (k_tiles > 0) gathered_last(k_tiles, ring, NothingToDo{}, t0);
}

// Thread 0 alone: A as one im2col box of the class's map a k-tile (the block's 128 class rows at
// one tap, kTileK output channels), then the tap's weights as produce_backward brings them.
template <typename T>
__device__ void produce_backward_im2col(const ConvGeom& g, const ParityClass& pc, const tma::TensorMap* a_map,
                                        const tma::TensorMap* w_map, int k_tiles, const Ring& ring, Tile tile, int t0) {
  const int groups = g.c_out / kTileK<T>, m0 = tile.row * kBlockM;
  const int xq = m0 % pc.wc, rest = m0 / pc.wc, yq = rest % pc.hc, b = rest / pc.hc;
  const int y0 = yq + pc.dy - (pc.nr - 1), x0 = xq + pc.dx - (pc.ns - 1);  // the traversal's coordinates
  for (int t = 0; t < k_tiles; ++t) {
    const int st = stage_of(t0 + t), tap = t / groups, c0 = (t % groups) * kTileK<T>, jr = tap / pc.ns,
              js = tap % pc.ns;
    mbarrier_wait(&ring.empty[st], empty_parity(t0 + t));
    mbarrier_arrive_expect_tx(&ring.full[st], kStageBytes);
    tma::load_im2col(ring.a_tile(st), a_map, c0, x0, y0, b, uint16_t(pc.ns - 1 - js), uint16_t(pc.nr - 1 - jr),
                     &ring.full[st]);
    load_weights_tile<T>(ring, st, w_map, (pc.ry0 + g.stride * jr) * g.k + pc.rx0 + g.stride * js, g.c_in, tile.col,
                         c0);
  }
}

// Persistent blocks over the tiles (c_in tiles, row tiles of the largest class, classes): each
// block walks its share (TileOrder), skipping the row tiles a smaller class does not have. A class
// without taps (a kernel smaller than the stride) stores zeros, or leaves grad_in as it was when
// accumulating.
template <typename T, bool Im2colA>
__global__ void __launch_bounds__(kThreads, 1)
    conv_backward_data_wgmma_kernel(ConvGeom g, NhwcView<const T> grad_out,
                                    const __grid_constant__ tma::TensorMap w_map,
                                    const __grid_constant__ ClassMaps class_maps, NhwcView<T> grad_in,
                                    bool accumulate, TileOrder order) {
  const Ring ring = make_ring(Im2colA ? 1 : 128 + 1);  // thread 0's expect_tx (and the gatherers)
  int t0 = 0;  // the ring's k-tiles before this tile's
  for (long long i = blockIdx.x; i < order.count(); i += gridDim.x) {
    const Tile tile = order(i);
    const ParityClass pc(g, tile.z);
    const int rows = pc.rows(g), k_tiles = pc.nr * pc.ns * (g.c_out / kTileK<T>);
    if (tile.row * kBlockM >= rows) continue;  // a smaller class
    if (threadIdx.x < 128) {
      if constexpr (Im2colA) {
        if (threadIdx.x == 0 && k_tiles > 0)
          produce_backward_im2col<T>(g, pc, &class_maps.cls[tile.z], &w_map, k_tiles, ring, tile, t0);
      } else {
        produce_backward<T>(g, pc, grad_out, &w_map, k_tiles, ring, tile, t0);
      }
    } else {
      const OutRows<T, ClassPixels> out{grad_in.data, grad_in.stride, rows, grad_in.c, nullptr, accumulate, {g, pc}};
      multiply_and_store<T, false, false, !kBackwardBKMajor<T>>(k_tiles, ring, out, tile, t0);
    }
    t0 += k_tiles;
  }
}

// wt[tap][ci][co] = w[co][tap][ci]: each tap's [c_out][c_in] slice transposed, 32x32 tiles through
// shared memory (block (32, 8), grid (c_in / 32, c_out / 32, taps)).
__global__ void transpose_taps_kernel(const float* w, int c_out, int taps, int c_in, float* wt) {
  __shared__ float tile[32][33];
  const int tap = int(blockIdx.z), ci0 = int(blockIdx.x) * 32, co0 = int(blockIdx.y) * 32, x = int(threadIdx.x);
  for (int r = int(threadIdx.y); r < 32; r += 8)
    if (co0 + r < c_out && ci0 + x < c_in) tile[r][x] = w[(size_t(co0 + r) * taps + tap) * c_in + ci0 + x];
  __syncthreads();
  for (int r = int(threadIdx.y); r < 32; r += 8)
    if (ci0 + r < c_in && co0 + x < c_out) wt[(size_t(tap) * c_in + ci0 + r) * c_out + co0 + x] = tile[x][r];
}

constexpr int kMaxStride = 255;  // the grid's z: stride^2 parity classes

// The backward data's largest parity class, (0, 0): its rows.
size_t largest_class_rows(const Conv2dShape& s) {
  return size_t(s.n) * ceil_div(size_t(s.h), size_t(s.stride)) * ceil_div(size_t(s.w), size_t(s.stride));
}

// The corners of class `pc`'s map of grad_out (ClassMaps): its hc x wc grid at (dy - (nr - 1),
// dx - (ns - 1)).
struct ClassBox {
  int lower_h, lower_w, upper_h, upper_w;
};
ClassBox class_box(const ConvGeom& g, const ParityClass& pc) {
  const int lower_h = pc.dy - (pc.nr - 1), lower_w = pc.dx - (pc.ns - 1);
  return ClassBox{lower_h, lower_w, lower_h + pc.hc - g.oh, lower_w + pc.wc - g.ow};
}
// Whether the class reads anything (rows and taps): the others' maps are never loaded.
bool class_reads(const ConvGeom& g, const ParityClass& pc) { return pc.rows(g) > 0 && pc.nr * pc.ns > 0; }

template <typename T>
ClassMaps grad_out_class_maps(const Conv2dShape& s, NhwcView<const T> grad_out) {
  const ConvGeom g = geometry(s);
  ClassMaps maps{};
  for (int z = s.stride * s.stride - 1; z >= 0; --z) {  // class 0 last: it always reads, and stands in
    const ParityClass pc(g, z);
    if (!class_reads(g, pc)) continue;
    const ClassBox box = class_box(g, pc);
    tma::Im2colNhwc t{};
    t.base = grad_out.data;
    t.element_bytes = sizeof(T);
    t.n = uint64_t(s.n), t.h = uint64_t(g.oh), t.w = uint64_t(g.ow), t.c = uint64_t(s.c_out);
    t.pixel_stride_bytes = uint64_t(grad_out.stride) * sizeof(T);
    t.lower_h = box.lower_h, t.lower_w = box.lower_w, t.upper_h = box.upper_h, t.upper_w = box.upper_w;
    t.stride = 1;
    t.channels_per_pixel = uint32_t(kTileK<T>);
    t.pixels_per_column = kBlockM;
    t.swizzle = 1;
    maps.cls[z] = tma::encode_im2col(t);
  }
  for (int z = 1; z < s.stride * s.stride; ++z)
    if (!class_reads(g, ParityClass(g, z))) maps.cls[z] = maps.cls[0];
  return maps;
}

}  // namespace

template <typename T>
bool conv2d_backward_data_wgmma_im2col_takes(const Conv2dShape& s, NhwcView<const T> grad_out) {
  if (!conv2d_backward_data_wgmma_takes(s) || s.stride > 2 || s.k > 16 || s.c_out % kTileK<T> != 0 ||
      (size_t(grad_out.stride) * sizeof(T)) % 16 != 0 || !tma::swizzled_base_fits(grad_out.data))
    return false;
  const ConvGeom g = geometry(s);
  for (int z = 0; z < s.stride * s.stride; ++z) {
    const ClassBox b = class_box(g, ParityClass(g, z));
    for (int corner : {b.lower_h, b.lower_w, b.upper_h, b.upper_w})
      if (corner < -128 || corner > 127) return false;
  }
  return true;
}

bool conv2d_backward_data_wgmma_takes(const Conv2dShape& s) {
  return s.k * s.k <= kMaxTaps && s.c_out % kBlockK == 0 && s.c_in % 8 == 0 && s.stride <= kMaxStride &&
         ceil_div(largest_class_rows(s), size_t(kBlockM)) <= kMaxRowTiles;
}

template <typename T>
size_t conv2d_backward_data_wgmma_workspace_bytes(const Conv2dShape& s) {
  if constexpr (kBackwardBKMajor<T>) return (s.weight_count() * sizeof(float) + 255) / 256 * 256;
  else return 0;
}

template <typename T>
void conv2d_backward_data_wgmma(const Conv2dShape& s, NhwcView<const T> grad_out, const T* weights,
                                NhwcView<T> grad_in, bool accumulate, cudaStream_t stream, void* workspace,
                                size_t workspace_bytes, WgmmaInput input) {
  s.validate();
  require_wgmma("conv2d_backward_data_wgmma");
  constexpr int V = 16 / int(sizeof(T));  // elements a 16-byte copy
  if (!conv2d_backward_data_wgmma_takes(s) || grad_out.stride % V != 0 ||
      reinterpret_cast<uintptr_t>(grad_out.data) % 16 != 0)
    throw Error("conv2d_backward_data_wgmma: needs a 1x1 or 3x3 kernel, c_out a multiple of 64 (" +
                std::to_string(s.c_out) + "), c_in a multiple of 8 (" + std::to_string(s.c_in) +
                "), at most 65535 * 128 pixels a parity class and grad_out's pixel stride a multiple of 16 bytes "
                "with 16-byte aligned data");
  if (grad_out.n != s.n || grad_out.h != s.out_h() || grad_out.w != s.out_w() || grad_out.c != s.c_out ||
      grad_in.n != s.n || grad_in.h != s.h || grad_in.w != s.w || grad_in.c != s.c_in)
    throw Error("conv2d_backward_data_wgmma: the views do not match the shape");
  const size_t needed = conv2d_backward_data_wgmma_workspace_bytes<T>(s);
  if (workspace_bytes < needed || (needed > 0 && !tma::swizzled_base_fits(workspace)))
    throw Error("conv2d_backward_data_wgmma: needs " + std::to_string(needed) +
                " bytes of 128-byte aligned workspace (the TF32 weights transposed, read by a swizzled map), got " +
                std::to_string(workspace_bytes));
  if (s.n == 0) return;
  const int taps = s.k * s.k, S = s.stride;
  const ConvGeom g = geometry(s);
  tma::TensorMap w_map{};  // all the taps (see load_weights_tile)
  if constexpr (kBackwardBKMajor<T>) {
    float* wt = static_cast<float*>(workspace);
    LAUNCH(transpose_taps_kernel, dim3(ceil_div(size_t(s.c_in), 32), ceil_div(size_t(s.c_out), 32), unsigned(taps)),
           dim3(32, 8), 0, stream, weights, s.c_out, taps, s.c_in, wt);
    // Wt[tap][ci]: rows of c_out floats, as 16-bit units
    w_map = tma::encode_2d(wt, uint64_t(s.c_out) * 2, uint64_t(taps) * s.c_in, uint64_t(s.c_out) * 4, 64, kBlockN, 1);
  } else {  // W[co][tap * c_in + ci]: rows co
    w_map = tma::encode_2d(weights, uint64_t(taps) * s.c_in, uint64_t(s.c_out), uint64_t(taps) * s.c_in * 2, 64,
                           kBlockK, 1);
  }
  const TileOrder order{int(ceil_div(size_t(s.c_in), kBlockN)), int(ceil_div(largest_class_rows(s), size_t(kBlockM))),
                        S * S};
  const dim3 grid(wgmma_conv_blocks(order.count()));
  const std::string needs = "a stride of at most 2 (" + std::to_string(S) + ") and a 16-byte pixel stride";
  if (uses_im2col(conv2d_backward_data_wgmma_im2col_takes(s, grad_out), input, "conv2d_backward_data_wgmma", needs,
                  tc_precision<T>(), tc::TcPass::BackwardData)) {
    const ClassMaps class_maps = grad_out_class_maps(s, grad_out);
    tc::allow_shared(conv_backward_data_wgmma_kernel<T, true>, kSharedBytes);
    LAUNCH((conv_backward_data_wgmma_kernel<T, true>), grid, dim3(kThreads), kSharedBytes, stream, g, grad_out, w_map,
           class_maps, grad_in, accumulate, order);
  } else {
    tc::allow_shared(conv_backward_data_wgmma_kernel<T, false>, kSharedBytes);
    LAUNCH((conv_backward_data_wgmma_kernel<T, false>), grid, dim3(kThreads), kSharedBytes, stream, g, grad_out,
           w_map, ClassMaps{}, grad_in, accumulate, order);
  }
}

template void conv2d_backward_data_wgmma<float>(const Conv2dShape&, NhwcView<const float>, const float*,
                                                NhwcView<float>, bool, cudaStream_t, void*, size_t, WgmmaInput);
template void conv2d_backward_data_wgmma<Bf16>(const Conv2dShape&, NhwcView<const Bf16>, const Bf16*, NhwcView<Bf16>,
                                               bool, cudaStream_t, void*, size_t, WgmmaInput);
template void conv2d_backward_data_wgmma<Fp16>(const Conv2dShape&, NhwcView<const Fp16>, const Fp16*, NhwcView<Fp16>,
                                               bool, cudaStream_t, void*, size_t, WgmmaInput);
template bool conv2d_backward_data_wgmma_im2col_takes<float>(const Conv2dShape&, NhwcView<const float>);
template bool conv2d_backward_data_wgmma_im2col_takes<Bf16>(const Conv2dShape&, NhwcView<const Bf16>);
template bool conv2d_backward_data_wgmma_im2col_takes<Fp16>(const Conv2dShape&, NhwcView<const Fp16>);
template size_t conv2d_backward_data_wgmma_workspace_bytes<float>(const Conv2dShape&);
template size_t conv2d_backward_data_wgmma_workspace_bytes<Bf16>(const Conv2dShape&);
template size_t conv2d_backward_data_wgmma_workspace_bytes<Fp16>(const Conv2dShape&);

}  // namespace yolo
