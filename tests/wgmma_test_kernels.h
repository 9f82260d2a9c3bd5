// A small warpgroup GEMM that tests the Hopper building blocks of kernels/wgmma.cuh and tma.cuh
// together (tests/test_kernel_wgmma.cpp), emulated and on an H100/H200 with sm_90a code: a
// producer warp fills a ring of swizzled shared-memory stages (16-byte cp.async gathers, or TMA
// boxes), each guarded by a "full" and an "empty" mbarrier; a warpgroup runs wgmma.mma_async on
// them. Launchers throw yolo::Error where current_device_runs_wgmma is false.
#pragma once
#include <cstdint>

#include "kernels/tma.h"

namespace yolo::testing {

enum class WgmmaOperand { Bf16, Fp16 };
// How the producer fills a stage: 16-byte cp.async gathers by its 32 lanes, or two TMA boxes
// issued by one lane (swizzled layouts only: TMA writes boxes as dense rows).
enum class WgmmaLoad { CpAsync, Tma };
// The descriptor's layout types (kernels/wgmma.cuh's Swizzle, by the same codes).
enum class WgmmaSwizzle { None = 0, B128 = 1, B64 = 2, B32 = 3 };
const char* wgmma_swizzle_name(WgmmaSwizzle s);

// Faults planted on purpose: each must make the result wrong or the emulation throw. Emulation
// only (the launcher refuses them natively).
enum class WgmmaFault {
  None,
  SkipFullWait,   // the warpgroup reads a stage without waiting for its "full" mbarrier
  SkipEmptyWait,  // the producer refills a stage without waiting for its "empty" mbarrier
  WrongSwizzle,   // the producer writes rows without the swizzle's XOR
  NoProxyFence,   // the producer arrives with no fence.proxy.async after its cp.async writes
  NoWgmmaFence,   // the warpgroup issues wgmma.mma_async with no wgmma.fence first
  WrongExpectTx,  // TMA: the producer announces 16 bytes fewer than its boxes bring
  NoWaitGroup,    // the warpgroup never waits for its wgmma batches (wgmma.wait_group)
  NoFullInit,     // the "full" mbarriers are used without mbarrier.init
  // The emulation's strict readings (runtime/emu/warpgroup.cpp), each planted once:
  NoInitFence,          // TMA: the mbarriers' init is not fenced for the async proxy
  ReleaseBeforeWait,    // the warpgroup releases a stage before the wait_group that retires its reads
  FullWaitAfterIssue,   // the warpgroup waits for "full" after issuing the stage's wgmma, not before
  BWrittenAfterArrive,  // TMA: the producer copies B itself after its arrive (only A's box completes)
  BarrierInStage,       // the "full" mbarriers lie in the last stage, which the producer fills
  UnalignedBase,        // the ring starts where the dynamic shared memory does, not at a 1024 boundary
};

// Ring stages of the kernel (so a K of more than 3 tiles wraps the mbarriers' phases).
constexpr int kWgmmaStages = 3;
// K elements one stage holds: the swizzle row's bytes / 2 (None: one k16 slice).
int wgmma_tile_k(WgmmaSwizzle s);

// C (m x n, FP32, row-major) = A (m x k) * B (n x k)^T; A and B row-major 16-bit patterns of
// `type`. n: 64 or 128; k: a positive multiple of 8 (rows are gathered in 16-byte chunks); any m
// (one block per 64 rows; rows past m read as zeros and are not written).
void launch_wgmma_gemm(WgmmaOperand type, WgmmaSwizzle swizzle, WgmmaLoad load, int n, const uint16_t* a,
                       const uint16_t* b, float* c, int m, int k, WgmmaFault fault);

// One TMA im2col box of `map` (kernels/tma.h: encode_im2col; its swizzle `swizzle`, 0..3) to
// shared memory and back, its rows unswizzled: out_box receives `box_bytes` bytes, row p (of
// row_bytes) the traversal's pixel p. The coordinates and offsets go to tma::load_im2col as they
// are. Emulated, and on an H100/H200 with sm_90a code (else throws yolo::Error).
void launch_im2col_box(const tma::TensorMap& map, int c, int w, int h, int n, int off_w, int off_h, int swizzle,
                       uint32_t box_bytes, unsigned char* out_box);

}  // namespace yolo::testing
