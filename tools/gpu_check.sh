#!/usr/bin/env bash
# The one prepared run for a GPU machine (DESIGN.md, "On a GPU"), in sections that each take a
# few minutes at most, so that one device call of under 6 minutes covers exactly what a change
# touched and leaves time for a rerun:
#   tools/gpu_check.sh OUTDIR                      every section
#   tools/gpu_check.sh OUTDIR tests train nccl     these, in this order
# Sections (upper bound of each, from its steps' timeouts):
#   tests      devices, the test suite natively (build/tests), then every FP32 pattern
#              through the device's cvt.rna.tf32.f32 against the host twin (seconds)   ~4 min
#   sanitizer  compute-sanitizer over the kernel tests; SANITIZERS picks the tools
#              (default memcheck racecheck; also synccheck initcheck), SANITIZER_TIMEOUT each  ~4 min
#   bench      the kernel benchmarks (build/bench_kernels, ceilings measured first)     ~2 min
#   loader     the input pipeline on the machine's cores (build/bench_loader)           ~2 min
#   train      the demo net, 50 steps, as CUDA Graphs, with --no-graph, with --no-idle   ~2 min
#   yolov3     YOLOv3-416 (batch 16), 50 steps with a trace of one step; 20 --no-graph  ~6 min
#   nccl       the demo without a communicator and as an NCCL job of one; the NCCL tests ~3 min
#   nccl2      2 NCCL ranks sharing gpu:0 (NCCL 2.30+), and that job with rank 1 killed  ~4 min
#   tc         tensor cores: the mma / tensor-core tests natively, under memcheck and
#              racecheck, then bench_kernels --filter conv_tc (cuBLAS yardstick)       ~5 min
#              (expected ~2: bounds 45 + 75 + 105 + 60 s; TC_RACECHECK_FILTER narrows racecheck)
#   tune       tensor-core plans: every candidate timed beside the planner's prediction
#              (bench_kernels --tune, bf16 then tf32), the planner's table for this GPU, and
#              Nsight Compute's shared-memory wavefronts and occupancy of the bf16 forward and
#              backward-data kernels at 52x52 128->256 (the bank model's check)          <= 3 min
#   peer       ours side by side with the PyTorch peer (tools/peer/torch_yolov3.py): YOLOv3-416
#              batch 16 and the demo net, each precision, eager; YOLOv3 bf16 under torch.compile
#              too; a table of images/s at the median step                           <= 6 min
#              (PEER_BUDGET seconds, 360: every step's timeout is what is left of it)
#   fold       fewer passes around BatchNorm: the native tests of BatchNorm applied in the next
#              convs' loads, bench_kernels' bn+leaky backward reading y beside the one
#              recomputing it (batch 16), then YOLOv3-416 bf16 batch 16 folded (default), with
#              --no-load-fold and with --no-fold, 36 steps each, medians              ~6 min
#   fold_convs each bf16 conv forward and weight gradient beside the same reading its input
#              through BatchNorm's apply (bench_kernels --normalized, rows "+bn")        ~4 min
#   wgmma      Hopper's building blocks (kernels/wgmma.cuh, tma.cuh) on the hardware: the
#              warpgroup tests and gemm_nt_wgmma's (every swizzle, BF16 and FP16, cp.async and
#              TMA rings; skipped where no sm_90a code runs), TMA's im2col boxes against the
#              documented hardware results and a convolution's im2col rows, the self-check's
#              cases one by one, the TF32 probe (truncated or rounded operands) and swizzled
#              boxes from a 16-byte aligned base (the summary line has all three),
#              the same under compute-sanitizer racecheck and synccheck,
#              the SASS check of sm_90a code (GMMA present, no local memory), then
#              bench_kernels --filter "fwd bf16": gemm_nt_wgmma (1x1 layers) and
#              conv2d_forward_wgmma (every layer but the first; A gathered, and by im2col where
#              c_in is a multiple of 64) beside cuBLAS and the mma.sync convolutions       ~6 min
#   wgmma_bwd  bench_kernels --filter "bwd data bf16" and "bwd weights bf16" (wgmma gathered
#              and by im2col beside cuBLAS and mma.sync), then the tf32 forward and backward
#              data rows (wgmma where planned)                                           ~6 min
#   wgmma_step YOLOv3-416 batch 16 in bf16 and tf32 with the planner's wgmma choices (im2col
#              where it fits), with YOLO_TMA_IM2COL=off (wgmma gathering) and with
#              YOLO_WGMMA=off, 36 steps each, medians                                    ~5 min
#   targets    issue 36's targets: bench_kernels --filter conv_tc with its verdict on the bf16 rows
#              against cuBLAS (tools/cublas_verdict.h), then the bf16 YOLOv3-416 step at batch 16
#              (36 steps, the median) against 650 img/s, and again with YOLO_WGMMA_PERSISTENT=off
#              (the wgmma convolutions a block a tile)                                   ~5 min
#   lookahead  YOLOv3-416 as the stock cfg trains it (batch 64, 16 micro-batches a step) in bf16,
#              and batch 16 in fp16 (the T4's precision, loss scale on the GPU), each with
#              look-ahead (default) and with --no-look-ahead, medians                   ~5 min
# Writes full logs to OUTDIR and prints a summary table last. A tool that is missing is
# reported as unavailable, not as a failure. Needs the binaries built beforehand (here or
# elsewhere: `make ARCH=90 all build/tests`, which builds sm_90a code).
set -u
usage="usage: tools/gpu_check.sh OUTDIR [tests|sanitizer|bench|loader|train|yolov3|nccl|nccl2|tc|tune|peer|fold|fold_convs|lookahead|wgmma|wgmma_bwd|wgmma_step|targets ...]"
OUT=${1:?$usage}
shift
sections=("$@")
(( ${#sections[@]} )) || sections=(tests sanitizer bench loader train yolov3 nccl nccl2 tc tune peer fold fold_convs
  lookahead wgmma wgmma_bwd wgmma_step targets)
for s in "${sections[@]}"; do
  case $s in tests|sanitizer|bench|loader|train|yolov3|nccl|nccl2|tc|tune|peer|fold|fold_convs|lookahead|wgmma|wgmma_bwd|wgmma_step|targets) ;;
    *) echo "unknown section '$s'; $usage" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
