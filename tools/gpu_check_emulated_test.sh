#!/usr/bin/env bash
# tools/gpu_check.sh's verdict (issue 50) end to end on the emulated build (GPU_CHECK_EMULATED=1:
# build/train_yolo_emu on emu:0, build/tests_emu, tiny shapes), three runs:
#   1. the whole verdict within a budget: verdict.json parses, every step of the script's header
#      appears with its status (what only hardware has: "unavailable"), our rows have figures, the
#      table is printed, and the conv verdict is read from bench_kernels' line (a stand-in that
#      prints one: cuBLAS is hardware only);
#   2. the deadline: a budget of 13 s, a test binary that fails (planted: FAILED in the json) and
#      a trainer that hangs ignoring SIGTERM: the hung step is cut by what the budget left, every
#      later step is "skipped (budget spent)", and the summary is out within the budget + 2 s;
#   3. a SIGTERM to gpu_check.sh mid-step: the step is stopped and recorded "interrupted", and
#      verdict.json and the table are still written.
# What it cannot check: the figures themselves (emulated rates), compute-sanitizer, cuBLAS, the
# PyTorch peer on a GPU, NCCL. Prints "tests: N passed, M failed, 0 skipped" for tools/run_tests.sh.
# BUILD (env): the build folder (build).
set -u
cd "$(dirname "$0")/.." || exit 1
build=${BUILD:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

pass() { passed=$((passed + 1)); echo "ok: $1"; }
fail() { failed=$((failed + 1)); echo "FAILED: $1"; }
expect() {  # description, command... (passes when the command succeeds)
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

if [[ ! -x $build/train_yolo_emu || ! -x $build/tests_emu ]]; then
  echo "FAILED: $build/train_yolo_emu and $build/tests_emu are not built"
  echo "tests: 0 passed, 1 failed, 0 skipped"
  exit 1
fi

# verdict.json's steps and targets as tab-separated lines (name, status, seconds, figure; name,
# figure, target, verdict); non-zero when it does not parse. jq where there is one, else python3.
steps_tsv() {  # verdict.json
  if command -v jq >/dev/null; then
    jq -er '.steps[] | [.name, .status, (.seconds | tostring), .figure] | @tsv' "$1"
  else
    python3 -c 'import json, sys
for s in json.load(open(sys.argv[1]))["steps"]:
    print("\t".join(str(s[k]) for k in ("name", "status", "seconds", "figure")))' "$1"
  fi
}
targets_tsv() {  # verdict.json
  if command -v jq >/dev/null; then
    jq -er '.targets[] | [.name, .figure, .target, .verdict] | @tsv' "$1"
  else
    python3 -c 'import json, sys
for t in json.load(open(sys.argv[1]))["targets"]:
    print("\t".join(t[k] for k in ("name", "figure", "target", "verdict")))' "$1"
  fi
}
finished() {  # verdict.json: written by the run's end, not only after a step
  if command -v jq >/dev/null; then jq -e '.finished == true' "$1" >/dev/null
  else python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["finished"] else 1)' "$1"; fi
}
status_of() { awk -F'\t' -v n="$2" '$1 == n { print $2; exit }' "$1"; }  # steps.tsv, step name
figure_of() { awk -F'\t' -v n="$2" '$1 == n { print $4; exit }' "$1"; }
# The step names of the script's header ("#   verdict N  NAME  S s"), in order.
plan_names() { sed -nE 's/^#   verdict [0-9]+ +(.*[^ ]) {2,}[0-9]+ s.*/\1/p' tools/gpu_check.sh; }

# Stand-ins: bench_kernels printing a verdict line; a test binary that fails; a trainer that hangs
# in training, ignoring SIGTERM (the real one lists the devices and writes the dataset).
cat >"$work/bench" <<'EOF'
#!/usr/bin/env bash
echo "conv_tc bf16 against cuBLAS: 60 of 60 rows; worst 1.20 (conv bwd data bf16 52x52 256->512 3x3 s2; target <= 1.25, ok); median 1.05 (target <= 1.10, ok); sum 1.10 (target <= 1.15, ok): targets met"
EOF
cat >"$work/failing_tests" <<'EOF'
#!/usr/bin/env bash
echo "failed test case: planted"
echo "tests: 0 passed, 1 failed, 0 skipped"
exit 1
EOF
cat >"$work/hanging_train" <<EOF
#!/usr/bin/env bash
case " \$* " in *" --list-devices "*|*" synth "*) exec "$PWD/$build/train_yolo_emu" "\$@" ;; esac
trap '' TERM
exec sleep 600
EOF
chmod +x "$work/bench" "$work/failing_tests" "$work/hanging_train"
verdict() {  # out folder, then VAR=value... for its environment
  local out=$1
  shift
  env GPU_CHECK_EMULATED=1 GPU_CHECK_TRAIN="$build/train_yolo_emu" GPU_CHECK_TESTS="$build/tests_emu" "$@" \
    tools/gpu_check.sh "$out" verdict >"$out.txt" 2>&1
}

# 1. The whole verdict.
start=$SECONDS
verdict "$work/full" VERDICT_BUDGET=90 GPU_CHECK_BENCH="$work/bench"
status=$? took=$((SECONDS - start))
expect "the verdict exits 0 within its budget (${took} s of 90)" test $status -eq 0 -a $took -le 90
if steps_tsv "$work/full/verdict.json" >"$work/full.tsv" && targets_tsv "$work/full/verdict.json" >"$work/full_targets.tsv"
then pass "verdict.json parses ($(wc -l <"$work/full.tsv") steps)"
else fail "verdict.json does not parse: $(head -c 300 "$work/full/verdict.json" 2>&1)"; fi
expect "verdict.json says the run finished" finished "$work/full/verdict.json"
missing="" plan=0
while IFS= read -r name; do
  plan=$((plan + 1))
  [[ -n $(status_of "$work/full.tsv" "$name") ]] || missing+="'$name' "
