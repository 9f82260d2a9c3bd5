// Stopping training cleanly on SIGTERM or SIGINT: what SLURM, Kubernetes and Ctrl-C send before
// they kill a job. The first signal only sets a flag, which the training loop reads between
// steps (it finishes the step under way, saves, prints the --resume command and exits with
// kStoppedExitCode).
//
// One request, one stop. A request can arrive as two signals: GNU `timeout` (like anything that
// signals a job and then the job's process group) sends SIGTERM to the process and then to its
// group, from the same process, microseconds apart. So a signal that repeats the request under
// way is only noted: the same signal, sent by the same process (si_pid, from kill, sigqueue or
// raise), within kSameRequestWindowNs of the first. Anything else is a second request and stops
// at once, by the default action, so the process dies of that signal and the checkpoint on disk
// is the previous good one (files are renamed into place whole): a second Ctrl-C (the terminal's
// signals come from the kernel, with no sending process), SIGINT after SIGTERM, another process's
// signal, or the same sender's a second or more later.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>

namespace yolo {

// The exit status of a run stopped by a signal after saving its checkpoint: 75, sysexits.h's
// EX_TEMPFAIL ("try again later"): not 0, so a scheduler that restarts failed jobs restarts
// it (with --resume), and not 128 + signal, which means killed before saving.
constexpr int kStoppedExitCode = 75;

// How long after the first signal the same sender's same signal is still the same request.
constexpr int64_t kSameRequestWindowNs = 1'000'000'000;

// A stop signal's arrival, as the rule above sees it.
struct SignalArrival {
  int signal = 0;
  pid_t sender = 0;  // the sending process; 0 when the kernel sent it (a terminal's Ctrl-C)
  int64_t time_ns = 0;
};
SignalArrival arrival_of(int signal, const siginfo_t& info, int64_t time_ns);
// Whether `next` repeats the request `first` made (see the top of this file).
bool repeats_request(const SignalArrival& first, const SignalArrival& next);

// Installs the handlers for SIGTERM and SIGINT (the program does, before training), and puts
// the default action back (after it: a Ctrl-C during the evaluation that follows stops at once).
void install_stop_handlers();
void remove_stop_handlers();
// The signal that asked for a stop (SIGTERM, SIGINT), or 0.
int stop_signal();
// The clock the handler stamps arrivals with, in nanoseconds (tests; nullptr: CLOCK_MONOTONIC).
using StopClock = int64_t (*)();
void set_stop_clock(StopClock clock);
// "SIGTERM", "SIGINT", "SIGHUP", or "a signal".
const char* signal_name(int signal);

}  // namespace yolo
