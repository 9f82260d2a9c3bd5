// darknet .weights files and our .ckpt checkpoints (formats in weights.h): darknet's layouts are
// converted to ours here, every size is checked against the file before a byte is trusted, and
// files are written beside the target and renamed into place.
#include "graph/weights.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "runtime/check.h"

namespace yolo::graph {
namespace {

static_assert(std::endian::native == std::endian::little,
              "both file formats are little-endian and this build does not swap bytes");

constexpr uint64_t kHeaderBytes = 20;  // version 0.2.0: three int32 and a uint64 `seen`
constexpr char kCheckpointMagic[8] = {'Y', 'O', 'L', 'O', 'C', 'K', 'P', 'T'};
// Version 2 added the step's shape (batch, subdivisions) after the seed; version 1 is still read.
constexpr uint32_t kCheckpointVersion = 2;
bool readable_version(uint32_t version) { return version == 1 || version == kCheckpointVersion; }

std::string errno_text() { return std::strerror(errno); }

// ---- layers ---------------------------------------------------------------------------------

// "layer 12 (conv, 256 filters)": what the messages call a layer. Our own names, so this unit
// does not depend on the cfg parser.
std::string describe(const LayerParams& l) {
  if (l.type == LayerType::Connected)
    return "layer " + std::to_string(l.layer) + " (connected, " + std::to_string(l.c_out) + " outputs)";
  return "layer " + std::to_string(l.layer) + " (conv, " + std::to_string(l.c_out) + " filters)";
}

// LayerParams come from the graph, not the user: a bad one is a bug, reported before any I/O.
void check_params(const LayerParams& l, const std::string& path) {
  auto bad = [&](const std::string& why) {
    throw Error(path + ": " + describe(l) + ": invalid parameter description (" + why + ")");
  };
  if (l.type != LayerType::Convolutional && l.type != LayerType::Connected)
    bad("only conv and connected layers have weights");
  if (l.c_out < 1 || l.c_in < 1 || l.k < 1 || l.in_h < 1 || l.in_w < 1) bad("a size below 1");
  if (l.type == LayerType::Convolutional && (l.in_h != 1 || l.in_w != 1)) bad("a conv layer with in_h/in_w != 1");
  if (l.type == LayerType::Connected && l.k != 1) bad("a connected layer with k != 1");
  if (!l.weights || !l.biases) bad("no weights or biases buffer");
  if (l.batch_normalize && (!l.scales || !l.rolling_mean || !l.rolling_variance))
    bad("batch_normalize without its buffers");
}

uint64_t float_count(const LayerParams& l) {
  return l.weight_count() + uint64_t(l.c_out) * (l.batch_normalize ? 4 : 1);
}

// Per output, darknet stores the weights channel-major [c_in][spatial] and we store
// [spatial][c_in] (spatial = k*k for conv, in_h*in_w for connected). Each output's block of
// rows x cols is transposed into cols x rows.
void transpose_blocks(const float* src, float* dst, size_t blocks, size_t rows, size_t cols) {
  const size_t block = rows * cols;
  if (rows == 1 || cols == 1) {
    std::memcpy(dst, src, blocks * block * sizeof(float));
    return;
  }
  for (size_t b = 0; b < blocks; ++b, src += block, dst += block)
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

size_t spatial(const LayerParams& l) { return size_t(l.k) * l.k * l.in_h * l.in_w; }

// The per-channel arrays in file order: conv puts them before the weights, connected after.
std::vector<float*> channel_arrays(const LayerParams& l) {
  if (!l.batch_normalize) return {};
  return {l.scales, l.rolling_mean, l.rolling_variance};
}

// Copies one layer's values from darknet's file order (`src`) into the layer, converting layouts.
void scatter_layer(const float* src, const LayerParams& l) {
  const size_t n = size_t(l.c_out);
  std::memcpy(l.biases, src, n * sizeof(float));
  src += n;
  if (l.type == LayerType::Convolutional)
    for (float* dst : channel_arrays(l)) std::memcpy(dst, src, n * sizeof(float)), src += n;
  transpose_blocks(src, l.weights, n, size_t(l.c_in), spatial(l));
  src += l.weight_count();
  if (l.type == LayerType::Connected)
    for (float* dst : channel_arrays(l)) std::memcpy(dst, src, n * sizeof(float)), src += n;
}

// The inverse of scatter_layer: the layer's values in darknet's file order.
void gather_layer(const LayerParams& l, float* dst) {
  const size_t n = size_t(l.c_out);
  std::memcpy(dst, l.biases, n * sizeof(float));
  dst += n;
  if (l.type == LayerType::Convolutional)
    for (float* src : channel_arrays(l)) std::memcpy(dst, src, n * sizeof(float)), dst += n;
  transpose_blocks(l.weights, dst, n, spatial(l), size_t(l.c_in));
  dst += l.weight_count();
  if (l.type == LayerType::Connected)
    for (float* src : channel_arrays(l)) std::memcpy(dst, src, n * sizeof(float)), dst += n;
}

bool all_finite(const std::vector<float>& values) {
  bool finite = true;
  for (float v : values) finite &= std::isfinite(v);
  return finite;
}

// ---- files ----------------------------------------------------------------------------------

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

// A regular file opened for reading, its size taken from the open descriptor.
class InputFile {
 public:
  InputFile(const std::string& path, const char* what) : path_(path) {
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_) throw Error(path + ": cannot open " + what + " (" + errno_text() + ")");
    struct stat info {};
    if (fstat(fileno(file_.get()), &info) != 0) throw Error(path + ": cannot stat (" + errno_text() + ")");
    if (!S_ISREG(info.st_mode)) throw Error(path + ": not a regular file (expected a " + what + ")");
    size_ = uint64_t(info.st_size);
  }
  uint64_t size() const { return size_; }
  uint64_t position() const { return position_; }
  uint64_t remaining() const { return size_ - position_; }
  // Callers check sizes first, so a short read here means the file changed or the disk failed.
  void read(void* data, size_t bytes) {
    if (bytes == 0) return;
    if (std::fread(data, 1, bytes, file_.get()) != bytes)
      throw Error(path_ + ": read failed at byte " + std::to_string(position_) + " (" +
                  (std::ferror(file_.get()) ? errno_text() : "the file got shorter while being read") + ")");
    position_ += bytes;
  }

 private:
  std::string path_;
  FilePtr file_;
  uint64_t size_ = 0, position_ = 0;
};

// Test hooks at each step of a save that makes it durable (see weights.h).
std::function<void(const std::string&)>& save_step_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

void save_step(const std::string& what) {
  if (save_step_hook()) save_step_hook()(what);
  static const int pause_ms = [] {
    const char* text = std::getenv("YOLO_TEST_SAVE_PAUSE_MS");
    return text ? std::atoi(text) : 0;
  }();
  if (pause_ms <= 0) return;
  std::fprintf(stderr, "train_yolo: save step: %s\n", what.c_str());  // where a test's kill lands
  std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
}

// Written to PATH.tmp.<pid>, then flushed to disk and renamed over PATH, so PATH is always either
// the old file or the whole new one. Until commit() succeeds, the destructor removes the temp.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), temp_(path + ".tmp." + std::to_string(getpid())) {
    file_.reset(std::fopen(temp_.c_str(), "wb"));
    if (!file_) throw Error(path_ + ": cannot write (creating " + temp_ + ": " + errno_text() + ")");
  }
  ~AtomicFile() {
    if (committed_) return;
    file_.reset();
    std::remove(temp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& path() const { return path_; }
  // A save-step hook's point in the middle of the file's data (before its bulk is written).
  void midway() { save_step("write " + temp_); }
  void write(const void* data, size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, file_.get()) != bytes) fail("write");
  }
  // Flushes the file to disk and renames it over path(). With keep_previous_as, an existing
  // path() is first renamed to that name (the previous checkpoint kept): a stop between the two
  // renames leaves no path() but the previous file under its new name.
  // The order is what makes a crash at any point (a kill, a power cut) leave a whole file: the
  // new one is on disk before any name changes, and the folder is synced after the renames.
  void commit(const std::string& keep_previous_as = "") {
    if (std::fflush(file_.get()) != 0) fail("write");
    save_step("fsync " + temp_);
    if (fsync(fileno(file_.get())) != 0) fail("flush to disk");
    if (std::fclose(file_.release()) != 0) fail("close");
    if (!keep_previous_as.empty() && std::filesystem::exists(path_)) {
      save_step("rename " + path_ + " " + keep_previous_as);
      if (std::rename(path_.c_str(), keep_previous_as.c_str()) != 0)
        throw Error(path_ + ": cannot rename it to " + keep_previous_as + " to keep it (" + errno_text() +
                    "); it is unchanged and the new file was not saved");
    }
    save_step("rename " + temp_ + " " + path_);
    if (std::rename(temp_.c_str(), path_.c_str()) != 0)
      throw Error(path_ + ": cannot rename " + temp_ + " to it (" + errno_text() + ")");
    committed_ = true;
    sync_directory();
  }

