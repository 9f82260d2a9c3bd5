// The optimizer step and gradient helpers: reference, fast CPU versions and CUDA kernels (see
// sgd.h). All elementwise: results do not depend on the launch or thread layout.
#include "kernels/sgd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"

namespace yolo {
namespace {

void check_buffers(const char* op, size_t count, std::initializer_list<const void*> pointers) {
  if (count == 0) return;
  for (const void* p : pointers)
    if (!p) throw Error(std::string(op) + ": a buffer is a null pointer");
}

constexpr size_t kCpuChunk = size_t(1) << 16;  // elements per CPU work item (fixed: thread-count independent)

// Exponent all ones (NaN or infinite), tested on the bits in fixed-width blocks: the compiler
// vectorises this at -O2, where it does not vectorise a loop over std::isfinite.
bool any_nonfinite(const float* g, size_t first, size_t stop) {
  constexpr int kLanes = 16;
  uint32_t lanes[kLanes] = {};
  size_t i = first;
  for (; i + kLanes <= stop; i += kLanes) {
    uint32_t bits[kLanes];
    std::memcpy(bits, g + i, sizeof bits);
    for (int k = 0; k < kLanes; ++k) lanes[k] |= (~bits[k] & 0x7f800000u) == 0u;
  }
  uint32_t any = 0;
  for (int k = 0; k < kLanes; ++k) any |= lanes[k];
  for (; i < stop; ++i) {
    uint32_t bits;
    std::memcpy(&bits, g + i, sizeof bits);
    any |= (~bits & 0x7f800000u) == 0u;
  }
  return any != 0;
}

// ---- CUDA -------------------------------------------------------------------------------
constexpr int kThreads = 256, kItems = 8;  // a block updates kThreads * kItems consecutive elements

// Each block finds the segment holding its first element once (binary search by thread 0);
// each thread's elements then only move forward through the table. Loads first, for
// independent memory requests in flight.
// H: the 16-bit copy's type (copy may be null: no copy).
template <typename H>
__global__ void sgd_update_kernel(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count,
                                  size_t begin, size_t end, SgdHyper hyper, H* copy) {
  if (hyper.live) {  // the same value for every thread: the whole block returns, or none does
    if (hyper.live->nonfinite) return;
    hyper.learning_rate = hyper.live->learning_rate;
    hyper.grad_scale = hyper.live->grad_scale;
  }
  if (hyper.loss_scale) hyper.grad_scale /= *hyper.loss_scale;
  __shared__ int first_segment;
  size_t chunk = begin + size_t(blockIdx.x) * kThreads * kItems;
  if (threadIdx.x == 0) {
    int lo = 0, hi = segment_count - 1;  // the last segment starting at or before chunk
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (segments[mid].offset <= chunk) lo = mid;
      else hi = mid - 1;
    }
    first_segment = lo;
  }
  __syncthreads();
  float wv[kItems] = {}, gv[kItems] = {}, uv[kItems] = {};
  for (int j = 0; j < kItems; ++j) {
    size_t i = chunk + size_t(j) * kThreads + threadIdx.x;
    if (i < end) wv[j] = w[i], gv[j] = g[i], uv[j] = u[i];
  }
  int s = first_segment;
  size_t segment_end = segments[s].offset + segments[s].count;
  bool decay = segments[s].decay, copied = segments[s].copy16;
  for (int j = 0; j < kItems; ++j) {
    size_t i = chunk + size_t(j) * kThreads + threadIdx.x;
    if (i >= end) break;
    while (i >= segment_end && s + 1 < segment_count) {
      ++s;
      segment_end = segments[s].offset + segments[s].count;
      decay = segments[s].decay, copied = segments[s].copy16;
    }
    float step = hyper.momentum * uv[j] + gv[j] * hyper.grad_scale;
    if (decay) step += hyper.decay * wv[j];
    u[i] = step;
    const float updated = wv[j] - hyper.learning_rate * step;
    w[i] = updated;
    if (copy && copied) copy[i] = from_float<H>(updated);
  }
}

// Elements [0, head) and the last `tail` are done one by one; the 16-byte-aligned middle as
// float4 packs.
struct Split {
  size_t head, packs, tail;
};
Split split_aligned(const float* p, size_t count) {
  size_t misalign = (reinterpret_cast<uintptr_t>(p) % 16) / sizeof(float);
  size_t head = misalign ? 4 - misalign : 0;
  if (head > count) head = count;
  return {head, (count - head) / 4, (count - head) % 4};
}

__device__ __forceinline__ bool nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

__global__ void nonfinite_kernel(const float* g, Split split, int* flag) {
  size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x, threads = size_t(gridDim.x) * blockDim.x;
  const float4* packs = reinterpret_cast<const float4*>(g + split.head);
  bool bad = false;
  for (size_t p = t; p < split.packs; p += threads) {
    float4 v = packs[p];
    bad = bad || nonfinite(v.x) || nonfinite(v.y) || nonfinite(v.z) || nonfinite(v.w);
  }
  if (t < split.head) bad = bad || nonfinite(g[t]);
  if (t < split.tail) bad = bad || nonfinite(g[split.head + 4 * split.packs + t]);
  if (bad) atomicExch(flag, 1);
}

__global__ void scale_kernel(float* g, Split split, float s) {
  size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x, threads = size_t(gridDim.x) * blockDim.x;
  float4* packs = reinterpret_cast<float4*>(g + split.head);
  for (size_t p = t; p < split.packs; p += threads) {
    float4 v = packs[p];
    packs[p] = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
  }
  if (t < split.head) g[t] *= s;
  if (t < split.tail) g[split.head + 4 * split.packs + t] *= s;
}

unsigned grid_for(const Split& split) {
  size_t threads = split.packs > 4 ? split.packs : 4, blocks = (threads + 255) / 256;
  return unsigned(blocks < 4096 ? blocks : 4096);
}

}  // namespace

