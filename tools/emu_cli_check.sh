#!/usr/bin/env bash
# The real CLI over emulated GPUs (build/train_yolo_emu), end to end and small: write a tiny
# synthetic set, train the demo net on emu:0,1 at 64x64 for 2 steps (the step split printed, with
# the device idle time),
# evaluate it (map), detect on an image (a drawn copy written), train a step in tf32 (and have
# it refused on an sm_75), let --precision auto pick bf16 (sm_90) and fp16 (sm_75), refuse bf16
# on an sm_75, train 2 steps replayed as graphs (the second launched) and 2 with --no-graph (the same weights), and
# refuse a bad --devices with the flag named; report every problem of a hostile VOC set at once;
# stop a run with SIGTERM through timeout (one request as two signals) and continue it with the
# printed command, ending on the uninterrupted bits; stop two ranks through launch_local.sh. Prints "tests: N passed, M failed, 0 skipped" for tools/run_tests.sh.
# BUILD (env): the build folder (build).
set -u
cd "$(dirname "$0")/.."
bin="$(pwd)/${BUILD:-build}/train_yolo_emu"
launcher="$(pwd)/tools/launch_local.sh"
models="$(pwd)/models"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# name, expected exit status, text the output must contain, command...
check() {
  local name=$1 want=$2 text=$3
  shift 3
  local log="$work/$(echo "$name" | tr -c 'a-z0-9\n' '_').log"
  (cd "$work" && "$@") >"$log" 2>&1
  local status=$?
  if [[ $status -eq $want ]] && grep -qF -- "$text" "$log"; then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name (exit $status, wanted $want and '$text'); its output:"
    sed 's/^/    /' "$log" | tail -n 40
  fi
}

# Two run folders' last.weights, byte for byte; the check's name.
same_weights() {
  if cmp -s "$work/$1/last.weights" "$work/$2/last.weights"; then
    passed=$((passed + 1))
    echo "ok: $3"
  else
    failed=$((failed + 1))
    echo "FAILED: $3: $1/last.weights and $2/last.weights differ"
  fi
}

if [[ ! -x "$bin" ]]; then
  echo "FAILED: $bin is not built"
  echo "tests: 0 passed, 1 failed, 0 skipped"
  exit 1
fi
check "synth" 0 "wrote 12 training" "$bin" synth set --train 12 --valid 3 --image-size 160x120 --png
# (fp32: the data-parallel CLI path and its split line, not the precision, which the checks below
# cover; emulated bf16 tensor cores take about 30x longer, a minute a step here.)
check "train on emu:0,1" 0 "; device idle between kernels" "$bin" --devices emu:0,1 --precision fp32 \
  --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 2 --size 64 --batch 8 --out out
check "map on emu:0" 0 "mAP@0.5 =" "$bin" map --cfg "$models/demo.cfg" --weights out/last.weights --data set/shapes.data \
  --size 64
check "detect on emu:1@sm75" 0 " -> drawn/000000.png" "$bin" detect --devices emu:1@sm75 --cfg "$models/demo.cfg" \
  --weights out/last.weights --names set/shapes.names --size 64 --out drawn set/validation/images/000000.png
check "detect on emu:1@sm120 (a GPU newer than the build: the sm_80 path)" 0 " -> drawn120/000000.png" "$bin" detect \
  --devices emu:1@sm120 --cfg "$models/demo.cfg" --weights out/last.weights --names set/shapes.names --size 64 \
  --out drawn120 set/validation/images/000000.png
check "train in tf32 on emu:0" 0 "precision tf32: convolutions and connected layers on tensor cores" "$bin" \
  --devices emu:0 --precision tf32 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64 --batch 4 \
  --out out_tf32
check "auto picks bf16 on emu:0" 0 "precision bf16: activations and their gradients in bf16" "$bin" \
  --devices emu:0 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64 --batch 2 --out out_auto
check "auto picks fp16 on emu:0@sm75, loss scaling on" 0 "dynamic loss scaling from 2^16 (auto: sm_75 has fp16" "$bin" \
  --devices emu:0@sm75 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64 --batch 2 --out out_fp16
