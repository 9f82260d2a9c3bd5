#!/usr/bin/env bash
# The Makefile's default ARCH: with GPUs present (nvidia-smi answers), the architectures whose
# code they run best (runtime/gpu_code.h's arch_for: 7.x -> 75, 9.0 -> 90, 8.x and 10.0 on -> 80,
# the newer ones through its PTX); without, all three the project targets, "75 80 90".
set -u
caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null) || caps=""
archs=()
for cap in $caps; do
  [[ $cap =~ ^([0-9]+)\.([0-9]+)$ ]] || continue
  cc=$((BASH_REMATCH[1] * 10 + BASH_REMATCH[2]))
  if ((cc < 80)); then archs+=(75); elif ((cc == 90)); then archs+=(90); else archs+=(80); fi
done
if ((${#archs[@]} == 0)); then echo "75 80 90"; else printf '%s\n' "${archs[@]}" | sort -u | tr '\n' ' ' | sed 's/ $//'; echo; fi
