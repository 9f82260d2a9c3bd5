// Elements of a storage type (float, Bf16, Fp16) moved as FP32 values: what kernels that
// compute in FP32 on tensors stored in 16 bits use (--precision bf16/fp16 keeps activations and
// their gradients in 16 bits; every op computes in FP32 and rounds once, to nearest even, on
// the way out). V consecutive elements per access: 1, or one 16-byte access (4 floats, 8
// 16-bit values) where the address allows it (vector_view says when a whole view does).
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/half_types.h"

namespace yolo {

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVector = int(16 / sizeof(T));

// V = 1, 4 (one 16-byte float4 or 8-byte access of 16-bit values: quad_view) or kVector<T>.
template <typename T, int V>
__device__ __forceinline__ void load_values(const T* p, float (&v)[V]) {
  static_assert(V == 1 || V == 4 || V == kVector<T>, "1 element, 4, or one 16-byte access");
  if constexpr (std::is_same_v<T, float>) {
    load_floats<V>(p, v);
  } else if constexpr (V == 1) {
    v[0] = to_float(*p);
  } else if constexpr (V == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = to_float(T{uint16_t(q.x & 0xffffu)}), v[1] = to_float(T{uint16_t(q.x >> 16)});
    v[2] = to_float(T{uint16_t(q.y & 0xffffu)}), v[3] = to_float(T{uint16_t(q.y >> 16)});
  } else {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = to_float(T{uint16_t(w[i] & 0xffffu)});
      v[2 * i + 1] = to_float(T{uint16_t(w[i] >> 16)});
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_values(T* p, const float (&v)[V]) {
  static_assert(V == 1 || V == 4 || V == kVector<T>, "1 element, 4, or one 16-byte access");
  if constexpr (std::is_same_v<T, float>) {
    store_floats<V>(p, v);
  } else if constexpr (V == 1) {
    *p = from_float<T>(v[0]);
  } else if constexpr (V == 4) {
    const uint32_t lo = uint32_t(from_float<T>(v[0]).bits) | uint32_t(from_float<T>(v[1]).bits) << 16,
                   hi = uint32_t(from_float<T>(v[2]).bits) | uint32_t(from_float<T>(v[3]).bits) << 16;
    *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = uint32_t(from_float<T>(v[2 * i]).bits) | uint32_t(from_float<T>(v[2 * i + 1]).bits) << 16;
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The same as one value for kernels that only move or add whole packs (common.cuh's FloatPack
// style, which nvcc unrolls further than arrays): Pack<T, V> is FloatPack<V> for float (the
// FP32 kernels' code is unchanged) and FP32 values for 16-bit storage.
struct Floats8 {
  float v[8];
};
template <typename T, int V>
using Pack = std::conditional_t<std::is_same_v<T, float>, FloatPack<V>, std::conditional_t<V == 1, float, Floats8>>;

__device__ __forceinline__ Floats8 add_packs(const Floats8& a, const Floats8& b) {
  Floats8 r;
#pragma unroll
  for (int i = 0; i < 8; ++i) r.v[i] = a.v[i] + b.v[i];
  return r;
}

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack_of(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return load_pack<V>(p);
  } else if constexpr (V == 1) {
    return to_float(*p);
  } else {
    Floats8 r;
    load_values<T, 8>(p, r.v);
    return r;
  }
}
template <typename T, int V>
__device__ __forceinline__ void store_pack_of(T* p, const Pack<T, V>& v) {
  if constexpr (std::is_same_v<T, float>) store_pack<V>(p, v);
  else if constexpr (V == 1) *p = from_float<T>(v);
  else store_values<T, 8>(p, v.v);
}

// Whether every kVector<T> channels of the view, from channel 0, can be one 16-byte access.
// Host side, for launchers choosing V.
template <typename T>
bool vector_view(const NhwcView<T>& v) {
  using E = std::remove_const_t<T>;
  return v.c % kVector<E> == 0 && v.stride % kVector<E> == 0 && reinterpret_cast<uintptr_t>(v.data) % 16 == 0;
}

}  // namespace yolo
