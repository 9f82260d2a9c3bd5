// Image decode/encode: PNG and JPEG round trips, grey/RGBA/BMP read as RGB, header-only size,
// and every bad file (missing, truncated, not an image, empty, absurd header) giving an error
// that names the file; bad write targets throw naming the file.
#include <doctest/doctest.h>

#include <stb_image_write.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "data/image.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

// A smooth pattern with some random texture: JPEG keeps it close, PNG exact.
Image test_image(int width, int height, Rng& rng) {
  Image image;
  image.width = width;
  image.height = height;
  image.rgb.resize(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = image.pixel(x, y);
      p[0] = uint8_t(x * 255 / width);
      p[1] = uint8_t(y * 255 / height);
      p[2] = uint8_t(128 + rng.integer(-8, 8));
    }
  return image;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(out.good());
}

// read_image must fail with a message that names the file and contains `reason`.
void check_read_fails(const std::string& path, const std::string& reason) {
  CAPTURE(path);
  Image image;
  std::string error;
  CHECK_FALSE(read_image(path, image, error));
  CHECK(error.find(path) != std::string::npos);
  CHECK_MESSAGE(error.find(reason) != std::string::npos, error);
}

}  // namespace

TEST_CASE("image: PNG round trip is exact, JPEG close; sizes from the header") {
  TempDir dir;
  Rng rng;
  CAPTURE(rng.seed());
  Image original = test_image(37, 23, rng);  // odd sizes: no row padding assumptions
  for (const char* name : {"a.png", "b.PNG"}) {
    write_image(dir / name, original);
    Image back;
    std::string error;
    REQUIRE_MESSAGE(read_image(dir / name, back, error), error);
    CHECK(back.width == 37);
    CHECK(back.height == 23);
    CHECK(back.rgb == original.rgb);
  }
  for (const char* name : {"c.jpg", "d.JPEG"}) {
    write_image(dir / name, original, 95);
    Image back;
    std::string error;
    REQUIRE_MESSAGE(read_image(dir / name, back, error), error);
    REQUIRE(back.width == 37);
    REQUIRE(back.height == 23);
    double sum = 0;
    for (size_t i = 0; i < back.rgb.size(); ++i) sum += std::abs(int(back.rgb[i]) - int(original.rgb[i]));
    double mean_error = sum / double(back.rgb.size());
    CHECK(mean_error < 6.0);
    CHECK(mean_error > 0.0);  // lossy: proves the JPEG path really ran
    CHECK(file_bytes(dir / name)[0] == 0xFF);
  }
  int width = 0, height = 0;
  std::string error;
  REQUIRE_MESSAGE(read_image_size(dir / "c.jpg", width, height, error), error);
  CHECK(width == 37);
  CHECK(height == 23);
  REQUIRE_MESSAGE(read_image_size(dir / "a.png", width, height, error), error);
  CHECK(width == 37);
  CHECK(height == 23);
}

TEST_CASE("image: grey and RGBA PNG and BMP are read as RGB") {
  TempDir dir;
  const int w = 5, h = 3;
  std::vector<uint8_t> grey(w * h), rgba(w * h * 4), rgb(w * h * 3);
  for (int i = 0; i < w * h; ++i) {
    grey[i] = uint8_t(i * 17);
    for (int c = 0; c < 4; ++c) rgba[i * 4 + c] = uint8_t(i * 10 + c * 3);
    for (int c = 0; c < 3; ++c) rgb[i * 3 + c] = uint8_t(200 - i * 7 - c);
  }
  REQUIRE(stbi_write_png((dir / "grey.png").c_str(), w, h, 1, grey.data(), w));
  REQUIRE(stbi_write_png((dir / "rgba.png").c_str(), w, h, 4, rgba.data(), w * 4));
  REQUIRE(stbi_write_bmp((dir / "rgb.bmp").c_str(), w, h, 3, rgb.data()));
  Image image;
  std::string error;
  REQUIRE_MESSAGE(read_image(dir / "grey.png", image, error), error);
  REQUIRE(image.rgb.size() == size_t(w * h * 3));
  for (int i = 0; i < w * h; ++i)
    for (int c = 0; c < 3; ++c) CHECK(image.rgb[i * 3 + c] == grey[i]);
  REQUIRE_MESSAGE(read_image(dir / "rgba.png", image, error), error);
  REQUIRE(image.rgb.size() == size_t(w * h * 3));
  for (int i = 0; i < w * h; ++i)
    for (int c = 0; c < 3; ++c) CHECK(image.rgb[i * 3 + c] == rgba[i * 4 + c]);  // alpha dropped
  REQUIRE_MESSAGE(read_image(dir / "rgb.bmp", image, error), error);
  CHECK(image.width == w);
  CHECK(image.height == h);
  CHECK(image.rgb == rgb);
  int width = 0, height = 0;
  REQUIRE_MESSAGE(read_image_size(dir / "rgb.bmp", width, height, error), error);
  CHECK(width == w);
  CHECK(height == h);
}

