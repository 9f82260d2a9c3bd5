// 2-D convolution: reference loops and the CUDA implicit GEMMs (the fast CPU passes:
// conv_cpu.cpp).
//
// The three passes as GEMMs (P = output pixels, Q = input pixels, KK = k*k*c_in):
//   forward        out[P x c_out]     = im2col(in)[P x KK] * W^T            (W is c_out x KK)
//   backward data  grad_in[Q x c_in]  = gather(grad_out)[Q x k*k*c_out] * W' (W rows read as is)
//   backward wts   dW[c_out x KK]     = grad_out^T[c_out x P] * im2col(in)[P x KK]
// The im2col operands are never built: loaders gather them tile by tile into shared memory.
// Backward data at stride S runs S*S "parity classes" of input pixels (y % S, x % S); in each,
// only every S-th kernel tap reaches an output pixel, so no work is masked away.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/channel_moments.cuh"
#include "kernels/common.cuh"
#include "kernels/conv.h"
#include "kernels/conv_checks.h"
#include "kernels/conv_geometry.cuh"
#include "kernels/gemm_tiles.cuh"

namespace yolo {

void Conv2dShape::validate() const {
  auto fail = [&](const std::string& why) {
    throw Error("conv2d: " + why + " (n " + std::to_string(n) + ", " + std::to_string(h) + "x" + std::to_string(w) +
                ", " + std::to_string(c_in) + "->" + std::to_string(c_out) + ", k " + std::to_string(k) + ", stride " +
                std::to_string(stride) + ")");
  };
  if (n < 0) fail("negative batch");
  if (h < 1 || w < 1) fail("image height and width must be at least 1");
  if (c_in < 1 || c_out < 1) fail("channel counts must be at least 1");
  if (k < 1 || k % 2 == 0) fail("kernel size must be odd and positive");
  if (stride < 1 || stride > 64) fail("stride must be 1..64");
  const double limit = double(std::numeric_limits<int>::max());
  if (double(n) * h * w > limit || double(n) * out_h() * out_w() > limit) fail("too many pixels");
  // (k*k*c_in and c_out also bound the CUDA grids' y extent: 65535 tiles of 64.)
  if (double(k) * k * std::max(c_in, c_out) > 4e6 || double(weight_count()) > limit) fail("too many weights");
}

namespace {

using conv_detail::check_conv;
using conv_detail::check_view;

// ---- CUDA ------------------------------------------------------------------------------------

using namespace tiled;

// Gathers the 4 consecutive K values (r, s, ci), (r, s, ci + 1), ... of one output pixel's
// receptive field into v; value e is read only where in_range(e). When c_in % 4 == 0 (vec) the 4
// share one tap: one float4 load; otherwise they may cross taps and are read one by one.
// pixel(r, s) is the tap's input row, or null in the padding (which reads as 0).
template <typename PixelOf, typename InRange>
__device__ __forceinline__ void gather_taps4(const ConvGeom& g, bool vec, int r, int s, int ci, PixelOf pixel,
                                             InRange in_range, float (&v)[4]) {
  if (vec) {
    float4 t{0.0f, 0.0f, 0.0f, 0.0f};
    const float* p = in_range(0) ? pixel(r, s) : nullptr;
    if (p) t = load_pack<4>(p + ci);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float* p = in_range(e) ? pixel(r, s) : nullptr;
    v[e] = p ? p[ci] : 0.0f;
    advance3(r, s, ci, 1, g.k, g.c_in);
  }
}

// Forward A: rows = output pixels, K = (r, s, ci) of the receptive field (K-major gather).
template <int R>
struct ForwardInputLoader {
  KMajorSlot slot;
  const ConvGeom& g;
  const float* data;
  int pitch, img_row0, iy0, ix0, k_pos, k_size, r, s, ci;
  bool row_ok, vec;
  float v[4];