summary=()
record() { summary+=("$(printf '%-28s %-12s %s' "$1" "$2" "$3")"); }

# NCCL is loaded at run time; on machines where it only ships inside a Python package, find it.
if [[ -z "${YOLO_NCCL_LIB:-}" ]] && command -v python3 >/dev/null; then
  dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [[ -n "$dir" && -d "$dir" ]] && export YOLO_NCCL_LIB="$dir"
fi
# The lib folder of a library that ships inside Python's nvidia packages: MODULE's lib/ (or the
# CUDA 13 wheels' nvidia/*/lib) holding a file matching GLOB; nothing when there is none.
python_lib_dir() {  # module, glob
  command -v python3 >/dev/null || return 0
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import glob, importlib, os, sys
for name in (sys.argv[1], "nvidia"):
    try:
        bases = list(importlib.import_module(name).__path__)
    except Exception:
        continue
    for base in bases:
        for lib in [os.path.join(base, "lib")] + sorted(glob.glob(os.path.join(base, "*", "lib"))):
            if glob.glob(os.path.join(lib, sys.argv[2])):
                print(lib)
                raise SystemExit(0)
PY
}
# cuBLAS, bench_kernels' yardstick, likewise (a folder: the loader tries libcublas.so.13, .12,
# .so in it). Not found: the loader's default paths, and bench_kernels prints "-" in the cuBLAS
# columns.
if [[ -z "${YOLO_CUBLAS_LIB:-}" ]]; then
  dir=$(python_lib_dir nvidia.cublas 'libcublas.so*')
  [[ -n "$dir" && -d "$dir" ]] && export YOLO_CUBLAS_LIB="$dir"
fi
# CUPTI (the split's device idle time, runtime/activity.h): the toolkit's when it has one, else
# Python's nvidia-cuda-cupti package (a folder: the loader opens libcupti.so.13 in it).
if [[ -z "${YOLO_CUPTI_LIB:-}" ]] &&
  ! ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 >/dev/null 2>&1; then
  dir=$(python_lib_dir nvidia.cuda_cupti 'libcupti.so.13')
  [[ -n "$dir" && -d "$dir" ]] && export YOLO_CUPTI_LIB="$dir"
fi

# YOLOv3's cfg as the trainer runs it on runs/shapes: heads at 3 classes (24 filters), and one
# input size (random=0), in $OUT/NAME.
trainer_yolov3_cfg() {  # name
  sed 's/^classes=80/classes=3/; s/^filters=255/filters=24/; s/^random=1/random=0/' models/yolov3.cfg >"$OUT/$1"
}

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

section_tests() {
  run_step "list devices" devices.log 60 ./train_yolo --list-devices
  run_step "tests (native)" tests.log 120 build/tests
  tail -n 1 "$OUT/tests.log" | grep -q '^tests:' && summary[-1]+=" | $(tail -n 1 "$OUT/tests.log")"
  # The TF32 twin (round_to_tf32) against the device on all 2^32 patterns: the mismatch count
  # and the first mismatch, if any.
  run_step "tf32 sweep (2^32 patterns)" tf32_sweep.log 60 env YOLO_TF32_SWEEP=all build/tests \
    -tc='*to_tf32 on the device equals round_to_tf32*'
  summary[-1]+=" | $(grep -m1 -o 'to_tf32 sweep: [^;]*\(; 0x[^;]*\)\?' "$OUT/tf32_sweep.log" || echo 'no sweep line')"
}

# The first question the hardware answers for stage 2 (issue 36): do the descriptor, swizzle,
# fragment and mbarrier facts the emulated twins follow hold on an H100/H200?
section_wgmma() {
  run_step "wgmma tests (native)" wgmma.log 120 build/tests \
    -tc='*wgmma*,tensor maps*,tma im2col*,kernel: conv2d on tensor cores*,conv moments*,tc plan*,*named barriers*'
  summary[-1]+=" | $(tail -n 1 "$OUT/wgmma.log")"
  # Issue 49's questions: the self-check's cases one by one (its log), how the tensor cores read a
  # raw FP32 operand in TF32 (32: truncated, as the twins assume; 32.03125: rounded), and whether
  # swizzled TMA boxes need the 128-byte aligned base the encoder now asks for.
  summary[-1]+=" | self-check: $(grep -c 'self-check: .*: ok$' "$OUT/wgmma.log") ok, $(grep 'self-check: ' "$OUT/wgmma.log" |
    grep -vc ': ok$') not | $(grep -m1 -o 'tf32 probe: [^"]*' "$OUT/wgmma.log" || echo 'no tf32 probe line')"
  summary[-1]+=" | $(grep -m1 -o 'swizzled im2col boxes from a base[^"]*' "$OUT/wgmma.log" || echo 'no base probe line')"
  if command -v compute-sanitizer >/dev/null; then
    for tool in racecheck synccheck; do
      run_step "wgmma under $tool" "wgmma_$tool.log" 90 \
        compute-sanitizer --tool "$tool" --error-exitcode 99 build/tests -tc='*wgmma*,tma im2col*'
      summary[-1]+=" | $(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$OUT/wgmma_$tool.log" || echo 'no summary')"
    done
  fi
  run_step "SASS check, sm_90a" sass_wgmma.log 60 tools/sass_check.sh --arch 90a \
    build/native/tests/wgmma_test_kernels.cu.o build/native/kernels/gemm_wgmma.cu.o \
    build/native/kernels/conv_wgmma.cu.o build/native/kernels/conv_wgmma_data.cu.o \
    build/native/kernels/conv_wgmma_weights.cu.o build/native/kernels/conv_tc.cu.o
  summary[-1]+=" | $(tail -n 1 "$OUT/sass_wgmma.log")"
  run_step "wgmma fwd vs cuBLAS" bench_wgmma.log 200 build/bench_kernels --filter "fwd bf16"
}

