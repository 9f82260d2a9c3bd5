// Hopper's asynchronous building blocks, as inline PTX under nvcc and as emulated twins for the
// host compiler (runtime/emu/warpgroup.cpp queues and checks; the arithmetic and the fragment
// layout are here, as mma.cuh keeps mma.sync's):
//   - wgmma.mma_async m64nNk16 (BF16, FP16; FP32 accumulators) with both operands K-major in
//     shared memory, named by matrix descriptors, and m64nNk8 in TF32 (T = float; K-major only:
//     the ISA has no transpose for 32-bit operands); wgmma.fence / commit_group / wait_group.
//     TF32 operands are FP32 words in shared memory of which the tensor cores read the top 19
//     bits: the low 13 mantissa bits are ignored (truncation toward zero, where mma.sync's
//     kernels round with cvt.rna first; a NaN whose payload lies in those bits reads as Inf).
//     sm_90a code only (YOLO_WGMMA_NATIVE): elsewhere the calls trap, and launchers ask
//     current_device_runs_wgmma (kernels/hopper.h) before choosing a wgmma kernel.
//   - mbarriers (init, arrive, arrive with expect_tx, try_wait.parity) and
//     fence.proxy.async.shared::cta: sm_90.
//
// Shared-memory operand layout (PTX ISA, "Shared Memory Matrix Layout" and "Matrix Descriptor
// Format" of wgmma), K-major, 16-bit elements, one descriptor per m64 (A) or nN (B) by k16 slice:
//   - Swizzle::None: core matrices of 8 rows x 16 bytes stored contiguously; the two 16-byte
//     k-chunks of a k16 slice `leading_bytes` apart, 8-row groups `stride_bytes` apart.
//   - Swizzle::B128/B64/B32: rows `swizzle_bytes` apart (128/64/32), 8-row groups `stride_bytes`
//     apart (8 * swizzle_bytes when dense), and the 16-byte chunk index within each row XORed
//     with the row's place in the pattern (`swizzled`: address bits 4.. ^= bits 7..). The k16
//     slices of a row are 32 bytes apart: their descriptors start 32 bytes apart. Tiles start
//     where the pattern does (1024, 512, 256 bytes); `leading_bytes` is unused.
// MN-major operands (wgmma's imm-trans 1; 16-bit types only), as the ISA's canonical layouts
// give them (`mn_major_address`): each swizzle row holds swizzle_bytes of consecutive M (or N)
// elements of one k; the 8 k of a k-block are consecutive rows (one 8 * swizzle_bytes pattern),
// k-blocks `stride_bytes` apart and groups of swizzle_bytes / 2 M/N elements `leading_bytes`
// apart. Without a swizzle: core matrices of 8 M/N elements (16 bytes) by 8 k, 16-byte rows;
// M/N groups of 8 `stride_bytes` apart, k-blocks `leading_bytes` apart. A k16 slice spans two
// k-blocks: its descriptor starts 2 * stride_bytes (swizzled) after the previous one.
// D fragment (PTX ISA, "Register Fragments" of wgmma .m64nNk16): warp w of the warpgroup holds
// rows 16w..16w+15, the m16n8 accumulator layout repeated along N: d[i] is D[row][col] with
// row = 16w + lane/4 + 8*((i/2)%2), col = 8*(i/4) + 2*(lane%4) + i%2.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/half_types.h"
#if !defined(__CUDACC__)
#include "runtime/fault.h"  // the emulated twin's planted fault (tests/test_kernel_wgmma_check.cpp)
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define YOLO_WGMMA_NATIVE 1
#else
#define YOLO_WGMMA_NATIVE 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define YOLO_MBARRIER_NATIVE 1
#else
#define YOLO_MBARRIER_NATIVE 0
#endif

namespace yolo::wgmma {

// ---- shared addresses, swizzles and descriptors (host and device) -----------------------------

// The shared-state-space address of a pointer into (dynamic) shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
#if defined(__CUDACC__)
  return uint32_t(__cvta_generic_to_shared(p));
#else
  return yolo::emu::shared_address(p);
#endif
}

