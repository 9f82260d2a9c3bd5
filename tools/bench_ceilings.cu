// Measures the two ceilings every kernel benchmark is judged against on this GPU: copy
// bandwidth (a device-to-device cudaMemcpy and our own float4 copy kernel; bytes read plus
// written) and the FP32 FMA rate (independent FMA chains in registers). Median of repeats,
// timed with CUDA events after a warm-up, on random (not zero) data.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/common.cuh"
#include "runtime/device.h"
#include "runtime/memory.h"

namespace {

__global__ void copy_float4(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

__global__ void fill_random(float* out, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    out[i] = float(h & 0xffffff) / float(0x1000000);
  }
}

constexpr int kChains = 8, kFmaIterations = 4096;

// Each thread runs kChains independent FMA chains: 2 * kChains * kFmaIterations flops.
__global__ void fma_rate(float* out, float a, float b) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = threadIdx.x * 1e-3f + c;
  for (int i = 0; i < kFmaIterations; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) acc[c] = fmaf(acc[c], a, b);
  float sum = 0.0f;
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  if (sum == 1234.5f) out[0] = sum;  // practically never true; keeps the work alive
}

template <typename Body>
float median_ms(Body body, int repeats) {
  cudaEvent_t start, stop;
  CHECKED(cudaEventCreate(&start));
  CHECKED(cudaEventCreate(&stop));
  body();  // warm-up
  CHECKED(cudaDeviceSynchronize());
  std::vector<float> times;
  for (int r = 0; r < repeats; ++r) {
    CHECKED(cudaEventRecord(start));
    body();
    CHECKED(cudaEventRecord(stop));
    CHECKED(cudaEventSynchronize(stop));
    float ms = 0;
    CHECKED(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CHECKED(cudaEventDestroy(start));
  CHECKED(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  try {
    const yolo::GpuDiscovery& found = yolo::discover_gpus();
    if (found.gpus.empty()) {
      std::printf("bench_ceilings: no GPU (%s); nothing to measure\n", found.why_no_gpu.c_str());
      return 0;
    }
    const yolo::GpuInfo& gpu = found.gpus[0];
    CHECKED(cudaSetDevice(0));
    const size_t bytes = size_t(2) << 30;  // 2 GiB each way: far beyond L2
    yolo::DeviceMemory a(yolo::Device::cuda(0), bytes), b(yolo::Device::cuda(0), bytes);
    size_t floats = bytes / sizeof(float);
    LAUNCH(fill_random, dim3(4096), dim3(256), 0, 0, static_cast<float*>(a.data()), floats, 12345u);
    CHECKED(cudaDeviceSynchronize());

    float memcpy_ms = median_ms([&] { CHECKED(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice)); }, 20);
    unsigned copy_blocks = unsigned(gpu.multiprocessors) * 8;
    float kernel_ms = median_ms([&] {
      LAUNCH(copy_float4, dim3(copy_blocks), dim3(256), 0, 0, static_cast<const float4*>(a.data()),
             static_cast<float4*>(b.data()), bytes / sizeof(float4));
    }, 20);
    unsigned fma_blocks = unsigned(gpu.multiprocessors) * 16;
    float fma_ms = median_ms([&] { LAUNCH(fma_rate, dim3(fma_blocks), dim3(256), 0, 0, static_cast<float*>(b.data()), 0.999f, 1e-3f); }, 20);
    double fma_flops = 2.0 * kChains * kFmaIterations * double(fma_blocks) * 256;

    std::printf("device: %s (sm_%d%d, %d SMs)\n", gpu.name.c_str(), gpu.cc_major, gpu.cc_minor, gpu.multiprocessors);
    std::printf("%-34s %10s %12s\n", "ceiling", "ms", "rate");
    std::printf("%-34s %10.3f %9.0f GB/s\n", "cudaMemcpy D2D 2 GiB (read+write)", memcpy_ms, 2.0 * bytes / memcpy_ms / 1e6);
    std::printf("%-34s %10.3f %9.0f GB/s\n", "copy_float4 kernel (read+write)", kernel_ms, 2.0 * bytes / kernel_ms / 1e6);
    std::printf("%-34s %10.3f %9.1f TFLOP/s\n", "FP32 FMA chains", fma_ms, fma_flops / fma_ms / 1e9);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ceilings: error: %s\n", e.what());
    return 1;
  }
}
