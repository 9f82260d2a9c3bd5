#!/usr/bin/env bash
# The one prepared run for a GPU machine (DESIGN.md, "On a GPU"); under five minutes.
# Runs the test suite natively, compute-sanitizer (memcheck, racecheck, synccheck, initcheck)
# on the kernel tests, the kernel benchmarks (build/bench_kernels, ceilings measured first) and
# the loader benchmark (build/bench_loader) and two short training runs; writes full logs to OUTDIR and prints a summary
# table last. A tool that is missing is reported as unavailable, not as a failure.
# Needs the binaries built beforehand (here or elsewhere: make ARCH=90).
set -u
OUT=${1:?usage: tools/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
summary=()
record() { summary+=("$(printf '%-28s %-12s %s' "$1" "$2" "$3")"); }

# NCCL is loaded at run time; on machines where it only ships inside a Python package, find it.
if [[ -z "${YOLO_NCCL_LIB:-}" ]] && command -v python3 >/dev/null; then
  dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [[ -n "$dir" && -d "$dir" ]] && export YOLO_NCCL_LIB="$dir"
fi

run_step() {  # name, log file, timeout seconds, command...
  local name=$1 log=$2 limit=$3
  shift 3
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$log" 2>&1
  local status=$?
  local took=$((SECONDS - start))
  if [[ $status -eq 0 ]]; then record "$name" "ok" "${took}s, $OUT/$log"
  elif [[ $status -eq 124 ]]; then record "$name" "TIMEOUT" "after ${limit}s, $OUT/$log"
  else record "$name" "FAILED($status)" "${took}s, $OUT/$log"; fi
  return $status
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; nvidia-smi -L; } >"$OUT/gpu.txt" 2>&1 || true

run_step "list devices" devices.log 60 ./train_yolo --list-devices
run_step "tests (native)" tests.log 120 build/tests
tail -n 1 "$OUT/tests.log" | grep -q '^tests:' && summary[-1]+=" | $(tail -n 1 "$OUT/tests.log")"

# Every kernel test file (tests/test_kernel_*.cpp); SANITIZERS picks the tools.
if command -v compute-sanitizer >/dev/null; then
  for tool in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do
    run_step "compute-sanitizer $tool" "sanitizer_$tool.log" "${SANITIZER_TIMEOUT:-120}" \
      compute-sanitizer --tool "$tool" --error-exitcode 99 build/tests -sf='*test_kernel_*' -tce='*invalid launch*'
    summary[-1]+=" | $(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$OUT/sanitizer_$tool.log" || echo 'no summary')"
  done
else
  record "compute-sanitizer" "unavailable" "not on PATH"
fi

if [[ -x build/bench_kernels ]]; then
  run_step "bench_kernels" bench_kernels.log 120 build/bench_kernels
else
  record "bench_kernels" "unavailable" "not built"
fi

# The input pipeline on the GPU machine's cores (1..16 loader threads).
if [[ -x build/bench_loader ]]; then
  run_step "bench_loader" bench_loader.log 120 build/bench_loader --images 128 --dir "$OUT/loader_images"
else
  record "bench_loader" "unavailable" "not built"
fi

# Training: the demo net, then YOLOv3 at 416 (batch 16) on the synthetic shapes (3 classes:
# the cfg's 80-class heads rewritten to 3), 50 steps each; images/s in the logs.
if [[ -x ./train_yolo ]]; then
  run_step "train demo (50 steps)" train_demo.log 120 ./train_yolo --max-batches 50 --out "$OUT/demo"
  sed 's/^classes=80/classes=3/; s/^filters=255/filters=24/' models/yolov3.cfg >"$OUT/yolov3-shapes.cfg"
  run_step "train yolov3-416 (50 steps)" train_yolov3.log 300 ./train_yolo --cfg "$OUT/yolov3-shapes.cfg" \
    --batch 16 --subdivisions 1 --max-batches 50 --out "$OUT/yolov3" --trace "$OUT/yolov3_step.json"
  summary[-1]+=" | $(grep -m1 -o '[0-9.]* images/s' "$OUT/train_yolov3.log" | tail -1)"
  rm -f "$OUT"/demo/*.weights "$OUT"/demo/*.ckpt "$OUT"/yolov3/*.weights "$OUT"/yolov3/*.ckpt  # too big to fetch
fi

# Data parallel through NCCL (issue 7): the demo as a launched job of one rank (NCCL's
# all-reduces on the path) against the plain run; two ranks sharing GPU 0 where NCCL allows it
# (2.30+, NCCL_MULTI_RANK_GPU_ENABLE=1; the NCCL tests in build/tests need the same variable);
# and that job losing rank 1 (rank 0 must stop within --comm-timeout, naming it).
if [[ -x ./train_yolo ]]; then
  run_step "demo, no communicator" dp_plain.log 120 ./train_yolo --max-batches 100 --out "$OUT/dp_plain"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_plain.log" | sed 's/.*steps: //')"
  run_step "demo, NCCL world 1" dp_nccl1.log 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 ./train_yolo --max-batches 100 \
    --out "$OUT/dp_nccl1"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_nccl1.log" | sed 's/.*steps: //')"
  export NCCL_MULTI_RANK_GPU_ENABLE=1
  run_step "NCCL tests, 2 ranks on gpu:0" tests_nccl.log 120 build/tests -sf='*test_nccl*'
  run_step "demo, 2 NCCL ranks on gpu:0" dp_nccl2.log 180 tools/launch_local.sh -n 2 -p "$OUT/dp_nccl2" -- \
    ./train_yolo --devices gpu:0 --max-batches 100 --out "$OUT/dp_nccl2" --trace "$OUT/dp_nccl2_step.json"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_nccl2.rank0.log" | sed 's/.*steps: //')"
  run_step "2 NCCL ranks, rank 1 killed" dp_kill.log 120 tools/launch_local.sh -n 2 -p "$OUT/dp_kill" \
    --kill-rank 1 --kill-after 20 -- ./train_yolo --devices gpu:0 --max-batches 100000 --comm-timeout 30 \
    --out "$OUT/dp_kill"
  [[ $? -ne 0 ]] && grep -q 'rank 1' "$OUT/dp_kill.rank0.log" && summary[-1]+=" | rank 0 stopped naming rank 1 (expected)"
  unset NCCL_MULTI_RANK_GPU_ENABLE
  rm -f "$OUT"/dp_*/*.weights "$OUT"/dp_*/*.ckpt
fi

echo
cat "$OUT/gpu.txt"
echo
[[ -f "$OUT/bench_kernels.log" ]] && cat "$OUT/bench_kernels.log" && echo
[[ -f "$OUT/bench_loader.log" ]] && cat "$OUT/bench_loader.log" && echo
printf '%-28s %-12s %s\n' "step" "status" "detail"
printf '%s\n' "${summary[@]}"
