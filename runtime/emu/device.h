// Emulated GPUs (DeviceKind::Emu, "emu:N"): what makes a device of the CPU emulation behave like
// a CUDA GPU to the code above runtime/.
//   - Properties per device (compute capability, SMs, memory), an H200-like sm_90 by default,
//     so the memory-fit check, tile planning and per-architecture rules can be tested.
//   - Device memory that host code cannot touch: each allocation is its own mapping, kept
//     inaccessible (PROT_NONE) except while a kernel, a copy or a collective runs (the access
//     window below). A host read of a device pointer - the classic bug that only shows on a GPU -
//     faults, and the fault handler names the device and allocation before the usual report.
//     Fresh allocations hold 0xFF bytes (NaN floats), as uninitialised device memory may; the
//     bytes past an allocation's end in its last page are poisoned for AddressSanitizer.
//   - A memory budget per device (the configured size): an allocation beyond it fails as
//     cudaMalloc does, with the numbers.
//   - Pinned host memory (PinnedHostBuffer) is registered, so copies can tell it from pageable
//     memory (runtime/memory.cpp: asynchronous from pinned memory, staged from pageable).
//   - Injected failures (tests): the N-th kernel launched on a device's streams fails as an
//     illegal memory access would, surfacing at the next synchronisation.
// Streams and events of emulated GPUs are runtime/stream_queue.h's; kernels are run by
// runtime/emu/scheduler.h; collectives by runtime/emu_communicator.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace yolo::emu {

constexpr int kMaxDevices = 8;  // emu:0 .. emu:7

struct DeviceProps {
  std::string name;
  int cc_major = 9, cc_minor = 0;
  int multiprocessors = 132;
  size_t memory_bytes = 0;
  size_t l2_bytes = 0;
  // Per SM and per block (opted in), as cudaDeviceProp's maxThreadsPerMultiProcessor,
  // sharedMemPerMultiprocessor and sharedMemPerBlockOptin: the planner's limits.
  int threads_per_sm = 2048;
  int shared_per_sm = 228 * 1024, shared_per_block = 227 * 1024;
  // Whether the build's sm_90a code runs here (wgmma, kernels/hopper.h): true for the H200
  // preset, as `make` builds it; false emulates a device (or build) where only the mma.sync
  // kernels run.
  bool sm90a_code = false;
};

// The preset for an architecture: 75 (T4), 80 (A100 40 GB), 89 (L4), 90 (H200, the default),
// 100 (B200), 120 (RTX 5090); the newer two run the sm_80 code, as a GPU runs the build's PTX
// (runtime/gpu_code.h). Other values throw yolo::Error naming them.
DeviceProps preset_for(int compute_capability);
// Device `index`'s properties (the H200 preset until configured). Throws for a bad index.
DeviceProps device_props(int index);
// Sets device `index`'s properties. Its memory budget applies to later allocations.
void configure_device(int index, const DeviceProps& props);

// Makes emulated device `index` current on this thread (-1: none).
void set_current_device(int index);
// SMs of the current emulated device; 4 when none is current (kernel tests: a small "GPU", so
// small problems still use several blocks).
int current_multiprocessors();
// The current emulated device's index (-1: none) and compute capability as 10*major + minor
// (90 when none is current, like the default device).
int current_device_index();
int current_compute_capability();
bool current_device_runs_sm90a_code();  // sm90a_code of the current device (true when none is current)
// For tests: the wgmma ops emulated threads have run in this process (one per thread and op), so
// a test can tell the wgmma kernels from the mma.sync ones behind one entry point.
unsigned long long wgmma_ops_run();

// ---- memory ----------------------------------------------------------------------------
// Device memory of emu:`device`: `bytes` (0 allowed) filled with 0xFF. Throws yolo::Error with
// the sizes when the device's memory is exhausted.
void* allocate_device(int device, size_t bytes);
void free_device(void* p);
size_t device_bytes_in_use(int device);

// Host memory registered as pinned (page-locked on a GPU machine).
void* allocate_pinned(size_t bytes);
void free_pinned(void* p);

enum class MemoryKind { Pageable, Pinned, Device };
// What `p` points into; for device memory also which device (when `device` is set).
MemoryKind memory_kind(const void* p, int* device = nullptr);

// The handler that names a host access to device memory, then hands the fault on to the handler
// it found (AddressSanitizer's report, or the default action). Installed with the first device
// allocation; a harness that installs its own SIGSEGV handler later (doctest does, per test
// case) hides it unless this is called again.
void install_fault_handler();

// While one of these lives (on any thread), device memory is accessible to the host: kernels,
// copies and collectives open it around their work. Nests; any thread.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// ---- injected failures (tests) ----------------------------------------------------------
// The `nth` (1-based) kernel launched on a stream of emu:`device` from now on throws yolo::Error
// ("an illegal memory access (injected ...)") instead of running, and, as on a GPU whose context
// such a fault loses, so does every kernel and collective on the device after it; 0 disarms.
// Either call gives the device back its context.
void fail_kernel_launch(int device, int64_t nth);
// The injected failure that lost emu:`device`'s context, or "" (collectives check it).
std::string device_failure(int device);
// Called by each stream launch on emu:`device`: throws when the armed failure is due.
void count_kernel_launch(int device, const char* kernel);
// Kernels launched on emu:`device`'s streams so far (to place an injected failure).
int64_t kernel_launches(int device);

}  // namespace yolo::emu
