"""Greedy parity and speculative decoding on one GPU: SmolLM2-135M fp32 on 64 GSM8K questions (chat template).

1. kvcm engine V1 vs V2 (eager and CUDA graphs): identical tokens (strict);
2. kvcm engine vs HF ``generate``: identical up to near ties (logit margin under ``--tolerance``), each reported;
3. tokens/s of each at batch 64 (median of ``--repeats`` runs, engines taking turns);
4. speculative decoding (target SmolLM2, drafter = its first ``--draft-layers`` layers): exactly the plain greedy
   tokens for D = 1, 2, 4 and V1/V2 target/draft pairs, with the mean acceptance length.

    KVCM_SMOLLM2_GGUF=... KVCM_GSM8K_DIR=... python benchmarks/gpu_spec.py

Also runs on the CPU (``--device cpu --num-prompts 4 --max-new-tokens 16``) as a smoke run of the script.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    ap.add_argument("--draft-layers", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=1e-3, help="logit margin below which a flip is a near tie")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"))
    args = ap.parse_args(argv)

    import kvcm
    from kvcm.engine import LLM, SamplingParams
    from kvcm.engine.llm import eos_token_ids
    from kvcm.models import hf_generate, load_smollm2, truncated_drafter
    from kvcm.engine.speculative import SpeculativeLLM
    from pytest_kvcm.parity import compare_outputs
    from throughput import load_prompts, sync

    t0 = time.perf_counter()
    dev = args.device
    say(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), torch {torch.__version__}")
    model, tok = load_smollm2(dtype=torch.float32, device=dev)
    eos = list(eos_token_ids(model, tok))
    prompts = load_prompts(tok, args.num_prompts, args.gsm8k)
    bs, n_new = len(prompts), args.max_new_tokens
    say(f"{bs} prompts ({'GSM8K' if args.gsm8k else 'built-in'}), mean {sum(map(len, prompts)) / bs:.0f} tokens, "
        f"{n_new} new tokens, batch {bs}, eos {eos}")
    max_seq = max(map(len, prompts)) + n_new + 8

    def kv_config():
        return (kvcm.KvCacheConfig(tokens_per_block=32, free_gpu_memory_fraction=0.3, dtype="float32")
                if dev == "cuda" else kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=bs * max_seq, dtype="float32"))

    runs = {}
    for name, version, graph in (("kvcm_v1", "v1", False), ("kvcm_v2", "v2", False), ("kvcm_v1_graph", "v1", True),
                                 ("kvcm_v2_graph", "v2", True)):
        if graph and dev != "cuda":
            continue
        llm = LLM(model, tok, manager_version=version, kv_cache_config=kv_config(), max_batch_size=bs,
                  max_seq_len=max_seq, device=dev, cuda_graph=graph)
        llm.generate(prompts[:2], SamplingParams(max_new_tokens=4))
        runs[name] = (llm, lambda p, llm=llm: llm.generate(p, SamplingParams(max_new_tokens=n_new)))
    runs["hf"] = (None, lambda p: hf_generate(model, p, n_new, eos_token_id=eos, batch_size=bs))
    runs["hf"][1](prompts[:2])
    outs, times = {}, {name: [] for name in runs}
    for r in range(args.repeats):
        for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            sync(dev)
            t = time.perf_counter()
            outs[name] = runs[name][1](prompts)
            sync(dev)
            times[name].append(time.perf_counter() - t)
    rates = {}
    for name in runs:
        n = sum(len(o.token_ids) for o in outs[name])
        dt = statistics.median(times[name])
        rates[name] = n / dt
        say(f"{name:>14}: {n} tokens, median {dt:.2f} s = {n / dt:8.1f} tok/s")
    for name in rates:
        if name != "hf":
            say(f"   {name} / hf = {rates[name] / rates['hf']:.2f}x")
    ok = True
    pairs = [("kvcm_v1", "kvcm_v2", None), ("kvcm_v2", "kvcm_v2_graph", None), ("kvcm_v1_graph", "kvcm_v2_graph", None),
             ("hf", "kvcm_v1", args.tolerance), ("hf", "kvcm_v2", args.tolerance), ("hf", "kvcm_v2_graph", args.tolerance)]
    for a, b, tol in pairs:
        if a in outs and b in outs:
            rep = compare_outputs(outs[a], outs[b], prompts, names=(a, b), tokenizer=tok, margin_tolerance=tol)
            ok &= rep.passed
            kind = "strict" if tol is None else f"near ties < {tol} allowed"
            say(f"PARITY {a} vs {b} ({kind}): {'PASS' if rep.passed else 'FAIL'}")
            say("   " + rep.format().replace("\n", "\n   "))
    for llm, _ in runs.values():
        if llm is not None:
            llm.close()
    runs.clear()
    say(f"elapsed {time.perf_counter() - t0:.1f} s")

    # speculative decoding: exactly the plain greedy tokens of the same engine; acceptance length
    sp = prompts[:args.spec_prompts]
    plain = outs["kvcm_v2"][:len(sp)]
    drafter = truncated_drafter(model, args.draft_layers)
    for d, tv, dv in ((1, "v2", "v2"), (2, "v2", "v2"), (4, "v2", "v2"), (4, "v1", "v2"), (4, "v2", "v1"),
                      (4, "v1", "v1")):
        cfg = kv_config()
        spec = SpeculativeLLM(model, drafter, num_draft=d, target_version=tv, draft_version=dv,
                              target_kv_cache_config=cfg, draft_kv_cache_config=cfg, max_batch_size=len(sp),
                              max_seq_len=max_seq + d + 1, device=dev, eos_token_ids=eos)
        sync(dev)
        t = time.perf_counter()
        souts = spec.generate(sp, n_new)
        sync(dev)
        dt = time.perf_counter() - t
        n = sum(len(o.token_ids) for o in souts)
        rep = compare_outputs(plain, souts, sp, names=("plain_v2", "spec"), tokenizer=tok)
        ok &= rep.passed
        st = spec.stats
        say(f"spec D={d} target {tv} / draft {dv} ({args.draft_layers}-layer drafter): {n} tokens in {dt:.2f} s = "
            f"{n / dt:.1f} tok/s; mean acceptance length {st.mean_acceptance_length:.3f}, acceptance rate "
            f"{st.acceptance_rate:.3f}; parity vs plain (strict): {'PASS' if rep.passed else 'FAIL'}")
        if not rep.passed:
            say("   " + rep.format().replace("\n", "\n   "))
        del spec
    say(f"total {time.perf_counter() - t0:.1f} s; {'ALL PASS' if ok else 'SOME FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