void sgd_check_segments(const SgdSegment* segments, int segment_count, size_t begin, size_t end) {
  if (end < begin)
    throw Error("sgd_update: end " + std::to_string(end) + " is before begin " + std::to_string(begin));
  if (begin == end && segment_count == 0) return;
  if (segment_count < 1 || !segments)
    throw Error("sgd_update: [" + std::to_string(begin) + ", " + std::to_string(end) + ") has no segment table");
  size_t next = begin;
  for (int i = 0; i < segment_count; ++i) {
    if (segments[i].offset != next)
      throw Error("sgd_update: segment " + std::to_string(i) + " starts at " + std::to_string(segments[i].offset) +
                  ", expected " + std::to_string(next) + " (segments must be back to back from begin)");
    next += segments[i].count;
  }
  if (next != end)
    throw Error("sgd_update: the segments end at " + std::to_string(next) + ", not at end " + std::to_string(end));
}

// ---- reference --------------------------------------------------------------------------
template <typename T>
void sgd_update_reference(T* w, const T* g, T* u, const SgdSegment* segments, int segment_count, size_t begin,
                          size_t end, SgdHyper hyper) {
  sgd_check_segments(segments, segment_count, begin, end);
  check_buffers("sgd_update", end - begin, {w, g, u});
  if (hyper.live && hyper.live->nonfinite) return;
  if (hyper.live) hyper.learning_rate = hyper.live->learning_rate, hyper.grad_scale = hyper.live->grad_scale;
  if (hyper.loss_scale) hyper.grad_scale /= *hyper.loss_scale;
  for (int s = 0; s < segment_count; ++s)
    for (size_t i = segments[s].offset; i < segments[s].offset + segments[s].count; ++i) {
      T step = T(hyper.momentum) * u[i] + g[i] * T(hyper.grad_scale);
      if (segments[s].decay) step += T(hyper.decay) * w[i];
      u[i] = step;
      w[i] -= T(hyper.learning_rate) * step;
    }
}

template <typename T>
void grad_nonfinite_check_reference(const T* g, size_t count, int* flag) {
  check_buffers("grad_nonfinite_check", count, {g});
  if (!flag) throw Error("grad_nonfinite_check: flag is a null pointer");
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(g[i])) *flag = 1;
}

template <typename T>
void grad_scale_inplace_reference(T* g, size_t count, T s) {
  check_buffers("grad_scale_inplace", count, {g});
  for (size_t i = 0; i < count; ++i) g[i] *= s;
}

template void sgd_update_reference<float>(float*, const float*, float*, const SgdSegment*, int, size_t, size_t, SgdHyper);
template void sgd_update_reference<double>(double*, const double*, double*, const SgdSegment*, int, size_t, size_t,
                                           SgdHyper);
template void grad_nonfinite_check_reference<float>(const float*, size_t, int*);
template void grad_nonfinite_check_reference<double>(const double*, size_t, int*);
template void grad_scale_inplace_reference<float>(float*, size_t, float);
template void grad_scale_inplace_reference<double>(double*, size_t, double);

// ---- fast CPU ---------------------------------------------------------------------------
void sgd_update_cpu(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                    size_t end, SgdHyper hyper) {
  sgd_check_segments(segments, segment_count, begin, end);
  check_buffers("sgd_update", end - begin, {w, g, u});
  if (hyper.live && hyper.live->nonfinite) return;
  if (hyper.live) hyper.learning_rate = hyper.live->learning_rate, hyper.grad_scale = hyper.live->grad_scale;
  if (hyper.loss_scale) hyper.grad_scale /= *hyper.loss_scale;
  struct Piece {
    size_t first, last;
    bool decay;
  };
  std::vector<Piece> pieces;  // segments cut into work items of at most kCpuChunk elements
  for (int s = 0; s < segment_count; ++s)
    for (size_t first = segments[s].offset, stop = first + segments[s].count; first < stop; first += kCpuChunk)
      pieces.push_back({first, std::min(stop, first + kCpuChunk), segments[s].decay});
  parallel_for(pieces.size(), [&](size_t p) {
    const Piece& piece = pieces[p];
    const float momentum = hyper.momentum, scale = hyper.grad_scale, lr = hyper.learning_rate;
    const float decay = hyper.decay;
    if (piece.decay) {
      for (size_t i = piece.first; i < piece.last; ++i) {
        float step = momentum * u[i] + g[i] * scale;
        step += decay * w[i];
        u[i] = step;
        w[i] -= lr * step;
      }
    } else {
      for (size_t i = piece.first; i < piece.last; ++i) {
        float step = momentum * u[i] + g[i] * scale;
        u[i] = step;
        w[i] -= lr * step;
      }
    }
  });
}

