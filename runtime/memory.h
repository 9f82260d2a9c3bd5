// Memory that owns itself (RAII, move-only): device memory (cudaMalloc, or aligned host memory
// for the CPU backend), pinned host buffers for fast, asynchronous copies, and copies between
// any two of them.
#pragma once
#include <cstddef>
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

// Page-locked host memory when a CUDA device can pin it, ordinary aligned memory otherwise
// (pinned() tells which); either way safe to use as a copy source or target.
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

// Copies bytes between host and device memory of any kind. With a stream the copy is queued
// on it (asynchronous for CUDA streams with pinned host memory); without, it completes before
// returning.
void copy_bytes(void* dst, const void* src, size_t bytes, Stream* stream = nullptr);

// Fills device or host memory with a byte value (for poisoning buffers in tests).
void fill_bytes(void* dst, int value, size_t bytes, Device device);

}  // namespace yolo
