#!/usr/bin/env bash
# The H200 figures of docs/benchmarks.md, for a GPU machine where the project is not pip-installed. Parts (all by default, in
# this order; name some to run only those, e.g. `bash ci/h200_figures.sh lane`, since one device call lasts at
# most 10 minutes):
#   throughput  benchmarks/throughput.py on all 1,319 GSM8K questions (256 new tokens, batch 256, bf16): tok/s and
#               GSM8K accuracy of kvcm (graphs, overlapped), kvcm eager, HF generate and generate_batch; the drift
#               of each from an fp32 run; fp32 overlapped vs serial on 64 prompts; a graph decode step's host share
#   lane        the GPU lane's post-merge stage, gpu_models (the gates that need the weights and GSM8K):
#               bash ci/gpu_lane.sh models; LANE_STAGE=smoke runs its pre-merge stage instead (nothing staged)
#   hostshare   benchmarks/throughput.py with kvcm graphs alone, twice back to back: tok/s and the host share
#               (a median over steps) of two runs in a row
#   wide        the hostshare run at vLLM's LLM-class defaults for an H100/H200 (1,024 sequences, 16,384 tokens a
#               step; vllm/engine/arg_utils.py) instead of 256 and 8,192, twice back to back, then the few-shot
#               8-shot run of kvcm V2 (no HF) at the same limits
#   spec        benchmarks/gpu_spec.py: speculative decoding's exactness and speed against plain graph decode
#   cutoff      benchmarks/gpu_spec.py --only speed (bf16, D = 4, both drafters, median of 3) at batch 1, 4, 8 .. 256, always
#               speculating and with the engine's default cut-off (spec_max_concurrency)
#   reuse       SmolLM2's GPU-lane block-reuse gates (suites/engine/test_reuse_cuda.py), then benchmarks/fewshot.py
#               on all 1,319 GSM8K questions 8-shot (bf16, batch 256): HF generate, kvcm V2 and V1 with reuse
#               off and on
#   kernels     benchmarks/decode_attention.py (the decode attention kernel, whole vs split keys, batch x KV
#               length) and benchmarks/prefill_attention.py (the kernel on the benchmarks' prefill steps, by query
#               tile); no weights and no GSM8K, so the call that stages the model's first half can run it
#   breakdown   benchmarks/step_breakdown.py (SmolLM2-135M's shape, random weights, bf16, batch 256): a full-batch
#               decode step and a mixed step kernel class by kernel class, with the fused layers and without;
#               no weights and no GSM8K
#   pipelined   the attention kernel's launch tunings side by side: benchmarks/decode_attention.py --variants (key
#               loop plain or software-pipelined, decode rows searched or by index, tile, warps, pipeline depth;
#               batch x KV length, outputs checked equal), then benchmarks/step_breakdown.py (the step of `breakdown`,
#               fused layers) with the rows searched, by index (the default) and pipelined; no weights, no GSM8K
#   hosttier    benchmarks/host_tier.py (SmolLM2-135M's shape, random weights, bf16, graphs): the host tier against
#               recomputing, V1 and V2, with and without the tier, where the prefixes do not fit the GPU pool;
#               HOST_PREFIXES (default 32) prefixes of 2,048-4,096 tokens; no weights and no GSM8K
#   split       benchmarks/fewshot.py 8-shot with kvcm V2 alone (no HF): as it is, decode_split_len 256, and
#               prefill_block_m 64
#   rowmap      LLM(step_row_map=True) against the engine as it is, one after the other: benchmarks/fewshot.py 8-shot
#               (V2 and V1, reuse off and on, no HF) and benchmarks/throughput.py (kvcm graphs alone)
#   drift       benchmarks/kernel_drift.py: which component moves bf16 logits from fp32
#   gemma       Gemma 3 270M: its GPU gates (suites/engine/test_gemma3_cuda.py, test_gemma3_tiny.py on CUDA) and
#               benchmarks/fewshot.py on all 1,319 GSM8K questions 5-shot (bf16, batch 256): HF generate, then kvcm
#               V2 and V1 on graphs with block reuse off and on, until DEADLINE_S (default 570) s into the script
# Needs KVCM_GSM8K_DIR and the wheels of ci/gpu_wheels.sh installed; every part but gemma needs KVCM_SMOLLM2_GGUF
# (../shared/tools/gpu-stage's setup.sh sets it and KVCM_GSM8K_DIR), gemma needs KVCM_GEMMA3_GGUF (ci/gemma_stage.sh's
# setup.sh sets it, KVCM_GSM8K_DIR and the wheels). BUDGET_S (default 560) bounds each part; the lane is interrupted (SIGINT: pytest
# still prints its counts) rather than killed. Logs go to OUT (default .kvcm/figures; a folder that holds
# files this script did not write is refused).
set -uo pipefail
out=${OUT:-.kvcm/figures}   # its logs have fixed names: never a folder holding files this script did not write
. "$(dirname "$0")/owned_dir.sh"
own_out_dir "$out" "h200_figures.sh (OUT)"
budget=${BUDGET_S:-560}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(throughput lane spec drift)   # gemma runs only when named (its model is staged apart)
for part in "${parts[@]}"; do
  case $part in
    kernels|breakdown|hosttier|pipelined) ;;
    gemma) : "${KVCM_GSM8K_DIR:?set it}" "${KVCM_GEMMA3_GGUF:?set it (ci/gemma_stage.sh setup.sh does)}" ;;
    *) : "${KVCM_GSM8K_DIR:?set it}" "${KVCM_SMOLLM2_GGUF:?set it (gpu-stage setup.sh does)}" ;;
  esac
