// The loader: batches are the same bits whatever the thread count, shards are disjoint and
// equal in steps, a saved position resumes exactly, unreadable images are replaced and
// reported (or stop the run with strict), the decoded-image cache changes no batch, and the
// feeder's device copy equals the batch.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "data/feeder.h"
#include "data/image.h"
#include "data/image_cache.h"
#include "data/loader.h"
#include "runtime/check.h"
#include "tests/test_support.h"

using namespace yolo::data;
using yolo::testing::TempDir;

namespace {

// `n` small PNGs of odd sizes, image i filled with a colour that encodes i, one box each.
Split make_split(const TempDir& dir, int n) {
  Split split;
  split.name = "train";
  for (int i = 0; i < n; ++i) {
    Image image;
    image.width = 37 + (i % 3) * 8;
    image.height = 29 + (i % 2) * 6;
    image.rgb.assign(static_cast<size_t>(image.width) * image.height * 3, 0);
    for (int y = 0; y < image.height; ++y)
      for (int x = 0; x < image.width; ++x) {
        uint8_t* p = image.pixel(x, y);
        p[0] = static_cast<uint8_t>(10 * i);
        p[1] = static_cast<uint8_t>(x * 255 / image.width);
        p[2] = static_cast<uint8_t>(y * 255 / image.height);
      }
    Sample sample;
    sample.image = dir / ("img" + std::to_string(i) + ".png");
    write_image(sample.image, image);
    sample.boxes.push_back(Box{0.5f, 0.5f, 0.4f + 0.01f * i, 0.3f, i % 3, false});
    split.samples.push_back(sample);
  }
  return split;
}

uint64_t hash_bytes(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t hash_batch(const Batch& b) {
  uint64_t h = hash_bytes(b.images, b.image_bytes());
  h = hash_bytes(b.truth_counts, sizeof(int) * b.count, h);
  for (int i = 0; i < b.count; ++i)
    h = hash_bytes(b.truths + static_cast<size_t>(i) * kMaxBoxes, sizeof(yolo::YoloTruth) * b.truth_counts[i], h);
  h = hash_bytes(&b.net_w, sizeof b.net_w, h);
  return hash_bytes(&b.net_h, sizeof b.net_h, h);
}

LoaderOptions small_options() {
  LoaderOptions o;
  o.batch = 3;
  o.net_w = o.net_h = 64;
  o.augment = true;
  o.augment_params.jitter = 0.3f;
  o.augment_params.hue = 0.1f;
  o.augment_params.saturation = 1.5f;
  o.augment_params.exposure = 1.5f;
  o.multiscale = true;
  o.multiscale_period = 2;
  o.seed = 1234;
  o.warn = [](const std::string&) {};
  return o;
}

std::vector<uint64_t> run_hashes(const Split& split, LoaderOptions o, int batches, LoaderState start = {}) {
  Loader loader(split, o, start);
  std::vector<uint64_t> hashes;
  for (int i = 0; i < batches; ++i) hashes.push_back(hash_batch(loader.next()));
  return hashes;
}

}  // namespace

TEST_CASE("loader: the same seed gives the same batches with 1, 2 or 3 threads and any prefetch") {
  TempDir dir;
  Split split = make_split(dir, 11);
  LoaderOptions o = small_options();
  o.threads = 1;
  o.prefetch = 2;
  std::vector<uint64_t> one = run_hashes(split, o, 9);  // 3 epochs of 3 steps
  o.threads = 2;
  o.prefetch = 3;
  CHECK(run_hashes(split, o, 9) == one);
  o.threads = 3;
  o.prefetch = 5;
  CHECK(run_hashes(split, o, 9) == one);
  o.seed = 1235;
  CHECK(run_hashes(split, o, 9) != one);
  // Batches differ from each other (shuffling and augmentation are not stuck).
  CHECK(std::set<uint64_t>(one.begin(), one.end()).size() == one.size());
}

TEST_CASE("loader: batch contents are the listed samples, letterboxed, with their boxes") {
  TempDir dir;
  Split split = make_split(dir, 5);
  LoaderOptions o;
  o.batch = 5;
  o.net_w = 128;  // wider than every image (aspect 2 > 53/29): letterbox bars at the sides
  o.net_h = 64;
  o.shuffle = false;
  o.threads = 2;
  o.warn = [](const std::string&) {};
  Loader loader(split, o);
  CHECK(loader.steps_per_epoch() == 1);
  const Batch& b = loader.next();
  CHECK(b.net_w == 128);
  CHECK(b.net_h == 64);
  for (int i = 0; i < 5; ++i) {
    CHECK(b.samples[i].index == i);
    CHECK(b.samples[i].ok);
    // Red channel of the image centre encodes the sample (10 * i / 255).
    const float* centre = b.images + (static_cast<size_t>(i) * 64 * 128 + 32 * 128 + 64) * 3;
    CHECK(yolo::testing::close(centre[0], 10.0 * i / 255, 1e-3, 0));
    REQUIRE(b.truth_counts[i] == 1);
    const yolo::YoloTruth& t = b.truths[static_cast<size_t>(i) * kMaxBoxes];
    Box expect = b.samples[i].placement.to_network(split.samples[i].boxes[0]);
    CHECK(t.class_id == i % 3);
    CHECK(yolo::testing::close(t.x, expect.x, 1e-5, 0));
    CHECK(yolo::testing::close(t.w, expect.w, 1e-5, 0));
    // Letterbox: a wide network input leaves bars at the sides, none above and below.
    CHECK(b.samples[i].placement.offset_y == doctest::Approx(0).epsilon(1e-6));
    CHECK(b.samples[i].placement.offset_x > 0);
  }
}

TEST_CASE("loader: shards are disjoint, equal in steps, and cover all but the stated remainder") {
  TempDir dir;
  const int n = 13, world = 3, batch = 2;
  Split split = make_split(dir, n);
  for (Remainder remainder : {Remainder::Drop, Remainder::Wrap}) {
    CAPTURE(static_cast<int>(remainder));
    std::vector<std::multiset<int64_t>> per_epoch(2);
    int64_t steps = -1;
    for (int rank = 0; rank < world; ++rank) {
      LoaderOptions o = small_options();
      o.batch = batch;
      o.multiscale = false;
      o.augment = false;
      o.rank = rank;
      o.world = world;
      o.remainder = remainder;
      o.threads = 2;
      Loader loader(split, o);
      if (steps < 0) steps = loader.steps_per_epoch();
      CHECK(loader.steps_per_epoch() == steps);
      for (int64_t i = 0; i < 2 * steps; ++i) {
        const Batch& b = loader.next();
        CHECK(b.epoch == i / steps);
        for (const SampleInfo& s : b.samples) per_epoch[b.epoch].insert(s.index);
      }
    }
    for (const auto& seen : per_epoch) {
      std::set<int64_t> distinct(seen.begin(), seen.end());
      if (remainder == Remainder::Drop) {
        CHECK(steps == n / (world * batch));
        CHECK(seen.size() == static_cast<size_t>(steps * world * batch));  // 12 of 13
        CHECK(distinct.size() == seen.size());                              // none twice
      } else {
        CHECK(steps == (n + world * batch - 1) / (world * batch));
        CHECK(distinct.size() == static_cast<size_t>(n));  // every sample, the wrap repeats some
        CHECK(seen.size() == static_cast<size_t>(steps * world * batch));
      }
    }
    // Shuffling: the two epochs drop different samples or order them differently.
    CHECK(per_epoch[0].size() > 0);
  }
}

TEST_CASE("loader: a saved position resumes exactly; the wrong seed is refused") {
  TempDir dir;
  Split split = make_split(dir, 10);
  LoaderOptions o = small_options();
  o.threads = 2;
  std::vector<uint64_t> straight = run_hashes(split, o, 8);
  LoaderState saved;
  {
    Loader first(split, o);
    for (int i = 0; i < 5; ++i) first.next();
    saved = first.state();
  }
  CHECK(saved.epoch == 5 / 3);
  CHECK(saved.step == 5 % 3);
  std::vector<uint64_t> resumed = run_hashes(split, o, 3, saved);
  CHECK(resumed == std::vector<uint64_t>(straight.begin() + 5, straight.end()));
  o.seed = 99;
  CHECK_THROWS_WITH_AS(Loader(split, o, saved), doctest::Contains("resume with the same seed"), yolo::Error);
}

TEST_CASE("loader: an unreadable image becomes a grey image without boxes, warned and counted; strict stops") {
  TempDir dir;
  Split split = make_split(dir, 4);
  yolo::testing::write_text_file(split.samples[2].image, "this is not a PNG");
  std::vector<std::string> warnings;
  std::mutex warnings_mutex;
  LoaderOptions o;
  o.batch = 4;
  o.net_w = o.net_h = 32;
  o.shuffle = false;
  o.threads = 2;
  o.warn = [&](const std::string& w) {
    std::lock_guard lock(warnings_mutex);
    warnings.push_back(w);
  };
  {
    Loader loader(split, o);
    const Batch& b = loader.next();
    CHECK_FALSE(b.samples[2].ok);
    CHECK(b.truth_counts[2] == 0);
    const float* grey = b.images + static_cast<size_t>(2) * 32 * 32 * 3;
    for (int k = 0; k < 32 * 32 * 3; k += 97) CHECK(grey[k] == 0.5f);
    CHECK(b.samples[1].ok);
    CHECK(b.truth_counts[1] == 1);
    loader.next();  // epoch 1 complete once handed out
    EpochStats stats = loader.epoch_stats(0);
    CHECK(stats.images == 4);
    CHECK(stats.unreadable == 1);
    CHECK(stats.boxes == 3);
    CHECK(stats.summary().find("1 unreadable") != std::string::npos);
  }
  REQUIRE(warnings.size() >= 1);
  CHECK(warnings[0].find("img2.png") != std::string::npos);

  o.strict = true;
  Loader strict(split, o);
  CHECK_THROWS_WITH_AS(strict.next(), doctest::Contains("img2.png"), yolo::Error);
}

TEST_CASE("loader: options and dataset sizes that cannot work are refused before any work") {
  TempDir dir;
  Split split = make_split(dir, 5);
  LoaderOptions o = small_options();
  o.batch = 3;
  o.world = 2;  // 6 > 5
  CHECK_THROWS_WITH_AS(Loader(split, o), doctest::Contains("fewer than one global batch (2 x 3 = 6)"), yolo::Error);
  o.remainder = Remainder::Wrap;
  CHECK(Loader(split, o).steps_per_epoch() == 1);
  o.world = 1;
  o.net_w = 100;
  CHECK_THROWS_WITH_AS(Loader(split, o), doctest::Contains("multiples of 32"), yolo::Error);
  o.net_w = 64;
  o.rank = 1;
  CHECK_THROWS_WITH_AS(Loader(split, o), doctest::Contains("rank 1 is outside world size 1"), yolo::Error);
  o.rank = 0;
  LoaderState far{7, 9, 0};
  CHECK_THROWS_WITH_AS(Loader(split, o, far), doctest::Contains("does not fit"), yolo::Error);
}

TEST_CASE("loader: multi-scale sizes follow the iteration and fit the buffers") {
  TempDir dir;
  Split split = make_split(dir, 6);
  LoaderOptions o = small_options();
  o.batch = 1;
  o.net_w = o.net_h = 416;
  o.augment = false;
  o.multiscale_period = 1;
  o.batches_per_iteration = 2;  // subdivisions: the size holds for two batches
  o.threads = 2;
  Loader loader(split, o);
  std::set<int> sizes;
  for (int i = 0; i < 12; ++i) {
    const Batch& b = loader.next();
    auto expect = multiscale_size(o.seed, i / 2, 416, 416, 1);
    CHECK(b.net_w == expect.first);
    CHECK(b.net_h == expect.second);
    CHECK(b.net_w <= loader.max_net_w());
    CHECK(b.net_h <= loader.max_net_h());
    sizes.insert(b.net_w);
  }
  CHECK(sizes.size() > 1);
}

TEST_CASE("feeder: the device copy of each batch equals the loader's batch (CPU device)") {
  TempDir dir;
  Split split = make_split(dir, 7);
  LoaderOptions o = small_options();
  o.batch = 2;
  o.threads = 2;
  Loader loader(split, o);
  DeviceFeeder feeder(loader, yolo::Device::cpu());
  yolo::Stream compute(yolo::Device::cpu());
  for (int i = 0; i < 6; ++i) {
    const DeviceBatch& d = feeder.next(compute);
    compute.synchronize();
    const Batch& h = *d.host;
    CHECK(std::memcmp(d.images, h.images, h.image_bytes()) == 0);
    CHECK(std::memcmp(d.truth_counts, h.truth_counts, sizeof(int) * h.count) == 0);
    CHECK(std::memcmp(d.truths, h.truths, sizeof(yolo::YoloTruth) * kMaxBoxes * h.count) == 0);
  }
}

TEST_CASE("loader: the decoded-image cache gives the same batches, and a warm one reads no file") {
  TempDir dir;
  Split split = make_split(dir, 11);
  LoaderOptions o = small_options();
  o.threads = 2;
  const std::vector<uint64_t> plain = run_hashes(split, o, 9);  // 3 epochs of 3 steps
  ImageCache cache(64 << 20);
  o.cache = &cache;
  CHECK(run_hashes(split, o, 9) == plain);
  CHECK(cache.cached_images() >= 9);  // every sample the 3 epochs used (9 of 11 each)
  for (const Sample& sample : split.samples) std::filesystem::remove(sample.image);
  o.threads = 3;
  CHECK(run_hashes(split, o, 9) == plain);
}
