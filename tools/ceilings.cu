// Measured ceilings (see bench.h): on a GPU a device-to-device copy, an FMA-bound kernel and
// mma.sync-bound kernels (one per tensor-core precision the device has); on the CPU a large
// memcpy and the micro-kernel variant's multiply-add chains on every pool thread. Also the benchmark timer and
// registry, which must live in one translation unit compiled the same way as the entries.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "kernels/common.cuh"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_parallel.h"
#if defined(__CUDACC__)
#include "kernels/mma.cuh"
#endif
#include "runtime/memory.h"
#include "tools/bench.h"

namespace yolo::bench {

namespace {

constexpr int kChains = 8, kFmaIterations = 4096;

#if defined(__CUDACC__)
__global__ void fma_chains(float* out, float a, float b) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = threadIdx.x * 1e-3f + c;
  for (int i = 0; i < kFmaIterations; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) acc[c] = fmaf(acc[c], a, b);
  float sum = 0.0f;
  for (int c = 0; c < kChains; ++c) sum += acc[c];
  if (sum == 1234.5f) out[0] = sum;  // practically never true; keeps the work alive
}

// mma.sync throughput: every warp runs kMmaChains independent accumulator tiles (so the tensor
// pipe never waits on one MMA's latency), 8 warps a block and 4 blocks an SM, all resident at
// once (__launch_bounds__ keeps the registers under 64), through a long loop; the accumulators
// are summed and kept alive. The operands vary by lane (not zeros), like real data.
enum class MmaKind { Tf32, Bf16, Fp16 };
constexpr int kMmaChains = 8, kMmaIterations = 16384, kMmaThreads = 256, kMmaBlocksPerSm = 4;

template <MmaKind Kind>
__global__ void __launch_bounds__(kMmaThreads, kMmaBlocksPerSm) mma_chains(float* out, int iterations) {
  const float x = 1e-3f * float(threadIdx.x % 32 + 1);
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; ++i) {
    if constexpr (Kind == MmaKind::Tf32) a[i] = mma::to_tf32(x * float(i + 1));
    else if constexpr (Kind == MmaKind::Bf16) a[i] = mma::pack_bf16x2(x * float(i + 1), -x);
    else a[i] = mma::pack_f16x2(x * float(i + 1), -x);
  }
  for (int i = 0; i < 2; ++i) {
    if constexpr (Kind == MmaKind::Tf32) b[i] = mma::to_tf32(0.5f - x * float(i));
    else if constexpr (Kind == MmaKind::Bf16) b[i] = mma::pack_bf16x2(0.5f - x * float(i), x);
    else b[i] = mma::pack_f16x2(0.5f - x * float(i), x);
  }
  float acc[kMmaChains][4];
  for (int c = 0; c < kMmaChains; ++c)
    for (int i = 0; i < 4; ++i) acc[c][i] = 0.0f;
  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int c = 0; c < kMmaChains; ++c) {
      if constexpr (Kind == MmaKind::Tf32) mma::mma_tf32_m16n8k8(acc[c], a, b, acc[c]);
      else if constexpr (Kind == MmaKind::Bf16) mma::mma_bf16_m16n8k16(acc[c], a, b, acc[c]);
      else mma::mma_f16_m16n8k16(acc[c], a, b, acc[c]);  // sm_75: two m16n8k8
    }
  }
  float sum = 0.0f;
  for (int c = 0; c < kMmaChains; ++c)
    for (int i = 0; i < 4; ++i) sum += acc[c][i];
  if (sum == 1234.5f) out[0] = sum;  // practically never true; keeps the work alive
}

// TFLOP/s of one mma_chains<Kind> launch filling every SM.
template <MmaKind Kind>
double mma_tflops(const GpuInfo& gpu, const Context& context, float* sink) {
  const unsigned blocks = unsigned(gpu.multiprocessors) * kMmaBlocksPerSm;
  const double flops_per_mma = Kind == MmaKind::Tf32 ? 2.0 * 16 * 8 * 8 : 2.0 * 16 * 8 * 16;
  const double ms = time_ms(context, [&] {
    LAUNCH(mma_chains<Kind>, dim3(blocks), dim3(kMmaThreads), 0, context.stream, sink, kMmaIterations);
  });
  const double mmas = double(blocks) * (kMmaThreads / 32) * kMmaChains * double(kMmaIterations);
  return mmas * flops_per_mma / ms / 1e9;
}

