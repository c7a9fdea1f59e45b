"""End-to-end throughput: the kvcm engine (CUDA graphs and eager) next to Hugging Face ``generate`` (static
batches, left padding) and transformers' own continuous batching (``generate_batch``), same prompts, one run.

    python benchmarks/throughput.py                                  # SmolLM2 fp32 on CPU, 32 built-in prompts
    python benchmarks/throughput.py --gsm8k DIR --num-prompts 0 --max-new-tokens 256 --batch-size 256 \\
        --dtype bfloat16                                             # all 1,319 GSM8K questions (chat template)

Beside tokens/s each engine's GSM8K accuracy is printed (flexible extract, ``drift.py``). Then a drift report:
each engine against an fp32 run of the same prompts through the kvcm engine (outputs equal, tokens before the
first divergence, the fp32 logit margin there), the same fp32 engine's outputs overlapped vs not on the first
``--identity-prompts`` prompts, and on CUDA the host share of the graph steps, a median over steps, of the whole run
and of full-batch decode steps overlapped and not (``step_profile.py``).

Tokens/s counts generated tokens (prompt tokens excluded, EOS included) over wall time. Each engine is built and
warmed up once (graph capture and first-call costs are reported apart, as setup) and run; then the engines take
turns for the other ``--repeats - 1`` rounds and the median wall time of each is reported with its ratio to the
others, so a busy machine slows all of them alike. On CUDA it also prints what the kvcm manager was given and what the process
used: free memory at the start, the KV budget, the pool, and the peak allocated.
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
from kvcm.versions import NAMES as ALL_VERSIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))
from drift import gsm8k_accuracy  # noqa: E402  (this directory's helpers, importable once the path is set)
from _hf_peers import HfGenerate, HfGenerateBatch  # noqa: E402

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
ENGINES = ("kvcm-graph", "kvcm-eager", "hf", "cb")


def say(*a):
    print(*a, flush=True)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def start_cold(llm) -> None:
    """Empty a kvcm engine's prefix cache before a timed run. Block reuse is on by default, so a run over prompts
    that an earlier run already computed (a warm-up, another configuration, an earlier round) would skip their
    prefill and time less work than the peer it is compared with, which cannot reuse across runs."""
    if not llm.reset_prefix_cache():
        raise SystemExit("reset_prefix_cache refused: a request still holds pages after the last generate")


def load_prompts(tok, num: int, gsm8k: str | None) -> tuple[list[list[int]], list[str]]:
    """``num`` chat-template prompts (0 = every GSM8K test question): GSM8K questions and their normalised
    answers, else the built-in prompts (no answers)."""
    from kvcm.models import chat_prompt_ids
    from pytest_kvcm.accuracy.gsm8k import target_answer
    targets = []
    if gsm8k:
        path = Path(gsm8k)
        files = [path] if path.is_file() else sorted(path.glob("*test*.jsonl")) or sorted(path.glob("*.jsonl"))
        if not files:
            raise SystemExit(f"--gsm8k {gsm8k}: no .jsonl file there (want GSM8K test rows with a 'question')")
        from pytest_kvcm.accuracy.gsm8k_rows import gsm8k_rows_or_exit
        rows = gsm8k_rows_or_exit(files[0], f"--gsm8k {gsm8k}")
        rows = rows[:num] if num else rows
        questions, targets = [r["question"] for r in rows], [target_answer(r["answer"]) for r in rows]
    else:
        questions = [BUILTIN[i % len(BUILTIN)] for i in range(num or len(BUILTIN))]
    return [chat_prompt_ids(tok, q) for q in questions], targets


class KvcmEngine:
    """A kvcm ``LLM`` built once (graphs captured once) and run on every round."""

    def __init__(self, model, tok, prompts, max_new, batch_size, device, *, kvcm_version="v2", cuda_graph=False,
                 fraction=0.5, overlap=True, token_buckets=None, graph_batch_sizes=None, block_reuse=True,
                 decode_split_len=0, max_num_tokens=8192, prefill_block_m=None, step_row_map=False):
        import kvcm
        from kvcm.engine import LLM
        self.max_new, self.device = max_new, torch.device(device)
        max_seq = max(len(p) for p in prompts) + max_new + 8
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[model.dtype]
        self.free_at_start = torch.cuda.mem_get_info()[0] if self.device.type == "cuda" else None
        cfg = (kvcm.KvCacheConfig(tokens_per_block=32, free_gpu_memory_fraction=fraction, dtype=dtype)
               if self.device.type == "cuda" else
               kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=batch_size * (max_seq + 64), dtype=dtype))
        t = time.perf_counter()
        # chunked prefill of max_num_tokens a step on CUDA; on the CPU whole prompts (the pool is sized to the batch)
        self.llm = LLM(model, tok, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=batch_size,
                       max_seq_len=max_seq, max_num_tokens=max_num_tokens if self.device.type == "cuda" else None,
                       device=device, cuda_graph=cuda_graph, overlap=overlap,
                       cuda_graph_token_buckets=token_buckets if cuda_graph else None,
                       cuda_graph_batch_sizes=graph_batch_sizes if cuda_graph else None,
                       enable_block_reuse=block_reuse, decode_split_len=decode_split_len,
                       prefill_block_m=prefill_block_m, step_row_map=step_row_map)
        self.llm.generate(prompts[:2], self._params(4))
        sync(device)
        self.setup_s = time.perf_counter() - t

    def _params(self, n):
        from kvcm.engine import SamplingParams
        return SamplingParams(max_new_tokens=n)

    def __call__(self, prompts):
        start_cold(self.llm)        # every round computes its prompts, as HF's rounds do
        return self.llm.generate(prompts, self._params(self.max_new))

    def describe(self) -> dict:
        mgr, out = self.llm.manager, {"setup_s": round(self.setup_s, 2)}
        out.update(kv_budget_gib=mgr.budget_bytes / 2**30, kv_pool_gib=mgr.pool_bytes / 2**30)
        if self.free_at_start is not None:
            out["free_at_start_gib"] = self.free_at_start / 2**30
        g = self.llm.graphs
        if g is not None:
            out.update(decode_shapes=len(g.shapes), token_buckets=sorted(g.buckets), replays=g.num_replays,
                       bucket_replays=g.num_bucket_replays)
            out["warmup"] = [r.as_dict() for r in self.llm.warmup_reports]
        return out

    def close(self):
        self.llm.close()


def build(name, model, tok, prompts, args):
    common = (model, tok, prompts, args.max_new_tokens, args.batch_size, args.device)
    if name == "kvcm-graph":
        return KvcmEngine(*common, kvcm_version=args.kvcm_version, cuda_graph=True, fraction=args.fraction,
                          overlap=not args.no_overlap, token_buckets=args.token_buckets,
                          graph_batch_sizes=args.graph_batch_sizes, block_reuse=not args.no_block_reuse,
                          decode_split_len=args.decode_split_len, max_num_tokens=args.max_num_tokens,
                          prefill_block_m=args.prefill_block_m, step_row_map=args.step_row_map)
    if name == "kvcm-eager":
        return KvcmEngine(*common, kvcm_version=args.kvcm_version, fraction=args.fraction, overlap=not args.no_overlap,
                          block_reuse=not args.no_block_reuse, max_num_tokens=args.max_num_tokens)
    if name == "hf":
        return HfGenerate(*common)
    if name == "cb":
        return HfGenerateBatch(*common)
    raise SystemExit(f"--engines: unknown engine {name!r}; choose from {', '.join(ENGINES)}")


def reference_section(args, prompts, outs, model, tok) -> dict:
    """An fp32 run of the same prompts through the kvcm engine (graphs on CUDA): every engine's drift from it,
    and its own outputs overlapped vs not on the first ``--identity-prompts`` prompts."""
    from kvcm.engine.llm import eos_token_ids
    from kvcm.models import load_smollm2
    from drift import HEADER, drift
    from pytest_kvcm.parity import compare_outputs
    ref_model = model if args.dtype == "float32" else load_smollm2(dtype=torch.float32, device=args.device)[0]
    eos = set(eos_token_ids(ref_model, tok))
    eng = KvcmEngine(ref_model, tok, prompts, args.max_new_tokens, args.batch_size, args.device,
                     kvcm_version=args.kvcm_version, cuda_graph=args.device == "cuda", fraction=args.fraction)
    sync(args.device)
    t = time.perf_counter()
    ref = eng(prompts)
    sync(args.device)
    say(f"   fp32 reference (kvcm {'graphs' if args.device == 'cuda' else 'eager'}): "
        f"{sum(len(o.token_ids) for o in ref)} tokens in {time.perf_counter() - t:.1f} s")
    out = {"drift": {}}
    say(f"   drift from fp32, {len(prompts)} prompts ({args.dtype}):\n{HEADER}")
    for name, got in outs.items():
        d = drift(name, ref, got, eos)
        out["drift"][name] = {"identical": d.identical, "prompts": d.num_prompts, "prefix_share": d.prefix_share,
                              "first_positions": d.first_positions, "margins": d.margins}
        say(d.row())
    n = min(args.identity_prompts, len(prompts))
    if n:
        llm = eng.llm
        llm.pipeline.overlap = False
        serial = eng(prompts[:n])
        llm.pipeline.overlap = True
        overlapped = eng(prompts[:n])
        rep = compare_outputs(serial, overlapped, prompts[:n], names=("serial", "overlapped"))
        out["overlap_identity"] = f"{n - len(rep.mismatches)}/{n} identical"
        say(f"   fp32 overlapped vs serial step loop: {out['overlap_identity']} (ahead-launched steps: "
            f"{llm.pipeline.num_launched_ahead})")
    eng.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--num-prompts", type=int, default=32, help="0 = every GSM8K test question")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32, help="max batch (kvcm, generate_batch) / batch (generate)")
    ap.add_argument("--max-num-tokens", type=int, default=8192, help="kvcm on CUDA: tokens a step (chunked "
                    "prefill; vLLM's LLM class on an H100/H200 takes 16,384 with 1,024 sequences)")
    ap.add_argument("--gsm8k", default=os.environ.get("KVCM_GSM8K_DIR"), help="GSM8K jsonl dir (chat template)")
    ap.add_argument("--engines", default=None, help=f"comma list of {', '.join(ENGINES)} "
                    "(default: all; kvcm-graph only on CUDA)")
    ap.add_argument("--kvcm-version", default="v2", choices=ALL_VERSIONS)
    ap.add_argument("--fraction", type=float, default=0.5, help="kvcm free_gpu_memory_fraction on CUDA")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--no-reference", action="store_true", help="skip the fp32 reference run (drift, identity)")
    ap.add_argument("--identity-prompts", type=int, default=64,
                    help="fp32 outputs overlapped vs not on this many prompts")
    ap.add_argument("--no-overlap", action="store_true", help="time the kvcm engines with the serial step loop")
    ap.add_argument("--token-buckets", type=int, nargs="+", default=None,
                    help="kvcm-graph's token buckets for mixed steps (default: the engine's, powers of two 16 .. 8192)")
    ap.add_argument("--no-block-reuse", action="store_true", help="the kvcm engines with block reuse off (on by "
                    "default, as in the engines it models)")
    ap.add_argument("--step-row-map", action="store_true", help="kvcm-graph's attention programs on steps other "
                    "than decodes read their rows from a map made once a step (LLM(step_row_map=True))")
    ap.add_argument("--decode-split-len", type=int, default=0, help="kvcm-graph's decode attention reads keys in "
                    "shares of this many positions (LLM(decode_split_len=...); 0: off)")
    ap.add_argument("--prefill-block-m", type=int, default=None, help="kvcm-graph's attention kernel takes this "
                    "many query rows a program on steps that carry prefill (LLM(prefill_block_m=...))")
    ap.add_argument("--graph-batch-sizes", type=int, nargs="+", default=None,
                    help="kvcm-graph's decode graph batch sizes (default: the engine's, 1, 2, 4 .. batch)")
    args = ap.parse_args(argv)
    if args.json:  # checked before minutes of work: never an input, never a file this benchmark did not write
        from pytest_kvcm.paths import report_problem
        problem = report_problem(args.json, "args", "engines")
        if problem:
            raise SystemExit(f"{ap.prog}: --json {args.json}: {problem}")
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvcm.models import load_smollm2
    from pytest_kvcm.parity import compare_outputs
    model, tok = load_smollm2(dtype=getattr(torch, args.dtype), device=args.device)
    prompts, targets = load_prompts(tok, args.num_prompts, args.gsm8k)
    chosen = (args.engines.split(",") if args.engines else
              [e for e in ENGINES if e != "kvcm-graph" or args.device == "cuda"])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    say(f"SmolLM2-135M {args.dtype} on {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else ''}"
        f"), {len(prompts)} prompts ({'GSM8K' if args.gsm8k else 'built-in'}, chat template, mean "
        f"{sum(map(len, prompts)) / len(prompts):.0f} tokens), {args.max_new_tokens} new tokens, batch "
        f"{args.batch_size}, {args.max_num_tokens} tokens a step (CUDA), torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}")
    engines, times, outs, info = {}, {}, {}, {}

    def timed_round(name):
        sync(args.device)
        t = time.perf_counter()
        outs[name] = engines[name](prompts)
        sync(args.device)
        times[name].append(time.perf_counter() - t)

    # each engine is built and run once before the next is built, so its memory figures are its own: the
    # resident bytes before it (weights, earlier engines) are left out of its peak
    for name in chosen:
        if args.device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        try:
            engines[name] = build(name, model, tok, prompts, args)
            times[name] = []
            timed_round(name)
        except Exception as exc:  # one engine failing must not hide the others' numbers
            say(f"{name:>11}: failed: {type(exc).__name__}: {exc}")
            engines.pop(name, None)
            continue
        if args.device == "cuda":
            info[name] = {"peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}
        n = sum(len(o.token_ids) for o in outs[name])   # said now too, so a run cut short keeps it
        say(f"   {name} first round: {n} tokens in {times[name][0]:.2f} s = {n / times[name][0]:.1f} tok/s")
    for r in range(1, args.repeats):
        for name in (list(engines) if r % 2 == 0 else list(reversed(engines))):
            timed_round(name)
    rates = {}
    for name, eng in engines.items():
        n = sum(len(o.token_ids) for o in outs[name])
        dt = statistics.median(times[name])
        rates[name] = n / dt
        acc = gsm8k_accuracy([tok.decode(o.token_ids, skip_special_tokens=True) for o in outs[name]], targets)
        info.setdefault(name, {}).update(tokens=n, median_s=round(dt, 3), times_s=[round(x, 3) for x in times[name]],
                                         tok_per_s=round(n / dt, 1), gsm8k_flexible=acc, **eng.describe())
        say(f"{name:>11}: {n:7d} tokens, median {dt:8.2f} s of {len(times[name])} = {n / dt:9.1f} tok/s   "
            f"GSM8K flexible {acc:5.1f}%   (setup {eng.setup_s:.1f} s)")
    for a in rates:
        for b in rates:
            if a.startswith("kvcm") and not b.startswith("kvcm"):
                say(f"   {a} / {b}: {rates[a] / rates[b]:.2f}x")
    if "kvcm-graph" in rates and "kvcm-eager" in rates:
        say(f"   kvcm-graph / kvcm-eager: {rates['kvcm-graph'] / rates['kvcm-eager']:.2f}x")
    if args.device == "cuda":
        say(f"   weights {weights / 2**30:.2f} GiB; peaks below are each engine's own (build, warmup, first run)")
        for name in engines:
            d = info[name]
            if "kv_budget_gib" not in d:
                say(f"   {name} memory: peak {d['peak_gib']:.1f} GiB")
                continue
            rest = d["peak_gib"] - d["kv_pool_gib"]
            left = d["free_at_start_gib"] - d["kv_budget_gib"]
            say(f"   {name} memory: free at start {d['free_at_start_gib']:.1f} GiB, KV budget {d['kv_budget_gib']:.1f}"
                f" GiB, pool {d['kv_pool_gib']:.1f} GiB (within budget: {d['kv_pool_gib'] <= d['kv_budget_gib']}), "
                f"peak {d['peak_gib']:.1f} GiB = pool + {rest:.2f} GiB activations/graphs/estimation cache (the "
                f"budget leaves {left:.1f} GiB of the free memory: {rest <= left})")
    ref = "hf" if "hf" in outs else None
    for name in outs:
        if name != ref and ref is not None:
            rep = compare_outputs(outs[ref], outs[name], prompts, names=(ref, name), tokenizer=tok)
            info[name]["parity_vs_hf"] = f"{rep.num_prompts - len(rep.mismatches)}/{rep.num_prompts} identical"
            say(f"   {name} vs {ref}: {info[name]['parity_vs_hf']} ({args.dtype}: bf16 may flip near ties)")
    if "kvcm-graph" in outs and "kvcm-eager" in outs:
        rep = compare_outputs(outs["kvcm-eager"], outs["kvcm-graph"], prompts, names=("eager", "graph"))
        say(f"   kvcm graph vs eager: {rep.num_prompts - len(rep.mismatches)}/{rep.num_prompts} identical")
    if "kvcm-graph" in engines and args.device == "cuda":
        from kvcm.engine import SamplingParams
        from step_profile import describe, describe_run, run_profile, step_profile
        llm = engines["kvcm-graph"].llm
        try:
            start_cold(llm)      # the profiled run computes its prompts, as the timed rounds did
            info["run_profile"] = run_profile(llm, prompts, SamplingParams(max_new_tokens=args.max_new_tokens))
            say(describe_run(info["run_profile"]))
            info["step_profile"] = step_profile(llm, prompts[:args.batch_size], n=min(80, args.max_new_tokens))
            say(describe(info["step_profile"]))
        except Exception as exc:  # the figures above stand without it
            say(f"   step profile failed: {type(exc).__name__}: {exc}")
    for eng in engines.values():
        eng.close()
    engines.clear()
    if not args.no_reference:
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        try:
            info["reference"] = reference_section(args, prompts, outs, model, tok)
        except Exception as exc:  # the figures above stand without it
            say(f"   fp32 reference failed: {type(exc).__name__}: {exc}")
    if args.json:
        from pytest_kvcm.paths import write_atomically
        write_atomically(args.json, json.dumps({"args": vars(args), "engines": info}, indent=1, default=str))
    gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