TEST_CASE("image: decode_image from memory names the source") {
  TempDir dir;
  Rng rng;
  Image original = test_image(8, 6, rng);
  write_image(dir / "m.png", original);
  std::vector<uint8_t> bytes = file_bytes(dir / "m.png");
  Image image;
  std::string error;
  REQUIRE_MESSAGE(decode_image(bytes.data(), bytes.size(), "in-memory", image, error), error);
  CHECK(image.rgb == original.rgb);
  bytes.resize(bytes.size() / 2);
  CHECK_FALSE(decode_image(bytes.data(), bytes.size(), "member.png of archive", image, error));
  CHECK(error.find("member.png of archive") != std::string::npos);
}

TEST_CASE("image: bad files give an error naming the file, never a crash") {
  TempDir dir;
  Rng rng;
  Image original = test_image(64, 48, rng);
  write_image(dir / "good.jpg", original);
  write_image(dir / "good.png", original);
  std::vector<uint8_t> jpeg = file_bytes(dir / "good.jpg");
  std::vector<uint8_t> png = file_bytes(dir / "good.png");

  check_read_fails(dir / "missing.jpg", "no such file");
  std::filesystem::create_directories(dir / "folder.jpg");
  check_read_fails(dir / "folder.jpg", "is a directory");

  write_text_file(dir / "empty.jpg", "");
  check_read_fails(dir / "empty.jpg", "empty file");
  write_text_file(dir / "text.jpg", "this is not an image, just text renamed to .jpg\n");
  check_read_fails(dir / "text.jpg", "not a JPEG, PNG or BMP image");

  // Truncated at several points: in the headers, mid-scan, and just the final EOI marker lost.
  for (size_t keep : {size_t(20), jpeg.size() / 2, jpeg.size() - 2}) {
    CAPTURE(keep);
    write_bytes(dir / "cut.jpg", std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + keep));
    check_read_fails(dir / "cut.jpg", "corrupt");
  }
  for (size_t keep : {size_t(12), size_t(40), png.size() / 2}) {
    CAPTURE(keep);
    write_bytes(dir / "cut.png", std::vector<uint8_t>(png.begin(), png.begin() + keep));
    check_read_fails(dir / "cut.png", "corrupt");
  }
  // PNG signature followed by garbage.
  std::vector<uint8_t> garbage(png.begin(), png.begin() + 8);
  for (int i = 0; i < 200; ++i) garbage.push_back(uint8_t(rng.integer(0, 255)));
  write_bytes(dir / "garbage.png", garbage);
  check_read_fails(dir / "garbage.png", "corrupt");

  // A BMP whose data is cut off (stb would pad it with zeros).
  std::vector<uint8_t> rgb(16 * 16 * 3, 77);
  REQUIRE(stbi_write_bmp((dir / "full.bmp").c_str(), 16, 16, 3, rgb.data()));
  std::vector<uint8_t> bmp = file_bytes(dir / "full.bmp");
  write_bytes(dir / "cut.bmp", std::vector<uint8_t>(bmp.begin(), bmp.begin() + bmp.size() / 2));
  check_read_fails(dir / "cut.bmp", "truncated");

  // Headers claiming absurd sizes are refused before any allocation: a PNG 40000 pixels wide,
  // and a JPEG of 30000 x 30000 (each side allowed, the pixel count not).
  std::vector<uint8_t> huge(png.begin(), png.begin() + 33);  // signature + IHDR
  auto put32 = [](uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (24 - 8 * i));
  };
  put32(&huge[16], 40000);
  put32(&huge[20], 2);
  write_bytes(dir / "huge.png", huge);
  check_read_fails(dir / "huge.png", "40000x2");
  std::vector<uint8_t> big = jpeg;
  size_t sof = 2;
  while (sof + 9 < big.size() && !(big[sof] == 0xFF && big[sof + 1] == 0xC0)) ++sof;
  REQUIRE(sof + 9 < big.size());
  for (size_t at : {sof + 5, sof + 7}) {
    big[at] = uint8_t(30000 >> 8);
    big[at + 1] = uint8_t(30000 & 0xFF);
  }
  write_bytes(dir / "huge.jpg", big);
  check_read_fails(dir / "huge.jpg", "30000x30000");
  // Sizes within the limits that the file's data cannot hold (stb allocates the whole image
  // first: 768 MB for these): a PNG whose IDAT is a 64x48 image's, a JPEG of 16000 x 16000.
  std::vector<uint8_t> forged = png;
  put32(&forged[16], 16000);
  put32(&forged[20], 16000);
  write_bytes(dir / "forged.png", forged);
  check_read_fails(dir / "forged.png", "compressed data cannot hold: truncated or forged?");
  for (size_t at : {sof + 5, sof + 7}) {
    big[at] = uint8_t(16000 >> 8);
    big[at + 1] = uint8_t(16000 & 0xFF);
  }
  write_bytes(dir / "forged.jpg", big);
  check_read_fails(dir / "forged.jpg", "16000x16000 pixels, more than its");
  int width = 0, height = 0;
  std::string error;
  CHECK_FALSE(read_image_size(dir / "huge.png", width, height, error));
  CHECK(error.find("huge.png") != std::string::npos);

  CHECK_FALSE(read_image_size(dir / "missing.png", width, height, error));
  CHECK(error.find("missing.png: no such file") != std::string::npos);
  CHECK_FALSE(read_image_size(dir / "text.jpg", width, height, error));
  CHECK(error.find("text.jpg") != std::string::npos);
  CHECK_FALSE(read_image_size(dir / "empty.jpg", width, height, error));
  CHECK(error.find("empty.jpg: empty file") != std::string::npos);
}

