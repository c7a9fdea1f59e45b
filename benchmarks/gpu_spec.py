"""Speculative decoding on the GPU: SmolLM2-135M on GSM8K questions (chat template), CUDA graphs on.

``--dtype`` (default float32) sets the model's and the cache's dtype. Exactness is an fp32 claim: there every
section must give plain decoding's tokens exactly. In bfloat16 the products of ``1 + D`` rows round differently
from those of one row, so a verification may flip a near tie; a run passes there when every difference is a tie
within ``--tolerance`` (default 1e-3 in float32, 0.1 in bfloat16, about bf16's mean logit error from fp32,
``benchmarks/kernel_drift.py``). Speed is worth measuring in bfloat16 too: cuBLAS multiplies a few fp32 rows
much more slowly than one (the ``linear`` lines of ``batch1`` show it), bf16 rows at the cost of one.

1. ``exactness``: speculative decoding (D = 4) with each drafter (the n-gram pool; a draft model, the target's
   first ``--draft-layers`` layers with its own cache) on V1 and V2 targets gives exactly the tokens of plain
   graph decoding of the same target on ``--num-prompts`` prompts; the warmup reports of both caches
   (estimation and final: planned, captured, skipped) are printed.
2. ``batch1``: the n-gram drafter at batch 1, where speculation has to pay: ``--batch1-prompts`` GSM8K prompts
   run one after another through batch 1, plain graph decode against each n-gram configuration (TensorRT-LLM's
   defaults: a public pool, the oldest match; the public pool with the newest match; a per-request pool) for
   each D in ``--batch1-drafts``: tok/s, the ratio to plain, acceptance length overall and per draft position,
   parity against plain. Every timed run starts from an empty pool (the pool learns only from that run's
   prompts and outputs). Then the step's anatomy: the GPU time of one replay of the plain ``(1, 1)`` and the
   verification ``(1, 1 + D)`` graphs (back to back), the wall time of a speculative step, and the difference,
   the host work not hidden behind the GPU.
3. ``speed``: plain graph decode vs speculative (graphs) for each of ``--drafters`` and D in ``--drafts``, at
   each of ``--batches``, for each speculation cut-off in ``--cutoffs`` (``spec_max_concurrency``: the engine's
   default, ``none`` = always speculate, or a number; every cut-off but ``none`` runs with the engine's
   acceptance gate, reset before each timed run so its learning steps are timed): tokens/s, ratio, engine steps
   speculative and plain, acceptance, where the gate closed, parity against plain decoding at that batch.

Every timed run is preceded by an untimed run of the same prompts on the same engine (the first pass over a
batch's step shapes pays one-time costs: on a 2-core CPU the first of four runs took 1.2x the others) and starts
with an empty prefix cache (block reuse is on by default: a run finding its prompts cached by the run before skips
their prefill, 1.5x faster on that CPU), so plain and speculative runs time the same work.

    KVCM_SMOLLM2_GGUF=... KVCM_GSM8K_DIR=... python benchmarks/gpu_spec.py [--json out.json]
    python benchmarks/gpu_spec.py --only batch1            # the n-gram at batch 1 alone (~2-3 minutes on an H200)

Also runs on the CPU as a smoke run (``--device cpu --only batch1 --batch1-prompts 2 --max-new-tokens 16``).
"""

from __future__ import annotations

import argparse
import gc
import json
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


def _strict(plain, spec, prompts, tok, tolerance, exact=True):
    """(passed, report line): strict parity, and whether the differences are near ties (margin < tolerance);
    ``exact=False`` (bfloat16) passes a run whose every difference is a near tie."""
    from pytest_kvcm.parity import compare_outputs
    strict = compare_outputs(plain, spec, prompts, names=("plain", "spec"), tokenizer=tok)
    if strict.passed:
        return True, "PASS"
    tied = compare_outputs(plain, spec, prompts, names=("plain", "spec"), tokenizer=tok, margin_tolerance=tolerance)
    kind = "only near ties" if tied.passed else "real divergence"
    if tied.passed and not exact:
        return True, (f"PASS within near ties: {tied.num_prompts - len(tied.mismatches)}/{tied.num_prompts} "
                      f"identical, {len(tied.near_ties)} differ first at a margin < {tolerance:g}")
    return False, f"FAIL ({kind})\n      " + strict.format().replace("\n", "\n      ")


