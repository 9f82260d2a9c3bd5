// NormalizedInput (kernels/conv.h) on the device: BatchNorm's apply on values a convolution's
// loader has just read, with the apply's own expression (exact_math.cuh, normalized_output: one
// subtraction, one FMA, the activation in rounded steps), so that a 16-byte chunk ends up
// holding the bits the apply would have stored. Callers transform only what they read from the
// image: the zeros of the padding and of rows past the end stay zeros.
#pragma once
#include <type_traits>

#include "kernels/conv.h"
#include "kernels/exact_math.cuh"
#include "kernels/half_types.h"

namespace yolo {

__device__ __forceinline__ float normalized_value(const NormalizedInput& n, int ch, float x) {
  const float4 t = *reinterpret_cast<const float4*>(n.table + 4 * ch);  // mean, scale, shift
  switch (n.act) {
    case Activation::Leaky: return normalized_output<Activation::Leaky>(x, t.x, t.y, t.z);
    case Activation::Relu: return normalized_output<Activation::Relu>(x, t.x, t.y, t.z);
    case Activation::Logistic: return normalized_output<Activation::Logistic>(x, t.x, t.y, t.z);
    default: return normalized_output<Activation::Linear>(x, t.x, t.y, t.z);
  }
}

template <typename T>
__device__ __forceinline__ T normalized_element(const NormalizedInput& n, int ch, T x) {
  if constexpr (std::is_same_v<T, float>) return normalized_value(n, ch, x);
  else return from_float<T>(normalized_value(n, ch, to_float(x)));
}

// One 16-byte chunk of T: channels ch0, ch0 + 1, ... (4 floats or 8 16-bit values).
template <typename T>
__device__ __forceinline__ uint4 normalized_chunk(const NormalizedInput& n, int ch0, uint4 r) {
  uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      w[i] = float_bits(normalized_value(n, ch0 + i, bits_float(w[i])));
    } else {
      const T lo = normalized_element(n, ch0 + 2 * i, T{uint16_t(w[i] & 0xffffu)});
      const T hi = normalized_element(n, ch0 + 2 * i + 1, T{uint16_t(w[i] >> 16)});
      w[i] = uint32_t(lo.bits) | uint32_t(hi.bits) << 16;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The wgmma producers' form: the 16-byte chunks a thread copied into shared memory (or TMA
// landed there), once they landed; chunk q (those with bit q of `read` set: from the image, not
// zero-filled) lies at chunk_at(q) and starts at channel channel_of(q). These are generic-proxy
// stores: wgmma may read them only after the thread's fence.proxy.async (the emulation is told
// of each, so a missing fence is caught even where TMA, not cp.async, brought the bytes).
template <typename T, class At, class Channel>
__device__ __forceinline__ void normalize_landed(const NormalizedInput& n, uint32_t read, const At& chunk_at,
                                                 const Channel& channel_of) {
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    if (!(read >> q & 1u)) continue;
    uint4* chunk = chunk_at(q);
    *chunk = normalized_chunk<T>(n, channel_of(q), *chunk);
#if !defined(__CUDACC__)
    yolo::emu::note_generic_shared_write(chunk, sizeof *chunk);
#endif
  }
}

}  // namespace yolo
