"""Acceptance of the n-gram drafter's configurations on a model's real greedy outputs, without speculating.

Under greedy verification the drafts a step keeps depend only on the target's greedy text, so the acceptance a
drafter would get at batch 1 follows from one plain run: each request's text is replayed through the drafter in
the engine's order (requests one after another; the first verification after the prefill's token, the next
after the tokens each one kept), through the engine's own ``NgramDrafter.draft`` (same limits, same padding),
and each step keeps the longest prefix of its drafts that equals the greedy text. Only the step that reaches a
request's end may differ from a real run (the target's tokens past a stop are not known here).

That makes every configuration's acceptance cheap to compare on the CPU with the real model (SmolLM2-135M,
fp32, GSM8K questions in the chat template); ``gpu_spec.py`` measures the speed.

    python benchmarks/ngram_acceptance.py --gsm8k /path/to/gsm8k --num-prompts 16
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (public pool, oldest match) of each configuration; the first is TensorRT-LLM's default
CONFIGS = {"pool-oldest": (True, True), "pool-newest": (True, False), "private-oldest": (False, True),
           "private-newest": (False, False)}


def replay(drafter, prompts: list[list[int]], outputs: list[list[int]], max_new_tokens: int):
    """Feed the requests through ``drafter`` one after another as batch 1 would; returns its ``SpecStats``."""
    from kvcm.engine import SamplingParams
    from kvcm.engine.runner import StepItem
    from kvcm.engine.sequence import Sequence, Status
    from kvcm.engine.spec_stats import SpecStats

    stats = SpecStats(drafter.name)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    k = drafter.num_draft
    for prompt, out in zip(prompts, outputs):
        seq = Sequence(list(prompt), params)
        seq.status = Status.RUNNING
        seq.output_token_ids = out[:1]
        while len(seq.output_token_ids) < len(out):
            j = len(seq.output_token_ids)
            item = StepItem(seq.request_id, [out[j - 1]] + [0] * k, seq.num_tokens - 1, decode=True, num_logits=1 + k)
            drafter.draft([seq], [item])
            used = item.num_logits - 1           # 0: nothing proposed, a plain decode
            a = 0
            while a < used and j + a < len(out) and item.token_ids[1 + a] == out[j + a]:
                a += 1
            stats.record(used, a)
            seq.output_token_ids = out[:j + a + 1]
        seq.status = Status.FINISHED
        drafter.free(seq)
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"),
                    help="GSM8K directory or test .jsonl (default $KVCM_GSM8K_DIR; else built-in prompts)")
    ap.add_argument("--num-prompts", type=int, default=16, help="first N questions (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    ap.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4, 8], help="draft lengths D (default 1 2 4 8)")
    ap.add_argument("--ngram-sizes", type=int, nargs="+", default=[2],
                    help="max_matching_ngram_size values (default 2, TensorRT-LLM's)")
    ap.add_argument("--device", default="cpu", help="where the plain greedy run happens (default cpu)")
    args = ap.parse_args(argv)

    import torch
    import kvcm
    from kvcm.engine import LLM, SamplingParams
    from kvcm.engine.ngram import NgramDrafter
    from kvcm.models import load_smollm2
    from throughput import load_prompts
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = load_smollm2(dtype=torch.float32, device=args.device)
    prompts, _ = load_prompts(tok, args.num_prompts, args.gsm8k)
    max_seq = max(map(len, prompts)) + args.max_new_tokens + 8
    batch = min(16, len(prompts))
    cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=batch * max_seq + 256, dtype="float32")
    llm = LLM(model, tok, kv_cache_config=cfg, max_batch_size=batch, max_seq_len=max_seq, device=args.device)
    t = time.perf_counter()
    outs = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_new_tokens=args.max_new_tokens))]
    print(f"{len(prompts)} prompts ({'GSM8K' if args.gsm8k else 'built-in'}), plain greedy run "
          f"{time.perf_counter() - t:.0f} s, {sum(map(len, outs))} tokens; acceptance length at batch 1 "
          f"(tokens a target forward, its own token included) and by draft position:")
    for n in args.ngram_sizes:
        for name, (public, oldest) in CONFIGS.items():
            for d in args.drafts:
                st = replay(NgramDrafter(d, max_matching_ngram_size=n, is_public_pool=public, is_use_oldest=oldest),
                            prompts, outs, args.max_new_tokens)
                by_pos = ", ".join(f"{p:.2f}" for p in st.acceptance_by_position)
                print(f"  {name:>14} n={n} D={d}: {st.mean_acceptance_length:.2f}  [{by_pos}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