  __device__ __forceinline__ ForwardInputLoader(const ConvGeom& geom, ConstAct in, int m0, int k_begin, bool vector)
      : g(geom), data(in.data), pitch(in.stride), vec(vector) {
    slot.init<R>();
    const int p = m0 + slot.row;
    row_ok = slot.active && p < g.n * g.oh * g.ow;
    const int q = row_ok ? p : 0, ox = q % g.ow, t = q / g.ow, oy = t % g.oh;
    img_row0 = t / g.oh * g.h, iy0 = oy * g.stride - g.pad, ix0 = ox * g.stride - g.pad;
    k_pos = k_begin + slot.kq, k_size = g.k * g.k * g.c_in;
    ci = k_pos % g.c_in;
    const int rs = k_pos / g.c_in;
    s = rs % g.k, r = rs / g.k;
  }
  __device__ __forceinline__ const float* pixel(int rr, int ss) const {
    const int iy = iy0 + rr, ix = ix0 + ss;
    if (unsigned(iy) >= unsigned(g.h) || unsigned(ix) >= unsigned(g.w)) return nullptr;
    return data + (size_t(img_row0 + iy) * g.w + ix) * pitch;
  }
  __device__ __forceinline__ void fetch() {
    gather_taps4(g, vec, r, s, ci, [&](int rr, int ss) { return pixel(rr, ss); },
                 [&](int e) { return row_ok && k_pos + e < k_size; }, v);
    k_pos += kBK;
    advance3(r, s, ci, kBK, g.k, g.c_in);
  }
  __device__ __forceinline__ void stash(Stage<R>& stage) { slot.stash<R>(stage, v); }
};

// Writes out (plus bias) or, when K is split, this split's dense [P][c_out] partial sums.
struct ForwardEpilogue {
  float* dst;
  const float* bias;
  int pitch, pixels, c_out;
  bool vec;
  __device__ __forceinline__ void put(int p, int co, const float (&v)[4]) {
    if (p >= pixels || co >= c_out) return;
    float* out = dst + size_t(p) * pitch + co;
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = v[e] + (bias && co + e < c_out ? bias[co + e] : 0.0f);
    if (vec && co + 3 < c_out) store_floats<4>(out, r);
    else
      for (int e = 0; e < 4 && co + e < c_out; ++e) out[e] = r[e];
  }
};

// grid: (pixel tiles, c_out tiles, splits).
template <int BM, int BN>
__global__ void __launch_bounds__(kThreads, 2)
    conv_forward_kernel(ConvGeom g, ConstAct in, const float* weights, const float* bias, Act out, float* partials,
                        int splits, bool vec_in, bool vec_w, bool vec_dst, ConvMoments moments) {
  __align__(16) __shared__ float as[2][kBK][BM + kPad];
  __align__(16) __shared__ float bs[2][kBK][BN + kPad];
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN, split = int(blockIdx.z);
  const int k_size = g.k * g.k * g.c_in, pixels = g.n * g.oh * g.ow, chunk = int(split_chunk(k_size, splits));
  const int k_begin = min(k_size, split * chunk), k_end = min(k_size, k_begin + chunk);
  ForwardInputLoader<BM> la(g, in, m0, k_begin, vec_in);
  KMajorMatrixLoader<BN> lb;
  lb.init(weights, k_size, g.c_out, k_size, n0, k_begin, vec_w);
  float acc[BM / 16][BN / 16];
  mainloop<BM, BN>(la, lb, k_begin, k_end, acc, as, bs);
  ForwardEpilogue epilogue = splits == 1 ? ForwardEpilogue{out.data, bias, out.stride, pixels, g.c_out, vec_dst}
                                         : ForwardEpilogue{partials + size_t(split) * pixels * g.c_out, nullptr,
                                                           g.c_out, pixels, g.c_out, vec_dst};
  write_tile<BM, BN>(acc, m0, n0, epilogue);
  if (moments.partials && splits == 1) {  // BatchNorm's statistics of this tile, from what it wrote
    static_assert(sizeof(as) >= moments::kScratchFloats * sizeof(float) && kThreads == moments::kBlockThreads);
    __syncthreads();  // the tile's writes are visible to the block; the stages are free
    moments::tile_moments<float>(out.data, out.stride, m0, min(BM, pixels - m0), n0, min(BN, g.c_out - n0), g.c_out,
                                 int(blockIdx.x), &as[0][0][0], moments.partials, moments.counts);
  }
}

// Backward data A: rows = class pixels, K = (jr, js, co) (K-major gather of grad_out).
template <int R>
struct BackwardDataGradLoader {
  KMajorSlot slot;
  const ConvGeom& g;
  const float* data;
  int pitch, ns, img_row0, oy0, ox0, k_pos, k_size, jr, js, co;
  bool row_ok, vec;
  float v[4];

