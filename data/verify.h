// Verifying a dataset's images when it is opened: each is decoded once, in parallel, so a
// corrupt, truncated or unreadable image is left out (and reported with the others) before
// training, instead of being found in the middle of an epoch. A JPEG without an end-of-image
// marker after its last scan is truncated, even where the decoder fills the missing tail with
// grey; a PNG without its IEND chunk likewise.
// Verdicts are cached, keyed by path, size and modification time, so the second opening of a
// large set takes seconds; a changed file is verified again.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace yolo::data {

// One image's verdict: kind "" when it is usable, else "unreadable image", "corrupt image",
// "truncated image" or "image format not read" (WebP, GIF, TIFF, HEIC...: named, with how to
// convert it) with a message naming the file.
struct ImageVerdict {
  std::string kind, message;
};
ImageVerdict verify_image_file(const std::string& path);

// JPEG: an end-of-image marker (FF D9) after the last start-of-scan (FF DA). Entropy-coded data
// stuffs every FF with 00, so neither marker occurs inside a scan; an EXIF thumbnail's markers
// come before the main image's scan.
bool jpeg_has_end_marker(const std::vector<uint8_t>& bytes);
// PNG: the IEND chunk's type in the last 4 KiB (its length, type and CRC end the file; a little
// trailing data is tolerated).
bool png_has_end_chunk(const std::vector<uint8_t>& bytes);

// Verifies every sample's image of `split` (options.threads, options.cache_file); those with a
// problem are left out and added to split.problems.
void verify_images(Split& split, const OpenOptions& options);

// The cache file beside the dataset (the folder of a .data or .json file, or the dataset folder
// itself): "<folder>/.train_yolo_images.cache" when the folder is writable, else "" (no cache).
std::string default_verify_cache(const std::string& dataset_path);

}  // namespace yolo::data