done
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
      OUT=$out/lane DEADLINE_S=$budget bash ci/gpu_lane.sh "${LANE_STAGE:-models}" ;;
    hostshare)
      for run in 1 2; do
        timeout $(( budget / 2 )) python3 benchmarks/throughput.py --gsm8k "$KVCM_GSM8K_DIR" --num-prompts 0 \
          --max-new-tokens 256 --batch-size 256 --dtype bfloat16 --repeats 1 --engines kvcm-graph --no-reference \
          --json "$out/hostshare$run.json" 2>&1 | quiet | grep -E "kvcm-graph:|host share|steps" | tee -a "$out/hostshare.log"
      done ;;
    wide)
      for run in 1 2; do
        timeout $(( budget / 3 )) python3 benchmarks/throughput.py --gsm8k "$KVCM_GSM8K_DIR" --num-prompts 0 \
          --max-new-tokens 256 --batch-size 1024 --max-num-tokens 16384 --dtype bfloat16 --repeats 1 \
          --engines kvcm-graph --no-reference --json "$out/wide$run.json" 2>&1 | quiet \
          | grep -E "kvcm-graph:|host share|steps" | tee -a "$out/wide.log"
      done
      timeout $(( budget / 3 )) python3 benchmarks/fewshot.py --model smollm2 --shots 8 --num-prompts 0 \
        --kvcm-versions v2 --dtype bfloat16 --batch-size 1024 --max-num-tokens 16384 --no-hf --profile \
        --json "$out/fewshot_wide.json" 2>&1 | quiet | tee -a "$out/wide.log" ;;
    breakdown)
      for fused in "" --no-fused-layers; do
        timeout $(( budget / 2 )) python3 benchmarks/step_breakdown.py $fused --json "$out/breakdown${fused:+-unfused}.json" \
          2>&1 | quiet | tee "$out/breakdown${fused:+-unfused}.log"
      done ;;
    pipelined)
      timeout $(( budget / 2 )) python3 benchmarks/decode_attention.py --batches 256 64 --kv-lens 221 1400 4096 \
        --variants plain:32:4 plain+index:32:4 pipe:32:4:3 pipe+index:32:4:3 pipe+index:32:4:2 pipe+index:64:4:3 \
        pipe+index:64:8:3 pipe+index:32:2:3 plain+index:64:4 pipe+index:128:8:3 pipe+index:64:4:4 pipe+index:16:2:3 \
        2>&1 | quiet | tee "$out/pipelined-kernel.log"
      # the fused step with the decode rows searched (as before), by index (the default), the other steps' rows
      # mapped once a step, and the key loop pipelined
      for opt in --search-decode-rows "" --step-row-map --pipelined-keys; do
        timeout $(( budget / 8 )) python3 benchmarks/step_breakdown.py $opt --json "$out/breakdown${opt:+-${opt#--}}.json" \
          2>&1 | quiet | tee "$out/breakdown${opt:+-${opt#--}}.log"
      done ;;
    hosttier)
      timeout "$budget" python3 benchmarks/host_tier.py --prefixes "${HOST_PREFIXES:-32}" --json "$out/host_tier.json" \
        2>&1 | quiet | tee "$out/host_tier.log" ;;
    cutoff)
      timeout "$budget" python3 benchmarks/gpu_spec.py --only speed --dtype bfloat16 --drafts 4 \
        --batches 1 4 8 16 32 64 256 --cutoffs none default --repeats 3 --token-buckets 16 64 256 1024 \
        --json "$out/cutoff.json" 2>&1 | quiet | tee "$out/cutoff.log" ;;
    reuse)
      timeout -s INT 240 python3 -m pytest -p pytest_kvcm.plugin --kvcm-stage=post_merge suites/engine/test_reuse_cuda.py -q -ra 2>&1 \
        | grep -v -E "Warning|warn" | tail -25 | tee "$out/reuse_gates.log"
      timeout "$(( ${DEADLINE_S:-570} - SECONDS ))" python3 benchmarks/fewshot.py --model smollm2 --shots 8 \
        --num-prompts 0 --kvcm-versions v2,v1 --dtype bfloat16 --batch-size 256 --profile --json "$out/fewshot.json" 2>&1 \
        | quiet | tee "$out/fewshot.log" ;;
    kernels)
      timeout 120 python3 benchmarks/decode_attention.py 2>&1 | tee "$out/decode_attention.log"
      timeout 80 python3 benchmarks/prefill_attention.py 2>&1 | tee "$out/prefill_attention.log" ;;
    split)
      n=0
      for opt in "--decode-split-len 0" "--decode-split-len 256" "--prefill-block-m 64"; do
        n=$(( n + 1 ))
        echo "== fewshot.py $opt (fewshot_split$n.json)" | tee -a "$out/fewshot_split.log"
        # shellcheck disable=SC2086  # $opt is a flag and its value
        timeout $(( budget / 3 )) python3 benchmarks/fewshot.py --model smollm2 --shots 8 --num-prompts 0 \
          --kvcm-versions v2 --dtype bfloat16 --batch-size 256 --no-hf --profile $opt \
          --json "$out/fewshot_split$n.json" 2>&1 | quiet | tee -a "$out/fewshot_split.log"
      done ;;
    rowmap)
      for opt in "" --step-row-map; do     # as it is, then the other steps' rows mapped once a step
        echo "== rowmap ${opt:-(as it is)}" | tee -a "$out/rowmap.log"
        # shellcheck disable=SC2086  # $opt is one flag or none
        timeout $(( budget / 4 )) python3 benchmarks/fewshot.py --model smollm2 --shots 8 --num-prompts 0 \
          --kvcm-versions v2 v1 --dtype bfloat16 --batch-size 256 --no-hf --profile $opt \
          --json "$out/rowmap-fewshot${opt:+-map}.json" 2>&1 | quiet | tee -a "$out/rowmap.log"
        # shellcheck disable=SC2086
        timeout $(( budget / 4 )) python3 benchmarks/throughput.py --gsm8k "$KVCM_GSM8K_DIR" --num-prompts 0 \
          --max-new-tokens 256 --batch-size 256 --dtype bfloat16 --repeats 1 --engines kvcm-graph --no-reference $opt \
          --json "$out/rowmap-throughput${opt:+-map}.json" 2>&1 | quiet | grep -E "kvcm-graph:|host share|steps" \
          | tee -a "$out/rowmap.log"
      done ;;
    spec)
      timeout "$budget" python3 benchmarks/gpu_spec.py --json "$out/gpu_spec.json" 2>&1 | quiet \
        | tee "$out/gpu_spec.log" ;;
    drift)
      timeout "$budget" python3 benchmarks/kernel_drift.py --num-prompts 16 --max-new-tokens 96 2>&1 | quiet | tail -8 ;;
    gemma)
      t0=$SECONDS
      python3 -c "from kvcm.models.gemma3 import gemma3_cache_dir; print('gemma: converted to', gemma3_cache_dir())" 2>&1 | quiet
      echo "gemma: GGUF de-quantized in $((SECONDS - t0)) s"
      timeout -s INT 200 python3 -m pytest -p pytest_kvcm.plugin --kvcm-stage=post_merge suites/engine/test_gemma3_cuda.py \
        suites/engine/test_gemma3_tiny.py -q -ra -s 2>&1 | grep -v -E "Warning|warn" | tail -25 | tee "$out/gemma_gates.log"
      timeout "$(( ${DEADLINE_S:-570} - SECONDS ))" python3 benchmarks/fewshot.py --model gemma-3-270m --shots 5 --num-prompts 0 \
        --kvcm-versions v2,v1 --dtype bfloat16 --batch-size 256 --json "$out/gemma_fewshot.json" 2>&1 | quiet \
        | tee "$out/gemma_fewshot.log" ;;
    *) echo "h200_figures: unknown part '$part' (throughput, hostshare, wide, lane, spec, cutoff, reuse, kernels, breakdown, pipelined, hosttier, split, rowmap, drift, gemma)" >&2
       exit 2 ;;
  esac
done
echo "== done at ${SECONDS} s"
