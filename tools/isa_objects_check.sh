#!/usr/bin/env bash
# The AVX micro-kernel objects (kernels/cpu_micro_avx*.cpp, compiled with -mavx2/-mavx512f) must
# define nothing but their one table function: a weak (inline or template) definition there could
# be the copy the linker keeps for every caller, and the program would die of SIGILL on a CPU
# without those instructions. Checks every build of them with nm; one test per object. Prints
# "tests: N passed, M failed, K skipped" for tools/run_tests.sh. BUILD (env): the build folder.
set -u
cd "$(dirname "$0")/.."
build=${BUILD:-build}
passed=0 failed=0 skipped=0
for variant in avx2 avx512; do
  for kind in native emu; do
    object="$build/$kind/kernels/cpu_micro_$variant.cpp.o"
    if [[ ! -f $object ]]; then
      skipped=$((skipped + 1))
      echo "skipped: $object is not built"
      continue
    fi
    # Defined symbols of any kind but local ones (t, b, d, r): W/V weak, u unique, T/D/B global.
    defined=$(nm -C "$object" | awk '$2 ~ /^[TDBRWVu]$/ { $1 = ""; print }' | sed 's/^ *//')
    if [[ "$defined" == "T yolo::cpu_micro::${variant}_tiles()" ]]; then
      passed=$((passed + 1))
      echo "ok: $object defines only ${variant}_tiles()"
    else
      failed=$((failed + 1))
      echo "FAILED: $object defines more than ${variant}_tiles(), which other units could link to:"
      echo "$defined" | sed 's/^/    /' | head -n 20
    fi
  done
done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
