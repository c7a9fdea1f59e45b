#!/usr/bin/env bash
# The README's H200 figures in one run, for a GPU machine where the project is not pip-installed:
#   1. benchmarks/throughput.py on all 1,319 GSM8K questions (256 new tokens, batch 256, bf16): tok/s and GSM8K
#      accuracy of kvcm (graphs, overlapped), kvcm eager, HF generate and generate_batch; the drift of each
#      from an fp32 run; fp32 overlapped vs serial on 64 prompts; a graph decode step's host share;
#   2. the GPU lane: pytest -p pytest_kvcm.plugin --kvcm-lane=l0_h200 --kvcm-version=both;
#   3. benchmarks/kernel_drift.py (which component moves bf16 logits from fp32), if time is left.
# Needs KVCM_SMOLLM2_GGUF and KVCM_GSM8K_DIR (../shared/tools/gpu-stage's setup.sh sets both) and the wheels of
# ci/gpu_wheels.sh installed. BUDGET_S (default 560) bounds the whole run: each part gets what is left, the
# lane is interrupted (SIGINT: pytest still prints its counts) rather than killed. Logs go to OUT (default .).
set -uo pipefail
out=${OUT:-.}
budget=${BUDGET_S:-560}
start=$SECONDS
left() {   # seconds until mark $1 (of 560, scaled to the budget); at least 1 (timeout 0 would mean none)
  local v=$(( $1 * budget / 560 - (SECONDS - start) ))
  echo $(( v < 1 ? 1 : v ))
}
: "${KVCM_SMOLLM2_GGUF:?set it (gpu-stage setup.sh does)}" "${KVCM_GSM8K_DIR:?set it}"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

echo "== throughput"
timeout "$(left 340)" python3 benchmarks/throughput.py --gsm8k "$KVCM_GSM8K_DIR" --num-prompts 0 \
  --max-new-tokens 256 --batch-size 256 --dtype bfloat16 --repeats 1 --json "$out/throughput.json" 2>&1 \
  | grep -v -E "Loading weights|Warning" | tee "$out/throughput.log"

echo "== lane at $((SECONDS - start)) s"
timeout -s INT "$(left 480)" python3 -m pytest -p pytest_kvcm.plugin --kvcm-lane=l0_h200 --kvcm-version=both -q \
  2>&1 | tail -80 > "$out/lane.log"
tail -30 "$out/lane.log"

echo "== kernel drift at $((SECONDS - start)) s"
timeout "$(left 550)" python3 benchmarks/kernel_drift.py --num-prompts 16 --max-new-tokens 96 2>&1 \
  | grep -v -E "Loading weights|Warning" | tail -8
echo "== done at $((SECONDS - start)) s"
