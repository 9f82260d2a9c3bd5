// Devices: what this machine offers (CUDA GPUs, the CPU, emulated GPUs), why a GPU is not used
// when it is not, and which device(s) a run uses (parsed from --devices).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "runtime/gpu_code.h"

// Builds whose .cu kernels are compiled by the host compiler against runtime/emu (build/tests_emu,
// build/train_yolo_emu, CPU-only builds) offer emulated GPUs: DeviceKind::Emu.
#define YOLO_EMULATED_KERNELS (!YOLO_CUDA)

namespace yolo {

// Cpu: the fast CPU ops. Cuda: a real GPU. Emu: an emulated GPU (runtime/emu/device.h): the CUDA
// kernels run on the CPU, with device memory, streams and collectives that behave as a GPU's do.
enum class DeviceKind { Cpu, Cuda, Emu };

// One device a buffer, stream or kernel lives on. For the CPU, index is always 0.
struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;
  static Device cpu() { return {DeviceKind::Cpu, 0}; }
  static Device cuda(int i) { return {DeviceKind::Cuda, i}; }
  static Device emu(int i) { return {DeviceKind::Emu, i}; }
  bool is_cuda() const { return kind == DeviceKind::Cuda; }
  bool is_emu() const { return kind == DeviceKind::Emu; }
  // Runs the CUDA kernels (a GPU or an emulated one), as opposed to the fast CPU ops.
  bool runs_kernels() const { return kind != DeviceKind::Cpu; }
  bool operator==(const Device&) const = default;
  std::string name() const;  // "cpu", "gpu:N" or "emu:N"
};

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  size_t memory_bytes = 0;
  size_t l2_bytes = 0;
  GpuCodeChoice code;  // which of the build's code it runs, and why (runtime/gpu_code.h)
};

// What the CUDA runtime found. Discovery never throws: a missing driver or no device is a
// normal outcome, reported in `why_no_gpu`.
struct GpuDiscovery {
  bool cuda_built = false;   // this binary has the CUDA backend
  std::vector<GpuInfo> gpus;      // the GPUs that can run this build's code
  std::vector<GpuInfo> unusable;  // those that cannot (code.why says why): never chosen
  std::string why_no_gpu;    // empty when gpus is non-empty
  int driver_version = 0, runtime_version = 0;
};

const GpuDiscovery& discover_gpus();  // cached after the first call
int cpu_threads();                     // hardware threads available to the CPU backend

// The devices a run uses. `spec` is the value of --devices:
//   "auto" (default): every GPU, or the CPU when there is none;
//   "cpu", "cpu:N" (N in-process replicas), "gpu:0,2", "gpu" (all GPUs);
//   "emu:0,1" (emulated GPUs, in builds with YOLO_EMULATED_KERNELS; "emu" = emu:0), each index
//   optionally followed by properties: @smXY (compute capability, with that architecture's SM
//   count and memory: sm75 T4, sm80 A100, sm89 L4, sm90 H200 (the default), sm100 B200, sm120
//   RTX 5090; runtime/emu/device.h), @sms=N, @mem=SIZE (bytes,
//   K/M/G suffixes), e.g. "emu:0@sm75@mem=512M,1@sm75". Emulated devices named are configured.
// Throws yolo::Error naming the flag on a malformed or unavailable choice.
struct DeviceChoice {
  std::vector<Device> devices;
  std::string reason;  // one line: why these devices (e.g. the CPU fallback's cause)
};
DeviceChoice choose_devices(const std::string& spec, const GpuDiscovery& found);

// The report of `train_yolo --list-devices`.
std::string describe_devices(const GpuDiscovery& found);

}  // namespace yolo
