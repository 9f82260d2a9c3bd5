// Images in memory (8-bit RGB, row-major, interleaved) and on disk: decoding JPEG, PNG and
// BMP through stb_image (grey and RGBA become RGB), writing PNG and JPEG.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace yolo::data {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
  uint8_t* pixel(int x, int y) { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
  const uint8_t* pixel(int x, int y) const { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
};

// Decodes `path`. On failure returns false and sets `error` to a message naming the file and
// the reason (missing, unreadable, not an image, corrupt); never throws for bad files.
bool read_image(const std::string& path, Image& image, std::string& error);

// Decodes an in-memory encoded image (same rules); `name` is used in the error message.
bool decode_image(const uint8_t* bytes, size_t size, const std::string& name, Image& image, std::string& error);

// The name of an image format recognised by its leading bytes but not read here ("WebP", "GIF",
// "TIFF", "HEIC", "AVIF", "JPEG XL", "JPEG 2000"), or "" (a JPEG, PNG or BMP, or no known format).
std::string unsupported_image_format(const uint8_t* bytes, size_t size);

// Reads only the header of `path` for its size (VOC files without a <size> element).
bool read_image_size(const std::string& path, int& width, int& height, std::string& error);

// Writes PNG or JPEG, chosen by the extension (.png, .jpg/.jpeg); throws yolo::Error naming the
// file if it cannot be written. JPEG quality 1..100.
void write_image(const std::string& path, const Image& image, int jpeg_quality = 90);

}  // namespace yolo::data
