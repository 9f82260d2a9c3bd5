// Whether the current device runs this build's sm_90a code. wgmma and setmaxnreg exist only in
// code compiled for sm_90a (`make` builds it when ARCH names 90), which runs on compute
// capability 9.0 alone (H100, H200). Kernels built on kernels/wgmma.cuh are chosen only where
// this holds; everywhere else the mma.sync kernels run. Ask it before capturing a CUDA graph:
// the first question per device launches a probe.
#pragma once

namespace yolo {

// A CUDA build: a probe kernel reports whether the code the driver loaded for this device is
// sm_90a's (cached per device). Under emulation: the current emulated device's sm90a_code.
bool current_device_runs_wgmma();

}  // namespace yolo
