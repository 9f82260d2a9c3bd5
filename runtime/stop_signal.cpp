// SIGTERM/SIGINT handling (see stop_signal.h). The handler does only what is async-signal-safe:
// an atomic store, write(2), and for a second signal sigaction + raise.
#include "runtime/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/check.h"

namespace yolo {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores to it");

void write_text(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_stop_signal(int signal) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, signal)) {
    write_text("\ntrain_yolo: ");
    write_text(signal_name(signal));
    write_text(" received: stopping after the step under way, then saving (a second signal stops at once)\n");
    return;
  }
  // The second one: die of it now, as if no handler had been installed.
  write_text("\ntrain_yolo: a second signal: stopping at once, without saving\n");
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  raise(signal);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and waits in progress go on; the loop looks between steps
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

void request_stop(int signal) { g_stop_signal.store(signal); }

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