// The descriptor's layout-type codes (bits 62-63).
enum class Swizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// A K-major row's pitch in bytes: the swizzle width (16, one core-matrix row, without one).
__host__ __device__ constexpr uint32_t swizzle_bytes(Swizzle s) {
  return s == Swizzle::B128 ? 128 : s == Swizzle::B64 ? 64 : s == Swizzle::B32 ? 32 : 16;
}

// A shared byte address as a swizzle mode moves it: 128B XORs bits 4-6 with bits 7-9, 64B bits
// 4-5 with 7-8, 32B bit 4 with bit 7 (the same patterns as TMA's 128B/64B/32B swizzles).
__host__ __device__ constexpr uint32_t swizzled(uint32_t address, Swizzle s) {
  const uint32_t mask = swizzle_bytes(s) / 16 - 1;
  return address ^ (((address >> 7) & mask) << 4);
}

// Where byte `k_byte` of row `row` of a K-major tile at `base` lives (see the top of the file;
// swizzled modes: k_byte < swizzle_bytes).
__host__ __device__ constexpr uint32_t k_major_address(uint32_t base, Swizzle s, uint32_t leading_bytes,
                                                       uint32_t stride_bytes, uint32_t row, uint32_t k_byte) {
  if (s == Swizzle::None)
    return base + (row / 8) * stride_bytes + (k_byte / 16) * leading_bytes + (row % 8) * 16 + k_byte % 16;
  return swizzled(base + (row / 8) * stride_bytes + (row % 8) * swizzle_bytes(s) + k_byte, s);
}

// Where element (mn, k) of an MN-major tile at `base` lives (see the top of the file).
__host__ __device__ constexpr uint32_t mn_major_address(uint32_t base, Swizzle s, uint32_t leading_bytes,
                                                        uint32_t stride_bytes, uint32_t mn, uint32_t k) {
  if (s == Swizzle::None)
    return base + (mn / 8) * stride_bytes + (k / 8) * leading_bytes + (k % 8) * 16 + (mn % 8) * 2;
  const uint32_t per_row = swizzle_bytes(s) / 2;  // 16-bit elements in a swizzle row
  return swizzled(base + (mn / per_row) * leading_bytes + (k / 8) * stride_bytes + (k % 8) * swizzle_bytes(s) +
                      (mn % per_row) * 2,
                  s);
}

// The 64-bit matrix descriptor: start address, leading and stride byte offsets (each >> 4 in
// 14 bits), base offset 0 (tiles start where their pattern does), layout type.
__host__ __device__ constexpr uint64_t descriptor(uint32_t address, Swizzle s, uint32_t leading_bytes,
                                                  uint32_t stride_bytes) {
  return uint64_t((address >> 4) & 0x3fff) | uint64_t((leading_bytes >> 4) & 0x3fff) << 16 |
         uint64_t((stride_bytes >> 4) & 0x3fff) << 32 | uint64_t(s) << 62;
}

