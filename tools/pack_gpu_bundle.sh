#!/usr/bin/env bash
# Packs the GPU bundle (`make gpu-bundle`): everything tools/gpu_check.sh needs on a GPU machine,
# so that the machine compiles nothing (its time is the scarce part):
#   yolo-gpu-bundle/               the checkout's files (tracked and untracked, not ignored): the
#                                  scripts, models, the PyTorch peer (tools/peer), the docs
#   yolo-gpu-bundle/train_yolo, build/{tests,bench_kernels,bench_loader,scaling_model}
#                                  from BUILD_DIR, their host debug info stripped (symbols and the
#                                  device code's line tables stay, for backtraces and the sanitizers)
#   yolo-gpu-bundle/nccl/libnccl.so.2   NCCL_LIB when it exists (gpu_check.sh uses it for two ranks
#                                  on one GPU; the machine's own NCCL refuses that)
#   yolo-gpu-bundle/BUNDLE.txt     the commit, whether the tree had changes, the architecture, the date
# in one xz archive (its dictionary spans a binary, so the five copies of the kernels cost about one).
# Refuses an archive over LIMIT_MIB (60: what a device call carries beside the checkout).
#   tools/pack_gpu_bundle.sh BUILD_DIR ARCHIVE [NCCL_LIB]
# On the GPU machine:  tar xJf gpu-bundle.tar.xz && yolo-gpu-bundle/tools/gpu_check.sh OUT verdict
set -euo pipefail
build=${1:?usage: tools/pack_gpu_bundle.sh BUILD_DIR ARCHIVE [NCCL_LIB]}
archive=${2:?usage: tools/pack_gpu_bundle.sh BUILD_DIR ARCHIVE [NCCL_LIB]}
nccl=${3:-}
limit_mib=${LIMIT_MIB:-60}
cd "$(dirname "$0")/.."

binaries=("$build/train_yolo:train_yolo" "$build/tests:build/tests" "$build/bench_kernels:build/bench_kernels"
  "$build/bench_loader:build/bench_loader" "$build/scaling_model:build/scaling_model")
for pair in "${binaries[@]}"; do
  [[ -x ${pair%%:*} ]] || { echo "pack_gpu_bundle: ${pair%%:*} is not built (make gpu-bundle builds it)" >&2; exit 2; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/yolo-gpu-bundle
mkdir -p "$root/build" "$root/nccl"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' file; do
  [[ -f $file ]] && install -D -m "$(stat -c %a "$file")" "$file" "$root/$file"
done
for pair in "${binaries[@]}"; do
  strip --strip-debug -o "$root/${pair##*:}" "${pair%%:*}"
done
if [[ -n $nccl && -f $nccl ]]; then
  cp "$nccl" "$root/nccl/libnccl.so.2"
  nccl_line="nccl: $(basename "$(dirname "$nccl")") ($nccl)"
else
  rmdir "$root/nccl"
  nccl_line="nccl: none packed (${nccl:-no NCCL_LIB given}): gpu_check's two-rank step uses the machine's"
fi
{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname), $(nproc) cores"
  echo "gpu code: $("$root/train_yolo" --list-devices 2>/dev/null | sed -n 's/^Built for: //p')"
  echo "$nccl_line"
} >"$root/BUNDLE.txt"

mkdir -p "$(dirname "$archive")"
XZ_OPT="-9 -T0" tar -C "$stage" -cJf "$archive.part" yolo-gpu-bundle
mv "$archive.part" "$archive"
size=$(stat -c %s "$archive")
echo "gpu bundle: $archive, $((size / 1048576)) MiB ($size bytes)"
sed 's/^/  /' "$root/BUNDLE.txt"
if ((size > limit_mib * 1048576)); then
  echo "gpu bundle: over the ${limit_mib} MiB a device call carries" >&2
  exit 1
fi
