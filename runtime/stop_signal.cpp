// SIGTERM/SIGINT handling (see stop_signal.h). The handler does only what is async-signal-safe:
// atomic loads and stores, clock_gettime, write(2), and for a second request sigaction + raise.
#include "runtime/stop_signal.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/check.h"

namespace yolo {
namespace {

// The first arrival, written once by the handler that wins g_recording; g_stop_signal is
// published after it. A process-directed signal may run the handler on any thread, so a second
// handler can start while the first is still recording: it waits for g_stop_signal.
std::atomic<bool> g_recording{false};
std::atomic<int> g_stop_signal{0};
std::atomic<pid_t> g_first_sender{0};
std::atomic<int64_t> g_first_time_ns{0};
std::atomic<StopClock> g_clock{nullptr};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free &&
                  std::atomic<pid_t>::is_always_lock_free && std::atomic<StopClock>::is_always_lock_free,
              "the signal handler uses them");

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

void write_text(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Dies of `signal` now, as if no handler had been installed.
void stop_at_once(int signal) {
  write_text("\ntrain_yolo: a second stop request: stopping at once, without saving\n");
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  raise(signal);
}

void on_stop_signal(int signal, siginfo_t* info, void*) {
  const StopClock clock = g_clock.load();
  const SignalArrival arrival = arrival_of(signal, *info, clock ? clock() : monotonic_ns());
  if (!g_recording.exchange(true)) {
    g_first_sender.store(arrival.sender);
    g_first_time_ns.store(arrival.time_ns);
    g_stop_signal.store(signal);
    write_text("\ntrain_yolo: ");
    write_text(signal_name(signal));
    write_text(" received: stopping after the step under way, then saving (a second request stops at once)\n");
    return;
  }
  int first_signal;
  while ((first_signal = g_stop_signal.load()) == 0) {
  }
  const SignalArrival first{first_signal, g_first_sender.load(), g_first_time_ns.load()};
  if (repeats_request(first, arrival)) {
    write_text("\ntrain_yolo: the same ");
    write_text(signal_name(signal));
    write_text(" again from the same sender: one stop request (saving as asked)\n");
    return;
  }
  stop_at_once(signal);
}

}  // namespace

SignalArrival arrival_of(int signal, const siginfo_t& info, int64_t time_ns) {
  // kill, sigqueue and raise name their sender; the kernel's own signals (a terminal's) do not.
  const bool from_a_process = info.si_code == SI_USER || info.si_code == SI_QUEUE || info.si_code == SI_TKILL;
  return {signal, from_a_process ? info.si_pid : 0, time_ns};
}

bool repeats_request(const SignalArrival& first, const SignalArrival& next) {
  return next.signal == first.signal && first.sender != 0 && next.sender == first.sender &&
         next.time_ns - first.time_ns < kSameRequestWindowNs;
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_sigaction = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGTERM);  // on one thread, the handlers never interrupt each other
  sigaddset(&action.sa_mask, SIGINT);
  action.sa_flags = SA_SIGINFO | SA_RESTART;  // reads and waits in progress go on; the loop looks between steps
  for (int signal : {SIGTERM, SIGINT})
    if (sigaction(signal, &action, nullptr) != 0)
      throw Error(std::string("cannot install the ") + signal_name(signal) + " handler (" + std::strerror(errno) + ")");
}

void remove_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT})
    if (sigaction(signal, &action, nullptr) != 0)
      throw Error(std::string("cannot restore the default ") + signal_name(signal) + " action (" +
                  std::strerror(errno) + ")");
}

int stop_signal() { return g_stop_signal.load(); }

void set_stop_clock(StopClock clock) { g_clock.store(clock); }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace yolo
