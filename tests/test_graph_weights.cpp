// darknet .weights files (layouts against hand-computed offsets, sizes of the real networks,
// partial loads, old headers, every error) and checkpoints (exact round trip, every corruption).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <tuple>

#include "graph/weights.h"
#include "runtime/check.h"
#include "tests/test_support.h"

namespace {

using namespace yolo::graph;
using yolo::Error;
using yolo::testing::Rng;
using yolo::testing::TempDir;
namespace fs = std::filesystem;

// Layers with their own storage; params() points LayerParams at it (so copies are independent).
class Net {
 public:
  Net& conv(int layer, int c_in, int c_out, int k, bool bn) {
    LayerParams p;
    p.layer = layer, p.type = LayerType::Convolutional, p.c_in = c_in, p.c_out = c_out, p.k = k, p.batch_normalize = bn;
    return add(p);
  }
  Net& connected(int layer, int in_c, int out, int in_h, int in_w, bool bn) {
    LayerParams p;
    p.layer = layer, p.type = LayerType::Connected, p.c_in = in_c, p.c_out = out, p.in_h = in_h, p.in_w = in_w;
    p.batch_normalize = bn;
    return add(p);
  }
  // Each layer's arrays: weights, biases, then (with BN) scales, rolling mean, rolling variance.
  std::vector<std::vector<float>>& arrays(size_t layer) { return layers_[layer].arrays; }
  void randomize(Rng& rng) {
    for (auto& l : layers_)
      for (auto& a : l.arrays)
        for (float& v : a) v = rng.uniform(-2.0f, 2.0f);
  }
  void fill(float value) {
    for (auto& l : layers_)
      for (auto& a : l.arrays) std::fill(a.begin(), a.end(), value);
  }
  std::vector<LayerParams> params() {
    std::vector<LayerParams> out;
    for (auto& l : layers_) {
      LayerParams p = l.shape;
      p.weights = l.arrays[0].data();
      p.biases = l.arrays[1].data();
      if (p.batch_normalize) {
        p.scales = l.arrays[2].data();
        p.rolling_mean = l.arrays[3].data();
        p.rolling_variance = l.arrays[4].data();
      }
      out.push_back(p);
    }
    return out;
  }
  bool layer_equals(const Net& other, size_t layer) const {
    const auto &a = layers_[layer].arrays, &b = other.layers_[layer].arrays;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
        return false;
    return true;
  }
  size_t size() const { return layers_.size(); }

 private:
  struct Layer {
    LayerParams shape;
    std::vector<std::vector<float>> arrays;
  };
  Net& add(const LayerParams& p) {
    Layer l{p, {std::vector<float>(p.weight_count()), std::vector<float>(size_t(p.c_out))}};
    if (p.batch_normalize)
      for (int i = 0; i < 3; ++i) l.arrays.emplace_back(size_t(p.c_out));
    layers_.push_back(std::move(l));
    return *this;
  }
  std::vector<Layer> layers_;
};

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}
template <class T>
void append(std::vector<unsigned char>& bytes, T value) {
  const auto* p = reinterpret_cast<const unsigned char*>(&value);
  bytes.insert(bytes.end(), p, p + sizeof value);
}
float float_at(const std::vector<unsigned char>& bytes, size_t offset) {
  REQUIRE(offset + 4 <= bytes.size());
  float v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}
void put_float(std::vector<unsigned char>& bytes, size_t offset, float v) { std::memcpy(bytes.data() + offset, &v, 4); }

// What is left in `dir` besides `keep`: a failed write must leave no temp file behind.
std::vector<std::string> leftovers(const std::string& dir, const std::string& keep = "") {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename() != keep) names.push_back(entry.path().filename().string());
  return names;
}

