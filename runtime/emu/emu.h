// CUDA on the CPU: what a kernel in kernels/*.cu uses, for the host compiler. Included by
// kernels/common.cuh when not compiling with nvcc; kernels never include it directly.
// Covers: 1-3D grids and blocks (<= 1024 threads), the built-in index variables,
// __syncthreads, static __shared__ (function-local static storage; one launch runs at a
// time) and dynamic shared memory (DYNAMIC_SHARED in common.cuh), the warp shuffles and votes,
// __syncwarp, atomics for int/unsigned/float, and the math intrinsics kernels use.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime/emu/device.h"
#include "runtime/emu/scheduler.h"

using dim3 = yolo::emu::dim3;
using uint3 = yolo::emu::uint3;
struct CUstream_st;
using cudaStream_t = CUstream_st*;  // a stream's queue (runtime/stream_queue.h); null: run at once

// ---- qualifiers --------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)
constexpr int warpSize = 32;

// ---- barriers and warp operations --------------------------------------------------------
inline void __syncthreads() { yolo::emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { yolo::emu::warp_barrier(mask); }
// A warp operation whose mask leaves out the calling lane, or names a lane that does not exist
// (a partial last warp), is undefined on a GPU: the emulation reports it (warp_barrier throws).
inline void __threadfence() {}
inline void __threadfence_block() {}
// Approximation: every lane of the warp that has not exited (the emulation does not track
// which side of a branch a lane is on).
inline unsigned __activemask() { return yolo::emu::live_lanes(); }

namespace yolo::emu {
// Every lane of `mask` publishes `value`; after the barrier each reads lane `source_of(lane)`
// (or keeps its own value where that is -1); a second barrier keeps the slots stable until
// all have read.
void check_shuffle_width(int width);  // a power of two in 1..32, else yolo::Error

template <typename T, typename SourceOf>
T warp_exchange(unsigned mask, T value, int width, SourceOf source_of) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move at most 8 bytes");
  check_shuffle_width(width);
  unsigned lane = lane_id();
  std::memcpy(warp_exchange_slot(lane), &value, sizeof(T));
  warp_barrier(mask);
  int source = source_of(int(lane));
  T result = value;
  if (source >= 0 && source < 32 && (live_lanes() >> source & 1))
    std::memcpy(&result, warp_exchange_slot(unsigned(source)), sizeof(T));
  warp_barrier(mask);
  return result;
}
}  // namespace yolo::emu

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
  return yolo::emu::warp_exchange(mask, value, width, [=](int lane) {
    return (lane / width) * width + (src_lane % width + width) % width;
  });
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return yolo::emu::warp_exchange(mask, value, width, [=](int lane) {
    int source = lane - int(delta);
    return source < (lane / width) * width ? -1 : source;
  });
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  return yolo::emu::warp_exchange(mask, value, width, [=](int lane) {
    int source = lane + int(delta);
    return source >= (lane / width + 1) * width ? -1 : source;
  });
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return yolo::emu::warp_exchange(mask, value, width, [=](int lane) {
    int source = lane ^ lane_mask;
    return source >= (lane / width + 1) * width ? -1 : source;  // later groups: own value
  });
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  unsigned lane = yolo::emu::lane_id();
  unsigned char* slot = yolo::emu::warp_exchange_slot(lane);
  slot[0] = predicate != 0;
  yolo::emu::warp_barrier(mask);
  unsigned bits = 0, live = yolo::emu::live_lanes() & mask;
  for (unsigned l = 0; l < 32; ++l)
    if ((live >> l & 1) && yolo::emu::warp_exchange_slot(l)[0]) bits |= 1u << l;
  yolo::emu::warp_barrier(mask);
  return bits;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return !__any_sync(mask, !predicate); }

