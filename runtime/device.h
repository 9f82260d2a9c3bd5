// Devices: what this machine offers (CUDA GPUs, the CPU), why a GPU is not used when it is
// not, and which device(s) a run uses (parsed from --devices).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace yolo {

enum class DeviceKind { Cpu, Cuda };

// One device a buffer, stream or kernel lives on. For the CPU, index is always 0.
struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::Cpu, 0}; }
  static Device cuda(int i) { return {DeviceKind::Cuda, i}; }
  bool is_cuda() const { return kind == DeviceKind::Cuda; }
  bool operator==(const Device&) const = default;
  std::string name() const;  // "cpu" or "gpu:N"
};

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;
  size_t l2_bytes = 0;
};

// What the CUDA runtime found. Discovery never throws: a missing driver or no device is a
// normal outcome, reported in `why_no_gpu`.
struct GpuDiscovery {
  bool cuda_built = false;   // this binary has the CUDA backend
  std::vector<GpuInfo> gpus;
  std::string why_no_gpu;    // empty when gpus is non-empty
  int driver_version = 0, runtime_version = 0;
};

const GpuDiscovery& discover_gpus();  // cached after the first call
int cpu_threads();                     // hardware threads available to the CPU backend

// The devices a run uses. `spec` is the value of --devices:
//   "auto" (default): every GPU, or the CPU when there is none;
//   "cpu", "cpu:N" (N in-process replicas), "gpu:0,2", "gpu" (all GPUs).
// Throws yolo::Error naming the flag on a malformed or unavailable choice.
struct DeviceChoice {
  std::vector<Device> devices;
  std::string reason;  // one line: why these devices (e.g. the CPU fallback's cause)
};
DeviceChoice choose_devices(const std::string& spec, const GpuDiscovery& found);

// The report of `train_yolo --list-devices`.
std::string describe_devices(const GpuDiscovery& found);

}  // namespace yolo