doctest::Contains contains(const std::string& text) { return doctest::Contains(text.c_str()); }

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A conv net with and without BN, k = 1 and 3, odd channel counts, and two connected layers
// (one after a 3x2x5 input, one after a flat one).
Net mixed_net() {
  Net net;
  net.conv(0, 3, 5, 3, true).conv(1, 5, 7, 1, false).conv(3, 7, 3, 3, true);
  net.connected(5, 5, 4, 3, 2, true).connected(6, 4, 3, 1, 1, false);
  return net;
}

}  // namespace

TEST_CASE("darknet weights: write then read is bit exact and the size is as predicted") {
  TempDir dir;
  Rng rng;
  INFO("seed " << rng.seed());
  Net net = mixed_net();
  net.randomize(rng);
  net.arrays(0)[0][1] = std::numeric_limits<float>::denorm_min();  // copied as bits, never computed with
  net.arrays(1)[1][2] = -0.0f;
  auto params = net.params();
  const std::string path = dir / "net.weights";
  write_darknet_weights(path, params, {0, 2, 0, 123456789012ull});

  // conv0 5*4 + 5*3*9, conv1 7 + 7*5, conv3 3*4 + 3*7*9, fc5 4*4 + 4*30, fc6 3 + 3*4 floats.
  CHECK(darknet_weights_bytes(params) == 20 + 4 * (155 + 42 + 201 + 136 + 15));
  CHECK(fs::file_size(path) == darknet_weights_bytes(params));

  Net loaded = net;
  loaded.fill(std::nanf(""));
  auto loaded_params = loaded.params();
  WeightsHeader header = read_darknet_weights(path, loaded_params);
  CHECK(header.major == 0);
  CHECK(header.minor == 2);
  CHECK(header.revision == 0);
  CHECK(header.seen == 123456789012ull);
  for (size_t l = 0; l < net.size(); ++l) CHECK(loaded.layer_equals(net, l));
  CHECK(leftovers(dir.path(), "net.weights").empty());
}

TEST_CASE("darknet weights: file order of biases and BatchNorm arrays, by hand") {
  TempDir dir;
  Net net;
  net.conv(0, 1, 2, 1, true).connected(1, 1, 2, 1, 1, true);
  // conv: biases, scales, mean, variance, weights; connected: biases, weights, scales, mean, variance.
  net.arrays(0) = {{9, 10}, {1, 2}, {3, 4}, {5, 6}, {7, 8}};
  net.arrays(1) = {{13, 14}, {11, 12}, {15, 16}, {17, 18}, {19, 20}};
  const std::string path = dir / "order.weights";
  write_darknet_weights(path, net.params(), {});
  auto bytes = read_bytes(path);
  REQUIRE(bytes.size() == 20 + 20 * 4);
  for (int i = 0; i < 20; ++i) CHECK(float_at(bytes, 20 + 4 * size_t(i)) == float(i + 1));
}

TEST_CASE("darknet weights: conv KCRS <-> KRSC and connected CHW <-> HWC, by hand") {
  TempDir dir;
  Net net;
  net.conv(0, 3, 2, 3, false).connected(1, 5, 2, 3, 2, false);  // connected input: h=3, w=2, c=5
  for (size_t l = 0; l < 2; ++l)
    for (size_t i = 0; i < net.arrays(l)[0].size(); ++i) net.arrays(l)[0][i] = float(1000 * l + i);
  const std::string path = dir / "layout.weights";
  write_darknet_weights(path, net.params(), {});
  auto bytes = read_bytes(path);
  REQUIRE(bytes.size() == 20 + 4 * (2 + 54 + 2 + 60));

  // conv weight o=1, c=2, ky=0, kx=1: darknet index ((1*3+2)*3+0)*3+1 = 46, after 2 biases
  // (byte 20 + 4*48 = 212); ours ((1*3+0)*3+1)*3+2 = 32.
  CHECK(float_at(bytes, 212) == net.arrays(0)[0][32]);
  CHECK(net.arrays(0)[0][32] == 32.0f);
  // connected weight o=1, y=2, x=1, c=3: darknet 1*30 + 3*6 + 2*2 + 1 = 53, after the conv
  // (byte 244) and 2 biases (byte 252): byte 252 + 4*53 = 464; ours 1*30 + (2*2+1)*5 + 3 = 58.
  CHECK(float_at(bytes, 464) == net.arrays(1)[0][58]);
  CHECK(net.arrays(1)[0][58] == 1058.0f);

  // Every element, by the same formulas.
  for (int o = 0; o < 2; ++o)
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 3; ++x)
          CHECK(float_at(bytes, 28 + 4 * size_t(((o * 3 + c) * 3 + y) * 3 + x)) == float(((o * 3 + y) * 3 + x) * 3 + c));
  for (int o = 0; o < 2; ++o)
    for (int c = 0; c < 5; ++c)
      for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 2; ++x)
          CHECK(float_at(bytes, 252 + 4 * size_t(o * 30 + c * 6 + y * 2 + x)) ==
                float(1000 + o * 30 + (y * 2 + x) * 5 + c));
}

