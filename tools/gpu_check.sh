#!/usr/bin/env bash
# The one prepared run for a GPU machine (DESIGN.md, "On a GPU"), in sections that each take a
# few minutes at most, so that one device call of under 6 minutes covers exactly what a change
# touched and leaves time for a rerun:
#   tools/gpu_check.sh OUTDIR verdict              the verdict: one device call, under 7 minutes
#   tools/gpu_check.sh OUTDIR                      every section but the verdict (about 75 minutes)
#   tools/gpu_check.sh OUTDIR tests train nccl     these, in this order
#   GPU_CHECK_EMULATED=1 tools/gpu_check.sh OUTDIR verdict   the verdict on the emulated build (CI)
#
#   verdict    issue 50: what a device call of 15 minutes (start-up included) must answer, in
#              priority order, within VERDICT_BUDGET seconds (400): each step's timeout is its own
#              bound or what is left of the budget less VERDICT_RESERVE (10 s, for the summary),
#              whichever is less; a step with under 5 s left is "skipped (budget spent)". Always
#              ends with OUTDIR/verdict.json (each step's name, status, seconds, figure; the
#              targets) and a one-screen table, also after a failed, hung or skipped step (and
#              verdict.json is rewritten after every step). Compiles nothing. Predicted per step on
#              an H100/H200 before any run, start-ups included (about a minute of them: CUDA
#              contexts, torch's import, NCCL's init), in priority order:
#                 step                                     predicted
#   verdict 0     dataset (synthetic shapes)                     6 s   runs/shapes, when absent
#   verdict 1     list devices                                   3 s
#   verdict 1     wgmma self-check, tf32 probe                   8 s   the 42 cases; probes
#   verdict 2     GPU-path tests (native)                       35 s   since 121aa79, -tc filters
#   verdict 2     wgmma under racecheck                         45 s   the Hopper tests
#   verdict 2     wgmma under synccheck                         20 s
#   verdict 3     ours default                                  15 s   YOLOv3-416 bf16 b16, stock
#   verdict 3     ours YOLO_WGMMA=off                           15 s   cfg (80 classes), 36 steps
#   verdict 3     ours YOLO_WGMMA_PERSISTENT=off                15 s
#   verdict 3     ours --no-load-fold                           15 s
#   verdict 3     peer eager                                    30 s   PyTorch bf16, same network
#   verdict 3     peer torch.compile                            80 s   compile time included
#   verdict 4     2 ranks, overlapped                           12 s   NCCL, 2 ranks on gpu:0
#   verdict 4     2 ranks, --no-overlap                         12 s
#   verdict 5     conv_tc vs cuBLAS                             60 s   the bf16 rows' verdict
#   verdict 6     ours 3-class cfg                              15 s   as earlier GPU runs trained
#   verdict 7     lost rank saves                               35 s   issue 54: rank 1 killed, rank 0
#                                                                      saves (while the budget lasts)
#                 summary (VERDICT_RESERVE)                     10 s
#                 total                                        431 s   (7 min 11 s; the last step
#                                                                      then runs only if others are quicker)
#              Targets on the table: the default row >= 650 img/s; >= 1.5x the compiled peer (713
#              img/s when it ran 475); bench_kernels' conv_tc verdict (met / not met / incomplete).
#              The stock cfg trains as users train it (80 classes, so the 255-filter heads whose
#              weights 1c50064 aligned) on the synthetic images labelled into 80 classes
#              (OUTDIR/shapes80.data), at one size (random=0: the figure is at 416, as the peer's).
#              Two ranks: NCCL from YOLO_NCCL_LIB, else BUNDLE_NCCL, else the bundle's
#              nccl/libnccl.so.2 (make gpu-bundle), else Python's (2.28 refuses two ranks a GPU).
#              GPU_CHECK_EMULATED=1: build/train_yolo_emu on emu:0 (two ranks: emu:0,1 in one
#              process) and build/tests_emu, models/demo.cfg at 32x32, fp32, batch 1, one step,
#              small test filters; compute-sanitizer, cuBLAS (unless GPU_CHECK_BENCH names a
#              bench_kernels) and the peer's GPU are "unavailable" there
#              (tools/gpu_check_emulated_test.sh runs it in make test). GPU_CHECK_TRAIN,
#              GPU_CHECK_TESTS, GPU_CHECK_BENCH: other binaries for ./train_yolo, build/tests,
#              build/bench_kernels (paths from the repository's root, or absolute).
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
#   lookahead  YOLOv3-416 as the stock cfg trains it (batch 64, 16 micro-batches a step) in bf16,
#              and batch 16 in fp16 (the T4's precision, loss scale on the GPU), each with
#              look-ahead (default) and with --no-look-ahead, medians                   ~5 min
#   (targets, issue 36's conv verdict and 650 img/s step, is part of the verdict now)
# Writes full logs to OUTDIR and prints a summary table last. A tool that is missing is
# reported as unavailable, not as a failure. Needs the binaries built beforehand (here or
# elsewhere: `make ARCH=90 all build/tests`, which builds sm_90a code; or `make gpu-bundle`).
set -u
all_sections=(tests sanitizer bench loader train yolov3 nccl nccl2 tc tune peer fold fold_convs lookahead wgmma
  wgmma_bwd wgmma_step)