 private:
  // Makes the rename itself durable; best effort, as some file systems refuse to sync folders.
  void sync_directory() const {
    std::string folder = std::filesystem::path(path_).parent_path().string();
    save_step("fsync-dir " + (folder.empty() ? std::string(".") : folder));
    int fd = open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
  }

  // A failed write, flush or close: the temporary file goes (the destructor), the target stays.
  [[noreturn]] void fail(const char* what) const {
    const int error = errno;
    const char* hint = error == ENOSPC   ? "; the disk is full"
                       : error == EDQUOT ? "; the disk quota is used up"
                       : error == EFBIG  ? "; the file size limit (ulimit -f) is reached"
                                         : "";
    throw Error(path_ + ": cannot " + what + " " + temp_ + " (" + std::strerror(error) + hint + "); " + path_ +
                " itself is unchanged");
  }

  std::string path_, temp_;
  FilePtr file_;
  bool committed_ = false;
};

// ---- checksum -------------------------------------------------------------------------------

// A 64-bit checksum taken 8 bytes at a time. Each step (xor the word, multiply by an odd
// constant, rotate) is a bijection of the state, so a change confined to one word always
// changes the result; the length and a final mix (splitmix64's) go in at the end.
class Checksum {
 public:
  void update(const void* data, size_t bytes) {
    auto* p = static_cast<const unsigned char*>(data);
    total_ += bytes;
    while (bytes > 0 && pending_ > 0) {
      tail_[pending_++] = *p++, --bytes;
      if (pending_ == 8) mix(word(tail_)), pending_ = 0;
    }
    for (; bytes >= 8; p += 8, bytes -= 8) mix(word(p));
    while (bytes > 0) tail_[pending_++] = *p++, --bytes;
  }
  uint64_t value() const {
    Checksum copy = *this;
    if (copy.pending_ > 0) {
      std::memset(copy.tail_ + copy.pending_, 0, 8 - copy.pending_);
      copy.mix(word(copy.tail_));
    }
    copy.mix(total_);
    uint64_t z = copy.state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  static uint64_t word(const unsigned char* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  void mix(uint64_t w) { state_ = std::rotl((state_ ^ w) * 0x9E3779B97F4A7C15ull, 29); }

  uint64_t state_ = 0x243F6A8885A308D3ull, total_ = 0;
  unsigned char tail_[8] = {};
  size_t pending_ = 0;
};

// Checkpoint reading: every field is counted against what is left before the checksum, so a
// truncated or corrupt length gives an error instead of a huge allocation or a read past the end.
class CheckpointReader {
 public:
  CheckpointReader(InputFile& in, const std::string& path) : in_(in), path_(path), end_(in.size() - 8) {}
  uint64_t left() const { return end_ - in_.position(); }
  // Throws unless `items` of `item_size` bytes remain, before anything that size is allocated.
  void require(uint64_t items, uint64_t item_size, const std::string& what) const {
    if (items <= left() / item_size) return;
    throw Error(path_ + ": checkpoint is truncated or corrupt: " + what + " needs " + std::to_string(items) +
                (item_size > 1 ? " x " + std::to_string(item_size) : "") + " bytes, only " + std::to_string(left()) +
                " remain before the checksum");
  }
  void take(void* data, uint64_t bytes, const std::string& what) {
    require(bytes, 1, what);
    in_.read(data, size_t(bytes));
    sum_.update(data, size_t(bytes));
  }
  template <class T>
  T value(const std::string& what) {
    T v{};
    take(&v, sizeof v, what);
    return v;
  }
  std::string text(const std::string& what) {
    const auto length = value<uint64_t>(what + "'s length");
    require(length, 1, what);
    std::string s(size_t(length), '\0');
    take(s.data(), length, what);
    return s;
  }
  // Bytes read before the reader existed (the magic): they count in the checksum too.
  void count(const void* data, size_t bytes) { sum_.update(data, bytes); }
  uint64_t checksum() const { return sum_.value(); }

 private:
  InputFile& in_;
  const std::string& path_;
  uint64_t end_;
  Checksum sum_;
};

// Checkpoint writing: every byte also goes into the checksum.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(AtomicFile& out) : out_(out) {}
  void put(const void* data, size_t bytes) {
    out_.write(data, bytes);
    sum_.update(data, bytes);
  }
  template <class T>
  void value(T v) {
    put(&v, sizeof v);
  }
  void text(const std::string& s) {
    value<uint64_t>(s.size());
    put(s.data(), s.size());
  }
  uint64_t checksum() const { return sum_.value(); }

 private:
  AtomicFile& out_;
  Checksum sum_;
};

}  // namespace

