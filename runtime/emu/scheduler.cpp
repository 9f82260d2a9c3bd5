// The emulated grid/block scheduler (see scheduler.h).
#include "runtime/emu/scheduler.h"

#include <algorithm>
#include <cfenv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/emu/device.h"
#include "runtime/emu/fiber.h"
#include "runtime/stream_queue.h"

// The built-in variables kernels read; set by the scheduler before each thread resumes.
yolo::emu::uint3 threadIdx, blockIdx;
yolo::emu::dim3 blockDim, gridDim;

namespace yolo::emu {

namespace {

enum class State : uint8_t {
  NotStarted,
  Ready,
  Running,
  AtBlockBarrier,
  AtWarpBarrier,
  AtNamedBarrier,
  AtCondition,
  Done
};

struct ThreadSlot {
  uint3 index;
  State state = State::NotStarted;
  uint32_t warp_mask = 0;  // the mask it waits with, at a warp barrier; the id at a named barrier
  unsigned barrier_count = 0;  // at a named barrier: the threads it completes with ...
  uint64_t arrival = 0;        // ... and when this one arrived (the first `count` arrivals complete it)
  Fiber* fiber = nullptr;
  AsyncCopies copies;      // cp.async copies issued and not yet waited for
  std::function<bool()> ready;  // at a condition (wait_until): what releases it
  std::string waits_for;        // and what it is, for a deadlock report
};

struct AlignedFree {
  void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(1024)); }
};
struct WarpgroupStateFree {
  void operator()(WarpgroupState* s) const { destroy_warpgroup_state(s); }
};

struct BlockRun {
  const LaunchSite* site = nullptr;
  std::vector<ThreadSlot> threads;
  unsigned current = 0;
  unsigned warps = 0;
  std::vector<unsigned char> exchange;        // warps * 32 lanes * 8 bytes
  std::vector<unsigned char> wide;            // warps * 32 lanes * kWideSlotBytes
  // Dynamic shared memory: exactly the bytes asked, at shared address kDynamicSharedBase, that far
  // into a 1024-aligned allocation.
  std::unique_ptr<unsigned char[], AlignedFree> block_shared;
  unsigned char* shared = nullptr;
  std::unique_ptr<WarpgroupState, WarpgroupStateFree> warpgroup;  // mbarriers, wgmma queues (per block)
  size_t shared_bytes = 0;
  std::fenv_t fp_environment;                 // the launching thread's rounding mode etc.
  std::exception_ptr error;
  bool cancelling = false;                    // unwinding suspended threads after an error
  uint64_t arrivals = 0;                      // named-barrier arrivals so far
};

// Thrown at a barrier into threads left suspended by an error, so their stacks unwind (local
// destructors run) and their fibers return to the pool. Never escapes the scheduler.
struct Cancelled {};

std::mutex g_launch_mutex;
BlockRun* g_block = nullptr;  // the block being run (one launch at a time)

[[noreturn]] void launch_error(const LaunchSite& site, const std::string& what) {
  throw Error(std::string(site.file) + ":" + std::to_string(site.line) + ": emulated launch of " +
              site.kernel + ": " + what);
}

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

std::string dims(uint3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::mutex g_shared_mutex;
std::map<std::pair<int, const void*>, size_t> g_shared_opt_in;  // (device, kernel) -> bytes allowed

}  // namespace

void allow_dynamic_shared(const void* kernel, size_t bytes) {
  const int device = current_device_index();
  const DeviceProps props = device < 0 ? preset_for(90) : device_props(device);
  const int cc = props.cc_major * 10 + props.cc_minor;
  const size_t limit = size_t(props.shared_per_block);
  if (bytes > limit)
    throw Error("cudaFuncSetAttribute (emulated): " + std::to_string(bytes) +
                " bytes of dynamic shared memory exceed the " + std::to_string(limit) + " per block of sm_" +
                std::to_string(cc));
  std::lock_guard lock(g_shared_mutex);
  g_shared_opt_in[{device, kernel}] = bytes;
}

