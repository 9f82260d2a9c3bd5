// The emulation's Hopper twins (declared in emu.h; kernels reach them through kernels/wgmma.cuh):
// mbarriers with phases, arrival and transaction counts, living in their 8 bytes of shared memory;
// the wgmma queue (operands read at issue, the arithmetic at the wait_group that covers it); and
// the generic-to-async proxy fence, checked on every byte the async proxy reads. They follow the
// PTX ISA's sections on mbarrier, on wgmma's fence/commit_group/wait_group, on fence.proxy.async
// and fence.mbarrier_init. Where a GPU would compute garbage or hang, the emulation throws and
// says which rule was broken; where the ISA leaves a GPU freedom (when wgmma reads its operands,
// what a TMA completion publishes), it takes the choice that exposes a kernel relying on luck.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/emu/device.h"
#include "runtime/emu/emu.h"

namespace yolo::emu {

namespace {

// Happens-before between the block's threads, as vector clocks: a thread's own entry counts its
// releases (mbarrier arrivals, fences); an mbarrier carries the clocks of a phase's arrivals to the
// threads that see the phase complete, and __syncthreads joins every clock. Each mbarrier also has
// an entry of its own past the threads' (Mbarrier::component): the async proxy's writes that
// complete its transactions (TMA boxes), so a box is published by the phase it completes and by
// nothing else. A byte the async proxy reads must have been written at a time the reader's clock
// covers.
using Clock = std::vector<uint32_t>;

void join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

uint32_t entry(const Clock& c, size_t i) { return i < c.size() ? c[i] : 0; }

struct ChunkWrite {
  uint32_t writer = 0;  // clock entry + 1 (a thread, or an mbarrier's TMA completions); 0: not written
  uint32_t time = 0;    // that entry's value at the write
};

// An mbarrier object's state (PTX ISA "Contents of the mbarrier object"): the expected and
// pending arrival counts, the transaction count, and the current phase (its parity is what
// try_wait.parity tests). The state is written to the object's 8 bytes of shared memory after
// every operation (encoded below) and kept here too, keyed by the address, with what the
// emulation checks: the clocks, who initialised it and whether that was fenced, and the bytes the
// last operation left (anything else writing there is reported at the barrier's next use).
struct Mbarrier {
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;
  Clock arrivals, completed;    // joined clocks of this phase's arrivals; of the last completed phase
  uint64_t bits = 0;            // its 8 bytes as the last mbarrier operation left them
  unsigned init_thread = 0;     // the thread that ran mbarrier.init
  uint32_t init_time = 0;       // that thread's clock entry at the init
  uint32_t init_fenced = 0;     // ... at the fence that made the init visible to the async proxy (0: none)
  unsigned component = 0;       // its clock entry for the TMA bytes that complete its transactions
  uint32_t async_time = 0;      // how many such completions so far
};

struct ThreadWork {
  Clock clock;
  std::vector<std::function<void()>> queued;  // wgmma ops issued, not yet run
  std::vector<size_t> group_ends;             // committed groups: end index into queued
  bool fenced = false;                        // a wgmma.fence since the last wait_group
  std::vector<uint32_t> written_chunks;       // 16-byte chunks written through the generic proxy
  std::vector<uint32_t> unfenced_inits;       // mbarriers it initialised and has not fenced since
};

// The PTX ISA bounds the pending and transaction counts to 2^20 - 1.
constexpr int64_t kMbarrierLimit = (int64_t(1) << 20) - 1;

std::string at(uint32_t address) { return "shared address " + std::to_string(address); }

// The state in the object's 8 bytes: pending and expected counts (20 bits each), the transaction
// count (21 bits, two's complement), the phase's parity (bit 63). The ISA leaves the layout opaque;
// this one only has to change whenever the state does.
uint64_t encode(const Mbarrier& m) {
  return uint64_t(m.pending) | uint64_t(m.expected) << 20 | (uint64_t(m.tx) & 0x1fffff) << 40 | (m.phase & 1) << 63;
}

}  // namespace

struct WarpgroupState {
  std::map<uint32_t, Mbarrier> mbarriers;
  std::vector<ThreadWork> threads;
  std::vector<uint32_t> component_barrier;  // mbarrier clock entries (past the threads'): their addresses
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

// The mbarrier at `address` for operation `op`: one mbarrier.init made, whose 8 bytes nothing but
// mbarrier operations have written since.
Mbarrier& mbarrier_at(uint32_t address, const std::string& op) {
  if (address % 8 != 0) throw Error(op + ": " + at(address) + " is not 8-byte aligned");
  const void* bytes = shared_pointer(address, 8);  // throws outside the window
  auto& mbarriers = block_warpgroup_state().mbarriers;
  auto it = mbarriers.find(address);
  if (it == mbarriers.end()) throw Error(op + " on " + at(address) + ", where no mbarrier.init made an mbarrier");
  if (std::memcmp(bytes, &it->second.bits, 8) != 0)
    throw Error(op + " on the mbarrier at " + at(address) + ", whose 8 bytes were overwritten since its last mbarrier "
                "operation (a store, a cp.async or a TMA box over them): on a GPU its phase and counts are now "
                "garbage");
  return it->second;
}

void store(uint32_t address, Mbarrier& m) {
  m.bits = encode(m);
  std::memcpy(shared_pointer(address, 8), &m.bits, 8);
}

// A thread other than the initialising one may use the mbarrier only once the init is ordered
// before (a __syncthreads after it, typically).
void require_init_seen(const Mbarrier& m, uint32_t address, const char* op) {
  const unsigned me = thread_rank();
  if (me != m.init_thread && entry(block_warpgroup_state().threads[me].clock, m.init_thread) < m.init_time)
    throw Error(std::string(op) + " by thread " + std::to_string(me) + " on the mbarrier at " + at(address) +
                " before its mbarrier.init (thread " + std::to_string(m.init_thread) +
                ") is ordered before it (a __syncthreads after the init?)");
}

// The phase completes when every expected arrival came and every expected byte landed.
void complete_phase_if_done(Mbarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  ++m.phase;
  m.pending = m.expected;
  m.completed = std::move(m.arrivals);
  m.arrivals.clear();
}

// What fence.proxy.async and fence.mbarrier_init do for the thread's earlier mbarrier.inits: the
// async proxy may use those mbarriers once the fence is ordered before it (a later event of the
// thread's, hence the clock's step).
void publish_inits(WarpgroupState& state) {
  ThreadWork& mine = state.threads[thread_rank()];
  if (mine.unfenced_inits.empty()) return;
  const uint32_t now = ++mine.clock[thread_rank()];
  for (uint32_t address : mine.unfenced_inits)
    if (auto it = state.mbarriers.find(address); it != state.mbarriers.end()) it->second.init_fenced = now;
  mine.unfenced_inits.clear();
}

}  // namespace

void mbarrier_init(uint32_t address, uint32_t count) {
  if (count < 1 || count > kMbarrierLimit)
    throw Error("mbarrier.init at " + at(address) + ": count " + std::to_string(count) + " outside 1..2^20-1");
  if (address % 8 != 0) throw Error("mbarrier.init: " + at(address) + " is not 8-byte aligned");
  shared_pointer(address, 8);
  WarpgroupState& state = block_warpgroup_state();
  ThreadWork& mine = state.threads[thread_rank()];
  auto [it, fresh] = state.mbarriers.try_emplace(address);
  Mbarrier& m = it->second;
  const unsigned component = fresh ? unsigned(state.threads.size() + state.component_barrier.size()) : m.component;
  if (fresh) state.component_barrier.push_back(address);
  m = Mbarrier{};
  m.expected = m.pending = count;
  m.init_thread = thread_rank();
  m.init_time = ++mine.clock[thread_rank()];
  m.component = component;
  mine.unfenced_inits.push_back(address);
  store(address, m);
}

void mbarrier_arrive(uint32_t address, uint32_t tx_bytes) {
  Mbarrier& m = mbarrier_at(address, "mbarrier.arrive");
  require_init_seen(m, address, "mbarrier.arrive");
  m.tx += tx_bytes;
  if (m.tx > kMbarrierLimit)
    throw Error("mbarrier.expect_tx at " + at(address) + ": the transaction count exceeds 2^20-1");
  ThreadWork& mine = block_warpgroup_state().threads[thread_rank()];
  join(m.arrivals, mine.clock);  // a release: what this thread did so far happens before the phase
  ++mine.clock[thread_rank()];
  --m.pending;
  complete_phase_if_done(m);
  store(address, m);
}

// `bytes` at `dst` written by the async proxy (a TMA copy issued by this thread), completing the
// transactions of the mbarrier at `bar`.
void async_copy_landed(const void* dst, size_t bytes, uint32_t bar) {
  WarpgroupState& state = block_warpgroup_state();
  Mbarrier& m = mbarrier_at(bar, "complete_tx");
  const unsigned issuer = thread_rank();
  if (m.init_fenced == 0 ||
      (issuer != m.init_thread && entry(state.threads[issuer].clock, m.init_thread) < m.init_fenced))
    throw Error("a TMA copy completes transactions on the mbarrier at " + at(bar) + ", whose mbarrier.init (thread " +
                std::to_string(m.init_thread) + ") was not made visible to the async proxy before the copy: " +
                (m.init_fenced == 0 ? "no fence.mbarrier_init (or fence.proxy.async) after the init"
                                    : "the fence after the init is not ordered before the copy"));
  // The bytes: written by the mbarrier's own clock entry, at its next completion.
  const uint32_t time = ++m.async_time;
  const uint32_t first = shared_address(dst) / 16, last = uint32_t((shared_address(dst) + bytes - 1) / 16);
  if (state.chunk_writer.size() <= last) {
    state.chunk_writer.resize(last + 1, 0);
    state.chunk_write.resize(last + 1);
  }
  for (uint32_t c = first; c <= last; ++c) {
    state.chunk_writer[c] = 0;  // the async proxy's own write: no proxy fence needed
    state.chunk_write[c] = ChunkWrite{m.component + 1, time};
  }
  // Only these bytes happen before the phase's completion, not what the issuing thread did before.
  if (m.arrivals.size() <= m.component) m.arrivals.resize(m.component + 1, 0);
  m.arrivals[m.component] = time;
  m.tx -= int64_t(bytes);
  if (m.tx < -kMbarrierLimit)
    throw Error("complete_tx at " + at(bar) + ": the transaction count falls below -(2^20-1)");
  complete_phase_if_done(m);
  store(bar, m);
}

// try_wait.parity(P) holds once the phase of parity P is complete: the current phase's parity
// differs from P (so parity 1 holds at once on a fresh mbarrier, in phase 0).
bool mbarrier_try_wait_parity(uint32_t address, uint32_t parity) {
  return (mbarrier_at(address, "mbarrier.try_wait").phase & 1) != (parity & 1);
}

void mbarrier_wait_parity(uint32_t address, uint32_t parity) {
  require_init_seen(mbarrier_at(address, "mbarrier.try_wait"), address, "mbarrier.try_wait");
  wait_until([address, parity] { return mbarrier_try_wait_parity(address, parity); },
             "the mbarrier at " + at(address) + " to complete a phase of parity " + std::to_string(parity & 1));
  // An acquire: the last completed phase's arrivals happen before what this thread does next
  // (a wait for an older phase joins more than it must, which can only hide a race).
  join(block_warpgroup_state().threads[thread_rank()].clock, mbarrier_at(address, "mbarrier.try_wait").completed);
}

// ---- the proxy fences ----------------------------------------------------------------------------

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

void fence_proxy_async() {
  WarpgroupState& state = block_warpgroup_state();
  ThreadWork& mine = state.threads[thread_rank()];
  for (uint32_t c : mine.written_chunks)
    if (state.chunk_writer[c] == thread_rank() + 1) state.chunk_writer[c] = 0;
  mine.written_chunks.clear();
  publish_inits(state);  // the Programming Guide's TMA example fences its mbarrier.init this way
}

void fence_mbarrier_init() { publish_inits(block_warpgroup_state()); }

namespace {

// Whether reader `me` (its clock `reader`) may read 16-byte chunk c, at `address`, through the
// async proxy: throws where nothing orders its last write before the read, or where its generic
// writer has not fenced it.
void check_async_read(const WarpgroupState& state, const Clock& reader, unsigned me, uint32_t c, uint32_t address) {
  if (c >= state.chunk_writer.size()) return;
  const ChunkWrite& w = state.chunk_write[c];
  if (w.writer != 0 && w.writer - 1 != me && entry(reader, w.writer - 1) < w.time) {
    const size_t threads = state.threads.size();
    const std::string writer = w.writer - 1 < threads ? "thread " + std::to_string(w.writer - 1)
                                                      : "a TMA copy completing the mbarrier at " +
                                                            at(state.component_barrier[w.writer - 1 - threads]);
    throw Error("the async proxy (wgmma) of thread " + std::to_string(me) + " reads " + at(address) + ", written by " +
                writer + " with nothing ordering the write before the read (a missing mbarrier wait?)");
  }
  if (state.chunk_writer[c] != 0)
    throw Error("the async proxy (wgmma) reads " + at(address) + ", written through the generic proxy (cp.async or "
                "a store) by thread " + std::to_string(state.chunk_writer[c] - 1) +
                " with no fence.proxy.async after it");
}

// The dynamic shared memory's bytes, read as the twins read operand elements.
struct Window {
  const unsigned char* base = static_cast<const unsigned char*>(dynamic_shared_memory());
  size_t size = dynamic_shared_size();
  // The element of `bytes` (2 or 4) at `address`, or the shared_pointer error outside the window.
  uint32_t element(uint32_t address, size_t bytes) const {
    if (address < kDynamicSharedBase || size_t(address - kDynamicSharedBase) + bytes > size)
      shared_pointer(address, bytes);  // throws
    const unsigned char* p = base + (address - kDynamicSharedBase);
    if (bytes == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
};

}  // namespace

void async_proxy_read_elements(const uint32_t* addresses, uint32_t* bits, size_t count, size_t bytes) {
  const WarpgroupState& state = block_warpgroup_state();
  const unsigned me = thread_rank();
  const Clock& reader = state.threads[me].clock;
  const Window window;
  for (size_t i = 0; i < count; ++i) {
    if (addresses[i] % bytes != 0)
      throw Error("the async proxy reads " + at(addresses[i]) + ", not aligned to its element");
    check_async_read(state, reader, me, addresses[i] / 16, addresses[i]);  // an aligned element lies in one chunk
    bits[i] = window.element(addresses[i], bytes);
  }
}

void check_operands_unchanged(const uint32_t* addresses, const uint32_t* bits_at_issue, size_t count, size_t bytes) {
  const Window window;
  for (size_t i = 0; i < count; ++i)
    if (window.element(addresses[i], bytes) != bits_at_issue[i])
      throw Error("wgmma.mma_async of thread " + std::to_string(thread_rank()) + " read its operand at " +
                  at(addresses[i]) + " when it was issued, and the bytes changed before the wgmma.wait_group that "
                  "covers it (a stage refilled or written while the tensor cores may still read it)");
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
