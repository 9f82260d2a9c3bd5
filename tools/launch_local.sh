#!/usr/bin/env bash
# A minimal local launcher, for trying the multi-process path on one machine without mpirun or
# torchrun: starts N copies of a command with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
# MASTER_PORT set (torchrun's variables), each one's output in PREFIX.rankR.log, and exits
# non-zero when any rank does (printing each rank's last line).
#   tools/launch_local.sh -n 2 [-p PREFIX] [--port P] [--kill-rank R --kill-after S] -- ./train_yolo ...
# --kill-rank/--kill-after: SIGKILL rank R after S seconds (to see the others stop, naming it).
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
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" >"$prefix.rank$r.log" 2>&1 &
  pids+=($!)
done
if ((kill_rank >= 0 && kill_rank < n)); then
  (sleep "$kill_after" && kill -9 "${pids[$kill_rank]}" 2>/dev/null) &
fi
failed=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  status=$?
  ((status != 0)) && failed=1
  echo "rank $r: exit $status: $(tail -n 1 "$prefix.rank$r.log")"
done
exit $failed