#if !defined(__CUDACC__)
// ---- emulated twin: each thread computes its own accumulators from shared memory ---------------
namespace emulated {

// The shared address of element (mn, k) of the 32-byte k slice a descriptor names (k16 of 16-bit
// elements, k8 of TF32), K-major or (mn_major, 16-bit only) MN-major. Throws for what the
// emulation does not model (a base offset; a K-major slice crossing a swizzle row; a start
// address away from its pattern's first row, which needs the base offset on a GPU).
inline uint32_t operand_address(uint64_t desc, bool mn_major, uint32_t mn, uint32_t k, uint32_t element_bytes) {
  const uint32_t start = uint32_t(desc & 0x3fff) << 4, leading = uint32_t(desc >> 16 & 0x3fff) << 4;
  const uint32_t stride = uint32_t(desc >> 32 & 0x3fff) << 4;
  const Swizzle s = Swizzle(desc >> 62);
  if ((desc >> 49 & 7) != 0) throw Error("wgmma descriptor: a matrix base offset (not emulated)");
  if (s != Swizzle::None) {
    const uint32_t width = swizzle_bytes(s), pattern = 8 * width;
    if (!mn_major && start % width + 32 > width)
      throw Error("wgmma descriptor: the k16 slice at shared address " + std::to_string(start) + " crosses a " +
                  std::to_string(width) + "-byte swizzle row");
    if (mn_major ? start % pattern != 0 : start % pattern >= width)
      throw Error("wgmma descriptor: start address " + std::to_string(start) + " is not at the first row of its " +
                  std::to_string(pattern) + "-byte swizzle pattern (a GPU needs the base offset field)");
  }
  return mn_major ? mn_major_address(start, s, leading, stride, mn, k)
                  : k_major_address(start, s, leading, stride, mn, element_bytes * k);
}

// An operand element as the tensor cores use it, from its bits (TF32: the FP32 word's low 13 bits
// dropped).
template <typename T>
double element_value(uint32_t bits) {
  if constexpr (std::is_same_v<T, float>) {
    float word;
    std::memcpy(&word, &bits, 4);
    if (yolo::fault_injected(yolo::Fault::Tf32RoundsOperands)) return double(round_to_tf32(word));  // planted
    return double(truncate_to_tf32(word));
  } else if constexpr (std::is_same_v<T, Bf16>) {
    return double(to_float(Bf16{uint16_t(bits)}));
  } else {
    return double(to_float(Fp16{uint16_t(bits)}));
  }
}

// Issued: this thread's operand elements are read now (the hardware may read them any time until
// the wait_group that covers the op: reading at issue is the earliest, and the wait checks that
// they did not change since, the latest). Queued until that wait; then D = A*B (+ D) for this
// thread's fragment, each output's products summed exactly and rounded once (the hardware's order
// and truncation differ: GPU-vs-emulation comparisons are tolerances).
template <typename T, int N, bool TransA, bool TransB>
void mma(float* d, uint64_t a_desc, uint64_t b_desc, bool accumulate) {
  const unsigned rank = yolo::emu::thread_rank() % 128, warp = rank / 32, lane = rank % 32;
  // The fragment's D[i] is row 16 warp + lane / 4 + 8 h (h = (i / 2) % 2) and column
  // 8 (i / 4) + 2 (lane % 4) + i % 2: this thread's 2 rows of A and N / 4 columns of B, each
  // element read once, A's first (a[h][k] at [h * K + k]), then B's (b[j][k] at [(2 + j) * K + k]).
  constexpr unsigned K = 32 / sizeof(T), kBytes = sizeof(T) == 4 ? 4 : 2;  // the slice's k: 16, or 8 in TF32
  constexpr unsigned kElements = (2 + N / 4) * K;
  struct Operands {
    uint32_t at[kElements], bits[kElements];
  };
  auto operands = std::make_shared<Operands>();
  for (unsigned h = 0; h < 2; ++h)
    for (unsigned k = 0; k < K; ++k)
      operands->at[h * K + k] = operand_address(a_desc, TransA, 16 * warp + lane / 4 + 8 * h, k, kBytes);
  for (unsigned j = 0; j < unsigned(N) / 4; ++j)
    for (unsigned k = 0; k < K; ++k)
      operands->at[(2 + j) * K + k] = operand_address(b_desc, TransB, 8 * (j / 2) + 2 * (lane % 4) + j % 2, k, kBytes);
  yolo::emu::async_proxy_read_elements(operands->at, operands->bits, kElements, kBytes);
  yolo::emu::wgmma_queue([=] {
    yolo::emu::check_operands_unchanged(operands->at, operands->bits, kElements, kBytes);
    const unsigned k_summed = yolo::fault_injected(yolo::Fault::WgmmaDropsLastK) ? K - 1 : K;  // planted
    double v[kElements];
    for (unsigned e = 0; e < kElements; ++e) v[e] = element_value<T>(operands->bits[e]);
    for (unsigned i = 0; i < unsigned(N) / 2; ++i) {
      const double* row = v + ((i / 2) % 2) * K;
      const double* col = v + (2 + 2 * (i / 4) + i % 2) * K;
      double sum = accumulate ? double(d[i]) : 0.0;
      for (unsigned k = 0; k < k_summed; ++k) sum += row[k] * col[k];
      d[i] = float(sum);
    }
  });
}

}  // namespace emulated
#endif

