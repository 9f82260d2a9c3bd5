// Tensor-core building blocks: mma.sync, ldmatrix, cp.async and the input conversions, as inline
// PTX under nvcc (guarded by __CUDA_ARCH__: sm_75 has only the m16n8k8 FP16 MMA and ldmatrix) and
// as emulated twins for the host compiler that follow the PTX ISA's fragment layouts element by
// element (section "Matrix fragments for mma.m16n8k8 / m16n8k16"), so a kernel that puts an
// element in the wrong lane or register fails under emulation as it would on a GPU.
//
// Fragment layouts (g = lane / 4, "groupID"; t = lane % 4, "threadID_in_group"):
//   C/D (16x8, FP32), every shape: d[i] = D[g + 8*(i/2)][2t + i%2].
//   TF32 m16n8k8:  a[i] = A[g + 8*(i%2)][t + 4*(i/2)];  b[i] = B[t + 4i][g].
//   16-bit m16n8k16 (BF16, FP16): register i of A holds A[g + 8*(i%2)][2t + 8*(i/2) + h] in
//     half h (h = 0 the low 16 bits); register i of B holds B[2t + 8i + h][g].
//   FP16 m16n8k8 (sm_75): a[i] holds A[g + 8i][2t + h]; b holds B[2t + h][g].
// The emulated MMA sums each output's products exactly (double) and rounds once to FP32; the
// hardware's internal order and truncation differ, so GPU-vs-emulation comparisons are
// tolerances. TF32 operands are read as the hardware reads them: the low 13 bits ignored
// (kernels round with to_tf32 first).
#pragma once
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/half_types.h"

namespace yolo::mma {

// ---- conversions ---------------------------------------------------------------------------------

// cvt.rna.tf32.f32: FP32 -> TF32 (ties away from zero; Inf and NaN truncated, so a NaN with its
// payload in the low 13 bits becomes Inf: round_to_tf32), as the 32-bit register the MMA reads.
__device__ __forceinline__ uint32_t to_tf32(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
#else
  return float_bits(round_to_tf32(f));
#endif
}

// Two floats as one register of 16-bit values, `lo` in the low half (round to nearest even).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(to_bf16(lo).bits) | uint32_t(to_bf16(hi).bits) << 16;
#endif
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(to_fp16(lo).bits) | uint32_t(to_fp16(hi).bits) << 16;
#endif
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<Bf16>(float lo, float hi) { return pack_bf16x2(lo, hi); }
template <>
__device__ __forceinline__ uint32_t pack2<Fp16>(float lo, float hi) { return pack_f16x2(lo, hi); }

#if !defined(__CUDACC__)
// ---- emulated twins: the warp's registers meet in its wide exchange slots -------------------------
namespace emulated {

enum class Kind { Tf32, Bf16, F16 };

inline double decode(Kind kind, uint32_t reg, int half) {
  if (kind == Kind::Tf32) return double(truncate_to_tf32(bits_float(reg)));
  const uint16_t bits = uint16_t(reg >> (16 * half));
  return kind == Kind::Bf16 ? double(to_float(Bf16{bits})) : double(to_float(Fp16{bits}));
}

// D = A*B + C for one m16n8kK MMA of the warp. a_regs/b_regs: registers per lane.
template <int K>
void mma(Kind kind, float (&d)[4], const uint32_t* a, int a_regs, const uint32_t* b, int b_regs, const float (&c)[4]) {
  yolo::emu::require_full_warp("mma.sync");
  const unsigned lane = yolo::emu::lane_id();
  unsigned char* mine = yolo::emu::warp_wide_slot(lane);
  std::memcpy(mine, a, sizeof(uint32_t) * a_regs);
  std::memcpy(mine + 16, b, sizeof(uint32_t) * b_regs);
  yolo::emu::warp_barrier(0xffffffffu);
  yolo::emu::require_full_warp("mma.sync");  // again: a lane that exited after this one arrived drops out
  auto reg_of = [](unsigned l, int offset, int index) {
    uint32_t r;
    std::memcpy(&r, yolo::emu::warp_wide_slot(l) + offset + 4 * index, 4);
    return r;
  };
  auto a_at = [&](int row, int k) {
    if (kind == Kind::Tf32) return decode(kind, reg_of(unsigned((row % 8) * 4 + k % 4), 0, row / 8 + 2 * (k / 4)), 0);
    if (K == 16) return decode(kind, reg_of(unsigned((row % 8) * 4 + (k % 8) / 2), 0, row / 8 + 2 * (k / 8)), k % 2);
    return decode(kind, reg_of(unsigned((row % 8) * 4 + k / 2), 0, row / 8), k % 2);  // f16 m16n8k8
  };
  auto b_at = [&](int k, int n) {
    if (kind == Kind::Tf32) return decode(kind, reg_of(unsigned(n * 4 + k % 4), 16, k / 4), 0);
    if (K == 16) return decode(kind, reg_of(unsigned(n * 4 + (k % 8) / 2), 16, k / 8), k % 2);
    return decode(kind, reg_of(unsigned(n * 4 + k / 2), 16, 0), k % 2);
  };
  float result[4];
  for (int i = 0; i < 4; ++i) {
    const int row = int(lane / 4) + 8 * (i / 2), col = int(lane % 4) * 2 + i % 2;
    double sum = double(c[i]);
    for (int k = 0; k < K; ++k) sum += a_at(row, k) * b_at(k, col);
    result[i] = float(sum);
  }
  yolo::emu::warp_barrier(0xffffffffu);  // slots stay stable until every lane has read them
  for (int i = 0; i < 4; ++i) d[i] = result[i];
}

}  // namespace emulated
#endif

// ---- mma.sync (FP32 accumulators: d = a*b + c; d may alias c) ----------------------------------------

__device__ __forceinline__ void mma_tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  __trap();  // no TF32 before sm_80; launchers refuse it first
#endif
#else
  emulated::mma<8>(emulated::Kind::Tf32, d, a, 4, b, 2, c);
#endif
}

