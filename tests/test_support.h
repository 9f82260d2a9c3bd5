// Helpers shared by the test suites: skipping with a visible reason, seeded random inputs
// (seed printed, settable with YOLO_TEST_SEED), the tolerance check of DESIGN.md, and a latch
// with a timeout for concurrency tests.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace yolo::testing {

void mark_skipped(const char* test_name, const std::string& reason);

// Ends the current test case as skipped, printing why.
#define SKIP_TEST(reason)                                                                    \
  do {                                                                                       \
    ::yolo::testing::mark_skipped(doctest::getContextOptions()->currentTest                 \
                                      ? doctest::getContextOptions()->currentTest->m_name   \
                                      : "?",                                                 \
                                  (reason));                                                 \
    return;                                                                                  \
  } while (0)

// A random source for one test: fresh seed each run unless YOLO_TEST_SEED is set.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("YOLO_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
}

class Rng {
 public:
  Rng() : seed_(test_seed()), engine_(seed_) {}
  uint64_t seed() const { return seed_; }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(engine_); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine_); }
  std::vector<float> floats(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
};

// |out - ref| <= atol + rtol*|ref|, written so that NaN fails.
inline bool close(double out, double ref, double atol, double rtol) {
  double diff = out > ref ? out - ref : ref - out;
  double mag = ref < 0 ? -ref : ref;
  return diff <= atol + rtol * mag;
}

// out[i] = data[0][i] + data[1][i] + ... added in rank order, in float: what every rank of an
// all-reduce must get, bit for bit (the communicators' contract).
inline std::vector<float> rank_ordered_sum(const std::vector<std::vector<float>>& data) {
  std::vector<float> out = data.at(0);
  for (size_t r = 1; r < data.size(); ++r)
    for (size_t i = 0; i < out.size(); ++i) out[i] += data[r][i];
  return out;
}

// What work on several streams did, in the order it happened (thread-safe).
struct Log {
  std::mutex mutex;
  std::vector<std::string> entries;
  void add(const std::string& s) {
    std::lock_guard lock(mutex);
    entries.push_back(s);
  }
  std::function<void()> note(const std::string& s) {  // work that adds s
    return [this, s] { add(s); };
  }
  std::vector<std::string> get() {
    std::lock_guard lock(mutex);
    return entries;
  }
  std::vector<std::string> take() {  // get, then forget
    std::lock_guard lock(mutex);
    return std::exchange(entries, {});
  }
};

// A one-shot latch whose wait gives up after a timeout (so a broken test fails, never hangs).
class Latch {
 public:
  void release() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return open_; });
  }
  bool is_open() {
    std::lock_guard lock(mutex_);
    return open_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

// A fresh directory under the system temp folder, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "yolo_test_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path() / relative
  std::string operator/(const std::string& relative) const { return path_ + "/" + relative; }

 private:
  std::string path_;
};

// Writes `text` to `path`, creating parent folders.
inline void write_text_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace yolo::testing
