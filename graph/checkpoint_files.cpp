// last.ckpt / prev.ckpt, --resume's choice between them, and the output folder's check (see
// checkpoint_files.h).
#include "graph/checkpoint_files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "runtime/check.h"

namespace yolo::graph {
namespace {

namespace fs = std::filesystem;

std::string steps_text(int64_t steps) { return std::to_string(steps) + (steps == 1 ? " step" : " steps"); }

// Our temporary files are named TARGET.tmp.PID (graph/weights.cpp): the PID, or 0 for another name.
pid_t temporary_owner(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at + 5 >= name.size()) return 0;
  pid_t pid = 0;
  for (char c : name.substr(at + 5)) {
    if (c < '0' || c > '9' || pid > 100000000) return 0;
    pid = pid * 10 + (c - '0');
  }
  return pid;
}

uint64_t size_if_there(const fs::path& path) {
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  return error ? 0 : static_cast<uint64_t>(size);
}

}  // namespace

std::string bytes_text(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) / (1ull << 30));
  else if (bytes >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / (1ull << 20));
  else if (bytes >= (1ull << 10))
    std::snprintf(buf, sizeof buf, "%.1f KB", static_cast<double>(bytes) / (1ull << 10));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

ResumePoint find_resume_checkpoint(const std::string& dir) {
  const std::string last = dir + "/last.ckpt", prev = dir + "/prev.ckpt";
  std::string last_problem;
  if (fs::exists(last)) {
    try {
      return ResumePoint{read_checkpoint(last), last, ""};
    } catch (const Error& e) {
      last_problem = e.what();
    }
  }
  if (!fs::exists(prev)) {
    if (!last_problem.empty()) throw Error(last_problem + " (and there is no " + prev + " to fall back on)");
    throw Error(dir + ": no checkpoint to resume from (neither last.ckpt nor prev.ckpt is there; is --out right?)");
  }
  ResumePoint point;
  try {
    point.checkpoint = read_checkpoint(prev);
  } catch (const Error& e) {
    if (last_problem.empty()) throw Error(std::string(e.what()) + " (and there is no " + last + ")");
    throw Error("neither checkpoint can be resumed: " + last_problem + "; " + e.what());
  }
  point.path = prev;
  const int64_t step = point.checkpoint.iteration;
  if (last_problem.empty()) {
    point.notice =
        "no " + last + " (a save was interrupted?): resuming from " + prev + " at step " + std::to_string(step);
  } else {
    const std::optional<int64_t> last_step = peek_checkpoint_iteration(last);
    const std::string cost = last_step && *last_step >= step
                                 ? "which loses " + steps_text(*last_step - step) + " (last.ckpt was at step " +
                                       std::to_string(*last_step) + ")"
                                 : "which loses the steps after it (last.ckpt's own step count is unreadable)";
    point.notice = last_problem + ": resuming from " + prev + " at step " + std::to_string(step) + " instead, " + cost;
  }
  return point;
}

void save_checkpoint(const std::string& dir, const Checkpoint& checkpoint) {
  write_checkpoint(dir + "/last.ckpt", checkpoint, dir + "/prev.ckpt");
}

void check_output_folder(const std::string& dir, uint64_t checkpoint_bytes, uint64_t weights_bytes, int weights_files) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw Error(dir + ": cannot create the output folder (" + error.message() + "; --out)");
  if (!fs::is_directory(dir)) throw Error(dir + ": not a folder (--out)");
  // Leftovers of processes that died while saving: whole checkpoints' worth of disk, otherwise.
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const pid_t owner = temporary_owner(entry.path().filename().string());
    if (owner > 0 && owner != getpid() && kill(owner, 0) != 0 && errno == ESRCH) fs::remove(entry.path(), error);
  }
  // Writable: a file is created, written, flushed and removed.
  const std::string probe = dir + "/.train_yolo_write_test." + std::to_string(getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(dir + ": the output folder is not writable (" + std::strerror(errno) + "; --out)");
  const bool written = write(fd, "ok", 2) == 2 && fsync(fd) == 0;
  const int write_error = errno;
  const bool closed = close(fd) == 0;
  std::remove(probe.c_str());
  if (!written || !closed)
    throw Error(dir + ": cannot write to the output folder (" + std::strerror(write_error) + "; --out)");

  struct statvfs info {};
  if (statvfs(dir.c_str(), &info) != 0) return;  // no figure: nothing to compare (the save still checks)
  const uint64_t free_bytes = static_cast<uint64_t>(info.f_bavail) * info.f_frsize;
  const uint64_t needed = 3 * checkpoint_bytes + static_cast<uint64_t>(weights_files + 1) * weights_bytes;
  const uint64_t present = size_if_there(dir + "/last.ckpt") + size_if_there(dir + "/prev.ckpt") +
                           size_if_there(dir + "/last.weights") +
                           (weights_files > 1 ? size_if_there(dir + "/best.weights") : 0);
  const uint64_t more = needed > present ? needed - present : 0;
  if (more > free_bytes)
    throw Error(dir + ": not enough disk space for saving: " + bytes_text(free_bytes) + " free, " + bytes_text(more) +
                " more needed (last.ckpt, prev.ckpt and the next one being written, " + bytes_text(checkpoint_bytes) +
                " each, and " + std::to_string(weights_files) + " .weights of " + bytes_text(weights_bytes) +
                " plus one being written); free some space or choose another --out");
}

}  // namespace yolo::graph
