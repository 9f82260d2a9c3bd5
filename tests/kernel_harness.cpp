// The kernel-test device choice (see kernel_harness.h).
#include "tests/kernel_harness.h"

#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

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
  return Device::cuda(found.gpus[0].index);  // the first GPU that runs this build's code
#else
  (void)why_not;
  // An emulated GPU: device memory the host cannot touch outside kernels and copies, so a
  // launcher that reads device memory on the host fails here as it would on a GPU. None is
  // current on the calling thread: kernels plan their tiles for a small 4-SM GPU, so small test
  // problems still use several blocks.
  emu::set_current_device(-1);
  return Device::emu(0);
#endif
}

}  // namespace yolo::testing
