#!/usr/bin/env bash
# Runs each test binary given, adds up their "tests: N passed, M failed, K skipped" lines and
# prints the total last, as CI reads it. A binary that dies without its line counts as a failure.
# Each section's wall time is printed after it, and all of them together before the total, so a
# slow CI run says where its time went. What failed (doctest's "failed test case:" lines, a
# script's "FAILED" lines, "!!!" lines) and what was flaky is repeated just before the total, so
# the end of a long log names it.
set -uo pipefail
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
passed=0 failed=0 skipped=0
timings=""
notes=""
for binary in "$@"; do
  echo "=== $binary"
  section_start=$SECONDS
  log=$(mktemp)
  "$binary" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  line=$(grep -E '^tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
  notes+=$(grep -E '^(failed test case: |flaky |FAILED|!!! )' "$log" | sed "s|^|  $binary: |")
  [[ -n $notes && ${notes: -1} != $'\n' ]] && notes+=$'\n'
  rm -f "$log"
  timings+=$(printf '%6d s  %s' $((SECONDS - section_start)) "$binary")$'\n'
  echo "=== $binary: $((SECONDS - section_start)) s"
  if [[ -z "$line" ]]; then
    echo "!!! $binary exited with status $status before reporting its results"
    notes+="  $binary: exited with status $status before reporting its results"$'\n'
    failed=$((failed + 1))
    continue
  fi
  read -r p f s <<<"$(echo "$line" | sed -E 's/tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped/\1 \2 \3/')"
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  if [[ $status -ne 0 && $f -eq 0 ]]; then
    echo "!!! $binary exited with status $status"
    notes+="  $binary: exited with status $status"$'\n'
    failed=$((failed + 1))
  fi
done
[[ -n $notes ]] && printf 'failures and flaky tests:\n%s' "$notes"
printf 'section times:\n%s' "$timings"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