#: n-gram configurations of the batch-1 section: (public pool, oldest match); the first is TensorRT-LLM's default
NGRAM_CONFIGS = {"pool-oldest": (True, True), "pool-newest": (True, False), "private-newest": (False, False),
                 "private-oldest": (False, True)}


def _graph_ms(llm, q_len: int) -> float | None:
    """GPU time of one replay of the engine's batch-1 graph of ``q_len`` queries (None: not captured)."""
    from step_profile import graph_gpu_ms
    static = llm.graphs.shapes.get((1, q_len)) if llm.graphs is not None else None
    return graph_gpu_ms(static) if static is not None and static.graph is not None else None


def linear_us(model, rows: list[int], reps: int = 200) -> dict:
    """GPU time of the model's own fp32 linears (one layer's q, gate and down projections, and the LM head) on
    ``m`` rows, in microseconds: a verification of ``D`` drafts multiplies ``1 + D`` rows where a decode
    multiplies one, and small-``m`` matrix products need not cost what a matrix-vector product does."""
    layer = model.model.layers[0]
    mods = {"q": layer.self_attn.q_proj, "gate": layer.mlp.gate_proj, "down": layer.mlp.down_proj,
            "lm_head": model.get_output_embeddings()}
    out = {}
    with torch.inference_mode():
        for name, mod in mods.items():
            for m in rows:
                x = torch.randn(m, mod.in_features, device=mod.weight.device, dtype=mod.weight.dtype)
                mod(x)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    mod(x)
                end.record()
                end.synchronize()
                out[f"{name}/{m}"] = start.elapsed_time(end) / reps * 1e3
    return out


