// The Communicator of emulated GPUs (emu:N): the ranks of an in-process group whose collectives
// are queued on the communication stream, as NCCL's are. A rank's part of an all-reduce or a
// broadcast is an item of its stream: when the stream reaches it, the rank's buffer is read (so
// a stream that forgot to wait for the gradients' producer reduces stale data), and when the
// last rank has arrived every rank's buffer gets the result (sums in rank order: the same bits
// on every rank, and the CPU replicas' bits). As with NCCL's non-blocking communicators: host
// waits (wait) poll with the group's timeout and then abort, naming the rank that gave up; an
// abort ends every pending collective with the group's message (their streams' synchronize()
// rethrows it) and makes every later call throw.
#pragma once
#include <memory>

#include "runtime/communicator.h"
#include "runtime/device.h"

namespace yolo {

// Rank `rank` of `group`, on emulated GPU `device`; its collectives go on that device's streams.
std::unique_ptr<Communicator> emulated_gpu_communicator(InProcessGroup& group, int rank, Device device);

// The communicator of an in-process replica on `device`: the emulated GPUs' above, or the CPU
// replicas' (group.communicator(rank)).
std::unique_ptr<Communicator> replica_communicator(InProcessGroup& group, int rank, Device device);

}  // namespace yolo
