// The kernel-test device choice (see kernel_harness.h).
#include "tests/kernel_harness.h"

namespace yolo::testing {

bool kernels_emulated() { return YOLO_EMU != 0; }

std::optional<Device> kernel_device(std::string* why_not) {
#if YOLO_EMU
  (void)why_not;
  return Device::cpu();  // emulated kernels read and write host memory
#elif YOLO_CUDA
  const GpuDiscovery& found = discover_gpus();
  if (found.gpus.empty()) {
    *why_not = "needs a GPU (" + found.why_no_gpu + "); build/tests_emu runs this kernel emulated";
    return std::nullopt;
  }
  return Device::cuda(0);
#else
  *why_not = "CPU-only build: kernels run emulated in build/tests_emu";
  return std::nullopt;
#endif
}

}  // namespace yolo::testing
