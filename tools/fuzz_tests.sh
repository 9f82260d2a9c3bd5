#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz/ (docs/testing.md, "Fuzzing").
#   tools/fuzz_tests.sh              CI's bounded run: each target replays its committed corpus
#                                    (tests/fuzz/corpus/NAME, crash regressions included), then
#                                    runs a fixed number of seeded mutations on a copy of it; one
#                                    test per target. Prints "tests: N passed, M failed, K skipped".
#   tools/fuzz_tests.sh --seconds N  `make fuzz`: each target N seconds on a corpus kept under
#                                    BUILD/fuzz/work/NAME; new crashes in BUILD/fuzz/crashes/NAME/.
# BUILD (env): the build folder (build). TARGETS (env): a subset, e.g. TARGETS="cfg image".
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD:-build}
[[ $build = /* ]] || build=$root/$build
seconds=
if [[ ${1:-} == --seconds ]]; then
  seconds=${2:?--seconds needs a number}
fi

# name, -max_len, dictionary (or -), runs in CI's bounded run (7-9 s each on a 2-core EPYC: about 70 s in all).
targets=(
  "cfg        4096 cfg.dict  110000"
  "labels     1024 -         200000"
  "darknet    512  -         30000"
  "voc        2048 xml.dict  300000"
  "coco       2048 json.dict 180000"
  "image      4096 -         100000"
  "weights    2048 -         200000"
  "checkpoint 1024 -         250000"
)

passed=0 failed=0 skipped=0
# The targets can be built where clang and its libFuzzer runtime are (tests/fuzz/fuzz.mk's test).
can_build() {
  local cxx
  if [[ -n ${FUZZ_CXX:-} ]]; then cxx=$(command -v "$FUZZ_CXX" || true)
  else cxx=$(command -v clang++-14 || command -v clang++ || true); fi
  [[ -n $cxx && -f $("$cxx" -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a ]]
}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Prints "exec/s, cov, ft, corpus" from a libFuzzer log.
figures() {
  local execs done_line
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$1" | tail -n 1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|INITED|NEW|REDUCE|pulse)' "$1" | tail -n 1)
  echo "exec/s ${execs:-?}, $(echo "$done_line" | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' || echo 'no coverage line')"
}

# One target: its run, then its verdict line in $scratch/NAME.result ("ok ...", "FAIL ...",
# "SKIP ...") followed, on failure, by the log's tail.
run_target() {
  local name=$1 max_len=$2 dict=$3 runs=$4
  local binary=$build/fuzz/fuzz_$name result=$scratch/$name.result
  if [[ ! -x $binary ]]; then
    if ! can_build; then
      echo "SKIP fuzz_$name: no clang++ with libFuzzer here (tools/ensure_deps.sh installs clang where it can)" >"$result"
    else
      echo "FAIL fuzz_$name: $binary is not built (make $binary)" >"$result"
    fi
    return
  fi
  local work=$scratch/$name corpus crashes
  mkdir -p "$work/run"
  local args=(-rss_limit_mb=2048 -timeout=10 -max_len="$max_len" -detect_leaks=1 -print_final_stats=1)
  [[ $dict != - ]] && args+=(-dict="$root/tests/fuzz/$dict")
  if [[ -n $seconds ]]; then
    corpus=$build/fuzz/work/$name crashes=$build/fuzz/crashes/$name
    mkdir -p "$corpus" "$crashes"
    cp -n "$root/tests/fuzz/corpus/$name"/* "$corpus"/ 2>/dev/null
    args+=(-max_total_time="$seconds" -artifact_prefix="$crashes/")
  else
    corpus=$work/corpus
    cp -r "$root/tests/fuzz/corpus/$name" "$corpus"
    args+=(-seed=1 -runs="$runs" -artifact_prefix="$work/")
  fi
  local log=$work/log start=$SECONDS status
  # From an empty folder, with TMPDIR inside it: whatever the input names is found there.
  (cd "$work/run" && TMPDIR="$work/run" "$binary" "${args[@]}" "$corpus" >"$log" 2>&1)
  status=$?
  if [[ $status -eq 0 ]]; then
    echo "ok   fuzz_$name ($((SECONDS - start)) s): $(figures "$log")" >"$result"
  else
    {
      echo "FAIL fuzz_$name (exit $status, $((SECONDS - start)) s): $(figures "$log")"
      tail -n 60 "$log"
      [[ -n $seconds ]] && echo "the input is in $crashes/; commit it as tests/fuzz/corpus/$name/crash-NAME once fixed"
    } >"$result"
  fi
}

# Two targets at a time (each runs on one core), verdicts printed in the table's order.
jobs_at_once=${FUZZ_JOBS:-2}
names=()
for entry in "${targets[@]}"; do
  read -r name max_len dict runs <<<"$entry"
  if [[ -n ${TARGETS:-} && " $TARGETS " != *" $name "* ]]; then continue; fi
  while (($(jobs -rp | wc -l) >= jobs_at_once)); do wait -n; done
  run_target "$name" "$max_len" "$dict" "$runs" &
  names+=("$name")
done
wait
for name in "${names[@]}"; do
  result=$scratch/$name.result
  [[ -f $result ]] || echo "FAIL fuzz_$name: no verdict (the runner died)" >"$result"
  cat "$result"
  case $(head -c 4 "$result") in
    "ok  ") passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
