#!/usr/bin/env bash
# The two workloads users reported as slower on more GPUs (issue 7), each run on every device
# set given, so 1 device and N devices are compared by the same command:
#   tools/seed_bench.sh mlp  DEVICES...   the MNIST MLP (models/mnist-mlp.cfg), batch 128, EPOCHS (5) epochs
#                                         of MNIST (MNIST_DIR= for the IDX files, else the synthetic set)
#   tools/seed_bench.sh yolo DEVICES...   YOLOv3 at 608x608 on 10,000 synthetic shape images (written once
#                                         to runs/shapes10k), STEPS (20) steps of BATCH (16) images, fixed size
# e.g.  tools/seed_bench.sh mlp cpu cpu:2        tools/seed_bench.sh yolo gpu:0 gpu:0,1,2,3
# Prints, per device set, the trainer's images/s and its split of a step (data wait, forward,
# backward, exposed communication, optimizer). Knobs: EPOCHS, STEPS, BATCH, SUBDIVISIONS, MAX_BATCHES
# (mlp: stop after this many steps instead of EPOCHS, for machines that cannot run five epochs).
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:?usage: tools/seed_bench.sh mlp|yolo DEVICES...}
shift
[[ $# -gt 0 ]] || { echo "seed_bench: name at least one device set (e.g. cpu cpu:2, gpu:0 gpu:0,1)" >&2; exit 2; }
[[ -x ./train_yolo ]] || { echo "seed_bench: build first (make)" >&2; exit 2; }
mkdir -p runs/seed

case $workload in
  mlp)
    args=(--cfg models/mnist-mlp.cfg --data "mnist${MNIST_DIR:+:$MNIST_DIR}" --batch 128 --subdivisions 1)
    if [[ -n ${MAX_BATCHES:-} ]]; then args+=(--max-batches "$MAX_BATCHES"); else args+=(--epochs "${EPOCHS:-5}"); fi
    ;;
  yolo)
    if [[ ! -f runs/shapes10k/shapes.data ]]; then
      ./train_yolo synth runs/shapes10k.tmp --train 10000 --valid 10
      mv runs/shapes10k.tmp runs/shapes10k
    fi
    # 3 classes instead of COCO's 80 (the heads' filters follow: 3 x (5 + 3)); a fixed input size.
    sed 's/^classes=80/classes=3/; s/^filters=255/filters=24/; s/^random=1/random=0/' models/yolov3.cfg \
      >runs/seed/yolov3-shapes.cfg
    args=(--cfg runs/seed/yolov3-shapes.cfg --data runs/shapes10k/shapes.data --size 608
          --batch "${BATCH:-16}" --subdivisions "${SUBDIVISIONS:-1}" --max-batches "${STEPS:-20}")
    ;;
  *) echo "seed_bench: unknown workload '$workload' (mlp or yolo)" >&2; exit 2 ;;
esac

for devices in "$@"; do
  log=runs/seed/$workload-${devices//[:,]/_}.log
  start=$SECONDS
  ./train_yolo "${args[@]}" --devices "$devices" --out "runs/seed/$workload-${devices//[:,]/_}" >"$log" 2>&1 ||
    { echo "seed_bench: $workload on $devices failed, see $log" >&2; tail -n 5 "$log" >&2; exit 1; }
  echo "== $workload on $devices: $((SECONDS - start)) s wall, log $log"
  grep -E 'images/s$' "$log" | tail -n 1
  grep -E 'train_yolo: (epoch [0-9]+|the last [0-9]+ steps): .*img/s' "$log" | tail -n 2
done
