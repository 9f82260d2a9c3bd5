// MNIST for the MLP benchmark: the IDX files when the user has them, otherwise a synthetic
// MNIST-shaped set (60,000 x 784 pixels, 10 classes) that a network can actually learn, so
// the benchmark runs anywhere without a download.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace yolo::data {

struct MnistSet {
  int count = 0, rows = 28, cols = 28;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major per image
  std::vector<uint8_t> labels;  // count, each in [0, 10)
  std::string source;           // file paths read, or "synthetic (seed S)"
};

// Reads an IDX3 image file and IDX1 label file (big-endian headers, magic 2051 / 2049).
// Errors (missing file, bad magic, truncated data, count mismatch, label >= 10) name the file.
MnistSet read_mnist_idx(const std::string& images_file, const std::string& labels_file);

// `count` images of 28x28: each class a distinct stroke pattern, jittered in position,
// thickness and intensity, plus noise.
MnistSet synthetic_mnist(int count, uint64_t seed);

// From `dir`: train-images-idx3-ubyte + train-labels-idx1-ubyte (or t10k-* when !train) if
// present (also with '.' instead of the last '-' as some mirrors name them); otherwise the
// synthetic set (60,000 train / 10,000 test). An empty `dir` means synthetic.
MnistSet load_mnist(const std::string& dir, bool train, uint64_t seed = 1);

}  // namespace yolo::data
