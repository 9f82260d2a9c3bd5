// One pass over a dataset that finds every problem (data/verify.h, data/problems.h): a hostile
// darknet set (a malformed label file, an unknown class, a truncated JPEG that still decodes, a
// corrupt image, a missing one) gives all five problems in one opening, with the good items kept;
// the report groups them by kind; --strict and too many unusable items stop; the verdicts'
// cache is used and invalidated by a change.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image.h"
#include "data/problems.h"
#include "data/verify.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo::data;
using yolo::testing::TempDir;
using yolo::testing::write_text_file;

namespace fs = std::filesystem;

namespace {

void write_small_image(const std::string& path, uint8_t shade) {
  Image image;
  image.width = 11;
  image.height = 7;
  image.rgb.assign(11 * 7 * 3, shade);
  for (size_t i = 0; i < image.rgb.size(); i += 7) image.rgb[i] = static_cast<uint8_t>(i);  // not flat
  write_image(path, image);
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const yolo::Error& e) {
    return e.what();
  }
  return "";
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// 100 good images (JPEG and PNG) plus the five bad items; train.txt lists them all.
struct HostileSet {
  TempDir dir;
  std::string data = dir / "set/obj.data";
  HostileSet() {
    fs::create_directories(dir / "set/images");
    fs::create_directories(dir / "set/labels");
    std::string list;
    for (int i = 0; i < 100; ++i) {
      std::string name = "good" + std::to_string(i) + (i % 2 ? ".png" : ".jpg");
      write_small_image(dir / ("set/images/" + name), static_cast<uint8_t>(i));
      write_text_file(dir / ("set/labels/good" + std::to_string(i) + ".txt"), "1 0.5 0.5 0.2 0.3\n");
      list += "images/" + name + "\n";
    }
    write_small_image(dir / "set/images/malformed.jpg", 1);
    write_text_file(dir / "set/labels/malformed.txt", "0 0.5 0.5 0.1 0.1\n0 0.5 0.5\n");
    write_small_image(dir / "set/images/unknown.jpg", 2);
    write_text_file(dir / "set/labels/unknown.txt", "7 0.5 0.5 0.1 0.1\n");
    // Truncated by its last 2 bytes (the end-of-image marker).
    write_small_image(dir / "set/images/truncated.jpg", 3);
    std::vector<uint8_t> bytes = file_bytes(dir / "set/images/truncated.jpg");
    bytes.resize(bytes.size() - 2);
    write_bytes(dir / "set/images/truncated.jpg", bytes);
    write_text_file(dir / "set/images/corrupt.jpg", "\xFF\xD8 not really a JPEG \xFF\xDA\x01\xFF\xD9");
    list += "images/malformed.jpg\nimages/unknown.jpg\nimages/truncated.jpg\nimages/corrupt.jpg\nimages/gone.jpg\n";
    write_text_file(dir / "set/train.txt", list);
    write_text_file(dir / "set/obj.data", "classes = 2\ntrain = train.txt\n");
  }
  Dataset open(OpenOptions options = {}) {
    options.verify_images = true;
    options.threads = 2;
    return open_dataset(data, options);
  }
};

std::string kinds_of(const Split& split) {
  std::string out;
  for (const Problem& p : split.problems) out += p.kind + ";";
  return out;
}

}  // namespace

TEST_CASE("verify_image_file: truncated JPEG and PNG named as such, corrupt and unreadable files") {
  TempDir dir;
  write_small_image(dir / "a.jpg", 9);
  CHECK(verify_image_file(dir / "a.jpg").kind.empty());
  std::vector<uint8_t> bytes = file_bytes(dir / "a.jpg");
  bytes.resize(bytes.size() - 2);  // the end-of-image marker
  write_bytes(dir / "cut.jpg", bytes);
  ImageVerdict cut = verify_image_file(dir / "cut.jpg");
  CHECK(cut.kind == "truncated image");
  CHECK(has(cut.message, "cut.jpg: JPEG without its end-of-image marker"));
  write_small_image(dir / "b.png", 9);
  CHECK(verify_image_file(dir / "b.png").kind.empty());
  bytes = file_bytes(dir / "b.png");
  bytes.resize(bytes.size() - 12);  // the IEND chunk
  write_bytes(dir / "cut.png", bytes);
  CHECK(verify_image_file(dir / "cut.png").kind == "truncated image");
  write_text_file(dir / "empty.jpg", "");
  CHECK(verify_image_file(dir / "empty.jpg").kind == "corrupt image");
  write_text_file(dir / "text.png", "\x89PNG this is not one ... IEND");
  CHECK(verify_image_file(dir / "text.png").kind == "corrupt image");
  CHECK(verify_image_file(dir / "none.jpg").kind == "unreadable image");
  // A WebP saved as .jpg (scrapers do that) is a format not read, not a corrupt image.
  write_text_file(dir / "scraped.jpg", std::string("RIFF\x24\0\0\0WEBPVP8 and its data", 27));
  const ImageVerdict webp = verify_image_file(dir / "scraped.jpg");
  CHECK(webp.kind == "image format not read");
  CHECK(has(webp.message, "scraped.jpg: a WebP image: this program reads JPEG, PNG and BMP only"));
}

