// The Communicator for GPU ranks: NCCL, created non-blocking so that no host thread ever waits
// on it without a deadline. Works for one process driving several GPUs (one host thread per
// GPU, each creating its own rank, as NCCL documents for that case) and for one process per GPU
// (the id shared through the rendezvous). All calls on a communicator come from the thread
// that owns its device. Builds without NCCL keep these declarations; the calls then throw.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/device.h"

namespace yolo {

// A new job id (ncclGetUniqueId: 128 bytes), made by rank 0 and given to every rank.
std::vector<uint8_t> nccl_unique_id();

// Ranks of one process share one of these: the first rank that aborts writes its number, and
// the others' waits see it at once instead of running into their timeouts.
struct NcclLocalGroup {
  std::atomic<int> failed_rank{-1};
};

// This rank's communicator on `device` (made current), waiting (polling, at most
// timeout_seconds, which also bounds every later wait) until all `world` ranks have joined.
// Throws yolo::Error naming the rank and device when NCCL is missing, fails or times out.
std::unique_ptr<Communicator> nccl_communicator(Device device, int rank, int world, const std::vector<uint8_t>& id,
                                                double timeout_seconds,
                                                std::shared_ptr<NcclLocalGroup> local = nullptr);

}  // namespace yolo
