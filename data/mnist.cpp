// MNIST: the IDX files (headers checked against the file sizes, labels against 0..9) and a
// synthetic stand-in of the same shape whose ten classes are distinct, learnable stroke patterns.
#include "data/mnist.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "data/rng.h"
#include "runtime/check.h"

namespace yolo::data {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImageMagic = 0x00000803, kLabelMagic = 0x00000801;

// The synthetic test split comes from a distant part of the (seed, index) stream.
constexpr uint64_t kTestIndexOffset = uint64_t(1) << 40;

uint32_t big_endian32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

// An IDX file of unsigned bytes with `dims` dimensions: the sizes from its header and its data.
struct IdxFile {
  std::array<uint32_t, 3> sizes{};
  std::vector<uint8_t> data;
};

IdxFile read_idx(const std::string& path, uint32_t magic, int dims) {
  const std::string what = dims == 3 ? "IDX3 image file" : "IDX1 label file";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error(path + ": no such file (expected an MNIST " + what + ")");
  const uint64_t file_size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) throw Error(path + ": cannot open the MNIST " + what);
  const size_t header_size = 4 + 4 * size_t(dims);
  uint8_t header[16] = {};
  in.read(reinterpret_cast<char*>(header), std::streamsize(std::min<uint64_t>(header_size, file_size)));
  if (file_size >= 2 && header[0] == 0x1F && header[1] == 0x8B)
    throw Error(path + ": is gzip-compressed; decompress it first (gunzip)");
  if (file_size >= 4 && big_endian32(header) != magic)
    throw Error(path + ": bad magic number " + hex32(big_endian32(header)) + ", expected " + hex32(magic) +
                " (an " + what + ")");
  if (file_size < header_size)
    throw Error(path + ": " + std::to_string(file_size) + " bytes, too short for the header of an " + what);
  IdxFile idx;
  unsigned __int128 expected = 1;  // no overflow whatever the header says
  for (int d = 0; d < dims; ++d) {
    idx.sizes[size_t(d)] = big_endian32(header + 4 + 4 * d);
    expected *= idx.sizes[size_t(d)];
  }
  if (dims == 3 && (idx.sizes[1] == 0 || idx.sizes[2] == 0))
    throw Error(path + ": image size " + std::to_string(idx.sizes[1]) + "x" + std::to_string(idx.sizes[2]) + " is empty");
  if (idx.sizes[0] > uint32_t(INT32_MAX)) throw Error(path + ": count " + std::to_string(idx.sizes[0]) + " is too large");
  expected += header_size;
  if (expected != file_size) {
    std::string shape = std::to_string(idx.sizes[0]);
    for (int d = 1; d < dims; ++d) shape += " x " + std::to_string(idx.sizes[size_t(d)]);
    throw Error(path + ": file is " + std::to_string(file_size) + " bytes, but its header (" + shape + ") needs " +
                std::to_string(uint64_t(std::min<unsigned __int128>(expected, UINT64_MAX))) +
                " bytes: truncated, or not an MNIST file");
  }
  idx.data.resize(size_t(file_size - header_size));
  in.read(reinterpret_cast<char*>(idx.data.data()), std::streamsize(idx.data.size()));
  if (!in) throw Error(path + ": read error");
  return idx;
}

// ---- synthetic digits --------------------------------------------------------------------

constexpr int kSide = 28;
constexpr int kShears = 3, kThicknesses = 3;
constexpr float kShear[kShears] = {-0.25f, 0.0f, 0.25f};
constexpr float kHalfWidth[kThicknesses] = {1.0f, 1.5f, 2.1f};

struct Point {
  float x, y;
};
using Polyline = std::vector<Point>;

// Points along an elliptical arc; angles in degrees, 0 = right, 90 = down (image rows grow down).
Polyline arc(float cx, float cy, float rx, float ry, float from, float to) {
  Polyline points;
  const int steps = 24;
  for (int i = 0; i <= steps; ++i) {
    float a = (from + (to - from) * float(i) / steps) * 3.14159265f / 180.0f;
    points.push_back({cx + rx * std::cos(a), cy + ry * std::sin(a)});
  }
  return points;
}

