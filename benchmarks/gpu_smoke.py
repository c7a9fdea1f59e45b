"""A first look on a CUDA machine: SmolLM2 loads, the kvcm engine matches HF generate, rough tokens/s.

    python benchmarks/gpu_smoke.py   (env KVCM_SMOLLM2_GGUF, KVCM_GSM8K_DIR as the GPU staging script sets)
"""

import json
import os
import time

import torch
import transformers

from kvcm.engine import LLM, SamplingParams
from kvcm.engine.models import chat_prompt_ids, hf_generate, load_smollm2

DEVICE = os.environ.get("KVCM_DEVICE", "cuda")
N = int(os.environ.get("KVCM_SMOKE_N", "64"))


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main():
    print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", flush=True)
    t0 = time.time()
    model, tok = load_smollm2(dtype=torch.float32, device=DEVICE)
    print(f"loaded in {time.time() - t0:.1f}s eos={tok.eos_token_id}", flush=True)
    rows = [json.loads(line) for line in open(os.path.join(os.environ["KVCM_GSM8K_DIR"], "test.jsonl"))][:N]
    prompts = [chat_prompt_ids(tok, r["question"]) for r in rows]
    n_new = int(os.environ.get("KVCM_SMOKE_NEW", "128"))
    for version in ("v1", "v2"):
        llm = LLM(model, tok, manager_version=version, max_batch_size=64, max_seq_len=1024, device=DEVICE)
        llm.generate(prompts[:4], SamplingParams(max_new_tokens=8))
        sync()
        t = time.time()
        outs = llm.generate(prompts, SamplingParams(max_new_tokens=n_new, stop_token_ids=(tok.eos_token_id,)))
        sync()
        dt = time.time() - t
        ntok = sum(len(o.token_ids) for o in outs)
        print(f"kvcm {version}: {ntok} tokens in {dt:.2f}s = {ntok / dt:.0f} tok/s", flush=True)
        if version == "v1":
            ref = outs
        else:
            same = sum(a.token_ids == b.token_ids for a, b in zip(ref, outs))
            print(f"v1 vs v2 identical: {same}/{len(outs)}", flush=True)
    t = time.time()
    hf = hf_generate(model, prompts, n_new, eos_token_id=tok.eos_token_id, batch_size=64)
    sync()
    dt = time.time() - t
    hf_ids = [h.token_ids for h in hf]
    ntok = sum(len(h) for h in hf_ids)
    print(f"hf generate: {ntok} tokens in {dt:.2f}s = {ntok / dt:.0f} tok/s", flush=True)
    same = sum(list(a.token_ids) == list(b) for a, b in zip(outs, hf_ids))
    print(f"kvcm v2 vs hf identical: {same}/{len(outs)}", flush=True)


if __name__ == "__main__":
    main()
