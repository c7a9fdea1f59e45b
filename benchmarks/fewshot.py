"""GSM8K few-shot, the textbook workload for block reuse: one shared K-shot prefix from the train split, then each
test question, as lm-eval's ``gsm8k`` prompt reads (``Question: ...\\nAnswer:``, greedy, stop at ``Question:``).

    python benchmarks/fewshot.py --model smollm2 --gsm8k DIR --num-prompts 0 --dtype bfloat16   # on the H200
    python benchmarks/fewshot.py --model gemma-3-270m --shots 5 --kvcm-versions v1,v2 --num-prompts 8  # CPU smoke

Runs, in one process on the same prompts: the kvcm engine with block reuse off, then on (for each version asked),
then Hugging Face ``generate`` (static batches, left padding, the same stop strings; it cannot reuse across
requests). For each: wall time, generated tokens and tok/s, prompt tokens computed by the prefill, the cache hit
rate (tokens and blocks), mean and median time to first token, and GSM8K accuracy (strict and flexible, scored as
``pytest_kvcm.accuracy.gsm8k`` scores). Reuse on must give the same tokens as reuse off (compared and printed).

Each kvcm engine is built and warmed up (graphs captured on CUDA), then its prefix cache is reset
(``LLM.reset_prefix_cache``), so the timed run starts with nothing cached and the shared prefix is computed by the
first requests admitted.
"""
from __future__ import annotations

import argparse
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

STOP = ("Question:", "</s>", "<|im_end|>")


def say(*a):
    print(*a, flush=True)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def free_device_memory(device):
    """Give an engine's pool back before the next is sized from the free memory."""
    import gc
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def read_rows(path: Path) -> list[dict]:
    from pytest_kvcm.accuracy.gsm8k_rows import gsm8k_rows_or_exit
    return gsm8k_rows_or_exit(path, "--gsm8k")


def fewshot_prompts(tok, gsm8k: Path, shots: int, num: int) -> tuple[list[list[int]], list[str], int]:
    """Token ids of every prompt (the first ``shots`` train rows, then each test question), the normalised
    answers, and the length in tokens of the prefix every prompt shares."""
    from pytest_kvcm.accuracy.gsm8k import build_prompt, target_answer
    test, train = read_rows(gsm8k / "test.jsonl"), read_rows(gsm8k / "train.jsonl")
    rows = test[:num] if num else test
    ex = train[:shots]
    prompts = [tok(build_prompt(r["question"], ex)).input_ids for r in rows]
    common = 0
    while all(len(p) > common and p[common] == prompts[0][common] for p in prompts):
        common += 1
    return [list(map(int, p)) for p in prompts], [target_answer(r["answer"]) for r in rows], common


def accuracy(texts: list[str], targets: list[str]) -> dict:
    from pytest_kvcm.accuracy.gsm8k import extract_answer, normalize, truncate_at_stop
    out = {}
    for mode in ("strict", "flexible"):
        hits = sum(normalize(extract_answer(truncate_at_stop(t), mode)) == normalize(g) for t, g in zip(texts, targets))
        out[mode] = round(100.0 * hits / len(targets), 2)
    return out


def load(model: str, dtype: torch.dtype, device: str):
    if model == "smollm2":
        from kvcm.models import load_smollm2
        return load_smollm2(dtype=dtype, device=device)
    from kvcm.models.gemma3 import load_gemma3
    return load_gemma3(dtype=dtype, device=device)