// ---- darknet .weights -----------------------------------------------------------------------

uint64_t darknet_weights_bytes(std::span<const LayerParams> layers) {
  uint64_t bytes = kHeaderBytes;
  for (const LayerParams& l : layers) bytes += float_count(l) * sizeof(float);
  return bytes;
}

WeightsHeader read_darknet_weights(const std::string& path, std::span<const LayerParams> layers, int load_layers) {
  InputFile in(path, "darknet .weights file");
  if (in.size() < 12)
    throw Error(path + ": " + std::to_string(in.size()) + " bytes, too short for a darknet .weights header");
  int32_t version[3];
  in.read(version, sizeof version);
  for (int32_t part : version)
    if (part < 0 || part > 1000)
      throw Error(path + ": not a darknet .weights file (its header says version " + std::to_string(version[0]) + "." +
                  std::to_string(version[1]) + "." + std::to_string(version[2]) + "; each part should be 0..1000)");
  WeightsHeader header{version[0], version[1], version[2], 0};
  // darknet wrote `seen` as a 32-bit int before version 0.2.
  const bool wide_seen = header.major * 10 + header.minor >= 2;
  const uint64_t header_bytes = wide_seen ? 20 : 16;
  if (in.size() < header_bytes)
    throw Error(path + ": " + std::to_string(in.size()) + " bytes, too short for a darknet .weights header");
  if (wide_seen) {
    in.read(&header.seen, 8);
  } else {
    uint32_t seen32 = 0;
    in.read(&seen32, 4);
    header.seen = seen32;
  }

  // Partial loading (a backbone): the layers before cfg index load_layers.
  size_t count = 0;
  while (count < layers.size() && (load_layers < 0 || layers[count].layer < load_layers)) ++count;
  const auto loaded = layers.first(count);

  // All sizes are checked before any parameter is touched.
  uint64_t needed = header_bytes;
  for (const LayerParams& l : loaded) {
    check_params(l, path);
    needed += float_count(l) * sizeof(float);
  }
  if (needed > in.size()) {
    uint64_t start = header_bytes;  // of the layer where the file ends
    for (const LayerParams& l : loaded) {
      const uint64_t end = start + float_count(l) * sizeof(float);
      if (end > in.size())
        throw Error(path + ": ends " + (start == in.size() ? "before " : "inside ") + describe(l) + ": expected " +
                    std::to_string(end - in.size()) + " more bytes (the file has " + std::to_string(in.size()) +
                    ", the cfg's layers need " + std::to_string(needed) + "): wrong cfg, or a truncated file?");
      start = end;
    }
  }
  if (load_layers < 0 && in.size() > needed)
    throw Error(path + " has " + std::to_string(in.size() - needed) + " bytes more than the cfg's layers need (" +
                std::to_string(needed) + " of " + std::to_string(in.size()) + "): wrong cfg?");

  std::vector<float> values;
  for (const LayerParams& l : loaded) {
    values.resize(size_t(float_count(l)));
    in.read(values.data(), values.size() * sizeof(float));
    if (!all_finite(values)) throw Error(path + ": " + describe(l) + " has NaN/Inf weights");
    scatter_layer(values.data(), l);
  }
  return header;
}

