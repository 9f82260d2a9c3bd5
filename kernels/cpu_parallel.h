// The fast CPU ops' threading: one pool of worker threads per process (hardware threads, or
// YOLO_CPU_THREADS), running independent work items. Results must not depend on the number of
// threads: split reductions into a fixed number of chunks (independent of the thread count)
// and add the chunks' results in order afterwards.
#pragma once
#include <cstddef>
#include <functional>

namespace yolo {

// Runs work(i) for every i in [0, count) and returns when all are done. Items run in any order,
// on any thread; nested calls run inline on the calling thread.
void parallel_for(size_t count, const std::function<void(size_t)>& work);

int cpu_pool_threads();

}  // namespace yolo
