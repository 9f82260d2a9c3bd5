#!/usr/bin/env bash
# The tensor-core kernels get the blocks per SM the planner assumes (kernels/tc_plan.h,
# tc_min_blocks): each kernel's __launch_bounds__ minimum is recorded by ptxas as its register
# limit (EIATTR_MAXREG_COUNT), and the registers it really uses (EIATTR_REGCOUNT) must give the
# same number of blocks (of its EIATTR_MAX_THREADS threads) on an SM of 64K registers: not fewer
# (ptxas would have spilled, which tools/sass_check.sh fails), and, for the BF16 and FP16 kernels
# the trainer runs by default, not more (the planner would under-count them). A TF32 kernel that
# gets more is listed as a note: its launch bounds are set for the layout that needs the most
# registers. The mma.sync kernels (_tc_kernel) and the wgmma ones (_wgmma_kernel) are checked.
# A kernel that reallocates registers between its warpgroups (setmaxnreg: USETMAXREG in its SASS)
# must balance them: one warpgroup gives registers back (DEALLOC d) and the others take them
# (TRY_ALLOC a), which only completes if 128 * d + (threads - 128) * a is at most what the block
# launched with, threads * its registers; more waits for registers that never come (a hang), less
# leaves some unused (a note).
# Checked for every architecture in the objects, except the kernels that are only a trap there
# (sm_75 has no cp.async, BF16 or TF32 tensor cores; wgmma exists in sm_90a code alone).
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
  # The ELF's attributes first, then, where wgmma kernels are (setmaxnreg is sm_90a code's, and
  # only the warp-specialised wgmma kernels reallocate registers), their SASS's USETMAXREG
  # instructions, in one awk.
  elf=$("$cuobjdump" -elf "$object")
  { echo "$elf"; echo "=== sass"
    if grep -q '_wgmma_kernel' <<<"$elf"; then "$cuobjdump" -sass -arch sm_90a "$object"; fi
  } | awk -v object="$object" '
    # Blocks of `threads` that fit 64K registers at r registers a thread (allocated in 8s).
    function blocks(r, threads) { r = int((r + 7) / 8) * 8; return int(65536 / (r * threads)) }
    function hex(text,   i, v) {
      v = 0; text = tolower(substr(text, 3))
      for (i = 1; i <= length(text); i++) v = v * 16 + index("0123456789abcdef", substr(text, i, 1)) - 1
      return v
    }
    # Trap stubs: sm_75 without cp.async, BF16 or TF32; the wgmma kernels outside sm_90a code.
    function stub(arch, fn) {
      return (arch == "sm_75" && (fn ~ /ELb1EEEv/ || fn !~ /Fp16/)) || (fn ~ /_wgmma_kernel/ && arch != "sm_90a")
    }
    /^=== sass/ { sass = 1; next }
    /^arch = / { arch = $3 }
    !sass && /^\.nv\.info\./ { section = substr($1, 10) }
    !sass && /EIATTR_MAXREG_COUNT/ { want = "maxreg"; next }
    !sass && /EIATTR_MAX_THREADS/ { want = "threads"; next }
    !sass && want != "" && /Value:/ {
      if (want == "maxreg") maxreg[arch " " section] = hex($2)
      else threads[arch " " section] = hex($2)
      want = ""
    }
    !sass && /register count:/ {
      match($0, /function: [^(]*/); fn = substr($0, RSTART + 10, RLENGTH - 10)
      regs[arch " " fn] = $NF
    }
    sass && /Function : / { fn = $3 }
    # setmaxnreg.dec / .inc: "USETMAXREG.DEALLOC.CTAPOOL 0x28 ;", "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;"
    function count(line) { match(line, /0x[0-9a-f]+ ;/); return hex(substr(line, RSTART, RLENGTH - 2)) }
    sass && /USETMAXREG\.DEALLOC/ { dealloc[arch " " fn] = count($0) }
    sass && /USETMAXREG\.TRY_ALLOC/ { alloc[arch " " fn] = count($0) }
    END {
      bad = 0; n = 0; m = 0
      for (key in maxreg) {
        split(key, part, " ")
        if (part[2] !~ /_(tc|wgmma)_kernel/ || stub(part[1], part[2]) || !(key in regs)) continue
        n++
        t = (key in threads) ? threads[key] : 256
        claimed = blocks(maxreg[key], t); got = blocks(regs[key], t)
        if (got == claimed) continue
        tf32 = part[2] ~ /_tc_kernelIf/
        printf "%s: %s %s: %d registers give %d blocks of %d threads per SM, its launch bounds claim %d (limit %d)\n",
               (tf32 && got > claimed) ? "note" : "FAILED", part[1], part[2], regs[key], got, t, claimed, maxreg[key]
        if (!tf32 || got < claimed) bad++
      }
      for (key in alloc) {
        split(key, part, " ")
        m++
        t = (key in threads) ? threads[key] : 0
        if (!(key in dealloc) || !(key in regs) || t <= 128) {
          printf "FAILED: %s %s: setmaxnreg.inc without the matching dec, register count or warpgroups to take from\n",
                 part[1], part[2]
          bad++; continue
        }
        wanted = 128 * dealloc[key] + (t - 128) * alloc[key]; held = t * regs[key]
        if (wanted > held) {
          printf "FAILED: %s %s: its warpgroups ask 128 x %d + %d x %d = %d registers, the block launched " \
                 "with %d x %d = %d (setmaxnreg.inc would wait forever)\n",
                 part[1], part[2], dealloc[key], t - 128, alloc[key], wanted, t, regs[key], held
          bad++
        } else if (wanted < held) {
          printf "note: %s %s: its warpgroups use %d of the %d registers the block launched with\n", part[1], part[2],
                 wanted, held
        }
      }
      printf "%s: %d tensor-core kernels checked, %d with setmaxnreg, %d failing\n", object, n, m, bad
      exit bad > 0
    }' || status=1
done
exit $status
