// 2-D convolution on tensor cores: the three passes as implicit GEMMs on the mma.sync main loop
// of kernels/tc_tiles.cuh, in TF32 (float tensors), BF16 or FP16 (16-bit tensors), all summing
// in FP32. The GEMMs are those of kernels/conv.cu (P = output pixels, KK = k*k*c_in):
//   forward        out[P x c_out]     = im2col(in)[P x KK] * W^T      A K-major, B K-major
//   backward data  grad_in[Q x c_in]  = gather(grad_out) * W'          A K-major, B MN-major
//                  (per parity class of input pixels, as in conv.cu)
//   backward wts   dW[c_out x KK]     = grad_out^T[c_out x P] * im2col(in)   both MN-major
// Loaders hand the main loop 16-byte chunks (one tap's V consecutive channels) when channel
// counts, pitches and pointers allow, and gather element by element otherwise (the 3-channel
// first layer, channel slices at odd offsets); the reduction is padded with zeros to the stage.
#include <algorithm>
#include <string>

#include "kernels/channel_moments.cuh"
#include "kernels/conv.h"
#include "kernels/conv_geometry.cuh"
#include "kernels/conv_small_c.h"
#include "kernels/conv_wgmma.h"
#include "kernels/normalized_input.cuh"
#include "kernels/tc_epilogue.cuh"
#include "kernels/tc_tiles.cuh"
#include "kernels/tma.h"

namespace yolo {

namespace {

using namespace tc;

// ---- loaders ----------------------------------------------------------------------------------

// Loaders keep a Cursor3 along the reduction (its split indices), stepped by a stage
// at a time; gathers step a copy by one element. A K-major loader's chunks (t, t + 256, ...) lie
// at the same k of different rows, so they share one cursor, and the cursor's tap as a pixel
// offset from each row's corner pixel, computed once a stage (pixel indices fit 32 bits; element
// offsets need not).
constexpr int kOutside = -(1 << 28);  // a row or tap position no offset brings back into the image

template <typename T>
constexpr bool chunks_share_k() {
  return kThreads % (Tc<T>::BK / Tc<T>::V) == 0;
}

// Forward A: rows = output pixels, K = (r, s, ci) of the receptive field (K-major).
template <typename T, int R>
struct ForwardInput {
  using S = Smem<T, true, R>;
  static constexpr int CP = S::chunks_per_thread, V = S::V;
  static_assert(chunks_share_k<T>());
  const ConvGeom& g;
  const T* data;
  int pitch;
  NormalizedInput norm;  // BatchNorm's apply on what is read (conv.h), or none
  int corner[CP];        // pixel index of the receptive field's top-left (it may lie outside the image)
  int iy0[CP], ix0[CP];  // its position; kOutside for rows past the last output pixel
  Cursor3 k;             // (r, s, ci)
  int tap;               // r * w + s: the cursor's pixel offset from a corner

  __device__ ForwardInput(const ConvGeom& geom, NhwcView<const T> in, NormalizedInput n, int m0, int k_begin)
      : g(geom), data(in.data), pitch(in.stride), norm(n) {
#pragma unroll
    for (int i = 0; i < CP; ++i) {
      const int p = m0 + S::chunk(i).row;
      const bool ok = p < g.n * g.oh * g.ow;
      const int q = ok ? p : 0, ox = q % g.ow, t = q / g.ow, oy = t % g.oh;
      const int iy = oy * g.stride - g.pad;
      ix0[i] = ox * g.stride - g.pad, iy0[i] = ok ? iy : kOutside;
      corner[i] = (t / g.oh * g.h + iy) * g.w + ix0[i];
    }
    k.start(k_begin + S::chunk(0).k, g.k, g.c_in);
    tap = k.major * g.w + k.middle;
  }
  __device__ bool inside(int i, int rr, int ss) const {
    return unsigned(iy0[i] + rr) < unsigned(g.h) && unsigned(ix0[i] + ss) < unsigned(g.w);
  }
  __device__ const T* base() const { return data; }
  __device__ const T* vec_ptr(int i) const {
    return k.major < g.k && inside(i, k.major, k.middle) ? data + size_t(corner[i] + tap) * pitch + k.minor : nullptr;
  }
  __device__ void gather(int i, T (&v)[V]) const {
    Cursor3 e = k;
#pragma unroll
    for (int j = 0; j < V; ++j, e.step(1, g.k, g.c_in)) {
      const bool ok = e.major < g.k && inside(i, e.major, e.middle);
      v[j] = ok ? data[size_t(corner[i] + e.major * g.w + e.middle) * pitch + e.minor] : T{};
      if (norm && ok) v[j] = normalized_element(norm, e.minor, v[j]);
    }
  }
  // Chunk i as read through vec_ptr (inside the image): channels k.minor..
  __device__ void normalize(int, uint4& r) const {
    if (norm) r = normalized_chunk<T>(norm, k.minor, r);
  }
  __device__ void advance() {
    k.step(Tc<T>::BK, g.k, g.c_in);
    tap = k.major * g.w + k.middle;
  }
};

// Backward data A: rows = the class's input pixels, K = (jr, js, co) (K-major gather of grad_out):
// tap (jr, js) of input pixel row m reads output pixel (oy0 - jr, ox0 - js).
template <typename T, int R>
struct BackwardDataGrad {
  using S = Smem<T, true, R>;
  static constexpr int CP = S::chunks_per_thread, V = S::V;
  static_assert(chunks_share_k<T>());
  const ConvGeom& g;
  const T* data;
  int pitch, nr, ns;      // taps (jr < nr, js < ns); nr = 0 when the class has none
  int corner[CP];        // pixel index of the row's output pixel (oy0, ox0) (it may lie outside the image)
  int oy0[CP], ox0[CP];  // kOutside for rows past the class's last
  Cursor3 k;             // (jr, js, co)
  int tap;               // -(jr * ow + js): the cursor's pixel offset from a corner

