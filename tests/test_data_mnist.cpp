// MNIST: IDX round trip and every malformed-file error, the synthetic set (shape, balance,
// determinism, and learnability by a nearest-class-mean classifier), and load_mnist's choice
// between files on disk and the synthetic fallback.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "data/mnist.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo;
using namespace yolo::data;
using namespace yolo::testing;

namespace {

void put32(std::vector<uint8_t>& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(value >> shift));
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(out.good());
}

std::vector<uint8_t> idx_images(uint32_t count, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> bytes;
  put32(bytes, 0x00000803);
  put32(bytes, count);
  put32(bytes, rows);
  put32(bytes, cols);
  bytes.insert(bytes.end(), pixels.begin(), pixels.end());
  return bytes;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> bytes;
  put32(bytes, 0x00000801);
  put32(bytes, uint32_t(labels.size()));
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  return bytes;
}

struct SmallSet {
  std::vector<uint8_t> pixels, labels;
};

// 5 images of 3 x 4 with random pixels.
SmallSet small_set(Rng& rng) {
  SmallSet set;
  for (int i = 0; i < 5 * 3 * 4; ++i) set.pixels.push_back(uint8_t(rng.integer(0, 255)));
  set.labels = {3, 0, 9, 7, 1};
  return set;
}

void check_read_fails(const std::string& images, const std::string& labels, const std::string& named,
                      const std::string& reason) {
  CAPTURE(reason);
  try {
    read_mnist_idx(images, labels);
    FAIL("no error");
  } catch (const Error& e) {
    std::string message = e.what();
    CHECK_MESSAGE(message.find(named) != std::string::npos, message);
    CHECK_MESSAGE(message.find(reason) != std::string::npos, message);
  }
}

}  // namespace

TEST_CASE("mnist: IDX files round trip") {
  TempDir dir;
  Rng rng;
  CAPTURE(rng.seed());
  SmallSet small = small_set(rng);
  write_bytes(dir / "img", idx_images(5, 3, 4, small.pixels));
  write_bytes(dir / "lab", idx_labels(small.labels));
  MnistSet set = read_mnist_idx(dir / "img", dir / "lab");
  CHECK(set.count == 5);
  CHECK(set.rows == 3);
  CHECK(set.cols == 4);
  CHECK(set.pixels == small.pixels);
  CHECK(set.labels == small.labels);
  CHECK(set.source == dir / "img" + " + " + dir / "lab");
}

TEST_CASE("mnist: malformed IDX files give errors naming the file") {
  TempDir dir;
  Rng rng;
  SmallSet small = small_set(rng);
  const std::string images = dir / "img", labels = dir / "lab", bad = dir / "bad";
  write_bytes(images, idx_images(5, 3, 4, small.pixels));
  write_bytes(labels, idx_labels(small.labels));

  check_read_fails(dir / "none", labels, dir / "none", "no such file");
  check_read_fails(images, dir / "none", dir / "none", "no such file");
  // Swapped: each file has the other's magic.
  check_read_fails(labels, images, labels, "bad magic number 0x00000801, expected 0x00000803");
  write_bytes(bad, idx_images(5, 3, 4, small.pixels));
  check_read_fails(images, bad, bad, "bad magic number 0x00000803, expected 0x00000801");
  // Truncated, one byte too many, and too short for a header.
  std::vector<uint8_t> cut = idx_images(5, 3, 4, small.pixels);
  cut.pop_back();
  write_bytes(bad, cut);
  check_read_fails(bad, labels, bad, "file is 75 bytes, but its header (5 x 3 x 4) needs 76 bytes");
  std::vector<uint8_t> longer = idx_labels(small.labels);
  longer.push_back(0);
  write_bytes(bad, longer);
  check_read_fails(images, bad, bad, "truncated, or not an MNIST file");
  write_bytes(bad, {0, 0, 8});
  check_read_fails(bad, labels, bad, "too short");
  // A header claiming 2^32-1 images of 65535 x 65535: no overflow, no huge allocation.
  std::vector<uint8_t> huge;
  put32(huge, 0x00000803);
  put32(huge, 0xFFFFFFFF);
  put32(huge, 0xFFFF);
  put32(huge, 0xFFFF);
  write_bytes(bad, huge);
  check_read_fails(bad, labels, bad, "");
  write_bytes(bad, idx_images(0, 0, 4, {}));
  check_read_fails(bad, labels, bad, "empty");
  // gzip-compressed files, as downloaded.
  write_bytes(bad, {0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2});
  check_read_fails(bad, labels, bad, "gzip");
  // Counts that disagree, and a label outside 0..9.
  write_bytes(bad, idx_labels({1, 2, 3, 4}));
  check_read_fails(images, bad, images, "has 5 images but " + bad + " has 4 labels");
  write_bytes(bad, idx_labels({1, 2, 10, 4, 5}));
  check_read_fails(images, bad, bad, "label 10 at index 2 is outside 0..9");
}