void grad_nonfinite_check_cpu(const float* g, size_t count, int* flag) {
  check_buffers("grad_nonfinite_check", count, {g});
  if (!flag) throw Error("grad_nonfinite_check: flag is a null pointer");
  size_t chunks = (count + kCpuChunk - 1) / kCpuChunk;
  std::vector<char> bad(chunks, 0);
  parallel_for(chunks, [&](size_t c) {
    size_t stop = std::min(count, (c + 1) * kCpuChunk);
    bad[c] = any_nonfinite(g, c * kCpuChunk, stop);
  });
  for (char b : bad)
    if (b) *flag = 1;
}

void grad_scale_inplace_cpu(float* g, size_t count, float s) {
  check_buffers("grad_scale_inplace", count, {g});
  parallel_for((count + kCpuChunk - 1) / kCpuChunk, [&](size_t c) {
    size_t stop = std::min(count, (c + 1) * kCpuChunk);
    for (size_t i = c * kCpuChunk; i < stop; ++i) g[i] *= s;
  });
}

// ---- CUDA launchers ---------------------------------------------------------------------
namespace {

template <typename H>
void sgd_update_launch(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count,
                       size_t begin, size_t end, SgdHyper hyper, H* copy, cudaStream_t stream) {
  if (end < begin)
    throw Error("sgd_update: end " + std::to_string(end) + " is before begin " + std::to_string(begin));
  if (end == begin) return;
  if (segment_count < 1 || !segments)
    throw Error("sgd_update: [" + std::to_string(begin) + ", " + std::to_string(end) + ") has no segment table");
  check_buffers("sgd_update", end - begin, {w, g, u});
  size_t per_block = size_t(kThreads) * kItems, blocks = (end - begin + per_block - 1) / per_block;
  if (blocks > 0x7fffffffu) throw Error("sgd_update: bucket of " + std::to_string(end - begin) + " elements too large");
  LAUNCH(sgd_update_kernel<H>, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, w, g, u, segments, segment_count,
         begin, end, hyper, copy);
}

}  // namespace

void sgd_update_cuda(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                     size_t end, SgdHyper hyper, cudaStream_t stream) {
  sgd_update_launch<Bf16>(w, g, u, segments, segment_count, begin, end, hyper, nullptr, stream);
}
void sgd_update_cuda(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                     size_t end, SgdHyper hyper, Bf16* copy, cudaStream_t stream) {
  if (!copy) throw Error("sgd_update: the bf16 weight copy is a null pointer");
  sgd_update_launch(w, g, u, segments, segment_count, begin, end, hyper, copy, stream);
}
void sgd_update_cuda(float* w, const float* g, float* u, const SgdSegment* segments, int segment_count, size_t begin,
                     size_t end, SgdHyper hyper, Fp16* copy, cudaStream_t stream) {
  if (!copy) throw Error("sgd_update: the fp16 weight copy is a null pointer");
  sgd_update_launch(w, g, u, segments, segment_count, begin, end, hyper, copy, stream);
}

namespace {
__global__ void loss_scale_kernel(const int* nonfinite, LossScaleLive* s, int growth_interval) {
  LossScaleLive v = *s;
  loss_scale_step(*nonfinite != 0, v, growth_interval);
  *s = v;
}
}  // namespace

void loss_scale_update_cuda(const int* nonfinite, LossScaleLive* s, int growth_interval, cudaStream_t stream) {
  if (!nonfinite || !s) throw Error("loss_scale_update: a null pointer");
  if (growth_interval < 1) throw Error("loss_scale_update: the growth interval must be at least 1 step");
  LAUNCH(loss_scale_kernel, dim3(1), dim3(1), 0, stream, nonfinite, s, growth_interval);
}

void grad_nonfinite_check_cuda(const float* g, size_t count, int* flag, cudaStream_t stream) {
  check_buffers("grad_nonfinite_check", count, {g});
  if (!flag) throw Error("grad_nonfinite_check: flag is a null pointer");
  if (count == 0) return;
  Split split = split_aligned(g, count);
  LAUNCH(nonfinite_kernel, dim3(grid_for(split)), dim3(256), 0, stream, g, split, flag);
}

void grad_scale_inplace_cuda(float* g, size_t count, float s, cudaStream_t stream) {
  check_buffers("grad_scale_inplace", count, {g});
  if (count == 0) return;
  Split split = split_aligned(g, count);
  LAUNCH(scale_kernel, dim3(grid_for(split)), dim3(256), 0, stream, g, split, s);
}

}  // namespace yolo
