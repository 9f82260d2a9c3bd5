// Fuzzes image decoding through our wrapper (decode_image: signature, dimension limits, BMP
// truncation, then stb_image) and the end-marker checks of data/verify.h on the same bytes.
#include <stb_image.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/verify.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// decode_image accepts up to 2^28 pixels, as real datasets may hold large images; decoding one
// takes seconds and gigabytes, which libFuzzer would report as a timeout or an out-of-memory
// though nothing is wrong. Headers claiming more than this are still passed to decode_image
// when they are beyond its limits (so its refusal is fuzzed), only not decoded when within.
constexpr int64_t kMaxFuzzPixels = int64_t(1) << 20;
constexpr int kMaxSide = 32768;  // data/image.cpp's limit
constexpr int64_t kMaxPixels = int64_t(1) << 28;

bool too_slow_to_decode(const uint8_t* data, size_t size) {
  int width = 0, height = 0, channels = 0;
  if (size > size_t(INT32_MAX) || !stbi_info_from_memory(data, int(size), &width, &height, &channels)) return false;
  const int64_t pixels = int64_t(width) * height;
  const bool refused = width <= 0 || height <= 0 || width > kMaxSide || height > kMaxSide || pixels > kMaxPixels;
  return !refused && pixels > kMaxFuzzPixels;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  yolo::data::jpeg_has_end_marker(bytes);
  yolo::data::png_has_end_chunk(bytes);
  if (too_slow_to_decode(data, size)) return 0;
  yolo::data::Image image;
  std::string error;
  if (yolo::data::decode_image(data, size, "fuzz.img", image, error)) {
    if (image.rgb.size() != size_t(image.width) * image.height * 3) __builtin_trap();
  } else if (error.rfind("fuzz.img: ", 0) != 0) {
    __builtin_trap();  // every refusal names the file
  }
  return 0;
}
