// Mistakes planted on purpose, in the emulated build only (build/tests_emu, build/train_yolo_emu),
// so that tests can show the emulated GPUs' adversarial mode (runtime/stream_queue.h) catches
// the kind of bug each stands for. In every other build fault_injected() is a constant false and
// the checks compile away.
#pragma once

namespace yolo {

enum class Fault {
  CommSkipsComputeWait,       // a bucket's all-reduce does not wait for the compute stream's event
  LossReadWithoutSync,        // the host reads the loss statistics without synchronising the stream
  AllReduceBeforeLastKernel,  // a bucket's all-reduce is queued before its last backward kernel
  CaptureFails,               // ending a stream capture fails, as where a driver cannot capture the step
  WgmmaDropsLastK,            // the emulated wgmma leaves out each slice's last k (a fact the twin gets wrong)
  Tf32RoundsOperands,         // the emulated wgmma rounds TF32 operands to nearest (a fact of TF32 alone wrong)
  TmaEncoderRefuses,          // the im2col tensor-map encoder refuses every map (as a driver might)
  // (keep TmaEncoderRefuses last: runtime/fault.cpp sizes its switches by it)
};

#if YOLO_EMU
bool fault_injected(Fault fault);
void inject_fault(Fault fault, bool on);
#else
constexpr bool fault_injected(Fault) { return false; }
#endif

}  // namespace yolo
