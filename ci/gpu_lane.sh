#!/usr/bin/env bash
# The GPU lane (l0_h100 on an H100, l0_h200 on an H200; its slow model gates included) in STAGES stages (default
# 3) run in turn, on a machine where the project is not pip-installed (the checkout on PYTHONPATH, the plugin by
# -p). The whole lane ran about 720 s on one H100 (2026-12-06), past what one 600 s device call allows, so each
# stage is its own call:
#   bash ci/gpu_lane.sh 1      # then 2, then 3 (no argument: every stage in turn, for a machine without a limit)
#   bash ci/gpu_lane.sh merge LANE FILE...   # here: fold the stages' recorded times into ci/durations/LANE.json
# The cut (--kvcm-stage-split=K/N) reads ci/durations/<lane>.json, so every test of the lane runs in exactly one
# stage; each stage records its own times into $OUT/durations-<lane>-K.json (--kvcm-durations-out) and leaves the
# cut of the others as it is. The shipped GPU files began as the CPU lane's recordings of the tests both lanes run,
# each GPU or slow test weighing 20 s (suites/engine/test_reuse_cuda.py's 12 took 117-133 s on an H200,
# docs/engine.md, and the CPU machine's seconds are about twice as long); merge replaces them with measured ones.
# Needs what ci/h200_figures.sh's lane part needs: KVCM_SMOLLM2_GGUF and KVCM_GSM8K_DIR (../shared/tools/gpu-stage's
# setup.sh sets them) and the wheels of ci/gpu_wheels.sh. DEADLINE_S (default 560) bounds a stage from the
# script's start: the run is interrupted (SIGINT: pytest still prints its counts) rather than killed.
set -uo pipefail
stages=${STAGES:-3}
if [ "${1:-}" = merge ]; then
  lane=${2:?usage: bash ci/gpu_lane.sh merge LANE FILE...}
  shift 2
  python3 - "ci/durations/$lane.json" "$@" <<'PY'
import json, sys
target, *stage_files = sys.argv[1:]
merged = json.load(open(target, encoding="utf-8"))
for name in stage_files:
    merged.update(json.load(open(name, encoding="utf-8")))
open(target, "w", encoding="utf-8").write(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
print(f"{target}: {len(merged)} tests")
PY
  exit $?
fi
run=("$@")
[ ${#run[@]} -gt 0 ] || run=($(seq 1 "$stages"))
for k in "${run[@]}"; do
  case $k in
    ''|*[!0-9]*) echo "gpu_lane: stage '$k' is not a number from 1 to $stages (or: merge LANE FILE...)" >&2; exit 2 ;;
  esac
  if [ "$k" -lt 1 ] || [ "$k" -gt "$stages" ]; then
    echo "gpu_lane: stage $k is not between 1 and STAGES=$stages" >&2; exit 2
  fi
done
out=${OUT:-.kvcm/gpu-lane}   # its logs have fixed names: never a folder holding files this script did not write
. "$(dirname "$0")/owned_dir.sh"
own_out_dir "$out" "gpu_lane.sh (OUT)"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
lane=$(python3 -c "import torch; print('l0_h200' if 'H200' in torch.cuda.get_device_name() else 'l0_h100')" 2>/dev/null) || {
  echo "gpu_lane: no CUDA device (torch.cuda.get_device_name() failed or torch is missing); the GPU lane runs on an H100 or H200" >&2; exit 2; }
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
status=0
for k in "${run[@]}"; do
  echo "== $lane stage $k/$stages at ${SECONDS} s"
  timeout -s INT "$(( ${DEADLINE_S:-560} - SECONDS ))" python3 -m pytest -p pytest_kvcm.plugin --kvcm-lane="$lane" \
    --kvcm-version=both --kvcm-slow --kvcm-stage-split="$k/$stages" --kvcm-record-durations \
    --kvcm-durations-out="$out/durations-$lane-$k.json" -q -ra -p no:randomly > "$out/lane-$k.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || status=$rc
  tail -40 "$out/lane-$k.log"
done
echo "== done at ${SECONDS} s"
exit "$status"