  __device__ __forceinline__ BackwardDataGradLoader(const ConvGeom& geom, const ParityClass& pc, ConstAct grad_out,
                                                    int m0, int k_begin, bool vector)
      : g(geom), data(grad_out.data), pitch(grad_out.stride), ns(max(pc.ns, 1)), vec(vector) {  // ns = 0: K = 0
    slot.init<R>();
    const int m = m0 + slot.row;
    row_ok = slot.active && m < pc.rows(g);
    const int q = row_ok ? m : 0, xq = q % pc.wc, t = q / pc.wc, yq = t % pc.hc;
    img_row0 = t / pc.hc * g.oh, oy0 = yq + pc.dy, ox0 = xq + pc.dx;
    k_pos = k_begin + slot.kq, k_size = pc.k_size(g);
    co = k_pos % g.c_out;
    const int t2 = k_pos / g.c_out;
    js = t2 % ns, jr = t2 / ns;
  }
  __device__ __forceinline__ const float* pixel(int a, int b) const {
    const int oy = oy0 - a, ox = ox0 - b;
    if (unsigned(oy) >= unsigned(g.oh) || unsigned(ox) >= unsigned(g.ow)) return nullptr;
    return data + (size_t(img_row0 + oy) * g.ow + ox) * pitch;
  }
  __device__ __forceinline__ void fetch() {
    if (vec) {  // c_out % 4 == 0
      float4 t{0.0f, 0.0f, 0.0f, 0.0f};
      const float* p = row_ok && k_pos < k_size ? pixel(jr, js) : nullptr;
      if (p) t = load_pack<4>(p + co);
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
      int a = jr, b = js, c = co;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float* p = row_ok && k_pos + e < k_size ? pixel(a, b) : nullptr;
        v[e] = p ? p[c] : 0.0f;
        advance3(a, b, c, 1, ns, g.c_out);
      }
    }
    k_pos += kBK;
    advance3(jr, js, co, kBK, ns, g.c_out);
  }
  __device__ __forceinline__ void stash(Stage<R>& stage) { slot.stash<R>(stage, v); }
};

// Backward data B: rows = K (jr, js, co), columns = ci: weights[co][r][s][ci..] (MN-major).
template <int R>
struct BackwardDataWeightLoader {
  MnMajorSlot slot;
  const ConvGeom& g;
  const float* weights;
  int ry0, rx0, ns, ci, k_pos, k_size, jr, js, co;
  bool vec;
  float v[4];