def run_kvcm(model, tok, prompts, args, version: str, reuse: bool) -> dict:
    import kvcm
    from kvcm.engine import LLM, SamplingParams
    from throughput import start_cold
    cuda = torch.device(args.device).type == "cuda"
    dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[model.dtype]
    max_seq = max(map(len, prompts)) + args.max_new_tokens + 8
    cfg = (kvcm.KvCacheConfig(tokens_per_block=32, free_gpu_memory_fraction=args.fraction, dtype=dtype)
           if cuda else kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=args.batch_size * (max_seq + 64),
                                           dtype=dtype))
    t = time.perf_counter()
    llm = LLM(model, tok, kvcm_version=version, kv_cache_config=cfg, max_batch_size=args.batch_size,
              max_seq_len=max_seq, max_num_tokens=args.max_num_tokens, device=args.device, cuda_graph=cuda,
              enable_block_reuse=reuse, decode_split_len=args.decode_split_len,
              prefill_block_m=args.prefill_block_m, step_row_map=args.step_row_map)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, stop_strings=STOP)
    # warm up, then drop what the warm-up cached: the timed run starts with nothing cached
    warm = [int(t) for t in tok("The warm-up run of this engine.", add_special_tokens=False).input_ids]
    llm.generate([warm, warm[::-1]], SamplingParams(max_new_tokens=4))
    start_cold(llm)
    sync(args.device)
    setup = time.perf_counter() - t
    sync(args.device)
    if args.profile and cuda:
        llm.pipeline.timeline = []
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    sync(args.device)
    wall = time.perf_counter() - t
    profile = None
    if llm.pipeline.timeline is not None:
        from step_profile import describe_run, profile_launches
        profile = describe_run(profile_launches(llm.pipeline.timeline))
        llm.pipeline.timeline = None
    st = llm.reuse_stats
    ttft = [o.first_token_s for o in outs if o.first_token_s is not None]
    usage = [vars(u) for u in llm.page_usage]
    llm.close()
    del llm
    free_device_memory(args.device)
    n = sum(len(o.token_ids) for o in outs)
    return {"name": f"kvcm-{version}-reuse-{'on' if reuse else 'off'}", "wall_s": wall, "setup_s": setup,
            "tokens": n, "tok_per_s": n / wall, "prompt_tokens": sum(map(len, prompts)),
            "computed_tokens": st.computed_tokens, "reused_tokens": st.reused_tokens,
            "token_hit_rate": st.token_hit_rate, "block_hit_rate": st.block_hit_rate,
            "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
            "ttft_median_s": statistics.median(ttft) if ttft else None, "page_usage": usage, "profile": profile,
            "token_ids": [o.token_ids for o in outs], "texts": [o.text for o in outs]}


def run_hf(model, tok, prompts, args) -> dict:
    from kvcm.engine.llm import eos_token_ids
    from kvcm.models import hf_generate
    eos = list(eos_token_ids(model, tok))
    gen = dict(stop_strings=list(STOP), tokenizer=tok)
    hf_generate(model, prompts[:2], 4, eos_token_id=eos, batch_size=2, margins=False)
    sync(args.device)
    t = time.perf_counter()
    outs = hf_generate(model, prompts, args.max_new_tokens, eos_token_id=eos, batch_size=args.batch_size,
                       margins=False, **gen)
    sync(args.device)
    wall = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    return {"name": "hf-generate", "wall_s": wall, "tokens": n, "tok_per_s": n / wall,
            "prompt_tokens": sum(map(len, prompts)), "computed_tokens": sum(map(len, prompts)),
            "token_ids": [o.token_ids for o in outs],
            "texts": [tok.decode(o.token_ids, skip_special_tokens=True) for o in outs]}


