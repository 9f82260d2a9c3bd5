#!/usr/bin/env bash
# The instruction mix of a kernel's main loop, from its machine code: for each function whose
# demangled name matches REGEX, the loop (a backward branch and the code back to its target) that
# holds the most tensor-core MMAs (HMMA), and its instructions by kind per iteration: MMAs,
# ldmatrix (LDSM), cp.async (LDGSTS), other shared loads/stores, global loads/stores, integer and
# address arithmetic, FP32, barriers and branches, the rest. What a GPU's issue slots go to, read
# without one (docs/perf.md holds the figures beside what ncu measured).
#   tools/sass_mix.sh OBJECT REGEX [ARCH]      e.g. build/native/kernels/conv_tc.cu.o 'conv_forward_tc_kernel<yolo::Bf16, 128, 128, true>' 90a
set -euo pipefail
cd "$(dirname "$0")/.."
object=${1:?usage: tools/sass_mix.sh OBJECT REGEX [ARCH]} regex=${2:?usage: tools/sass_mix.sh OBJECT REGEX [ARCH]}
arch=${3:-90a}
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [[ -z "$cuobjdump" ]]; then
  tools_dir=$(tools/ensure_sass_tools.sh) || { echo "sass_mix: no cuobjdump (see above)" >&2; exit 2; }
  cuobjdump=$tools_dir/cuobjdump
fi
export PATH="$(dirname "$cuobjdump"):$PATH"

"$cuobjdump" -sass -arch "sm_$arch" "$object" | c++filt | awk -v want="$regex" -v arch="$arch" '
  function hex(text,   i, v) {
    v = 0; text = tolower(text); sub(/^0x/, "", text)
    for (i = 1; i <= length(text); i++) v = v * 16 + index("0123456789abcdef", substr(text, i, 1)) - 1
    return v
  }
  function kind(op) {
    if (op ~ /^HMMA/) return "mma"
    if (op ~ /^LDSM/) return "ldmatrix"
    if (op ~ /^LDGSTS/) return "cp.async"
    if (op ~ /^(LDS|STS)/) return "shared"
    if (op ~ /^(LDG|STG|LD|ST)\\./ || op ~ /^(LDG|STG)$/) return "global"
    if (op ~ /^(V?IMAD|V?IADD|LOP|SHF|LEA|ISETP|IABS|SEL|MOV|PRMT|V?IMNMX|I2F|F2I|ICMP|S2R|CS2R|U[A-Z]|R2UR|PLOP|POPC|FLO|BMSK|SGXT)/) return "integer"
    if (op ~ /^(FFMA|FADD|FMUL|FSETP|FSEL|FMNMX|F2F|MUFU|FCHK)/) return "fp32"
    if (op ~ /^(BAR|DEPBAR|BRA|BSYNC|BSSY|BREAK|WARPSYNC|EXIT|NOP|YIELD|CALL|RET)/) return "control"
    return "other"
  }
  function flush(   best, i, a, b, n, k, line) {
    if (name == "" || count == 0) return
    best = -1
    for (i = 0; i < loops; ++i) {
      n = 0
      for (a = 0; a < count; ++a) if (addr[a] >= from[i] && addr[a] <= to[i] && op[a] ~ /^HMMA/) ++n
      if (n > best) { best = n; b = i }
    }
    if (best <= 0) { printf "%s: no loop with HMMA\n", name; return }
    delete mix
    n = 0
    for (a = 0; a < count; ++a) if (addr[a] >= from[b] && addr[a] <= to[b]) { ++mix[kind(op[a])]; ++n }
    line = sprintf("%s (sm_%s): main loop of %d instructions:", name, arch, n)
    split("mma ldmatrix cp.async shared global integer fp32 control other", order, " ")
    for (k = 1; k <= 9; ++k) line = line sprintf(" %s %d", order[k], mix[order[k]] + 0)
    printf "%s; integer per MMA %.2f\n", line, (mix["integer"] + 0) / mix["mma"]
  }
  /Function : / { flush(); fn = $0; sub(/.*Function : /, "", fn); name = (fn ~ want) ? fn : ""; count = 0; loops = 0; next }
  name != "" && /\/\*[0-9a-f]+\*\// {
    match($0, /\/\*[0-9a-f]+\*\//); a = substr($0, RSTART + 2, RLENGTH - 4)
    text = substr($0, RSTART + RLENGTH); sub(/^[ \t]+/, "", text); sub(/;.*/, "", text)
    sub(/^@!?U?P[T0-9]+ +/, "", text)
    split(text, w, /[ \t]+/)
    address = hex(a)
    addr[count] = address; op[count] = w[1]; ++count
    if (w[1] ~ /^BRA/ && match(text, /0x[0-9a-f]+/)) {
      target = hex(substr(text, RSTART, RLENGTH))
      if (target < address) { from[loops] = target; to[loops] = address; ++loops }
    }
  }
  END { flush() }'