  __device__ __forceinline__ BackwardDataWeightLoader(const ConvGeom& geom, const ParityClass& pc, const float* w,
                                                      int n0, int k_begin, bool vector)
      : g(geom), weights(w), ry0(pc.ry0), rx0(pc.rx0), ns(max(pc.ns, 1)), vec(vector) {
    slot.init<R>();
    ci = n0 + slot.rq;
    k_pos = k_begin + slot.k_local, k_size = pc.k_size(g);
    co = k_pos % g.c_out;
    const int t = k_pos / g.c_out;
    js = t % ns, jr = t / ns;
  }
  __device__ __forceinline__ void fetch() {
    const bool ok = slot.active && k_pos < k_size;
    const int r = ry0 + g.stride * jr, s = rx0 + g.stride * js;
    const float* p = weights + ((size_t(ok ? co : 0) * g.k + (ok ? r : 0)) * g.k + (ok ? s : 0)) * g.c_in + ci;
    if (vec) {  // c_in % 4 == 0
      float4 t{0.0f, 0.0f, 0.0f, 0.0f};
      if (ok && ci < g.c_in) t = load_pack<4>(p);
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = ok && ci + e < g.c_in ? p[e] : 0.0f;
    }
    k_pos += kBK;
    advance3(jr, js, co, kBK, ns, g.c_out);
  }
  __device__ __forceinline__ void stash(Stage<R>& stage) { slot.stash<R>(stage, v); }
};

// Writes grad_in (splits == 1: = or += ) or this split's partial sums [split][Q][c_in].
struct BackwardDataEpilogue {
  const ConvGeom& g;
  const ParityClass& pc;
  float* dst;
  int pitch, rows;
  bool accumulate, vec;
  __device__ __forceinline__ void put(int m, int ci, const float (&v)[4]) {
    if (m >= rows || ci >= g.c_in) return;
    float* p = dst + size_t(pc.input_pixel(g, m)) * pitch + ci;
    if (vec && ci + 3 < g.c_in) {
      float r[4] = {v[0], v[1], v[2], v[3]};
      if (accumulate) {
        float4 old = load_pack<4>(p);
        r[0] += old.x, r[1] += old.y, r[2] += old.z, r[3] += old.w;
      }
      store_floats<4>(p, r);
    } else {
      for (int e = 0; e < 4 && ci + e < g.c_in; ++e) p[e] = accumulate ? p[e] + v[e] : v[e];
    }
  }
};

// grid: (row tiles of the largest class, c_in tiles, classes * splits).
template <int BM, int BN>
__global__ void __launch_bounds__(kThreads, 2)
    conv_backward_data_kernel(ConvGeom g, ConstAct grad_out, const float* weights, Act grad_in, bool accumulate,
                              float* partials, int splits, bool vec_grad, bool vec_w, bool vec_dst) {
  __align__(16) __shared__ float as[2][kBK][BM + kPad];
  __align__(16) __shared__ float bs[2][kBK][BN + kPad];
  const ParityClass pc(g, int(blockIdx.z) / splits);
  const int split = int(blockIdx.z) % splits, rows = pc.rows(g);
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN;
  if (m0 >= rows) return;  // a smaller class: the whole block leaves
  const int k_size = pc.k_size(g), chunk = int(split_chunk(k_size, splits));
  const int k_begin = min(k_size, split * chunk), k_end = min(k_size, k_begin + chunk);
  BackwardDataGradLoader<BM> la(g, pc, grad_out, m0, k_begin, vec_grad);
  BackwardDataWeightLoader<BN> lb(g, pc, weights, n0, k_begin, vec_w);
  float acc[BM / 16][BN / 16];
  mainloop<BM, BN>(la, lb, k_begin, k_end, acc, as, bs);
  const bool direct = splits == 1;
  float* dst = direct ? grad_in.data : partials + size_t(split) * g.n * g.h * g.w * g.c_in;
  BackwardDataEpilogue epilogue{g, pc, dst, direct ? grad_in.stride : g.c_in, rows, direct && accumulate, vec_dst};
  write_tile<BM, BN>(acc, m0, n0, epilogue);
}

// Backward weights B: rows = K (output pixels p), columns = (r, s, ci) (MN-major gather of in).
template <int R>
struct BackwardWeightInputLoader {
  MnMajorSlot slot;
  const ConvGeom& g;
  const float* data;
  int pitch, col, r, s, ci, k_pos, pixels, b, oy, ox;
  bool vec;
  float v[4];

