#!/usr/bin/env bash
# Checks that a kernel's FP32 and 16-bit instantiations do their floating-point arithmetic the same
# way (kernels/exact_math.cuh): for each architecture, the functions whose demangled names differ
# only in a storage-type template argument (float, yolo::Bf16, yolo::Fp16; integer arguments such
# as the vector width are ignored) are grouped, and the float one's set of FP arithmetic forms
# (FFMA, FADD, FMUL, MUFU, FMNMX, FCHK with their modifiers, operand signs, |abs| and immediates;
# operands of commutative products and sums sorted) must equal each 16-bit one's. An FMA that nvcc
# contracted in one instantiation only shows up as a form the other lacks (as the Fp16 batchnorm
# backward's FFMA -a*b+c against the FP32 one's a*b-c did). Loop unrolling may differ, so counts
# are not compared, and a form used by both in different places is not caught. The Fp16 widening's
# multiply by 2^-24 (subnormals, kernels/half_types.h) is not arithmetic of the op and is ignored.
# One line per group and architecture, then a verdict; exit status 0 when everything passes, 1
# when something fails, 2 for a usage or tool error.
#
#   tools/sass_twins_check.sh [--arch "75 80 90a"] OBJECT...
#
# cuobjdump comes from $CUOBJDUMP, PATH or tools/ensure_sass_tools.sh (which installs it).
set -euo pipefail

archs='75 80 90a'
objects=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --arch) archs=${2:?--arch needs a list such as "80 90"}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "sass_twins_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) objects+=("$1"); shift ;;
  esac
