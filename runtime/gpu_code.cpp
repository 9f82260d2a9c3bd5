// The GPU code a device runs (gpu_code.h).
#include "runtime/gpu_code.h"

#include <algorithm>
#include <sstream>

// The Makefile passes the build's targets to this file alone; CPU-only builds have none.
#ifndef YOLO_GPU_SASS
#define YOLO_GPU_SASS ""
#endif
#ifndef YOLO_GPU_PTX
#define YOLO_GPU_PTX 0
#endif

namespace yolo {

namespace {

std::string sm_name(int cc) { return "sm_" + std::to_string(cc) + (cc == 90 ? "a" : ""); }
std::string cc_name(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// The build's best SASS for `cc`: same major, minor at most the device's; sm_90a on 9.0 only.
int runnable_sass(int cc, const BuildGpuCode& build) {
  int best = 0;
  for (int s : build.sass) {
    const bool runs = s == 90 ? cc == 90 : s / 10 == cc / 10 && s % 10 <= cc % 10;
    if (runs) best = std::max(best, s);
  }
  return best;
}

}  // namespace

int arch_for(int cc) {
  if (cc < 80) return 75;
  if (cc == 90) return 90;
  return 80;  // 8.x runs sm_80 SASS; 9.x other than 9.0 and 10.0 on run its PTX
}

const BuildGpuCode& this_build_gpu_code() {
  static const BuildGpuCode code = [] {
    BuildGpuCode c;
    std::istringstream list(YOLO_GPU_SASS);
    for (std::string item; list >> item;) c.sass.push_back(std::stoi(item));  // "90a" reads as 90
    c.ptx = YOLO_GPU_PTX;
    return c;
  }();
  return code;
}

std::string describe_build_gpu_code(const BuildGpuCode& build) {
  std::string text;
  for (int s : build.sass) text += (text.empty() ? "" : " ") + sm_name(s);
  if (build.ptx) text += (text.empty() ? "" : " + ") + std::string("compute_") + std::to_string(build.ptx) + " PTX";
  return text.empty() ? "no GPU code" : text;
}

const char* gpu_code_name(GpuCode code) {
  switch (code) {
    case GpuCode::Sm75: return "sm_75";
    case GpuCode::Sm80: return "sm_80";
    case GpuCode::Sm90a: return "sm_90a";
    case GpuCode::PtxJit: return "PTX JIT";
    default: return "none";
  }
}

GpuCodeChoice choose_gpu_code(int cc, const BuildGpuCode& build) {
  GpuCodeChoice c;
  const std::string device = "compute capability " + cc_name(cc);
  if (cc < 75) {
    c.why = device + " is older than CUDA 13 supports (7.5, the T4's, and newer)";
    return c;
  }
  if (const int sass = runnable_sass(cc, build)) {
    c.sass = sass;
    c.code = sass == 90 ? GpuCode::Sm90a : sass >= 80 ? GpuCode::Sm80 : GpuCode::Sm75;
    if (c.code == GpuCode::Sm90a)
      c.why = "the build's sm_90a code: wgmma and TMA where their self-check passes (Hopper, 9.0 exactly)";
    else if (sass == cc)
      c.why = "the build's " + sm_name(sass) + " code";
    else
      c.why = "the build's " + sm_name(sass) + " code, which " + device + " runs (same major version)";
    if (c.code == GpuCode::Sm75) c.why += "; mma.sync in FP16 (no bf16 or tf32 before 8.0)";
    return c;
  }
  if (build.ptx && build.ptx <= cc) {
    c.code = GpuCode::PtxJit;
    c.why = "no SASS for " + device + " in this build: the driver compiles its compute_" + std::to_string(build.ptx) +
            " PTX at the first launch (cached on disk), so the sm_80 path runs (mma.sync; no wgmma)";
    return c;
  }
  c.why = "this build has no code for " + device + " (it holds " + describe_build_gpu_code(build) +
          "): rebuild with `make ARCH=" + std::to_string(arch_for(cc)) + "`";
  return c;
}

int minimum_driver_series(int runtime_version) {
  if (runtime_version >= 13000) return 580;
  if (runtime_version >= 12000) return 525;
  return 0;
}

std::string old_driver_message(int driver_version, int runtime_version) {
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  std::string text = "the NVIDIA driver is too old: it supports CUDA " + version(driver_version) +
                     ", this build's runtime is CUDA " + version(runtime_version);
  if (const int series = minimum_driver_series(runtime_version))
    text += ", which needs driver " + std::to_string(series) + " or newer (e.g. Debian/Ubuntu's nvidia-driver-" +
            std::to_string(series) + ")";
  return text;
}

}  // namespace yolo
