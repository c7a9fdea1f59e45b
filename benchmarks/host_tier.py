"""The host tier against recomputing (V1's secondary pool, or V2's host level with ``--kvcm-version v2``): shared
prefixes that do not fit the GPU pool together but fit the host tier.

Round 1 admits every prefix once (each with its own suffix); round 2 asks every prefix again with new suffixes and
is measured, with the tier (``LLM(host_cache_size=...)``: evicted pages go to pinned host memory and come back on a
hit) and without it (evicted pages are recomputed), in one run on one device. Reported per arm: prompt tokens
cached (hit rate), prefill tokens computed, blocks offloaded / onboarded, round-2 wall time, and whether the two
arms' greedy tokens agree; then what one block's copy host -> GPU costs against computing it.

Usage: python benchmarks/host_tier.py [--device cuda] [--prefixes 16] [--prefix-len 1024] [--gpu-prefixes 4]
       [--new-tokens 16] [--dtype bfloat16] [--kvcm-version v1|v2] [--quick]   (--quick: a tiny model on the CPU,
       a smoke run)
Environment: KVCM_SMOLLM2_GGUF (the model; a tiny seeded llama without it or with --quick).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TPB = 32


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def block_bytes(model, dtype: str) -> int:
    import kvcm

    spec = kvcm.ModelSpec.from_hf_config(model.config)
    probe = kvcm.create_kv_cache_manager("v1", spec, kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=TPB,
                                                                        dtype=dtype),
                                         max_batch_size=1, max_seq_len=4096, device="meta")
    return sum(g.bytes_per_block for g in probe.layer_groups)


def workload(args, vocab: int):
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(10, vocab - 1, (args.prefix_len,), generator=g).tolist() for _ in range(args.prefixes)]
    rounds = [[p + torch.randint(10, vocab - 1, (8,), generator=g).tolist() for p in prefixes] for _ in range(2)]
    return rounds


def arm(model, args, rounds, host_bytes):
    import kvcm
    from kvcm.engine import LLM, SamplingParams

    per_prompt = args.prefix_len + 8 + args.new_tokens
    gpu_tokens = max(args.gpu_prefixes * per_prompt, 2 * per_prompt)
    llm = LLM(model, kvcm_version=args.kvcm_version, max_batch_size=args.batch, max_seq_len=per_prompt + TPB,
              device=args.device, enable_block_reuse=True,
              kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=gpu_tokens, dtype=args.dtype),
              host_cache_size=host_bytes)
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    llm.generate(rounds[0], params)
    sync(args.device)
    start = time.perf_counter()
    outs = llm.generate(rounds[1], params)
    sync(args.device)
    wall = time.perf_counter() - start
    st, ks = llm.reuse_stats, llm.manager.get_kv_cache_stats()
    return {"host_cache_size": host_bytes, "gpu_blocks": ks.max_num_blocks, "host_blocks": ks.max_num_host_blocks,
            "hit_rate": st.reused_tokens / max(st.prompt_tokens, 1), "prompt_tokens": st.prompt_tokens,
            "prefill_tokens_computed": st.computed_tokens, "offloaded_blocks": ks.offloaded_blocks,
            "onboarded_blocks": ks.onboarded_blocks, "round2_seconds": wall}, [o.token_ids for o in outs], llm


def copy_cost(llm, args, blocks: int):
    """Seconds to copy ``blocks`` blocks host -> GPU pool (through the same seam the tier uses)."""
    from kvcm import seams

    pool = llm.manager.pools[0]
    host = llm.manager._reuse.host[0]
    if pool.storage is None or host.storage is None:
        return None
    n = min(blocks, host.num_blocks, pool.num_blocks)
    sync(args.device)
    start = time.perf_counter()
    for i in range(n):
        for g, gpu in enumerate(llm.manager.pools):
            seams.tier_copy(gpu.storage, i, llm.manager._reuse.host[g].storage, i)
    sync(args.device)
    return (time.perf_counter() - start) / max(n, 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prefixes", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--gpu-prefixes", type=int, default=4, help="how many prompts the GPU pool holds at once")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kvcm-version", choices=("v1", "v2"), default="v1")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.device, args.prefixes, args.prefix_len, args.gpu_prefixes, args.new_tokens = "cpu", 6, 96, 2, 4
        args.dtype, args.batch = "float32", 2
    from kvcm.models import ModelNotInstalled, load_smollm2, tiny_model

    model = None
    if not args.quick:
        try:
            model, _ = load_smollm2(dtype=getattr(torch, args.dtype), device=args.device)
        except ModelNotInstalled as exc:
            print(f"SmolLM2 not installed ({exc}); a tiny llama instead", file=sys.stderr)
    name = "smollm2-135m"
    if model is None:
        model, name = tiny_model("llama")[0].to(getattr(torch, args.dtype)), "tiny-llama"
    rounds = workload(args, model.config.vocab_size)
    per_prompt = args.prefix_len + 8 + args.new_tokens
    host_bytes = (args.prefixes + 1) * -(-per_prompt // TPB) * block_bytes(model, args.dtype)
    arm(model, args, [r[:1] for r in rounds], None)        # warm-up: kernels and allocator, not measured
    with_tier, tokens_on, llm_on = arm(model, args, rounds, host_bytes)
    without, tokens_off, _ = arm(model, args, rounds, None)
    recompute = without["round2_seconds"] / max(without["prefill_tokens_computed"] // TPB, 1)
    report = {"model": name, "kvcm_version": args.kvcm_version, "device": args.device, "dtype": args.dtype,
              "gpu": torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else None,
              "prefixes": args.prefixes, "prefix_len": args.prefix_len, "with_host_tier": with_tier,
              "without_host_tier": without, "same_tokens": tokens_on == tokens_off,
              "copy_seconds_per_block": copy_cost(llm_on, args, 64),
              "round2_seconds_per_computed_block_without_tier": recompute}
    print(json.dumps(report, indent=2))
    return 0 if report["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
