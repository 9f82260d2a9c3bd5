# The verdict of tools/gpu_check.sh (issue 50): what one device call must answer, in priority
# order, within one budget, ending always with OUT/verdict.json and a one-screen table. Sourced by
# tools/gpu_check.sh, whose header lists the steps with their predicted seconds (read from there
# for the table) and whose functions the steps are: run_step, ours_run, two_ranks, peer_torch,
# bench_conv_tc, wgmma_sanitizers, trainer_yolov3_cfg.
# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154  # the variables gpu_check.sh defines and reads

# The header's "verdict" lines: each step's priority and predicted seconds, by name.
declare -A v_priority=() v_predicted=()
verdict_plan() {
  local pri name pred
  while IFS=$'\t' read -r pri name pred; do
    v_priority[$name]=$pri v_predicted[$name]=$pred
  done < <(sed -nE 's/^#   verdict ([0-9]+) +(.*[^ ]) {2,}([0-9]+) s.*/\1\t\2\t\3/p' tools/gpu_check.sh)
}

# Shapes and filters: the hardware's, or the emulated build's (tiny: the script's plumbing, not
# the kernels' speed, is what an emulated run checks).
verdict_settings() {
  v_shapes=runs/shapes          # the synthetic set every section trains on
  v_synth=()                    # its size: the trainer's default (200 + 50 images, 640x480)
  v_precision=bf16 v_batch=16
  v_shape=("${yolo416[@]}")
  v_stock_cfg="$OUT/yolov3-stock.cfg"  # written below: the stock cfg at one size, 416 (random=0)
  v_label="YOLOv3-416 bf16 batch 16, stock cfg"
  v_peer=(--cfg models/yolov3.cfg --classes 80 --size 416 --batch 16 --warmup 5 --steps 30)
  v_ranks=(--cfg models/demo.cfg --max-batches 100 --comm-timeout 30) v_ranks_batch=16  # as section nccl2
  # Since 121aa79: wgmma (and its self-check's cache), TMA's maps and im2col mode, persistent
  # blocks, named barriers; the tensor-core tests (mma.sync, ldmatrix, cp.async, the planner, the
  # bank model); BatchNorm in the loads, folded shortcuts, the recomputing backward, conv moments;
  # the parameters' alignment; the cuBLAS verdict's arithmetic.
  v_gpu_tests="*wgmma*,tensor maps*,tma im2col*,*named barriers*,*tensor cores*,tc plan*,tc banks*,*mma.sync*"
  v_gpu_tests+=",*ldmatrix*,*cp.async*,conv moments*,batchnorm from moments*,*BatchNorm's apply has*"
  v_gpu_tests+=",*BatchNorm applied in the loads*,*normalized conv input*,folded shortcuts*"
  v_gpu_tests+=",batchnorm: cuda backward recomputing*,batchnorm: a shortcut folded*,executor: each layer*"
  v_gpu_tests+=",cublas verdict*"
  v_probe_tests=$wgmma_probe_tests
  if ((emulated)); then
    v_shapes="$OUT/shapes" v_synth=(--train 4 --valid 1 --image-size 64x64 --png)
    v_precision=fp32 v_batch=1
    v_shape=(--size 32 --subdivisions 1 --max-batches 1)
    v_stock_cfg=models/demo.cfg
    v_label="emulated: demo.cfg 32x32 fp32 batch 1"
    v_peer=(--cfg models/demo.cfg --classes 80 --size 32 --batch 1 --warmup 1 --steps 1)
    v_ranks=(--cfg models/demo.cfg --size 32 --batch 2 --max-batches 1) v_ranks_batch=2
    v_gpu_tests="tc plan*,cublas verdict*,*named barriers synchronise*,tma im2col: the traversal*"
    v_gpu_tests+=",tma im2col: the encoder refuses*,wgmma self-check cache*"
    v_probe_tests="*wgmma TF32 probe*,*boxes of a slice only 16-byte aligned*"
  else
    sed 's/^random=1/random=0/' models/yolov3.cfg >"$v_stock_cfg"
  fi
}

