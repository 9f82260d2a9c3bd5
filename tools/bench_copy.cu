// Baseline entry: our plain float4 copy kernel (CPU: memcpy by pool threads), the yardstick
// every memory-bound op is compared with.
#include <cstring>

#include "kernels/common.cuh"
#include "kernels/cpu_parallel.h"
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {
namespace {

__global__ void copy_float4(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

BENCH_ENTRY("copy", [](const Context& context, std::vector<Result>& out) {
  // One YOLOv3-416 activation of the first layer: batch x 416 x 416 x 32 floats.
  size_t floats = size_t(context.batch) * 416 * 416 * 32;
  DeviceMemory a(context.device, floats * 4), b(context.device, floats * 4);
  fill_bytes(a.data(), 0x3c, floats * 4, context.device);
  Result r{"copy", "b x 416x416x32", 0, 2.0 * double(floats) * 4, 0};
  if (context.device.is_cuda()) {
    r.ms = time_ms(context, [&] {
      LAUNCH(copy_float4, dim3(4096), dim3(256), 0, context.stream, static_cast<const float4*>(a.data()),
             static_cast<float4*>(b.data()), floats / 4);
    });
  } else {
    size_t chunks = 64, per = floats * 4 / chunks;
    r.ms = time_ms(context, [&] {
      parallel_for(chunks, [&](size_t i) {
        std::memcpy(static_cast<char*>(b.data()) + i * per, static_cast<const char*>(a.data()) + i * per, per);
      });
    });
  }
  out.push_back(r);
});

}  // namespace
}  // namespace yolo::bench
