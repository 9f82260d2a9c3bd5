#!/usr/bin/env bash
# make test: the Makefile's default ARCH follows the GPUs present (tools/gpu_arch.sh, from
# nvidia-smi's compute capabilities) and the nvcc targets follow ARCH: each ARCH's SASS, and
# compute_80's PTX wherever sm_80 is built. nvidia-smi is faked on PATH (what it prints, or a
# failure); `make -n` shows the flags without building. Prints "tests: N passed, M failed, 0 skipped".
set -u
cd "$(dirname "$0")/.."
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
passed=0 failed=0

# name, what the fake nvidia-smi prints ("fail": exits 9), the ARCH expected, the gencodes expected
check() {
  local name=$1 smi=$2 want_arch=$3 want_codes=$4
  if [[ $smi == fail ]]; then printf '#!/bin/sh\nexit 9\n' >"$fake/nvidia-smi"
  else printf '#!/bin/sh\nprintf "%s\\n"\n' "$smi" >"$fake/nvidia-smi"; fi
  chmod +x "$fake/nvidia-smi"
  local arch codes
  arch=$(PATH="$fake:$PATH" tools/gpu_arch.sh)
  codes=$(PATH="$fake:$PATH" make -s -n CUDA=1 NVCC=nvcc BUILD="$fake/build" "$fake/build/native/kernels/gemm.cu.o" 2>/dev/null |
    grep -E '^nvcc .* -c ' | grep -oE 'code=(sm|compute)_[0-9]+a?' | sed 's/code=//' | tr '\n' ' ' | sed 's/ $//')
  if [[ $arch == "$want_arch" && $codes == "$want_codes" ]]; then
    passed=$((passed + 1))
    echo "ok: $name: ARCH $arch, $codes"
  else
    failed=$((failed + 1))
    echo "FAILED $name: ARCH '$arch' (want '$want_arch'), nvcc targets '$codes' (want '$want_codes')"
  fi
}

check "no GPU (nvidia-smi fails)" fail "75 80 90" "sm_75 sm_80 sm_90a compute_80"
check "an H100" "9.0" "90" "sm_90a"
check "a T4" "7.5" "75" "sm_75"
check "an RTX 3090 and an L4" '8.6\\n8.9' "80" "sm_80 compute_80"
check "a B200 (its PTX)" "10.0" "80" "sm_80 compute_80"
check "an RTX 5090 beside an H200" '12.0\\n9.0' "80 90" "sm_80 sm_90a compute_80"
echo "tests: $passed passed, $failed failed, 0 skipped"
