// Helpers shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp): the input as text, an
// in-memory file and a per-process scratch folder for the readers that only take a path.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace yolo::fuzz {

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A file in memory (memfd) named by /proc/self/fd/N: for readers of one file, without the
// cost of a real file system on every input. It is a regular file, as the readers require.
class MemoryFile {
 public:
  explicit MemoryFile(const char* name) : fd_(memfd_create(name, 0)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  // Replaces the contents with `bytes` and returns the path to open.
  const std::string& write(std::string_view bytes) const {
    if (ftruncate(fd_, 0) != 0) std::abort();
    for (size_t done = 0; done < bytes.size();) {
      ssize_t n = pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(done));
      if (n <= 0) std::abort();  // the harness itself failed, not the code under test
      done += size_t(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// $TMPDIR/fuzz_NAME.PID, created on first use and removed when the process exits normally
// (one folder per process, so parallel fuzzers and CI runs do not share files).
class Scratch {
 public:
  explicit Scratch(const std::string& name) {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") / (name + "." + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::string path(const std::string& relative) const { return (dir_ / relative).string(); }

  // Writes `bytes` to dir/relative (replacing it) and returns the full path.
  std::string write(const std::string& relative, std::string_view bytes) const {
    std::string full = path(relative);
    std::filesystem::create_directories(std::filesystem::path(full).parent_path());
    std::ofstream out(full, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) std::abort();  // the harness itself failed, not the code under test
    return full;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace yolo::fuzz