# Backward data and the weight gradient (wgmma gathered and by im2col, beside cuBLAS and
# mma.sync), and tf32's rows: apart from section_wgmma so that each fits one call.
section_wgmma_bwd() {
  [[ -x build/bench_kernels ]] || { record "wgmma_bwd" "unavailable" "build/bench_kernels not built"; return; }
  run_step "wgmma bwd data vs cuBLAS" bench_wgmma_bwd.log 150 build/bench_kernels --filter "bwd data bf16"
  run_step "wgmma bwd weights vs cuBLAS" bench_wgmma_wgrad.log 150 build/bench_kernels --filter "bwd weights bf16"
  # TF32's forward and backward data go to wgmma where the planner predicts it (operands read
  # truncated; backward data from the weights transposed).
  run_step "tf32 fwd (planner) vs cuBLAS" bench_tf32_fwd.log 120 build/bench_kernels --filter "conv fwd tf32"
  run_step "tf32 bwd data (planner) vs cuBLAS" bench_tf32_bwd.log 120 build/bench_kernels --filter "conv bwd data tf32"
}

# The trainer with the planner's wgmma choices (issue 36 item 4) and with YOLO_WGMMA=off, in bf16
# and in tf32 (where the forward and backward data can change). Apart from section_wgmma so that
# each fits one call of a few minutes.
section_wgmma_step() {
  [[ -x ./train_yolo ]] || { record "wgmma step" "unavailable" "./train_yolo not built"; return; }
  trainer_yolov3_cfg yolov3-wgmma.cfg
  local mode log precision wgmma im2col
  # mode: wgmma with im2col where it fits (on), wgmma gathering every operand (gather), mma.sync (off).
  for precision in bf16 tf32; do
    for mode in on gather off; do
      wgmma=on im2col=on
      [[ $mode == gather ]] && im2col=off
      [[ $mode == off ]] && wgmma=off
      log="wgmma_yolov3_${precision}_$mode.log"
      run_step "yolov3 $precision wgmma $mode" "$log" 90 env YOLO_WGMMA=$wgmma YOLO_TMA_IM2COL=$im2col ./train_yolo \
        --cfg "$OUT/yolov3-wgmma.cfg" --size 416 --batch 16 --subdivisions 1 --max-batches 36 \
        --precision "$precision" --out "$OUT/wgmma_runs/${precision}_$mode"
      [[ -f "$OUT/$log" ]] && summary[-1]+=" | $(ours_rate "$OUT/$log" 16 |
        awk '{printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4}')"
      rm -f "$OUT/wgmma_runs/${precision}_$mode/"*.weights "$OUT/wgmma_runs/${precision}_$mode/"*.ckpt
    done
  done
}

# Issue 36's targets in one call: every conv_tc row (each pass and precision, the planner's
# kernels, cuBLAS beside) with bench_kernels' verdict on the bf16 rows (tools/cublas_verdict.h:
# each within 1.25x of cuBLAS, the median within 1.1x, the sum within 1.15x), then the trainer's
# bf16 YOLOv3-416 step at batch 16 (the planner's choices, as `peer` runs ours) against 650 img/s,
# and the same step with YOLO_WGMMA_PERSISTENT=off (the wgmma convolutions a block a tile: what
# persistent blocks gained).
section_targets() {
  if [[ -x build/bench_kernels ]]; then
    run_step "conv_tc vs cuBLAS (targets)" bench_targets.log 150 build/bench_kernels --filter conv_tc
    summary[-1]+=" | $(grep -m1 '^conv_tc bf16 against cuBLAS' "$OUT/bench_targets.log" || echo 'no verdict line')"
  else
    record "conv_tc vs cuBLAS (targets)" "unavailable" "build/bench_kernels not built"
  fi
  [[ -x ./train_yolo ]] || { record "yolov3 bf16 (targets)" "unavailable" "./train_yolo not built"; return; }
  trainer_yolov3_cfg yolov3-targets.cfg
  local persistent log rate
  for persistent in on off; do
    log="targets_yolov3_bf16_persistent_$persistent.log"
    run_step "yolov3 bf16 persistent $persistent" "$log" 120 env YOLO_WGMMA_PERSISTENT=$persistent ./train_yolo \
      --cfg "$OUT/yolov3-targets.cfg" --size 416 --batch 16 --subdivisions 1 --max-batches 36 --precision bf16 \
      --out "$OUT/targets_run"
    rate=$(ours_rate "$OUT/$log" 16)
    if [[ -z $rate ]]; then summary[-1]+=" | no rate in the log"
    elif [[ $persistent == on ]]; then
      summary[-1]+=" | $(awk '{ printf "%s img/s, %s ms/step (data wait %s, other %s); target >= 650 img/s: %s",
        $1, $2, $3, $4, ($1 >= 650 ? "met" : "not met") }' <<<"$rate")"
    else
      summary[-1]+=" | $(awk '{ printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4 }' <<<"$rate")"
    fi
    rm -rf "$OUT/targets_run"
  done
}

# Every kernel test file (tests/test_kernel_*.cpp).
section_sanitizer() {
  if ! command -v compute-sanitizer >/dev/null; then
    record "compute-sanitizer" "unavailable" "not on PATH"
    return
  fi
  for tool in ${SANITIZERS:-memcheck racecheck}; do
    run_step "compute-sanitizer $tool" "sanitizer_$tool.log" "${SANITIZER_TIMEOUT:-110}" \
      compute-sanitizer --tool "$tool" --error-exitcode 99 build/tests -sf='*test_kernel_*' -tce='*invalid launch*'
    summary[-1]+=" | $(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$OUT/sanitizer_$tool.log" || echo 'no summary')"
  done
}

