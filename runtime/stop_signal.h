// Stopping training cleanly on SIGTERM or SIGINT: what SLURM, Kubernetes and Ctrl-C send before
// they kill a job. The first signal only sets a flag, which the training loop reads between
// steps (it finishes the step under way, saves, prints the --resume command and exits with
// kStoppedExitCode). A second signal stops at once: the default action, so the process dies of
// that signal; the checkpoint on disk is then the previous good one (files are renamed into
// place whole).
#pragma once

namespace yolo {

// The exit status of a run stopped by a signal after saving its checkpoint: 75, sysexits.h's
// EX_TEMPFAIL ("try again later"): not 0, so a scheduler that restarts failed jobs restarts
// it (with --resume), and not 128 + signal, which means killed before saving.
constexpr int kStoppedExitCode = 75;

// Installs the handlers for SIGTERM and SIGINT (the program does, before training), and puts
// the default action back (after it: a Ctrl-C during the evaluation that follows stops at once).
void install_stop_handlers();
void remove_stop_handlers();
// The signal that asked for a stop (SIGTERM, SIGINT), or 0.
int stop_signal();
// As if `signal` had arrived once (tests; 0 clears the request).
void request_stop(int signal);
// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int signal);

}  // namespace yolo
