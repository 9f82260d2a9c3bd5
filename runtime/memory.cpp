// Device and pinned host memory (see memory.h).
#include "runtime/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/stream.h"
#include "runtime/stream_queue.h"
#if YOLO_EMULATED_KERNELS
#include "runtime/emu/device.h"
#endif

namespace yolo {

namespace {
constexpr size_t kHostAlignment = 4096;

// Exactly `bytes` (not rounded up), so AddressSanitizer sees the true end of the buffer.
void* host_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  if (posix_memalign(&p, kHostAlignment, bytes == 0 ? 1 : bytes) != 0)
    throw Error(std::string("out of host memory allocating ") + std::to_string(bytes) + " bytes for " + what);
  return p;
}

// The CPU device's memory (the arena of a CPU run: activations of tens of MB streamed by every
// op): large blocks on 2 MiB boundaries with transparent huge pages asked for, so that streaming
// them does not walk the page tables every 4 KiB. Where the kernel does not do it (THP off), the
// advice is ignored and the memory is ordinary.
void* cpu_device_alloc(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes < kHuge) return host_alloc(bytes, "CPU device memory");
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, bytes) != 0)
    throw Error(std::string("out of host memory allocating ") + std::to_string(bytes) + " bytes for CPU device memory");
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
  return p;
}

[[maybe_unused]] std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(1ull << 30));
  return text;
}
}  // namespace

DeviceMemory::DeviceMemory(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  if (device.is_emu()) {
#if YOLO_EMULATED_KERNELS
    data_ = emu::allocate_device(device.index, bytes);
    return;
#else
    set_current_device(device);  // throws: no emulated GPUs in this build
#endif
  }
  if (!device.is_cuda()) {
    data_ = cpu_device_alloc(bytes);
    return;
  }
#if YOLO_CUDA
  set_current_device(device);
  cudaError_t status = cudaMalloc(&data_, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw Error("out of memory on " + device.name() + ": asked for " + gib(bytes) + ", " +
                gib(free_bytes) + " free of " + gib(total));
  }
  CHECKED(status);
#else
  throw Error("a CUDA device was requested from a CPU-only build");
#endif
}

void DeviceMemory::release() {
  if (!data_) return;
  if (device_.is_cuda()) {
#if YOLO_CUDA
    cudaFree(data_);  // never throws from a destructor; errors surface on the next checked call
#endif
  } else if (device_.is_emu()) {
#if YOLO_EMULATED_KERNELS
    emu::free_device(data_);
#endif
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

DeviceMemory::~DeviceMemory() { release(); }

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedHostBuffer::PinnedHostBuffer(size_t bytes) : bytes_(bytes) {
#if YOLO_CUDA
  if (!discover_gpus().gpus.empty()) {
    CHECKED(cudaHostAlloc(&data_, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
    pinned_ = true;
    return;
  }
#elif YOLO_EMULATED_KERNELS
  data_ = emu::allocate_pinned(bytes);
  pinned_ = true;
  return;
#endif
  data_ = host_alloc(bytes, "a host buffer");
}

void PinnedHostBuffer::release() {
  if (!data_) return;
#if YOLO_CUDA
  if (pinned_) cudaFreeHost(data_);
#elif YOLO_EMULATED_KERNELS
  if (pinned_) emu::free_pinned(data_);
#endif
  if (!pinned_) std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
}

PinnedHostBuffer::~PinnedHostBuffer() { release(); }

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_ = std::exchange(o.pinned_, false);
  }
  return *this;
}

#if YOLO_EMULATED_KERNELS
namespace {

// A copy queued on an emulated GPU's stream, as cudaMemcpyAsync behaves (memory.h).
void emulated_copy(void* dst, const void* src, size_t bytes, Stream& stream) {
  using emu::MemoryKind;
  const MemoryKind to = emu::memory_kind(dst), from = emu::memory_kind(src);
  StreamQueue& queue = *stream.queue();
  if (from == MemoryKind::Pageable && to == MemoryKind::Device) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                              static_cast<const unsigned char*>(src) + bytes);
    queue.push([dst, staged] {
      emu::DeviceAccess access;
      std::memcpy(dst, staged->data(), staged->size());
    });
    return;
  }
  uint64_t item = queue.push([dst, src, bytes] {
    emu::DeviceAccess access;
    std::memcpy(dst, src, bytes);
  });
  // To pageable memory, or between host buffers: done when the call returns.
  if (to == MemoryKind::Pageable || (to != MemoryKind::Device && from != MemoryKind::Device)) queue.wait_for(item);
}

}  // namespace
#endif

void copy_bytes(void* dst, const void* src, size_t bytes, Stream* stream) {
  if (bytes == 0) return;
  if (stream && stream->device().is_cuda()) {
#if YOLO_CUDA
    // Unified addressing lets the runtime tell host from device pointers.
    CHECKED(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream->native()));
#endif
    return;
  }
#if YOLO_EMULATED_KERNELS
  if (stream && stream->device().is_emu()) {
    emulated_copy(dst, src, bytes, *stream);
    return;
  }
  if (emu::memory_kind(dst) == emu::MemoryKind::Device || emu::memory_kind(src) == emu::MemoryKind::Device) {
    auto copy = [=] {
      emu::DeviceAccess access;
      std::memcpy(dst, src, bytes);
    };
    if (stream) stream->enqueue(copy);
    else copy();
    return;
  }
#endif
  if (stream) {
    stream->enqueue([=] { std::memcpy(dst, src, bytes); });
    return;
  }
#if YOLO_CUDA
  if (!discover_gpus().gpus.empty()) {
    CHECKED(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void copy_and_wait(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes == 0) return;  // empty host vectors have no data pointer
  copy_bytes(dst, src, bytes, &stream);
  stream.synchronize();
}

void fill_bytes(void* dst, int value, size_t bytes, Device device) {
  if (device.is_cuda()) {
#if YOLO_CUDA
    set_current_device(device);
    CHECKED(cudaMemset(dst, value, bytes));
#endif
    return;
  }
#if YOLO_EMULATED_KERNELS
  if (device.is_emu()) {
    emu::DeviceAccess access;
    std::memset(dst, value, bytes);
    return;
  }
#endif
  std::memset(dst, value, bytes);
}

void fill_bytes(void* dst, int value, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  if (stream.device().is_cuda()) {
#if YOLO_CUDA
    CHECKED(cudaMemsetAsync(dst, value, bytes, stream.native()));
#endif
    return;
  }
  Device device = stream.device();
  stream.enqueue([=] { fill_bytes(dst, value, bytes, device); });
}

std::optional<MemoryInfo> device_memory_info(Device device) {
  MemoryInfo info;
  if (device.is_cuda()) {
#if YOLO_CUDA
    set_current_device(device);
    CHECKED(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
#endif
    return info;
  }
#if YOLO_EMULATED_KERNELS
  if (device.is_emu()) {
    info.total_bytes = emu::device_props(device.index).memory_bytes;
    size_t used = emu::device_bytes_in_use(device.index);
    info.free_bytes = info.total_bytes > used ? info.total_bytes - used : 0;
    return info;
  }
#endif
  return std::nullopt;
}

}  // namespace yolo
