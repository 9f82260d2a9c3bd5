// The kernel-test device choice (see kernel_harness.h).
#include "tests/kernel_harness.h"

namespace yolo::testing {

// Builds without CUDA compile every .cu against the emulation (runtime/emu).
bool kernels_emulated() { return YOLO_CUDA == 0; }

std::optional<Device> kernel_device(std::string* why_not) {
#if YOLO_CUDA
  const GpuDiscovery& found = discover_gpus();
  if (found.gpus.empty()) {
    *why_not = "needs a GPU (" + found.why_no_gpu + "); build/tests_emu runs this kernel emulated";
    return std::nullopt;
  }
  return Device::cuda(0);
#else
  (void)why_not;
  return Device::cpu();  // emulated kernels read and write host memory
#endif
}

}  // namespace yolo::testing