  __device__ __forceinline__ BackwardWeightInputLoader(const ConvGeom& geom, ConstAct in, int n0, int k_begin,
                                                       bool vector)
      : g(geom), data(in.data), pitch(in.stride), vec(vector) {
    slot.init<R>();
    col = n0 + slot.rq;
    ci = col % g.c_in;
    const int rs = col / g.c_in;
    s = rs % g.k, r = rs / g.k;
    k_pos = k_begin + slot.k_local, pixels = g.n * g.oh * g.ow;
    ox = k_pos % g.ow;
    const int t = k_pos / g.ow;
    oy = t % g.oh, b = t / g.oh;
  }
  __device__ __forceinline__ const float* pixel(int rr, int ss) const {
    const int iy = oy * g.stride - g.pad + rr, ix = ox * g.stride - g.pad + ss;
    if (unsigned(iy) >= unsigned(g.h) || unsigned(ix) >= unsigned(g.w)) return nullptr;
    return data + (size_t(b * g.h + iy) * g.w + ix) * pitch;
  }
  __device__ __forceinline__ void fetch() {
    const bool ok = slot.active && k_pos < pixels;
    const int cols = g.k * g.k * g.c_in;
    gather_taps4(g, vec, r, s, ci, [&](int rr, int ss) { return pixel(rr, ss); },
                 [&](int e) { return ok && col + e < cols; }, v);
    k_pos += kBK;
    advance3(b, oy, ox, kBK, g.oh, g.ow);
  }
  __device__ __forceinline__ void stash(Stage<R>& stage) { slot.stash<R>(stage, v); }
};

// Writes dW [c_out][KK] (splits == 1) or this split's partial sums [split][c_out][KK].
struct BackwardWeightEpilogue {
  float* dst;
  int c_out, cols;
  bool vec;
  __device__ __forceinline__ void put(int co, int col, const float (&v)[4]) {
    if (co >= c_out || col >= cols) return;
    float* p = dst + size_t(co) * cols + col;
    if (vec && col + 3 < cols) store_floats<4>(p, v);
    else
      for (int e = 0; e < 4 && col + e < cols; ++e) p[e] = v[e];
  }
};

// grid: (c_out tiles, KK tiles, splits).
template <int BM, int BN>
__global__ void __launch_bounds__(kThreads, 2)
    conv_backward_weights_kernel(ConvGeom g, ConstAct in, ConstAct grad_out, float* grad_weights, float* partials,
                                 int splits, bool vec_grad, bool vec_in, bool vec_dst) {
  __align__(16) __shared__ float as[2][kBK][BM + kPad];
  __align__(16) __shared__ float bs[2][kBK][BN + kPad];
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN, split = int(blockIdx.z);
  const int pixels = g.n * g.oh * g.ow, cols = g.k * g.k * g.c_in, chunk = int(split_chunk(pixels, splits));
  const int k_begin = min(pixels, split * chunk), k_end = min(pixels, k_begin + chunk);
  MnMajorMatrixLoader<BM> la;  // grad_out as [pixels][c_out]
  la.init(grad_out.data, grad_out.stride, g.c_out, pixels, m0, k_begin, vec_grad);
  BackwardWeightInputLoader<BN> lb(g, in, n0, k_begin, vec_in);
  float acc[BM / 16][BN / 16];
  mainloop<BM, BN>(la, lb, k_begin, k_end, acc, as, bs);
  float* dst = splits == 1 ? grad_weights : partials + size_t(split) * g.c_out * cols;
  BackwardWeightEpilogue epilogue{dst, g.c_out, cols, vec_dst};
  write_tile<BM, BN>(acc, m0, n0, epilogue);
}

// Calls launch.template operator()<BM, BN>() for the plan's tile.
template <typename F>
void with_tile(const TilePlan& plan, F&& launch) {
  switch (plan.tile) {
    case 0: return launch.template operator()<128, 128>();
    case 1: return launch.template operator()<128, 64>();
    case 2: return launch.template operator()<64, 128>();
    default: return launch.template operator()<64, 64>();
  }
}

template <typename V>
bool vec_ok(const V& v) {
  return v.c % 4 == 0 && v.stride % 4 == 0 && aligned16(v.data);
}

// Forward: out[P x c_out] = im2col(in)[P x KK] * W^T.
TilePlan forward_plan(const Conv2dShape& s) {
  const long long pixels = (long long)s.n * s.out_h() * s.out_w();
  return plan_tiles(pixels, s.c_out, (long long)s.k * s.k * s.c_in, 1, kMaxSplits, kMinSplitK);
}

// Backward data: the classes' average K stands for all of them (the larger classes dominate).
TilePlan backward_data_plan(const Conv2dShape& s) {
  const int S = s.stride, classes = S * S;
  const long long rows = (long long)s.n * ((s.h + S - 1) / S) * ((s.w + S - 1) / S);
  const long long k = (long long)s.k * s.k * s.c_out / classes + 1;
  return plan_tiles(rows, s.c_in, k, classes, std::min(kMaxSplits, 65535 / classes), kMinSplitK);
}

TilePlan backward_weights_plan(const Conv2dShape& s) {
  const long long pixels = (long long)s.n * s.out_h() * s.out_w();
  return plan_tiles(s.c_out, (long long)s.k * s.k * s.c_in, pixels, 1, kMaxSplits, kMinSplitK);
}

}  // namespace

