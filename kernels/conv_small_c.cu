// Convolutions over inputs of a few channels on CUDA cores (kernels/conv_small_c.h): the forward
// and the weight gradient that conv2d_forward_tc / conv2d_backward_weights_tc send here.
#include "kernels/conv_small_c.h"

#include <algorithm>
#include <cstdint>

#include "kernels/channel_moments.cuh"
#include "kernels/conv_geometry.cuh"
#include "kernels/gemm_tiles.cuh"
#include "kernels/half_types.h"
#include "kernels/tc_plan.h"

namespace yolo::small_c {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxField = 36;               // k * k * c_in, in registers
constexpr int kChunk = 128;                 // pixels the weight gradient stages in shared memory at a time
constexpr int kCoBlock = 8, kTapBlock = 4;  // a thread's channels at a time; a gradient role's taps

int field_size(const Conv2dShape& s) { return s.k * s.k * s.c_in; }
int padded_field(int field) { return (field + 3) / 4 * 4; }  // rows of whole float4s
int gradient_roles(const Conv2dShape& s) {
  return int(ceil_div(size_t(s.c_out), kCoBlock) * ceil_div(size_t(field_size(s)), kTapBlock));
}

// The receptive field of output pixel p in (r, s, ci) order, as KRSC weights are; zeros outside
// the image and past the field (compile-time indices: the array stays in registers).
template <typename T>
__device__ __forceinline__ void load_field(const ConvGeom& g, NhwcView<const T> in, long long p,
                                           float (&field)[kMaxField]) {
  const int field_n = g.k * g.k * g.c_in;
  const int ox = int(p % g.ow), oy = int(p / g.ow % g.oh), b = int(p / g.ow / g.oh);
  int r = 0, c = 0, ci = 0;
#pragma unroll
  for (int j = 0; j < kMaxField; ++j) {
    float v = 0.0f;
    if (j < field_n) {
      const int iy = oy * g.stride - g.pad + r, ix = ox * g.stride - g.pad + c;
      if (unsigned(iy) < unsigned(g.h) && unsigned(ix) < unsigned(g.w))
        v = to_float(in.data[(size_t(b * g.h + iy) * g.w + ix) * in.stride + ci]);
      if (++ci == g.c_in) {
        ci = 0;
        if (++c == g.k) c = 0, ++r;
      }
    }
    field[j] = v;
  }
}

// `count` (up to 8) consecutive channels of one pixel: one 16-byte store of 16-bit values, or two
// of FP32, where whole and aligned.
template <typename T>
__device__ __forceinline__ void store_channels(T* dst, const float (&v)[kCoBlock], int count) {
  if (count == kCoBlock && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    if constexpr (sizeof(T) == 2) {
      auto pair = [&](int i) { return uint32_t(from_float<T>(v[i]).bits) | uint32_t(from_float<T>(v[i + 1]).bits) << 16; };
      *reinterpret_cast<uint4*>(dst) = make_uint4(pair(0), pair(2), pair(4), pair(6));
    } else {
      reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < kCoBlock; ++c)
    if (c < count) dst[c] = from_float<T>(v[c]);
}

// ---- forward ---------------------------------------------------------------------------------------

// One output pixel per thread, all its channels, 8 at a time; the weights in shared memory as
// FP32 rows of whole float4s (every thread reads the same words: broadcasts). Then the block's
// BatchNorm moments from what it stored, as the tensor-core forward computes them.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    forward_kernel(ConvGeom g, NhwcView<const T> in, const T* weights, const float* bias, NhwcView<T> out,
                   ConvMoments moments) {
  DYNAMIC_SHARED(float, shared);  // weights [c_out][pitch], then the moments' scratch
  const int field_n = g.k * g.k * g.c_in, pitch = (field_n + 3) / 4 * 4;
  for (int i = int(threadIdx.x); i < g.c_out * pitch; i += kThreads)
    shared[i] = i % pitch < field_n ? to_float(weights[i / pitch * field_n + i % pitch]) : 0.0f;
  __syncthreads();
  const long long pixels = (long long)g.n * g.oh * g.ow, p0 = (long long)blockIdx.x * kPixels;
  const long long p = p0 + threadIdx.x;
  if (p < pixels) {
    float field[kMaxField];
    load_field(g, in, p, field);
    T* dst = out.data + size_t(p) * out.stride;
    for (int co0 = 0; co0 < g.c_out; co0 += kCoBlock) {
      const int count = min(kCoBlock, g.c_out - co0);
      float acc[kCoBlock];
#pragma unroll
      for (int c = 0; c < kCoBlock; ++c) acc[c] = bias && c < count ? bias[co0 + c] : 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxField; j += 4) {
        if (j >= pitch) break;
#pragma unroll
        for (int c = 0; c < kCoBlock; ++c) {
          if (c >= count) break;
          const float4 w = *reinterpret_cast<const float4*>(shared + (co0 + c) * pitch + j);
          acc[c] = __fmaf_rn(field[j], w.x, acc[c]);
          acc[c] = __fmaf_rn(field[j + 1], w.y, acc[c]);
          acc[c] = __fmaf_rn(field[j + 2], w.z, acc[c]);
          acc[c] = __fmaf_rn(field[j + 3], w.w, acc[c]);
        }
      }
      store_channels(dst + co0, acc, count);
    }
  }
  if (moments.partials) {
    __syncthreads();  // the block's stores are visible to it
    moments::tile_moments<T>(out.data, out.stride, int(p0), int(min(pixels - p0, (long long)kPixels)), 0, g.c_out,
                             g.c_out, int(blockIdx.x), shared + g.c_out * pitch, moments.partials, moments.counts);
  }
}

