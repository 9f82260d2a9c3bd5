// The stop rule (runtime/stop_signal.h): one request, one stop. The first SIGTERM or SIGINT only
// sets the flag; the same signal from the same sender within the window (GNU timeout's pair:
// the process, then its group) is the same request; anything else stops the process at once.
// Signals are real, delivered with their sender (raise, kill, another process's kill); the
// window is tested on an injected clock, never with sleeps.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "runtime/stop_signal.h"
#include "tests/child_process.h"

using namespace yolo;
using yolo::testing::output_of_forked;

namespace {

int64_t g_fake_now_ns = 0;
int64_t fake_clock() { return g_fake_now_ns; }

// Sends `signal` to this process from a new process (another sender), and returns once it has.
void signal_from_another_process(int signal) {
  const pid_t target = getpid();
  const pid_t sender = fork();
  if (sender == 0) _exit(kill(target, signal) == 0 ? 0 : 1);
  int status = 0;
  waitpid(sender, &status, 0);  // kill() has returned: the signal is pending here, delivered now
}

// What a forked child that installs the handlers and then runs `send` did: its output and wait
// status. It exits 0 when it survives with stop_signal() == `first`, 10 when it survives otherwise.
template <typename Send>
std::string run_signalled(int first, Send send, int* status) {
  return output_of_forked(
      [first, send] {
        install_stop_handlers();
        send();
        _exit(stop_signal() == first ? 0 : 10);
      },
      status);
}

bool survived(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
bool died_of(int status, int signal) { return WIFSIGNALED(status) && WTERMSIG(status) == signal; }

}  // namespace

TEST_CASE("repeats_request: the same signal from the same process within the window; nothing else") {
  const SignalArrival first{SIGTERM, 4242, 1'000};
  auto next = [](int signal, pid_t sender, int64_t time_ns) { return SignalArrival{signal, sender, time_ns}; };
  CHECK(repeats_request(first, next(SIGTERM, 4242, 1'000)));
  CHECK(repeats_request(first, next(SIGTERM, 4242, 1'000 + kSameRequestWindowNs - 1)));
  CHECK_FALSE(repeats_request(first, next(SIGTERM, 4242, 1'000 + kSameRequestWindowNs)));
  CHECK_FALSE(repeats_request(first, next(SIGINT, 4242, 1'000)));  // another signal
  CHECK_FALSE(repeats_request(first, next(SIGTERM, 4243, 1'000)));  // another sender
  // The terminal's Ctrl-C comes from the kernel (no sender): a second one always stops at once.
  CHECK_FALSE(repeats_request({SIGINT, 0, 1'000}, next(SIGINT, 0, 1'000)));
}

TEST_CASE("arrival_of: kill, sigqueue and raise name their sender; the kernel's signals do not") {
  siginfo_t info{};
  info.si_pid = 321;
  for (int code : {SI_USER, SI_QUEUE, SI_TKILL}) {
    CAPTURE(code);
    info.si_code = code;
    const SignalArrival a = arrival_of(SIGTERM, info, 77);
    CHECK(a.signal == SIGTERM);
    CHECK(a.sender == 321);
    CHECK(a.time_ns == 77);
  }
  info.si_code = SI_KERNEL;  // a terminal's SIGINT
  CHECK(arrival_of(SIGINT, info, 77).sender == 0);
}

TEST_CASE("one request as two signals (timeout's pair: the process, then its group) stops once, after saving") {
  for (int signal : {SIGTERM, SIGINT}) {
    CAPTURE(signal);
    int status = 0;
    std::string output = run_signalled(
        signal,
        [signal] {
          setpgid(0, 0);  // a group of its own, as timeout makes, so kill(0) reaches only this process
          kill(getpid(), signal);
          kill(0, signal);
        },
        &status);
    INFO(output);
    CHECK(survived(status));
    CHECK(output.find(std::string(signal_name(signal)) + " received: stopping after the step under way") !=
          std::string::npos);
    CHECK(output.find("again from the same sender: one stop request") != std::string::npos);
  }
}

TEST_CASE("a second request stops at once: another sender, another signal, or the same sender after the window") {
  int status = 0;
  std::string output = run_signalled(
      SIGTERM,
      [] {
        raise(SIGTERM);
        signal_from_another_process(SIGTERM);
      },
      &status);
  INFO(output);
  CHECK(died_of(status, SIGTERM));
  CHECK(output.find("a second stop request: stopping at once, without saving") != std::string::npos);

  output = run_signalled(
      SIGTERM,
      [] {
        raise(SIGTERM);
        raise(SIGINT);  // Ctrl-C after a scheduler's SIGTERM
      },
      &status);
  INFO(output);
  CHECK(died_of(status, SIGINT));

  output = run_signalled(
      SIGTERM,
      [] {
        set_stop_clock(fake_clock);
        g_fake_now_ns = 5'000;
        raise(SIGTERM);
        g_fake_now_ns = 5'000 + kSameRequestWindowNs;
        raise(SIGTERM);
      },
      &status);
  INFO(output);
  CHECK(died_of(status, SIGTERM));
}

TEST_CASE("within the window on the injected clock, the same sender's signal is still one request") {
  int status = 0;
  std::string output = run_signalled(
      SIGTERM,
      [] {
        set_stop_clock(fake_clock);
        g_fake_now_ns = 5'000;
        raise(SIGTERM);
        g_fake_now_ns = 5'000 + kSameRequestWindowNs - 1;
        raise(SIGTERM);
      },
      &status);
  INFO(output);
  CHECK(survived(status));
}

TEST_CASE("after training the handlers go: the first signal then stops the process") {
  int status = 0;
  std::string output = output_of_forked(
      [] {
        install_stop_handlers();
        remove_stop_handlers();
        raise(SIGINT);
        _exit(12);
      },
      &status);
  CHECK(died_of(status, SIGINT));
  CHECK(output.find("received") == std::string::npos);
}
