#!/usr/bin/env bash
# The tests of the GPU path on emulated GPUs again, under the adversarial schedule
# (runtime/stream_queue.h): every stream's work delayed as far as its waits allow, so a missing
# wait or synchronisation fails here every time. YOLO_EMU_ADVERSARIAL (env): the seed (default
# 1; the run prints it). BUILD (env): the build folder (build).
set -u
cd "$(dirname "$0")/.."
seed=${YOLO_EMU_ADVERSARIAL:-1}
echo "adversarial schedule, seed $seed"
# As 2 shards at once (tools/sharded_tests.sh): the emulated tests use one core each.
YOLO_EMU_ADVERSARIAL=$seed exec tools/sharded_tests.sh -tc='*emu:*,*emulated*,*GPU path*,*kernel device*,*adversarial*'