Polyline join(Polyline a, const Polyline& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Each class's strokes, loosely digit-shaped, in a 28x28 frame.
std::vector<Polyline> class_strokes(int digit) {
  switch (digit) {
    case 0: return {arc(14, 14, 6, 9, 0, 360)};
    case 1: return {{{11, 7}, {15, 4}, {15, 24}}};
    case 2: return {join(arc(14, 9.5f, 5.5f, 5, 180, 360), {{8, 24}, {21, 24}})};
    case 3: return {arc(13.5f, 9, 5.5f, 4.5f, 200, 450), arc(13.5f, 18.5f, 6, 5, 270, 520)};
    case 4: return {{{17, 24}, {17, 4}, {7, 18}, {21, 18}}};
    case 5: return {join({{20, 4}, {9, 4}}, arc(13, 17.5f, 6, 6, 225, 510))};
    case 6: return {{{18, 4}, {11, 11}, {8, 18}}, arc(14, 18, 6, 6, 180, 540)};
    case 7: return {{{7, 4}, {21, 4}, {12, 24}}};
    case 8: return {arc(14, 8.5f, 5, 4.5f, 0, 360), arc(14, 18.5f, 6, 5.5f, 0, 360)};
    default: return {arc(14, 9.5f, 5.5f, 5.5f, 0, 360), {{19.5f, 9.5f}, {17, 24}}};
  }
}

float distance_to_segment(Point p, Point a, Point b) {
  float dx = b.x - a.x, dy = b.y - a.y;
  float length2 = dx * dx + dy * dy;
  float t = length2 > 0 ? std::clamp(((p.x - a.x) * dx + (p.y - a.y) * dy) / length2, 0.0f, 1.0f) : 0.0f;
  float ex = p.x - (a.x + t * dx), ey = p.y - (a.y + t * dy);
  return std::sqrt(ex * ex + ey * ey);
}

// Anti-aliased renderings of every class at every shear and thickness, made once: samples are
// then a shifted copy plus intensity and noise, which keeps 60,000 images well under a second.
using Template = std::array<float, kSide * kSide>;
const std::vector<Template>& templates() {
  static const std::vector<Template> all = [] {
    std::vector<Template> out;
    for (int digit = 0; digit < 10; ++digit) {
      std::vector<Polyline> strokes = class_strokes(digit);
      for (float shear : kShear)
        for (float half_width : kHalfWidth) {
          Template t{};
          for (int y = 0; y < kSide; ++y)
            for (int x = 0; x < kSide; ++x) {
              // Undo the shear on the pixel centre instead of shearing every stroke.
              Point p{x + 0.5f - shear * (y + 0.5f - kSide / 2.0f), y + 0.5f};
              float d = 1e9f;
              for (const Polyline& line : strokes)
                for (size_t i = 0; i + 1 < line.size(); ++i) d = std::min(d, distance_to_segment(p, line[i], line[i + 1]));
              t[size_t(y * kSide + x)] = std::clamp(half_width + 0.5f - d, 0.0f, 1.0f);
            }
          out.push_back(t);
        }
    }
    return out;
  }();
  return all;
}

MnistSet synthetic_range(int count, uint64_t seed, uint64_t first_index) {
  if (count < 0) throw Error("synthetic MNIST: count " + std::to_string(count) + " is negative");
  const std::vector<Template>& all = templates();
  MnistSet set;
  set.count = count;
  set.pixels.resize(size_t(count) * kSide * kSide);
  set.labels.resize(size_t(count));
  set.source = "synthetic (seed " + std::to_string(seed) + ")";
  for (int i = 0; i < count; ++i) {
    KeyedRng rng(seed, first_index + uint64_t(i));
    int label = int(rng.below(10));
    const Template& t = all[size_t(label * kShears * kThicknesses) + rng.below(kShears * kThicknesses)];
    int dx = int(rng.below(3)) - 1, dy = int(rng.below(3)) - 1;
    float intensity = 170.0f + float(rng.below(86));
    int noise_amplitude = 5 + int(rng.below(36));
    set.labels[size_t(i)] = uint8_t(label);
    uint8_t* out = set.pixels.data() + size_t(i) * kSide * kSide;
    uint64_t bits = 0;
    for (int y = 0; y < kSide; ++y)
      for (int x = 0; x < kSide; ++x) {
        if ((x & 7) == 0) bits = rng.next();  // 8 bits of noise per pixel
        int sx = x - dx, sy = y - dy;
        float ink = (sx >= 0 && sx < kSide && sy >= 0 && sy < kSide) ? t[size_t(sy * kSide + sx)] : 0.0f;
        int noise = (int(bits & 0xFF) - 128) * noise_amplitude / 128;
        bits >>= 8;
        out[y * kSide + x] = uint8_t(std::clamp(int(ink * intensity) + noise, 0, 255));
      }
  }
  return set;
}

bool file_exists(const fs::path& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

}  // namespace

MnistSet read_mnist_idx(const std::string& images_file, const std::string& labels_file) {
  IdxFile images = read_idx(images_file, kImageMagic, 3);
  IdxFile labels = read_idx(labels_file, kLabelMagic, 1);
  if (images.sizes[0] != labels.sizes[0])
    throw Error(images_file + " has " + std::to_string(images.sizes[0]) + " images but " + labels_file + " has " +
                std::to_string(labels.sizes[0]) + " labels; they must come in pairs");
  for (size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= 10)
      throw Error(labels_file + ": label " + std::to_string(labels.data[i]) + " at index " + std::to_string(i) +
                  " is outside 0..9");
  MnistSet set;
  set.count = int(images.sizes[0]);
  set.rows = int(images.sizes[1]);
  set.cols = int(images.sizes[2]);
  set.pixels = std::move(images.data);
  set.labels = std::move(labels.data);
  set.source = images_file + " + " + labels_file;
  return set;
}

MnistSet synthetic_mnist(int count, uint64_t seed) { return synthetic_range(count, seed, 0); }

MnistSet load_mnist(const std::string& dir, bool train, uint64_t seed) {
  const std::string split = train ? "train" : "t10k";
  if (!dir.empty()) {
    const fs::path base(dir);
    // The usual names, and mirrors' "train-images.idx3-ubyte" with '.' for the last '-'.
    for (const char* separator : {"-", "."}) {
      fs::path images = base / (split + "-images" + separator + "idx3-ubyte");
      fs::path labels = base / (split + "-labels" + separator + "idx1-ubyte");
      bool have_images = file_exists(images), have_labels = file_exists(labels);
      if (have_images && have_labels) return read_mnist_idx(images.string(), labels.string());
      if (have_images || have_labels)
        throw Error("found " + (have_images ? images : labels).string() + " but not " +
                    (have_images ? labels : images).string() + "; MNIST needs both");
    }
    fs::path gz = base / (split + "-images-idx3-ubyte.gz");
    if (file_exists(gz)) throw Error("found " + gz.string() + ": decompress the MNIST files first (gunzip " + gz.string() + ")");
  }
  if (train) return synthetic_range(60000, seed, 0);
  MnistSet set = synthetic_range(10000, seed, kTestIndexOffset);
  set.source = "synthetic (seed " + std::to_string(seed) + ", test split)";
  return set;
}

}  // namespace yolo::data
