// A Communicator between CPU ranks in separate processes, over the rendezvous's connections:
// rank 0 sums in rank order (the in-process group's bits) and sends the sum back; a rank that
// fails, aborts or goes away makes the others throw, naming it, instead of hanging.
#pragma once
#include <memory>

#include "runtime/communicator.h"
#include "runtime/rendezvous.h"

namespace yolo {

// Takes the connections of a completed rendezvous. A collective that has not finished after
// timeout_seconds (--comm-timeout) throws and aborts the others.
std::unique_ptr<Communicator> socket_communicator(Rendezvous&& connected, double timeout_seconds);

}  // namespace yolo