size_t dynamic_shared_limit(const void* kernel) {
  std::lock_guard lock(g_shared_mutex);
  auto it = g_shared_opt_in.find({current_device_index(), kernel});
  return it == g_shared_opt_in.end() ? kDefaultSharedLimit : std::max(kDefaultSharedLimit, it->second);
}

void validate_launch(const LaunchSite& site, dim3 grid, dim3 block, size_t shared, size_t shared_limit) {
  // Limits of every GPU we target (compute capability 7.5 and newer).
  uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0)
    launch_error(site, "invalid configuration: grid " + dims(grid) + " block " + dims(block) + " has a zero dimension");
  if (threads > 1024 || block.z > 64)
    launch_error(site, "invalid configuration: block " + dims(block) + " exceeds 1024 threads or z > 64");
  if (grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
    launch_error(site, "invalid configuration: grid " + dims(grid) + " exceeds the grid limits");
  // More than 48 KiB needs a per-kernel opt-in on every GPU (and T4 stops at 64 KiB).
  if (shared > shared_limit)
    launch_error(site, "dynamic shared memory of " + std::to_string(shared) + " bytes exceeds the " +
                           std::to_string(shared_limit) + " available " +
                           (shared_limit > kDefaultSharedLimit ? "by its opt-in" : "without an opt-in"));
}

namespace {

uint32_t lanes_existing(const BlockRun& b, unsigned warp) {
  unsigned first = warp * 32, count = unsigned(b.threads.size()) - first;
  return count >= 32 ? 0xffffffffu : ((1u << count) - 1);
}

// Named barriers (bar.sync id, count) where `count` threads wait: the first `count` to arrive
// are released together (a later arrival waits for the barrier's next completion, as on a GPU),
// their work before it happening before what each does after it. Returns whether any was.
bool release_named_barriers(BlockRun& b) {
  // One pass to count the waiters at each id and their count (asked whenever no thread can run:
  // a barrier still filling costs no more than that).
  unsigned waiting_at[kNamedBarriers] = {}, count_at[kNamedBarriers] = {};
  for (const ThreadSlot& t : b.threads)
    if (t.state == State::AtNamedBarrier) ++waiting_at[t.warp_mask], count_at[t.warp_mask] = t.barrier_count;
  bool released = false;
  for (unsigned id = 1; id < kNamedBarriers; ++id) {
    if (waiting_at[id] == 0 || waiting_at[id] < count_at[id]) continue;
    std::vector<unsigned> waiting;
    for (unsigned i = 0; i < b.threads.size(); ++i)
      if (b.threads[i].state == State::AtNamedBarrier && b.threads[i].warp_mask == id) waiting.push_back(i);
    std::sort(waiting.begin(), waiting.end(),
              [&](unsigned x, unsigned y) { return b.threads[x].arrival < b.threads[y].arrival; });
    waiting.resize(count_at[id]);
    if (b.warpgroup) join_clocks(*b.warpgroup, waiting);
    for (unsigned i : waiting) b.threads[i].state = State::Ready;
    released = true;
  }
  return released;
}

// Releases threads whose barrier is complete; returns false when none could be released.
// A warp barrier completes for the lanes waiting with mask M when every lane of M that exists
// and has not exited waits with exactly M (PTX: the same membermask); exited lanes drop out,
// as on sm_70 and newer.
bool release_barriers(BlockRun& b) {
  bool released = false;
  for (unsigned w = 0; w < b.warps; ++w) {
    ThreadSlot* lanes = &b.threads[size_t(w) * 32];
    uint32_t existing = lanes_existing(b, w), live = 0;
    for (unsigned lane = 0; lane < 32; ++lane)
      if ((existing >> lane & 1) && lanes[lane].state != State::Done) live |= 1u << lane;
    uint32_t release = 0;
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (!(live >> lane & 1) || lanes[lane].state != State::AtWarpBarrier) continue;
      uint32_t mask = lanes[lane].warp_mask, needed = mask & live;
      bool complete = true;
      for (unsigned other = 0; other < 32 && complete; ++other)
        if (needed >> other & 1)
          complete = lanes[other].state == State::AtWarpBarrier && lanes[other].warp_mask == mask;
      if (complete) release |= needed;
    }
    for (unsigned lane = 0; lane < 32; ++lane)
      if (release >> lane & 1) lanes[lane].state = State::Ready;
    released = released || release != 0;
  }
  for (ThreadSlot& t : b.threads)
    if (t.state == State::AtCondition && t.ready()) {
      t.state = State::Ready;
      released = true;
    }
  released = release_named_barriers(b) || released;
  if (released) return true;
  bool all_at_block = true, any_at_block = false;
  for (const ThreadSlot& t : b.threads) {
    if (t.state == State::AtBlockBarrier) any_at_block = true;
    else if (t.state != State::Done) all_at_block = false;
  }
  if (!any_at_block || !all_at_block) return false;
  if (b.warpgroup) join_all_clocks(*b.warpgroup);
  for (ThreadSlot& t : b.threads)
    if (t.state == State::AtBlockBarrier) t.state = State::Ready;
  return true;
}