void write_darknet_weights(const std::string& path, std::span<const LayerParams> layers, const WeightsHeader& header) {
  for (const LayerParams& l : layers) check_params(l, path);
  AtomicFile out(path);
  // Always the current layout (0.2.0, 64-bit seen) whatever version was read: the file then has
  // darknet_weights_bytes() bytes.
  const int32_t version[3] = {0, 2, 0};
  out.write(version, sizeof version);
  out.write(&header.seen, sizeof header.seen);
  out.midway();
  std::vector<float> values;
  for (const LayerParams& l : layers) {
    values.resize(size_t(float_count(l)));
    gather_layer(l, values.data());
    // Such a file could not be loaded again (read_darknet_weights refuses it).
    if (!all_finite(values)) throw Error(path + ": not written: " + describe(l) + " has NaN/Inf weights");
    out.write(values.data(), values.size() * sizeof(float));
  }
  out.commit();
}

// ---- checkpoints ----------------------------------------------------------------------------

uint64_t checkpoint_bytes(const std::string& cfg_digest, std::span<const std::pair<std::string, uint64_t>> tensors) {
  // magic, version, digest (length + text), iteration, seen, loader epoch/step/seed, seed, batch,
  // subdivisions, tensor count
  uint64_t bytes = sizeof kCheckpointMagic + 4 + 8 + cfg_digest.size() + 8 * 8 + 8;
  for (const auto& [name, count] : tensors) bytes += 8 + name.size() + 8 + count * sizeof(float);
  return bytes + 8;  // the checksum
}