done < <(plan_names)
expect "each of the header's $plan steps has a status${missing:+ (missing: $missing)}" test -z "$missing" -a $plan -ge 15
unexpected=""
while IFS=$'\t' read -r name want; do
  got=$(status_of "$work/full.tsv" "$name")
  [[ $got =~ ^($want)$ ]] || unexpected+="'$name': $got (wanted $want); "
done <<'EOF'
dataset (synthetic shapes)	ok
list devices	ok
wgmma self-check, tf32 probe	ok
GPU-path tests (native)	ok
wgmma under racecheck	unavailable
wgmma under synccheck	unavailable
ours default	ok
ours YOLO_WGMMA=off	ok
ours YOLO_WGMMA_PERSISTENT=off	ok
ours --no-load-fold	ok
peer eager	unavailable|ok
peer torch.compile	unavailable|ok
2 ranks, overlapped	ok
2 ranks, --no-overlap	ok
conv_tc vs cuBLAS	ok
ours 3-class cfg	ok
lost rank saves	unavailable
EOF
expect "each step's status as the emulated build has it${unexpected:+: $unexpected}" test -z "$unexpected"
expect "our rows have their images/s: '$(figure_of "$work/full.tsv" "ours default")'" \
  grep -qE $'^ours (default|YOLO_WGMMA=off|3-class cfg)\tok\t[0-9]+\t[0-9.]+ img/s' "$work/full.tsv"
expect "the two-rank rows have their exposed communication" \
  grep -qE $'^2 ranks, --no-overlap\tok\t[0-9]+\t[0-9.]+ img/s, exposed comm [0-9.]+ ms a step; overlapped' "$work/full.tsv"
expect "the 650 img/s target is judged (not met, emulated)" grep -qE $'\t[0-9.]+ img/s\t>= 650 img/s\tnot met$' \
  "$work/full_targets.tsv"
expect "the conv verdict read from bench_kernels' line (met)" \
  grep -qE $'^conv_tc bf16 vs cuBLAS\tworst 1.20, median 1.05, sum 1.10 \\(60/60 rows\\)\t.*\tmet$' "$work/full_targets.tsv"
expect "the table is printed: every step and the three targets" bash -c "grep -q '^p  *step  *status' '$work/full.txt' &&
  grep -q 'ours 3-class cfg' '$work/full.txt' && grep -q '^target ' '$work/full.txt' &&
  grep -q '^ours vs 1.5x the compiled peer ' '$work/full.txt' && grep -q '^conv_tc bf16 vs cuBLAS ' '$work/full.txt'"

# 2. The deadline, a planted failure and a hung step.
start=$SECONDS
verdict "$work/short" VERDICT_BUDGET=13 VERDICT_RESERVE=2 GPU_CHECK_TESTS="$work/failing_tests" \
  GPU_CHECK_TRAIN="$work/hanging_train"
took=$((SECONDS - start))
expect "with a hung step the summary is out within the budget + 2 s (${took} s of 13)" test $took -le 15
if steps_tsv "$work/short/verdict.json" >"$work/short.tsv"; then pass "verdict.json parses after the deadline"
else fail "verdict.json does not parse after the deadline"; fi
expect "the failing test binary is FAILED in verdict.json ($(status_of "$work/short.tsv" "GPU-path tests (native)"))" \
  test "$(status_of "$work/short.tsv" "GPU-path tests (native)")" = "FAILED(1)"
expect "the hung trainer is cut by the budget: $(status_of "$work/short.tsv" "ours default")" \
  test "$(status_of "$work/short.tsv" "ours default")" = "TIMEOUT"
late=$(awk -F'\t' '$1 == "ours default" { after = 1; next }
  after && $2 != "skipped (budget spent)" && $2 != "unavailable" { print $1 ": " $2 }' "$work/short.tsv")
skipped=$(grep -c $'\tskipped (budget spent)\t' "$work/short.tsv")
expect "every later step is skipped (budget spent) ($skipped)${late:+; not: $late}" test -z "$late" -a "$skipped" -ge 6
expect "the table is printed after the deadline" grep -q '^conv_tc bf16 vs cuBLAS ' "$work/short.txt"

# 3. SIGTERM mid-step (what a device run's own deadline sends).
env GPU_CHECK_EMULATED=1 GPU_CHECK_TESTS="$build/tests_emu" GPU_CHECK_TRAIN="$work/hanging_train" VERDICT_BUDGET=60 \
  tools/gpu_check.sh "$work/term" verdict >"$work/term.txt" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [[ -f $work/term/ours_default.log ]] && break; sleep 0.1; done
start=$SECONDS
kill -TERM "$pid"
wait "$pid"
status=$? took=$((SECONDS - start))
expect "SIGTERM: gpu_check.sh ends within 5 s (${took} s), exit 143 ($status)" test $took -le 5 -a $status -eq 143
steps_tsv "$work/term/verdict.json" >"$work/term.tsv" 2>/dev/null
expect "SIGTERM: the step under way is recorded interrupted ($(status_of "$work/term.tsv" "ours default"))" \
  test "$(status_of "$work/term.tsv" "ours default")" = "interrupted"
expect "SIGTERM: verdict.json finished and the table printed" bash -c "
  $(declare -f finished); finished '$work/term/verdict.json' && grep -q '^target ' '$work/term.txt'"

echo "tests: $passed passed, $failed failed, 0 skipped"
[[ $failed -eq 0 ]]