section_bench() {
  if [[ -x build/bench_kernels ]]; then run_step "bench_kernels" bench_kernels.log 120 build/bench_kernels
  else record "bench_kernels" "unavailable" "not built"; fi
}

# The input pipeline on the GPU machine's cores (1..16 loader threads).
section_loader() {
  if [[ -x build/bench_loader ]]; then
    run_step "bench_loader" bench_loader.log 120 build/bench_loader --images 128 --dir "$OUT/loader_images"
  else
    record "bench_loader" "unavailable" "not built"
  fi
}

# Training: the demo net; YOLOv3 at 416 (batch 16) on the synthetic shapes (3 classes: the cfg's
# 80-class heads rewritten to 3); 50 steps each; images/s in the logs.
section_train() {
  [[ -x ./train_yolo ]] || { record "train" "unavailable" "./train_yolo not built"; return; }
  run_step "train demo (50 steps)" train_demo.log 120 ./train_yolo --max-batches 50 --out "$OUT/demo"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/train_demo.log" | sed 's/.*steps: //')"
  # CUDA Graphs against eager steps (issue 15): the same loss line, and the step time side by side.
  run_step "train demo, --no-graph" train_demo_eager.log 120 ./train_yolo --max-batches 50 --no-graph \
    --out "$OUT/demo_eager"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/train_demo_eager.log" | sed 's/.*steps: //')"
  cmp -s "$OUT/demo/last.weights" "$OUT/demo_eager/last.weights" && summary[-1]+=" | same weights as graphs"
  # What recording the device's activity (CUPTI, for the idle figure) costs.
  run_step "train demo, --no-idle" train_demo_no_idle.log 120 ./train_yolo --max-batches 50 --no-idle \
    --out "$OUT/demo_no_idle"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/train_demo_no_idle.log" | sed 's/.*steps: //')"
  rm -f "$OUT"/demo*/*.weights "$OUT"/demo*/*.ckpt  # not needed back
}