// ---- wgmma ---------------------------------------------------------------------------------------

// The compiler must not move accumulator reads or writes across wgmma's asynchronous window.
template <int M>
__device__ __forceinline__ void fence_registers(float (&d)[M]) {
#if defined(__CUDACC__)
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+f"(d[i])::"memory");
#else
  (void)d;
#endif
}

// wgmma.fence: before the first mma_async of a batch, once other instructions touched `d`.
template <int M>
__device__ __forceinline__ void fence(float (&d)[M]) {
  fence_registers(d);
#if YOLO_WGMMA_NATIVE
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::wgmma_fence();
#endif
}

// D (+)= A * B for one 32-byte k slice (m64nNk16 for Bf16 and Fp16, m64nNk8 for TF32; N 64 or
// 128); accumulate = false ignores D's value; TransA / TransB: that operand is MN-major
// (imm-trans 1; 16-bit only). The PTX, one macro per N for every operand type (the operand lists
// are long): SHAPE_TYPES the shape and types, e.g. "m64n64k16.f32.bf16.bf16"; scale-d a predicate
// set from `accumulate`; scale-a and scale-b 1; TRANS ", a, b" with the two imm-trans values, or
// nothing (TF32 takes none).
#define YOLO_WGMMA_M64N64(SHAPE_TYPES, TRANS)                                                        \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\n"                                                                \
      "setp.ne.b32 p, %34, 0;\n"                                                    \
      "wgmma.mma_async.sync.aligned." SHAPE_TYPES " "                                      \
      "{"                                                                                \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"   \
      "}, %32, %33, p, 1, 1" TRANS ";\n}\n"                                          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)))
#define YOLO_WGMMA_M64N128(SHAPE_TYPES, TRANS)                                                        \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\n"                                                                \
      "setp.ne.b32 p, %66, 0;\n"                                                    \
      "wgmma.mma_async.sync.aligned." SHAPE_TYPES " "                                      \
      "{"                                                                                \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "   \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "   \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"   \
      "}, %64, %65, p, 1, 1" TRANS ";\n}\n"                                          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),   \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),   \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),   \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),   \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "l"(a_desc), "l"(b_desc), "r"(int(accumulate)))

template <typename T, int N, bool TransA = false, bool TransB = false>
__device__ __forceinline__ void mma_async(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, bool accumulate) {
  static_assert(N == 64 || N == 128, "the wgmma shapes built here are m64n64 and m64n128");
  static_assert(std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16> || std::is_same_v<T, float>,
                "wgmma operands here are Bf16, Fp16 or TF32 (float)");
  static_assert(!std::is_same_v<T, float> || (!TransA && !TransB), "TF32 wgmma reads K-major operands only");
#if YOLO_WGMMA_NATIVE
// The four transpose combinations of one shape and type.
#define YOLO_WGMMA_ANY_TRANS(MACRO, SHAPE_TYPES)              \
  if constexpr (!TransA && !TransB) MACRO(SHAPE_TYPES, ", 0, 0"); \
  else if constexpr (!TransA) MACRO(SHAPE_TYPES, ", 0, 1");       \
  else if constexpr (!TransB) MACRO(SHAPE_TYPES, ", 1, 0");       \
  else MACRO(SHAPE_TYPES, ", 1, 1")
  if constexpr (N == 64) {
    if constexpr (std::is_same_v<T, Bf16>) YOLO_WGMMA_ANY_TRANS(YOLO_WGMMA_M64N64, "m64n64k16.f32.bf16.bf16");
    else if constexpr (std::is_same_v<T, Fp16>) YOLO_WGMMA_ANY_TRANS(YOLO_WGMMA_M64N64, "m64n64k16.f32.f16.f16");
    else YOLO_WGMMA_M64N64("m64n64k8.f32.tf32.tf32", "");
  } else {
    if constexpr (std::is_same_v<T, Bf16>) YOLO_WGMMA_ANY_TRANS(YOLO_WGMMA_M64N128, "m64n128k16.f32.bf16.bf16");
    else if constexpr (std::is_same_v<T, Fp16>) YOLO_WGMMA_ANY_TRANS(YOLO_WGMMA_M64N128, "m64n128k16.f32.f16.f16");
    else YOLO_WGMMA_M64N128("m64n128k8.f32.tf32.tf32", "");
  }
#undef YOLO_WGMMA_ANY_TRANS
#elif defined(__CUDACC__)
  (void)d;
  (void)a_desc;
  (void)b_desc;
  (void)accumulate;
  __trap();  // no wgmma outside sm_90a code; launchers ask current_device_runs_wgmma first
#else
  emulated::mma<T, N, TransA, TransB>(d, a_desc, b_desc, accumulate);
#endif
}
#undef YOLO_WGMMA_M64N64
#undef YOLO_WGMMA_M64N128

