// The decoded-image cache: a cached image is the bytes a fresh decode gives and needs its file no
// more; images past the budget are decoded each time; unreadable files are never kept.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "data/image.h"
#include "data/image_cache.h"
#include "tests/test_support.h"

using namespace yolo::data;
using yolo::testing::TempDir;

namespace {

// A w x h PNG at `path` whose pixels depend on `seed`.
Image write_png(const std::string& path, int w, int h, int seed) {
  Image image;
  image.width = w;
  image.height = h;
  image.rgb.resize(size_t(w) * h * 3);
  for (size_t i = 0; i < image.rgb.size(); ++i) image.rgb[i] = uint8_t((i * 7 + size_t(seed) * 31) % 251);
  write_image(path, image);
  return image;
}

}  // namespace

TEST_CASE("image cache: a cached image is the fresh decode's bytes, and later reads need no file") {
  TempDir dir;
  const std::string a = dir / "a.png", b = dir / "b.png";
  const Image written_a = write_png(a, 23, 17, 1), written_b = write_png(b, 9, 31, 2);
  ImageCache cache(1 << 20);
  std::string error;
  auto first = cache.read(0, a, error);
  REQUIRE(first);
  CHECK(first->width == 23);
  CHECK(first->height == 17);
  CHECK(first->rgb == written_a.rgb);
  auto other = cache.read(1, b, error);
  REQUIRE(other);
  CHECK(other->rgb == written_b.rgb);
  CHECK(cache.cached_images() == 2);
  CHECK(cache.cached_bytes() == written_a.rgb.size() + written_b.rgb.size());

  std::filesystem::remove(a);
  std::filesystem::remove(b);
  auto again = cache.read(0, a, error);
  REQUIRE(again);
  CHECK(again->rgb == written_a.rgb);
  auto other_again = cache.read(1, b, error);
  REQUIRE(other_again);
  CHECK(other_again->rgb == written_b.rgb);
}

TEST_CASE("image cache: images past the budget are decoded each time; unreadable files are never kept") {
  TempDir dir;
  const std::string a = dir / "a.png", b = dir / "b.png", bad = dir / "bad.png";
  const Image written_a = write_png(a, 20, 10, 3);
  write_png(b, 20, 10, 4);
  ImageCache cache(written_a.rgb.size() + 1);  // room for one
  std::string error;
  REQUIRE(cache.read(0, a, error));
  auto over = cache.read(1, b, error);
  REQUIRE(over);  // returned, but not kept
  CHECK(cache.cached_images() == 1);
  CHECK(cache.cached_bytes() == written_a.rgb.size());
  std::filesystem::remove(b);
  error.clear();
  CHECK_FALSE(cache.read(1, b, error));
  CHECK(error.find("b.png") != std::string::npos);

  yolo::testing::write_text_file(bad, "this is not a PNG");
  error.clear();
  CHECK_FALSE(cache.read(2, bad, error));
  CHECK(error.find("bad.png") != std::string::npos);
  CHECK(cache.cached_images() == 1);
  // Fixed on disk: the next read decodes it (the failure was not remembered).
  ImageCache roomy(1 << 20);
  CHECK_FALSE(roomy.read(2, bad, error));
  const Image fixed = write_png(bad, 5, 6, 5);
  auto now = roomy.read(2, bad, error);
  REQUIRE(now);
  CHECK(now->rgb == fixed.rgb);
}