TEST_CASE("darknet weights: load_layers loads a prefix and accepts trailing data") {
  TempDir dir;
  Rng rng;
  INFO("seed " << rng.seed());
  Net net;
  net.conv(0, 3, 4, 3, true).conv(2, 4, 4, 1, false).conv(5, 4, 6, 3, true);
  net.randomize(rng);
  auto params = net.params();
  const std::string path = dir / "full.weights";
  write_darknet_weights(path, params, {0, 2, 0, 64});

  Net target = net;
  target.fill(7.0f);
  const Net untouched = target;
  auto target_params = target.params();
  CHECK(read_darknet_weights(path, target_params, 3).seen == 64);  // layers 0 and 2 (index < 3)
  CHECK(target.layer_equals(net, 0));
  CHECK(target.layer_equals(net, 1));
  CHECK(target.layer_equals(untouched, 2));

  target = untouched;
  target_params = target.params();
  read_darknet_weights(path, target_params, 2);  // layer 0 only
  CHECK(target.layer_equals(net, 0));
  CHECK(target.layer_equals(untouched, 1));

  // A backbone file holding only the first two layers: enough for load_layers = 3, not for all.
  const std::string backbone = dir / "backbone.weights";
  write_darknet_weights(backbone, std::span(params).first(2), {});
  target = untouched;
  target_params = target.params();
  read_darknet_weights(backbone, target_params, 3);
  CHECK(target.layer_equals(net, 1));
  CHECK(target.layer_equals(untouched, 2));
  CHECK_THROWS_WITH_AS(read_darknet_weights(backbone, target_params), doctest::Contains("ends before layer 5"), Error);
}

TEST_CASE("darknet weights: before version 0.2 `seen` is 32 bits") {
  TempDir dir;
  Net net;
  net.conv(0, 1, 1, 1, false);
  auto file = [&](int32_t major, int32_t minor, bool wide_seen) {
    std::vector<unsigned char> bytes;
    append(bytes, major), append(bytes, minor), append(bytes, int32_t(0));
    if (wide_seen) append(bytes, uint64_t(4000000000ull));
    else append(bytes, uint32_t(4000000000u));
    append(bytes, 2.5f), append(bytes, -1.5f);  // bias, weight
    const std::string path = dir / ("v" + std::to_string(major) + std::to_string(minor) + ".weights");
    write_bytes(path, bytes);
    return path;
  };
  for (auto [major, minor, wide] : {std::tuple{0, 1, false}, std::tuple{0, 2, true}, std::tuple{1, 0, true}}) {
    CAPTURE(major);
    CAPTURE(minor);
    net.fill(0.0f);
    auto params = net.params();
    WeightsHeader header = read_darknet_weights(file(major, minor, wide), params);
    CHECK(header.major == major);
    CHECK(header.minor == minor);
    CHECK(header.seen == 4000000000ull);
    CHECK(net.arrays(0)[1][0] == 2.5f);
    CHECK(net.arrays(0)[0][0] == -1.5f);
  }
}