// ---- weight gradient ------------------------------------------------------------------------------

// Slices of the pixels: a pure function of the shape and the device's SMs (the workspace and
// the summing order follow it).
int slices(const Conv2dShape& s) {
  const long long chunks = (long long)ceil_div(size_t(s.n) * s.out_h() * s.out_w(), kChunk);
  return int(std::max<long long>(1, std::min<long long>(chunks, 4LL * tc::current_gpu().sms)));
}

// A block sums one slice of pixels, kChunk at a time: their gradients and fields staged in shared
// memory as FP32, rows padded with zeros to whole float4s (8 channels, 4 taps) so each thread
// reads them 16 bytes at a time. Its threads are roles x groups: a role is one block of 8 output
// channels x 4 taps (32 sums in registers), a group every groups-th pixel of the chunk. At the end
// the groups' sums meet in shared memory in a fixed order: the slice's partial [c_out][field].
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    weights_kernel(ConvGeom g, NhwcView<const T> in, NhwcView<const T> grad_out, int slice_count, float* partials) {
  DYNAMIC_SHARED(float, shared);
  const int field_n = g.k * g.k * g.c_in, tap_blocks = (field_n + kTapBlock - 1) / kTapBlock;
  const int grad_pitch = (g.c_out + kCoBlock - 1) / kCoBlock * kCoBlock, field_pitch = tap_blocks * kTapBlock;
  const int roles = grad_pitch / kCoBlock * tap_blocks, groups = kThreads / roles;
  float* s_grad = shared;                           // [kChunk][grad_pitch]
  float* s_field = shared + kChunk * grad_pitch;    // [kChunk][field_pitch]
  const int t = int(threadIdx.x), role = t % roles, group = t / roles;
  const int co0 = role / tap_blocks * kCoBlock, j0 = role % tap_blocks * kTapBlock;
  float acc[kCoBlock][kTapBlock] = {};
  const long long pixels = (long long)g.n * g.oh * g.ow;
  const long long per_slice = ((pixels + slice_count - 1) / slice_count + kChunk - 1) / kChunk * kChunk;
  const long long begin = per_slice * blockIdx.x, end = min(pixels, begin + per_slice);
  for (long long c0 = begin; c0 < end; c0 += kChunk) {
    const int n = int(min(end - c0, (long long)kChunk));
    __syncthreads();  // nobody reads the previous chunk any more
    for (int i = t; i < n * grad_pitch; i += kThreads) {
      const int q = i / grad_pitch, co = i % grad_pitch;
      s_grad[i] = co < g.c_out ? to_float(grad_out.data[size_t(c0 + q) * grad_out.stride + co]) : 0.0f;
    }
    for (int q = t; q < n; q += kThreads) {
      float field[kMaxField];
      load_field(g, in, c0 + q, field);  // zeros past the field: the row's pad
#pragma unroll
      for (int j = 0; j < kMaxField; ++j)
        if (j < field_pitch) s_field[q * field_pitch + j] = field[j];
    }
    __syncthreads();
    if (group >= groups) continue;
    for (int q = group; q < n; q += groups) {
      const float4 g0 = *reinterpret_cast<const float4*>(s_grad + q * grad_pitch + co0);
      const float4 g1 = *reinterpret_cast<const float4*>(s_grad + q * grad_pitch + co0 + 4);
      const float4 f = *reinterpret_cast<const float4*>(s_field + q * field_pitch + j0);
      const float gv[kCoBlock] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w}, fv[kTapBlock] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int c = 0; c < kCoBlock; ++c)
#pragma unroll
        for (int j = 0; j < kTapBlock; ++j) acc[c][j] = __fmaf_rn(gv[c], fv[j], acc[c][j]);
    }
  }
  __syncthreads();
  float* s_sum = shared;  // [c_out][field_n]: group 0's sums first, then each group's in turn
  for (int i = t; i < g.c_out * field_n; i += kThreads) s_sum[i] = 0.0f;
  __syncthreads();
  for (int turn = 0; turn < groups; ++turn) {
    if (group == turn)
#pragma unroll
      for (int c = 0; c < kCoBlock; ++c)
#pragma unroll
        for (int j = 0; j < kTapBlock; ++j)
          if (co0 + c < g.c_out && j0 + j < field_n) s_sum[(co0 + c) * field_n + j0 + j] += acc[c][j];
    __syncthreads();
  }
  for (int i = t; i < g.c_out * field_n; i += kThreads)
    partials[size_t(blockIdx.x) * g.c_out * field_n + i] = s_sum[i];
}