# 0. The synthetic shapes (written when absent, into a temporary folder renamed into place, as the
# trainer writes its default), and the same images labelled into 80 classes (OUT/shapes80.data),
# so that the stock cfg keeps its 80-class heads: the trainer resizes heads to a dataset's classes.
verdict_dataset() {
  local name="dataset (synthetic shapes)" tmp="$v_shapes.tmp$$" i
  if [[ -f $v_shapes/shapes.data ]]; then
    record "$name" "ok" "$v_shapes, present" 0
  else
    mkdir -p "$(dirname "$v_shapes")"
    if run_step "$name" dataset.log 60 "$TRAIN" synth "$tmp" "${v_synth[@]}"; then
      rm -rf "$v_shapes" && mv "$tmp" "$v_shapes"
    fi
    rm -rf "$tmp"
  fi
  [[ -f $v_shapes/shapes.data ]] || return
  local dir
  dir=$(cd "$v_shapes" && pwd)
  { cat "$dir/shapes.names"; for ((i = $(wc -l <"$dir/shapes.names"); i < 80; i++)); do echo "class$i"; done; } \
    >"$OUT/shapes80.names"
  printf 'classes=80\ntrain=%s/train.txt\nvalid=%s/valid.txt\nnames=%s/shapes80.names\nbackup=%s/backup/\n' \
    "$dir" "$dir" "$OUT" "$OUT" >"$OUT/shapes80.data"
  figure "$(wc -l <"$dir/train.txt") training images in $v_shapes; 80 classes in $OUT/shapes80.data"
}

# 1. The devices, then the self-check's cases one by one, the TF32 probe and the base probe (the
# wgmma section's questions, its notes). Without a GPU the other steps would time the CPU: they
# are skipped.
verdict_devices() {
  run_step "list devices" devices.log 30 "$TRAIN" --list-devices
  local gpus
  gpus=$(sed -nE 's/^ +(gpu:[0-9]+ .*)/\1/p; s/^(Emulated GPUs: [^(]*).*/\1/p' "$OUT/devices.log" 2>/dev/null | paste -sd ';')
  figure "${gpus:-no GPU} | $(grep -m1 -E '^NCCL' "$OUT/devices.log") $(grep -m1 '^Built for' "$OUT/devices.log")"
  if [[ -z $gpus && ${s_status[-1]} == ok ]]; then
    restatus "FAILED(no GPU)" "${s_detail[-1]}"
    budget_deadline=1 budget_status="skipped (no GPU)" budget_why="--list-devices found no GPU"
  fi
}
verdict_probes() {
  run_step "wgmma self-check, tf32 probe" wgmma_probes.log 60 "$TESTS" -tc="$v_probe_tests"
  figure "$(tests_line wgmma_probes.log) | $(wgmma_probe_text wgmma_probes.log)"
}
# The "tests: N passed, M failed, K skipped" line of a test log, and the first failed cases' names.
tests_line() {  # log file
  local line failed
  line=$(grep -m1 '^tests: ' "$OUT/$1" 2>/dev/null)
  failed=$(sed -n 's/^failed test case: //p' "$OUT/$1" 2>/dev/null | head -n 3 | paste -sd ';')
  echo "${line:-no tests line}${failed:+ (failed: $failed)}"
}

# 2. The native tests of every GPU path since 121aa79 but the probes', then compute-sanitizer.
verdict_gpu_tests() {
  run_step "GPU-path tests (native)" gpu_path_tests.log 100 "$TESTS" -tc="$v_gpu_tests" -tce="$v_probe_tests"
  figure "$(tests_line gpu_path_tests.log)"
}
verdict_sanitizers() { wgmma_sanitizers 75 45; }