std::optional<int64_t> peek_checkpoint_iteration(const std::string& path) {
  try {
    InputFile file(path, "checkpoint");
    char magic[sizeof kCheckpointMagic] = {};
    uint32_t version = 0;
    uint64_t digest_length = 0;
    if (file.size() < sizeof magic + 4 + 8) return std::nullopt;
    file.read(magic, sizeof magic);
    file.read(&version, sizeof version);
    file.read(&digest_length, sizeof digest_length);
    if (std::memcmp(magic, kCheckpointMagic, sizeof magic) != 0 || !readable_version(version) ||
        digest_length > 256 || file.remaining() < digest_length + 8)
      return std::nullopt;
    std::string digest(size_t(digest_length), '\0');
    file.read(digest.data(), digest.size());
    int64_t iteration = 0;
    file.read(&iteration, sizeof iteration);
    if (iteration < 0) return std::nullopt;
    return iteration;
  } catch (const Error&) {
    return std::nullopt;
  }
}

namespace {

void write_checkpoint_version(const std::string& path, const Checkpoint& checkpoint,
                              const std::string& keep_previous_as, uint32_t version) {
  AtomicFile file(path);
  CheckpointWriter out(file);
  out.put(kCheckpointMagic, sizeof kCheckpointMagic);
  out.value<uint32_t>(version);
  out.text(checkpoint.cfg_digest);
  out.value<int64_t>(checkpoint.iteration);
  out.value<uint64_t>(checkpoint.seen);
  out.value<int64_t>(checkpoint.loader.epoch);
  out.value<int64_t>(checkpoint.loader.step);
  out.value<uint64_t>(checkpoint.loader.seed);
  out.value<uint64_t>(checkpoint.seed);
  if (version >= 2) {
    out.value<int64_t>(checkpoint.batch);
    out.value<int64_t>(checkpoint.subdivisions);
  }
  out.value<uint64_t>(checkpoint.tensors.size());
  file.midway();
  for (const auto& [name, data] : checkpoint.tensors) {
    out.text(name);
    out.value<uint64_t>(data.size());
    out.put(data.data(), data.size() * sizeof(float));
  }
  const uint64_t checksum = out.checksum();
  file.write(&checksum, sizeof checksum);
  file.commit(keep_previous_as);
}

}  // namespace