Ceilings gpu_ceilings(Device device, const Context& context) {
  const GpuInfo& gpu = discover_gpus().gpus[size_t(device.index)];
  const size_t bytes = size_t(1) << 30;
  DeviceMemory a(device, bytes), b(device, bytes);
  fill_bytes(a.data(), 0x3c, bytes, device);
  Ceilings c;
  double copy_ms = time_ms(context, [&] {
    CHECKED(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, context.stream));
  });
  c.copy_gbs = 2.0 * double(bytes) / copy_ms / 1e6;
  unsigned blocks = unsigned(gpu.multiprocessors) * 16;
  double fma_ms = time_ms(context, [&] {
    LAUNCH(fma_chains, dim3(blocks), dim3(256), 0, context.stream, static_cast<float*>(b.data()), 0.999f, 1e-3f);
  });
  c.fp32_tflops = 2.0 * kChains * kFmaIterations * double(blocks) * 256 / fma_ms / 1e9;
  const int cc = gpu.cc_major * 10 + gpu.cc_minor;
  float* sink = static_cast<float*>(b.data());
  if (cc >= 80) {
    c.tf32_mma_tflops = mma_tflops<MmaKind::Tf32>(gpu, context, sink);
    c.bf16_mma_tflops = mma_tflops<MmaKind::Bf16>(gpu, context, sink);
  } else {
    c.mma_note = "tf32 and bf16 need sm_80, this GPU is sm_" + std::to_string(cc);
  }
  if (cc >= 75) c.fp16_mma_tflops = mma_tflops<MmaKind::Fp16>(gpu, context, sink);
  else c.mma_note = "no mma.sync before sm_75, this GPU is sm_" + std::to_string(cc);
  c.where = device.name() + " " + gpu.name;
  return c;
}
#endif

Ceilings cpu_ceilings(const Context& context) {
  const size_t bytes = size_t(256) << 20;
  std::unique_ptr<char[]> a(new char[bytes]), b(new char[bytes]);
  std::memset(a.get(), 1, bytes);
  std::memset(b.get(), 2, bytes);
  Ceilings c;
  size_t threads = size_t(cpu_pool_threads()), chunk = bytes / threads;
  double copy_ms = time_ms(context, [&] {
    parallel_for(threads, [&](size_t t) { std::memcpy(b.get() + t * chunk, a.get() + t * chunk, chunk); });
  });
  c.copy_gbs = 2.0 * double(bytes) / copy_ms / 1e6;
  // The multiply-add ceiling of the micro-kernel variant in use (kernels/cpu_isa.h), each thread
  // running its kPeakChains independent register chains: what the conv and gemm blocks can reach.
  const cpu_micro::Tiles& tiles = cpu_micro_tiles();
  const long steps = 1 << 20;
  std::vector<float> sink(threads);
  double fma_ms = time_ms(context, [&] {
    parallel_for(threads, [&](size_t t) { sink[t] = tiles.peak(steps, 1.0f + float(t)); });
  });
  c.fp32_tflops = 2.0 * cpu_micro::kPeakChains * tiles.peak_lanes * double(steps) * double(threads) / fma_ms / 1e9;
  c.mma_note = "tensor cores need a GPU";
  c.where = "cpu (" + std::to_string(threads) + " threads, " + cpu_isa_name(static_cast<CpuIsa>(tiles.variant)) + ")";
  return c;
}

std::vector<std::pair<std::string, Entry>>& registry() {
  static std::vector<std::pair<std::string, Entry>> all;
  return all;
}

}  // namespace

double time_ms(const Context& context, const std::function<void()>& run) {
  std::vector<double> times;
#if defined(__CUDACC__)
  if (context.device.is_cuda()) {
    cudaEvent_t start, stop;
    CHECKED(cudaEventCreate(&start));
    CHECKED(cudaEventCreate(&stop));
    run();  // warm-up
    CHECKED(cudaStreamSynchronize(context.stream));
    for (int r = 0; r < context.repeats; ++r) {
      CHECKED(cudaEventRecord(start, context.stream));
      run();
      CHECKED(cudaEventRecord(stop, context.stream));
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
#endif
  run();
  for (int r = 0; r < context.repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Ceilings measure_ceilings(Device device) {
  Context context;
  context.device = device;
  context.repeats = 10;
#if defined(__CUDACC__)
  if (device.is_cuda()) return gpu_ceilings(device, context);
#endif
  return cpu_ceilings(context);
}

int register_entry(const char* family, Entry entry) {
  registry().emplace_back(family, std::move(entry));
  return int(registry().size());
}

const std::vector<std::pair<std::string, Entry>>& entries() { return registry(); }

}  // namespace yolo::bench
