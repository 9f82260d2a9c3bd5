// Writes the binary seeds of tests/fuzz/corpus/ with the project's own writers: a .weights
// file for the fuzz layer set, checkpoints, and tiny PNG, JPEG and BMP images. Run once
// (`make fuzz-seeds`); the output is committed. Usage: make_seeds CORPUS_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/image.h"
#include "graph/weights.h"
#include "runtime/check.h"
#include "tests/fuzz/fuzz_layers.h"

namespace fs = std::filesystem;
using namespace yolo;

namespace {

data::Image gradient(int width, int height) {
  data::Image image;
  image.width = width, image.height = height;
  image.rgb.resize(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = image.pixel(x, y);
      p[0] = uint8_t(x * 255 / width), p[1] = uint8_t(y * 255 / height), p[2] = uint8_t((x + y) * 40);
    }
  return image;
}

// 24-bit BMP (stb_image_write could, but write_image offers only PNG and JPEG): BITMAPINFOHEADER,
// bottom-up rows padded to 4 bytes, file size filled in (data/image.cpp checks it).
void write_bmp(const std::string& path, const data::Image& image) {
  const int row = (image.width * 3 + 3) / 4 * 4;
  const uint32_t pixels = uint32_t(row) * image.height, size = 54 + pixels;
  std::vector<uint8_t> b(size, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) b[at + k] = uint8_t(v >> (8 * k));
  };
  b[0] = 'B', b[1] = 'M';
  put32(2, size);
  put32(10, 54);
  put32(14, 40);
  put32(18, uint32_t(image.width));
  put32(22, uint32_t(image.height));
  b[26] = 1, b[28] = 24;
  put32(34, pixels);
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) {
      const uint8_t* p = image.pixel(x, image.height - 1 - y);
      uint8_t* q = &b[54 + size_t(y) * row + size_t(x) * 3];
      q[0] = p[2], q[1] = p[1], q[2] = p[0];
    }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

graph::Checkpoint checkpoint(int tensors) {
  graph::Checkpoint c;
  c.cfg_digest = "fuzz-seed";
  c.iteration = 12;
  c.seen = 768;
  c.loader = {1, 3, 42};
  c.seed = 7;
  for (int t = 0; t < tensors; ++t)
    c.tensors.push_back({"layer" + std::to_string(t) + ".weights", {1.0f, -2.5f, 0.25f}});
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path corpus = argv[1];
  try {
    for (const char* target : {"weights", "checkpoint", "image"}) fs::create_directories(corpus / target);
    fuzz::FuzzLayers layers;
    write_darknet_weights((corpus / "weights/seed-all.weights").string(), layers.params(), {0, 2, 0, 1234});
    write_darknet_weights((corpus / "weights/seed-backbone.weights").string(), std::span(layers.params()).first(2),
                          {0, 2, 0, 99});
    write_checkpoint((corpus / "checkpoint/seed-empty.ckpt").string(), checkpoint(0));
    write_checkpoint((corpus / "checkpoint/seed-two.ckpt").string(), checkpoint(2));
    data::write_image((corpus / "image/seed-8x6.png").string(), gradient(8, 6));
    data::write_image((corpus / "image/seed-1x1.png").string(), gradient(1, 1));
    data::write_image((corpus / "image/seed-8x6.jpg").string(), gradient(8, 6), 90);
    data::write_image((corpus / "image/seed-17x3.jpg").string(), gradient(17, 3), 20);
    write_bmp((corpus / "image/seed-5x3.bmp").string(), gradient(5, 3));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
