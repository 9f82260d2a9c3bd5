// Decoded training images kept in memory across epochs, so that each file is decoded once per run
// instead of once per epoch: in the demo's training (200 JPEGs of 640x480 at batch 16) decoding
// was 12% of the process's CPU time on 2 cores, taken from the compute threads (perf, 2026-12-02).
// A cached image is the same bytes a fresh decode gives, so batches do not change with it.
//
// Bounded: images are kept while the total stays within the budget (the first ones decoded; the
// rest are decoded each time they are used). Unreadable images are never kept: each use tries the
// file again and reports it as before. Files changed on disk during a run are not re-read once
// cached. Shared by the loaders of one process (thread-safe).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "data/image.h"

namespace yolo::data {

class ImageCache {
 public:
  explicit ImageCache(size_t budget_bytes) : budget_(budget_bytes) {}

  // Image `key` (a sample's index in its split), decoded from `path` unless cached. nullptr, with
  // `error` set as read_image sets it, when the file cannot be read or decoded.
  std::shared_ptr<const Image> read(int64_t key, const std::string& path, std::string& error);

  size_t budget_bytes() const { return budget_; }
  size_t cached_bytes() const;
  size_t cached_images() const;

 private:
  const size_t budget_;
  mutable std::mutex mutex_;
  size_t used_ = 0;
  std::unordered_map<int64_t, std::shared_ptr<const Image>> images_;
};

// The default budget: a quarter of this machine's memory, at most 4 GiB.
size_t default_image_cache_bytes();

}  // namespace yolo::data
