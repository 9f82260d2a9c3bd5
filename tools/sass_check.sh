#!/usr/bin/env bash
# Checks the machine code of the tensor-core kernels: for each object and architecture, every
# function whose demangled name matches the pattern must contain HMMA (mma.sync) instructions,
# every function matching the wgmma pattern must contain GMMA (wgmma) instructions in sm_90a code
# and be a refusal stub (BPT.TRAP) in every other, and no function in the objects may touch
# local memory (LDL/STL: register spills or arrays the compiler could not keep in registers).
# One line per function and architecture, then a verdict; exit status 0 when everything passes,
# 1 when something fails, 2 for a usage or tool error.
#
#   tools/sass_check.sh [--pattern REGEX] [--wgmma-pattern REGEX] [--arch "75 80 90a"] [OBJECT...]
#
# OBJECT defaults to build/native/kernels/conv_tc.cu.o build/native/kernels/gemm_tc.cu.o (a
# CUDA build's nvcc objects). --pattern (default '_tc_|tc_kernel', extended regex) picks the
# tensor-core kernels by demangled name. Below sm_80 a matching function without HMMA passes
# only as a refusal stub (it traps: BPT.TRAP), as kernels for TF32 and BF16 are on sm_75.
# --wgmma-pattern (default 'wgmma_.*kernel') picks the kernels built on kernels/wgmma.cuh.
# cuobjdump comes from $CUOBJDUMP, PATH or tools/ensure_sass_tools.sh (which installs it).
set -euo pipefail

pattern='_tc_|tc_kernel'
wgmma_pattern='wgmma_.*kernel'
archs='75 80 90a'
objects=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pattern) pattern=${2:?--pattern needs a regex}; shift 2 ;;
    --wgmma-pattern) wgmma_pattern=${2:?--wgmma-pattern needs a regex}; shift 2 ;;
    --arch) archs=${2:?--arch needs a list such as "80 90a"}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "sass_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) objects+=("$1"); shift ;;
  esac
done
[[ ${#objects[@]} -gt 0 ]] || objects=(build/native/kernels/conv_tc.cu.o build/native/kernels/gemm_tc.cu.o)

# ---- find cuobjdump (and nvdisasm, which it runs) -------------------------------------------
works() { [[ -n "$1" ]] && "$1" --version >/dev/null 2>&1; }
cuobjdump=${CUOBJDUMP:-}
if [[ -n "$cuobjdump" ]] && ! works "$cuobjdump"; then
  echo "sass_check: CUOBJDUMP=$cuobjdump does not run" >&2
  exit 2
fi
if [[ -z "$cuobjdump" ]] && works "$(command -v cuobjdump || true)"; then cuobjdump=$(command -v cuobjdump); fi
if [[ -z "$cuobjdump" ]]; then
  tools_dir=$("$(dirname "$0")/ensure_sass_tools.sh") || { echo "sass_check: no cuobjdump (see above)" >&2; exit 2; }
  cuobjdump=$tools_dir/cuobjdump
fi
export PATH="$(dirname "$cuobjdump"):$PATH"
if ! command -v nvdisasm >/dev/null; then
  echo "sass_check: cuobjdump needs nvdisasm on PATH (tools/ensure_sass_tools.sh installs both)" >&2
  exit 2
fi

# ---- check -----------------------------------------------------------------------------------
failures=0 matched=0
fail() { echo "FAIL   $*"; failures=$((failures + 1)); }
for object in "${objects[@]}"; do
  if [[ ! -f "$object" ]]; then
    fail "$object: no such object (build it with make, CUDA=1)"
    continue
  fi
  for arch in $archs; do
    if ! sass=$("$cuobjdump" -sass -arch "sm_$arch" "$object" 2>&1); then
      if grep -q "does not contain device code" <<<"$sass"; then
        fail "$object: no device code (a host or emulated object? check the nvcc objects of a CUDA=1 build)"
        break
      fi
      fail "$object sm_$arch: cuobjdump failed: $(head -3 <<<"$sass")"
      continue
    fi
    if ! grep -q "code for sm_$arch" <<<"$sass"; then
      fail "$object: no sm_$arch code (built with ARCH that leaves it out? pass --arch)"
      continue
    fi
    # Per function: mangled name, HMMA count, LDL count, STL count, BPT.TRAP count, GMMA count.
    counts=$(awk '
      function flush() { if (name != "") print name, hmma, ldl, stl, trap, gmma }
      /Function : / { flush(); name = $NF; hmma = ldl = stl = trap = gmma = 0; next }
      /^[ \t]*\/\*[0-9a-f]+\*\/[ \t]/ {
        op = $2
        if (op ~ /^@/) op = $3
        sub(/;.*/, "", op)
        base = op; sub(/\..*/, "", base)
        if (base == "HMMA") hmma++
        else if (base == "HGMMA") gmma++
        else if (base == "LDL") ldl++
        else if (base == "STL") stl++
        else if (op ~ /^BPT\.TRAP/) trap++
      }
      END { flush() }' <<<"$sass")
    if [[ -z "$counts" ]]; then
      echo "note   $object sm_$arch: no functions"
      continue
    fi
    while read -r mangled hmma ldl stl trap gmma; do
      name=$(c++filt <<<"$mangled" 2>/dev/null || echo "$mangled")
      tc=no
      grep -Eq -- "$pattern" <<<"$name" && tc=yes
      grep -Eq -- "$wgmma_pattern" <<<"$name" && tc=wg
      line="sm_$arch  tc:$(printf '%-3s' $tc)  HMMA $(printf '%4d' "$hmma")  GMMA $(printf '%3d' "$gmma")  LDL/STL $ldl/$stl  $name  ($(basename "$object"))"
      bad=""
      [[ $ldl -eq 0 && $stl -eq 0 ]] || bad="local memory traffic"
      if [[ $tc == wg ]]; then
        matched=$((matched + 1))
        if [[ $arch == 90a && $gmma -eq 0 ]]; then
          bad=${bad:+$bad, }"no GMMA in a wgmma kernel's sm_90a code"
        elif [[ $arch != 90a && ( $gmma -gt 0 || $trap -eq 0 ) ]]; then
          bad=${bad:+$bad, }"a wgmma kernel outside sm_90a code must be a trap stub"
        fi
      elif [[ $tc == yes ]]; then
        matched=$((matched + 1))
        if [[ $hmma -eq 0 ]]; then
          if [[ ${arch%a} -lt 80 && $trap -gt 0 ]]; then
            [[ -n "$bad" ]] || { echo "stub   $line: traps (no tensor cores for it below sm_80)"; continue; }
          else
            bad=${bad:+$bad, }"no HMMA in a tensor-core kernel"
          fi
        fi
      fi
      if [[ -n "$bad" ]]; then fail "$line: $bad"; else echo "ok     $line"; fi
    done <<<"$counts"
  done
done
if [[ $matched -eq 0 ]]; then
  fail "no function matched the tensor-core pattern '$pattern' (wrong objects, or pass --pattern)"
fi
if [[ $failures -gt 0 ]]; then
  echo "sass_check: $failures failure(s)"
  exit 1
fi
echo "sass_check: all passed ($matched tensor-core function(s) by arch)"