size_t forward_shared_bytes(const Conv2dShape& s) {
  return (size_t(s.c_out) * padded_field(field_size(s)) + moments::kScratchFloats) * sizeof(float);
}
size_t weights_shared_bytes(const Conv2dShape& s) {
  const size_t grad_pitch = ceil_div(size_t(s.c_out), kCoBlock) * kCoBlock, field_pitch = padded_field(field_size(s));
  return size_t(kChunk) * (grad_pitch + field_pitch) * sizeof(float);
}

}  // namespace

bool takes(const Conv2dShape& s) {
  constexpr size_t kShared = 48 * 1024;  // no opt-in needed
  return s.c_in <= 4 && field_size(s) <= kMaxField && gradient_roles(s) <= kThreads &&
         forward_shared_bytes(s) <= kShared && weights_shared_bytes(s) <= kShared;
}

int forward_moment_blocks(const Conv2dShape& s) { return int(ceil_div(size_t(s.n) * s.out_h() * s.out_w(), kPixels)); }

template <typename T>
void forward(const Conv2dShape& s, NhwcView<const T> in, const T* weights, const float* bias, NhwcView<T> out,
             ConvMoments moments, cudaStream_t stream) {
  const size_t pixels = size_t(s.n) * s.out_h() * s.out_w();
  if (pixels == 0) return;
  LAUNCH(forward_kernel<T>, dim3(ceil_div(pixels, kPixels)), dim3(kThreads), forward_shared_bytes(s), stream,
         geometry(s), in, weights, bias, out, moments);
}

size_t weights_workspace_bytes(const Conv2dShape& s) {
  return (size_t(slices(s)) * s.c_out * field_size(s) * sizeof(float) + 255) / 256 * 256;
}

template <typename T>
void backward_weights(const Conv2dShape& s, NhwcView<const T> in, NhwcView<const T> grad_out, float* grad_weights,
                      void* workspace, cudaStream_t stream) {
  const int outputs = s.c_out * field_size(s), slice_count = slices(s);
  float* partials = static_cast<float*>(workspace);
  LAUNCH(weights_kernel<T>, dim3(unsigned(slice_count)), dim3(kThreads), weights_shared_bytes(s), stream,
         geometry(s), in, grad_out, slice_count, partials);
  // dW = the slices' partials summed in slice order (the split reductions' second pass).
  tiled::launch_sum_splits(partials, slice_count, 1, outputs, grad_weights, outputs, false, nullptr, stream);
}

#define YOLO_SMALL_C(T)                                                                                           \
  template void forward<T>(const Conv2dShape&, NhwcView<const T>, const T*, const float*, NhwcView<T>, ConvMoments, \
                           cudaStream_t);                                                                          \
  template void backward_weights<T>(const Conv2dShape&, NhwcView<const T>, NhwcView<const T>, float*, void*,        \
                                    cudaStream_t);
YOLO_SMALL_C(float)
YOLO_SMALL_C(Bf16)
YOLO_SMALL_C(Fp16)
#undef YOLO_SMALL_C

}  // namespace yolo::small_c
