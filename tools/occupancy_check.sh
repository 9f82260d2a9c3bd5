#!/usr/bin/env bash
# The tensor-core kernels get the blocks per SM the planner assumes (kernels/tc_plan.h,
# tc_min_blocks): each kernel's __launch_bounds__ minimum is recorded by ptxas as its register
# limit (EIATTR_MAXREG_COUNT), and the registers it really uses (EIATTR_REGCOUNT) must give the
# same number of 256-thread blocks on an SM of 64K registers: not fewer (ptxas would have spilled,
# which tools/sass_check.sh fails), and, for the BF16 and FP16 kernels the trainer runs by
# default, not more (the planner would under-count them). A TF32 kernel that gets more is listed
# as a note: its launch bounds are set for the layout that needs the most registers.
# Checked for every architecture in the objects, except the kernels that are only a trap there
# (sm_75 has no cp.async, BF16 or TF32 tensor cores: those variants are stubs).
#   tools/occupancy_check.sh OBJECT...
# Prints one line per kernel that fails (or is noted) and a summary; exit status 1 when any fails.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || { echo "usage: tools/occupancy_check.sh OBJECT..." >&2; exit 2; }
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [[ -z "$cuobjdump" ]]; then
  tools_dir=$(tools/ensure_sass_tools.sh) || { echo "occupancy_check: no cuobjdump (see above)" >&2; exit 2; }
  cuobjdump=$tools_dir/cuobjdump
fi

status=0
for object in "$@"; do
  [[ -f "$object" ]] || { echo "FAILED: $object: no such object (build it with CUDA=1)"; status=1; continue; }
  "$cuobjdump" -elf "$object" | awk -v object="$object" '
    # 256-thread blocks that fit 64K registers at r registers a thread (allocated in 8s).
    function blocks(r) { r = int((r + 7) / 8) * 8; return int(65536 / (r * 256)) }
    function hex(text,   i, v) {
      v = 0; text = tolower(substr(text, 3))
      for (i = 1; i <= length(text); i++) v = v * 16 + index("0123456789abcdef", substr(text, i, 1)) - 1
      return v
    }
    function stub(arch, fn) { return arch == "sm_75" && (fn ~ /ELb1EEEv/ || fn !~ /Fp16/) }
    /^arch = / { arch = $3 }
    /^\.nv\.info\./ { section = substr($1, 10) }
    /EIATTR_MAXREG_COUNT/ { want = 1; next }
    want && /Value:/ { maxreg[arch " " section] = hex($2); want = 0 }
    /register count:/ {
      match($0, /function: [^(]*/); fn = substr($0, RSTART + 10, RLENGTH - 10)
      regs[arch " " fn] = $NF
    }
    END {
      bad = 0; n = 0
      for (key in maxreg) {
        split(key, part, " ")
        if (part[2] !~ /_tc_kernel/ || stub(part[1], part[2]) || !(key in regs)) continue
        n++
        claimed = blocks(maxreg[key]); got = blocks(regs[key])
        if (got == claimed) continue
        tf32 = part[2] ~ /_tc_kernelIf/
        printf "%s: %s %s: %d registers give %d blocks per SM, its launch bounds claim %d (limit %d)\n",
               (tf32 && got > claimed) ? "note" : "FAILED", part[1], part[2], regs[key], got, claimed, maxreg[key]
        if (!tf32 || got < claimed) bad++
      }
      printf "%s: %d tensor-core kernels checked, %d failing\n", object, n, bad
      exit bad > 0
    }' || status=1
done
exit $status
