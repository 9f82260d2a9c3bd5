// Memory that owns itself (RAII, move-only): device memory (cudaMalloc, an emulated GPU's
// protected memory, or aligned host memory for the CPU backend), pinned host buffers for fast,
// asynchronous copies, and copies and fills between and of any of them.
#pragma once
#include <cstddef>
#include <optional>
#include <utility>

#include "runtime/device.h"

namespace yolo {

class Stream;

class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(Device device, size_t bytes);  // throws yolo::Error with the sizes when out of memory
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept { *this = std::move(o); }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release();
  Device device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory when a CUDA device can pin it (in builds with emulated kernels:
// registered as pinned), ordinary aligned memory otherwise (pinned() tells which); either way
// safe to use as a copy source or target.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(size_t bytes);
  ~PinnedHostBuffer();
  PinnedHostBuffer(PinnedHostBuffer&& o) noexcept { *this = std::move(o); }
  PinnedHostBuffer& operator=(PinnedHostBuffer&& o) noexcept;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

// Copies bytes between host and device memory of any kind, as cudaMemcpy(Async) does.
// With a stream the copy is queued on it, after the stream's earlier work. For GPU and emulated
// GPU streams: asynchronous between device memory and pinned host memory (the host buffer must
// stay untouched until the stream is synchronised); from pageable host memory the source is
// staged before the call returns (the caller may reuse it at once); to pageable host memory the
// call returns once the copy is done. CPU streams: always asynchronous. Without a stream the copy
// is done when the call returns, and it is NOT ordered after any stream's work (our streams are
// non-blocking, as on a GPU): synchronise the stream that wrote the data first.
void copy_bytes(void* dst, const void* src, size_t bytes, Stream* stream = nullptr);
// copy_bytes on `stream`, then the stream synchronised (its errors rethrown): the copy comes
// after the stream's earlier work and is done when the call returns. Nothing for 0 bytes.
void copy_and_wait(void* dst, const void* src, size_t bytes, Stream& stream);

// Fills device or host memory with a byte value now (for poisoning buffers in tests), or queued
// on a stream after its earlier work (cudaMemsetAsync).
void fill_bytes(void* dst, int value, size_t bytes, Device device);
void fill_bytes(void* dst, int value, size_t bytes, Stream& stream);

// Free and total memory of a GPU or an emulated GPU; nullopt for the CPU (no fixed budget).
struct MemoryInfo {
  size_t free_bytes = 0, total_bytes = 0;
};
std::optional<MemoryInfo> device_memory_info(Device device);

}  // namespace yolo
