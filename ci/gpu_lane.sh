#!/usr/bin/env bash
# The GPU lane (l0_h100 on an H100, l0_h200 on an H200) in its two stages, each one device call, on a machine where
# the project is not pip-installed (the checkout on PYTHONPATH, the plugin by -p):
#   bash ci/gpu_lane.sh smoke           # pre_merge: gpu_smoke, nothing staged (the Triton kernels, fused layers,
#                                       # CUDA graphs, speculation, chunked-local, host tier and reuse at real shapes
#                                       # with random weights, fp32 parity against Hugging Face); only pydantic's wheels
#   bash ci/gpu_lane.sh models [K/N]    # post_merge: gpu_models, the gates that need SmolLM2's and Gemma's weights
#                                       # and GSM8K (../shared/tools/gpu-stage's setup.sh sets KVCM_SMOLLM2_GGUF and
#                                       # KVCM_GSM8K_DIR); K/N: pytest-split's group K of N, when it outgrows one call
#   bash ci/gpu_lane.sh merge STAGE FILE...   # here: fold stages' recorded times into ci/durations/<lane>-STAGE.json
# A stage cut into groups (pytest-split: --splits N --group K) reads ci/durations/<lane>-<stage>.json for the cut
# and records its own tests' times into $OUT/durations-<lane>-<stage>-K.json (a copy, written with
# --clean-durations), so the cut of the other groups, read on other machines, stays as it was; `merge` then folds
# the groups' files into the lane's (pytest-split writes the file it reads, so this is the one step it lacks).
# DEADLINE_S (default 470, so a stage ends inside an 8-minute call) bounds a stage: pytest is interrupted (SIGINT:
# it still prints its counts) rather than killed.
set -uo pipefail
usage="usage: bash ci/gpu_lane.sh smoke | models [K/N] | merge STAGE FILE..."
if [ "${1:-}" = merge ]; then
  stage=${2:?$usage}
  shift 2
  [ $# -gt 0 ] || { echo "gpu_lane: merge $stage: name the recorded files ($usage)" >&2; exit 2; }
  exec python3 - "$stage" "$@" <<'PY'
import json, math, sys
stage, *files = sys.argv[1:]
def load(path, required):
    try:
        data = json.load(open(path, encoding="utf-8"))
    except FileNotFoundError:
        if required:
            sys.exit(f"gpu_lane merge: {path}: no such file")
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        sys.exit(f"gpu_lane merge: {path}: not JSON ({exc})")
    bad = [k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
           or v < 0] if isinstance(data, dict) else None
    if bad is None or bad:
        sys.exit(f"gpu_lane merge: {path}: expected an object of test id -> seconds >= 0"
                 + (f" ({bad[0]!r} is {data[bad[0]]!r})" if bad else ""))
    return data
merged = {}
for path in files:
    merged.update(load(path, True))
lanes = {f.rsplit("/", 1)[-1].split("-")[1] for f in files if f.rsplit("/", 1)[-1].startswith("durations-")}
if len(lanes) != 1:
    sys.exit(f"gpu_lane merge: the files must be one lane's durations-<lane>-{stage}-K.json, given {files}")
target = f"ci/durations/{lanes.pop()}-{stage}.json"
out = load(target, False)
out.update(merged)
open(target + ".tmp", "w", encoding="utf-8").write(json.dumps(dict(sorted(out.items())), indent=1) + "\n")
import os; os.replace(target + ".tmp", target)
print(f"{target}: {len(out)} tests ({len(merged)} recorded now)")
PY
fi
stage=${1:-}
case $stage in
  smoke) term=pre_merge ;;
  models) term=post_merge; : "${KVCM_SMOLLM2_GGUF:?models: stage SmolLM2 first (../shared/tools/gpu-stage; source .gpu/b/setup.sh)}" ;;
  *) echo "gpu_lane: unknown stage '${stage}' ($usage)" >&2; exit 2 ;;
esac
split=()
if [ -n "${2:-}" ]; then
  if ! [[ $2 =~ ^([1-9][0-9]{0,2})/([1-9][0-9]{0,2})$ ]] || [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
    echo "gpu_lane: group '$2' is not K/N with 1 <= K <= N <= 999" >&2; exit 2
  fi
  split=(--splits "${BASH_REMATCH[2]}" --group "${BASH_REMATCH[1]}")
fi
deadline=${DEADLINE_S:-470}
if ! [[ $deadline =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_lane: DEADLINE_S='$deadline' must be a whole number of seconds > 0" >&2; exit 2
fi
out=${OUT:-.kvcm/gpu-lane}   # its logs have fixed names: never a folder holding files this script did not write
. "$(dirname "$0")/owned_dir.sh"
own_out_dir "$out" "gpu_lane.sh (OUT)"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
lane=$(python3 -c "import torch; print('l0_h200' if 'H200' in torch.cuda.get_device_name() else 'l0_h100')" 2>/dev/null) || {
  echo "gpu_lane: no CUDA device (torch.cuda.get_device_name() failed or torch is missing); the GPU lane runs on an H100 or H200" >&2; exit 2; }
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
part=${2:-1/1}   # K of K/N, or the whole stage as part 1 (set -u: an absent $2 must not be read bare)
record=$out/durations-$lane-$term-${part%%/*}.json
base=ci/durations/$lane-$term.json
if [ -f "$base" ]; then cp "$base" "$record"; else echo '{}' > "$record"; fi
echo "== $lane $term (gpu_$stage) ${2:-whole} at ${SECONDS} s"
gpu_only=()
[ "$stage" = models ] && gpu_only=(--kvcm-gpu-only)   # the interpreter and CPU forms of post-merge run on the CPU lane
timeout -s INT "$deadline" python3 -m pytest --rootdir "$PWD" -p pytest_kvcm.plugin --kvcm-lane="$lane" --kvcm-stage="$term" \
  --kvcm-version=both "${gpu_only[@]}" "${split[@]}" --durations-path "$record" --store-durations --clean-durations \
  -q -ra -p no:randomly > "$out/lane-$stage.log" 2>&1
status=$?
tail -40 "$out/lane-$stage.log"
echo "== done at ${SECONDS} s"
exit "$status"
