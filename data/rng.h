// Counter-based randomness for the input pipeline: every random choice about a sample is a
// pure function of (seed, epoch, sample index), so batches do not depend on which thread did
// the work or in what order, and a resumed run draws exactly what an uninterrupted one would.
#pragma once
#include <cstdint>

namespace yolo::data {

// splitmix64's finaliser: a bijective mix of 64 bits.
constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t mix64(uint64_t a, uint64_t b) { return mix64(mix64(a) ^ (b + 0x632BE59BD9B4E019ull)); }
constexpr uint64_t mix64(uint64_t a, uint64_t b, uint64_t c) { return mix64(mix64(a, b), c); }

// A small generator seeded from such a key (splitmix64 stream).
class KeyedRng {
 public:
  constexpr explicit KeyedRng(uint64_t key) : state_(key) {}
  constexpr KeyedRng(uint64_t a, uint64_t b, uint64_t c = 0) : state_(mix64(a, b, c)) {}
  constexpr uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix64(state_);
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  constexpr float unit() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  constexpr float uniform(float lo, float hi) { return lo + (hi - lo) * unit(); }
  // Uniform integer in [0, n), n > 0 (multiply-shift; bias below 2^-32 for the n we use).
  constexpr uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  constexpr bool coin() { return (next() >> 63) != 0; }

 private:
  uint64_t state_;
};

}  // namespace yolo::data