  __device__ BackwardDataGrad(const ConvGeom& geom, const ParityClass& pc, NhwcView<const T> grad_out, int m0,
                              int k_begin)
      : g(geom), data(grad_out.data), pitch(grad_out.stride), nr(pc.ns > 0 ? pc.nr : 0), ns(max(pc.ns, 1)) {
#pragma unroll
    for (int i = 0; i < CP; ++i) {
      const int m = m0 + S::chunk(i).row;
      const bool ok = m < pc.rows(g);
      const int q = ok ? m : 0, xq = q % pc.wc, t = q / pc.wc, yq = t % pc.hc;
      ox0[i] = xq + pc.dx, oy0[i] = ok ? yq + pc.dy : kOutside;
      corner[i] = (t / pc.hc * g.oh + yq + pc.dy) * g.ow + ox0[i];
    }
    k.start(k_begin + S::chunk(0).k, ns, g.c_out);
    tap = -(k.major * g.ow + k.middle);
  }
  __device__ bool inside(int i, int a, int b) const {
    return unsigned(oy0[i] - a) < unsigned(g.oh) && unsigned(ox0[i] - b) < unsigned(g.ow);
  }
  __device__ const T* base() const { return data; }
  __device__ const T* vec_ptr(int i) const {
    return k.major < nr && inside(i, k.major, k.middle) ? data + size_t(corner[i] + tap) * pitch + k.minor : nullptr;
  }
  __device__ void gather(int i, T (&v)[V]) const {
    Cursor3 e = k;
#pragma unroll
    for (int j = 0; j < V; ++j, e.step(1, ns, g.c_out)) {
      const bool ok = e.major < nr && inside(i, e.major, e.middle);
      v[j] = ok ? data[size_t(corner[i] - e.major * g.ow - e.middle) * pitch + e.minor] : T{};
    }
  }
  __device__ void advance() {
    k.step(Tc<T>::BK, ns, g.c_out);
    tap = -(k.major * g.ow + k.middle);
  }
};

// Backward data B: K = (jr, js, co), columns = ci: weights[co][r][s][ci..] (MN-major).
template <typename T, int R>
struct BackwardDataWeights {
  using S = Smem<T, false, R>;
  static constexpr int CP = S::chunks_per_thread, V = S::V;
  const ConvGeom& g;
  const T* weights;
  int ry0, rx0, nr, ns;  // as in BackwardDataGrad
  int ci;                // the chunks' first column: MN-major chunks t, t + 256, ... share their rows
  Cursor3 k[CP];         // (jr, js, co)

