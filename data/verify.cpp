// Image verification when a dataset is opened (see verify.h).
#include "data/verify.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "data/image.h"

namespace fs = std::filesystem;

namespace yolo::data {

namespace {

// v2: formats not read got a kind of their own (they were "corrupt image").
constexpr const char* kCacheHeader = "train_yolo image verification cache v2";

bool starts_with(const std::vector<uint8_t>& b, std::initializer_list<uint8_t> magic) {
  return b.size() >= magic.size() && std::equal(magic.begin(), magic.end(), b.begin());
}

}  // namespace

bool jpeg_has_end_marker(const std::vector<uint8_t>& b) {
  size_t last_sos = 0;
  for (size_t i = 2; i + 1 < b.size(); ++i)
    if (b[i] == 0xFF && b[i + 1] == 0xDA) last_sos = i;
  for (size_t i = b.size() >= 2 ? b.size() - 2 : 0; i > last_sos; --i)
    if (b[i] == 0xFF && b[i + 1] == 0xD9) return true;
  return false;
}

bool png_has_end_chunk(const std::vector<uint8_t>& b) {
  if (b.size() < 12) return false;
  const size_t from = b.size() > 4096 ? b.size() - 4096 : 0;
  for (size_t i = b.size() - 4;; --i) {
    if (b[i] == 'I' && b[i + 1] == 'E' && b[i + 2] == 'N' && b[i + 3] == 'D') return true;
    if (i == from) return false;
  }
}

namespace {

struct FileKey {
  uintmax_t size = 0;
  int64_t mtime = 0;
  bool operator==(const FileKey&) const = default;
};

bool key_of(const std::string& path, FileKey& key) {
  std::error_code ec;
  key.size = fs::file_size(path, ec);
  if (ec) return false;
  auto t = fs::last_write_time(path, ec);
  if (ec) return false;
  key.mtime = static_cast<int64_t>(t.time_since_epoch().count());
  return true;
}

struct CacheEntry {
  FileKey key;
  ImageVerdict verdict;
};

// "size \t mtime \t kind \t message \t path" per line; kind "ok" for a usable image.
std::unordered_map<std::string, CacheEntry> read_cache(const std::string& file) {
  std::unordered_map<std::string, CacheEntry> cache;
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line) || line != kCacheHeader) return cache;  // none, or another version
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    size_t start = 0;
    for (int k = 0; k < 4; ++k) {
      size_t tab = line.find('\t', start);
      if (tab == std::string::npos) break;
      fields.push_back(line.substr(start, tab - start));
      start = tab + 1;
    }
    if (fields.size() != 4) continue;  // a damaged line: verified again
    CacheEntry e;
    char* end = nullptr;
    e.key.size = std::strtoull(fields[0].c_str(), &end, 10);
    if (*end) continue;
    e.key.mtime = std::strtoll(fields[1].c_str(), &end, 10);
    if (*end) continue;
    if (fields[2] != "ok") e.verdict = {fields[2], fields[3]};
    cache[line.substr(start)] = e;
  }
  return cache;
}

std::string without_tabs(std::string s) {
  std::replace_if(
      s.begin(), s.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return s;
}

// Written whole to a temporary file and renamed (another process may write it at the same time:
// the last complete one wins). A cache that cannot be written only costs time.
void write_cache(const std::string& file, const std::unordered_map<std::string, CacheEntry>& cache) {
  const std::string tmp = file + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << kCacheHeader << "\n";
    for (const auto& [path, e] : cache) {
      if (path.find_first_of("\t\n\r") != std::string::npos) continue;
      out << e.key.size << '\t' << e.key.mtime << '\t' << (e.verdict.kind.empty() ? "ok" : without_tabs(e.verdict.kind))
          << '\t' << (e.verdict.kind.empty() ? "-" : without_tabs(e.verdict.message)) << '\t' << path << '\n';
    }
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace

ImageVerdict verify_image_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {"unreadable image", path + ": cannot be opened (" + std::strerror(errno) + ")"};
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return {"unreadable image", path + ": read error"};
  if (bytes.empty()) return {"corrupt image", path + ": the file is empty"};
  // The end markers first: a truncated file is named as such, whether or not a decoder would
  // accept it (some fill the missing part with grey).
  if (starts_with(bytes, {0xFF, 0xD8}) && !jpeg_has_end_marker(bytes))
    return {"truncated image", path + ": JPEG without its end-of-image marker after the last scan (truncated)"};
  if (starts_with(bytes, {0x89, 'P', 'N', 'G'}) && !png_has_end_chunk(bytes))
    return {"truncated image", path + ": PNG without its IEND chunk (truncated)"};
  Image image;
  std::string error;
  if (!decode_image(bytes.data(), bytes.size(), path, image, error)) {
    const bool unsupported = !unsupported_image_format(bytes.data(), bytes.size()).empty();
    return {unsupported ? "image format not read" : "corrupt image", error};
  }
  return {};
}

void verify_images(Split& split, const OpenOptions& options) {
  std::unordered_map<std::string, CacheEntry> cache;
  if (!options.cache_file.empty()) cache = read_cache(options.cache_file);
  const size_t n = split.samples.size();
  std::vector<ImageVerdict> verdicts(n);
  std::vector<FileKey> keys(n);
  std::vector<char> known(n, 0), has_key(n, 0);
  std::vector<size_t> todo;
  for (size_t i = 0; i < n; ++i) {
    const std::string& path = split.samples[i].image;
    has_key[i] = key_of(path, keys[i]);
    auto it = cache.find(path);
    if (has_key[i] && it != cache.end() && it->second.key == keys[i]) {
      verdicts[i] = it->second.verdict;
      known[i] = 1;
    } else {
      todo.push_back(i);
    }
  }
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, 64);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < todo.size();)
      verdicts[todo[k]] = verify_image_file(split.samples[todo[k]].image);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads && static_cast<size_t>(t) < todo.size(); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();

  std::vector<Sample> kept;
  kept.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (has_key[i] && !known[i]) cache[split.samples[i].image] = CacheEntry{keys[i], verdicts[i]};
    if (verdicts[i].kind.empty())
      kept.push_back(std::move(split.samples[i]));
    else
      split.problems.push_back({verdicts[i].kind, verdicts[i].message});
  }
  split.samples = std::move(kept);
  if (!options.cache_file.empty() && !todo.empty()) write_cache(options.cache_file, cache);
}

std::string default_verify_cache(const std::string& dataset_path) {
  std::error_code ec;
  fs::path p(dataset_path);
  fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  if (dir.empty()) dir = ".";
  if (::access(dir.c_str(), W_OK) != 0) return "";
  return (dir / ".train_yolo_images.cache").string();
}

}  // namespace yolo::data
