#!/usr/bin/env bash
# make test / CI wrapper for tools/sass_check.sh: the tensor-core kernels' machine code has HMMA
# instructions (the wgmma kernels GMMA in sm_90a code, trap stubs elsewhere) and no local-memory traffic (nor do the small-channel convolutions': their
# receptive field lives in registers), for every architecture the CUDA build targets; and for
# tools/sass_twins_check.sh: batchnorm's and the activations' FP32 and 16-bit instantiations use
# the same FP arithmetic forms (no FMA contracted in one only); and for tools/occupancy_check.sh:
# the tensor-core kernels (mma.sync and wgmma) get exactly the blocks per SM the planner assumes,
# and the one that reallocates registers between warpgroups (setmaxnreg) balances them; and the
# trainer embeds the code `train_yolo --list-devices` says it was built for (runtime/gpu_code.h:
# each ARCH's SASS and compute_80's PTX, which GPUs newer than the build run). Prints
# the runner's "tests: N passed, M failed, K skipped" line; skipped in CPU-only builds.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
if ! grep -q -- '-DYOLO_CUDA=1' "$build/flags.native" 2>/dev/null; then
  echo "sass check: skipped (CPU-only build: no nvcc objects to inspect)"
  echo "tests: 0 passed, 0 failed, 4 skipped"
  exit 0
fi
archs=$(grep -oE 'code=sm_[0-9]+a?' "$build/flags.native" | sort -u | sed 's/code=sm_//' | tr '\n' ' ')
passed=0 failed=0
if tools/sass_check.sh --arch "$archs" "$build/native/kernels/conv_tc.cu.o" "$build/native/kernels/gemm_tc.cu.o" \
  "$build/native/kernels/conv_small_c.cu.o" "$build/native/kernels/gemm_wgmma.cu.o" "$build/native/kernels/conv_wgmma.cu.o" \
  "$build/native/kernels/conv_wgmma_data.cu.o" "$build/native/kernels/conv_wgmma_weights.cu.o" \
  "$build/native/tests/wgmma_test_kernels.cu.o"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
if tools/sass_twins_check.sh --arch "$archs" "$build/native/kernels/batchnorm.cu.o" \
  "$build/native/kernels/activation.cu.o"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
if tools/occupancy_check.sh "$build/native/kernels/conv_tc.cu.o" "$build/native/kernels/gemm_tc.cu.o" \
  "$build/native/kernels/gemm_wgmma.cu.o" "$build/native/kernels/conv_wgmma.cu.o" \
  "$build/native/kernels/conv_wgmma_data.cu.o" "$build/native/kernels/conv_wgmma_weights.cu.o"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
fi
# The trainer's embedded code, as cuobjdump lists it, against its own "Built for:" line.
skipped=0
trainer=${TRAINER:-./train_yolo}
if [[ ! -x $trainer || $trainer -ot "$build/flags.native" ]]; then
  echo "embedded code: skipped ($trainer is not built with these flags; make builds it)"
  skipped=1
else
  cuobjdump=$(tools/ensure_sass_tools.sh)/cuobjdump
  listed() { "$cuobjdump" "$1" "$trainer" 2>/dev/null | grep -oE 'sm_[0-9]+a?' | sort -u | tr '\n' ' '; }
  found=$(listed --list-elf | sed 's/ $//')
  ptx=$(listed --list-ptx | sed 's/sm_/compute_/; s/ $//')
  [[ -n $ptx ]] && found+=" + $ptx PTX"
  said=$("$trainer" --list-devices | sed -n 's/^Built for: //p')
  if [[ -n $said && $found == "$said" ]]; then
    echo "embedded code: $found, as $trainer --list-devices says"
    passed=$((passed + 1))
  else
    echo "FAILED embedded code: cuobjdump finds '$found' in $trainer, which says it was built for '$said'"
    failed=$((failed + 1))
  fi
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