// ---- public entry points -------------------------------------------------------------------------

template <typename T>
void conv2d_forward_reference(const Conv2dShape& s, NhwcView<const T> in, const T* weights, const T* bias,
                              NhwcView<T> out, void*, size_t) {
  check_conv("conv2d_forward_reference", s, in, "in", true, out, "out", weights);
  const int pad = s.pad();
  for (int b = 0; b < s.n; ++b)
    for (int oy = 0; oy < s.out_h(); ++oy)
      for (int ox = 0; ox < s.out_w(); ++ox)
        for (int co = 0; co < s.c_out; ++co) {
          T sum = 0;
          for (int r = 0; r < s.k; ++r)
            for (int sx = 0; sx < s.k; ++sx) {
              const int iy = oy * s.stride - pad + r, ix = ox * s.stride - pad + sx;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              for (int ci = 0; ci < s.c_in; ++ci)
                sum += in.data[in.at(b, iy, ix, ci)] * weights[((size_t(co) * s.k + r) * s.k + sx) * s.c_in + ci];
            }
          out.data[out.at(b, oy, ox, co)] = sum + (bias ? bias[co] : T(0));
        }
}

template <typename T>
void conv2d_backward_data_reference(const Conv2dShape& s, NhwcView<const T> grad_out, const T* weights,
                                    NhwcView<T> grad_in, bool accumulate, void*, size_t) {
  check_conv("conv2d_backward_data_reference", s, grad_out, "grad_out", false, grad_in, "grad_in", weights);
  const int pad = s.pad(), S = s.stride;
  for (int b = 0; b < s.n; ++b)
    for (int iy = 0; iy < s.h; ++iy)
      for (int ix = 0; ix < s.w; ++ix)
        for (int ci = 0; ci < s.c_in; ++ci) {
          T sum = 0;
          for (int r = 0; r < s.k; ++r)
            for (int sx = 0; sx < s.k; ++sx) {
              const int ty = iy + pad - r, tx = ix + pad - sx;  // = output pixel * stride
              if (ty < 0 || tx < 0 || ty % S != 0 || tx % S != 0 || ty / S >= s.out_h() || tx / S >= s.out_w())
                continue;
              for (int co = 0; co < s.c_out; ++co)
                sum += grad_out.data[grad_out.at(b, ty / S, tx / S, co)] *
                       weights[((size_t(co) * s.k + r) * s.k + sx) * s.c_in + ci];
            }
          T& dst = grad_in.data[grad_in.at(b, iy, ix, ci)];
          dst = accumulate ? dst + sum : sum;
        }
}

