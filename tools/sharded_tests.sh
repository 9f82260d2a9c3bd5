#!/usr/bin/env bash
# build/tests_emu as SHARDS processes at once (default 2, the CI machine's cores): the emulated
# tests run on one core each, so two shards take about half the time. The test cases, in one
# seeded random order (heavy ones spread over the shards), are split into contiguous ranges
# (doctest's --first/--last); each shard's output is printed whole, in order, then one line
# "tests: N passed, M failed, K skipped" with their sums for tools/run_tests.sh.
# A case that failed in its shard (at most 3 of them) is run once more, alone: one that passes
# then counts as passed and is named on a line "flaky (failed in its shard, passed alone): NAME",
# which tools/run_tests.sh repeats at the end of its output; one that fails again stays failed.
# Arguments: doctest filters (e.g. -tc='*emu:*'), applied to the count and to every shard.
# BUILD (env): the build folder (build); BINARY (env): another doctest binary.
set -u
cd "$(dirname "$0")/.."
bin=${BINARY:-${BUILD:-build}/tests_emu}
shards=${SHARDS:-2}
[[ -x "$bin" ]] || { echo "$bin is not built"; echo "tests: 0 passed, 1 failed, 0 skipped"; exit 1; }
order=(--order-by=rand --rand-seed=20261202)
total=$("$bin" -ltc "${order[@]}" "$@" 2>/dev/null | sed -n 's/.*passing the current filters: \([0-9]*\).*/\1/p')
[[ -n "$total" ]] || { echo "cannot count $bin's test cases"; echo "tests: 0 passed, 1 failed, 0 skipped"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pids=()
for ((k = 0; k < shards; ++k)); do
  first=$((k * total / shards + 1)) last=$(((k + 1) * total / shards))
  "$bin" "${order[@]}" "$@" --first="$first" --last="$last" >"$work/$k.log" 2>&1 &
  pids+=($!)
done
for ((k = 0; k < shards; ++k)); do wait "${pids[$k]}"; done
passed=0 failed=0 skipped=0 died=0
for ((k = 0; k < shards; ++k)); do
  echo "--- shard $((k + 1)) of $shards"
  cat "$work/$k.log"
  line=$(grep -E '^tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$work/$k.log" | tail -n 1)
  if [[ -z "$line" ]]; then
    echo "!!! shard $((k + 1)) died before reporting its results"
    failed=$((failed + 1)) died=1
    continue
  fi
  read -r p f s <<<"$(echo "$line" | sed -E 's/tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')"
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
mapfile -t failed_cases < <(cat "$work"/*.log | sed -n 's/^failed test case: //p')
if ((died == 0 && ${#failed_cases[@]} > 0 && ${#failed_cases[@]} <= 3)); then
  for name in "${failed_cases[@]}"; do
    escaped=${name//\\/\\\\}
    escaped=${escaped//,/\\,}
    echo "--- again, alone: $name"
    "$bin" "$@" -tc="$escaped" >"$work/again.log" 2>&1
    cat "$work/again.log"
    if grep -qE '^tests: [1-9][0-9]* passed, 0 failed, 0 skipped$' "$work/again.log"; then
      echo "flaky (failed in its shard, passed alone): $name"
      passed=$((passed + 1)) failed=$((failed - 1))
    fi
  done
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