section_yolov3() {
  [[ -x ./train_yolo ]] || { record "yolov3" "unavailable" "./train_yolo not built"; return; }
  sed 's/^classes=80/classes=3/; s/^filters=255/filters=24/' models/yolov3.cfg >"$OUT/yolov3-shapes.cfg"
  run_step "train yolov3-416 (50 steps)" train_yolov3.log 300 ./train_yolo --cfg "$OUT/yolov3-shapes.cfg" \
    --batch 16 --subdivisions 1 --max-batches 50 --out "$OUT/yolov3" --trace "$OUT/yolov3_step.json"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/train_yolov3.log" | sed 's/.*steps: //')"
  run_step "train yolov3-416, --no-graph" train_yolov3_eager.log 300 ./train_yolo --cfg "$OUT/yolov3-shapes.cfg" \
    --batch 16 --subdivisions 1 --max-batches 20 --no-graph --out "$OUT/yolov3_eager"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/train_yolov3_eager.log" | sed 's/.*steps: //')"
  rm -f "$OUT"/yolov3/*.weights "$OUT"/yolov3/*.ckpt  # too big to fetch
}

# Data parallel through NCCL (issue 7): the demo as a launched job of one rank (NCCL's
# all-reduces on the path) against the plain run, and the NCCL tests; then two ranks sharing
# GPU 0 where NCCL allows it (2.30+, NCCL_MULTI_RANK_GPU_ENABLE=1; the NCCL tests in build/tests
# need the same variable) and that job losing rank 1 (rank 0 must stop within --comm-timeout,
# naming it).
section_nccl() {
  [[ -x ./train_yolo ]] || { record "nccl" "unavailable" "./train_yolo not built"; return; }
  run_step "demo, no communicator" dp_plain.log 60 ./train_yolo --max-batches 100 --out "$OUT/dp_plain"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_plain.log" | sed 's/.*steps: //')"
  run_step "demo, NCCL world 1" dp_nccl1.log 60 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 ./train_yolo --max-batches 100 \
    --out "$OUT/dp_nccl1"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_nccl1.log" | sed 's/.*steps: //')"
  run_step "demo, NCCL world 1, --no-graph" dp_nccl1_eager.log 60 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 ./train_yolo \
    --max-batches 100 --no-graph --out "$OUT/dp_nccl1_eager"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_nccl1_eager.log" | sed 's/.*steps: //')"
  run_step "NCCL tests, 2 ranks on gpu:0" tests_nccl.log 60 env NCCL_MULTI_RANK_GPU_ENABLE=1 build/tests -sf='*test_nccl*'
  rm -f "$OUT"/dp_*/*.weights "$OUT"/dp_*/*.ckpt
}

section_nccl2() {
  [[ -x ./train_yolo ]] || { record "nccl2" "unavailable" "./train_yolo not built"; return; }
  export NCCL_MULTI_RANK_GPU_ENABLE=1
  run_step "demo, 2 NCCL ranks on gpu:0" dp_nccl2.log 120 tools/launch_local.sh -n 2 -p "$OUT/dp_nccl2" -- \
    ./train_yolo --devices gpu:0 --max-batches 100 --out "$OUT/dp_nccl2" --trace "$OUT/dp_nccl2_step.json"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_nccl2.rank0.log" | sed 's/.*steps: //')"
  run_step "demo, 2 NCCL ranks, --no-graph" dp_nccl2_eager.log 120 tools/launch_local.sh -n 2 \
    -p "$OUT/dp_nccl2_eager" -- ./train_yolo --devices gpu:0 --max-batches 100 --no-graph --out "$OUT/dp_nccl2_eager"
  summary[-1]+=" | $(grep -m1 'the last' "$OUT/dp_nccl2_eager.rank0.log" | sed 's/.*steps: //')"
  run_step "2 NCCL ranks, rank 1 killed" dp_kill.log 90 tools/launch_local.sh -n 2 -p "$OUT/dp_kill" \
    --kill-rank 1 --kill-after 20 -- ./train_yolo --devices gpu:0 --max-batches 100000 --comm-timeout 30 \
    --out "$OUT/dp_kill"
  [[ $? -ne 0 ]] && grep -q 'rank 1' "$OUT/dp_kill.rank0.log" && summary[-1]+=" | rank 0 stopped naming rank 1 (expected)"
  unset NCCL_MULTI_RANK_GPU_ENABLE
  rm -f "$OUT"/dp_*/*.weights "$OUT"/dp_*/*.ckpt
}

# Tensor-core plans (kernels/tc_plan.h): every candidate plan of every YOLOv3 conv pass timed beside
# its predicted time, in bf16 and tf32 (the "tune summary" lines: how often the planner's choice
# was within 5% of the fastest, and the model's rms log error); the planner's table for this GPU;
# then Nsight Compute on the bf16 forward and backward-data kernels at 52x52 128->256, whose
# shared-memory wavefronts the bank model (tests/test_kernel_tc_banks.cpp) predicts free of
# conflicts (the layout before had 36% and 26% excess, ncu_*.txt in the 2026-12-04 results), and
# whose global sectors the 16-byte epilogue stores should bring near their ideal (27% and 30%
# excess before, split-K partials included).
section_tune() {
  if [[ ! -x build/bench_kernels ]]; then
    record "tune" "unavailable" "build/bench_kernels not built"
    return
  fi
  run_step "tune bf16" tune_bf16.log 60 build/bench_kernels --tune --repeats 5
  summary[-1]+=" | $(grep -m1 '^tune summary' "$OUT/tune_bf16.log" || echo 'no summary')"
  run_step "tune tf32" tune_tf32.log 40 build/bench_kernels --tune --repeats 5 --filter tf32
  summary[-1]+=" | $(grep -m1 '^tune summary' "$OUT/tune_tf32.log" || echo 'no summary')"
  run_step "plans (this GPU)" plans.log 10 build/bench_kernels --plans this
  if ! command -v ncu >/dev/null; then
    record "tune ncu" "unavailable" "ncu not on PATH"
    return
  fi
  local kernel pass
  for kernel in conv_forward_tc_kernel conv_backward_data_tc_kernel; do
    [[ $kernel == conv_forward_tc_kernel ]] && pass="fwd" || pass="bwd data"
    run_step "ncu $kernel" "ncu_$kernel.txt" 35 ncu --clock-control none --kernel-name "regex:$kernel" \
      --launch-skip 1 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis_Tables --section SourceCounters \
      build/bench_kernels --filter "conv $pass bf16 52x52 128->256 3x3 s1" --repeats 1
    summary[-1]+=" | $(grep -o 'uncoalesced shared accesses resulting in a total of [0-9]* excessive wavefronts ([0-9]*% of the' \
      "$OUT/ncu_$kernel.txt" | head -1 || true)"
    summary[-1]+=" | $(grep -o 'uncoalesced global accesses resulting in a total of [0-9]* excessive sectors ([0-9]*% of the' \
      "$OUT/ncu_$kernel.txt" | head -1 || true) | $(grep -m1 'Registers Per Thread' "$OUT/ncu_$kernel.txt" | tr -s ' ')"
  done
}

# Tensor cores: the mma.sync / ldmatrix / cp.async tests and the tensor-core conv and gemm tests,
# natively, then under memcheck and racecheck (racecheck, the slow one, by default on the TF32
# and FP16 cases: BF16 runs the same tiles with another MMA), then the benchmark's conv_tc rows
# (mma.sync ceilings in the header; every YOLOv3 conv shape, pass and precision, with cuBLAS).
section_tc() {
  # doctest filters: comma-separated, case-insensitive wildcards ('?' stands for the commas in
  # the names); "*mma*" also matches a batchnorm test ("gamma"), hence the exclusion.
  local filter='*tensor cores*,*mma*,*ldmatrix*,*cp.async*' exclude='*batchnorm*'
  local race_filter=${TC_RACECHECK_FILTER:-'*tensor cores? TF32*,*tensor cores? FP16*,*ldmatrix*,*cp.async*'}
  if [[ -x build/tests ]]; then
    run_step "tc tests (native)" tc_tests.log 45 build/tests -tc="$filter" -tce="$exclude"
    tail -n 1 "$OUT/tc_tests.log" | grep -q '^tests:' && summary[-1]+=" | $(tail -n 1 "$OUT/tc_tests.log")"
    if command -v compute-sanitizer >/dev/null; then
      run_step "tc memcheck" tc_memcheck.log 75 compute-sanitizer --tool memcheck --error-exitcode 99 \
        build/tests -tc="$filter" -tce="$exclude"
      summary[-1]+=" | $(grep -m1 -E 'ERROR SUMMARY' "$OUT/tc_memcheck.log" || echo 'no summary')"
      run_step "tc racecheck" tc_racecheck.log 105 compute-sanitizer --tool racecheck --error-exitcode 99 \
        build/tests -tc="$race_filter" -tce="$exclude"
      summary[-1]+=" | $(grep -m1 -E 'RACECHECK SUMMARY' "$OUT/tc_racecheck.log" || echo 'no summary')"
    else
      record "tc compute-sanitizer" "unavailable" "not on PATH"
    fi
  else
    record "tc tests" "unavailable" "build/tests not built"
  fi
  if [[ -x build/bench_kernels ]]; then
    run_step "bench conv_tc" bench_tc.log 60 build/bench_kernels --filter conv_tc
    summary[-1]+=" | $(grep -m1 '^mma.sync ceilings' "$OUT/bench_tc.log") | $(grep -m1 '^cuBLAS yardstick' "$OUT/bench_tc.log")"
    summary[-1]+=" | $(grep -m1 '^conv_tc bf16 against cuBLAS' "$OUT/bench_tc.log" || echo 'no verdict line')"
  else
    record "bench conv_tc" "unavailable" "not built"
  fi
}

# Ours against the PyTorch peer (tools/peer/torch_yolov3.py: the same cfg, network, loss and
# SGD in PyTorch eager, channels_last, cudnn.benchmark), YOLOv3-416 batch 16 first, then the demo
# net (160, batch 16) while the budget lasts. YOLOv3's cfg as `yolov3` makes it (heads at the
# synthetic set's 3 classes; the peer gets --classes 3, the same network), plus random=0: one
# input size, 416, for both. Ours: fp32, tf32, bf16 and fp16 (dynamic loss scaling from 2^16:
# its first steps skip for overflow), 36 steps (demo: 120) on runs/shapes (200 images: epochs
# of 12 steps), the median step of the epochs after the first (epoch 1 holds the warm-up), data
# loading included. The peer: fp32 (no TF32), tf32, bf16 autocast, fp16 autocast with
# GradScaler; 5 warm-up steps (cudnn.benchmark picks its algorithms there), then 30 (YOLOv3) or
# 50 (demo) steps timed with CUDA events, on one batch of random images and boxes already on
# the GPU, the median step; then YOLOv3 in bf16 under torch.compile (--compile: its first step
# compiles, reported apart). Our runs write --timeline (the 4th-6th steps' kernels from CUPTI,
# replayed graphs) and tools/timeline_summary.py says the device's busy and idle time in each
# and the gap at each step boundary (timeline_NET_PREC.txt; the gaps on the summary line). The whole section keeps within
# PEER_BUDGET seconds (360): each step's timeout is what is left (a step with under 15 s left is
# skipped), and the peer skips the precisions that would overrun
# (--budget-s).
declare -A peer_ours=() peer_torch=() peer_compiled=()
peer_deadline=0
peer_step() {  # name, log file, timeout seconds, command...: run_step within the section's budget
  local name=$1 log=$2 limit=$3
  shift 3
  local left=$((peer_deadline - SECONDS))
  if ((left < ${peer_min:-15})); then
    record "$name" "skipped" "the section's ${PEER_BUDGET:-360} s are spent"
    return 124
  fi
  ((limit > left)) && limit=$left
  run_step "$name" "$log" "$limit" "$@"
}
# Our images/s, ms per step, data wait and "other" from a training log, as medians over the epochs
# >= 2 of "train_yolo: epoch N: loss L; X img/s; a step T ms = data wait D + ... + other R", else
# the final "train_yolo: the last K steps: X img/s; a step T ms = ..."; nothing if neither.
ours_rate() {  # log, batch
  awk -v batch="$2" '
    function median(a, n,   i, j, t) {
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    /^train_yolo: epoch [0-9]+: loss [^;]+; [0-9.e+]+ img\/s; a step / {
      if ($3 + 0 >= 2) { n++; ms[n] = $10; dw[n] = $15; ot[n] = $31 + 0 }
      next
    }
    /^train_yolo: the last [0-9]+ steps: [0-9.e+]+ img\/s; a step / { last = $6; lms = $10; ldw = $15; lot = $31 + 0 }
    END {
      if (n) { m = median(ms, n); printf "%.1f %.1f %.1f %.1f\n", batch * 1000 / m, m, median(dw, n), median(ot, n) }
      else if (last != "") printf "%.1f %.1f %.1f %.1f\n", last, lms, ldw, lot
    }' "$1"
}
# The peer's "peer: PRECISION X img/s (T ms/step) ... median M ms" line: "R M" (R: images/s at the
# median step time, batch $3), or its skip/failure reason. PRECISION may be e.g. bf16+compile.
peer_rate() {  # log, precision, batch
  local line
  line=$(grep -m1 -F "peer: $2 " "$1" 2>/dev/null) || return 0
  if [[ $line =~ img/s\ \(([0-9.]+)\ ms/step\).*median\ ([0-9.]+)\ ms ]]; then
    awk -v b="$3" -v m="${BASH_REMATCH[2]}" 'BEGIN { printf "%.1f %.2f\n", (m > 0 ? b * 1000 / m : 0), m }'
  elif [[ $line == *skipped* ]]; then echo "skipped"
  else echo "failed"; fi
}
# A run's device timeline (--timeline $OUT/NAME.json): tools/timeline_summary.py into NAME.txt, and
# the gaps at its step boundaries (ms) on the summary line.
timeline_gaps() {  # name
  [[ -f "$OUT/$1.json" ]] && command -v python3 >/dev/null || return 0
  python3 tools/timeline_summary.py "$OUT/$1.json" >"$OUT/$1.txt" 2>&1
  summary[-1]+=" | step boundary gap $(awk 'NR > 1 && $5 != "-" { g = g (g ? ", " : "") $5 } END { print (g ? g : "-") }' \
    "$OUT/$1.txt") ms"
}
peer_net() {  # name, our cfg, size, our steps, peer steps, seconds to leave for what follows, compile (0/1), peer cfg args...
  local net=$1 cfg=$2 size=$3 our_steps=$4 steps=$5 reserve=$6 compile=$7
  shift 7
  local prec log status
  for prec in fp32 tf32 bf16 fp16; do
    log="peer_ours_${net}_$prec.log"
    peer_step "ours $net $prec" "$log" 60 ./train_yolo --cfg "$cfg" --size "$size" --batch 16 --subdivisions 1 \
      --max-batches "$our_steps" --precision "$prec" --out "$OUT/peer_runs/${net}_$prec" \
      --timeline "$OUT/timeline_${net}_$prec.json"
    timeline_gaps "timeline_${net}_$prec"
    if [[ -f "$OUT/$log" ]]; then
      peer_ours[$net.$prec]=$(ours_rate "$OUT/$log" 16)
      [[ -n ${peer_ours[$net.$prec]} ]] && summary[-1]+=" | $(awk '{printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4}' <<<"${peer_ours[$net.$prec]}")"
    fi
    rm -f "$OUT/peer_runs/${net}_$prec/"*.weights "$OUT/peer_runs/${net}_$prec/"*.ckpt
  done
  if ((compile)); then  # look-ahead's effect: the same bf16 run with each step queued after the read
    log="peer_ours_${net}_bf16_in_turn.log"
    peer_step "ours $net bf16 --no-look-ahead" "$log" 60 ./train_yolo --cfg "$cfg" --size "$size" --batch 16 \
      --subdivisions 1 --max-batches "$our_steps" --precision bf16 --no-look-ahead \
      --out "$OUT/peer_runs/${net}_bf16_in_turn" --timeline "$OUT/timeline_${net}_bf16_in_turn.json"
    [[ -f "$OUT/$log" ]] && summary[-1]+=" | $(ours_rate "$OUT/$log" 16 |
      awk '{printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4}')"
    timeline_gaps "timeline_${net}_bf16_in_turn"
    rm -f "$OUT/peer_runs/${net}_bf16_in_turn/"*.weights "$OUT/peer_runs/${net}_bf16_in_turn/"*.ckpt
  fi
  if ! command -v python3 >/dev/null; then
    record "peer $net" "unavailable" "python3 not on PATH"
    return
  fi
  log="peer_torch_$net.log"
  local left=$((peer_deadline - SECONDS - reserve))
  ((left < 15)) && left=15  # peer_step still skips it when the whole budget is spent
  peer_step "peer $net (PyTorch)" "$log" "$left" python3 tools/peer/torch_yolov3.py "$@" --size "$size" --batch 16 \
    --device cuda --precisions fp32,tf32,bf16,fp16 --warmup 5 --steps "$steps" --budget-s $((left - 5))
  status=$?
  if ((status == 3)); then
    summary[-1]=$(printf '%-28s %-12s %s' "peer $net (PyTorch)" "unavailable" "$(grep -m1 'unavailable' "$OUT/$log")")
  elif [[ -f "$OUT/$log" ]]; then
    summary[-1]+=" | $(grep -m1 -o 'loss [a-z]*[^;]*' "$OUT/$log" | cut -c1-60)"
  fi
  for prec in fp32 tf32 bf16 fp16; do peer_torch[$net.$prec]=$(peer_rate "$OUT/$log" "$prec" 16); done
  ((compile)) || return
  # torch.compile in bf16 (the issue's yardstick); its compile time is reported apart.
  log="peer_torch_compiled_$net.log"
  left=$((peer_deadline - SECONDS - reserve))
  ((left < 15)) && left=15
  peer_step "peer $net (torch.compile)" "$log" "$left" python3 tools/peer/torch_yolov3.py "$@" --size "$size" \
    --batch 16 --device cuda --precisions bf16 --compile --warmup 5 --steps "$steps"
  [[ -f "$OUT/$log" ]] && summary[-1]+=" | $(grep -m1 -o 'compiled (default) in [0-9.]* s' "$OUT/$log")"
  peer_compiled[$net.bf16]=$(peer_rate "$OUT/$log" "bf16+compile" 16)
}
section_peer() {
  [[ -x ./train_yolo ]] || { record "peer" "unavailable" "./train_yolo not built"; return; }
  peer_deadline=$((SECONDS + ${PEER_BUDGET:-360}))
  trainer_yolov3_cfg yolov3-peer.cfg
  peer_net yolov3 "$OUT/yolov3-peer.cfg" 416 36 30 50 1 --cfg models/yolov3.cfg --classes 3
  peer_net demo models/demo.cfg 160 120 50 0 0 --cfg models/demo.cfg
  {
    echo "ours vs PyTorch (tools/peer/torch_yolov3.py): full training steps, batch 16, images/s at the median" \
      "step; ratio = ours / PyTorch (eager; compiled: torch.compile, bf16)"
    printf '%-7s %-9s %11s %11s %7s %13s %7s   %-32s %s\n' net precision "ours img/s" "eager img/s" ratio \
      "compiled" ratio "ours ms/step (data wait, other)" "eager / compiled ms/step"
    local net prec ours torch comp o_rate o_ms o_dw o_other t_rate t_ms c_rate c_ms ratio c_ratio
    ratio_of() { [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }' || echo -; }
    for net in yolov3 demo; do
      for prec in fp32 tf32 bf16 fp16; do
        ours=${peer_ours[$net.$prec]:-} torch=${peer_torch[$net.$prec]:-} comp=${peer_compiled[$net.$prec]:-}
        [[ -z $ours && -z $torch ]] && continue
        read -r o_rate o_ms o_dw o_other <<<"${ours:--}"
        read -r t_rate t_ms <<<"${torch:--}"
        read -r c_rate c_ms <<<"${comp:--}"
        ratio=$(ratio_of "$o_rate" "$t_rate")
        c_ratio=$(ratio_of "$o_rate" "$c_rate")
        printf '%-7s %-9s %11s %11s %7s %13s %7s   %-32s %s\n' "$net" "$prec" "$o_rate" "$t_rate" "$ratio" \
          "$c_rate" "$c_ratio" "${o_ms:+$o_ms ($o_dw, $o_other)}" "${t_ms:-} / ${c_ms:-}"
        record "side by side $net $prec" "table" \
          "img/s ours ${o_rate} | eager ${t_rate} | ratio ${ratio} | compiled ${c_rate} | ratio ${c_ratio}"
      done
    done
    echo "ours: median over epochs >= 2 (12 steps each) on runs/shapes, data loading included; PyTorch: median" \
      "step, one batch resident on the GPU (logs: $OUT/peer_*.log)"
  } >"$OUT/peer_table.txt"
  rm -rf "$OUT/peer_runs"
}

# BatchNorm's recomputing backward and the folded shortcuts (docs/perf.md has the prediction:
# 0.8-1.7 ms off the YOLOv3-416 bf16 step; the recompute at about 3/4 of the reading backward).
section_fold() {
  if [[ -x build/tests ]]; then  # the loads' BatchNorm against the unfused pair, bit for bit, natively
    run_step "BatchNorm in the loads (native)" fold_tests.log 120 build/tests \
      -tc="*BatchNorm's apply has*,*BatchNorm applied in the loads*,*normalized conv input*"
  else
    record "BatchNorm in the loads (native)" "unavailable" "build/tests not built"
  fi
  if [[ -x build/bench_kernels ]]; then
    run_step "bench bn+leaky bwd" bench_fold.log 90 build/bench_kernels --filter "bn+leaky bwd" --batch 16
  else
    record "bench bn+leaky bwd" "unavailable" "not built"
  fi
  [[ -x ./train_yolo ]] || { record "fold" "unavailable" "./train_yolo not built"; return; }
  trainer_yolov3_cfg yolov3-fold.cfg
  local mode log flags
  for mode in fold no-load-fold no-fold; do
    log="fold_yolov3_$mode.log"
    flags=()
    [[ $mode != fold ]] && flags=("--$mode")
    run_step "yolov3 bf16 $mode" "$log" 90 ./train_yolo --cfg "$OUT/yolov3-fold.cfg" --size 416 --batch 16 \
      --subdivisions 1 --max-batches 36 --precision bf16 "${flags[@]}" --out "$OUT/fold_runs/$mode"
    [[ -f "$OUT/$log" ]] && summary[-1]+=" | $(ours_rate "$OUT/$log" 16 |
      awk '{printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4}')"
    rm -f "$OUT/fold_runs/$mode/"*.weights "$OUT/fold_runs/$mode/"*.ckpt
  done
}

# BatchNorm applied in the loads, per layer: each bf16 forward and weight gradient of YOLOv3-416
# beside the same reading its input through BatchNorm (docs/perf.md has the prediction: the
# transform hides behind the tensor cores, or those passes slow by up to a third).
section_fold_convs() {
  [[ -x build/bench_kernels ]] || { record "fold_convs" "unavailable" "build/bench_kernels not built"; return; }
  run_step "bench conv fwd +bn" bench_fold_fwd.log 120 build/bench_kernels --filter "conv fwd bf16" --normalized
  run_step "bench conv wgrad +bn" bench_fold_wgrad.log 120 build/bench_kernels --filter "conv bwd weights bf16" \
    --normalized
}

# Look-ahead where it was missing before (docs/perf.md has the predictions): micro-batches (the
# stock cfg's 16 a step: one host round trip each without it) and fp16's loss scale on the GPU.
section_lookahead() {
  [[ -x ./train_yolo ]] || { record "lookahead" "unavailable" "./train_yolo not built"; return; }
  trainer_yolov3_cfg yolov3-lookahead.cfg
  local run mode log flags batch args precision
  for run in "bf16 64/16" "fp16 16/1"; do
    read -r precision batch <<<"$run"
    args=(--batch "${batch%/*}" --subdivisions "${batch#*/}")
    for mode in ahead in-turn; do
      log="lookahead_${precision}_$mode.log"
      flags=()
      [[ $mode == in-turn ]] && flags=(--no-look-ahead)
      run_step "yolov3 $precision $batch $mode" "$log" 120 ./train_yolo --cfg "$OUT/yolov3-lookahead.cfg" --size 416 \
        "${args[@]}" --max-batches 24 --precision "$precision" "${flags[@]}" --out "$OUT/lookahead_runs/$mode"
      [[ -f "$OUT/$log" ]] && summary[-1]+=" | $(ours_rate "$OUT/$log" "${batch%/*}" |
        awk '{printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4}')"
      rm -f "$OUT/lookahead_runs/$mode/"*.weights "$OUT/lookahead_runs/$mode/"*.ckpt
    done
  done
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; nvidia-smi -L; } >"$OUT/gpu.txt" 2>&1 || true
for s in "${sections[@]}"; do
  start=$SECONDS
  "section_$s"
  echo "section $s: $((SECONDS - start)) s" >>"$OUT/sections.txt"
done

echo
cat "$OUT/gpu.txt"
echo
[[ -f "$OUT/bench_kernels.log" ]] && cat "$OUT/bench_kernels.log" && echo
[[ -f "$OUT/bench_loader.log" ]] && cat "$OUT/bench_loader.log" && echo
[[ -f "$OUT/bench_tc.log" ]] && cat "$OUT/bench_tc.log" && echo
[[ -f "$OUT/bench_fold.log" ]] && cat "$OUT/bench_fold.log" && echo
[[ -f "$OUT/bench_targets.log" ]] && cat "$OUT/bench_targets.log" && echo
[[ -f "$OUT/bench_wgmma.log" ]] && grep -E "fwd bf16|^op " "$OUT/bench_wgmma.log" && echo
[[ -f "$OUT/bench_wgmma_bwd.log" ]] && grep -E "bwd data bf16|^op " "$OUT/bench_wgmma_bwd.log" && echo
[[ -f "$OUT/bench_wgmma_wgrad.log" ]] && grep -E "bwd weights bf16|^op " "$OUT/bench_wgmma_wgrad.log" && echo
[[ -f "$OUT/bench_tf32_fwd.log" ]] && grep -E "fwd tf32|^op " "$OUT/bench_tf32_fwd.log" && echo
[[ -f "$OUT/bench_tf32_bwd.log" ]] && grep -E "bwd data tf32|^op " "$OUT/bench_tf32_bwd.log" && echo
[[ -f "$OUT/peer_table.txt" ]] && cat "$OUT/peer_table.txt" && echo
cat "$OUT/sections.txt"
printf '%-28s %-12s %s\n' "step" "status" "detail"
printf '%s\n' "${summary[@]}"