TEST_CASE("darknet weights: read errors name the file and what is wrong") {
  TempDir dir;
  Rng rng;
  Net net;
  net.conv(0, 3, 4, 3, true).conv(2, 4, 4, 1, false).conv(5, 4, 6, 3, true);
  net.randomize(rng);
  auto params = net.params();
  const std::string good = dir / "good.weights";
  write_darknet_weights(good, params, {});
  const auto bytes = read_bytes(good);
  const size_t layer5_start = 20 + 4 * (4 * 4 + 4 * 3 * 9 + 4 + 4 * 4);
  Net target = net;
  auto target_params = target.params();
  auto read_error = [&](const std::string& name, const std::vector<unsigned char>& content) {
    const std::string path = dir / name;
    write_bytes(path, content);
    std::string message = error_of([&] { read_darknet_weights(path, target_params); });
    CHECK(message.find(path) != std::string::npos);
    return message;
  };

  SUBCASE("missing file") {
    const std::string path = dir / "missing.weights";
    CHECK_THROWS_WITH_AS(read_darknet_weights(path, target_params), contains(path + ": cannot open"), Error);
  }
  SUBCASE("a folder") {
    CHECK_THROWS_WITH_AS(read_darknet_weights(dir.path(), target_params), doctest::Contains("not a regular file"), Error);
  }
  SUBCASE("too short for a header") {
    CHECK(read_error("tiny.weights", {1, 2, 3}).find("3 bytes, too short for a darknet .weights header") != std::string::npos);
    auto old = std::vector<unsigned char>(bytes.begin(), bytes.begin() + 14);
    old[4] = 1;  // 0.1.0 needs 16 bytes
    old[8] = 0;
    CHECK(read_error("old.weights", old).find("14 bytes, too short") != std::string::npos);
  }
  SUBCASE("garbage header") {
    std::string text = "this is some text and certainly not weights";
    CHECK(read_error("text.weights", {text.begin(), text.end()}).find("not a darknet .weights file") != std::string::npos);
    auto negative = bytes;
    negative[8] = 0xff, negative[9] = 0xff, negative[10] = 0xff, negative[11] = 0xff;  // revision -1
    CHECK(read_error("negative.weights", negative).find("version 0.2.-1") != std::string::npos);
  }
  SUBCASE("ends inside a layer") {
    auto cut = std::vector<unsigned char>(bytes.begin(), bytes.end() - 10);
    std::string message = read_error("cut.weights", cut);
    CHECK(message.find("ends inside layer 5 (conv, 6 filters): expected 10 more bytes") != std::string::npos);
    CHECK(message.find("need " + std::to_string(bytes.size())) != std::string::npos);
    auto at_boundary = std::vector<unsigned char>(bytes.begin(), bytes.begin() + long(layer5_start));
    CHECK(read_error("boundary.weights", at_boundary).find("ends before layer 5") != std::string::npos);
    // Nothing was loaded: sizes are checked first.
    CHECK(target.layer_equals(net, 0));
  }
  SUBCASE("extra bytes") {
    auto longer = bytes;
    longer.resize(bytes.size() + 12);
    CHECK(read_error("long.weights", longer).find("has 12 bytes more than the cfg's layers need") != std::string::npos);
  }
  SUBCASE("NaN or Inf") {
    for (float bad : {std::nanf(""), -std::numeric_limits<float>::infinity()}) {
      auto poisoned = bytes;
      put_float(poisoned, layer5_start + 4 * 30, bad);
      CHECK(read_error("nan.weights", poisoned).find("layer 5 (conv, 6 filters) has NaN/Inf weights") != std::string::npos);
    }
  }
  SUBCASE("a LayerParams without its BatchNorm buffers") {
    target_params[0].scales = nullptr;
    CHECK_THROWS_WITH_AS(read_darknet_weights(good, target_params), doctest::Contains("layer 0 (conv, 4 filters)"), Error);
  }
}

