#!/usr/bin/env bash
# Nothing lost by default, end to end with the real trainer (./train_yolo on the CPU):
#   1. a run given no checkpoint flag but a short --checkpoint-minutes (the default's mechanism,
#      10 minutes shortened to 0.6 s), killed with SIGKILL after it, resumes from the checkpoint it
#      wrote by itself and ends on the uninterrupted run's bits;
#   2. SIGKILL inside each step of a save (YOLO_TEST_SAVE_PAUSE_MS announces and holds each): the
#      data half written, before its flush, between the renames, after them; each time --resume
#      continues from what was left and ends on the uninterrupted bits;
#   3. two ranks through tools/launch_local.sh, rank 1 killed: rank 0 saves the last step both
#      completed, says so and prints the command that continues; one process resumes from it.
# Prints "tests: N passed, M failed, 0 skipped" for tools/run_tests.sh. TRAINER (env): the binary.
set -u
cd "$(dirname "$0")/.."
bin="$(pwd)/${TRAINER:-train_yolo}"
launcher="$(pwd)/tools/launch_local.sh"
models="$(pwd)/models"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

ok() {
  passed=$((passed + 1))
  echo "ok: $1"
}
not_ok() {
  failed=$((failed + 1))
  echo "FAILED: $1"
  shift
  for log in "$@"; do sed 's/^/    /' "$log" | tail -n 15; done
}

if [[ ! -x "$bin" ]]; then
  echo "FAILED: $bin is not built"
  echo "tests: 0 passed, 1 failed, 0 skipped"
  exit 1
fi
(cd "$work" && "$bin" synth set --train 16 --valid 2 --image-size 96x72 --png >/dev/null) || {
  echo "FAILED: synth"
  echo "tests: 0 passed, 1 failed, 0 skipped"
  exit 1
}
args=(--devices cpu --threads 1 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 250 --size 64 --batch 4)
(cd "$work" && "$bin" "${args[@]}" --checkpoint-every 0 --out straight >straight.log 2>&1) ||
  not_ok "the uninterrupted run" "$work/straight.log"

# Waits (at most 120 s) until `file` exists; then true.
wait_for_file() {
  for _ in $(seq 1 1200); do
    [[ -e $1 ]] && return 0
    sleep 0.1
  done
  return 1
}

# Resumes run folder $1 with the printed command's flags and compares its weights with the
# uninterrupted run's; $2: the check's name.
resume_and_compare() {
  local out=$1 name=$2
  if (cd "$work" && "$bin" "${args[@]}" --checkpoint-every 0 --out "$out" --resume >"$out.resume.log" 2>&1) &&
    cmp -s "$work/$out/last.weights" "$work/straight/last.weights"; then
    ok "$name: $(grep -o 'resuming [^ ]* at step [0-9]*' "$work/$out.resume.log")"
  else
    not_ok "$name (the resumed run failed or its weights differ from the uninterrupted run's)" "$work/$out.log" \
      "$work/$out.resume.log"
  fi
}

# 1. The time interval's own checkpoint.
(cd "$work" && exec "$bin" "${args[@]}" --max-batches 100000 --checkpoint-minutes 0.01 --out timed >timed.log 2>&1) &
pid=$!
if wait_for_file "$work/timed/last.ckpt"; then
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if grep -q "checkpoints: every 0.01 min and at the end" "$work/timed.log"; then
    resume_and_compare timed "killed after the interval: resumed from the checkpoint it wrote by itself"
  else
    not_ok "the checkpoint policy line" "$work/timed.log"
  fi
else
  kill -9 "$pid" 2>/dev/null
  not_ok "no last.ckpt appeared within 120 s" "$work/timed.log"
fi

# 2. SIGKILL inside each step of the third save's checkpoint (each step announced on stderr and
# held 150 ms by YOLO_TEST_SAVE_PAUSE_MS): its data half written, before its flush, between the
# renames, after them, before the folder's flush.
points=("write [^ ]*/last.ckpt" "fsync [^ ]*/last.ckpt" "rename [^ ]*/last.ckpt [^ ]*/prev.ckpt"
  "rename [^ ]*/last.ckpt.tmp.[0-9]* [^ ]*/last.ckpt$" "fsync-dir")
counts=(3 3 2 3 6)  # the third save's (the first has no last.ckpt to keep; two folder flushes a save)
for k in "${!points[@]}"; do
  out=killed$k
  (cd "$work" && YOLO_TEST_SAVE_PAUSE_MS=150 exec "$bin" "${args[@]}" --checkpoint-every 1 --out "$out" \
    >"$out.log" 2>&1) &
  pid=$!
  for _ in $(seq 1 3000); do
    (($(grep -c "save step: ${points[$k]}" "$work/$out.log" 2>/dev/null) >= counts[k])) && break
    sleep 0.02
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  left=$(cd "$work/$out" && ls | grep -v '^results.csv$\|^chart.png$\|^model.cfg$' | tr '\n' ' ')
  resume_and_compare "$out" "SIGKILL at '$(tail -n 1 "$work/$out.log" | sed 's/.*save step: //; s|/[^ ]*/||g')' (left: $left)"
done

# 3. A lost rank: the survivor saves; one process continues.
(cd "$work" && "$launcher" -n 2 -p ll --kill-rank 1 --kill-after 6 -- "$bin" "${args[@]}" --max-batches 100000 \
  --checkpoint-every 0 --comm-timeout 10 --out lost >ll.log 2>&1)
status=$?
if [[ $status -eq 1 ]] && grep -q "rank 0 saved the state after step [0-9]*, the last step every replica completed" \
  "$work/ll.rank0.log" && grep -q "to continue, on this or another number of replicas: .* --resume" \
  "$work/ll.rank0.log"; then
  step=$(grep -o "saved the state after step [0-9]*" "$work/ll.rank0.log" | grep -o '[0-9]*$')
  if (cd "$work" && "$bin" "${args[@]}" --max-batches $((step + 2)) --out lost --resume >lost.resume.log 2>&1) &&
    grep -q "resuming lost/last.ckpt at step $step" "$work/lost.resume.log"; then
    ok "a lost rank: rank 0 saved step $step without being asked; one process resumed it"
  else
    not_ok "resuming the survivor's checkpoint on one process" "$work/lost.resume.log"
  fi
else
  not_ok "a lost rank (launcher exit $status, wanted 1 and rank 0's save)" "$work/ll.log" "$work/ll.rank0.log"
fi

echo "tests: $passed passed, $failed failed, 0 skipped"
[[ $failed -eq 0 ]]