# 3. Ours on the stock cfg: the default, and each A/B switch of the Hopper path (the rate beside
# the default's); then the PyTorch peer, eager and compiled, on the same network.
verdict_row() {  # name, log file, "VAR=value" (or ""), trainer flags...
  local name=$1 log=$2 vars=$3
  shift 3
  ours_run "$name" "$log" 60 "$v_batch" "$vars" --cfg "$v_stock_cfg" --data "$OUT/shapes80.data" "${v_shape[@]}" \
    --precision "$v_precision" "$@"
  [[ -n $last_rate ]] || return 0
  local rate=${last_rate%% *} text
  text="$rate img/s ($(awk '{ print $2 }' <<<"$last_rate") ms/step)"
  [[ -n $v_default_rate && $name != "ours default" ]] &&
    text+=", $(awk -v a="$rate" -v b="$v_default_rate" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')x the default"
  grep -q 'heads resized' "$OUT/$log" && text+="; heads resized to the data's 80 classes"
  figure "$text"
}
v_default_rate=""
verdict_ours() {
  verdict_row "ours default" ours_default.log ""
  v_default_rate=${last_rate%% *}
  verdict_row "ours YOLO_WGMMA=off" ours_wgmma_off.log "YOLO_WGMMA=off"
  verdict_row "ours YOLO_WGMMA_PERSISTENT=off" ours_persistent_off.log "YOLO_WGMMA_PERSISTENT=off"
  verdict_row "ours --no-load-fold" ours_no_load_fold.log "" --no-load-fold
}
v_peer_compiled=""
verdict_peer() {
  local rate
  peer_torch "peer eager" peer_eager.log 60 "${v_peer[@]}" --device cuda --precisions bf16
  rate=$(peer_rate "$OUT/peer_eager.log" bf16 "$v_batch")
  [[ -n $rate ]] && figure "$(peer_text "$rate")"
  peer_torch "peer torch.compile" peer_compiled.log 120 "${v_peer[@]}" --device cuda --precisions bf16 --compile
  rate=$(peer_rate "$OUT/peer_compiled.log" bf16+compile "$v_batch")
  [[ -n $rate ]] && figure "$(peer_text "$rate")"
  [[ $rate =~ ^[0-9.]+\  ]] && v_peer_compiled=${rate%% *}
}
peer_text() {  # peer_rate's "R M", or its reason
  [[ $1 =~ ^[0-9.]+\  ]] && awk '{ printf "%s img/s (median step %s ms)", $1, $2 }' <<<"$1" || echo "$1"
}