TEST_CASE("darknet weights: a failed write leaves no temp file and the old file intact") {
  TempDir dir;
  Rng rng;
  Net net = mixed_net();
  net.randomize(rng);
  auto params = net.params();

  const std::string in_missing_folder = dir / "no/such/folder.weights";
  CHECK_THROWS_WITH_AS(write_darknet_weights(in_missing_folder, params, {}), contains(in_missing_folder), Error);
  CHECK(leftovers(dir.path()).empty());

  // The temp file is written, then the rename onto a folder fails.
  const std::string folder = dir / "folder.weights";
  fs::create_directory(folder);
  CHECK_THROWS_WITH_AS(write_darknet_weights(folder, params, {}), contains(folder + ": cannot rename"), Error);
  CHECK(leftovers(dir.path(), "folder.weights").empty());
  fs::remove(folder);

  // NaN in the last layer: refused mid-file; the previous file stays as it was.
  const std::string path = dir / "net.weights";
  write_darknet_weights(path, params, {});
  const auto before = read_bytes(path);
  net.arrays(4)[0][11] = std::nanf("");
  params = net.params();
  CHECK_THROWS_WITH_AS(write_darknet_weights(path, params, {}),
                       contains(path + ": not written: layer 6 (connected, 3 outputs) has NaN/Inf"), Error);
  CHECK(read_bytes(path) == before);
  CHECK(leftovers(dir.path(), "net.weights").empty());
}

TEST_CASE("darknet weights: file sizes of YOLOv3 and YOLOv3-tiny (80 classes)") {
  // (c_in, c_out, k, batch_normalize) of each conv layer; the detection convs have 255 filters
  // (3 anchors x (80 classes + 5)) and no BatchNorm.
  struct Row {
    int c_in, c_out, k;
    bool bn;
  };
  auto bytes_of = [](const std::vector<Row>& rows) {
    std::vector<LayerParams> layers;
    for (const Row& r : rows) {
      LayerParams p;
      p.layer = int(layers.size()), p.c_in = r.c_in, p.c_out = r.c_out, p.k = r.k, p.batch_normalize = r.bn;
      layers.push_back(p);
    }
    return std::pair{layers.size(), darknet_weights_bytes(layers)};
  };

  std::vector<Row> v3 = {{3, 32, 3, true}};
  auto stage = [&](int c, int blocks) {  // downsampling conv, then residual blocks (1x1 c, 3x3 2c)
    v3.push_back({c, 2 * c, 3, true});
    for (int b = 0; b < blocks; ++b) v3.push_back({2 * c, c, 1, true}), v3.push_back({c, 2 * c, 3, true});
  };
  stage(32, 1), stage(64, 2), stage(128, 8), stage(256, 8), stage(512, 4);
  auto head = [&](int c_in, int c) {  // three (1x1 c, 3x3 2c) pairs, the last 1x1 before the 3x3 ending it
    for (int i = 0; i < 3; ++i) v3.push_back({i == 0 ? c_in : 2 * c, c, 1, true}), v3.push_back({c, 2 * c, 3, true});
    v3.push_back({2 * c, 255, 1, false});
  };
  head(1024, 512);
  v3.push_back({512, 256, 1, true});  // before the upsample; concatenated with 512 backbone channels
  head(256 + 512, 256);
  v3.push_back({256, 128, 1, true});
  head(128 + 256, 128);
  CHECK(bytes_of(v3) == std::pair<size_t, uint64_t>{75, 248007048});

  const std::vector<Row> tiny = {{3, 16, 3, true},     {16, 32, 3, true},    {32, 64, 3, true},     {64, 128, 3, true},
                                 {128, 256, 3, true},  {256, 512, 3, true},  {512, 1024, 3, true},  {1024, 256, 1, true},
                                 {256, 512, 3, true},  {512, 255, 1, false}, {256, 128, 1, true},   {128 + 256, 256, 3, true},
                                 {256, 255, 1, false}};
  CHECK(bytes_of(tiny) == std::pair<size_t, uint64_t>{13, 35434956});
}