// What each group of stuck threads waits at: one example thread per (barrier, mask).
std::string describe_stuck(const BlockRun& b) {
  std::map<std::pair<int, uint32_t>, std::pair<uint3, int>> groups;
  std::map<std::string, int> conditions;
  for (const ThreadSlot& t : b.threads) {
    if (t.state == State::Done) continue;
    if (t.state == State::AtCondition) {
      conditions[t.waits_for] += 1;
      continue;
    }
    const bool keyed = t.state == State::AtWarpBarrier || t.state == State::AtNamedBarrier;
    auto key = std::make_pair(int(t.state), keyed ? t.warp_mask : 0u);
    auto [it, inserted] = groups.try_emplace(key, t.index, 0);
    ++it->second.second;
  }
  std::string detail;
  for (const auto& [what, count] : conditions) detail += " " + std::to_string(count) + " thread(s) wait for " + what + ";";
  for (const auto& [key, example] : groups)
    detail += " " + std::to_string(example.second) + " thread(s) such as " + dims(example.first) +
              (key.first == int(State::AtBlockBarrier)   ? " wait at __syncthreads;"
               : key.first == int(State::AtNamedBarrier) ? " wait at named barrier " + std::to_string(key.second) + ";"
                                                         : " wait at a warp operation with mask 0x" + hex(key.second) + ";");
  return detail;
}

void resume(BlockRun& b, unsigned i) {
  ThreadSlot& t = b.threads[i];
  t.state = State::Running;
  b.current = i;
  threadIdx = t.index;
  t.fiber->resume();
  if (t.fiber->finished()) {
    t.state = State::Done;
    fiber_pool().release(t.fiber);
    t.fiber = nullptr;
  }
}

// After an error: resumes every suspended thread with `cancelling` set, so each barrier call
// throws Cancelled and the thread unwinds back to its fiber's body.
void cancel_suspended(BlockRun& b) {
  b.cancelling = true;
  for (unsigned i = 0; i < b.threads.size(); ++i)
    if (b.threads[i].fiber && b.threads[i].state != State::Done) resume(b, i);
  b.cancelling = false;
}

