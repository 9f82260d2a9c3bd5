// The emulation's ldmatrix and cp.async (declared in emu.h; kernels reach them through
// kernels/mma.cuh). The mma.sync twin itself lives in mma.cuh, next to the fragment layouts.
#include <cstring>
#include <string>

#include "runtime/check.h"
#include "runtime/emu/emu.h"

namespace yolo::emu {

void require_full_warp(const char* what) {
  if (live_lanes() != 0xffffffffu)
    throw Error(std::string(what) + " with lanes of the warp missing or exited: undefined on a GPU (every lane "
                "of the warp must execute it)");
}

void ldmatrix(uint32_t* r, int matrices, bool trans, const void* row_address) {
  require_full_warp("ldmatrix");
  const unsigned lane = lane_id();
  std::memcpy(warp_wide_slot(lane), &row_address, sizeof row_address);
  warp_barrier(0xffffffffu);
  require_full_warp("ldmatrix");  // again: a lane that exited after this one arrived drops out of the barrier
  auto row = [&](unsigned source_lane) {
    const unsigned char* p;
    std::memcpy(&p, warp_wide_slot(source_lane), sizeof p);
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw Error("ldmatrix: lane " + std::to_string(source_lane) + "'s row address is not 16-byte aligned");
    return p;
  };
  uint32_t result[4];
  for (int j = 0; j < matrices; ++j) {
    const unsigned base = unsigned(j) * 8;
    if (!trans) {
      std::memcpy(&result[j], row(base + lane / 4) + (lane % 4) * 4, 4);
    } else {
      uint16_t lo, hi;
      std::memcpy(&lo, row(base + 2 * (lane % 4)) + (lane / 4) * 2, 2);
      std::memcpy(&hi, row(base + 2 * (lane % 4) + 1) + (lane / 4) * 2, 2);
      result[j] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
  warp_barrier(0xffffffffu);
  for (int j = 0; j < matrices; ++j) r[j] = result[j];
}

void cp_async(void* shared_dst, const void* global_src, unsigned bytes, unsigned src_bytes) {
  if (reinterpret_cast<uintptr_t>(shared_dst) % bytes != 0 ||
      (src_bytes > 0 && reinterpret_cast<uintptr_t>(global_src) % bytes != 0))
    throw Error("cp.async of " + std::to_string(bytes) + " bytes: an address is not " + std::to_string(bytes) +
                "-byte aligned");
  AsyncCopies& copies = thread_async_copies();
  if (copies.count == sizeof copies.pending / sizeof copies.pending[0])
    throw Error("cp.async: more than 64 copies in flight in one thread (the emulation's limit)");
  copies.pending[copies.count++] = AsyncCopy{shared_dst, global_src, bytes, src_bytes};
}

void cp_async_commit() {
  AsyncCopies& copies = thread_async_copies();
  if (copies.groups == sizeof copies.group_ends / sizeof copies.group_ends[0])
    throw Error("cp.async: more than 16 committed groups in flight in one thread (the emulation's limit)");
  copies.group_ends[copies.groups++] = copies.count;
}

void cp_async_wait(unsigned pending_groups) {
  AsyncCopies& copies = thread_async_copies();
  if (copies.groups <= pending_groups) return;
  const unsigned done_groups = copies.groups - pending_groups, done = copies.group_ends[done_groups - 1];
  for (unsigned i = 0; i < done; ++i) {
    const AsyncCopy& c = copies.pending[i];
    if (c.src_bytes) std::memcpy(c.dst, c.src, c.src_bytes);
    std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
    note_generic_shared_write(c.dst, c.bytes);
  }
  std::memmove(copies.pending, copies.pending + done, (copies.count - done) * sizeof(AsyncCopy));
  copies.count -= done;
  for (unsigned g = 0; g < pending_groups; ++g) copies.group_ends[g] = copies.group_ends[g + done_groups] - done;
  copies.groups = pending_groups;
}

}  // namespace yolo::emu