// ---- checkpoints ----------------------------------------------------------------------------

namespace {

Checkpoint sample_checkpoint(Rng& rng) {
  Checkpoint c;
  c.cfg_digest = "sha256:0123456789abcdef";
  c.cfg_digest.push_back('\0');  // any bytes
  c.iteration = 123456789012;
  c.seen = 0xFEDCBA9876543210ull;
  c.loader = {7, -3, 0x1122334455667788ull};
  c.seed = 42;
  c.batch = 64;
  c.subdivisions = 16;
  c.tensors.emplace_back("conv_0.weights", rng.floats(37));
  c.tensors.emplace_back("empty", std::vector<float>{});
  c.tensors.emplace_back("conv_0.momentum", std::vector<float>{-0.0f, std::numeric_limits<float>::denorm_min(), std::nanf("")});
  c.tensors.emplace_back("bn.rolling_mean", rng.floats(5));
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("checkpoint: write then read gives back every field and bit") {
  TempDir dir;
  Rng rng;
  INFO("seed " << rng.seed());
  const Checkpoint c = sample_checkpoint(rng);
  const std::string path = dir / "run.ckpt";
  write_checkpoint(path, c);
  // magic 8, version 4, digest 8 + 24, eight 8-byte fields, tensor count 8, tensors, checksum 8.
  CHECK(fs::file_size(path) == 8 + 4 + 32 + 64 + 8 + (22 + 8 + 148) + (13 + 8) + (23 + 8 + 12) + (23 + 8 + 20) + 8);
  Checkpoint r = read_checkpoint(path);
  CHECK(r.cfg_digest == c.cfg_digest);
  CHECK(r.iteration == c.iteration);
  CHECK(r.seen == c.seen);
  CHECK(r.loader.epoch == 7);
  CHECK(r.loader.step == -3);
  CHECK(r.loader.seed == c.loader.seed);
  CHECK(r.seed == 42);
  CHECK(r.batch == 64);
  CHECK(r.subdivisions == 16);
  REQUIRE(r.tensors.size() == c.tensors.size());
  for (size_t t = 0; t < c.tensors.size(); ++t) {
    CHECK(r.tensors[t].first == c.tensors[t].first);
    CHECK(same_bits(r.tensors[t].second, c.tensors[t].second));
  }
  CHECK(leftovers(dir.path(), "run.ckpt").empty());

  // Overwriting replaces it whole.
  Checkpoint empty;
  write_checkpoint(path, empty);
  CHECK(read_checkpoint(path).tensors.empty());
}

TEST_CASE("checkpoint: a version 1 file (before the batch and subdivisions were kept) is still read") {
  TempDir dir;
  Rng rng;
  INFO("seed " << rng.seed());
  const Checkpoint c = sample_checkpoint(rng);
  const std::string path = dir / "v1.ckpt";
  yolo::graph::test_hooks::write_checkpoint_version1(path, c);
  CHECK(fs::file_size(path) == 8 + 4 + 32 + 48 + 8 + (22 + 8 + 148) + (13 + 8) + (23 + 8 + 12) + (23 + 8 + 20) + 8);
  const Checkpoint r = read_checkpoint(path);
  CHECK(r.iteration == c.iteration);
  CHECK(r.seed == 42);
  CHECK(r.batch == 0);  // not recorded
  CHECK(r.subdivisions == 0);
  REQUIRE(r.tensors.size() == c.tensors.size());
  CHECK(same_bits(r.tensors[3].second, c.tensors[3].second));
  CHECK(yolo::graph::peek_checkpoint_iteration(path) == c.iteration);
}

TEST_CASE("checkpoint: every damaged byte and every truncation is refused") {
  TempDir dir;
  Rng rng;
  INFO("seed " << rng.seed());
  const std::string path = dir / "run.ckpt";
  write_checkpoint(path, sample_checkpoint(rng));
  const auto bytes = read_bytes(path);
  const std::string damaged = dir / "damaged.ckpt";
  auto read_error = [&](const std::vector<unsigned char>& content) {
    write_bytes(damaged, content);
    std::string message = error_of([&] { read_checkpoint(damaged); });
    CHECK(message.find(damaged + ": ") == 0);
    return message;
  };

  SUBCASE("one flipped byte anywhere") {
    for (size_t i = 0; i < bytes.size(); ++i) {
      CAPTURE(i);
      auto flipped = bytes;
      flipped[i] ^= 0x10;
      std::string message = read_error(flipped);
      if (i < 8) CHECK(message.find("not a checkpoint") != std::string::npos);
      else if (i < 12) CHECK(message.find("unsupported checkpoint version") != std::string::npos);
      else CHECK(message.find("corrupt") != std::string::npos);
    }
    auto in_data = bytes;
    in_data[200] ^= 1;  // inside conv_0.weights
    CHECK(read_error(in_data).find("checksum mismatch: the checkpoint is corrupt") != std::string::npos);
  }
  SUBCASE("truncated") {
    for (size_t size : {size_t(0), size_t(5)})
      CHECK(read_error({bytes.begin(), bytes.begin() + long(size)}).find("not a checkpoint") != std::string::npos);
    for (size_t size : {size_t(8), size_t(12), size_t(30), size_t(100), bytes.size() / 2, bytes.size() - 8, bytes.size() - 1}) {
      CAPTURE(size);
      CHECK(read_error({bytes.begin(), bytes.begin() + long(size)}).find("truncated") != std::string::npos);
    }
  }
  SUBCASE("wrong magic or version") {
    auto other = bytes;
    other[7] = 'X';
    CHECK(read_error(other).find("not a checkpoint") != std::string::npos);
    other = bytes;
    other[8] = 3;
    CHECK(read_error(other).find("unsupported checkpoint version 3 (this build reads versions 1 to 2)") !=
          std::string::npos);
  }
  SUBCASE("absurd sizes") {
    const size_t count_at = 8 + 4 + 8 + 24 + 64;  // the tensor count
    auto huge = bytes;
    std::memcpy(huge.data() + count_at, std::array<uint64_t, 1>{1ull << 60}.data(), 8);
    CHECK(read_error(huge).find("1152921504606846976 tensors cannot fit") != std::string::npos);
    huge = bytes;
    std::memcpy(huge.data() + count_at + 8, std::array<uint64_t, 1>{1ull << 62}.data(), 8);  // first name's length
    CHECK(read_error(huge).find("tensor 0's name needs 4611686018427387904 bytes") != std::string::npos);
    huge = bytes;
    std::memcpy(huge.data() + count_at + 8 + 8 + 14, std::array<uint64_t, 1>{1ull << 62}.data(), 8);  // its count
    CHECK(read_error(huge).find("needs 4611686018427387904 x 4 bytes") != std::string::npos);
  }
  SUBCASE("trailing bytes") {
    auto longer = bytes;
    longer.resize(bytes.size() + 8);
    CHECK(read_error(longer).find("8 unexpected bytes after the last tensor") != std::string::npos);
  }
  SUBCASE("a darknet .weights file is not a checkpoint") {
    Net net;
    net.conv(0, 1, 1, 1, false);
    write_darknet_weights(damaged, net.params(), {});
    CHECK_THROWS_WITH_AS(read_checkpoint(damaged), doctest::Contains("not a checkpoint"), Error);
  }
  SUBCASE("missing file, unwritable path") {
    const std::string missing = dir / "missing.ckpt";
    CHECK_THROWS_WITH_AS(read_checkpoint(missing), contains(missing + ": cannot open"), Error);
    const std::string folder = dir / "folder.ckpt";
    fs::create_directory(folder);
    CHECK_THROWS_WITH_AS(write_checkpoint(folder, Checkpoint{}), contains(folder + ": cannot rename"), Error);
    CHECK(leftovers(dir.path(), "folder.ckpt").size() == 1);  // run.ckpt only, no temp file
  }
}
