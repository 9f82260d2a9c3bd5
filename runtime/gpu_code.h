// Which of the build's GPU code a device runs, as a pure function of its compute capability and
// of what the build embeds (the Makefile's ARCH): the CUDA runtime loads, for each kernel, the
// build's SASS for the device's architecture, and otherwise compiles (JIT) the build's PTX.
// The facts it follows (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"):
//   - SASS for compute capability X.y runs on X.z with z >= y only (sm_80 runs on 8.6 and 8.9,
//     never on 9.0 or 7.5);
//   - sm_90a SASS (wgmma, setmaxnreg) runs on 9.0 exactly;
//   - PTX for compute_XY is compiled by the driver for any device of XY or newer, at the first
//     launch (then cached on disk), so a GPU newer than the build (B200's 10.0, the RTX 50 series'
//     12.0) runs the sm_80 path (mma.sync, cp.async; no wgmma) from it;
//   - CUDA 13 supports compute capability 7.5 and newer only.
// `train_yolo --list-devices` prints the choice for each GPU; devices that cannot run any of the
// build's code are left out of --devices auto with the reason (runtime/device.h).
#pragma once
#include <string>
#include <vector>

namespace yolo {

enum class GpuCode { Sm75, Sm80, Sm90a, PtxJit, None };

// What a build embeds, as compute capabilities (10 * major + minor; 90 is sm_90a).
struct BuildGpuCode {
  std::vector<int> sass;  // e.g. {75, 80, 90}
  int ptx = 0;            // the PTX's virtual architecture (80: compute_80); 0 when none
};

// This binary's, from the Makefile (YOLO_GPU_SASS, YOLO_GPU_PTX); empty in CPU-only builds.
const BuildGpuCode& this_build_gpu_code();
// The build's code as ARCH lists it, e.g. "sm_75 sm_80 sm_90a + compute_80 PTX".
std::string describe_build_gpu_code(const BuildGpuCode& build);

struct GpuCodeChoice {
  GpuCode code = GpuCode::None;
  int sass = 0;     // the SASS target that runs (0 for PtxJit and None)
  std::string why;  // one line: why this code, or why none can run
  bool usable() const { return code != GpuCode::None; }
};
GpuCodeChoice choose_gpu_code(int compute_capability, const BuildGpuCode& build);
// The ARCH value (Makefile) whose code a device of `compute_capability` runs best: 75, 80 (also
// for 8.6, 8.9 and, through its PTX, 10.0 and newer) or 90. tools/gpu_arch.sh does the same.
int arch_for(int compute_capability);
// "sm_75", "sm_80", "sm_90a", "PTX JIT" or "none".
const char* gpu_code_name(GpuCode code);

// The NVIDIA driver series this build's CUDA runtime needs (580 for CUDA 13), and the line that
// says so when the driver is older: `driver_version` and `runtime_version` as cudaDriverGetVersion
// and cudaRuntimeGetVersion report them (e.g. 12040, 13000).
int minimum_driver_series(int runtime_version);
std::string old_driver_message(int driver_version, int runtime_version);

}  // namespace yolo