  __device__ BackwardDataWeights(const ConvGeom& geom, const ParityClass& pc, const T* w, int n0, int k_begin)
      : g(geom), weights(w), ry0(pc.ry0), rx0(pc.rx0), nr(pc.ns > 0 ? pc.nr : 0), ns(max(pc.ns, 1)) {
    static_assert(kThreads % (R / V) == 0);
    ci = n0 + S::chunk(0).row;
#pragma unroll
    for (int i = 0; i < CP; ++i) k[i].start(k_begin + S::chunk(i).k, ns, g.c_out);
  }
  __device__ const T* row(int i) const {
    const int r = ry0 + g.stride * k[i].major, s = rx0 + g.stride * k[i].middle;
    return weights + ((size_t(k[i].minor) * g.k + r) * g.k + s) * g.c_in;
  }
  __device__ const T* base() const { return weights; }
  __device__ const T* vec_ptr(int i) const { return k[i].major < nr && ci < g.c_in ? row(i) + ci : nullptr; }
  __device__ void gather(int i, T (&v)[V]) const {
    const bool ok = k[i].major < nr;
    const T* p = ok ? row(i) : nullptr;
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = ok && ci + e < g.c_in ? p[ci + e] : T{};
  }
  __device__ void advance() {
#pragma unroll
    for (int i = 0; i < CP; ++i) k[i].step(Tc<T>::BK, ns, g.c_out);
  }
};

// Backward weights B: K = output pixels (b, oy, ox), columns = (r, s, ci) (MN-major gather of in).
// A chunk's columns are fixed: kept as the tap's offsets from the output pixel's input corner
// (r - pad, s - pad; far outside the image past the last column) and ci.
template <typename T, int R>
struct BackwardWeightsInput {
  using S = Smem<T, false, R>;
  static constexpr int CP = S::chunks_per_thread, V = S::V;
  const ConvGeom& g;
  const T* data;
  int pitch;
  NormalizedInput norm;        // BatchNorm's apply on what is read (conv.h), or none
  int dy[CP], dx[CP], ci[CP];  // the chunk's first column
  Cursor3 k[CP];               // (b, oy, ox)

