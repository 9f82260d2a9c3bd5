// The emulation's Hopper twins (declared in emu.h; kernels reach them through kernels/wgmma.cuh):
// mbarriers with phases, arrival and transaction counts; the wgmma queue (ops run at the
// wait_group that covers them); and the generic-to-async proxy fence, checked on every byte the
// async proxy reads. They follow the PTX ISA's sections on mbarrier, on wgmma's
// fence/commit_group/wait_group, and on fence.proxy.async. Where a GPU would compute garbage or
// hang, the emulation throws and says which rule was broken.
#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/emu/device.h"
#include "runtime/emu/emu.h"

namespace yolo::emu {

namespace {

// Happens-before between the block's threads, as vector clocks: a thread's own entry counts its
// releases (mbarrier arrivals); an mbarrier carries the clocks of a phase's arrivals to the
// threads that see the phase complete, and __syncthreads joins every clock. A byte the async
// proxy reads must have been written at a time the reader's clock covers.
using Clock = std::vector<uint32_t>;

void join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

struct ChunkWrite {
  uint32_t writer = 0;  // thread + 1 (0: not written in this block)
  uint32_t time = 0;    // the writer's own clock entry at the write
};

// An mbarrier object's state (PTX ISA "Contents of the mbarrier object"): the expected and
// pending arrival counts, the transaction count, and the current phase (its parity is what
// try_wait.parity tests). Kept beside shared memory, keyed by the object's address.
struct Mbarrier {
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;
  Clock arrivals, completed;  // joined clocks of this phase's arrivals; of the last completed phase
};

struct ThreadWork {
  Clock clock;
  std::vector<std::function<void()>> queued;  // wgmma ops issued, not yet run
  std::vector<size_t> group_ends;             // committed groups: end index into queued
  bool fenced = false;                        // a wgmma.fence since the last wait_group
  std::vector<uint32_t> written_chunks;       // 16-byte chunks written through the generic proxy
};

// The PTX ISA bounds the pending and transaction counts to 2^20 - 1.
constexpr int64_t kMbarrierLimit = (int64_t(1) << 20) - 1;

std::string at(uint32_t address) { return "shared address " + std::to_string(address); }

}  // namespace

struct WarpgroupState {
  std::map<uint32_t, Mbarrier> mbarriers;
  std::vector<ThreadWork> threads;
  std::vector<uint32_t> chunk_writer;  // per 16-byte chunk: writing thread + 1 until it fences, else 0
  std::vector<ChunkWrite> chunk_write; // per 16-byte chunk: its last write (cp.async or TMA)
};

WarpgroupState& block_warpgroup_state() {
  if (WarpgroupState* state = block_warpgroup_state_if_any()) return *state;
  auto* state = new WarpgroupState;
  state->threads.resize(block_thread_count());
  for (size_t t = 0; t < state->threads.size(); ++t) {
    state->threads[t].clock.assign(state->threads.size(), 0);
    state->threads[t].clock[t] = 1;
  }
  adopt_warpgroup_state(state);
  return *state;
}

void destroy_warpgroup_state(WarpgroupState* state) { delete state; }

void join_all_clocks(WarpgroupState& state) {
  Clock all;
  for (const ThreadWork& t : state.threads) join(all, t.clock);
  for (ThreadWork& t : state.threads) t.clock = all;
}

void join_clocks(WarpgroupState& state, const std::vector<unsigned>& ranks) {
  Clock all;
  for (unsigned r : ranks) join(all, state.threads[r].clock);
  for (unsigned r : ranks) state.threads[r].clock = all;
}

void check_thread_exit(WarpgroupState& state) {
  if (!state.threads[thread_rank()].queued.empty())
    throw Error("the thread returned with wgmma operations no wgmma.wait_group covered (their accumulators were "
                "never complete)");
}

// ---- mbarriers -----------------------------------------------------------------------------------

namespace {

Mbarrier& mbarrier_at(uint32_t address, const char* op) {
  if (address % 8 != 0) throw Error(std::string(op) + ": " + at(address) + " is not 8-byte aligned");
  shared_pointer(address, 8);  // throws outside the window
  auto& mbarriers = block_warpgroup_state().mbarriers;
  auto it = mbarriers.find(address);
  if (it == mbarriers.end())
    throw Error(std::string(op) + " on " + at(address) + ", where no mbarrier.init made an mbarrier");
  return it->second;
}

// The phase completes when every expected arrival came and every expected byte landed.
void complete_phase_if_done(Mbarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  ++m.phase;
  m.pending = m.expected;
  m.completed = std::move(m.arrivals);
  m.arrivals.clear();
}

}  // namespace

void mbarrier_init(uint32_t address, uint32_t count) {
  if (count < 1 || count > kMbarrierLimit)
    throw Error("mbarrier.init at " + at(address) + ": count " + std::to_string(count) + " outside 1..2^20-1");
  if (address % 8 != 0) throw Error("mbarrier.init: " + at(address) + " is not 8-byte aligned");
  shared_pointer(address, 8);
  Mbarrier& m = block_warpgroup_state().mbarriers[address];
  m = Mbarrier{count, count, 0, 0, {}, {}};
}

void mbarrier_arrive(uint32_t address, uint32_t tx_bytes) {
  Mbarrier& m = mbarrier_at(address, "mbarrier.arrive");
  m.tx += tx_bytes;
  if (m.tx > kMbarrierLimit)
    throw Error("mbarrier.expect_tx at " + at(address) + ": the transaction count exceeds 2^20-1");
  ThreadWork& mine = block_warpgroup_state().threads[thread_rank()];
  join(m.arrivals, mine.clock);  // a release: what this thread did so far happens before the phase
  ++mine.clock[thread_rank()];
  --m.pending;
  complete_phase_if_done(m);
}

void mbarrier_complete_tx(uint32_t address, uint32_t tx_bytes) {
  Mbarrier& m = mbarrier_at(address, "complete_tx");
  // The copy was issued by this thread: what it did before happens before the phase completes.
  ThreadWork& issuer = block_warpgroup_state().threads[thread_rank()];
  join(m.arrivals, issuer.clock);
  ++issuer.clock[thread_rank()];
  m.tx -= tx_bytes;
  if (m.tx < -kMbarrierLimit)
    throw Error("complete_tx at " + at(address) + ": the transaction count falls below -(2^20-1)");
  complete_phase_if_done(m);
}

// try_wait.parity(P) holds once the phase of parity P is complete: the current phase's parity
// differs from P (so parity 1 holds at once on a fresh mbarrier, in phase 0).
bool mbarrier_try_wait_parity(uint32_t address, uint32_t parity) {
  return (mbarrier_at(address, "mbarrier.try_wait").phase & 1) != (parity & 1);
}

void mbarrier_wait_parity(uint32_t address, uint32_t parity) {
  mbarrier_at(address, "mbarrier.try_wait");
  wait_until([address, parity] { return mbarrier_try_wait_parity(address, parity); },
             "the mbarrier at " + at(address) + " to complete a phase of parity " + std::to_string(parity & 1));
  // An acquire: the last completed phase's arrivals happen before what this thread does next
  // (a wait for an older phase joins more than it must, which can only hide a race).
  join(block_warpgroup_state().threads[thread_rank()].clock, mbarrier_at(address, "mbarrier.try_wait").completed);
}

// ---- the proxy fence -----------------------------------------------------------------------------

void note_generic_shared_write(const void* dst, size_t bytes) {
  WarpgroupState* state = block_warpgroup_state_if_any();
  if (!state || bytes == 0 || !in_dynamic_shared(dst)) return;
  const uint32_t first = shared_address(dst) / 16, last = uint32_t((shared_address(dst) + bytes - 1) / 16);
  if (state->chunk_writer.size() <= last) {
    state->chunk_writer.resize(last + 1, 0);
    state->chunk_write.resize(last + 1);
  }
  ThreadWork& mine = state->threads[thread_rank()];
  for (uint32_t c = first; c <= last; ++c) {
    state->chunk_writer[c] = thread_rank() + 1;
    state->chunk_write[c] = ChunkWrite{thread_rank() + 1, mine.clock[thread_rank()]};
    mine.written_chunks.push_back(c);
  }
}

void note_async_shared_write(const void* dst, size_t bytes) {
  WarpgroupState& state = block_warpgroup_state();
  const uint32_t first = shared_address(dst) / 16, last = uint32_t((shared_address(dst) + bytes - 1) / 16);
  if (state.chunk_writer.size() <= last) {
    state.chunk_writer.resize(last + 1, 0);
    state.chunk_write.resize(last + 1);
  }
  for (uint32_t c = first; c <= last; ++c) {
    state.chunk_writer[c] = 0;
    state.chunk_write[c] = ChunkWrite{thread_rank() + 1, state.threads[thread_rank()].clock[thread_rank()]};
  }
}

void fence_proxy_async() {
  WarpgroupState& state = block_warpgroup_state();
  ThreadWork& mine = state.threads[thread_rank()];
  for (uint32_t c : mine.written_chunks)
    if (state.chunk_writer[c] == thread_rank() + 1) state.chunk_writer[c] = 0;
  mine.written_chunks.clear();
}

const unsigned char* async_proxy_read(uint32_t address, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(shared_pointer(address, bytes));
  const WarpgroupState& state = block_warpgroup_state();
  const Clock& reader = state.threads[thread_rank()].clock;
  for (uint32_t c = address / 16; c <= (address + bytes - 1) / 16 && c < state.chunk_writer.size(); ++c) {
    const ChunkWrite& w = state.chunk_write[c];
    if (w.writer != 0 && w.writer - 1 != thread_rank() && reader[w.writer - 1] < w.time)
      throw Error("the async proxy (wgmma) of thread " + std::to_string(thread_rank()) + " reads " + at(address) +
                  ", written by thread " + std::to_string(w.writer - 1) + " with nothing ordering the write before "
                  "the read (a missing mbarrier wait?)");
    if (state.chunk_writer[c] != 0)
      throw Error("the async proxy (wgmma) reads " + at(address) + ", written through the generic proxy (cp.async or "
                  "a store) by thread " + std::to_string(state.chunk_writer[c] - 1) +
                  " with no fence.proxy.async after it");
  }
  return p;
}

// ---- wgmma ---------------------------------------------------------------------------------------

namespace {

// wgmma's instructions are .sync.aligned: the warp's lanes execute each one together, and every
// lane must (none exited). The second barrier keeps a lane from running on (and exiting) before
// every lane has checked.
void converge(const char* what) {
  require_full_warp(what);
  warp_barrier(0xffffffffu);
  require_full_warp(what);
  warp_barrier(0xffffffffu);
}

}  // namespace

void converge_warp(const char* what) { converge(what); }

void wgmma_fence() {
  converge("wgmma.fence");
  block_warpgroup_state().threads[thread_rank()].fenced = true;
}

void wgmma_queue(std::function<void()> run) {
  converge("wgmma.mma_async");
  WarpgroupState& state = block_warpgroup_state();
  if ((thread_rank() / 128 + 1) * 128 > state.threads.size())
    throw Error("wgmma.mma_async in a warpgroup the block does not fill (warpgroups are 128 threads; the block has " +
                std::to_string(state.threads.size()) + ")");
  ThreadWork& mine = state.threads[thread_rank()];
  if (!mine.fenced)
    throw Error("wgmma.mma_async with no wgmma.fence since the thread's last wgmma.wait_group (the accumulators "
                "may have been written by other instructions)");
  mine.queued.push_back(std::move(run));
}

void wgmma_commit_group() {
  converge("wgmma.commit_group");
  ThreadWork& mine = block_warpgroup_state().threads[thread_rank()];
  mine.group_ends.push_back(mine.queued.size());
}

namespace {
std::atomic<unsigned long long> g_wgmma_ops_run{0};
}  // namespace

unsigned long long wgmma_ops_run() { return g_wgmma_ops_run.load(); }

void wgmma_wait_group(unsigned pending_groups) {
  converge("wgmma.wait_group");
  ThreadWork& mine = block_warpgroup_state().threads[thread_rank()];
  mine.fenced = false;
  if (mine.group_ends.size() <= pending_groups) return;
  const size_t done_groups = mine.group_ends.size() - pending_groups, done = mine.group_ends[done_groups - 1];
  for (size_t i = 0; i < done; ++i) mine.queued[i]();
  g_wgmma_ops_run += done;
  mine.queued.erase(mine.queued.begin(), mine.queued.begin() + ptrdiff_t(done));
  mine.group_ends.erase(mine.group_ends.begin(), mine.group_ends.begin() + ptrdiff_t(done_groups));
  for (size_t& end : mine.group_ends) end -= done;
}

}  // namespace yolo::emu