def row(r: dict, targets: list[str]) -> str:
    acc = accuracy(r["texts"], targets)
    r["gsm8k"] = acc
    hit = (f"hit {r['token_hit_rate']:6.1%} tokens {r['block_hit_rate']:6.1%} blocks" if "token_hit_rate" in r
           else "cannot reuse across requests")
    ttft = f"TTFT mean {r['ttft_mean_s']:.3f} s median {r['ttft_median_s']:.3f} s" if r.get("ttft_mean_s") else ""
    return (f"{r['name']:>20}: {r['wall_s']:8.2f} s, {r['tokens']:8d} tokens = {r['tok_per_s']:9.1f} tok/s; "
            f"prefill computed {r['computed_tokens']:,} of {r['prompt_tokens']:,} prompt tokens "
            f"({r['computed_tokens'] / r['prompt_tokens']:.1%}); {hit}; {ttft}; GSM8K strict {acc['strict']:.2f} "
            f"flexible {acc['flexible']:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma-3-270m"])
    ap.add_argument("--gsm8k", default=None, help="GSM8K dir with test.jsonl and train.jsonl "
                    "(default: $KVCM_GSM8K_DIR, else ../shared/data/gsm8k beside the checkout)")
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=32, help="0 = every test question")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-num-tokens", type=int, default=8192, help="tokens a step (chunked prefill)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--kvcm-versions", nargs="+", default=["v2"],
                    help=f"{' '.join(ALL_VERSIONS)}, comma- or space-separated (as host_step.py takes them)")
    ap.add_argument("--fraction", type=float, default=0.5, help="kvcm free_gpu_memory_fraction on CUDA")
    ap.add_argument("--no-hf", action="store_true", help="leave Hugging Face generate out")
    ap.add_argument("--step-row-map", action="store_true", help="the kvcm engines' attention programs on steps "
                    "other than decodes read their rows from a map made once a step (LLM(step_row_map=True))")
    ap.add_argument("--decode-split-len", type=int, default=0, help="the kvcm engines' decode attention reads keys "
                    "in shares of this many positions (LLM(decode_split_len=...); 0: off)")
    ap.add_argument("--prefill-block-m", type=int, default=None, help="the kvcm engines' attention kernel takes "
                    "this many query rows a program on steps that carry prefill (LLM(prefill_block_m=...); "
                    "default: its least tile)")
    ap.add_argument("--profile", action="store_true", help="CUDA: record the timed runs' step timelines and print "
                                                          "each one's host share and GPU time (step_profile.py)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.json:  # checked before minutes of work: never an input, never a file this benchmark did not write
        from pytest_kvcm.paths import report_problem
        problem = report_problem(args.json, "args", "shared_prefix_tokens")
        if problem:
            raise SystemExit(f"{ap.prog}: --json {args.json}: {problem}")
    root = Path(__file__).resolve().parents[1]
    gsm8k = Path(args.gsm8k or os.environ.get("KVCM_GSM8K_DIR") or root.parent / "shared" / "data" / "gsm8k")
    for split in ("test", "train"):
        if not (gsm8k / f"{split}.jsonl").is_file():
            raise SystemExit(f"--gsm8k {gsm8k}: no {split}.jsonl there")
    versions = [v for given in args.kvcm_versions for v in given.split(",") if v]
    if not versions or set(versions) - set(ALL_VERSIONS):
        raise SystemExit(f"--kvcm-versions {' '.join(args.kvcm_versions)!r}: some of {', '.join(ALL_VERSIONS)}, "
                         f"comma- or space-separated")
    model, tok = load(args.model, getattr(torch, args.dtype), args.device)
    prompts, targets, common = fewshot_prompts(tok, gsm8k, args.shots, args.num_prompts)
    say(f"{args.model} {args.dtype} on {args.device} "
        f"({torch.cuda.get_device_name() if args.device == 'cuda' else ''}), GSM8K {args.shots}-shot: "
        f"{len(prompts)} prompts, mean {statistics.fmean(map(len, prompts)):.0f} tokens, {common} shared; "
        f"at most {args.max_new_tokens} new tokens, batch {args.batch_size}, {args.max_num_tokens} tokens a step")
    results = []

    def save():
        if args.json:
            keep = [{k: v for k, v in r.items() if k not in ("token_ids", "texts")} for r in results]
            from pytest_kvcm.paths import write_atomically
            write_atomically(args.json, json.dumps({"args": vars(args), "shared_prefix_tokens": common,
                                                   "results": keep}, indent=1, default=str))

    hf = None
    if not args.no_hf:      # first, so a run cut short by its time limit still has the baseline
        hf = run_hf(model, tok, prompts, args)
        free_device_memory(args.device)
        say(row(hf, targets))
        results.append(hf)
        save()
    for v in versions:
        off = run_kvcm(model, tok, prompts, args, v, reuse=False)
        say(row(off, targets))
        on = run_kvcm(model, tok, prompts, args, v, reuse=True)
        say(row(on, targets))
        for r in (off, on):
            if r["profile"]:
                say(f"   {r['name']} step profile (the timed run's timeline):\n{r['profile']}")
        same = sum(a == b for a, b in zip(off["token_ids"], on["token_ids"]))
        say(f"   {v}: reuse on / off: {off['wall_s'] / on['wall_s']:.2f}x faster, prefill computes "
            f"{on['computed_tokens'] / off['computed_tokens']:.1%} of the tokens; outputs equal on {same}/"
            f"{len(prompts)} prompts ({args.dtype})")
        for u in on["page_usage"]:
            say(f"   {v} reuse on, page usage: {u}")
        for r in (off, on):
            if hf is not None:
                same = sum(a == b for a, b in zip(hf["token_ids"], r["token_ids"]))
                say(f"   {r['name']} / hf-generate: {hf['wall_s'] / r['wall_s']:.2f}x faster; outputs equal on "
                    f"{same}/{len(prompts)}")
        results += [off, on]
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
