// The fast CPU ops' threading: one pool of worker threads per process (hardware threads, or
// YOLO_CPU_THREADS), running independent work items. Results must not depend on the number of
// threads: split reductions into a fixed number of chunks (independent of the thread count)
// and add the chunks' results in order afterwards. Also a per-pixel loop helper they share.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

namespace yolo {

// Runs work(i) for every i in [0, count) and returns when all are done. Items run in any order,
// on any thread; nested calls run inline on the calling thread.
void parallel_for(size_t count, const std::function<void(size_t)>& work);

int cpu_pool_threads();

// Replaces the pool with one of `threads` threads (for tests that prove results do not depend
// on the thread count). Must not run while any parallel_for is in progress.
void set_cpu_pool_threads(int threads);

// One pixel's c channels, out[ch] = f(ch, in[ch]), in blocks of 8 through a local array: all
// loads before the stores (in place is safe) and fixed-size loops that g++ vectorizes at -O2.
template <typename F>
inline void map_channels(const float* in, float* out, int c, F f) {
  int ch = 0;
  for (; ch + 8 <= c; ch += 8) {
    float t[8];
    for (int j = 0; j < 8; ++j) t[j] = in[ch + j];
    for (int j = 0; j < 8; ++j) t[j] = f(ch + j, t[j]);
    for (int j = 0; j < 8; ++j) out[ch + j] = t[j];
  }
  for (; ch < c; ++ch) out[ch] = f(ch, in[ch]);
}

// Per-thread packing buffers (slots 0 and 1) of the fast CPU gemm and conv, reused across calls;
// pool workers only read them while the call that filled them waits.
inline std::vector<float>& cpu_scratch(int slot, size_t floats) {
  thread_local std::vector<float> buffers[2];
  buffers[slot].resize(floats);
  return buffers[slot];
}

}  // namespace yolo