# 4. Two ranks on one device, the all-reduce overlapped with backward and after it.
verdict_two_ranks() {
  local mode prefix rate overlapped="" flags
  for mode in overlapped --no-overlap; do
    prefix=ranks_${mode#--}
    prefix=${prefix//-/_}
    flags=()
    [[ $mode == --no-overlap ]] && flags=(--no-overlap)
    two_ranks "2 ranks, $mode" "$prefix" 45 "${v_ranks[@]}" --data "$v_shapes/shapes.data" \
      --precision "$v_precision" "${flags[@]}"
    [[ -f $OUT/$prefix.rank0.log ]] && ((!emulated)) && note "NCCL: ${YOLO_NCCL_LIB:-its default search path}"
    grep -qs 'invalid usage' "$OUT/$prefix.rank0.log" &&
      note "NCCL refused two ranks on one GPU (2.30+ does: YOLO_NCCL_LIB or the bundle's nccl/libnccl.so.2)"
    rate=$(ours_rate "$OUT/$prefix.rank0.log" "$v_ranks_batch" 2>/dev/null)
    rm -f "$OUT/$prefix"/*.weights "$OUT/$prefix"/*.ckpt
    [[ -n $rate ]] || continue
    if [[ $mode == overlapped ]]; then
      overlapped=${rate%% *}
      figure "$(awk '{ printf "%s img/s, exposed comm %s ms a step", $1, $5 }' <<<"$rate")"
    else
      figure "$(awk -v o="$overlapped" '{ printf "%s img/s, exposed comm %s ms a step; overlapped %s", $1, $5,
        (o != "" && $1 > 0 ? sprintf("%.2fx", o / $1) : "-") }' <<<"$rate")"
    fi
  done
}

# 5. The conv verdict against cuBLAS.
verdict_conv() {
  conv_verdict="incomplete"
  if [[ -z $BENCH ]]; then
    record "conv_tc vs cuBLAS" "unavailable" "cuBLAS and the GPU's timings: hardware only (GPU_CHECK_BENCH names one)"
  elif [[ ! -x $BENCH ]]; then
    record "conv_tc vs cuBLAS" "unavailable" "$BENCH not built"
  else
    bench_conv_tc "conv_tc vs cuBLAS" bench_targets.log 150
  fi
}

# 6. The 3-class cfg earlier GPU runs trained (heads of 24 filters), while time allows.
verdict_three_class() {
  local cfg=models/demo.cfg
  if ((!emulated)); then
    cfg="$OUT/yolov3-3class.cfg"
    trainer_yolov3_cfg yolov3-3class.cfg
  fi
  ours_run "ours 3-class cfg" ours_3class.log 60 "$v_batch" "" --cfg "$cfg" --data "$v_shapes/shapes.data" \
    "${v_shape[@]}" --precision "$v_precision"
  [[ -n $last_rate ]] && figure "$(awk '{ printf "%s img/s (%s ms/step)", $1, $2 }' <<<"$last_rate")"
}

# 7. Issue 54 on NCCL, while time allows: two ranks on gpu:0, rank 1 killed; rank 0 must save the
# last step both completed (its update gated on the all-reduces that NCCL's abort ends) and say so.
verdict_lost_rank() {
  if ((emulated)); then
    record "lost rank saves" "unavailable" "emulated GPUs are threads of one process (tests_emu covers them)"
    return
  fi
  run_step "lost rank saves" lost_rank.log 60 env NCCL_MULTI_RANK_GPU_ENABLE=1 tools/launch_local.sh -n 2 \
    -p "$OUT/lost_rank" --kill-rank 1 --kill-after 25 -- "$TRAIN" --devices gpu:0 --cfg models/demo.cfg \
    --data "$v_shapes/shapes.data" --max-batches 100000 --comm-timeout 10 --out "$OUT/lost_rank"
  local saved
  saved=$(grep -o 'rank 0 saved the state after step [0-9]*' "$OUT/lost_rank.rank0.log" 2>/dev/null | head -n 1)
  if [[ -n $saved ]]; then
    restatus "ok" "$saved"
    figure "${saved#rank 0 saved the state after }"
  else
    restatus "failed" "rank 0 did not save: $(tail -n 1 "$OUT/lost_rank.rank0.log" 2>/dev/null | cut -c1-200)"
  fi
  rm -f "$OUT/lost_rank"/*.weights "$OUT/lost_rank"/*.ckpt
}

# The targets beside their figures: "NAME<TAB>FIGURE<TAB>TARGET<TAB>VERDICT" lines.
verdict_targets() {
  local ours=$v_default_rate want
  if [[ -n $ours ]]; then
    printf '%s\t%s img/s\t>= 650 img/s\t%s\n' "$v_label" "$ours" \
      "$(awk -v a="$ours" 'BEGIN { print (a >= 650 ? "met" : "not met") }')"
  else
    printf '%s\t-\t>= 650 img/s\tincomplete\n' "$v_label"
  fi
  if [[ -n $ours && -n $v_peer_compiled ]]; then
    want=$(awk -v p="$v_peer_compiled" 'BEGIN { printf "%.1f", 1.5 * p }')
    printf 'ours vs 1.5x the compiled peer\t%s img/s\t>= %s img/s (1.5 x %s)\t%s\n' "$ours" "$want" \
      "$v_peer_compiled" "$(awk -v a="$ours" -v b="$want" 'BEGIN { print (a >= b ? "met" : "not met") }')"
  else
    printf 'ours vs 1.5x the compiled peer\t%s\t>= 1.5 x the compiled peer\tincomplete\n' "${ours:-"-"}${ours:+ img/s}"
  fi
  local line
  line=$(grep -m1 '^conv_tc bf16 against cuBLAS' "$OUT/bench_targets.log" 2>/dev/null |
    sed -E 's/.*: ([0-9]+) of ([0-9]+) rows; worst ([0-9.]+).*median ([0-9.]+).*sum ([0-9.]+).*/worst \3, median \4, sum \5 (\1\/\2 rows)/')
  printf 'conv_tc bf16 vs cuBLAS\t%s\tworst <= 1.25, median <= 1.1, sum <= 1.15\t%s\n' "${line:--}" \
    "${conv_verdict:-incomplete}"
}

json_str() {  # text: a JSON string (control characters but tab and newline dropped)
  local LC_ALL=C s=$1
  s=${s//[$'\001'-$'\010'$'\013'-$'\037']/}
  s=${s//\\/\\\\} s=${s//\"/\\\"}
  s=${s//$'\t'/\\t} s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
json_num() { [[ $1 =~ ^-?[0-9]+([.][0-9]+)?$ ]] && printf '%s' "$1" || printf 'null'; }

# OUT/verdict.json from the steps recorded so far (written anew after each step, so that a run
# stopped from outside leaves what it had).
verdict_save() {
  local i n=${#s_name[@]} sep="" name fig target verdict
  {
    printf '{\n  "mode": "verdict",\n  "emulated": %s,\n' "$( ((emulated)) && echo true || echo false)"
    printf '  "device": %s,\n' "$(json_str "$v_device")"
    printf '  "budget_s": %s,\n  "reserve_s": %s,\n  "elapsed_s": %s,\n' "$v_budget" "$v_reserve" \
      $((SECONDS - v_start))
    printf '  "finished": %s,\n  "steps": [' "$( ((v_done)) && echo true || echo false)"
    for ((i = 0; i < n; i++)); do
      name=${s_name[$i]}
      printf '%s\n    {"name": %s, "priority": %s, "status": %s, "seconds": %s, "predicted_s": %s, "figure": %s, ' \
        "$sep" "$(json_str "$name")" "$(json_num "${v_priority[$name]:-}")" "$(json_str "${s_status[$i]}")" \
        "$(json_num "${s_secs[$i]}")" "$(json_num "${v_predicted[$name]:-}")" "$(json_str "${s_figure[$i]}")"
      printf '"log": %s, "detail": %s}' "$(json_str "${s_log[$i]}")" "$(json_str "${s_detail[$i]}")"
      sep=","
    done
    printf '\n  ],\n  "targets": ['
    sep=""
    while IFS=$'\t' read -r name fig target verdict; do
      printf '%s\n    {"name": %s, "figure": %s, "target": %s, "verdict": %s}' "$sep" "$(json_str "$name")" \
        "$(json_str "$fig")" "$(json_str "$target")" "$(json_str "$verdict")"
      sep=","
    done < <(verdict_targets)
    printf '\n  ]\n}\n'
  } >"$OUT/verdict.json.part" && mv "$OUT/verdict.json.part" "$OUT/verdict.json"
}

# The one-screen table: each step (priority, status, seconds against the prediction, its figure cut
# to the width), then each target beside its figure.
verdict_table() {
  local i name fig target verdict
  echo
  echo "verdict: ${v_device:-no device} | $((SECONDS - v_start)) s of VERDICT_BUDGET $v_budget s | $OUT/verdict.json"
  printf '%-2s %-31s %-22s %4s %4s  %s\n' "p" "step" "status" "s" "pred" "figure (the logs have the rest)"
  for i in "${!s_name[@]}"; do
    name=${s_name[$i]} fig=${s_figure[$i]:-${s_detail[$i]}}
    printf '%-2s %-31s %-22s %4s %4s  %s\n' "${v_priority[$name]:--}" "${name:0:31}" "${s_status[$i]}" \
      "${s_secs[$i]:--}" "${v_predicted[$name]:--}" "${fig:0:90}"
  done
  echo
  printf '%-38s %-47s %-42s %s\n' "target" "figure" "wanted" "verdict"
  while IFS=$'\t' read -r name fig target verdict; do
    printf '%-38s %-47s %-42s %s\n' "$name" "$fig" "$target" "$verdict"
  done < <(verdict_targets)
}

# The summary, once, however the run ends (the EXIT trap): a step under way when a signal came is
# stopped and recorded as interrupted.
verdict_finish() {
  ((v_done)) && return 0
  v_done=1
  if [[ -n ${step_pid:-} ]]; then  # its timeout passes the signal on (and a SIGKILL kill_grace s later)
    kill -TERM "$step_pid" 2>/dev/null
    wait "$step_pid" 2>/dev/null
    record "$step_name" "interrupted" "gpu_check.sh was stopped during this step" $((SECONDS - step_start)) ""
  fi
  verdict_save
  verdict_table
}

section_verdict() {
  v_start=$SECONDS v_done=0
  v_budget=${VERDICT_BUDGET:-400} v_reserve=${VERDICT_RESERVE:-10}
  budget_deadline=$((v_start + v_budget - v_reserve)) budget_min=5
  ((budget_deadline > 0)) || budget_deadline=1  # (0 would mean no deadline)
  budget_why="VERDICT_BUDGET ${v_budget} s, less ${v_reserve} s for the summary"
  trap verdict_finish EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  if ((emulated)); then v_device="emulated ($TRAIN, emu:0)"
  else v_device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | paste -sd ';'); fi
  verdict_settings
  verdict_plan
  local task
  for task in verdict_dataset verdict_devices verdict_probes verdict_gpu_tests verdict_sanitizers verdict_ours \
    verdict_peer verdict_two_ranks verdict_conv verdict_three_class verdict_lost_rank; do
    "$task"
    verdict_save
  done
  verdict_finish
}