TEST_CASE("mnist: synthetic set has MNIST's shape, balanced classes, and is deterministic") {
  MnistSet a = synthetic_mnist(3000, 4), b = synthetic_mnist(3000, 4), c = synthetic_mnist(3000, 5);
  CHECK(a.count == 3000);
  CHECK(a.rows == 28);
  CHECK(a.cols == 28);
  REQUIRE(a.pixels.size() == size_t(3000 * 784));
  REQUIRE(a.labels.size() == 3000);
  CHECK(a.source == "synthetic (seed 4)");
  CHECK(a.pixels == b.pixels);
  CHECK(a.labels == b.labels);
  CHECK(a.pixels != c.pixels);
  int per_class[10] = {};
  for (uint8_t label : a.labels) {
    REQUIRE(label < 10);
    ++per_class[label];
  }
  for (int k = 0; k < 10; ++k) {
    CAPTURE(k);
    CHECK(per_class[k] > 230);  // 300 expected
    CHECK(per_class[k] < 370);
  }
  // Every image has strokes (bright pixels) on a mostly dark background.
  for (int i = 0; i < a.count; ++i) {
    int bright = 0, dark = 0;
    for (int p = 0; p < 784; ++p) {
      uint8_t v = a.pixels[size_t(i) * 784 + size_t(p)];
      bright += v >= 128;
      dark += v < 50;
    }
    CAPTURE(i);
    REQUIRE(bright >= 20);
    REQUIRE(dark >= 400);
  }
  CHECK_THROWS_AS(synthetic_mnist(-1, 1), Error);
}

TEST_CASE("mnist: synthetic classes are learnable: nearest class mean beats 90% on held-out samples") {
  MnistSet train = synthetic_mnist(2000, 21), test = synthetic_mnist(1000, 22);
  std::vector<double> mean(10 * 784, 0.0);
  int per_class[10] = {};
  for (int i = 0; i < train.count; ++i) {
    int k = train.labels[size_t(i)];
    ++per_class[k];
    for (int p = 0; p < 784; ++p) mean[size_t(k * 784 + p)] += train.pixels[size_t(i) * 784 + size_t(p)];
  }
  for (int k = 0; k < 10; ++k)
    for (int p = 0; p < 784; ++p) mean[size_t(k * 784 + p)] /= std::max(per_class[k], 1);
  int correct = 0;
  for (int i = 0; i < test.count; ++i) {
    int best = -1;
    double best_distance = 0;
    for (int k = 0; k < 10; ++k) {
      double distance = 0;
      for (int p = 0; p < 784; ++p) {
        double d = test.pixels[size_t(i) * 784 + size_t(p)] - mean[size_t(k * 784 + p)];
        distance += d * d;
      }
      if (best < 0 || distance < best_distance) {
        best = k;
        best_distance = distance;
      }
    }
    correct += best == test.labels[size_t(i)];
  }
  MESSAGE("nearest-class-mean accuracy: " << correct / 10.0 << "%");
  CHECK(correct > 900);
}

TEST_CASE("mnist: load_mnist reads IDX files when present, else falls back to synthetic") {
  TempDir dir;
  Rng rng;
  SmallSet small = small_set(rng);

  MnistSet fallback = load_mnist(dir.path(), false, 3);  // an empty folder
  CHECK(fallback.count == 10000);
  CHECK(fallback.source == "synthetic (seed 3, test split)");
  MnistSet same = load_mnist("", false, 3);
  CHECK(same.pixels == fallback.pixels);
  // The test split is not a copy of the training stream's first images.
  MnistSet train_head = synthetic_mnist(100, 3);
  CHECK(!std::equal(train_head.pixels.begin(), train_head.pixels.end(), fallback.pixels.begin()));

  write_bytes(dir / "t10k-images-idx3-ubyte", idx_images(5, 3, 4, small.pixels));
  write_bytes(dir / "t10k-labels-idx1-ubyte", idx_labels(small.labels));
  MnistSet test = load_mnist(dir.path(), false);
  CHECK(test.count == 5);
  CHECK(test.labels == small.labels);
  CHECK(test.source == dir / "t10k-images-idx3-ubyte" + " + " + dir / "t10k-labels-idx1-ubyte");

  // Mirrors' naming with '.'; and one file of a pair missing is an error, not a silent fallback.
  write_bytes(dir / "train-images.idx3-ubyte", idx_images(5, 3, 4, small.pixels));
  CHECK_THROWS_WITH_AS(load_mnist(dir.path(), true), doctest::Contains("train-labels.idx1-ubyte"), Error);
  write_bytes(dir / "train-labels.idx1-ubyte", idx_labels(small.labels));
  MnistSet trained = load_mnist(dir.path(), true);
  CHECK(trained.count == 5);
  CHECK(trained.pixels == small.pixels);

  TempDir zipped;
  write_bytes(zipped / "train-images-idx3-ubyte.gz", {0x1F, 0x8B});
  CHECK_THROWS_WITH_AS(load_mnist(zipped.path(), true), doctest::Contains("gunzip"), Error);
}