  __device__ BackwardWeightsInput(const ConvGeom& geom, NhwcView<const T> in, NormalizedInput n, int n0, int k_begin)
      : g(geom), data(in.data), pitch(in.stride), norm(n) {
#pragma unroll
    for (int i = 0; i < CP; ++i) {
      const TcAt ch = S::chunk(i);
      Cursor3 col;
      col.start(n0 + ch.row, g.k, g.c_in);
      const bool ok = col.major < g.k;
      dy[i] = ok ? col.major - g.pad : kOutside, dx[i] = col.middle - g.pad, ci[i] = col.minor;
      k[i].start(k_begin + ch.k, g.oh, g.ow);
    }
  }
  __device__ const T* pixel(int i, int ddy, int ddx) const {
    const int iy = k[i].middle * g.stride + ddy, ix = k[i].minor * g.stride + ddx;
    if (k[i].major >= g.n || unsigned(iy) >= unsigned(g.h) || unsigned(ix) >= unsigned(g.w)) return nullptr;
    return data + (size_t(k[i].major * g.h + iy) * g.w + ix) * pitch;
  }
  __device__ const T* base() const { return data; }
  __device__ const T* vec_ptr(int i) const {
    const T* p = pixel(i, dy[i], dx[i]);
    return p ? p + ci[i] : nullptr;
  }
  __device__ void gather(int i, T (&v)[V]) const {
    Cursor3 e;  // the columns (r, s, ci) from the chunk's first
    e.major = dy[i] == kOutside ? g.k : dy[i] + g.pad, e.middle = dx[i] + g.pad, e.minor = ci[i];
#pragma unroll
    for (int j = 0; j < V; ++j, advance3(e.major, e.middle, e.minor, 1, g.k, g.c_in)) {
      const T* p = e.major < g.k ? pixel(i, e.major - g.pad, e.middle - g.pad) : nullptr;
      v[j] = p ? p[e.minor] : T{};
      if (norm && p) v[j] = normalized_element(norm, e.minor, v[j]);
    }
  }
  // Chunk i as read through vec_ptr (inside the image): channels ci[i]..
  __device__ void normalize(int i, uint4& r) const {
    if (norm) r = normalized_chunk<T>(norm, ci[i], r);
  }
  __device__ void advance() {
#pragma unroll
    for (int i = 0; i < CP; ++i) k[i].step(Tc<T>::BK, g.oh, g.ow);
  }
};

// ---- epilogues (the forward's and the weight gradient's rows are plain: TileRows) -------------------

// Backward data: the parity class's rows m, scattered over the input pixels (grad_in, = or +=, as T;
// or this split's FP32 partials [input pixel][c_in]).
template <typename Out>
struct ClassRows {
  const ConvGeom& g;
  const ParityClass& pc;
  Out* base;
  long long pitch;
  int rows, cols;
  const float* bias;
  bool accumulate;
  using OutType = Out;
  __device__ Out* row(int m) const { return m < rows ? base + pc.input_pixel(g, m) * pitch : nullptr; }
  __device__ bool vec() const { return rows_aligned(base, pitch); }
};

// ---- kernels: grid (M tiles, N tiles, splits [x classes]) -----------------------------------------

template <typename T, int BM, int BN, bool Async>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(TcPass::Forward, BM, Async))
    conv_forward_tc_kernel(ConvGeom g, NhwcView<const T> in, NormalizedInput norm, const T* weights, const float* bias,
                           NhwcView<T> out, float* partials, int splits, bool vec_in, bool vec_w, ConvMoments moments) {
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN, split = int(blockIdx.z);
  const int k_size = g.k * g.k * g.c_in, pixels = g.n * g.oh * g.ow;
  const KRange k = split_range(k_size, splits, split, Tc<T>::BK);
  ForwardInput<T, BM> la(g, in, norm, m0, k.k_begin);
  MatrixLoader<T, true, BN> lb(weights, k_size, g.c_out, k_size, n0, k.k_begin);
  float acc[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4];
  run_mainloop<T, true, true, BM, BN, Async>(la, lb, k, vec_in, vec_w, acc);
  if (splits > 1) {  // this split's FP32 partial sums [P][c_out]; the second pass adds the bias
    float* part = partials + size_t(block_index_anew().z) * pixels * g.c_out;
    write_tile<BM, BN>(acc, TileRows<float>{part, g.c_out, pixels, g.c_out});
  } else {
    write_tile<BM, BN>(acc, TileRows<T>{out.data, out.stride, pixels, g.c_out, bias});
  }
  if (moments.partials && splits == 1) {  // BatchNorm's statistics of this tile, from what it wrote (as T)
    static_assert(kThreads == moments::kBlockThreads);
    __syncthreads();  // the tile's writes are visible to the block; the stages are free
    DYNAMIC_SHARED(float, scratch);
    moments::tile_moments<T>(out.data, out.stride, m0, min(BM, pixels - m0), n0, min(BN, g.c_out - n0), g.c_out,
                             int(blockIdx.x), scratch, moments.partials, moments.counts);
  }
}

template <typename T, int BM, int BN, bool Async>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(TcPass::BackwardData, BM, Async))
    conv_backward_data_tc_kernel(ConvGeom g, NhwcView<const T> grad_out, const T* weights, NhwcView<T> grad_in,
                                 bool accumulate, float* partials, int splits, bool vec_grad, bool vec_w) {
  const ParityClass pc(g, int(blockIdx.z) / splits);
  const int split = int(blockIdx.z) % splits, rows = pc.rows(g);
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN;
  if (m0 >= rows) return;  // a smaller class: the whole block leaves
  const KRange k = split_range(pc.k_size(g), splits, split, Tc<T>::BK);
  BackwardDataGrad<T, BM> la(g, pc, grad_out, m0, k.k_begin);
  BackwardDataWeights<T, BN> lb(g, pc, weights, n0, k.k_begin);
  float acc[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4];
  run_mainloop<T, true, false, BM, BN, Async>(la, lb, k, vec_grad, vec_w, acc);
  if (splits > 1) {
    float* part = partials + size_t(block_index_anew().z % splits) * g.n * g.h * g.w * g.c_in;
    write_tile<BM, BN>(acc, ClassRows<float>{g, pc, part, g.c_in, rows, g.c_in, nullptr, false});
  } else {
    write_tile<BM, BN>(acc, ClassRows<T>{g, pc, grad_in.data, grad_in.stride, rows, g.c_in, nullptr, accumulate});
  }
}

template <typename T, int BM, int BN, bool Async>
__global__ void __launch_bounds__(kThreads, min_blocks<T>(TcPass::BackwardWeights, BM, Async))
    conv_backward_weights_tc_kernel(ConvGeom g, NhwcView<const T> in, NormalizedInput norm, NhwcView<const T> grad_out,
                                    float* grad_weights, float* partials, int splits, bool vec_grad, bool vec_in) {
  const int m0 = int(blockIdx.x) * BM, n0 = int(blockIdx.y) * BN, split = int(blockIdx.z);
  const int pixels = g.n * g.oh * g.ow, cols = g.k * g.k * g.c_in;
  const KRange k = split_range(pixels, splits, split, Tc<T>::BK);
  MatrixLoader<T, false, BM> la(grad_out.data, grad_out.stride, g.c_out, pixels, m0, k.k_begin);
  BackwardWeightsInput<T, BN> lb(g, in, norm, n0, k.k_begin);
  float acc[WarpTile<BM, BN>::MI][WarpTile<BM, BN>::NI][4];
  run_mainloop<T, false, false, BM, BN, Async>(la, lb, k, vec_grad, vec_in, acc);
  float* dst = splits > 1 ? partials + size_t(block_index_anew().z) * g.c_out * cols : grad_weights;  // dW [c_out][KK]
  write_tile<BM, BN>(acc, TileRows<float>{dst, cols, g.c_out, cols});
}

