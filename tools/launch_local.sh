#!/usr/bin/env bash
# A minimal local launcher, for trying the multi-process path on one machine without mpirun or
# torchrun: starts N copies of a command with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
# MASTER_PORT set (torchrun's variables), each one's output in PREFIX.rankR.log, and exits
# non-zero when any rank does (printing each rank's last line): 75 when every rank that did not
# finish was stopped by a signal after saving (train_yolo's kStoppedExitCode), else 1.
#   tools/launch_local.sh -n 2 [-p PREFIX] [--port P] [--kill-rank R --kill-after S] -- ./train_yolo ...
# --kill-rank/--kill-after: SIGKILL rank R after S seconds (to see the others stop, naming it).
# SIGTERM and SIGINT sent to the launcher go on to every rank. Each rank runs in a process group
# of its own (setsid), so a signal to the launcher's group (GNU timeout's second one, a terminal's
# Ctrl-C) reaches a rank once, through the launcher, and the ranks see one sender.
set -u
n=2 prefix=launch port=$((29500 + RANDOM % 2000)) kill_rank=-1 kill_after=0
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    -n) n=$2; shift 2 ;;
    -p) prefix=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --kill-rank) kill_rank=$2; shift 2 ;;
    --kill-after) kill_after=$2; shift 2 ;;
    *) echo "launch_local: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
[[ $# -gt 1 && $1 == -- ]] || { echo "usage: tools/launch_local.sh -n N [-p PREFIX] -- command..." >&2; exit 2; }
shift
pids=()
interrupted=0
# Passes a stop request on to every rank (the ranks' stop rule: runtime/stop_signal.h).
forward() {
  interrupted=1
  kill -s "$1" "${pids[@]}" 2>/dev/null
}
trap 'forward TERM' TERM
trap 'forward INT' INT
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port setsid "$@" >"$prefix.rank$r.log" 2>&1 &
  pids+=($!)
done
if ((kill_rank >= 0 && kill_rank < n)); then
  (sleep "$kill_after" && kill -9 "${pids[$kill_rank]}" 2>/dev/null) &
fi
# A rank's exit status; a trapped signal ends `wait` early, so it waits again after one.
wait_rank() {
  local status
  while :; do
    interrupted=0
    wait "$1"
    status=$?
    ((interrupted)) || return "$status"
  done
}
result=0
for ((r = 0; r < n; r++)); do
  wait_rank "${pids[$r]}"
  status=$?
  if ((status == 75 && result != 1)); then result=75; elif ((status != 0)); then result=1; fi
  echo "rank $r: exit $status: $(tail -n 1 "$prefix.rank$r.log")"
done
exit $result