template <typename T>
void conv2d_backward_weights_reference(const Conv2dShape& s, NhwcView<const T> in, NhwcView<const T> grad_out,
                                       T* grad_weights, T* grad_bias, void*, size_t) {
  check_conv("conv2d_backward_weights_reference", s, in, "in", true, grad_out, "grad_out", grad_weights, "grad_weights");
  const int pad = s.pad();
  for (int co = 0; co < s.c_out; ++co) {
    for (int r = 0; r < s.k; ++r)
      for (int sx = 0; sx < s.k; ++sx)
        for (int ci = 0; ci < s.c_in; ++ci) {
          T sum = 0;
          for (int b = 0; b < s.n; ++b)
            for (int oy = 0; oy < s.out_h(); ++oy)
              for (int ox = 0; ox < s.out_w(); ++ox) {
                const int iy = oy * s.stride - pad + r, ix = ox * s.stride - pad + sx;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                sum += grad_out.data[grad_out.at(b, oy, ox, co)] * in.data[in.at(b, iy, ix, ci)];
              }
          grad_weights[((size_t(co) * s.k + r) * s.k + sx) * s.c_in + ci] = sum;
        }
    if (grad_bias) {
      T sum = 0;
      for (int b = 0; b < s.n; ++b)
        for (int oy = 0; oy < s.out_h(); ++oy)
          for (int ox = 0; ox < s.out_w(); ++ox) sum += grad_out.data[grad_out.at(b, oy, ox, co)];
      grad_bias[co] = sum;
    }
  }
}

size_t conv2d_forward_workspace_bytes(const Conv2dShape& s) {
  s.validate();
  if (s.n == 0) return 0;
  return split_partials_bytes(forward_plan(s), (long long)s.n * s.out_h() * s.out_w(), s.c_out);
}

int conv2d_forward_moment_blocks(const Conv2dShape& s) {
  s.validate();
  const long long pixels = (long long)s.n * s.out_h() * s.out_w();
  const TilePlan plan = forward_plan(s);
  return plan.splits > 1 ? moments::split_moment_blocks(pixels) : int(ceil_div(pixels, plan.bm()));
}

void conv2d_forward_cuda(const Conv2dShape& s, ConstAct in, const float* weights, const float* bias, Act out,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream, ConvMoments moments) {
  const char* op = "conv2d_forward_cuda";
  check_conv(op, s, in, "in", true, out, "out", weights);
  if (s.n == 0) return;
  const TilePlan plan = forward_plan(s);
  check_workspace(op, conv2d_forward_workspace_bytes(s), workspace, workspace_bytes);
  const ConvGeom g = geometry(s);
  const long long pixels = (long long)s.n * g.oh * g.ow;
  float* partials = static_cast<float*>(workspace);
  const bool vec_in = vec_ok(in), vec_w = s.c_in % 4 == 0 && aligned16(weights);
  const bool vec_dst = plan.splits > 1 ? s.c_out % 4 == 0 : vec_ok(out);
  if (bool(moments.partials) != bool(moments.counts))
    throw Error(std::string(op) + ": moments needs both its partials and its counts");
  with_tile(plan, [&]<int BM, int BN>() {
    LAUNCH((conv_forward_kernel<BM, BN>), dim3(ceil_div(pixels, BM), ceil_div(s.c_out, BN), unsigned(plan.splits)),
           dim3(kThreads), 0, stream, g, in, weights, bias, out, partials, plan.splits, vec_in, vec_w, vec_dst,
           moments);
  });
  if (plan.splits > 1 && moments.partials)
    moments::launch_sum_splits_moments<float>(partials, plan.splits, int(pixels), s.c_out, out.data, out.stride, bias,
                                              moments.partials, moments.counts, stream);
  else if (plan.splits > 1)
    launch_sum_splits(partials, plan.splits, int(pixels), s.c_out, out.data, out.stride, false, bias, stream);
}

size_t conv2d_backward_data_workspace_bytes(const Conv2dShape& s) {
  s.validate();
  const TilePlan plan = backward_data_plan(s);
  return split_partials_bytes(plan, (long long)s.n * s.h * s.w, s.c_in);
}

