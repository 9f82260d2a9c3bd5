// One arena per device: a single large allocation, sub-allocated by offset (bump pointer),
// with a high-water mark. The graph plans every buffer of a step into it once, so nothing is
// allocated inside a training step.
// Where the arena is host memory and AddressSanitizer is on (CPU and emulated builds), the
// whole arena starts poisoned, each sub-allocation unpoisons exactly its bytes, and a red zone
// separates neighbours: an out-of-bounds access by a kernel or op is reported, not hidden.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/memory.h"

namespace yolo {

class Arena {
 public:
  static constexpr size_t kDefaultAlignment = 256;  // what vectorised and TMA loads want

  Arena(Device device, size_t capacity_bytes, std::string name);
  ~Arena();
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  // Returns `bytes` of memory aligned to `alignment` (a power of two). Throws yolo::Error naming
  // the arena, the tag and the numbers when it does not fit.
  void* allocate(size_t bytes, const std::string& tag, size_t alignment = kDefaultAlignment);
  template <typename T>
  T* allocate_array(size_t count, const std::string& tag) {
    if (count > SIZE_MAX / sizeof(T)) throw_too_large(count, sizeof(T), tag);
    return static_cast<T*>(allocate(count * sizeof(T), tag, alignof(T) > kDefaultAlignment ? alignof(T) : kDefaultAlignment));
  }
  // Forgets every sub-allocation (re-poisons them); the high-water mark is kept.
  void reset();

  size_t used() const { return used_; }
  size_t high_water() const { return high_water_; }
  size_t capacity() const { return memory_.size(); }
  size_t red_zone() const { return red_zone_; }
  Device device() const { return memory_.device(); }
  const std::string& name() const { return name_; }
  std::string report() const;  // one line per sub-allocation, for the memory plan

 private:
  [[noreturn]] void throw_too_large(size_t count, size_t element_bytes, const std::string& tag) const;
  struct Block {
    std::string tag;
    size_t offset, bytes;
  };
  DeviceMemory memory_;
  std::string name_;
  size_t used_ = 0, high_water_ = 0, red_zone_ = 0;
  bool poisoning_ = false;
  std::vector<Block> blocks_;
};

// True when this binary was built with AddressSanitizer.
bool asan_enabled();

}  // namespace yolo