[[noreturn]] void rethrow_with_context(BlockRun& b, unsigned thread) {
  std::string what;
  try {
    std::rethrow_exception(b.error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "a non-standard exception";
  }
  launch_error(*b.site, "thread " + dims(b.threads[thread].index) + " of block " + dims(blockIdx) + " threw: " + what);
}

void run_block(BlockRun& b, const std::function<void()>& kernel_call) {
  for (ThreadSlot& t : b.threads) {
    t.state = State::NotStarted;
    t.fiber = nullptr;
    t.copies = AsyncCopies{};  // copies a thread never waited for are dropped (never seen on a GPU either)
  }
  // Shared memory is uninitialised on a GPU: fill it with NaN bytes so kernels that read before
  // writing show it in their results.
  if (b.shared_bytes) std::memset(b.shared, 0xff, b.shared_bytes);
  b.warpgroup.reset();
  std::function<void()> body = [&b, &kernel_call] {
    std::fesetenv(&b.fp_environment);  // a pooled fiber must not keep an older FP environment
    try {
      kernel_call();
      if (b.warpgroup) check_thread_exit(*b.warpgroup);
    } catch (const Cancelled&) {
    } catch (...) {
      if (!b.error) b.error = std::current_exception();
    }
  };
  size_t remaining = b.threads.size();
  while (remaining > 0) {
    for (unsigned i = 0; i < b.threads.size(); ++i) {
      ThreadSlot& t = b.threads[i];
      if (t.state == State::NotStarted) {
        t.fiber = fiber_pool().acquire();
        t.fiber->assign(&body);
      } else if (t.state != State::Ready) {
        continue;
      }
      resume(b, i);
      if (t.state == State::Done) --remaining;
      if (b.error) {
        cancel_suspended(b);
        rethrow_with_context(b, i);
      }
    }
    if (remaining > 0 && !release_barriers(b)) {
      std::string stuck = describe_stuck(b);
      cancel_suspended(b);
      launch_error(*b.site, "block " + dims(blockIdx) + " can never pass its barriers:" + stuck +
                                " (divergent __syncthreads, or warp operations whose masks differ)");
    }
  }
}

void suspend_at(State state, uint32_t mask) {
  ThreadSlot& t = g_block->threads[g_block->current];
  t.state = state;
  t.warp_mask = mask;
  Fiber::suspend();
  // Resumed by the scheduler, which set threadIdx and current back to this thread.
  if (g_block->cancelling) throw Cancelled{};
}

}  // namespace

void run_grid(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& body, size_t shared_limit) {
  validate_launch(site, grid, block, dynamic_shared_bytes, shared_limit);
  std::lock_guard lock(g_launch_mutex);
  BlockRun b;
  b.site = &site;
  std::fegetenv(&b.fp_environment);
  b.threads.resize(size_t(block.x) * block.y * block.z);
  for (unsigned z = 0, i = 0; z < block.z; ++z)
    for (unsigned y = 0; y < block.y; ++y)
      for (unsigned x = 0; x < block.x; ++x) b.threads[i++].index = {x, y, z};
  b.warps = unsigned((b.threads.size() + 31) / 32);
  b.exchange.assign(size_t(b.warps) * 32 * 8, 0);
  b.wide.assign(size_t(b.warps) * 32 * kWideSlotBytes, 0);
  b.shared_bytes = dynamic_shared_bytes;
  if (dynamic_shared_bytes) {
    b.block_shared.reset(static_cast<unsigned char*>(
        ::operator new[](kDynamicSharedBase + dynamic_shared_bytes, std::align_val_t(1024))));
    b.shared = b.block_shared.get() + kDynamicSharedBase;
  }
  blockDim = block;
  gridDim = grid;
  g_block = &b;
  struct Reset {
    ~Reset() { g_block = nullptr; }
  } reset;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        run_block(b, body);
      }
}

void run_on_stream(CUstream_st* stream, const char* what, std::function<void()> work) {
  if (!stream) {
    DeviceAccess access;
    work();
    return;
  }
  StreamQueue* queue = reinterpret_cast<StreamQueue*>(stream);
  const int device = queue->emulated_device();
  queue->push([device, what, work = std::move(work)] {
    count_kernel_launch(device, what);
    DeviceAccess access;
    work();
  });
}

void block_barrier() { suspend_at(State::AtBlockBarrier, 0); }

void named_barrier(unsigned id, unsigned count) {
  BlockRun& b = *g_block;
  const std::string where = "thread " + dims(threadIdx) + " of block " + dims(blockIdx) + ": bar.sync " +
                            std::to_string(id) + ", " + std::to_string(count) + ": ";
  if (id == 0 || id >= kNamedBarriers)
    launch_error(*b.site, where + "named barriers are 1..15 (0 is __syncthreads's)");
  if (count == 0 || count % 32 != 0 || count > b.threads.size())
    launch_error(*b.site, where + "the count must be whole warps, at most the block's " +
                              std::to_string(b.threads.size()) + " threads");
  for (const ThreadSlot& t : b.threads)
    if (t.state == State::AtNamedBarrier && t.warp_mask == id && t.barrier_count != count)
      launch_error(*b.site, where + "other threads wait there with a count of " + std::to_string(t.barrier_count));
  b.threads[b.current].barrier_count = count;
  b.threads[b.current].arrival = b.arrivals++;
  suspend_at(State::AtNamedBarrier, id);
}

