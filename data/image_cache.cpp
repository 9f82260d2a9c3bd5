// Decoded images in memory (see image_cache.h).
#include "data/image_cache.h"

#include <unistd.h>

#include <algorithm>

namespace yolo::data {

std::shared_ptr<const Image> ImageCache::read(int64_t key, const std::string& path, std::string& error) {
  {
    std::lock_guard lock(mutex_);
    auto it = images_.find(key);
    if (it != images_.end()) return it->second;
  }
  auto image = std::make_shared<Image>();
  if (!read_image(path, *image, error)) return nullptr;
  const size_t bytes = image->rgb.size();
  std::lock_guard lock(mutex_);
  // Another worker may have decoded it meanwhile (the same image in two batches in flight): keep one.
  auto [it, inserted] = images_.try_emplace(key, nullptr);
  if (!inserted) return it->second;
  if (used_ + bytes > budget_) {
    images_.erase(it);
    return image;
  }
  it->second = image;
  used_ += bytes;
  return image;
}

size_t ImageCache::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

size_t ImageCache::cached_images() const {
  std::lock_guard lock(mutex_);
  return images_.size();
}

size_t default_image_cache_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const size_t memory = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
  return std::min(memory / 4, size_t(4) << 30);
}

}  // namespace yolo::data