// ---- warp-wide matrix operations and asynchronous copies (twins for kernels/mma.cuh) ------
namespace yolo::emu {
// mma.sync and ldmatrix are .sync.aligned: every lane of the warp takes part. Throws (naming
// `what`) when lanes of the warp have exited or never existed.
void require_full_warp(const char* what);
// ldmatrix.sync.aligned.m8n8.x{matrices}[.trans].shared.b16 into r[0..matrices): lane l supplies
// the address of row l % 8 of matrix l / 8 (lanes >= 8 * matrices unused); each row is 8 16-bit
// elements, 16-byte aligned (else throws, as the GPU faults).
void ldmatrix(uint32_t* r, int matrices, bool trans, const void* row_address);
// cp.async: queued per thread, done when a cp_async_wait covers its group (so a kernel that
// reads shared memory before waiting sees the old bytes, as it may on a GPU). src_bytes < bytes
// zero-fills the rest; both addresses must be aligned to `bytes`.
void cp_async(void* shared_dst, const void* global_src, unsigned bytes, unsigned src_bytes);
void cp_async_commit();
void cp_async_wait(unsigned pending_groups);  // until at most that many committed groups remain

// ---- Hopper's warpgroup MMA, mbarriers and proxy fences (twins for kernels/wgmma.cuh) ------------
// In runtime/emu/warpgroup.cpp, which says what each follows in the PTX ISA and what it checks.
// Addresses are shared-state-space addresses (shared_address in scheduler.h). An mbarrier's state
// lives in its 8 bytes of shared memory: anything else writing there is reported at its next use.
void mbarrier_init(uint32_t address, uint32_t count);
// mbarrier.arrive, after mbarrier.expect_tx of `tx_bytes` when they are not 0.
void mbarrier_arrive(uint32_t address, uint32_t tx_bytes);
bool mbarrier_try_wait_parity(uint32_t address, uint32_t parity);
void mbarrier_wait_parity(uint32_t address, uint32_t parity);    // try_wait in a loop
// fence.proxy.async.shared::cta: this thread's generic-proxy writes of shared memory (and its
// mbarrier.inits) become visible to the async proxy.
void fence_proxy_async();
// fence.mbarrier_init.release.cluster: this thread's mbarrier.inits become visible to the async
// proxy (a TMA copy may complete transactions on them once the fence is ordered before it).
void fence_mbarrier_init();
// Writes to shared memory through the generic proxy that the async proxy (wgmma, TMA) may read
// only after the writing thread's fence_proxy_async: cp.async's completions report here.
void note_generic_shared_write(const void* dst, size_t bytes);
// A TMA copy issued by this thread landed `bytes` at `dst`, completing transactions of the mbarrier
// at `bar`: the bytes are published to the threads that see that phase complete, and nothing the
// issuing thread did before is. Throws where the mbarrier's init was not fenced for the async proxy.
void async_copy_landed(const void* dst, size_t bytes, uint32_t bar);
// wgmma's queue: the op reads its operands when issued (kernels/wgmma.cuh, through
// async_proxy_read_elements) and its arithmetic (`run`) runs when a wgmma_wait_group of this
// thread covers it, first asking check_operands_unchanged of every operand element it read.
void wgmma_fence();
// The warp executes a .sync.aligned instruction together (setmaxnreg): every lane, none exited.
void converge_warp(const char* what);
void wgmma_queue(std::function<void()> run);
void wgmma_commit_group();
void wgmma_wait_group(unsigned pending_groups);
// The async proxy's reads of `count` elements of `bytes` (2 or 4, aligned) at shared addresses
// `addresses`, into `bits`: throws for bytes outside the dynamic shared memory, and for bytes a
// thread wrote through the generic proxy and has not fenced since, or that nothing orders before
// the reading thread.
void async_proxy_read_elements(const uint32_t* addresses, uint32_t* bits, size_t count, size_t bytes);
// Throws where the elements at `addresses` no longer hold `bits_at_issue`: a write between a
// wgmma's issue and the wait_group that covers it (the tensor cores may read them until then).
void check_operands_unchanged(const uint32_t* addresses, const uint32_t* bits_at_issue, size_t count, size_t bytes);
}  // namespace yolo::emu

