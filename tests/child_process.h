// Child processes for multi-process tests (ranks of a launched job): a test starts this same
// test binary again with YOLO_TEST_ROLE=NAME and the environment it chooses; main() then runs
// the role registered under NAME (its return value is the exit code) instead of the tests.
// Unlike fork(), the child is a fresh process: it may start threads like any program.
#pragma once
#include <string>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace yolo::testing {

using Role = int (*)();
bool register_role(const char* name, Role role);
int run_role(const std::string& name);  // main(): the role's exit code (2: no such role)

// Defines a role: TEST_ROLE(train_rank) { ...; return 0; }
#define TEST_ROLE(name)                                                                      \
  static int name##_role();                                                                  \
  [[maybe_unused]] static const bool name##_registered = ::yolo::testing::register_role(#name, name##_role); \
  static int name##_role()

class ChildProcess {
 public:
  // Runs `role` in a new process of this binary with `env` ("NAME=value") added to this
  // process's environment; its stdout and stderr go to `log_file`.
  ChildProcess(const std::string& role, const std::vector<std::string>& env, const std::string& log_file);
  ~ChildProcess();  // kills it if it still runs
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Waits up to `seconds`; the exit code, or -1 when it was killed (by us, after the wait, or
  // by a signal).
  int wait(double seconds);

 private:
  pid_t pid_ = -1;
};

// Runs `body` in a fork()ed copy of this process (for code that must crash there: a sanitizer
// report, a fault) and returns what it wrote to stdout and stderr; *status: its wait status.
// The child exits 0 if body returns. Only the calling thread exists in the child.
template <typename Body>
std::string output_of_forked(Body body, int* status) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  pid_t child = fork();
  if (child < 0) return "fork failed";
  if (child == 0) {
    dup2(fds[1], STDERR_FILENO);
    dup2(fds[1], STDOUT_FILENO);  // doctest's crash report too
    body();
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buffer[4096];
  for (ssize_t got; (got = read(fds[0], buffer, sizeof buffer)) > 0;) report.append(buffer, size_t(got));
  close(fds[0]);
  waitpid(child, status, 0);
  return report;
}

}  // namespace yolo::testing