def batch1(args, build, timed, free, prompts, tok, rows) -> bool:
    """The n-gram drafter at batch 1: plain graph decode, then each configuration and D on one engine per D
    (the drafter swapped between configurations, the graphs kept). Returns whether every run was exact."""
    from kvcm.engine.ngram import NgramDrafter
    cuda = args.device == "cuda"
    plain_llm = build("v2", batch=1)
    plain, plain_rate = timed(plain_llm, prompts, 1)
    plain_gpu = _graph_ms(plain_llm, 1) if cuda else None
    plain_step = 1e3 / plain_rate            # one target forward a token
    free(plain_llm)
    gpu = f", GPU {plain_gpu:.2f} ms a (1, 1) graph replay" if plain_gpu is not None else ""
    say(f"BATCH1 {len(prompts)} prompts one after another: plain graph decode {plain_rate:8.1f} tok/s "
        f"({plain_step:.2f} ms a token{gpu})")
    rows.append({"config": "plain", "tok_s": plain_rate, "gpu_ms": plain_gpu})
    if cuda:
        ms = [1] + [1 + d for d in args.batch1_drafts]
        lin = linear_us(plain_llm.model, ms)
        for name in ("q", "gate", "down", "lm_head"):
            say(f"BATCH1 {args.dtype} linear {name:>7}, µs at " + ", ".join(f"{m} rows {lin[f'{name}/{m}']:.1f}" for m in ms))
        rows.append({"config": "linear_us", **lin})
    ok = True
    for d in args.batch1_drafts:
        llm = build("v2", NgramDrafter(d), d, batch=1)
        verify_gpu = _graph_ms(llm, 1 + d) if cuda else None
        for name in args.ngram:
            public, oldest = NGRAM_CONFIGS[name]
            llm.drafter = NgramDrafter(d, is_public_pool=public, is_use_oldest=oldest)
            outs, rate = timed(llm, prompts, 1)
            same, line = _strict(plain, outs, prompts, tok, args.tolerance, args.dtype == "float32")
            ok &= same
            st = llm.spec_stats
            ntok = sum(len(o.token_ids) for o in outs)
            step_ms = 1e3 * ntok / rate / (st.steps + len(prompts))      # verifications + one prefill each
            by_pos = ", ".join(f"{p:.2f}" for p in st.acceptance_by_position)
            anatomy = (f"; a step {step_ms:.2f} ms = GPU {verify_gpu:.2f} + {step_ms - verify_gpu:.2f} not hidden"
                       if verify_gpu is not None else f"; a step {step_ms:.2f} ms")   # prefill steps included
            say(f"BATCH1 {name:>14} D={d}: {rate:8.1f} tok/s = {rate / plain_rate:5.2f}x plain; acceptance length "
                f"{st.mean_acceptance_length:.2f}, by position [{by_pos}]; {llm.drafter.num_proposed} drafts from "
                f"the pool{anatomy}; parity {line}")
            rows.append({"config": f"{name}-D{d}", "tok_s": rate, "vs_plain": rate / plain_rate, "identical": same,
                         "stats": st.as_dict(), "step_ms": step_ms, "verify_gpu_ms": verify_gpu})
        free(llm)
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda (graphs captured) or cpu (a smoke run); default: cuda when there is one")
    ap.add_argument("--num-prompts", type=int, default=64, help="exactness: prompts, run as one batch (default 64)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    ap.add_argument("--batch1-prompts", type=int, default=16, help="batch1: GSM8K prompts run one after another (default 16)")
    ap.add_argument("--batch1-drafts", type=int, nargs="+", default=[1, 2, 4, 8], help="batch1: draft lengths D (default 1 2 4 8)")
    ap.add_argument("--ngram", nargs="+", choices=list(NGRAM_CONFIGS), default=list(NGRAM_CONFIGS)[:3],
                    help="batch1: n-gram configurations, a public or per-request (private) pool, its oldest or newest "
                         "match (default the first three; pool-oldest is TensorRT-LLM's default)")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64], help="speed: batch sizes (default 8 64)")
    ap.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4], help="speed: draft lengths D, both drafters (default 1 2 4)")
    ap.add_argument("--drafters", nargs="+", choices=["ngram", "model"], default=["ngram", "model"],
                    help="speed: drafters (default both)")
    ap.add_argument("--cutoffs", nargs="+", default=["default"],
                    help="speed: spec_max_concurrency values to time, each against plain: 'default' (the engine's), "
                         "'none' (always speculate) or an integer (default: default)")
    ap.add_argument("--spec-acceptance-window", type=int, default=None,
                    help="speed: the acceptance gate's window for every cut-off but none (default: the engine's)")
    ap.add_argument("--prompts-per-slot", type=int, default=2, help="speed: batch x this many prompts, at least 4 (default 2)")
    ap.add_argument("--draft-layers", type=int, default=20, help="layers of the target kept as the draft model (default 20)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each configuration, the median reported (default 2)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="model and KV cache dtype (default float32, where every section must be exact)")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="logit margin below which a flip is a near tie (default 1e-3 in float32, 0.1 in bfloat16)")
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"),
                    help="GSM8K directory or test .jsonl (default $KVCM_GSM8K_DIR; else built-in prompts)")
    ap.add_argument("--token-buckets", type=int, nargs="*", default=None,
                    help="graphs for mixed steps (default: the engine's, 16 .. 8192)")
    ap.add_argument("--only", choices=["exactness", "batch1", "speed"], nargs="+", default=None,
                    help="run only these sections (default: all three)")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args(argv)
    if args.json:  # checked before minutes of work: never an input, never a file this benchmark did not write
        from pytest_kvcm.paths import report_problem
        problem = report_problem(args.json, "exactness", "speed")
        if problem:
            raise SystemExit(f"{ap.prog}: --json {args.json}: {problem}")
    if args.tolerance is None:
        args.tolerance = 1e-3 if args.dtype == "float32" else 0.1

    import kvcm
    from kvcm.engine import LLM, SamplingParams
    from kvcm.engine.spec_gate import DEFAULT_WINDOW
    from kvcm.models import load_smollm2, truncated_drafter
    from throughput import load_prompts, start_cold, sync
    window = DEFAULT_WINDOW if args.spec_acceptance_window is None else args.spec_acceptance_window

    t0 = time.perf_counter()
    dev = args.device
    say(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), torch {torch.__version__}")
    model, tok = load_smollm2(dtype=getattr(torch, args.dtype), device=dev)
    n_new = args.max_new_tokens
    only = set(args.only or ["exactness", "batch1", "speed"])
    if "speed" not in only:
        args.batches = []
    exact_n = args.num_prompts if "exactness" in only else 0
    b1_n = args.batch1_prompts if "batch1" in only else 0
    need = max([exact_n, b1_n] + [max(4, b * args.prompts_per_slot) for b in args.batches])
    prompts, _ = load_prompts(tok, need, args.gsm8k)
    max_seq = max(map(len, prompts)) + n_new + 8
    B = max(args.batches + [min(exact_n, 64), 1])
    say(f"{len(prompts)} prompts ({'GSM8K' if args.gsm8k else 'built-in'}), mean {sum(map(len, prompts)) / len(prompts):.0f}"
        f" tokens, {n_new} new tokens, max_seq_len {max_seq}, graphs for batch <= {B}")
    params = SamplingParams(max_new_tokens=n_new)
    drafter_model = truncated_drafter(model, args.draft_layers)
    out = {"device": dev, "dtype": args.dtype, "max_new_tokens": n_new, "exactness": [], "batch1": [], "speed": []}

    def build(kvcm_version, drafter=None, d=0, draft_kvcm_version=None, batch=None, gate=True):
        b = batch or B
        cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=b * max_seq + 4096, dtype=args.dtype)
        kind = None if drafter is None else drafter_model if drafter == "model" else drafter
        llm = LLM(model, tok, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=b, max_seq_len=max_seq,
                  device=dev, cuda_graph=dev == "cuda", max_draft_len=d, drafter=kind,
                  draft_kvcm_version=draft_kvcm_version, cuda_graph_token_buckets=args.token_buckets,
                  # the draft's cache sized on its own, so the target holds what plain decoding's engine holds
                  draft_kv_cache_config=cfg if drafter == "model" else None,
                  # exactness must verify drafts all the way: no acceptance gate there
                  spec_acceptance_window=window if gate else 0)
        llm.generate(prompts[:2], SamplingParams(max_new_tokens=4))   # first launches, kernel compiles
        return llm

    def timed(llm, ps, batch):
        llm.limits = llm.limits.replace(max_batch_size=batch)   # graphs were captured for every batch up to B
        llm.generate(ps, params)   # untimed: an engine's first pass over a batch's shapes pays one-time costs
        times, outs = [], None
        for _ in range(args.repeats):
            if hasattr(llm.drafter, "clear"):
                llm.drafter.clear()      # a cold pool: nothing learned from an earlier run of the same prompts
            llm.reset_spec_gate()        # and a gate that judges the drafter afresh, its learning steps timed
            start_cold(llm)              # and nothing cached: every run computes its prompts' prefill
            sync(dev)
            t = time.perf_counter()
            outs = llm.generate(ps, params)
            sync(dev)
            times.append(time.perf_counter() - t)
        return outs, sum(len(o.token_ids) for o in outs) / statistics.median(times)

    def free(llm):
        llm.close()
        del llm
        gc.collect()
        if dev == "cuda":
            torch.cuda.empty_cache()

    def reports(llm):
        lines = []
        for cache, reps in (("target", llm.warmup_reports), ("draft", llm.draft_warmup_reports)):
            for r in reps:
                lines.append({"manager": cache, **r.as_dict()})
        return lines

    # ---- 1. exactness: D = 4, both drafters, V1 and V2 targets, against plain graph decoding ----------------
    ok = True
    ex_prompts = prompts[:args.num_prompts]
    for tv, dv in (("v1", "v2"), ("v2", "v1")) if exact_n else ():
        plain_llm = build(tv)
        plain, _ = timed(plain_llm, ex_prompts, min(len(ex_prompts), B))
        free(plain_llm)
        for drafter in ("ngram", "model"):
            llm = build(tv, drafter if drafter == "model" else "ngram", 4, dv, gate=False)
            spec, rate = timed(llm, ex_prompts, min(len(ex_prompts), B))
            same, line = _strict(plain, spec, ex_prompts, tok, args.tolerance, args.dtype == "float32")
            ok &= same
            reps = reports(llm)
            skipped = sum(len(r["skipped"]) for r in reps)
            ok &= skipped == 0
            st = llm.spec_stats
            say(f"EXACT target {tv} drafter {drafter}{'' if drafter == 'ngram' else f' (draft {dv})'} D=4, "
                f"{len(ex_prompts)} prompts: {line}; acceptance length {st.mean_acceptance_length:.2f}; "
                f"warmup skipped {skipped}")
            for r in reps:
                say(f"   warmup {r['manager']:>6} {r['cache']:>10}: {r['planned']} planned, {r['captured']} captured, "
                    f"{len(r['skipped'])} skipped")
            out["exactness"].append({"kvcm_version": tv, "drafter": drafter,
                                     "draft_kvcm_version": dv if drafter == "model" else None, "identical": same,
                                     "warmup": reps, "stats": st.as_dict(), "tok_s": rate})
            free(llm)
    say(f"elapsed {time.perf_counter() - t0:.1f} s")

    # ---- 2. batch 1: the n-gram pool's configurations, D, and the step's anatomy ------------------------------
    if b1_n:
        ok &= batch1(args, build, timed, free, prompts[:b1_n], tok, out["batch1"])
        say(f"elapsed {time.perf_counter() - t0:.1f} s")

    # ---- 3. speed: plain graph decode vs speculative, each drafter and D, at each batch ----------------------
    sets = {b: prompts[:max(4, b * args.prompts_per_slot)] for b in args.batches}
    plain_llm = build("v2") if args.batches else None
    plain = {b: timed(plain_llm, sets[b], b) for b in args.batches}
    if plain_llm is not None:
        free(plain_llm)
    for b in args.batches:
        say(f"SPEED batch {b:>3} ({len(sets[b])} prompts): plain graph decode {plain[b][1]:9.1f} tok/s")
        out["speed"].append({"batch": b, "config": "plain", "tok_s": plain[b][1]})
    from kvcm.engine.spec_cutoff import DEFAULT_SPEC_MAX_CONCURRENCY
    cutoffs = {c: (DEFAULT_SPEC_MAX_CONCURRENCY if c == "default" else None if c == "none" else int(c))
               for c in args.cutoffs}
    for drafter in args.drafters if args.batches else ():
        for d in args.drafts:
            llm = build("v2", drafter, d, "v2")
            for b in args.batches:
                for name, cutoff in cutoffs.items():
                    llm.spec_max_concurrency = cutoff
                    # "none" is speculation unguarded (TensorRT-LLM's defaults: no cut-off, no gate); any other
                    # cut-off runs with the engine's acceptance gate
                    llm.spec_acceptance_window = 0 if cutoff is None else window
                    outs, rate = timed(llm, sets[b], b)
                    same, line = _strict(plain[b][0], outs, sets[b], tok, args.tolerance, args.dtype == "float32")
                    ok &= same
                    st = llm.spec_stats
                    by_pos = ", ".join(f"{p:.2f}" for p in st.acceptance_by_position)
                    label = f"cut-off {name}" + (f" = {cutoff}" if name == "default" else "")
                    gate = llm.spec_gate
                    label += "" if gate is None else (f", gate closed at verification {gate.closed_at} (rate "
                                                      f"{gate.mean_at_close:.2f} < {gate.threshold:.2f})"
                                                      if gate.closed else f", gate open ({gate.threshold:.2f})")
                    say(f"SPEED batch {b:>3} {drafter:>5} D={d} {label}: {rate:9.1f} tok/s = "
                        f"{rate / plain[b][1]:5.2f}x plain; steps speculative / plain {st.steps_on} / "
                        f"{st.steps_off}; acceptance length {st.mean_acceptance_length:.2f}, by position [{by_pos}]; "
                        f"parity {line}")
                    out["speed"].append({"batch": b, "config": f"{drafter}-D{d}", "cutoff": cutoff, "tok_s": rate,
                                         "vs_plain": rate / plain[b][1], "identical": same, "stats": st.as_dict(),
                                         "gate": None if gate is None else gate.as_dict()})
            free(llm)
    say(f"total {time.perf_counter() - t0:.1f} s; {'ALL PASS' if ok else 'SOME FAIL'}")
    if args.json:
        from pytest_kvcm.paths import write_atomically
        write_atomically(args.json, json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