void conv2d_backward_data_cuda(const Conv2dShape& s, ConstAct grad_out, const float* weights, Act grad_in,
                               bool accumulate, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "conv2d_backward_data_cuda";
  check_conv(op, s, grad_out, "grad_out", false, grad_in, "grad_in", weights);
  if (s.n == 0) return;
  const TilePlan plan = backward_data_plan(s);
  check_workspace(op, conv2d_backward_data_workspace_bytes(s), workspace, workspace_bytes);
  const ConvGeom g = geometry(s);
  const int S = s.stride;
  float* partials = static_cast<float*>(workspace);
  const bool vec_grad = vec_ok(grad_out), vec_w = s.c_in % 4 == 0 && aligned16(weights);
  const bool vec_dst = plan.splits > 1 ? s.c_in % 4 == 0 : vec_ok(grad_in);
  const long long class_rows = (long long)s.n * ((s.h + S - 1) / S) * ((s.w + S - 1) / S);  // class (0, 0): the largest
  with_tile(plan, [&]<int BM, int BN>() {
    LAUNCH((conv_backward_data_kernel<BM, BN>),
           dim3(ceil_div(class_rows, BM), ceil_div(s.c_in, BN), unsigned(S * S * plan.splits)), dim3(kThreads), 0,
           stream, g, grad_out, weights, grad_in, accumulate, partials, plan.splits, vec_grad, vec_w, vec_dst);
  });
  if (plan.splits > 1)
    launch_sum_splits(partials, plan.splits, s.n * s.h * s.w, s.c_in, grad_in.data, grad_in.stride, accumulate, nullptr,
                      stream);
}

size_t conv2d_backward_weights_workspace_bytes(const Conv2dShape& s) {
  s.validate();
  const TilePlan plan = backward_weights_plan(s);
  return split_partials_bytes(plan, s.c_out, (long long)s.k * s.k * s.c_in) + bias_partials_bytes(s);
}

void conv2d_backward_weights_cuda(const Conv2dShape& s, ConstAct in, ConstAct grad_out, float* grad_weights,
                                  float* grad_bias, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "conv2d_backward_weights_cuda";
  check_conv(op, s, in, "in", true, grad_out, "grad_out", grad_weights, "grad_weights");
  const TilePlan plan = backward_weights_plan(s);
  check_workspace(op, conv2d_backward_weights_workspace_bytes(s), workspace, workspace_bytes);
  const ConvGeom g = geometry(s);
  const int cols = s.k * s.k * s.c_in;
  float* partials = static_cast<float*>(workspace);
  float* bias_partials =
      reinterpret_cast<float*>(static_cast<char*>(workspace) + split_partials_bytes(plan, s.c_out, cols));
  const bool vec_grad = vec_ok(grad_out), vec_in = vec_ok(in);
  const bool vec_dst = cols % 4 == 0 && (plan.splits > 1 || aligned16(grad_weights));
  with_tile(plan, [&]<int BM, int BN>() {
    LAUNCH((conv_backward_weights_kernel<BM, BN>),
           dim3(ceil_div(s.c_out, BM), ceil_div(cols, BN), unsigned(plan.splits)), dim3(kThreads), 0, stream, g, in,
           grad_out, grad_weights, partials, plan.splits, vec_grad, vec_in, vec_dst);
  });
  if (plan.splits > 1)
    launch_sum_splits(partials, plan.splits, s.c_out, cols, grad_weights, cols, false, nullptr, stream);
  if (grad_bias) launch_bias_gradient(s, grad_out, grad_bias, bias_partials, stream);
}

template void conv2d_forward_reference<float>(const Conv2dShape&, NhwcView<const float>, const float*, const float*,
                                              NhwcView<float>, void*, size_t);
template void conv2d_forward_reference<double>(const Conv2dShape&, NhwcView<const double>, const double*,
                                               const double*, NhwcView<double>, void*, size_t);
template void conv2d_backward_data_reference<float>(const Conv2dShape&, NhwcView<const float>, const float*,
                                                    NhwcView<float>, bool, void*, size_t);
template void conv2d_backward_data_reference<double>(const Conv2dShape&, NhwcView<const double>, const double*,
                                                     NhwcView<double>, bool, void*, size_t);
template void conv2d_backward_weights_reference<float>(const Conv2dShape&, NhwcView<const float>,
                                                       NhwcView<const float>, float*, float*, void*, size_t);
template void conv2d_backward_weights_reference<double>(const Conv2dShape&, NhwcView<const double>,
                                                        NhwcView<const double>, double*, double*, void*, size_t);

}  // namespace yolo
