// The emulated launch: runs a grid's blocks one after another on the host thread that runs the
// launch (the stream's, or the caller's for a null stream), each block's threads as fibers (fiber.h). A thread runs until it reaches a barrier
// (__syncthreads: every thread of the block that has not exited; a warp operation: the live
// lanes of its mask), so barriers are real and threads that return early drop out of them,
// as on the GPU. One emulated launch runs at a time in the process, which lets __shared__
// variables be plain static storage.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct CUstream_st;

namespace yolo::emu {

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

// Where a launch came from, for error messages.
struct LaunchSite {
  const char* kernel;
  const char* file;
  int line;
};

// Throws yolo::Error for a configuration no GPU we target can launch. Dynamic shared memory
// beyond 48 KiB needs the kernel's opt-in (allow_dynamic_shared, as cudaFuncSetAttribute).
// `shared_limit`: dynamic_shared_limit(kernel) on the launching thread.
constexpr size_t kDefaultSharedLimit = 48 * 1024;
void validate_launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                     size_t shared_limit = kDefaultSharedLimit);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) for emulated
// launches on the current emulated device (throws yolo::Error, as CUDA fails, when the device
// has less shared memory per block: 64 KiB on sm_75, 163 KiB on sm_80, 227 KiB on sm_90).
void allow_dynamic_shared(const void* kernel, size_t bytes);
size_t dynamic_shared_limit(const void* kernel);  // for the current emulated device

// Runs `body` (the kernel call with its arguments bound) for every thread of the grid. Throws
// yolo::Error for an invalid configuration, a barrier no thread set can complete, or an
// exception thrown by a thread.
void run_grid(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& body, size_t shared_limit = kDefaultSharedLimit);

// Runs `work` (an emulated kernel, or device-side work such as the emulated sort) in the order
// of `stream`: queued on the stream's queue (a StreamQueue), or at once for a null stream. It runs
// with device memory accessible (device.h, DeviceAccess); on an emulated GPU's stream it counts
// as a launch for injected failures. The device work of one process runs one item at a time.
void run_on_stream(CUstream_st* stream, const char* what, std::function<void()> work);

// Used by the device-side API (emu.h); valid only inside an emulated kernel.
void block_barrier();                             // __syncthreads
// bar.sync id, count: the calling thread waits until `count` threads wait at barrier `id` (1..15;
// 0 is __syncthreads's); the first `count` arrivals complete it. count: whole warps, at most the
// block. Throws yolo::Error for a bad id or count, or threads meeting at one id with different
// counts (undefined on a GPU).
constexpr unsigned kNamedBarriers = 16;
void named_barrier(unsigned id, unsigned count);
void warp_barrier(uint32_t mask);                 // __syncwarp and each warp operation's steps
unsigned lane_id();                               // this thread's lane in its warp
uint32_t live_lanes();                            // lanes of this warp that exist and have not exited
unsigned char* warp_exchange_slot(unsigned lane); // 8 bytes per lane, per warp, for shuffles/votes
// 64 bytes per lane, per warp, for the warp-wide matrix operations (mma.sync, ldmatrix twins).
constexpr size_t kWideSlotBytes = 64;
unsigned char* warp_wide_slot(unsigned lane);

// This thread's cp.async copies not yet waited for (the cp.async twin in kernels/mma.cuh):
// copies in issue order, and the end of each committed group in `pending`.
struct AsyncCopy {
  void* dst;
  const void* src;
  unsigned bytes, src_bytes;  // bytes written; bytes read from src (the rest are zeros)
};
struct AsyncCopies {
  AsyncCopy pending[64];
  unsigned count = 0;
  unsigned group_ends[16];
  unsigned groups = 0;
};
AsyncCopies& thread_async_copies();
// The block's dynamic shared memory. Its shared-state-space address is kDynamicSharedBase, off a
// 1024-byte boundary: a GPU promises 16-byte alignment (DYNAMIC_SHARED's __align__(16)) and no
// more, so a kernel that needs a swizzle pattern's boundary must find it itself (as
// kernels/wgmma_tiles.cuh's ring does); the host memory behind it lies the same way.
constexpr uint32_t kDynamicSharedBase = 1024 + 16;
void* dynamic_shared_memory();
size_t dynamic_shared_size();  // its bytes

// For the warpgroup twins (runtime/emu/warpgroup.cpp), valid only inside an emulated kernel:
unsigned thread_rank();  // the calling thread's linear index in its block
// Suspends the calling thread until `ready()` holds; the scheduler asks whenever no thread can
// run. `what` names the wait in the report of a block that can never finish.
void wait_until(std::function<bool()> ready, std::string what);
// The byte offset of `p` in the block's dynamic shared memory (the shared state space address a
// GPU would give); throws yolo::Error for a pointer outside it (static __shared__ storage has no
// shared address in the emulation).
uint32_t shared_address(const void* p);
void* shared_pointer(uint32_t address, size_t bytes);  // the inverse; throws outside the window
bool in_dynamic_shared(const void* p);
// The warpgroup twins' state for the block being run: made on first use, dropped with the block.
struct WarpgroupState;
WarpgroupState& block_warpgroup_state();  // defined with the twins
WarpgroupState* block_warpgroup_state_if_any();
void adopt_warpgroup_state(WarpgroupState* state);    // the block owns it from here
void destroy_warpgroup_state(WarpgroupState* state);  // defined with the twins
size_t block_thread_count();
// Called as each thread of a block returns (throws for a thread that leaves work unwaited).
void check_thread_exit(WarpgroupState& state);
void join_all_clocks(WarpgroupState& state);  // at each __syncthreads: every thread's work happens before
// at a named barrier: the work of the threads `ranks` (the block's linear indices) happens before
// what each of them does next.
void join_clocks(WarpgroupState& state, const std::vector<unsigned>& ranks);

}  // namespace yolo::emu

// CUDA's built-in variables, set by the scheduler before each emulated thread resumes.
extern yolo::emu::uint3 threadIdx, blockIdx;
extern yolo::emu::dim3 blockDim, gridDim;