// ---- host side -----------------------------------------------------------------------------------

template <typename V>
bool vec_view(const V& v, int elems) {
  return v.c % elems == 0 && v.stride % elems == 0 && reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
}
bool vec_pointer(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A normalized input (conv.h) needs the tensor-core loaders: not the small-channel kernels.
void check_normalized_input(const char* op, const Conv2dShape& s, NormalizedInput norm) {
  if (!norm) return;
  if (small_c::takes(s))
    throw Error(std::string(op) + ": a BatchNorm-normalized input needs more than " + std::to_string(s.c_in) +
                " input channels (the small-channel kernels read the input as it is)");
  if (!vec_pointer(norm.table)) throw Error(std::string(op) + ": the normalized input's table is not 16-byte aligned");
}

template <typename V>
void check_view_shape(const char* op, const char* name, const V& v, int n, int h, int w, int c) {
  check_view_arg(v, op, name);
  if (v.n != n || v.h != h || v.w != w || v.c != c)
    throw Error(std::string(op) + ": " + name + " is " + view_dims(v) + ", expected " + std::to_string(n) + "x" +
                std::to_string(h) + "x" + std::to_string(w) + "x" + std::to_string(c));
}

template <typename T, bool AK, bool BKm, int BM, int BN, bool Async>
size_t smem_bytes() {
  return launch_smem_bytes<T, AK, BKm, BM, BN, Async>();
}

size_t partials_bytes(const TcPlan& plan, long long rows, long long cols) {
  return plan.splits > 1 ? (size_t(plan.splits) * size_t(rows) * size_t(cols) * sizeof(float) + 255) / 256 * 256 : 0;
}

void check_workspace_tc(const char* op, size_t need, const void* workspace, size_t bytes) {
  if (need == 0) return;
  if (workspace == nullptr || bytes < need)
    throw Error(std::string(op) + ": needs " + std::to_string(need) + " bytes of workspace, got " +
                std::to_string(workspace ? bytes : 0));
  if (!vec_pointer(workspace)) throw Error(std::string(op) + ": workspace is not 16-byte aligned");
}

// Split-K slices at most: the weight gradient reduces over every pixel of the batch (2.8 M at
// 416x416, batch 16, with 32 x 27 outputs on the first layer), so it may need many slices to
// fill the GPU; the others reduce over k * k * channels.
constexpr int kMaxSplits = 64, kMaxWeightSplits = 1024;

template <typename T>
TcProblem problem_of(const Conv2dShape& s, TcPass pass) {
  return conv2d_tc_problem(s, pass, tc_precision<T>());
}

template <typename T>
TcPlan plan_of(const Conv2dShape& s, TcPass pass) {
  return choose_plan(problem_of<T>(s, pass), current_gpu());
}
template <typename T>
TcPlan forward_plan(const Conv2dShape& s) {
  return plan_of<T>(s, TcPass::Forward);
}
template <typename T>
TcPlan backward_data_plan(const Conv2dShape& s) {
  return plan_of<T>(s, TcPass::BackwardData);
}
template <typename T>
TcPlan backward_weights_plan(const Conv2dShape& s) {
  return plan_of<T>(s, TcPass::BackwardWeights);
}

// Where the planner chose wgmma but the views rule it out (a pixel stride or a pointer its 16-byte
// copies and TMA cannot take; the planner sees shapes only): mma.sync, 128x128, no split, so that
// the workspace sized for the wgmma plan and the moments' blocks (one per 128 pixels) still hold.
TcPlan mma_instead_of_wgmma() {
  TcPlan plan;
  plan.tile = 0, plan.splits = 1, plan.async = true;  // cp.async where the views allow it (checked at launch)
  return plan;
}

// The weight gradient's partial sums (split-K slices, the wgmma kernel's pixel splits, or the
// small-channel kernel's pixel slices).
template <typename T>
size_t weights_partials_bytes(const Conv2dShape& s) {
  if (small_c::takes(s)) return small_c::weights_workspace_bytes(s);
  const TcPlan plan = backward_weights_plan<T>(s);
  if (plan.wgmma) return (conv2d_backward_weights_wgmma_workspace_bytes(s) + 255) / 256 * 256;
  return partials_bytes(plan, s.c_out, (long long)s.k * s.k * s.c_in);
}

template <typename T>
size_t forward_workspace(const Conv2dShape& s) {
  if (s.n == 0 || small_c::takes(s)) return 0;
  return partials_bytes(forward_plan<T>(s), (long long)s.n * s.out_h() * s.out_w(), s.c_out);
}

}  // namespace