usage="usage: tools/gpu_check.sh OUTDIR [verdict | SECTION ...]; sections: ${all_sections[*]}"
OUT=${1:?$usage}
shift
sections=("$@")
(( ${#sections[@]} )) || sections=("${all_sections[@]}")
for s in "${sections[@]}"; do
  if [[ $s == verdict ]]; then
    (( ${#sections[@]} == 1 )) || { echo "verdict runs alone (it keeps to one budget); $usage" >&2; exit 2; }
  elif [[ $s == targets ]]; then
    echo "targets is part of verdict now (tools/gpu_check.sh OUTDIR verdict); $usage" >&2
    exit 2
  elif [[ " ${all_sections[*]} " != *" $s "* ]]; then
    echo "unknown section '$s'; $usage" >&2
    exit 2
  fi
done
emulated=0
if [[ ${GPU_CHECK_EMULATED:-0} == 1 ]]; then
  [[ ${sections[0]} == verdict ]] || { echo "GPU_CHECK_EMULATED=1 runs the verdict only" >&2; exit 2; }
  emulated=1
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the steps run from the repository's root
cd "$(dirname "$0")/.." || exit 2

# The binaries the steps run (the emulated build's under GPU_CHECK_EMULATED=1), and the devices
# the trainer is given (none: its default, every GPU).
if ((emulated)); then
  TRAIN=${GPU_CHECK_TRAIN:-build/train_yolo_emu} TESTS=${GPU_CHECK_TESTS:-build/tests_emu}
  BENCH=${GPU_CHECK_BENCH:-} DEVICES=(--devices emu:0)
else
  TRAIN=${GPU_CHECK_TRAIN:-./train_yolo} TESTS=${GPU_CHECK_TESTS:-build/tests}
  BENCH=${GPU_CHECK_BENCH:-build/bench_kernels} DEVICES=()
fi

# Every step's record, in the order run: name, status (ok, FAILED(N), TIMEOUT, unavailable,
# skipped (budget spent)), seconds, log file, the summary line's detail, and the figure the
# verdict reports (verdict.json).
s_name=() s_status=() s_secs=() s_log=() s_detail=() s_figure=()
record() {  # name, status, detail, [seconds], [log file]
  s_name+=("$1") s_status+=("$2") s_detail+=("$3") s_secs+=("${4:-}") s_log+=("${5:-}") s_figure+=("")
}
note() { s_detail[-1]+=" | $*"; }        # more about the last step, on its summary line
figure() {  # the last step's figure, on its line and in verdict.json (none for a step not run)
  [[ ${s_status[-1]} == skipped* ]] && return
  s_figure[-1]=$1
  note "$1"
}
restatus() { s_status[-1]=$1; s_detail[-1]=$2; }  # status, detail

# Libraries loaded at run time. NCCL: the bundle's build (make gpu-bundle: 2.30+, which lets two
# ranks share a GPU) when nothing names one, else the one inside Python's nvidia packages, on
# machines where it only ships there.
if [[ -z "${YOLO_NCCL_LIB:-}" ]]; then
  if [[ -n "${BUNDLE_NCCL:-}" && -f "$BUNDLE_NCCL" ]]; then export YOLO_NCCL_LIB="$BUNDLE_NCCL"
  elif [[ -f nccl/libnccl.so.2 ]]; then export YOLO_NCCL_LIB="$PWD/nccl/libnccl.so.2"
  elif command -v python3 >/dev/null; then
    dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [[ -n "$dir" && -d "$dir" ]] && export YOLO_NCCL_LIB="$dir"
  fi
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
if [[ -z "${YOLO_CUBLAS_LIB:-}" ]] && ((!emulated)); then
  dir=$(python_lib_dir nvidia.cublas 'libcublas.so*')
  [[ -n "$dir" && -d "$dir" ]] && export YOLO_CUBLAS_LIB="$dir"
fi
# CUPTI (the split's device idle time, runtime/activity.h): the toolkit's when it has one, else
# Python's nvidia-cuda-cupti package (a folder: the loader opens libcupti.so.13 in it).
if [[ -z "${YOLO_CUPTI_LIB:-}" ]] && ((!emulated)) &&
  ! ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 >/dev/null 2>&1; then
  dir=$(python_lib_dir nvidia.cuda_cupti 'libcupti.so.13')
  [[ -n "$dir" && -d "$dir" ]] && export YOLO_CUPTI_LIB="$dir"
fi

# YOLOv3's cfg as the trainer runs it on runs/shapes: heads at 3 classes (24 filters), and one
# input size (random=0), in $OUT/NAME.
trainer_yolov3_cfg() {  # name
  sed 's/^classes=80/classes=3/; s/^filters=255/filters=24/; s/^random=1/random=0/' models/yolov3.cfg >"$OUT/$1"
}
# YOLOv3-416 at batch 16 as the step figures take it: one step of 16 images, 36 steps (3 epochs of
# runs/shapes' 200 images; the rate is the median step of epochs 2 and 3).
yolo416=(--size 416 --subdivisions 1 --max-batches 36)

# A deadline that run_step keeps to (in $SECONDS; 0: none), the least time it starts a step with,
# and what a step past it is recorded as; the peer section and the verdict set them.
budget_deadline=0 budget_min=5 budget_status="skipped (budget spent)" budget_why="budget spent"
kill_grace=3  # seconds from a step's SIGTERM to its SIGKILL (for a step that ignores the first)
# The step under way (its timeout's pid, name, start), for a trap that must stop it.
step_pid="" step_name="" step_start=0

run_step() {  # name, log file, timeout seconds, command...
  local name=$1 log=$2 limit=$3 cut=""
  shift 3
  rm -f "$OUT/$log"  # never read an earlier run's log for this one
  if ((budget_deadline)); then  # the step ends by the deadline, even one that must be killed
    local left=$((budget_deadline - SECONDS - kill_grace))
    if ((left < budget_min)); then
      record "$name" "$budget_status" "$budget_why" 0
      return 125
    fi
    ((limit > left)) && limit=$left cut=" (what the budget left)"
  fi
  # In the background and waited for, so that a trapped signal is handled at once, not after it.
  step_name=$name step_start=$SECONDS
  timeout -k "$kill_grace" "$limit" "$@" >"$OUT/$log" 2>&1 &
  step_pid=$!
  { wait "$step_pid"; } 2>/dev/null  # (bash's "Killed" notice for a step past its SIGKILL: the record says it)
  local status=$?
  step_pid=""
  local took=$((SECONDS - step_start))
  if ((status == 0)); then record "$name" "ok" "${took}s, $OUT/$log" "$took" "$log"
  elif ((status == 124 || (status == 137 && took >= limit))); then
    record "$name" "TIMEOUT" "after ${limit}s$cut, $OUT/$log" "$took" "$log"
  else record "$name" "FAILED($status)" "${took}s, $OUT/$log" "$took" "$log"; fi
  return $status
}

# Our images/s, ms per step, data wait, "other" and exposed communication from a training log, as
# medians over the epochs >= 2 of "train_yolo: epoch N: loss L; X img/s; a step T ms = data wait D
# + forward F + backward B + exposed comm C + optimizer O + other R", else the final "train_yolo:
# the last K steps: X img/s; a step T ms = ..."; nothing if neither.
ours_rate() {  # log, batch
  awk -v batch="$2" '
    function median(a, n,   i, j, t) {
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    /^train_yolo: epoch [0-9]+: loss [^;]+; [0-9.e+]+ img\/s; a step / {
      if ($3 + 0 >= 2) { n++; ms[n] = $10; dw[n] = $15; cm[n] = $25; ot[n] = $31 + 0 }
      next
    }
    /^train_yolo: the last [0-9]+ steps: [0-9.e+]+ img\/s; a step / {
      last = $6; lms = $10; ldw = $15; lcm = $25; lot = $31 + 0
    }
    END {
      if (n) {
        m = median(ms, n)
        printf "%.1f %.1f %.1f %.1f %.1f\n", batch * 1000 / m, m, median(dw, n), median(ot, n), median(cm, n)
      } else if (last != "") printf "%.1f %.1f %.1f %.1f %.1f\n", last, lms, ldw, lot, lcm
    }' "$1"
}
rate_text() {  # ours_rate's fields
  awk '{ printf "%s img/s, %s ms/step (data wait %s, other %s)", $1, $2, $3, $4 }' <<<"$1"
}
# One training run of ours as a step: run_step, then its rate on the summary line (last_rate:
# ours_rate's fields, empty when the log has none); its weights and checkpoint are removed (too big
# to fetch). Its run folder is $OUT/runs/LOG (without .log).
last_rate=""
ours_run() {  # name, log file, timeout, batch, "VAR=value ..." for its environment (or ""), trainer args...
  local name=$1 log=$2 limit=$3 batch=$4 vars status
  read -ra vars <<<"$5"
  shift 5
  local out="$OUT/runs/${log%.log}"
  run_step "$name" "$log" "$limit" env "${vars[@]}" "$TRAIN" "${DEVICES[@]}" --batch "$batch" "$@" --out "$out"
  status=$?
  last_rate=""
  [[ -f "$OUT/$log" ]] && last_rate=$(ours_rate "$OUT/$log" "$batch")
  [[ -n $last_rate ]] && note "$(rate_text "$last_rate")"
  rm -f "$out"/*.weights "$out"/*.ckpt
  return $status
}

# Two ranks of ours sharing one device: NCCL ranks on gpu:0 through tools/launch_local.sh (NCCL
# 2.30+ allows it with NCCL_MULTI_RANK_GPU_ENABLE=1) or, emulated, two emulated GPUs as threads of
# one process (how the emulated build runs replicas). Either way rank 0's output is in
# $OUT/PREFIX.rank0.log.
two_ranks() {  # name, prefix, timeout, trainer args...
  local name=$1 prefix=$2 limit=$3
  shift 3
  if ((emulated)); then
    run_step "$name" "$prefix.rank0.log" "$limit" "$TRAIN" --devices emu:0,1 "$@" --out "$OUT/$prefix"
  else
    run_step "$name" "$prefix.log" "$limit" env NCCL_MULTI_RANK_GPU_ENABLE=1 tools/launch_local.sh -n 2 \
      -p "$OUT/$prefix" -- "$TRAIN" --devices gpu:0 "$@" --out "$OUT/$prefix"
  fi
}

# bench_kernels' conv_tc rows (each pass and precision, the planner's kernels, cuBLAS beside) and
# its verdict on the bf16 rows against issue 36's targets (tools/cublas_verdict.h: each within
# 1.25x of cuBLAS, the median within 1.1x, the sum within 1.15x); conv_verdict: met, not met or
# incomplete (a missing row or cuBLAS time, or no verdict line).
conv_verdict=""
bench_conv_tc() {  # name, log file, timeout
  run_step "$1" "$2" "$3" "$BENCH" --filter conv_tc
  local line
  line=$(grep -m1 '^conv_tc bf16 against cuBLAS' "$OUT/$2" 2>/dev/null)
  case $line in
    *": targets met"*) conv_verdict="met" ;;
    *": targets not met"*) conv_verdict="not met" ;;
    *) conv_verdict="incomplete" ;;
  esac
  figure "${line:-no verdict line}"
}

section_tests() {
  run_step "list devices" devices.log 60 "$TRAIN" --list-devices
  run_step "tests (native)" tests.log 120 "$TESTS"
  tail -n 1 "$OUT/tests.log" | grep -q '^tests:' && note "$(tail -n 1 "$OUT/tests.log")"
  # The TF32 twin (round_to_tf32) against the device on all 2^32 patterns: the mismatch count
  # and the first mismatch, if any.
  run_step "tf32 sweep (2^32 patterns)" tf32_sweep.log 60 env YOLO_TF32_SWEEP=all "$TESTS" \
    -tc='*to_tf32 on the device equals round_to_tf32*'
  note "$(grep -m1 -o 'to_tf32 sweep: [^;]*\(; 0x[^;]*\)\?' "$OUT/tf32_sweep.log" || echo 'no sweep line')"
}

# The Hopper tests (doctest filters): the warpgroup tests and gemm_nt_wgmma's, TMA's maps and its
# im2col mode, the wgmma convolutions (persistent blocks included), the tensor-core convolutions
# and conv moments, the planner, named barriers; the ones compute-sanitizer checks; and the
# self-check's cases one by one, the TF32 probe and the swizzled-base probe, whose lines
# wgmma_probe_text reads.
wgmma_tests='*wgmma*,tensor maps*,tma im2col*,kernel: conv2d on tensor cores*,conv moments*,tc plan*,*named barriers*'
wgmma_sanitized_tests='*wgmma*,tma im2col*'
wgmma_probe_tests='*wgmma self-check passes every case*,*wgmma TF32 probe*,*boxes of a slice only 16-byte aligned*'
# Issue 49's questions from a log of those tests, as one line: the self-check's cases (ok and
# not), how the tensor cores read a raw FP32 operand in TF32 (32: truncated, as the twins assume;
# 32.03125: rounded), and whether swizzled TMA boxes need the 128-byte aligned base the encoder
# asks for.
wgmma_probe_text() {  # log file
  echo "self-check: $(grep -c 'self-check: .*: ok$' "$OUT/$1" 2>/dev/null) ok," \
    "$(grep -s 'self-check: ' "$OUT/$1" | grep -vc ': ok$') not" \
    "| $(grep -m1 -o 'tf32 probe: [^"]*' "$OUT/$1" 2>/dev/null || echo 'no tf32 probe line')" \
    "| $(grep -m1 -o 'swizzled im2col boxes from a base[^"]*' "$OUT/$1" 2>/dev/null || echo 'no base probe line')"
}
# compute-sanitizer's racecheck and synccheck over the Hopper tests.
wgmma_sanitizers() {  # racecheck's timeout, synccheck's
  local tool limit why=""
  if ((emulated)); then why="hardware only (an emulated run)"
  elif ! command -v compute-sanitizer >/dev/null; then why="compute-sanitizer not on PATH"; fi
  for tool in racecheck synccheck; do
    [[ -n $why ]] && { record "wgmma under $tool" "unavailable" "$why"; continue; }
    limit=$1
    [[ $tool == synccheck ]] && limit=$2
    run_step "wgmma under $tool" "wgmma_$tool.log" "$limit" \
      compute-sanitizer --tool "$tool" --error-exitcode 99 "$TESTS" -tc="$wgmma_sanitized_tests"
    figure "$(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$OUT/wgmma_$tool.log" || echo 'no summary')"
  done
}

# The first question the hardware answers for stage 2 (issue 36): do the descriptor, swizzle,
# fragment and mbarrier facts the emulated twins follow hold on an H100/H200?
section_wgmma() {
  run_step "wgmma tests (native)" wgmma.log 120 "$TESTS" -tc="$wgmma_tests"
  note "$(tail -n 1 "$OUT/wgmma.log")"
  note "$(wgmma_probe_text wgmma.log)"
  wgmma_sanitizers 90 90
  run_step "SASS check, sm_90a" sass_wgmma.log 60 tools/sass_check.sh --arch 90a \
    build/native/tests/wgmma_test_kernels.cu.o build/native/kernels/gemm_wgmma.cu.o \
    build/native/kernels/conv_wgmma.cu.o build/native/kernels/conv_wgmma_data.cu.o \
    build/native/kernels/conv_wgmma_weights.cu.o build/native/kernels/conv_tc.cu.o
  note "$(tail -n 1 "$OUT/sass_wgmma.log")"
  run_step "wgmma fwd vs cuBLAS" bench_wgmma.log 200 "$BENCH" --filter "fwd bf16"
}

# Backward data and the weight gradient (wgmma gathered and by im2col, beside cuBLAS and
# mma.sync), and tf32's rows: apart from section_wgmma so that each fits one call.
section_wgmma_bwd() {
  [[ -x $BENCH ]] || { record "wgmma_bwd" "unavailable" "$BENCH not built"; return; }
  run_step "wgmma bwd data vs cuBLAS" bench_wgmma_bwd.log 150 "$BENCH" --filter "bwd data bf16"
  run_step "wgmma bwd weights vs cuBLAS" bench_wgmma_wgrad.log 150 "$BENCH" --filter "bwd weights bf16"
  # TF32's forward and backward data go to wgmma where the planner predicts it (operands read
  # truncated; backward data from the weights transposed).
  run_step "tf32 fwd (planner) vs cuBLAS" bench_tf32_fwd.log 120 "$BENCH" --filter "conv fwd tf32"
  run_step "tf32 bwd data (planner) vs cuBLAS" bench_tf32_bwd.log 120 "$BENCH" --filter "conv bwd data tf32"
}

# The trainer with the planner's wgmma choices (issue 36 item 4) and with YOLO_WGMMA=off, in bf16
# and in tf32 (where the forward and backward data can change). Apart from section_wgmma so that
# each fits one call of a few minutes.
section_wgmma_step() {
  [[ -x $TRAIN ]] || { record "wgmma step" "unavailable" "$TRAIN not built"; return; }
  trainer_yolov3_cfg yolov3-wgmma.cfg
  local mode precision wgmma im2col
  # mode: wgmma with im2col where it fits (on), wgmma gathering every operand (gather), mma.sync (off).
  for precision in bf16 tf32; do
    for mode in on gather off; do
      wgmma=on im2col=on
      [[ $mode == gather ]] && im2col=off
      [[ $mode == off ]] && wgmma=off
      ours_run "yolov3 $precision wgmma $mode" "wgmma_yolov3_${precision}_$mode.log" 90 16 \
        "YOLO_WGMMA=$wgmma YOLO_TMA_IM2COL=$im2col" --cfg "$OUT/yolov3-wgmma.cfg" "${yolo416[@]}" --precision "$precision"
    done
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
      compute-sanitizer --tool "$tool" --error-exitcode 99 "$TESTS" -sf='*test_kernel_*' -tce='*invalid launch*'
    note "$(grep -m1 -E '(ERROR|RACECHECK) SUMMARY' "$OUT/sanitizer_$tool.log" || echo 'no summary')"
  done
}

section_bench() {
  if [[ -x $BENCH ]]; then run_step "bench_kernels" bench_kernels.log 120 "$BENCH"
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
  [[ -x $TRAIN ]] || { record "train" "unavailable" "$TRAIN not built"; return; }
  run_step "train demo (50 steps)" train_demo.log 120 "$TRAIN" --max-batches 50 --out "$OUT/demo"
  note "$(grep -m1 'the last' "$OUT/train_demo.log" | sed 's/.*steps: //')"
  # CUDA Graphs against eager steps (issue 15): the same loss line, and the step time side by side.
  run_step "train demo, --no-graph" train_demo_eager.log 120 "$TRAIN" --max-batches 50 --no-graph \
    --out "$OUT/demo_eager"
  note "$(grep -m1 'the last' "$OUT/train_demo_eager.log" | sed 's/.*steps: //')"
  cmp -s "$OUT/demo/last.weights" "$OUT/demo_eager/last.weights" && note "same weights as graphs"
  # What recording the device's activity (CUPTI, for the idle figure) costs.
  run_step "train demo, --no-idle" train_demo_no_idle.log 120 "$TRAIN" --max-batches 50 --no-idle \
    --out "$OUT/demo_no_idle"
  note "$(grep -m1 'the last' "$OUT/train_demo_no_idle.log" | sed 's/.*steps: //')"
  rm -f "$OUT"/demo*/*.weights "$OUT"/demo*/*.ckpt  # not needed back
}

section_yolov3() {
  [[ -x $TRAIN ]] || { record "yolov3" "unavailable" "$TRAIN not built"; return; }
  sed 's/^classes=80/classes=3/; s/^filters=255/filters=24/' models/yolov3.cfg >"$OUT/yolov3-shapes.cfg"
  run_step "train yolov3-416 (50 steps)" train_yolov3.log 300 "$TRAIN" --cfg "$OUT/yolov3-shapes.cfg" \
    --batch 16 --subdivisions 1 --max-batches 50 --out "$OUT/yolov3" --trace "$OUT/yolov3_step.json"
  note "$(grep -m1 'the last' "$OUT/train_yolov3.log" | sed 's/.*steps: //')"
  run_step "train yolov3-416, --no-graph" train_yolov3_eager.log 300 "$TRAIN" --cfg "$OUT/yolov3-shapes.cfg" \
    --batch 16 --subdivisions 1 --max-batches 20 --no-graph --out "$OUT/yolov3_eager"
  note "$(grep -m1 'the last' "$OUT/train_yolov3_eager.log" | sed 's/.*steps: //')"
  rm -f "$OUT"/yolov3/*.weights "$OUT"/yolov3/*.ckpt  # too big to fetch
}

# Data parallel through NCCL (issue 7): the demo as a launched job of one rank (NCCL's
# all-reduces on the path) against the plain run, and the NCCL tests; then two ranks sharing
# GPU 0 where NCCL allows it (2.30+, NCCL_MULTI_RANK_GPU_ENABLE=1; the NCCL tests in build/tests
# need the same variable) and that job losing rank 1 (rank 0 must stop within --comm-timeout,
# naming it).
section_nccl() {
  [[ -x $TRAIN ]] || { record "nccl" "unavailable" "$TRAIN not built"; return; }
  run_step "demo, no communicator" dp_plain.log 60 "$TRAIN" --max-batches 100 --out "$OUT/dp_plain"
  note "$(grep -m1 'the last' "$OUT/dp_plain.log" | sed 's/.*steps: //')"
  run_step "demo, NCCL world 1" dp_nccl1.log 60 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$TRAIN" --max-batches 100 \
    --out "$OUT/dp_nccl1"
  note "$(grep -m1 'the last' "$OUT/dp_nccl1.log" | sed 's/.*steps: //')"
  run_step "demo, NCCL world 1, --no-graph" dp_nccl1_eager.log 60 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 "$TRAIN" \
    --max-batches 100 --no-graph --out "$OUT/dp_nccl1_eager"
  note "$(grep -m1 'the last' "$OUT/dp_nccl1_eager.log" | sed 's/.*steps: //')"
  run_step "NCCL tests, 2 ranks on gpu:0" tests_nccl.log 60 env NCCL_MULTI_RANK_GPU_ENABLE=1 "$TESTS" -sf='*test_nccl*'
  rm -f "$OUT"/dp_*/*.weights "$OUT"/dp_*/*.ckpt
}

section_nccl2() {
  [[ -x $TRAIN ]] || { record "nccl2" "unavailable" "$TRAIN not built"; return; }
  two_ranks "demo, 2 NCCL ranks on gpu:0" dp_nccl2 120 --max-batches 100 --trace "$OUT/dp_nccl2_step.json"
  note "$(grep -m1 'the last' "$OUT/dp_nccl2.rank0.log" | sed 's/.*steps: //')"
  two_ranks "demo, 2 NCCL ranks, --no-graph" dp_nccl2_eager 120 --max-batches 100 --no-graph
  note "$(grep -m1 'the last' "$OUT/dp_nccl2_eager.rank0.log" | sed 's/.*steps: //')"
  if ! run_step "2 NCCL ranks, rank 1 killed" dp_kill.log 90 env NCCL_MULTI_RANK_GPU_ENABLE=1 tools/launch_local.sh \
    -n 2 -p "$OUT/dp_kill" --kill-rank 1 --kill-after 20 -- "$TRAIN" --devices gpu:0 --max-batches 100000 \
    --comm-timeout 30 --out "$OUT/dp_kill"; then
    grep -q 'rank 1' "$OUT/dp_kill.rank0.log" && note "rank 0 stopped naming rank 1 (expected)"
  fi
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
  if [[ ! -x $BENCH ]]; then
    record "tune" "unavailable" "$BENCH not built"
    return
  fi
  run_step "tune bf16" tune_bf16.log 60 "$BENCH" --tune --repeats 5
  note "$(grep -m1 '^tune summary' "$OUT/tune_bf16.log" || echo 'no summary')"
  run_step "tune tf32" tune_tf32.log 40 "$BENCH" --tune --repeats 5 --filter tf32
  note "$(grep -m1 '^tune summary' "$OUT/tune_tf32.log" || echo 'no summary')"
  run_step "plans (this GPU)" plans.log 10 "$BENCH" --plans this
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
      "$BENCH" --filter "conv $pass bf16 52x52 128->256 3x3 s1" --repeats 1
    note "$(grep -o 'uncoalesced shared accesses resulting in a total of [0-9]* excessive wavefronts ([0-9]*% of the' \
      "$OUT/ncu_$kernel.txt" | head -1 || true)"
    note "$(grep -o 'uncoalesced global accesses resulting in a total of [0-9]* excessive sectors ([0-9]*% of the' \
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
  if [[ -x $TESTS ]]; then
    run_step "tc tests (native)" tc_tests.log 45 "$TESTS" -tc="$filter" -tce="$exclude"
    tail -n 1 "$OUT/tc_tests.log" | grep -q '^tests:' && note "$(tail -n 1 "$OUT/tc_tests.log")"
    if command -v compute-sanitizer >/dev/null; then
      run_step "tc memcheck" tc_memcheck.log 75 compute-sanitizer --tool memcheck --error-exitcode 99 \
        "$TESTS" -tc="$filter" -tce="$exclude"
      note "$(grep -m1 -E 'ERROR SUMMARY' "$OUT/tc_memcheck.log" || echo 'no summary')"
      run_step "tc racecheck" tc_racecheck.log 105 compute-sanitizer --tool racecheck --error-exitcode 99 \
        "$TESTS" -tc="$race_filter" -tce="$exclude"
      note "$(grep -m1 -E 'RACECHECK SUMMARY' "$OUT/tc_racecheck.log" || echo 'no summary')"
    else
      record "tc compute-sanitizer" "unavailable" "not on PATH"
    fi
  else
    record "tc tests" "unavailable" "$TESTS not built"
  fi
  if [[ -x $BENCH ]]; then
    bench_conv_tc "bench conv_tc" bench_tc.log 60
    note "$(grep -m1 '^mma.sync ceilings' "$OUT/bench_tc.log") | $(grep -m1 '^cuBLAS yardstick' "$OUT/bench_tc.log")"
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
# The peer as a step: its exit status 3 says it cannot run here (no torch, or no CUDA device for
# it): "unavailable", not a failure. On the summary line: the compile time (--compile), else the loss.
peer_torch() {  # name, log file, timeout, peer args...
  local name=$1 log=$2 limit=$3 status
  shift 3
  if ! command -v python3 >/dev/null; then
    record "$name" "unavailable" "python3 not on PATH"
    return 3
  fi
  run_step "$name" "$log" "$limit" python3 tools/peer/torch_yolov3.py "$@"
  status=$?
  if ((status == 3)); then
    restatus "unavailable" "$(grep -m1 'unavailable' "$OUT/$log")"
  elif [[ -f "$OUT/$log" && " $* " == *" --compile "* ]]; then
    note "$(grep -m1 -o 'compiled ([a-z-]*) in [0-9.]* s' "$OUT/$log")"
  elif [[ -f "$OUT/$log" ]]; then
    note "$(grep -m1 -o 'loss [a-z]*[^;]*' "$OUT/$log" | cut -c1-60)"
  fi
  return $status
}
# A run's device timeline (--timeline $OUT/NAME.json): tools/timeline_summary.py into NAME.txt, and
# the gaps at its step boundaries (ms) on the summary line.
timeline_gaps() {  # name
  [[ -f "$OUT/$1.json" ]] && command -v python3 >/dev/null || return 0
  python3 tools/timeline_summary.py "$OUT/$1.json" >"$OUT/$1.txt" 2>&1
  note "step boundary gap $(awk 'NR > 1 && $5 != "-" { g = g (g ? ", " : "") $5 } END { print (g ? g : "-") }' \
    "$OUT/$1.txt") ms"
}
peer_net() {  # name, our cfg, size, our steps, peer steps, seconds to leave for what follows, compile (0/1), peer cfg args...
  local net=$1 cfg=$2 size=$3 our_steps=$4 steps=$5 reserve=$6 compile=$7
  shift 7
  local prec left
  for prec in fp32 tf32 bf16 fp16; do
    ours_run "ours $net $prec" "peer_ours_${net}_$prec.log" 60 16 "" --cfg "$cfg" --size "$size" --subdivisions 1 \
      --max-batches "$our_steps" --precision "$prec" --timeline "$OUT/timeline_${net}_$prec.json"
    peer_ours[$net.$prec]=$last_rate
    timeline_gaps "timeline_${net}_$prec"
  done
  if ((compile)); then  # look-ahead's effect: the same bf16 run with each step queued after the read
    ours_run "ours $net bf16 --no-look-ahead" "peer_ours_${net}_bf16_in_turn.log" 60 16 "" --cfg "$cfg" \
      --size "$size" --subdivisions 1 --max-batches "$our_steps" --precision bf16 --no-look-ahead \
      --timeline "$OUT/timeline_${net}_bf16_in_turn.json"
    timeline_gaps "timeline_${net}_bf16_in_turn"
  fi
  command -v python3 >/dev/null || { record "peer $net" "unavailable" "python3 not on PATH"; return; }
  left=$((budget_deadline - SECONDS - reserve))
  ((left < 15)) && left=15  # run_step still skips it when the whole budget is spent
  peer_torch "peer $net (PyTorch)" "peer_torch_$net.log" "$left" "$@" --size "$size" --batch 16 --device cuda \
    --precisions fp32,tf32,bf16,fp16 --warmup 5 --steps "$steps" --budget-s $((left - 5))
  for prec in fp32 tf32 bf16 fp16; do peer_torch[$net.$prec]=$(peer_rate "$OUT/peer_torch_$net.log" "$prec" 16); done
  ((compile)) || return
  # torch.compile in bf16 (the issue's yardstick); its compile time is reported apart.
  left=$((budget_deadline - SECONDS - reserve))
  ((left < 15)) && left=15
  peer_torch "peer $net (torch.compile)" "peer_torch_compiled_$net.log" "$left" "$@" --size "$size" --batch 16 \
    --device cuda --precisions bf16 --compile --warmup 5 --steps "$steps"
  peer_compiled[$net.bf16]=$(peer_rate "$OUT/peer_torch_compiled_$net.log" "bf16+compile" 16)
}
section_peer() {
  [[ -x $TRAIN ]] || { record "peer" "unavailable" "$TRAIN not built"; return; }
  local budget_deadline=$((SECONDS + ${PEER_BUDGET:-360})) budget_min=15
  local budget_why="the section's ${PEER_BUDGET:-360} s are spent"
  trainer_yolov3_cfg yolov3-peer.cfg
  peer_net yolov3 "$OUT/yolov3-peer.cfg" 416 36 30 50 1 --cfg models/yolov3.cfg --classes 3
  peer_net demo models/demo.cfg 160 120 50 0 0 --cfg models/demo.cfg
  {
    echo "ours vs PyTorch (tools/peer/torch_yolov3.py): full training steps, batch 16, images/s at the median" \
      "step; ratio = ours / PyTorch (eager; compiled: torch.compile, bf16)"
    printf '%-7s %-9s %11s %11s %7s %13s %7s   %-32s %s\n' net precision "ours img/s" "eager img/s" ratio \
      "compiled" ratio "ours ms/step (data wait, other)" "eager / compiled ms/step"
    local net prec ours torch comp o_rate o_ms o_dw o_other o_comm t_rate t_ms c_rate c_ms ratio c_ratio
    ratio_of() { [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }' || echo -; }
    for net in yolov3 demo; do
      for prec in fp32 tf32 bf16 fp16; do
        ours=${peer_ours[$net.$prec]:-} torch=${peer_torch[$net.$prec]:-} comp=${peer_compiled[$net.$prec]:-}
        [[ -z $ours && -z $torch ]] && continue
        # shellcheck disable=SC2034  # o_comm: the fifth field, read so o_other holds the fourth alone
        read -r o_rate o_ms o_dw o_other o_comm <<<"${ours:--}"
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
}

# BatchNorm's recomputing backward and the folded shortcuts (docs/perf.md has the prediction:
# 0.8-1.7 ms off the YOLOv3-416 bf16 step; the recompute at about 3/4 of the reading backward).
section_fold() {
  if [[ -x $TESTS ]]; then  # the loads' BatchNorm against the unfused pair, bit for bit, natively
    run_step "BatchNorm in the loads (native)" fold_tests.log 120 "$TESTS" \
      -tc="*BatchNorm's apply has*,*BatchNorm applied in the loads*,*normalized conv input*"
  else
    record "BatchNorm in the loads (native)" "unavailable" "$TESTS not built"
  fi
  if [[ -x $BENCH ]]; then
    run_step "bench bn+leaky bwd" bench_fold.log 90 "$BENCH" --filter "bn+leaky bwd" --batch 16
  else
    record "bench bn+leaky bwd" "unavailable" "not built"
  fi
  [[ -x $TRAIN ]] || { record "fold" "unavailable" "$TRAIN not built"; return; }
  trainer_yolov3_cfg yolov3-fold.cfg
  local mode flags
  for mode in fold no-load-fold no-fold; do
    flags=()
    [[ $mode != fold ]] && flags=("--$mode")
    ours_run "yolov3 bf16 $mode" "fold_yolov3_$mode.log" 90 16 "" --cfg "$OUT/yolov3-fold.cfg" "${yolo416[@]}" \
      --precision bf16 "${flags[@]}"
  done
}

# BatchNorm applied in the loads, per layer: each bf16 forward and weight gradient of YOLOv3-416
# beside the same reading its input through BatchNorm (docs/perf.md has the prediction: the
# transform hides behind the tensor cores, or those passes slow by up to a third).
section_fold_convs() {
  [[ -x $BENCH ]] || { record "fold_convs" "unavailable" "$BENCH not built"; return; }
  run_step "bench conv fwd +bn" bench_fold_fwd.log 120 "$BENCH" --filter "conv fwd bf16" --normalized
  run_step "bench conv wgrad +bn" bench_fold_wgrad.log 120 "$BENCH" --filter "conv bwd weights bf16" --normalized
}

# Look-ahead where it was missing before (docs/perf.md has the predictions): micro-batches (the
# stock cfg's 16 a step: one host round trip each without it) and fp16's loss scale on the GPU.
section_lookahead() {
  [[ -x $TRAIN ]] || { record "lookahead" "unavailable" "$TRAIN not built"; return; }
  trainer_yolov3_cfg yolov3-lookahead.cfg
  local run mode flags batch precision
  for run in "bf16 64/16" "fp16 16/1"; do
    read -r precision batch <<<"$run"
    for mode in ahead in-turn; do
      flags=()
      [[ $mode == in-turn ]] && flags=(--no-look-ahead)
      ours_run "yolov3 $precision $batch $mode" "lookahead_${precision}_$mode.log" 120 "${batch%/*}" "" \
        --cfg "$OUT/yolov3-lookahead.cfg" --size 416 --subdivisions "${batch#*/}" --max-batches 24 \
        --precision "$precision" "${flags[@]}"
    done
  done
}

# shellcheck source=tools/gpu_check_verdict.sh
source tools/gpu_check_verdict.sh

if [[ ${sections[0]} == verdict ]]; then
  section_verdict  # OUT/verdict.json and its table, whatever happens to the steps
  exit 0
fi
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
[[ -f "$OUT/bench_wgmma.log" ]] && grep -E "fwd bf16|^op " "$OUT/bench_wgmma.log" && echo
[[ -f "$OUT/bench_wgmma_bwd.log" ]] && grep -E "bwd data bf16|^op " "$OUT/bench_wgmma_bwd.log" && echo
[[ -f "$OUT/bench_wgmma_wgrad.log" ]] && grep -E "bwd weights bf16|^op " "$OUT/bench_wgmma_wgrad.log" && echo
[[ -f "$OUT/bench_tf32_fwd.log" ]] && grep -E "fwd tf32|^op " "$OUT/bench_tf32_fwd.log" && echo
[[ -f "$OUT/bench_tf32_bwd.log" ]] && grep -E "bwd data tf32|^op " "$OUT/bench_tf32_bwd.log" && echo
[[ -f "$OUT/peer_table.txt" ]] && cat "$OUT/peer_table.txt" && echo
cat "$OUT/sections.txt"
summary_table() {
  local i
  printf '%-28s %-12s %s\n' "step" "status" "detail"
  for i in "${!s_name[@]}"; do printf '%-28s %-12s %s\n' "${s_name[$i]}" "${s_status[$i]}" "${s_detail[$i]}"; done
}
summary_table
