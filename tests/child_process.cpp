// Child processes for multi-process tests (see child_process.h).
#include "tests/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace yolo::testing {

namespace {

std::map<std::string, Role>& roles() {
  static std::map<std::string, Role> table;
  return table;
}

}  // namespace

bool register_role(const char* name, Role role) {
  roles()[name] = role;
  return true;
}

int run_role(const std::string& name) {
  auto it = roles().find(name);
  if (it == roles().end()) {
    std::fprintf(stderr, "no test role '%s'\n", name.c_str());
    return 2;
  }
  return it->second();
}

ChildProcess::ChildProcess(const std::string& role, const std::vector<std::string>& env, const std::string& log_file) {
  std::vector<std::string> vars(env);
  vars.push_back("YOLO_TEST_ROLE=" + role);
  for (char** e = environ; *e; ++e) vars.emplace_back(*e);  // later duplicates lose to ours
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  int status = posix_spawn(&pid_, self.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (status != 0) throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(status));
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

int ChildProcess::wait(double seconds) {
  if (pid_ <= 0) return -1;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid_, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (done == 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return -1;
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace yolo::testing
