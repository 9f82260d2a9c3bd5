// current_device_runs_wgmma (kernels/hopper.h).
#include "kernels/hopper.h"

#include <atomic>

#include "kernels/common.cuh"
#include "kernels/wgmma.cuh"

namespace yolo {

#if defined(__CUDACC__)
namespace {
__device__ int g_runs_wgmma;
// Compiled once per architecture of the build: only the sm_90a pass writes 1.
__global__ void sm90a_probe_kernel() { g_runs_wgmma = YOLO_WGMMA_NATIVE; }
}  // namespace

bool current_device_runs_wgmma() {
  static std::atomic<int> cached[64] = {};  // 0: not asked yet, 1: no, 2: yes
  int device = 0;
  CHECKED(cudaGetDevice(&device));
  if (device >= 0 && device < 64)
    if (const int known = cached[device].load(std::memory_order_relaxed)) return known == 2;
  int major = 0;
  CHECKED(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  int runs = 0;
  if (major == 9) {  // sm_90a code loads nowhere else: no probe needed to say no
    LAUNCH(sm90a_probe_kernel, 1, 1, 0, nullptr);
    CHECKED(cudaMemcpyFromSymbol(&runs, g_runs_wgmma, sizeof runs));
  }
  if (device >= 0 && device < 64) cached[device].store(runs ? 2 : 1, std::memory_order_relaxed);
  return runs != 0;
}
#else
bool current_device_runs_wgmma() { return emu::current_device_runs_sm90a_code(); }
#endif

}  // namespace yolo