__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  __trap();  // no BF16 before sm_80; launchers refuse it first
#endif
#else
  emulated::mma<16>(emulated::Kind::Bf16, d, a, 4, b, 2, c);
#endif
}

__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  // sm_75 has m16n8k8 only: the k16 product as two k8 halves (registers 0,1 / 2,3 of A; 0 / 1 of B).
  float t[4];
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=f"(t[0]), "=f"(t[1]), "=f"(t[2]), "=f"(t[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[2]), "r"(a[3]), "r"(b[1]), "f"(t[0]), "f"(t[1]), "f"(t[2]), "f"(t[3]));
#endif
#else
  emulated::mma<16>(emulated::Kind::F16, d, a, 4, b, 2, c);
#endif
}

// The sm_75 shape itself (a: 2 registers, b: 1).
__device__ __forceinline__ void mma_f16_m16n8k8(float (&d)[4], const uint32_t (&a)[2], uint32_t b,
                                                const float (&c)[4]) {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 750
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  __trap();
#endif
#else
  emulated::mma<8>(emulated::Kind::F16, d, a, 2, &b, 1, c);
#endif
}

// One 16-bit m16n8k16 MMA in the precision of T (Bf16 or Fp16).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
  if constexpr (std::is_same_v<T, Bf16>) mma_bf16_m16n8k16(d, a, b, c);
  else mma_f16_m16n8k16(d, a, b, c);
}

// ---- ldmatrix: N (1, 2, 4) 8x8 matrices of 16-bit elements from shared memory --------------------------
// Lane l gives the address of row l % 8 of matrix l / 8. Without .trans, r[j] of lane l holds
// matrix j's row l/4, columns 2(l%4) and +1; with .trans, column l/4, rows 2(l%4) and +1.
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row_address) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix moves 1, 2 or 4 matrices");
#if defined(__CUDACC__)
  const unsigned address = unsigned(__cvta_generic_to_shared(row_address));
  if constexpr (N == 1) {
    if constexpr (Trans) asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(address));
    else asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(address));
  } else if constexpr (N == 2) {
    if constexpr (Trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
    else asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
  } else {
    if constexpr (Trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(address));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(address));
  }
#else
  yolo::emu::ldmatrix(r, N, Trans, row_address);
#endif
}

// ---- cp.async (sm_80+): 16 bytes global -> shared, bypassing registers ---------------------------------
// fill = false writes 16 zero bytes (src-size 0) and reads nothing; global_src must still be a
// global address then (the PTX ISA wants one: pass any valid pointer of the operand). Both
// addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src, bool fill) {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 800
  const unsigned dst = unsigned(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(global_src), "r"(fill ? 16 : 0)
               : "memory");
#else
  __trap();  // no cp.async before sm_80; those kernels stage through registers
#endif
#else
  yolo::emu::cp_async(shared_dst, global_src, 16, fill ? 16 : 0);
#endif
}
// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
#else
  yolo::emu::cp_async_commit();
#endif
}
// Waits until at most `Pending` of this thread's committed groups are still in flight. Other
// threads' copies need a __syncthreads after this to be visible.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDACC__)
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");  // later shared loads stay after it
#endif
#else
  yolo::emu::cp_async_wait(Pending);
#endif
}

}  // namespace yolo::mma