void write_checkpoint(const std::string& path, const Checkpoint& checkpoint, const std::string& keep_previous_as) {
  write_checkpoint_version(path, checkpoint, keep_previous_as, kCheckpointVersion);
}

Checkpoint read_checkpoint(const std::string& path) {
  InputFile file(path, "checkpoint");
  char magic[sizeof kCheckpointMagic] = {};
  if (file.size() >= sizeof magic) file.read(magic, sizeof magic);
  if (std::memcmp(magic, kCheckpointMagic, sizeof magic) != 0)
    throw Error(path + ": not a checkpoint (no YOLOCKPT magic at the start; " + std::to_string(file.size()) +
                " bytes)");
  if (file.size() < sizeof magic + 8) throw Error(path + ": checkpoint is truncated: no room for its checksum");
  CheckpointReader in(file, path);
  in.count(magic, sizeof magic);
  const auto version = in.value<uint32_t>("the version");
  if (!readable_version(version))
    throw Error(path + ": unsupported checkpoint version " + std::to_string(version) + " (this build reads versions 1 "
                "to " + std::to_string(kCheckpointVersion) + ")");
  Checkpoint ckpt;
  ckpt.cfg_digest = in.text("the cfg digest");
  ckpt.iteration = in.value<int64_t>("the iteration");
  ckpt.seen = in.value<uint64_t>("the seen count");
  ckpt.loader.epoch = in.value<int64_t>("the loader's epoch");
  ckpt.loader.step = in.value<int64_t>("the loader's step");
  ckpt.loader.seed = in.value<uint64_t>("the loader's seed");
  ckpt.seed = in.value<uint64_t>("the seed");
  if (version >= 2) {
    ckpt.batch = in.value<int64_t>("the batch");
    ckpt.subdivisions = in.value<int64_t>("the subdivisions");
  }
  const auto tensors = in.value<uint64_t>("the tensor count");
  // Each tensor takes at least 16 bytes (name length and count).
  if (tensors > in.left() / 16)
    throw Error(path + ": checkpoint is truncated or corrupt: " + std::to_string(tensors) + " tensors cannot fit in the " +
                std::to_string(in.left()) + " bytes left");
  for (uint64_t t = 0; t < tensors; ++t) {
    const std::string which = "tensor " + std::to_string(t);
    std::string name = in.text(which + "'s name");
    const auto count = in.value<uint64_t>(which + " ('" + name + "')'s size");
    const std::string what = which + " ('" + name + "', " + std::to_string(count) + " floats)";
    in.require(count, sizeof(float), what);
    std::vector<float> data(static_cast<size_t>(count));
    in.take(data.data(), count * sizeof(float), what);
    ckpt.tensors.emplace_back(std::move(name), std::move(data));
  }
  if (in.left() > 0)
    throw Error(path + ": checkpoint is corrupt: " + std::to_string(in.left()) +
                " unexpected bytes after the last tensor");
  uint64_t stored = 0;
  file.read(&stored, sizeof stored);
  if (stored != in.checksum())
    throw Error(path + ": checksum mismatch: the checkpoint is corrupt (damaged on disk or in a copy)");
  return ckpt;
}

namespace test_hooks {
void set_save_step_hook(std::function<void(const std::string& step)> hook) { save_step_hook() = std::move(hook); }
void write_checkpoint_version1(const std::string& path, const Checkpoint& checkpoint) {
  write_checkpoint_version(path, checkpoint, "", 1);
}
}  // namespace test_hooks

}  // namespace yolo::graph