TEST_CASE("image: WebP, GIF, TIFF, HEIC and AVIF are named as formats not read, with how to convert; not corrupt") {
  TempDir dir;
  // Each format's leading bytes as its writers put them, then some data.
  auto with_tail = [](std::string head) {
    for (int i = 0; i < 64; ++i) head.push_back(char(i * 7));
    return std::vector<uint8_t>(head.begin(), head.end());
  };
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {"WebP", with_tail(std::string("RIFF\x24\0\0\0WEBPVP8 ", 16))},
      {"GIF", with_tail("GIF89a")},
      {"TIFF", with_tail(std::string("II*\0\x08\0\0\0", 8))},
      {"TIFF", with_tail(std::string("MM\0*\0\0\0\x08", 8))},
      {"HEIC", with_tail(std::string("\0\0\0\x18" "ftypheic", 12))},
      {"AVIF", with_tail(std::string("\0\0\0\x1C" "ftypavif", 12))},
  };
  for (const auto& [format, bytes] : files) {
    CAPTURE(format);
    CHECK(unsupported_image_format(bytes.data(), bytes.size()) == format);
    const std::string path = dir / ("photo." + format);
    write_bytes(path, bytes);
    Image image;
    std::string error;
    CHECK_FALSE(read_image(path, image, error));
    CHECK(error.find(path + ": a " + format + " image: this program reads JPEG, PNG and BMP only; convert it first") ==
          0);
    CHECK(error.find("corrupt") == std::string::npos);
    int width = 0, height = 0;
    CHECK_FALSE(read_image_size(path, width, height, error));
    CHECK(error.find("a " + format + " image") != std::string::npos);
  }
  // JPEG, PNG and BMP, and unknown bytes, are none of these.
  Rng rng;
  write_image(dir / "good.png", test_image(8, 8, rng));
  const std::vector<uint8_t> png = file_bytes(dir / "good.png");
  CHECK(unsupported_image_format(png.data(), png.size()).empty());
  const std::string text = "RIFF but not a WebP, just text";
  CHECK(unsupported_image_format(reinterpret_cast<const uint8_t*>(text.data()), text.size()).empty());
  CHECK(unsupported_image_format(png.data(), 2).empty());
}

TEST_CASE("image: reading from many threads at once gives each its own result and error") {
  TempDir dir;
  Rng rng;
  Image original = test_image(40, 30, rng);
  write_image(dir / "ok.png", original);
  std::vector<uint8_t> png = file_bytes(dir / "ok.png");
  write_bytes(dir / "bad.png", std::vector<uint8_t>(png.begin(), png.begin() + 60));
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        Image image;
        std::string error;
        bool good = (i + t) % 2 == 0;
        bool ok = read_image(dir / (good ? "ok.png" : "bad.png"), image, error);
        if (ok != good || (good && image.rgb != original.rgb) ||
            (!good && error.find("bad.png: corrupt") == std::string::npos))
          ++failures[t];
      }
    });
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) CHECK(failures[t] == 0);
}

TEST_CASE("image: writing to a bad place or format throws naming the file") {
  TempDir dir;
  Rng rng;
  Image image = test_image(4, 4, rng);
  std::string unwritable = dir / "no/such/folder/x.png";
  CHECK_THROWS_WITH_AS(write_image(unwritable, image), doctest::Contains(unwritable.c_str()), Error);
  std::filesystem::create_directories(dir / "taken.jpg");  // a directory where the file should go
  CHECK_THROWS_WITH_AS(write_image(dir / "taken.jpg", image), doctest::Contains((dir / "taken.jpg").c_str()), Error);
  CHECK_THROWS_WITH_AS(write_image(dir / "x.gif", image), doctest::Contains("x.gif: unknown extension '.gif'"), Error);
  CHECK_THROWS_WITH_AS(write_image(dir / "noext", image), doctest::Contains("noext"), Error);
  CHECK_THROWS_WITH_AS(write_image(dir / "q.jpg", image, 0), doctest::Contains("quality 0"), Error);
  Image wrong = image;
  wrong.rgb.pop_back();
  CHECK_THROWS_WITH_AS(write_image(dir / "w.png", wrong), doctest::Contains("w.png"), Error);
  CHECK_FALSE(std::filesystem::exists(dir / "w.png"));
}
