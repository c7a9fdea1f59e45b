#!/usr/bin/env bash
# The README's H200 figures, for a GPU machine where the project is not pip-installed. Parts (all by default, in
# this order; name some to run only those, e.g. `bash ci/h200_figures.sh lane`, since one device call lasts at
# most 10 minutes):
#   throughput  benchmarks/throughput.py on all 1,319 GSM8K questions (256 new tokens, batch 256, bf16): tok/s and
#               GSM8K accuracy of kvcm (graphs, overlapped), kvcm eager, HF generate and generate_batch; the drift
#               of each from an fp32 run; fp32 overlapped vs serial on 64 prompts; a graph decode step's host share
#   lane        the GPU lane, its slow tests (the model accuracy gates) included: pytest -p pytest_kvcm.plugin
#               --kvcm-lane=l0_h200 --kvcm-version=both --kvcm-slow
#   spec        benchmarks/gpu_spec.py: speculative decoding's exactness and speed against plain graph decode
#   drift       benchmarks/kernel_drift.py: which component moves bf16 logits from fp32
# Needs KVCM_SMOLLM2_GGUF and KVCM_GSM8K_DIR (../shared/tools/gpu-stage's setup.sh sets both) and the wheels of
# ci/gpu_wheels.sh installed. BUDGET_S (default 560) bounds each part; the lane is interrupted (SIGINT: pytest
# still prints its counts) rather than killed. Logs go to OUT (default .).
set -uo pipefail
out=${OUT:-.}
budget=${BUDGET_S:-560}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(throughput lane spec drift)
: "${KVCM_SMOLLM2_GGUF:?set it (gpu-stage setup.sh does)}" "${KVCM_GSM8K_DIR:?set it}"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
quiet() { grep -v -E "Loading weights|Converting|Writing model|Warning|warn" ; }
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

for part in "${parts[@]}"; do
  echo "== $part at ${SECONDS} s"
  case $part in
    throughput)
      timeout "$budget" python3 benchmarks/throughput.py --gsm8k "$KVCM_GSM8K_DIR" --num-prompts 0 \
        --max-new-tokens 256 --batch-size 256 --dtype bfloat16 --repeats 1 --json "$out/throughput.json" 2>&1 \
        | quiet | tee "$out/throughput.log" ;;
    lane)
      timeout -s INT "$budget" python3 -m pytest -p pytest_kvcm.plugin --kvcm-lane=l0_h200 --kvcm-version=both \
        --kvcm-slow -q -ra 2>&1 | tail -80 > "$out/lane.log"
      tail -30 "$out/lane.log" ;;
    spec)
      timeout "$budget" python3 benchmarks/gpu_spec.py --json "$out/gpu_spec.json" 2>&1 | quiet \
        | tee "$out/gpu_spec.log" ;;
    drift)
      timeout "$budget" python3 benchmarks/kernel_drift.py --num-prompts 16 --max-new-tokens 96 2>&1 | quiet | tail -8 ;;
    *) echo "h200_figures: unknown part '$part' (throughput, lane, spec, drift)" >&2; exit 2 ;;
  esac
done
echo "== done at ${SECONDS} s"
