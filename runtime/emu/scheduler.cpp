// The emulated grid/block scheduler (see scheduler.h).
#include "runtime/emu/scheduler.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/emu/fiber.h"

// The built-in variables kernels read; set by the scheduler before each thread resumes.
yolo::emu::uint3 threadIdx, blockIdx;
yolo::emu::dim3 blockDim, gridDim;

namespace yolo::emu {

namespace {

enum class State : uint8_t { NotStarted, Ready, Running, AtBlockBarrier, AtWarpBarrier, Done };

struct ThreadSlot {
  uint3 index;
  State state = State::NotStarted;
  uint32_t warp_mask = 0;  // the mask it waits with, at a warp barrier
  Fiber* fiber = nullptr;
};

struct BlockRun {
  const LaunchSite* site = nullptr;
  std::vector<ThreadSlot> threads;
  unsigned current = 0;
  unsigned warps = 0;
  std::vector<unsigned char> exchange;        // warps * 32 lanes * 8 bytes
  std::unique_ptr<unsigned char[]> shared;    // dynamic shared memory, exactly the bytes asked
  size_t shared_bytes = 0;
  std::exception_ptr error;
};

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

void validate(const LaunchSite& site, dim3 grid, dim3 block, size_t shared) {
  // Limits of every GPU we target (compute capability 7.5 and newer).
  uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0)
    launch_error(site, "invalid configuration: grid " + dims(grid) + " block " + dims(block) + " has a zero dimension");
  if (threads > 1024 || block.z > 64)
    launch_error(site, "invalid configuration: block " + dims(block) + " exceeds 1024 threads or z > 64");
  if (grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
    launch_error(site, "invalid configuration: grid " + dims(grid) + " exceeds the grid limits");
  if (shared > 227 * 1024)
    launch_error(site, "dynamic shared memory of " + std::to_string(shared) + " bytes exceeds 227 KiB");
}

uint32_t lanes_existing(const BlockRun& b, unsigned warp) {
  unsigned first = warp * 32, count = unsigned(b.threads.size()) - first;
  return count >= 32 ? 0xffffffffu : ((1u << count) - 1);
}

// Releases threads whose barrier is complete; returns false when none could be released.
bool release_barriers(BlockRun& b) {
  bool released = false;
  for (unsigned w = 0; w < b.warps; ++w) {
    uint32_t waiting = 0, needed = 0;
    for (unsigned lane = 0; lane < 32 && w * 32 + lane < b.threads.size(); ++lane) {
      const ThreadSlot& t = b.threads[w * 32 + lane];
      if (t.state == State::AtWarpBarrier) {
        waiting |= 1u << lane;
        needed |= t.warp_mask;
      }
    }
    // A lane named in a mask that has exited can never arrive: that is a deadlock (reported),
    // as it would hang or misbehave on a GPU.
    if (waiting && (needed & ~waiting) == 0) {
      for (unsigned lane = 0; lane < 32; ++lane)
        if (waiting >> lane & 1) b.threads[w * 32 + lane].state = State::Ready;
      released = true;
    }
  }
  if (released) return true;
  bool all_at_block = true, any_at_block = false;
  for (const ThreadSlot& t : b.threads) {
    if (t.state == State::AtBlockBarrier) any_at_block = true;
    else if (t.state != State::Done) all_at_block = false;
  }
  if (!any_at_block || !all_at_block) return false;
  for (ThreadSlot& t : b.threads)
    if (t.state == State::AtBlockBarrier) t.state = State::Ready;
  return true;
}

[[noreturn]] void deadlock(const BlockRun& b) {
  std::string detail;
  int shown = 0;
  for (const ThreadSlot& t : b.threads) {
    if (t.state == State::Done || shown == 4) continue;
    ++shown;
    detail += " thread " + dims(t.index) +
              (t.state == State::AtBlockBarrier ? " waits at __syncthreads;"
                                                : " waits at a warp operation (mask 0x" +
                                                      hex(t.warp_mask) + ");");
  }
  launch_error(*b.site, "block " + dims(blockIdx) + " can never pass its barriers:" + detail +
                            " (divergent __syncthreads, or a warp mask naming lanes that exited or wait elsewhere)");
}

// Abandons the fibers still suspended inside the kernel after an error.
void abandon(BlockRun& b) {
  for (ThreadSlot& t : b.threads)
    if (t.fiber && t.state != State::Done) fiber_pool().discard(t.fiber);
}

void run_block(BlockRun& b, const std::function<void()>& kernel_call) {
  for (ThreadSlot& t : b.threads) {
    t.state = State::NotStarted;
    t.fiber = nullptr;
  }
  // Shared memory is uninitialised on a GPU: fill it with NaN bytes so kernels that read before
  // writing show it in their results.
  if (b.shared_bytes) std::memset(b.shared.get(), 0xff, b.shared_bytes);
  std::function<void()> body = [&b, &kernel_call] {
    try {
      kernel_call();
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
      t.state = State::Running;
      b.current = i;
      threadIdx = t.index;
      t.fiber->resume();
      if (t.fiber->finished()) {
        t.state = State::Done;
        fiber_pool().release(t.fiber);
        --remaining;
      }
      if (b.error) {
        abandon(b);
        std::rethrow_exception(b.error);
      }
    }
    if (remaining > 0 && !release_barriers(b)) {
      abandon(b);
      deadlock(b);
    }
  }
}

}  // namespace

void run_grid(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& body) {
  validate(site, grid, block, dynamic_shared_bytes);
  std::lock_guard lock(g_launch_mutex);
  BlockRun b;
  b.site = &site;
  b.threads.resize(size_t(block.x) * block.y * block.z);
  for (unsigned z = 0, i = 0; z < block.z; ++z)
    for (unsigned y = 0; y < block.y; ++y)
      for (unsigned x = 0; x < block.x; ++x) b.threads[i++].index = {x, y, z};
  b.warps = unsigned((b.threads.size() + 31) / 32);
  b.exchange.assign(size_t(b.warps) * 32 * 8, 0);
  b.shared_bytes = dynamic_shared_bytes;
  if (dynamic_shared_bytes) b.shared.reset(new unsigned char[dynamic_shared_bytes]);
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

static void suspend_at(State state, uint32_t mask) {
  ThreadSlot& t = g_block->threads[g_block->current];
  t.state = state;
  t.warp_mask = mask;
  Fiber::suspend();
  // Resumed by the scheduler, which set threadIdx and current back to this thread.
}

void block_barrier() { suspend_at(State::AtBlockBarrier, 0); }
void warp_barrier(uint32_t mask) {
  unsigned warp = g_block->current / 32, lane = g_block->current % 32;
  uint32_t existing = lanes_existing(*g_block, warp);
  if (!(mask >> lane & 1) || (mask & ~existing))
    launch_error(*g_block->site, "thread " + dims(threadIdx) + " of block " + dims(blockIdx) +
                                     ": warp operation with mask 0x" + hex(mask) +
                                     (!(mask >> lane & 1) ? " that leaves out the calling lane"
                                                          : " naming lanes that do not exist (lanes 0x" +
                                                                hex(existing) + " exist in this warp)") +
                                     ": undefined on a GPU");
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

unsigned char* warp_exchange_slot(unsigned lane) {
  unsigned warp = g_block->current / 32;
  return &g_block->exchange[(size_t(warp) * 32 + lane) * 8];
}

void* dynamic_shared_memory() { return g_block->shared.get(); }

}  // namespace yolo::emu