void warp_barrier(uint32_t mask) {
  unsigned lane = g_block->current % 32;
  if (!(mask >> lane & 1))
    launch_error(*g_block->site, "thread " + dims(threadIdx) + " of block " + dims(blockIdx) +
                                     ": warp operation with mask 0x" + hex(mask) +
                                     " that leaves out the calling lane: undefined on a GPU");
  suspend_at(State::AtWarpBarrier, mask);
}

unsigned lane_id() { return g_block->current % 32; }

uint32_t live_lanes() {
  unsigned warp = g_block->current / 32;
  uint32_t live = 0;
  for (unsigned lane = 0; lane < 32 && warp * 32 + lane < g_block->threads.size(); ++lane)
    if (g_block->threads[warp * 32 + lane].state != State::Done) live |= 1u << lane;
  return live;
}

unsigned char* warp_wide_slot(unsigned lane) {
  unsigned warp = g_block->current / 32;
  return &g_block->wide[(size_t(warp) * 32 + lane) * kWideSlotBytes];
}

AsyncCopies& thread_async_copies() { return g_block->threads[g_block->current].copies; }

unsigned char* warp_exchange_slot(unsigned lane) {
  unsigned warp = g_block->current / 32;
  return &g_block->exchange[(size_t(warp) * 32 + lane) * 8];
}

void* dynamic_shared_memory() { return g_block->shared; }
size_t dynamic_shared_size() { return g_block->shared_bytes; }

unsigned thread_rank() { return g_block->current; }

void wait_until(std::function<bool()> ready, std::string what) {
  if (ready()) return;
  ThreadSlot& t = g_block->threads[g_block->current];
  t.ready = std::move(ready);
  t.waits_for = std::move(what);
  suspend_at(State::AtCondition, 0);
  t.ready = nullptr;
}

uint32_t shared_address(const void* p) {
  const auto* byte = static_cast<const unsigned char*>(p);
  const unsigned char* base = g_block->shared;
  if (!base || byte < base || byte >= base + g_block->shared_bytes)
    launch_error(*g_block->site, "thread " + dims(threadIdx) + ": a shared-state-space address of a pointer outside "
                                     "the block's dynamic shared memory (the emulation gives addresses to "
                                     "DYNAMIC_SHARED memory only)");
  return kDynamicSharedBase + uint32_t(byte - base);
}

void* shared_pointer(uint32_t address, size_t bytes) {
  if (address < kDynamicSharedBase || size_t(address - kDynamicSharedBase) + bytes > g_block->shared_bytes)
    launch_error(*g_block->site, "thread " + dims(threadIdx) + ": shared address " + std::to_string(address) + " + " +
                                     std::to_string(bytes) + " bytes lies outside the block's " +
                                     std::to_string(g_block->shared_bytes) + " bytes of dynamic shared memory (from " +
                                     std::to_string(kDynamicSharedBase) + ")");
  return g_block->shared + (address - kDynamicSharedBase);
}

bool in_dynamic_shared(const void* p) {
  const auto* byte = static_cast<const unsigned char*>(p);
  const unsigned char* base = g_block->shared;
  return base && byte >= base && byte < base + g_block->shared_bytes;
}

WarpgroupState* block_warpgroup_state_if_any() { return g_block->warpgroup.get(); }
void adopt_warpgroup_state(WarpgroupState* state) { g_block->warpgroup.reset(state); }
size_t block_thread_count() { return g_block->threads.size(); }

void check_shuffle_width(int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    launch_error(*g_block->site, "thread " + dims(threadIdx) + ": shuffle width " + std::to_string(width) +
                                     " is not a power of two in 1..32");
}

}  // namespace yolo::emu
