"""GPU check on one H200 (torch 2.11, transformers 5.17, offline): SmolLM2-135M fp32 on 64 GSM8K questions.

1. kvcm engine V1 vs V2: identical tokens (strict);
2. kvcm engine vs HF ``generate``: identical up to near ties, each reported with its logit margin;
3. tokens/s of the kvcm engine (V1, V2) and HF generate at batch 64;
4. speculative decoding (target SmolLM2, drafter = its first 10 layers, D = 4): tokens equal to plain greedy,
   and the mean acceptance length.

    KVCM_SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf KVCM_GSM8K_DIR=/path/gsm8k python benchmarks/gpu_spec.py

Env ``KVCM_CACHE_DIR`` (optional) is where the converted model is kept. Everything prints with flush=True.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def say(*a):
    print(*a, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--spec-prompts", type=int, default=16)
    ap.add_argument("--num-draft", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=10)
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"))
    args = ap.parse_args(argv)

    import kvcm
    from kvcm.engine.llm import eos_token_ids
    from kvcm.engine.models import load_smollm2, truncated_drafter
    from kvcm.engine.speculative import SpeculativeLLM
    from pytest_kvcm.parity import compare_outputs
    from throughput import load_prompts, run_hf, run_kvcm, sync

    t0 = time.perf_counter()
    dev = args.device
    say(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), torch {torch.__version__}")
    model, tok = load_smollm2(dtype=torch.float32, device=dev)
    say(f"model loaded in {time.perf_counter() - t0:.1f} s; eos id {tok.eos_token_id}")
    prompts = load_prompts(tok, args.num_prompts, args.gsm8k)
    say(f"{len(prompts)} prompts ({'GSM8K' if args.gsm8k else 'built-in'}), mean {sum(map(len, prompts)) / len(prompts):.0f} tokens, "
        f"{args.max_new_tokens} new tokens, batch {len(prompts)}")
    bs = len(prompts)

    outs, rates = {}, {}
    for name, fn, extra in (("kvcm_v1", run_kvcm, ("v1",)), ("kvcm_v2", run_kvcm, ("v2",)), ("hf", run_hf, ())):
        try:
            fn(model, tok, prompts[:2], 4, bs, dev, *extra)  # warmup
            sync(dev)
            t = time.perf_counter()
            outs[name] = fn(model, tok, prompts, args.max_new_tokens, bs, dev, *extra)
            sync(dev)
            dt = time.perf_counter() - t
            n = sum(len(o.token_ids) for o in outs[name])
            rates[name] = n / dt
            say(f"{name:>8}: {n} tokens in {dt:.2f} s = {n / dt:.1f} tok/s")
        except Exception as exc:
            say(f"{name:>8}: FAILED {type(exc).__name__}: {exc}")
    if "kvcm_v2" in rates and "hf" in rates:
        say(f"kvcm_v2 / hf = {rates['kvcm_v2'] / rates['hf']:.2f}x; kvcm_v1 / hf = "
            f"{rates.get('kvcm_v1', 0) / rates['hf']:.2f}x")
    if "kvcm_v1" in outs and "kvcm_v2" in outs:
        rep = compare_outputs(outs["kvcm_v1"], outs["kvcm_v2"], prompts, names=("v1", "v2"), tokenizer=tok)
        say("PARITY V1 vs V2 (strict): " + ("PASS" if rep.passed else "FAIL"))
        say(rep.format())
    if "hf" in outs and "kvcm_v2" in outs:
        rep = compare_outputs(outs["hf"], outs["kvcm_v2"], prompts, names=("hf", "v2"), tokenizer=tok,
                              margin_tolerance=1e-3)
        say("PARITY HF vs V2 (near ties < 1e-3 allowed): " + ("PASS" if rep.passed else "FAIL"))
        say(rep.format())
    say(f"elapsed {time.perf_counter() - t0:.1f} s")

    # speculative decoding: exact vs plain greedy of the same engine, acceptance length
    sp = prompts[:args.spec_prompts]
    max_seq = max(map(len, sp)) + args.max_new_tokens + args.num_draft + 8
    cfg = (kvcm.KvCacheConfig(tokens_per_block=32, free_gpu_memory_fraction=0.2, dtype="float32") if dev == "cuda"
           else kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=len(sp) * (max_seq + 64), dtype="float32"))
    try:
        drafter = truncated_drafter(model, args.draft_layers)
        for tv, dv in (("v2", "v2"), ("v1", "v2")):
            spec = SpeculativeLLM(model, drafter, num_draft=args.num_draft, target_version=tv, draft_version=dv,
                                  target_kv_cache_config=cfg, draft_kv_cache_config=cfg, max_batch_size=len(sp),
                                  max_seq_len=max_seq, device=dev, eos_token_ids=eos_token_ids(model, tok))  # as plain LLM stops
            sync(dev)
            t = time.perf_counter()
            souts = spec.generate(sp, args.max_new_tokens)
            sync(dev)
            dt = time.perf_counter() - t
            n = sum(len(o.token_ids) for o in souts)
            ref = outs.get("kvcm_v2", [None] * len(prompts))[:len(sp)]
            st = spec.stats
            say(f"spec target {tv} / draft {dv}, D={args.num_draft}, drafter {args.draft_layers} layers: {n} tokens in "
                f"{dt:.2f} s = {n / dt:.1f} tok/s; mean acceptance length {st.mean_acceptance_length:.3f}, "
                f"acceptance rate {st.acceptance_rate:.3f}, preemptions {st.preemptions}")
            if ref[0] is not None:
                rep = compare_outputs(ref, souts, sp, names=("plain_v2", "spec"), tokenizer=tok)
                say(f"PARITY spec vs plain (strict): {'PASS' if rep.passed else 'FAIL'}")
                say(rep.format())
                if not rep.passed:
                    rep2 = compare_outputs(ref, souts, sp, names=("plain_v2", "spec"), tokenizer=tok,
                                           margin_tolerance=1e-3)
                    say(f"  with near ties < 1e-3 allowed: {'PASS' if rep2.passed else 'FAIL'}")
    except Exception as exc:
        say(f"speculative: FAILED {type(exc).__name__}: {exc}")
    say(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