done
[[ ${#objects[@]} -gt 0 ]] || { echo "sass_twins_check: no objects given (see --help)" >&2; exit 2; }

works() { [[ -n "$1" ]] && "$1" --version >/dev/null 2>&1; }
cuobjdump=${CUOBJDUMP:-}
if [[ -n "$cuobjdump" ]] && ! works "$cuobjdump"; then
  echo "sass_twins_check: CUOBJDUMP=$cuobjdump does not run" >&2
  exit 2
fi
if [[ -z "$cuobjdump" ]] && works "$(command -v cuobjdump || true)"; then cuobjdump=$(command -v cuobjdump); fi
if [[ -z "$cuobjdump" ]]; then
  tools_dir=$("$(dirname "$0")/ensure_sass_tools.sh") || { echo "sass_twins_check: no cuobjdump (see above)" >&2; exit 2; }
  cuobjdump=$tools_dir/cuobjdump
fi
export PATH="$(dirname "$cuobjdump"):$PATH"
command -v nvdisasm >/dev/null || { echo "sass_twins_check: cuobjdump needs nvdisasm on PATH" >&2; exit 2; }

# "mangled<TAB>form" for every FP arithmetic instruction of every function, forms normalised.
fp_forms() {
  awk '
    function operand(t, s) {
      gsub(/^ +| +$/, "", t); sub(/\.reuse$/, "", t)
      s = ""
      if (t ~ /^-/) { s = "-"; sub(/^-/, "", t) }
      if (t ~ /^\|/) s = s "|"
      if (t ~ /^\|?R[0-9]+\|?$/) return s "r"
      if (t ~ /^\|?RZ\|?$/) return s "0"
      if (t ~ /^\|?(UR[0-9]+|c\[)/) return s "u"
      return s t
    }
    /Function : / { name = $NF; next }
    /^[ \t]*\/\*[0-9a-f]+\*\/[ \t]/ {
      line = $0
      sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, "", line)
      sub(/[ \t]*;.*$/, "", line)
      sub(/^@!?U?P[0-9T] +/, "", line)
      op = line; sub(/ .*/, "", op)
      base = op; sub(/\..*/, "", base)
      if (base !~ /^(FFMA|FADD|FMUL|MUFU|FMNMX|FCHK)$/) next
      if (line ~ /5\.9604644775390625e-08/) next  # the Fp16 widening: mantissa * 2^-24
      n = split(substr(line, length(op) + 2), a, ",")
      for (i = 2; i <= n; i++) o[i - 1] = operand(a[i])
      m = n - 1
      if ((base == "FMUL" || base == "FFMA") && m >= 2) {  # -a*b == a*-b, a*b == b*a
        neg = (o[1] ~ /^-/) != (o[2] ~ /^-/)
        sub(/^-/, "", o[1]); sub(/^-/, "", o[2])
        if (o[2] < o[1]) { t = o[1]; o[1] = o[2]; o[2] = t }
        if (neg) o[1] = "-" o[1]
      } else if (base == "FADD" && m >= 2 && o[2] < o[1]) {
        t = o[1]; o[1] = o[2]; o[2] = t
      }
      form = op "("
      for (i = 1; i <= m; i++) form = form (i > 1 ? "," : "") o[i]
      print name "\t" form ")"
    }'
}

failures=0 pairs=0
fail() { echo "FAIL   $*"; failures=$((failures + 1)); }
for object in "${objects[@]}"; do
  [[ -f "$object" ]] || { fail "$object: no such object (build it with make, CUDA=1)"; continue; }
  for arch in $archs; do
    if ! sass=$("$cuobjdump" -sass -arch "sm_$arch" "$object" 2>&1); then
      fail "$object sm_$arch: cuobjdump failed: $(head -3 <<<"$sass")"
      continue
    fi
    grep -q "code for sm_$arch" <<<"$sass" || { fail "$object: no sm_$arch code (pass --arch)"; continue; }
    forms=$(fp_forms <<<"$sass" | sort -u)
    [[ -n "$forms" ]] || { echo "note   $object sm_$arch: no FP arithmetic"; continue; }
    # Demangled name -> group key (the storage type as T, integer arguments as N) and type.
    report=$(paste <(cut -f1 <<<"$forms" | c++filt) <(cut -f2 <<<"$forms") | awk -F'\t' -v arch="$arch" -v obj="$(basename "$object")" '
      {
        name = $1; sub(/>\(.*/, ">", name)
        if (!match(name, /[<, ](float|yolo::Bf16|yolo::Fp16)[,>]/)) next
        type = substr(name, RSTART + 1, RLENGTH - 2)
        key = substr(name, 1, RSTART) "T" substr(name, RSTART + RLENGTH - 1)
        while (match(key, /[<, ][0-9]+[,>]/)) key = substr(key, 1, RSTART) "N" substr(key, RSTART + RLENGTH - 1)
        has[key, type, $2] = 1; types[key, type] = 1; forms_of[key] = forms_of[key] SUBSEP $2; keys[key] = 1
      }
      END {
        for (key in keys) {
          if (!((key, "float") in types)) continue
          for (t = 1; t <= 2; t++) {
            other = t == 1 ? "yolo::Bf16" : "yolo::Fp16"
            if (!((key, other) in types)) continue
            n = split(forms_of[key], f, SUBSEP); only32 = only16 = ""; delete seen
            for (i = 2; i <= n; i++) {
              if (f[i] in seen) continue
              seen[f[i]] = 1
              a = (key, "float", f[i]) in has; b = (key, other, f[i]) in has
              if (a && !b) only32 = only32 " " f[i]
              if (b && !a) only16 = only16 " " f[i]
            }
            if (only32 == "" && only16 == "") print "ok     sm_" arch "  " key " (float, " other ")  (" obj ")"
            else print "FAIL   sm_" arch "  " key ": float only:" (only32 == "" ? " -" : only32) "; " other " only:" (only16 == "" ? " -" : only16) "  (" obj ")"
          }
        }
      }' | sort -k3)
    if [[ -z "$report" ]]; then
      fail "$object sm_$arch: no float / 16-bit instantiation pairs (wrong object?)"
      continue
    fi
    echo "$report"
    pairs=$((pairs + $(grep -c . <<<"$report")))
    failures=$((failures + $(grep -c '^FAIL' <<<"$report" || true)))
  done
done
if [[ $failures -gt 0 ]]; then
  echo "sass_twins_check: $failures failure(s)"
  exit 1
fi
echo "sass_twins_check: all passed ($pairs float / 16-bit pair(s) by arch)"
