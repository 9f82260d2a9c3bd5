// The per-device memory arena (see arena.h).
#include "runtime/arena.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "runtime/check.h"

#if defined(__SANITIZE_ADDRESS__)
#define YOLO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define YOLO_ASAN 1
#endif
#endif

#if YOLO_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace yolo {

bool asan_enabled() {
#if YOLO_ASAN
  return true;
#else
  return false;
#endif
}

Arena::Arena(Device device, size_t capacity_bytes, std::string name)
    : memory_(device, capacity_bytes), name_(std::move(name)) {
  poisoning_ = asan_enabled() && !device.is_cuda();
  // A red zone only where something can see it: it would waste device memory otherwise.
  red_zone_ = poisoning_ ? 64 : 0;
  if (poisoning_) POISON(memory_.data(), capacity_bytes);
}

Arena::~Arena() {
  if (poisoning_ && memory_.data()) UNPOISON(memory_.data(), memory_.size());
}

void* Arena::allocate(size_t bytes, const std::string& tag, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw Error("arena '" + name_ + "': alignment " + std::to_string(alignment) + " for '" + tag +
                "' is not a power of two");
  if (alignment > capacity())
    throw Error("arena '" + name_ + "': alignment " + std::to_string(alignment) + " for '" + tag +
                "' exceeds the arena's capacity");
  // Align the address, not just the offset (bases are 4096-aligned on the host, 256 from
  // cudaMalloc). Every term is below capacity + alignment here, so nothing wraps.
  uintptr_t base = reinterpret_cast<uintptr_t>(memory_.data());
  size_t start = used_ == 0 ? 0 : used_ + red_zone_;
  start += (alignment - (base + start) % alignment) % alignment;
  if (start > capacity() || bytes > capacity() - start) {
    char text[512];
    size_t usable = start > capacity() ? 0 : capacity() - start;
    std::snprintf(text, sizeof text,
                  "arena '%s' on %s is full: '%s' needs %zu bytes (aligned to %zu) but only %zu of "
                  "%zu bytes are left at that alignment (%zu used, high water %zu)",
                  name_.c_str(), device().name().c_str(), tag.c_str(), bytes, alignment, usable,
                  capacity(), used_, high_water_);
    throw Error(text);
  }
  char* p = static_cast<char*>(memory_.data()) + start;
  if (poisoning_) UNPOISON(p, bytes);
  used_ = start + bytes;
  if (used_ > high_water_) high_water_ = used_;
  blocks_.push_back({tag, start, bytes});
  return p;
}

void Arena::throw_too_large(size_t count, size_t element_bytes, const std::string& tag) const {
  throw Error("arena '" + name_ + "': '" + tag + "' asks for " + std::to_string(count) + " elements of " +
              std::to_string(element_bytes) + " bytes, which overflows a size");
}

void Arena::reset() {
  if (poisoning_) POISON(memory_.data(), memory_.size());
  used_ = 0;
  blocks_.clear();
}

std::string Arena::report() const {
  std::string out;
  char line[256];
  for (const Block& b : blocks_) {
    std::snprintf(line, sizeof line, "  %12zu  %12zu  %s\n", b.offset, b.bytes, b.tag.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  arena '%s' on %s: %zu of %zu bytes used, high water %zu\n",
                name_.c_str(), device().name().c_str(), used_, capacity(), high_water_);
  return out + line;
}

}  // namespace yolo
