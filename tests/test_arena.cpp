// The arena: alignment, high-water mark, overflow reports, poisoned gaps; and memory RAII.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>

#include "runtime/arena.h"
#include "runtime/check.h"
#include "runtime/stream.h"
#include "tests/test_support.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

using namespace yolo;
using namespace yolo::testing;

TEST_CASE("arena: sub-allocations are aligned and do not overlap") {
  Arena arena(Device::cpu(), 1 << 20, "align");
  Rng rng;
  CAPTURE(rng.seed());
  std::vector<std::pair<char*, size_t>> blocks;
  for (int i = 0; i < 50; ++i) {
    size_t bytes = size_t(rng.integer(0, 5000));
    size_t alignment = size_t(1) << rng.integer(0, 12);
    auto* p = static_cast<char*>(arena.allocate(bytes, "block" + std::to_string(i), alignment));
    CHECK(reinterpret_cast<uintptr_t>(p) % alignment == 0);
    std::memset(p, i, bytes);  // under ASan: touching exactly the bytes given is allowed
    blocks.push_back({p, bytes});
  }
  for (size_t i = 1; i < blocks.size(); ++i)
    CHECK(blocks[i].first >= blocks[i - 1].first + blocks[i - 1].second);
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = 0; j < blocks[i].second; j += 97) REQUIRE(blocks[i].first[j] == char(i));
}

TEST_CASE("arena: high-water mark survives reset") {
  Arena arena(Device::cpu(), 1 << 20, "hwm");
  arena.allocate(1000, "a");
  arena.allocate(3000, "b");
  size_t peak = arena.used();
  CHECK(peak >= 4000);
  CHECK(arena.high_water() == peak);
  arena.reset();
  CHECK(arena.used() == 0);
  arena.allocate(10, "c");
  CHECK(arena.high_water() == peak);
  CHECK(arena.report().find("'hwm'") != std::string::npos);
}

TEST_CASE("arena: running out names the arena, the buffer and the numbers") {
  Arena arena(Device::cpu(), 4096, "activations");
  arena.allocate(3000, "conv_0 output");
  CHECK_THROWS_WITH_AS(arena.allocate(2000, "conv_1 output"),
                       doctest::Contains("arena 'activations' on cpu is full: 'conv_1 output' needs 2000"), Error);
  CHECK_THROWS_WITH_AS(arena.allocate(8, "odd", 3), doctest::Contains("not a power of two"), Error);
  CHECK_THROWS_AS(arena.allocate(SIZE_MAX - 8, "huge"), Error);  // no overflow in the arithmetic
  CHECK_THROWS_WITH_AS(arena.allocate_array<float>((SIZE_MAX >> 2) + 2, "wraps"), doctest::Contains("overflows"), Error);
  CHECK_THROWS_WITH_AS(arena.allocate(8, "big-align", size_t(1) << 40), doctest::Contains("exceeds the arena"), Error);
  CHECK(arena.used() >= 3000);  // failed requests change nothing
}

TEST_CASE("arena: gaps between sub-allocations are poisoned under AddressSanitizer") {
  if (!asan_enabled()) SKIP_TEST("this binary is not built with AddressSanitizer (build/tests_emu is)");
#if defined(__SANITIZE_ADDRESS__)
  Arena arena(Device::cpu(), 1 << 16, "poison");
  auto* a = static_cast<char*>(arena.allocate(100, "a"));
  auto* b = static_cast<char*>(arena.allocate(256, "b"));
  CHECK_FALSE(__asan_address_is_poisoned(a));
  CHECK_FALSE(__asan_address_is_poisoned(a + 99));
  CHECK(__asan_address_is_poisoned(a + 100));   // just past a
  CHECK(__asan_address_is_poisoned(b - 1));      // just before b
  CHECK(__asan_address_is_poisoned(b + 256));    // just past b, even though b fills its alignment
  CHECK(__asan_address_is_poisoned(static_cast<char*>(b) + 4096));  // never allocated
  arena.reset();
  CHECK(__asan_address_is_poisoned(a));          // everything is poisoned again
#endif
}

TEST_CASE("memory: device buffers, pinned buffers and copies round-trip") {
  std::vector<Device> devices{Device::cpu()};
  if (!discover_gpus().gpus.empty()) devices.push_back(Device::cuda(discover_gpus().gpus[0].index));
  Rng rng;
  CAPTURE(rng.seed());
  for (Device device : devices) {
    CAPTURE(device.name());
    std::vector<float> values = rng.floats(1001);
    DeviceMemory memory(device, values.size() * sizeof(float));
    PinnedHostBuffer staging(values.size() * sizeof(float));
    std::memcpy(staging.data(), values.data(), staging.size());
    Stream stream(device, StreamPriority::Normal, "copy");
    copy_bytes(memory.data(), staging.data(), staging.size(), &stream);
    std::vector<float> back(values.size(), -1.0f);
    copy_bytes(back.data(), memory.data(), staging.size(), &stream);
    stream.synchronize();
    CHECK(back == values);
    DeviceMemory moved = std::move(memory);
    CHECK(memory.data() == nullptr);
    CHECK(moved.size() == values.size() * sizeof(float));
  }
}