check "bf16 refused on emu:0@sm75" 2 "precision bf16 needs tensor cores of sm_80 or newer; this device is sm_75" "$bin" \
  --devices emu:0@sm75 --precision bf16 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64
check "fp32 asked for on emu:0" 0 "train_yolo: precision fp32" "$bin" \
  --devices emu:0 --precision fp32 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64 --batch 2 \
  --out out_fp32
check "tf32 refused on emu:0@sm75" 2 "precision tf32 needs tensor cores of sm_80 or newer; this device is sm_75" "$bin" \
  --devices emu:0@sm75 --precision tf32 --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64
check "graphs on emu:0" 0 "CUDA Graphs: each kind of micro-batch is captured" "$bin" --devices emu:0 --precision fp32 \
  --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 2 --size 64 --batch 2 --out out_graphs
check "--no-graph on emu:0" 0 "the steps run eagerly, without CUDA Graphs: --no-graph" "$bin" --devices emu:0 \
  --precision fp32 --no-graph --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 2 --size 64 --batch 2 \
  --out out_eager
same_weights out_graphs out_eager "graphs and --no-graph write the same weights"
check "a bad --devices" 2 "--devices emu:0@sm61: no emulated GPU preset for sm_61" "$bin" --devices emu:0@sm61 \
  --cfg "$models/demo.cfg" --data set/shapes.data
# Heads that follow the dataset (issue 16): the 3-class demo cfg on a 4-class set trains with
# resized heads and writes the cfg it trained, which detect then finds beside the weights.
sed 's/^classes *=.*/classes = 4/; s/^names *=.*/names = four.names/' "$work/set/shapes.data" >"$work/set/four.data"
printf 'rectangle\nellipse\ntriangle\nstar\n' >"$work/set/four.names"
# (On the CPU backend: nothing of it is device-specific, and CI time counts.)
check "the demo on a 4-class set: heads resized" 0 "the [yolo] heads resized from 3 to 4 classes" "$bin" \
  --devices cpu --cfg "$models/demo.cfg" --data set/four.data --max-batches 1 --size 64 --batch 2 --out out_four
check "detect with the run's model.cfg" 0 " -> drawn_four/000000.png" "$bin" detect --devices cpu \
  --weights out_four/last.weights --names set/four.names --size 64 --out drawn_four set/validation/images/000000.png

# What a new user tripped on (issue 34).
check "usage: data's description beside it" 0 "[data options]   read a dataset, say what it is" "$bin" --help

# detect's stdout is its results only (every line a JSON object, or TSV of 7 fields); what it
# says about devices and files goes to stderr. (out/ is the run trained above.)
detect_args=(detect --devices cpu --cfg "$models/demo.cfg" --weights out/last.weights --names set/shapes.names
  --size 64 --threshold 0.001 --out drawn_json set/validation/images/000000.png)
(cd "$work" && "$bin" "${detect_args[@]}" --json >"$work/detect.json" 2>"$work/detect.err" &&
  "$bin" "${detect_args[@]}" >"$work/detect.tsv" 2>>"$work/detect.err")
if [[ -s "$work/detect.json" ]] && ! grep -qv '^{"image": ".*", "class": ".*", "score": [0-9.]*, "box": \[.*\]}$' \
  "$work/detect.json" && ! awk -F'\t' 'NF != 7 { bad = 1 } END { exit !bad }' "$work/detect.tsv" &&
  grep -q "train_yolo: using the CPU backend" "$work/detect.err"; then
  passed=$((passed + 1))
  echo "ok: detect's stdout holds only its results ($(wc -l <"$work/detect.json") JSON lines)"
else
  failed=$((failed + 1))
  echo "FAILED: detect's stdout holds more than its results; stdout (--json, then TSV), stderr:"
  cat "$work/detect.json" "$work/detect.tsv" "$work/detect.err" | sed 's/^/    /' | tail -n 20