TEST_CASE("jpeg_has_end_marker: after the last scan only; an EXIF thumbnail's end does not count") {
  using B = std::vector<uint8_t>;
  CHECK(jpeg_has_end_marker(B{0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0x00, 3, 0xFF, 0xD9}));
  CHECK_FALSE(jpeg_has_end_marker(B{0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0x00, 3, 4}));
  // APP1 holding a thumbnail (its own scan and end) before the main scan, which is cut.
  CHECK_FALSE(jpeg_has_end_marker(B{0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xD8, 0xFF, 0xDA, 5, 0xFF, 0xD9, 0xFF, 0xDA, 6, 7}));
  CHECK(
      jpeg_has_end_marker(B{0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xD8, 0xFF, 0xDA, 5, 0xFF, 0xD9, 0xFF, 0xDA, 6, 0xFF, 0xD9}));
  CHECK(jpeg_has_end_marker(B{0xFF, 0xD8, 0xFF, 0xDA, 1, 0xFF, 0xD9, 0, 0}));  // padding after the end
}

TEST_CASE("a hostile dataset: every problem in one opening, grouped by kind; the good items kept") {
  HostileSet set;
  Dataset d = set.open();
  CHECK(d.train.samples.size() == 100);
  CHECK(d.train.left_out() == 5);
  CHECK(kinds_of(d.train) == "malformed label file;unknown class;missing image;truncated image;corrupt image;");
  std::string report = problem_report(d, 3);
  CAPTURE(report);
  CHECK(has(report, "train: 5 problems, 5 items left out of 105 listed:"));
  CHECK(has(report, "  malformed label file: 1\n    " + (set.dir / "set/labels/malformed.txt:2: expected 5 values")));
  CHECK(has(report, "unknown class: 1\n    " + (set.dir / "set/labels/unknown.txt:1: class id 7")));
  CHECK(has(report, "truncated image: 1\n    " + (set.dir / "set/images/truncated.jpg: JPEG without")));
  CHECK(has(report, "missing image: 1\n    " + (set.dir / "set/images/gone.jpg: does not exist")));
  const std::string list = set.dir / "runs/x/dataset_problems.txt";
  write_problem_list(d, list);
  std::string text = read_all(list);
  for (const char* file : {"malformed.txt:2", "unknown.txt:1", "truncated.jpg", "corrupt.jpg", "gone.jpg"})
    CHECK(has(text, file));
  // 5 of 105 is under 5%: training goes on; --strict stops, naming the list.
  CHECK(error_of([&] { check_usable(d, false, list); }).empty());
  CHECK(has(error_of([&] { check_usable(d, true, list); }),
            "5 problems in the dataset, and --strict stops at any (all of "
            "them: " +
                list + ")"));
  // Over 5% unusable: the dataset is probably wrong.
  write_text_file(set.dir / "set/train.txt", "images/good0.jpg\nimages/gone1.jpg\nimages/gone2.jpg\n");
  CHECK(has(error_of([&] { check_usable(set.open(), false, ""); }),
            "2 of the train split's 3 items are unusable, more than 5%: the dataset is probably wrong"));
}

TEST_CASE("the verdicts' cache: the second opening reads it; a changed file is verified again") {
  HostileSet set;
  OpenOptions options;
  options.cache_file = set.dir / "verified.cache";
  REQUIRE(set.open(options).train.samples.size() == 100);
  REQUIRE(fs::exists(options.cache_file));
  // Plant a verdict for good0.jpg in the cache (same size and time): the next opening believes it.
  std::string cache = read_all(options.cache_file);
  const std::string good = set.dir / "set/images/good0.jpg";
  size_t at = cache.find("\tok\t-\t" + good + "\n");
  REQUIRE(at != std::string::npos);
  cache.replace(at, 6, "\tcorrupt image\tplanted\t");
  write_text_file(options.cache_file, cache);
  Dataset cached = set.open(options);
  CHECK(cached.train.samples.size() == 99);
  CHECK(cached.train.problems.size() == 6);
  bool planted = false;
  for (const Problem& p : cached.train.problems)
    planted = planted || (p.kind == "corrupt image" && p.message == "planted");
  CHECK(planted);
  // Touched (a new modification time): verified again, usable.
  fs::last_write_time(good, fs::last_write_time(good) + std::chrono::seconds(5));
  CHECK(set.open(options).train.samples.size() == 100);
}