bool conv2d_tc_small_channels(const Conv2dShape& s) { return small_c::takes(s); }

// Shapes only: `vec` is whether the channel counts allow 16-byte chunks; a view or pointer that is
// not aligned only turns cp.async off at launch (workspace sizes must not depend on pointers).
TcProblem conv2d_tc_problem(const Conv2dShape& s, TcPass pass, Precision precision) {
  if (precision == Precision::Fp32) throw Error("conv2d_tc_problem: fp32 convolutions do not run on tensor cores");
  TcProblem p;
  p.pass = pass;
  p.precision = precision;
  p.elem = precision == Precision::Tf32 ? 4 : 2;
  const int V = 16 / p.elem;
  const long long pixels = (long long)s.n * s.out_h() * s.out_w(), taps = (long long)s.k * s.k;
  switch (pass) {
    case TcPass::Forward:
      p.m = pixels, p.n = s.c_out, p.k = taps * s.c_in, p.max_splits = kMaxSplits;
      p.vec = s.c_in % V == 0, p.a_kmajor = true, p.b_kmajor = true;
      p.wgmma_shape = conv2d_forward_wgmma_takes(s);
      break;
    case TcPass::BackwardData: {
      const int S = s.stride, classes = S * S;
      p.m = (long long)s.n * ((s.h + S - 1) / S) * ((s.w + S - 1) / S), p.n = s.c_in;
      p.k = taps * s.c_out / classes + 1, p.groups = classes, p.max_splits = std::min(kMaxSplits, 65535 / classes);
      p.vec = s.c_out % V == 0 && s.c_in % V == 0, p.a_kmajor = true, p.b_kmajor = false;
      p.wgmma_shape = conv2d_backward_data_wgmma_takes(s), p.weight_elements = (long long)s.weight_count();
      break;
    }
    case TcPass::BackwardWeights:
      p.m = s.c_out, p.n = taps * s.c_in, p.k = pixels, p.max_splits = kMaxWeightSplits;
      p.vec = s.c_out % V == 0 && s.c_in % V == 0, p.a_kmajor = false, p.b_kmajor = false;
      p.wgmma_shape = conv2d_backward_weights_wgmma_takes(s);
      break;
    case TcPass::Gemm: throw Error("conv2d_tc_problem: a convolution has no gemm pass");
  }
  return p;
}

template <typename T>
size_t conv2d_forward_tc_workspace_bytes(const Conv2dShape& s) {
  s.validate();
  return forward_workspace<T>(s);
}

template <typename T>
int conv2d_forward_tc_moment_blocks(const Conv2dShape& s) {
  s.validate();
  if (small_c::takes(s)) return small_c::forward_moment_blocks(s);
  const long long pixels = (long long)s.n * s.out_h() * s.out_w();
  const TcPlan plan = forward_plan<T>(s);
  return plan.splits > 1 ? moments::split_moment_blocks(pixels) : int(ceil_div(pixels, plan.bm()));
}

template <typename T>
void conv2d_forward_tc(const Conv2dShape& s, NhwcView<const T> in, const T* weights, const float* bias, NhwcView<T> out,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream, ConvMoments moments,
                       NormalizedInput norm) {
  const char* op = "conv2d_forward_tc";
  s.validate();
  require_precision(tc_precision<T>(), op);
  check_view_shape(op, "in", in, s.n, s.h, s.w, s.c_in);
  check_view_shape(op, "out", out, s.n, s.out_h(), s.out_w(), s.c_out);
  if (weights == nullptr) throw Error(std::string(op) + ": weights is null");
  check_normalized_input(op, s, norm);
  if (s.n == 0) return;
  if (small_c::takes(s)) return small_c::forward<T>(s, in, weights, bias, out, moments, stream);
  constexpr int V = Tc<T>::V;
  const bool vec_in = vec_view(in, V), vec_w = (s.k * s.k * s.c_in) % V == 0 && vec_pointer(weights);
  TcPlan plan = forward_plan<T>(s);
  if (plan.wgmma) {  // every precision (TF32 too: both operands K-major); the weights by a swizzled map
    if (vec_in && vec_w && tma::swizzled_base_fits(weights))
      return conv2d_forward_wgmma<T>(s, in, weights, bias, out, stream, moments, norm);
    plan = mma_instead_of_wgmma();
  }
  plan.async = plan.async && vec_in && vec_w && !norm;  // cp.async lands in shared memory untransformed
  check_workspace_tc(op, forward_workspace<T>(s), workspace, workspace_bytes);
  const ConvGeom g = geometry(s);
  const long long pixels = (long long)s.n * g.oh * g.ow;
  float* partials = static_cast<float*>(workspace);
  with_plan(plan, [&]<int BM, int BN, bool Async>() {
    auto kernel = conv_forward_tc_kernel<T, BM, BN, Async>;
    const size_t smem = smem_bytes<T, true, true, BM, BN, Async>();
    if (smem < moments::kScratchFloats * sizeof(float))  // the moments reuse the stages' shared memory
      throw Error(std::string(op) + ": internal error: too little shared memory for the epilogue's statistics");
    allow_shared(kernel, smem);
    LAUNCH(kernel, dim3(ceil_div(pixels, BM), ceil_div(s.c_out, BN), unsigned(plan.splits)), dim3(kThreads), smem,
           stream, g, in, norm, weights, bias, out, partials, plan.splits, vec_in, vec_w, moments);
  });
  if (plan.splits > 1 && moments.partials)
    moments::launch_sum_splits_moments<T>(partials, plan.splits, int(pixels), s.c_out, out.data, out.stride, bias,
                                          moments.partials, moments.counts, stream);
  else if (plan.splits > 1)
    launch_sum_splits_tc(partials, plan.splits, int(pixels), s.c_out, out.data, out.stride, false, bias, stream);
}

