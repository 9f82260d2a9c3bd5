// tc::shared_opt_in_needed (declared with tc::allow_shared in kernels/tc_tiles.cuh): which
// (device, kernel, bytes) still needs its dynamic shared memory opt-in. A unit of its own so
// that every kernel family that opts in (mma.sync and wgmma alike) links without the others.
#include <cstddef>
#include <mutex>
#include <set>
#include <tuple>

#include "runtime/check.h"
#if YOLO_CUDA
#include <cuda_runtime_api.h>
#else
#include "runtime/emu/device.h"
#endif

namespace yolo::tc {

bool shared_opt_in_needed(const void* kernel, size_t bytes) {
  int device = 0;
#if YOLO_CUDA
  CHECKED(cudaGetDevice(&device));
#else
  device = emu::current_device_index();
#endif
  static std::mutex mutex;
  static std::set<std::tuple<int, const void*, size_t>> done;
  std::lock_guard lock(mutex);
  return done.insert({device, kernel, bytes}).second;
}

}  // namespace yolo::tc
