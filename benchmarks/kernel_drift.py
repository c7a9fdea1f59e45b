"""Which part of a bf16 forward moves it away from fp32: the kvcm engine with and without its own kernels, and
Hugging Face's forward, all teacher-forced on the same fp32 greedy continuations.

Greedy drift (``drift.py``) says *that* an engine parts from fp32 and where; this says *why*. Each prompt and its
fp32 continuation go through one forward in every configuration, and at every continuation position the
bf16 logits are compared with the fp32 ones: how often the argmax differs, how often it differs where fp32 is
not near a tie (margin >= 0.1: an error, not a coin flip), and the mean absolute logit error. Configurations:

* ``hf``: the model's own forward (SDPA), one prompt at a time;
* ``kvcm``: the engine's forward over its paged cache, as it runs (on CUDA: Triton attention and the fused
  RMSNorm / rotary / SiLU kernels);
* ``kvcm-no-fused``: the same with Hugging Face's RMSNorm, rotary and MLP code in place of the fused kernels;
* ``kvcm-torch-attn``: the same with the torch reference attention in place of the Triton kernel.

A configuration that is much further from fp32 than ``hf`` names the component to look at.

    python benchmarks/kernel_drift.py --gsm8k DIR --num-prompts 64 --max-new-tokens 128   # CUDA
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))


def kvcm_logits(llm, ids: list[int], n: int) -> torch.Tensor:
    """Logits [n, vocab] of the last ``n`` positions of one prefill of ``ids`` through the engine's runner."""
    from kvcm.engine.runner import StepItem
    rid = "__kernel_drift__"
    llm.manager.begin_context_chunk(rid, 0, len(ids), len(ids))
    try:
        return llm.runner.run([StepItem(rid, list(ids), 0, decode=False, num_logits=n)]).float()
    finally:
        llm.manager.free_resources(rid)


@torch.inference_mode()
def hf_logits(model, ids: list[int], n: int) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(torch.tensor([ids], device=device), use_cache=False).logits[0, -n:].float()


class Tally:
    def __init__(self):
        self.positions = self.flips = self.real_flips = 0
        self.abs_err = 0.0

    def add(self, got: torch.Tensor, ref: torch.Tensor) -> None:
        top = ref.topk(2, dim=-1)
        margin = top.values[:, 0] - top.values[:, 1]
        flip = got.argmax(-1) != top.indices[:, 0]
        self.positions += ref.shape[0]
        self.flips += int(flip.sum())
        self.real_flips += int((flip & (margin >= 0.1)).sum())
        self.abs_err += float((got - ref).abs().mean(-1).sum())

    def row(self, name: str) -> str:
        n = max(1, self.positions)
        return (f"{name:>16} | {100 * self.flips / n:7.3f}% | {self.real_flips:6d} | {self.abs_err / n:9.5f}")


HEADER = ("           config | argmax  | flips  | mean |logit\n"
          "                  | flips   | m>=0.1 | error| vs fp32")


def run(prompts, cont, model16, model32, device, *, kvcm_version="v2") -> dict[str, Tally]:
    """``cont[i]``: prompt i's fp32 greedy continuation (EOS cut). Returns a tally per configuration."""
    import kvcm
    from kvcm.engine import LLM
    max_len = max(len(p) + len(c) for p, c in zip(prompts, cont)) + 8
    cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=4 * max_len, dtype="bfloat16")
    llm16 = LLM(model16, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=4, max_seq_len=max_len,
                device=device)
    cfg32 = cfg.replace(dtype="float32")
    llm32 = LLM(model32, kvcm_version=kvcm_version, kv_cache_config=cfg32, max_batch_size=4, max_seq_len=max_len,
                device=device)
    runner = llm16.runner
    configs = {"hf": None, "kvcm": {}, "kvcm-no-fused": {"fused": None},
               "kvcm-torch-attn": {"use_kernel": False}}
    tallies = {name: Tally() for name in configs}
    for p, c in zip(prompts, cont):
        if len(c) < 2:
            continue
        ids, n = list(p) + list(c[:-1]), len(c)
        ref = kvcm_logits(llm32, ids, n)
        tallies["hf"].add(hf_logits(model16, ids, n), ref)
        for name, swap in configs.items():
            if swap is None:
                continue
            saved = {k: getattr(runner, k) for k in swap}
            try:
                for k, v in swap.items():
                    setattr(runner, k, v)
                tallies[name].add(kvcm_logits(llm16, ids, n), ref)
            finally:
                for k, v in saved.items():
                    setattr(runner, k, v)
    return tallies


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"))
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    from kvcm.engine import LLM, SamplingParams
    from kvcm.engine.llm import eos_token_ids
    from kvcm.models import load_smollm2
    from throughput import load_prompts
    import kvcm
    model32, tok = load_smollm2(dtype=torch.float32, device=args.device)
    model16, _ = load_smollm2(dtype=torch.bfloat16, device=args.device)
    prompts, _ = load_prompts(tok, args.num_prompts, args.gsm8k)
    eos = set(eos_token_ids(model32, tok))
    max_len = max(map(len, prompts)) + args.max_new_tokens + 8
    ref_llm = LLM(model32, tok, kv_cache_config=kvcm.KvCacheConfig(
        tokens_per_block=32, max_tokens=len(prompts) * max_len, dtype="float32"),
        max_batch_size=len(prompts), max_seq_len=max_len, device=args.device)
    outs = ref_llm.generate(prompts, SamplingParams(max_new_tokens=args.max_new_tokens))
    cont = [[t for t in o.token_ids if t not in eos] for o in outs]
    del ref_llm
    tallies = run(prompts, cont, model16, model32, args.device)
    print(f"teacher-forced bf16 vs fp32, {len(prompts)} prompts, {sum(map(len, cont))} positions:\n{HEADER}")
    for name, t in tallies.items():
        print(t.row(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