template <typename T>
size_t conv2d_backward_data_tc_workspace_bytes(const Conv2dShape& s) {
  s.validate();
  if (s.n == 0) return 0;
  const TcPlan plan = backward_data_plan<T>(s);
  // wgmma: no split; in TF32 its copy of the weights transposed (mma_instead_of_wgmma needs none).
  if (plan.wgmma) return conv2d_backward_data_wgmma_workspace_bytes<T>(s);
  return partials_bytes(plan, (long long)s.n * s.h * s.w, s.c_in);
}

template <typename T>
void conv2d_backward_data_tc(const Conv2dShape& s, NhwcView<const T> grad_out, const T* weights, NhwcView<T> grad_in,
                             bool accumulate, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* op = "conv2d_backward_data_tc";
  s.validate();
  require_precision(tc_precision<T>(), op);
  check_view_shape(op, "grad_out", grad_out, s.n, s.out_h(), s.out_w(), s.c_out);
  check_view_shape(op, "grad_in", grad_in, s.n, s.h, s.w, s.c_in);
  if (weights == nullptr) throw Error(std::string(op) + ": weights is null");
  if (s.n == 0) return;
  constexpr int V = Tc<T>::V;
  const bool vec_grad = vec_view(grad_out, V), vec_w = s.c_in % V == 0 && vec_pointer(weights);
  TcPlan plan = backward_data_plan<T>(s);
  if (plan.wgmma) {  // the weights (TF32: their transposed copy in the workspace) by a swizzled map
    if (vec_grad && vec_w && tma::swizzled_base_fits(sizeof(T) == 4 ? workspace : static_cast<const void*>(weights)))
      return conv2d_backward_data_wgmma<T>(s, grad_out, weights, grad_in, accumulate, stream, workspace,
                                           workspace_bytes);
    plan = mma_instead_of_wgmma();
  }
  plan.async = plan.async && vec_grad && vec_w;
  check_workspace_tc(op, conv2d_backward_data_tc_workspace_bytes<T>(s), workspace, workspace_bytes);
  const ConvGeom g = geometry(s);
  const int S = s.stride;
  float* partials = static_cast<float*>(workspace);
  const long long class_rows = (long long)s.n * ((s.h + S - 1) / S) * ((s.w + S - 1) / S);  // class (0, 0): the largest
  with_plan(plan, [&]<int BM, int BN, bool Async>() {
    auto kernel = conv_backward_data_tc_kernel<T, BM, BN, Async>;
    const size_t smem = smem_bytes<T, true, false, BM, BN, Async>();
    allow_shared(kernel, smem);
    LAUNCH(kernel, dim3(ceil_div(class_rows, BM), ceil_div(s.c_in, BN), unsigned(S * S * plan.splits)),
           dim3(kThreads), smem, stream, g, grad_out, weights, grad_in, accumulate, partials, plan.splits, vec_grad,
           vec_w);
  });
  if (plan.splits > 1)
    launch_sum_splits_tc(partials, plan.splits, s.n * s.h * s.w, s.c_in, grad_in.data, grad_in.stride, accumulate,
                         static_cast<const float*>(nullptr), stream);
}