fi

# data and training agree on the steps per epoch: 12 images at batch 5 are 2 (the partial batch dropped).
check "data: steps per epoch as training's" 0 "batch 5 at 64x64 (letterbox, augmented), 2 steps per epoch" "$bin" data \
  --data set/shapes.data --size 64 --batch 5 --out data_steps
check "training: the same steps per epoch" 0 "12 training images, 2 steps per epoch" "$bin" --devices cpu \
  --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 1 --size 64 --batch 5 --out out_steps

# One epoch numbering: the console's "epoch N: loss" lines and results.csv's epoch column (12
# images at batch 4: 3 steps an epoch, 6 steps are epochs 1 and 2).
check "two epochs" 0 "6 steps" "$bin" --devices cpu --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 6 \
  --size 64 --batch 4 --out out_epochs
console_epochs=$(grep -o 'train_yolo: epoch [0-9.]*: loss' "$work/two_epochs.log" | awk '{ print $3 }' | tr -d : |
  paste -sd,)
csv_epochs=$(tail -n +2 "$work/out_epochs/results.csv" 2>/dev/null | cut -d, -f1 | paste -sd,)
if [[ "$console_epochs" == "1,2" && "$csv_epochs" == "1,2" ]]; then
  passed=$((passed + 1))
  echo "ok: the console and results.csv number the epochs alike (1, 2)"
else
  failed=$((failed + 1))
  echo "FAILED: epochs on the console '$console_epochs', in results.csv '$csv_epochs' (wanted 1,2 both)"
fi

# The default job (no --cfg: models/demo.cfg from the working directory) reports the final mAP on
# the validation split; it reaches results.csv's last row and the chart.
ln -s "$models" "$work/models"
check "the default job reports its final map" 0 "mAP@0.5 recorded as step 2's in out_default/results.csv" \
  "$bin" --devices cpu --data set/shapes.data --max-batches 2 --size 64 --batch 4 --out out_default
final_map=$(tail -n 1 "$work/out_default/results.csv" 2>/dev/null | awk -F, '{ print $NF }')
printed_map=$(grep -o 'mAP@0.5 = [0-9.]*' "$work/the_default_job_reports_its_final_map.log" | awk '{ print $3 }')
if [[ -n "$final_map" && -n "$printed_map" ]] && awk -v a="$final_map" -v b="$printed_map" \
  'BEGIN { exit !(a - b < 5e-5 && b - a < 5e-5) }'; then
  passed=$((passed + 1))
  echo "ok: results.csv's last row holds the final mAP@0.5 ($final_map)"
else
  failed=$((failed + 1))
  echo "FAILED: results.csv's last row has map50 '$final_map', not the mAP@0.5 the run printed"
fi

# A hostile VOC set (issue 16): a truncated XML, swapped corners, a box beyond <size>, a truncated
# JPEG; every problem in one run, all of them in the list, and 4 of 12 unusable stops the run.
mkdir -p "$work/hvoc" && cp -r "$work/set/train" "$work/set/validation" "$work/hvoc/"
ann="$work/hvoc/train/annotations"
head -c 150 "$ann/000001.xml" >"$work/cut.xml" && mv "$work/cut.xml" "$ann/000001.xml"
sed -i '0,/<xmin>/s/<xmin>[0-9]*<\/xmin>/<xmin>159<\/xmin>/' "$ann/000002.xml"
sed -i '0,/<xmax>/s/<xmax>[0-9]*<\/xmax>/<xmax>900<\/xmax>/' "$ann/000003.xml"
jpg="$work/hvoc/train/images/000004.png"
[[ -f "$jpg" ]] && head -c -20 "$jpg" >"$work/cut.png" && mv "$work/cut.png" "$jpg"
check "a hostile VOC set: every problem at once" 2 "4 of the train split's 12 items are unusable" "$bin" data \
  --data hvoc --size 64 --batch 2 --out hvoc_report
