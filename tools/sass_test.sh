#!/usr/bin/env bash
# make test / CI wrapper for tools/sass_check.sh: the tensor-core kernels' machine code has HMMA
# instructions (the wgmma kernels GMMA in sm_90a code, trap stubs elsewhere) and no local-memory traffic (nor do the small-channel convolutions': their
# receptive field lives in registers), for every architecture the CUDA build targets; and for
# tools/sass_twins_check.sh: batchnorm's and the activations' FP32 and 16-bit instantiations use
# the same FP arithmetic forms (no FMA contracted in one only); and for tools/occupancy_check.sh:
# the tensor-core kernels (mma.sync and wgmma) get exactly the blocks per SM the planner assumes,
# and the one that reallocates registers between warpgroups (setmaxnreg) balances them. Prints
# the runner's "tests: N passed, M failed, K skipped" line; skipped in CPU-only builds.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
if ! grep -q -- '-DYOLO_CUDA=1' "$build/flags" 2>/dev/null; then
  echo "sass check: skipped (CPU-only build: no nvcc objects to inspect)"
  echo "tests: 0 passed, 0 failed, 3 skipped"
  exit 0
fi
archs=$(grep -oE 'code=sm_[0-9]+a?' "$build/flags" | sort -u | sed 's/code=sm_//' | tr '\n' ' ')
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
echo "tests: $passed passed, $failed failed, 0 skipped"