template <typename T>
size_t conv2d_backward_weights_tc_workspace_bytes(const Conv2dShape& s) {
  s.validate();
  return weights_partials_bytes<T>(s) + bias_partials_bytes(s);
}

template <typename T>
void conv2d_backward_weights_tc(const Conv2dShape& s, NhwcView<const T> in, NhwcView<const T> grad_out,
                                float* grad_weights, float* grad_bias, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream, NormalizedInput norm) {
  const char* op = "conv2d_backward_weights_tc";
  s.validate();
  require_precision(tc_precision<T>(), op);
  check_view_shape(op, "in", in, s.n, s.h, s.w, s.c_in);
  check_view_shape(op, "grad_out", grad_out, s.n, s.out_h(), s.out_w(), s.c_out);
  if (grad_weights == nullptr) throw Error(std::string(op) + ": grad_weights is null");
  check_normalized_input(op, s, norm);
  check_workspace_tc(op, conv2d_backward_weights_tc_workspace_bytes<T>(s), workspace, workspace_bytes);
  float* bias_partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + weights_partials_bytes<T>(s));
  if (small_c::takes(s)) {
    small_c::backward_weights<T>(s, in, grad_out, grad_weights, workspace, stream);
    if (grad_bias) launch_bias_gradient(s, grad_out, grad_bias, bias_partials, stream);
    return;
  }
  constexpr int V = Tc<T>::V;
  const bool vec_grad = vec_view(grad_out, V), vec_in = vec_view(in, V);
  TcPlan plan = backward_weights_plan<T>(s);
  if (plan.wgmma) {
    if constexpr (sizeof(T) == 2)
      // TMA reads grad_out as one dense matrix, by a swizzled map
      if (vec_grad && vec_in && grad_out.stride == s.c_out && tma::swizzled_base_fits(grad_out.data)) {
        conv2d_backward_weights_wgmma<T>(s, in, grad_out, grad_weights, workspace, weights_partials_bytes<T>(s), stream,
                                         norm);
        if (grad_bias) launch_bias_gradient(s, grad_out, grad_bias, bias_partials, stream);
        return;
      }
    plan = mma_instead_of_wgmma();
  }
  plan.async = plan.async && vec_grad && vec_in && !norm;  // cp.async lands in shared memory untransformed
  const ConvGeom g = geometry(s);
  const int cols = s.k * s.k * s.c_in;
  float* partials = static_cast<float*>(workspace);
  with_plan(plan, [&]<int BM, int BN, bool Async>() {
    auto kernel = conv_backward_weights_tc_kernel<T, BM, BN, Async>;
    const size_t smem = smem_bytes<T, false, false, BM, BN, Async>();
    allow_shared(kernel, smem);
    LAUNCH(kernel, dim3(ceil_div(s.c_out, BM), ceil_div(cols, BN), unsigned(plan.splits)), dim3(kThreads), smem,
           stream, g, in, norm, grad_out, grad_weights, partials, plan.splits, vec_grad, vec_in);
  });
  if (plan.splits > 1)
    launch_sum_splits_tc(partials, plan.splits, s.c_out, cols, grad_weights, cols, false,
                         static_cast<const float*>(nullptr), stream);
  if (grad_bias) launch_bias_gradient(s, grad_out, grad_bias, bias_partials, stream);
}

#define YOLO_CONV_TC(T)                                                                                               \
  template size_t conv2d_forward_tc_workspace_bytes<T>(const Conv2dShape&);                                           \
  template int conv2d_forward_tc_moment_blocks<T>(const Conv2dShape&);                                                \
  template void conv2d_forward_tc<T>(const Conv2dShape&, NhwcView<const T>, const T*, const float*, NhwcView<T>,      \
                                     void*, size_t, cudaStream_t, ConvMoments, NormalizedInput);                      \
  template size_t conv2d_backward_data_tc_workspace_bytes<T>(const Conv2dShape&);                                     \
  template void conv2d_backward_data_tc<T>(const Conv2dShape&, NhwcView<const T>, const T*, NhwcView<T>, bool, void*, \
                                           size_t, cudaStream_t);                                                     \
  template size_t conv2d_backward_weights_tc_workspace_bytes<T>(const Conv2dShape&);                                  \
  template void conv2d_backward_weights_tc<T>(const Conv2dShape&, NhwcView<const T>, NhwcView<const T>, float*,       \
                                              float*, void*, size_t, cudaStream_t, NormalizedInput);
YOLO_CONV_TC(float)
YOLO_CONV_TC(Bf16)
YOLO_CONV_TC(Fp16)
#undef YOLO_CONV_TC

}  // namespace yolo