list="$work/hvoc_report/dataset_problems.txt"
if [[ -f "$list" ]] && grep -q "000001.xml" "$list" && grep -q "000002.xml:.*corners swapped" "$list" &&
  grep -q "000003.xml:.*extends past the image's right edge (xmax 900 > width 160); the image is 160x120" "$list" &&
  grep -q "000004.png: PNG without" "$list"; then
  passed=$((passed + 1))
  echo "ok: the problem list names all four"
else
  failed=$((failed + 1))
  echo "FAILED: the problem list $list does not name all four; it holds:"
  sed 's/^/    /' "$list" 2>/dev/null | tail -n 20
fi
# SIGTERM mid-run (issues 17, 34), as GNU timeout sends it: to the process, then to its process
# group, microseconds apart (a TERM to timeout itself makes it do the same as its deadline does).
# One request: the step under way finishes and is saved, exit status 75, the --resume command
# printed; that command then ends on the weights of an uninterrupted run. (CPU backend: the stop
# logic is not device-specific.)
sig_args=(--devices cpu --cfg "$models/demo.cfg" --data set/shapes.data --max-batches 24 --size 96 --batch 4
  --checkpoint-every 1)
(cd "$work" && exec timeout 600 "$bin" "${sig_args[@]}" --out out_sig >"$work/sig.log" 2>&1) &
sig_pid=$!
for _ in $(seq 1 600); do grep -q '^iter 1/' "$work/sig.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$sig_pid"
wait "$sig_pid"
sig_status=$?
resume_line=$(grep -o 'to continue: .*' "$work/sig.log" | sed 's/^to continue: //')
if [[ $sig_status -eq 75 ]] && grep -q "SIGTERM received: stopping after the step under way" "$work/sig.log" &&
  grep -q "stopped by SIGTERM after step" "$work/sig.log" && ! grep -q "stopping at once" "$work/sig.log" &&
  [[ "$resume_line" == *" --out out_sig --resume" ]]; then
  passed=$((passed + 1))
  echo "ok: timeout's SIGTERM pair is one request: the step finishes, saves, exit 75: $(grep -o 'stopped by SIGTERM after step [0-9]*' "$work/sig.log")"
else
  failed=$((failed + 1))
  echo "FAILED: SIGTERM through timeout (exit $sig_status, wanted 75, one request and the --resume command); its output:"
  sed 's/^/    /' "$work/sig.log" | tail -n 20
fi
check "the printed --resume command continues" 0 "resuming out_sig/last.ckpt at step" bash -c "$resume_line"
check "the same run uninterrupted" 0 "24 steps" "$bin" "${sig_args[@]}" --out out_nosig
same_weights out_sig out_nosig "stopped by SIGTERM and resumed = uninterrupted, bit for bit"
# tools/launch_local.sh passes a SIGTERM on to its ranks (2 CPU ranks as processes): every rank
# stops after the same step and saves, and the launcher exits 75.
(cd "$work" && exec "$launcher" -n 2 -p ll -- "$bin" "${sig_args[@]}" --out out_ll >"$work/ll.log" 2>&1) &
ll_pid=$!
for _ in $(seq 1 600); do grep -q '^iter 1/' "$work/ll.rank0.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$ll_pid"
wait "$ll_pid"
ll_status=$?
if [[ $ll_status -eq 75 ]] && [[ $(grep -c '^rank [01]: exit 75' "$work/ll.log") -eq 2 ]] &&
  grep -q "stopped by SIGTERM after step" "$work/ll.rank0.log" && [[ -f "$work/out_ll/last.ckpt" ]]; then
  passed=$((passed + 1))
  echo "ok: launch_local.sh passes SIGTERM on: both ranks stop and save, exit 75"
else
  failed=$((failed + 1))
  echo "FAILED: launch_local.sh and SIGTERM (exit $ll_status, wanted 75 from it and both ranks); its output:"
  sed 's/^/    /' "$work/ll.log" "$work"/ll.rank*.log | tail -n 20
fi
echo "tests: $passed passed, $failed failed, 0 skipped"
[[ $failed -eq 0 ]]