// Closes the batch of mma_async issued since the last commit.
__device__ __forceinline__ void commit_group() {
#if YOLO_WGMMA_NATIVE
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::wgmma_commit_group();
#endif
}

// Waits until at most `Pending` committed batches are in flight; `d` is readable after it.
template <int Pending, int M>
__device__ __forceinline__ void wait_group(float (&d)[M]) {
#if YOLO_WGMMA_NATIVE
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::wgmma_wait_group(Pending);
#endif
  fence_registers(d);
}

// ---- register reallocation between warpgroups (setmaxnreg, sm_90a) --------------------------------
// A producer warpgroup gives registers back (dec) so the math warpgroups can take them (inc);
// every thread of the warpgroup executes it. The emulation has no register file: it checks the
// count and that the warp is converged.
template <int Registers>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(Registers % 8 == 0 && Registers >= 24 && Registers <= 256, "setmaxnreg takes 24..256 in steps of 8");
#if YOLO_WGMMA_NATIVE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Registers));
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::converge_warp("setmaxnreg.inc");
#endif
}
template <int Registers>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(Registers % 8 == 0 && Registers >= 24 && Registers <= 256, "setmaxnreg takes 24..256 in steps of 8");
#if YOLO_WGMMA_NATIVE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Registers));
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::converge_warp("setmaxnreg.dec");
#endif
}

// ---- mbarriers and the proxy fence (sm_90) -------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#if YOLO_MBARRIER_NATIVE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::mbarrier_init(shared_address(bar), count);
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if YOLO_MBARRIER_NATIVE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::mbarrier_arrive(shared_address(bar), 0);
#endif
}

// Expects `bytes` more of asynchronous copies (TMA) in this phase, then arrives.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if YOLO_MBARRIER_NATIVE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::mbarrier_arrive(shared_address(bar), bytes);
#endif
}

// Until the phase of parity `parity` is complete (a fresh mbarrier is in phase 0, so parity 1
// passes at once: a ring's "empty" barriers are first waited with parity 1).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if YOLO_MBARRIER_NATIVE
  const uint32_t address = shared_address(bar);
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::mbarrier_wait_parity(shared_address(bar), parity);
#endif
}

// After thread 0 initialised a block's mbarriers, before the __syncthreads that shows them to the
// other threads: makes the initialisation visible to the async proxy, whose TMA copies complete
// transactions on them: the PTX ISA's fence.mbarrier_init (a fence for earlier mbarrier.inits
// alone), as CUTLASS's fence_barrier_init and DeepGEMM use it, and fence.proxy.async.shared::cta,
// as the Programming Guide's TMA example does. Without it a first
// stage's byte count may be lost, or the copy complete on a barrier the TMA unit sees uninitialised.
__device__ __forceinline__ void fence_barrier_init() {
#if YOLO_MBARRIER_NATIVE
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::fence_mbarrier_init();
  yolo::emu::fence_proxy_async();
#endif
}

// Orders this thread's earlier generic-proxy writes of shared memory (stores, cp.async) before
// later async-proxy reads of it (wgmma, TMA stores).
__device__ __forceinline__ void fence_proxy_async() {
#if YOLO_MBARRIER_NATIVE
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  yolo::emu::fence_proxy_async();
#endif
}

}  // namespace yolo::wgmma
