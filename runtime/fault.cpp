// The planted faults' switches (see fault.h).
#include "runtime/fault.h"

#if YOLO_EMU
#include <atomic>

namespace yolo {

namespace {
std::atomic<bool> g_faults[static_cast<int>(Fault::TmaEncoderRefuses) + 1];
}

bool fault_injected(Fault fault) { return g_faults[static_cast<int>(fault)].load(); }

void inject_fault(Fault fault, bool on) { g_faults[static_cast<int>(fault)].store(on); }

}  // namespace yolo
#endif
