// 16-bit storage types (bf16, fp16) and the roundings the tensor-core paths use, identical in
// all three builds (nvcc, the emulation, the CPU backend).
//
// Why our own types and not the toolkit's __half / __nv_bfloat16: CPU-only builds have no
// toolkit, the emulated build compiles kernels with g++, and one plain 16-bit struct is the same
// type in every build, so a tensor written by one path is read bit for bit by another. Kernels
// only move these as bits (into mma.sync registers, through ldmatrix and cp.async); the
// conversions below are exact integer arithmetic, round to nearest even as the hardware's
// cvt.rn does, and tested against hand-computed cases (tests/test_kernel_mma.cpp).
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/tensor.h"  // YOLO_HOST_DEVICE

namespace yolo {

struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

YOLO_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
YOLO_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bfloat16: the top 16 bits of an FP32 ----------------------------------------------------
YOLO_HOST_DEVICE inline float to_float(Bf16 h) { return bits_float(uint32_t(h.bits) << 16); }
// Round to nearest, ties to even; NaN stays NaN (quiet), Inf stays Inf, overflow rounds to Inf.
YOLO_HOST_DEVICE inline Bf16 to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{uint16_t((u >> 16) | 0x40u)};
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return Bf16{uint16_t(rounded >> 16)};
}

// ---- IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits -----------------------------
YOLO_HOST_DEVICE inline float to_float(Fp16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16, exponent = (h.bits >> 10) & 0x1fu,
                 mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // Inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in FP32
    const float magnitude = float(mantissa) * bits_float(0x33800000u);  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
// Round to nearest, ties to even, with subnormal results; beyond 65504 (after rounding) -> Inf.
YOLO_HOST_DEVICE inline Fp16 to_fp16(float f) {
  const uint32_t u = float_bits(f), sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return Fp16{uint16_t(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};  // NaN
  if (magnitude >= 0x477ff000u) return Fp16{uint16_t(sign | 0x7c00u)};  // rounds to 65536 or more: Inf
  const int exponent = int(magnitude >> 23) - 127;
  if (exponent >= -14) {  // normal: drop 13 mantissa bits, rounding to even (a carry may bump the exponent)
    const uint32_t rebased = magnitude - (112u << 23);
    const uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return Fp16{uint16_t(sign | (rounded >> 13))};
  }
  if (exponent < -25) return Fp16{uint16_t(sign)};  // below half the smallest subnormal: zero
  // Subnormal: the value in units of 2^-24, the implicit bit made explicit, rounded to even.
  const uint32_t full = (magnitude & 0x7fffffu) | 0x800000u;
  const int shift = -exponent - 1;  // 14..24: value = full * 2^(exponent-23) = (full >> shift) units
  const uint32_t units = full >> shift, rest = full & ((1u << shift) - 1u), half = 1u << (shift - 1);
  const uint32_t rounded = units + (rest > half || (rest == half && (units & 1u)) ? 1u : 0u);
  return Fp16{uint16_t(sign | rounded)};  // 0x400 when it rounds up to the smallest normal: still right
}

// ---- TF32: FP32 with 10 mantissa bits, in an FP32 register ----------------------------------------
// cvt.rna.tf32.f32 as the GPU computes it. It is no hardware instruction on sm_80..sm_120: ptxas
// (CUDA 13) lowers it to integer steps, FSETP.GEU |x|, +INF; @!P IADD x, 0x1000; LOP3 x & 0xffffe000.
// So a finite value rounds to nearest, ties away from zero, on the 13 dropped bits (the largest
// finite values round to Inf), while Inf and NaN are only truncated: a NaN whose payload lies
// wholly in the 13 dropped bits becomes an Inf of its sign (the H200 turned 0xff801e21 into
// 0xff800000), any other NaN keeps its sign and top 10 payload bits. The low 13 bits are zero.
YOLO_HOST_DEVICE inline float round_to_tf32(float f) {
  const uint32_t u = float_bits(f);
  const bool finite = (u & 0x7f800000u) != 0x7f800000u;
  return bits_float((finite ? u + 0x1000u : u) & 0xffffe000u);
}
// An FP32 word as the tensor cores read a TF32 operand (mma.sync's registers, wgmma's shared
// memory): the low 13 bits ignored, truncated toward zero, Inf and NaN alike.
YOLO_HOST_DEVICE inline float truncate_to_tf32(float f) { return bits_float(float_bits(f) & 0xffffe000u); }

template <typename T>
YOLO_HOST_DEVICE inline T from_float(float f);
template <>
YOLO_HOST_DEVICE inline float from_float<float>(float f) { return f; }
template <>
YOLO_HOST_DEVICE inline Bf16 from_float<Bf16>(float f) { return to_bf16(f); }
template <>
YOLO_HOST_DEVICE inline Fp16 from_float<Fp16>(float f) { return to_fp16(f); }
YOLO_HOST_DEVICE inline float to_float(float f) { return f; }

}  // namespace yolo
