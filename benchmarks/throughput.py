"""Throughput of the kvcm reference engine next to Hugging Face ``generate`` (static batches, left padding) and
transformers' own continuous batching (``generate_batch``), on the same prompts in one run.

    python benchmarks/throughput.py                       # SmolLM2 fp32 on CPU, 32 built-in prompts
    python benchmarks/throughput.py --device cuda --num-prompts 64 --gsm8k /data/gsm8k --batch-sizes 64

Tokens/s counts generated tokens (prompt tokens excluded) over wall time, greedy, no sampling. A short warmup
run of each engine comes first so one-off costs (allocator, kernels, CUDA context) stay out of the figures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUILTIN = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in one sentence.",
    "What is 17 plus 25?", "Name three primary colors.", "Give me a synonym for happy.",
    "How many legs does a spider have?", "Translate 'good morning' into Spanish.",
    "What is the boiling point of water in Celsius?", "Suggest a name for a pet cat.",
    "Why is the sky blue?", "List two uses of a paperclip.", "What does a CPU do?",
    "Write one sentence about autumn.", "What is 9 times 8?", "Who wrote Romeo and Juliet?",
    "Describe a rainbow briefly.", "What is the largest planet?", "How do you make tea?",
    "What is a prime number?", "Give a tip for better sleep.", "What is the opposite of cold?",
    "Name a famous painting.", "What is gravity?", "How many days are in a leap year?",
    "What language is spoken in Brazil?", "Write a short greeting for a birthday card.",
    "What is the chemical symbol for gold?", "Name a fruit that is yellow.", "What is an ocean current?",
    "How many minutes are in two hours?", "What do bees make?",
]


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def load_prompts(tok, num: int, gsm8k: str | None) -> list[list[int]]:
    from kvcm.engine.models import chat_prompt_ids
    if gsm8k:
        path = Path(gsm8k)
        files = [path] if path.is_file() else sorted(path.glob("*test*.jsonl")) or sorted(path.glob("*.jsonl"))
        if not files:
            raise SystemExit(f"--gsm8k {gsm8k}: no .jsonl file there (want GSM8K test rows with a 'question')")
        questions = []
        for line in files[0].read_text().splitlines():
            if line.strip():
                questions.append(json.loads(line)["question"])
            if len(questions) >= num:
                break
    else:
        questions = [BUILTIN[i % len(BUILTIN)] for i in range(num)]
    return [chat_prompt_ids(tok, q) for q in questions]


def run_kvcm(model, tok, prompts, max_new, batch_size, device, version="v2"):
    import kvcm
    from kvcm.engine import LLM, SamplingParams
    max_seq = max(len(p) for p in prompts) + max_new + 8
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[model.dtype]
    cfg = (kvcm.KvCacheConfig(tokens_per_block=32, free_gpu_memory_fraction=0.5, dtype=dtype)
           if torch.device(device).type == "cuda" else
           kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=batch_size * (max_seq + 64), dtype=dtype))
    llm = LLM(model, tok, manager_version=version, kv_cache_config=cfg, max_batch_size=batch_size,
              max_seq_len=max_seq, device=device)
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=max_new))
    return outs


def run_hf(model, tok, prompts, max_new, batch_size, device):
    from kvcm.engine.models import hf_generate
    return hf_generate(model, prompts, max_new, eos_token_id=tok.eos_token_id, batch_size=batch_size)


def run_cb(model, tok, prompts, max_new, batch_size, device):
    """transformers' continuous batching. 5.17+ takes a ``ContinuousBatchingConfig`` (older releases read the
    same fields from ``GenerationConfig``); the attention implementation must be a paged one."""
    from transformers import GenerationConfig
    gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id)
    max_seq = max(len(p) for p in prompts) + max_new + 8
    cb_fields = dict(max_batch_tokens=max(512, batch_size * 16), num_blocks=max(64, batch_size * max_seq // 32 + 8))
    kwargs = {}
    params = inspect.signature(model.generate_batch).parameters
    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError:
        ContinuousBatchingConfig = None
    if ContinuousBatchingConfig is not None and "continuous_batching_config" in params:
        kwargs["continuous_batching_config"] = ContinuousBatchingConfig(page_size=32, max_requests_per_batch=batch_size,
                                                                        **cb_fields)
    else:
        for k, v in dict(cb_fields, block_size=32).items():
            setattr(gen, k, v)
    if "warmup" in params and torch.device(device).type != "cuda":
        kwargs["warmup"] = False
    try:  # 5.24 switches to a paged-capable attention itself
        res = model.generate_batch(prompts, generation_config=gen, progress_bar=False, **kwargs)
    except ValueError as exc:  # older releases want the paged implementation named explicitly
        if "attn" not in str(exc) and "paged" not in str(exc):
            raise
        saved = model.config._attn_implementation
        model.set_attn_implementation("sdpa_paged")
        try:
            res = model.generate_batch(prompts, generation_config=gen, progress_bar=False, **kwargs)
        finally:
            model.set_attn_implementation(saved)
    outs = sorted(res.values(), key=lambda o: int(str(o.request_id).rsplit("_", 1)[-1]))
    from kvcm.engine.models import GenOutput
    return [GenOutput(list(o.generated_tokens)) for o in outs]


def timed(name, fn, model, tok, prompts, max_new, bs, device, *extra):
    args = (model, tok, prompts, max_new, bs, device, *extra)
    sync(device)
    t = time.perf_counter()
    outs = fn(*args)
    sync(device)
    dt = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    print(f"{name:>24}: {n:6d} tokens in {dt:7.2f} s = {n / dt:8.1f} tok/s", flush=True)
    return outs, n / dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", default="32", help="comma-separated batch sizes, e.g. 8,32")
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"), help="GSM8K jsonl dir (chat template)")
    ap.add_argument("--engines", default="kvcm,hf,cb", help="subset of kvcm,hf,cb")
    ap.add_argument("--kvcm-version", default="v2", choices=["v1", "v2"])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvcm.engine.models import load_smollm2
    from pytest_kvcm.parity import compare_outputs
    dtype = getattr(torch, args.dtype)
    model, tok = load_smollm2(dtype=dtype, device=args.device)
    prompts = load_prompts(tok, args.num_prompts, args.gsm8k)
    engines = {"kvcm": run_kvcm, "hf": run_hf, "cb": run_cb}
    chosen = [e for e in args.engines.split(",") if e]
    print(f"SmolLM2-135M {args.dtype} on {args.device}, {len(prompts)} prompts (mean {sum(map(len, prompts)) / len(prompts):.0f}"
          f" tokens), {args.max_new_tokens} new tokens, torch {torch.__version__}, threads {torch.get_num_threads()}",
          flush=True)
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        print(f"-- batch size {bs}", flush=True)
        rates, outs = {}, {}
        for name in chosen:
            fn = engines[name]
            label = {"kvcm": f"kvcm engine ({args.kvcm_version})", "hf": "HF generate",
                     "cb": "HF generate_batch (CB)"}[name]
            extra = (args.kvcm_version,) if name == "kvcm" else ()
            try:
                fn(model, tok, prompts[:2], 4, bs, args.device, *extra)  # warmup
                outs[name], rates[name] = timed(label, fn, model, tok, prompts, args.max_new_tokens, bs,
                                                args.device, *extra)
            except Exception as exc:  # one engine failing must not hide the others' numbers
                print(f"{label:>24}: failed: {type(exc).__name__}: {exc}", flush=True)
        if "kvcm" in rates:
            for other in ("hf", "cb"):
                if other in rates:
                    print(f"   kvcm / {other}: {rates['kvcm'] / rates[other]:.2f}x", flush=True)
        if "kvcm" in outs and "hf" in outs:
            rep = compare_outputs(outs["hf"], outs["kvcm"], prompts, names=("hf", "kvcm"), tokenizer=tok,
                                  margin_tolerance=1e-3)
            print("   " + rep.format().replace("\n", "\n   "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
