#!/usr/bin/env bash
# The CPU backend against PyTorch on the same cores, side by side in one run (issue 18's
# benchmark; a benchmark, not a test): the demo net (models/demo.cfg) training at SIZE x SIZE,
# batch BATCH, ours once per micro-kernel variant this CPU runs (YOLO_CPU_ISA) and PyTorch's CPU
# build through tools/peer/torch_yolov3.py (the same cfg, loss and SGD), both on THREADS threads;
# then the MNIST MLP, ours against tools/peer/torch_mlp.py.
# Ours is timed by its own split of the steps after the first (its "the last N steps" line); the
# compute figure leaves out the data wait and bookkeeping, which the peer does not have (its one
# batch lives in memory). Prints a table and the ratios to PyTorch.
#   tools/cpu_vs_torch.sh [--size 160] [--batch 16] [--steps 8] [--threads 2]
# PYTHON (env): the interpreter with torch (python3). Skips, saying so, when torch is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
size=160 batch=16 steps=8 threads=$(nproc)
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) size=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "usage: $0 [--size N] [--batch B] [--steps S] [--threads T]" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
[[ -x ./train_yolo ]] || { echo "cpu_vs_torch: ./train_yolo is not built (make)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
./train_yolo synth "$work/set" --train 64 --valid 4 --image-size 320x240 >/dev/null || exit 1

best=$(./train_yolo --list-devices | sed -n 's/^CPU ops: \([a-z0-9]*\) micro-kernels.*best here: \([a-z0-9]*\).*/\2/p')
isas=(baseline)
[[ $best == avx2 || $best == avx512 ]] && isas+=(avx2)
[[ $best == avx512 ]] && isas+=(avx512)

printf '%-26s %10s %12s %s\n' "run" "img/s" "compute/s" "step split"
declare -A rate compute
for isa in "${isas[@]}"; do
  line=$(YOLO_CPU_THREADS=$threads YOLO_CPU_ISA=$isa ./train_yolo --devices cpu --cfg models/demo.cfg \
    --data "$work/set/shapes.data" --size "$size" --batch "$batch" --max-batches $((steps + 1)) --out "$work/$isa" 2>&1 |
    grep 'the last [0-9]* steps:' | sed 's/.*steps: //')
  # "X img/s; a step T ms = data wait D + forward F + backward B + exposed comm C + optimizer O + other R"
  rate[$isa]=$(echo "$line" | awk '{print $1}')
  compute[$isa]=$(echo "$line" | awk -v b="$batch" '{for (i = 1; i <= NF; ++i) {
      if ($i == "forward") f = $(i + 1); if ($i == "backward") k = $(i + 1); if ($i == "optimizer") o = $(i + 1) }
      printf "%.1f", b * 1000 / (f + k + o)}')
  printf '%-26s %10s %12s %s\n' "ours ($isa)" "${rate[$isa]}" "${compute[$isa]}" "$(echo "$line" | cut -d';' -f2)"
done

peer=$("$python" tools/peer/torch_yolov3.py --cfg models/demo.cfg --size "$size" --batch "$batch" --device cpu \
  --threads "$threads" --precisions fp32 --warmup 1 --steps "$steps" 2>&1)
status=$?
if [[ $status -ne 0 ]]; then
  echo "cpu_vs_torch: PyTorch peer skipped: $(echo "$peer" | tail -n 1)"
  exit 0
fi
torch=$(echo "$peer" | sed -n 's/^peer: fp32 \([0-9.]*\) img\/s.*/\1/p')
printf '%-26s %10s\n' "PyTorch CPU (chan_last)" "$torch"
# The MNIST MLP (models/mnist-mlp.cfg, batch 128) the same way: ours per variant (the synthetic
# MNIST set), PyTorch through tools/peer/torch_mlp.py.
declare -A mlp
for isa in "${isas[@]}"; do
  mlp[$isa]=$(YOLO_CPU_THREADS=$threads YOLO_CPU_ISA=$isa ./train_yolo --devices cpu --cfg models/mnist-mlp.cfg \
    --data mnist --batch 128 --max-batches 21 --out "$work/mlp-$isa" 2>&1 | grep 'the last [0-9]* steps:' |
    sed 's/.*steps: //' | awk '{print $1}')
  printf '%-26s %10s\n' "ours MLP ($isa)" "${mlp[$isa]}"
done
torch_mlp=$("$python" tools/peer/torch_mlp.py --cfg models/mnist-mlp.cfg --threads "$threads" 2>&1 |
  sed -n 's/^peer: fp32 \([0-9.]*\) img\/s.*/\1/p')
printf '%-26s %10s\n' "PyTorch CPU MLP" "$torch_mlp"
for isa in "${isas[@]}"; do
  awk -v a="${rate[$isa]}" -v c="${compute[$isa]}" -v t="$torch" -v n="$isa" \
    'BEGIN { printf "ratio to PyTorch, ours (%s): %.2fx (compute only: %.2fx)\n", n, a / t, c / t }'
done
for isa in "${isas[@]}"; do
  awk -v a="${mlp[$isa]}" -v t="$torch_mlp" -v n="$isa" 'BEGIN { printf "MLP ratio to PyTorch, ours (%s): %.2fx\n", n, a / t }'
done