// ---- vector types (16-byte float4 and friends, as the CUDA headers define them) ----------
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- atomics: emulated threads never run at the same time, so plain updates are atomic ----
template <typename T>
inline T __emu_atomic_update(T* address, T value, T (*op)(T, T)) {
  T old = *address;
  *address = op(old, value);
  return old;
}
inline int atomicAdd(int* a, int v) { return __emu_atomic_update<int>(a, v, [](int x, int y) { return int(unsigned(x) + unsigned(y)); }); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __emu_atomic_update<unsigned>(a, v, [](unsigned x, unsigned y) { return x + y; }); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return __emu_atomic_update<unsigned long long>(a, v, [](unsigned long long x, unsigned long long y) { return x + y; });
}
inline float atomicAdd(float* a, float v) { return __emu_atomic_update<float>(a, v, [](float x, float y) { return x + y; }); }
inline double atomicAdd(double* a, double v) { return __emu_atomic_update<double>(a, v, [](double x, double y) { return x + y; }); }
inline int atomicSub(int* a, int v) { return __emu_atomic_update<int>(a, v, [](int x, int y) { return int(unsigned(x) - unsigned(y)); }); }
inline int atomicMax(int* a, int v) { return __emu_atomic_update<int>(a, v, [](int x, int y) { return x > y ? x : y; }); }
inline unsigned atomicMax(unsigned* a, unsigned v) { return __emu_atomic_update<unsigned>(a, v, [](unsigned x, unsigned y) { return x > y ? x : y; }); }
inline int atomicMin(int* a, int v) { return __emu_atomic_update<int>(a, v, [](int x, int y) { return x < y ? x : y; }); }
inline unsigned atomicMin(unsigned* a, unsigned v) { return __emu_atomic_update<unsigned>(a, v, [](unsigned x, unsigned y) { return x < y ? x : y; }); }
inline int atomicExch(int* a, int v) { return __emu_atomic_update<int>(a, v, [](int, int y) { return y; }); }
inline unsigned atomicExch(unsigned* a, unsigned v) { return __emu_atomic_update<unsigned>(a, v, [](unsigned, unsigned y) { return y; }); }
inline float atomicExch(float* a, float v) { return __emu_atomic_update<float>(a, v, [](float, float y) { return y; }); }
template <typename T>
inline T __emu_atomic_cas(T* address, T compare, T value) {
  T old = *address;
  if (old == compare) *address = value;
  return old;
}
inline int atomicCAS(int* a, int c, int v) { return __emu_atomic_cas(a, c, v); }
inline unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { return __emu_atomic_cas(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
  return __emu_atomic_cas(a, c, v);
}
// Devices have no float atomicMax/Min; kernels build them from atomicCAS on the bit pattern.

// ---- math and bit intrinsics -------------------------------------------------------------
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
// The _rn intrinsics are one IEEE operation each, rounded once, as on a GPU, where nvcc never
// fuses them with a neighbour. The host compiler would (GCC contracts a*b + c into an FMA by
// default in C++ wherever the target has one, e.g. -march=native): their results pass through an
// empty asm it cannot see into (an SSE register: the emulation is x86-64 only). __fmaf_rn is a
// true fused multiply-add (std::fma rounds once, with or without FMA hardware).
inline float __emu_rounded(float r) {
  asm("" : "+x"(r));
  return r;
}
inline float __fadd_rn(float a, float b) { return __emu_rounded(a + b); }
inline float __fsub_rn(float a, float b) { return __emu_rounded(a - b); }
inline float __fmul_rn(float a, float b) { return __emu_rounded(a * b); }
inline float __fdiv_rn(float a, float b) { return __emu_rounded(a / b); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }  // NaN -> 0 on a GPU
inline int __float2int_rn(float x) { return int(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <typename T>
inline T __ldg(const T* p) { return *p; }

// ---- launch -------------------------------------------------------------------------------
namespace yolo::emu {
// Binds the arguments as a real launch would (converted to the parameter types, copied once) and
// checks the configuration at once (CUDA reports those errors at the launch), then runs the grid
// in the stream's order (run_on_stream); each thread calls the kernel with its own copies of the
// parameters. An error inside the kernel surfaces at the next synchronisation of its stream.
template <typename... Params, typename... Args>
void launch(const LaunchSite& site, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
  const size_t shared_limit = dynamic_shared_limit(reinterpret_cast<const void*>(kernel));
  validate_launch(site, grid, block, shared_bytes, shared_limit);
  auto bound = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  run_on_stream(stream, site.kernel, [site, kernel, grid, block, shared_bytes, shared_limit, bound] {
    run_grid(site, grid, block, shared_bytes, [&] { std::apply(kernel, *bound); }, shared_limit);
  });
}
}  // namespace yolo::emu
