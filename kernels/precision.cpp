// Precision names and the device checks (precision.h).
#include "kernels/precision.h"

#include <atomic>
#include <string>

#if defined(__CUDACC__) || YOLO_CUDA
#include <cuda_runtime_api.h>
#endif
#if !YOLO_CUDA
#include "runtime/emu/device.h"
#endif

namespace yolo {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& name, const std::string& what) {
  for (Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16})
    if (name == precision_name(p)) return p;
  throw Error(what + ": unknown precision '" + name + "' (fp32, tf32, bf16 or fp16)");
}

std::optional<Precision> parse_precision_choice(const std::string& name, const std::string& what) {
  if (name == "auto") return std::nullopt;
  for (Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16})
    if (name == precision_name(p)) return p;
  throw Error(what + ": unknown precision '" + name + "' (auto, fp32, tf32, bf16 or fp16)");
}

Precision automatic_precision(bool runs_kernels, int compute_capability, std::string* why) {
  const std::string sm = "sm_" + std::to_string(compute_capability);
  auto say = [&](const std::string& text) {
    if (why) *why = text;
  };
  if (!runs_kernels) {
    say("the CPU backend computes fp32");
    return Precision::Fp32;
  }
  if (compute_capability >= 80) {
    say(sm + " has bf16 tensor cores (FP32's exponent range: no loss scaling)");
    return Precision::Bf16;
  }
  if (compute_capability >= 75) {
    say(sm + " has fp16 tensor cores but no bf16 ones (dynamic loss scaling on)");
    return Precision::Fp16;
  }
  say(sm + " has no tensor cores this trainer uses");
  return Precision::Fp32;
}

int min_compute_capability(Precision p) {
  switch (p) {
    case Precision::Fp32: return 0;
    case Precision::Fp16: return 75;
    default: return 80;
  }
}

int current_compute_capability() {
#if YOLO_CUDA
  // Asked at every tensor-core launch: cached per device (a device's capability never changes).
  static std::atomic<int> cached[64] = {};
  int device = 0;
  CHECKED(cudaGetDevice(&device));
  if (device >= 0 && device < 64)
    if (int cc = cached[device].load(std::memory_order_relaxed)) return cc;
  int major = 0, minor = 0;
  CHECKED(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECKED(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (device >= 0 && device < 64) cached[device].store(major * 10 + minor, std::memory_order_relaxed);
  return major * 10 + minor;
#else
  return emu::current_compute_capability();
#endif
}

void require_precision(Precision p, const char* op) {
  const int cc = current_compute_capability(), need = min_compute_capability(p);
  if (cc < need)
    throw Error(std::string(op) + ": precision " + precision_name(p) + " needs tensor cores of sm_" +
                std::to_string(need) + " or newer; this device is sm_" + std::to_string(cc) +
                (p == Precision::Bf16 || p == Precision::Tf32 ? " (on a T4, sm_75, use --precision fp16)" : ""));
}

}  // namespace yolo
