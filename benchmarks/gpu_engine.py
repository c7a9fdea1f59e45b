"""GPU check and benchmark of the reference engine (kvcm.engine) on one GPU.

1. Essentials (fp32): engine tokens == Hugging Face generate on tiny llama / qwen3 / mistral (past the
   window), V1 and V2, eager and CUDA-graph replay; then SmolLM2-135M on GSM8K prompts (first difference and
   its logit margin are printed when a near tie flips).
2. CUDA-graph warmup reports for SmolLM2: planned / captured / skipped shapes on the estimation and the final
   cache, V1 and V2, D = 0 and 4; then on a budget that puts the long dummies on a page boundary, clean and with
   the historic ``gen-dummy-extra-token`` defect injected (which must skip shapes).
3. Decode tokens/s at batch 1, 16, 64, 256: engine with CUDA graphs, engine eager, HF generate.
   Decode rate = batch * (N - 1) / (time(N new tokens) - time(1 new token)), so prefill is left out.
4. Where a graph decode step's time goes at batch 256: host phases (schedule, fill, replay launch, wait for the
   GPU, sampling, postprocess) and the CUDA kernels by total time (torch profiler).

Environment: KVCM_SMOLLM2_GGUF (model), KVCM_GSM8K_DIR (test.jsonl / parquet; synthetic prompts otherwise).
Usage: python benchmarks/gpu_engine.py [--dtype bfloat16|float32] [--batches 1,16,64,256] [--new-tokens 64]
       [--device cuda] [--quick]  (--quick: small sizes, for a CPU smoke run of the script itself)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
from kvcm.versions import NAMES as ALL_VERSIONS

# Run as a script, sys.path[0] is benchmarks/: put the repository root first so ``kvcm`` is this checkout's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def free_cuda():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ prompts
def gsm8k_questions(n: int) -> list[str]:
    root = os.environ.get("KVCM_GSM8K_DIR")
    rows = []
    if root:
        path = Path(root)
        files = sorted(path.glob("test.jsonl")) + sorted(path.glob("**/test*.jsonl"))
        if files:
            from pytest_kvcm.accuracy.gsm8k_rows import gsm8k_rows_or_exit
            rows = [r["question"] for r in gsm8k_rows_or_exit(files[0], "KVCM_GSM8K_DIR")]
        else:
            shards = sorted(path.glob("**/test*.parquet"))
            try:
                import pyarrow.parquet as pq
                rows = [q for s in shards for q in pq.read_table(s, columns=["question"]).column(0).to_pylist()]
            except Exception as exc:  # noqa: BLE001 - any reader problem falls back to synthetic prompts
                log(f"GSM8K parquet unreadable ({exc!r}); using synthetic prompts")
    if not rows:
        log("no GSM8K questions found (KVCM_GSM8K_DIR unset or empty): synthetic prompts")
        rows = [f"A shop sells {i + 3} apples for {2 * i + 5} dollars. How much do {i + 7} apples cost?"
                for i in range(n)]
    return [f"Question: {rows[i % len(rows)]}\nAnswer:" for i in range(n)]


def random_prompts(lengths, seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


# ------------------------------------------------------------------------------------------------ engine
def make_llm(model, tok, kvcm_version, dtype_name, device, *, max_batch_size, max_seq_len, max_tokens,
             cuda_graph=False, max_draft_len=0, batch_sizes=None, tpb=32):
    import kvcm
    from kvcm.engine import LLM
    cfg = kvcm.KvCacheConfig(tokens_per_block=tpb, max_tokens=max_tokens, dtype=dtype_name)
    return LLM(model, tok, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=max_batch_size,
               max_seq_len=max_seq_len, device=device, cuda_graph=cuda_graph, max_draft_len=max_draft_len,
               cuda_graph_batch_sizes=batch_sizes)


@torch.inference_mode()
def hf_tokens(model, prompts, n, pad_id):
    width = max(len(p) for p in prompts)
    dev = next(model.parameters()).device
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=pad_id, eos_token_id=None, num_beams=1,
                         temperature=None, top_p=None, top_k=None)
    return out[:, width:].tolist()


def compare(name, got, ref, margins=None):
    bad = []
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            m = margins[i][k] if margins and k < len(margins[i]) else None
            bad.append(f"prompt {i} pos {k}: engine {a[k:k + 1]} hf {b[k:k + 1]} margin {m}")
    log(f"  {name}: {'OK' if not bad else 'MISMATCH'} ({len(got) - len(bad)}/{len(got)} identical)")
    for line in bad[:5]:
        log("     ", line)
    return not bad


def essentials_tiny(device) -> bool:
    from kvcm.engine import SamplingParams
    from kvcm.models import tiny_model
    ok = True
    log("== essentials: tiny models, fp32, engine vs HF generate, eager and CUDA graphs")
    prompts = random_prompts((5, 23, 40, 9, 31, 17), seed=1)
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    for arch in ("llama", "qwen3", "mistral"):
        model, _ = tiny_model(arch, seed=1, device=device)
        ref = hf_tokens(model, prompts, 32, 0)
        for kvcm_version in ALL_VERSIONS:
            for graph in (False, True):
                llm = make_llm(model, None, kvcm_version, "float32", device, max_batch_size=8, max_seq_len=128,
                               max_tokens=4096, cuda_graph=graph, tpb=8)
                outs = llm.generate(prompts, params)
                tag = f"{arch} {kvcm_version} {'graph' if graph else 'eager'}"
                if graph:
                    tag += f" ({llm.graphs.num_replays} replays)"
                    ok &= llm.graphs.num_replays > 0
                ok &= compare(tag, [o.token_ids for o in outs], ref, [o.logits_margins for o in outs])
                llm.close()
                del llm
        del model
        free_cuda()
    return ok


def essentials_smollm2(model, tok, device, prompts) -> bool:
    from kvcm.engine import SamplingParams
    log("== essentials: SmolLM2 fp32 on GSM8K prompts, engine vs HF generate (32 tokens)")
    ids = [tok(p)["input_ids"] for p in prompts]
    ref = hf_tokens(model, ids, 32, tok.pad_token_id)
    ok = True
    for kvcm_version in ALL_VERSIONS:
        for graph in (False, True):
            llm = make_llm(model, tok, kvcm_version, "float32", device, max_batch_size=16, max_seq_len=512,
                           max_tokens=16 * 512, cuda_graph=graph, batch_sizes=[1, 2, 4, 8, 16])
            outs = llm.generate(ids, SamplingParams(max_new_tokens=32, ignore_eos=True))
            ok &= compare(f"smollm2 {kvcm_version} {'graph' if graph else 'eager'}", [o.token_ids for o in outs], ref,
                          [o.logits_margins for o in outs])
            llm.close()
            del llm
            free_cuda()
    return ok


def _print_reports(tag, llm, rows, **extra):
    for rep in llm.warmup_reports:
        log(f"  {tag} {rep.cache:10s}: planned {len(rep.planned):2d} captured {len(rep.captured):2d} "
            f"skipped {len(rep.skipped)}")
        for shape, reason in rep.skipped[:4]:
            log(f"      skipped {shape}: {reason}")
        rows.append({**extra, **rep.as_dict()})


def warmup_reports(model, tok, device, dtype_name, max_batch_size, max_seq_len):
    log(f"== CUDA-graph warmup reports (SmolLM2 {dtype_name}, B={max_batch_size}, S={max_seq_len})")
    rows = []
    for kvcm_version in ALL_VERSIONS:
        for d in (0, 4):
            t = time.time()
            llm = make_llm(model, tok, kvcm_version, dtype_name, device, max_batch_size=max_batch_size,
                           max_seq_len=max_seq_len, max_tokens=max_batch_size * max_seq_len, cuda_graph=True,
                           max_draft_len=d)
            _print_reports(f"{kvcm_version} D={d}", llm, rows, kvcm_version=kvcm_version, draft=d)
            log(f"    ({time.time() - t:.1f}s, graphs held: {len(llm.graphs.shapes)} decode shapes, "
                f"{len(llm.graphs.buckets)} token buckets)")
            llm.close()
            del llm
            free_cuda()
    # a pool smaller than one max_seq_len request: get_num_available_tokens answers a page boundary, and a dummy
    # one token too large no longer fits (the historic defect, put back for the second pass)
    boundary_tokens, bsz = max_seq_len // 2, min(16, max_batch_size)
    log(f"== warmup on a page boundary: pool of {boundary_tokens} tokens (pages of 8) < S={max_seq_len}, B={bsz}")
    import kvcm.policy
    from pytest_kvcm.defects import build_registry
    for inject in (None, "gen-dummy-extra-token"):
        with kvcm.policy.applied(build_registry()[inject].policy() if inject else kvcm.policy.DEFAULT):
            for kvcm_version in ALL_VERSIONS:
                for d in (0, 4):
                    llm = make_llm(model, tok, kvcm_version, dtype_name, device, max_batch_size=bsz,
                                   max_seq_len=max_seq_len, max_tokens=boundary_tokens, cuda_graph=True,
                                   max_draft_len=d, tpb=8)
                    _print_reports(f"{kvcm_version} D={d} {inject or 'clean'}", llm, rows,
                                   kvcm_version=kvcm_version, draft=d, boundary=True, injected=inject)
                    llm.close()
                    del llm
                    free_cuda()
    return rows


def time_engine(llm, ids, n):
    from kvcm.engine import SamplingParams
    sync(llm.device)
    t = time.time()
    llm.generate(ids, SamplingParams(max_new_tokens=n, ignore_eos=True))
    sync(llm.device)
    return time.time() - t


def time_hf(model, ids, n, pad):
    dev = next(model.parameters()).device
    sync(dev)
    t = time.time()
    hf_tokens(model, ids, n, pad)
    sync(dev)
    return time.time() - t


def profile_decode(model, tok, device, dtype_name, bs, n, max_seq_len, prompts_text):
    """Host phases of graph decode steps (perf_counter, with a synchronize after the replay so the wait for
    the GPU is its own phase) and the CUDA kernels of the same steps by total time."""
    import collections
    from kvcm.engine import SamplingParams, sampler, scheduler
    from kvcm.engine import cuda_graph
    log(f"== profile: graph decode at batch {bs} (SmolLM2 {dtype_name}, {n} new tokens)")
    ids = [tok(p)["input_ids"] for p in prompts_text[:bs]]
    llm = make_llm(model, tok, "v2", dtype_name, device, max_batch_size=bs, max_seq_len=max_seq_len,
                   max_tokens=bs * max_seq_len, cuda_graph=True)
    llm.generate(ids[:2], SamplingParams(max_new_tokens=2))
    acc, calls = collections.Counter(), collections.Counter()
    saved = []

    def wrap(owner, name, key, after=None):
        f = getattr(owner, name)
        saved.append((owner, name, f))

        def timed(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            if after:
                after()
            acc[key] += time.perf_counter() - t
            calls[key] += 1
            return r
        setattr(owner, name, timed)

    wrap(scheduler.Scheduler, "schedule", "schedule")
    wrap(scheduler.Scheduler, "commit", "commit")
    wrap(scheduler.Scheduler, "complete", "complete")
    wrap(cuda_graph.StaticStep, "fill", "fill (host, H2D copy)")
    wrap(torch.cuda.CUDAGraph, "replay", "replay launch")
    wrap(torch.cuda.CUDAGraph, "replay", "replay + wait for GPU", after=torch.cuda.synchronize)
    wrap(sampler, "unpack", "tokens to host (wait)")
    try:
        sync(device)
        t = time.time()
        llm.generate(ids, SamplingParams(max_new_tokens=n, ignore_eos=True))
        sync(device)
        wall = time.time() - t
    finally:
        for owner, name, f in reversed(saved):
            setattr(owner, name, f)
    steps = calls["schedule"]
    log(f"  {steps} steps in {wall:.2f}s = {wall / steps * 1e3:.2f} ms/step; {llm.graphs.num_replays} graph replays")
    for key, v in acc.items():
        log(f"    {key:26s} {v / calls[key] * 1e3:7.3f} ms/call ({calls[key]} calls)")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(ids, SamplingParams(max_new_tokens=16, ignore_eos=True))
        sync(device)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
    print(table, flush=True)
    llm.close()
    free_cuda()
    return {"ms_per_step": wall / steps * 1e3, **{k: v / calls[k] * 1e3 for k, v in acc.items()}}


def throughput(model, tok, device, dtype_name, batches, n, max_seq_len, prompts_text):
    log(f"== decode tokens/s, SmolLM2 {dtype_name}, V2, {n} new tokens, GSM8K prompts, S={max_seq_len}")
    bmax = max(batches)
    ids_all = [tok(p)["input_ids"] for p in prompts_text[:bmax]]
    results = []
    engines = {}
    for mode in ("graph", "eager"):
        engines[mode] = make_llm(model, tok, "v2", dtype_name, device, max_batch_size=bmax,
                                 max_seq_len=max_seq_len, max_tokens=bmax * max_seq_len,
                                 cuda_graph=mode == "graph")
        time_engine(engines[mode], ids_all[:2], 4)   # first-call costs out of the way
    for bs in batches:
        ids = ids_all[:bs]
        row = {"batch": bs}
        for mode, llm in engines.items():  # best of two: the first call of a shape pays one-off costs
            t1 = min(time_engine(llm, ids, 1) for _ in range(2))
            tn = min(time_engine(llm, ids, n) for _ in range(2))
            row[mode] = bs * (n - 1) / (tn - t1) if tn > t1 else float("nan")
        t1 = min(time_hf(model, ids, 1, tok.pad_token_id) for _ in range(2))
        tn = min(time_hf(model, ids, n, tok.pad_token_id) for _ in range(2))
        row["hf"] = bs * (n - 1) / (tn - t1) if tn > t1 else float("nan")
        log(f"  batch {bs:4d}: graph {row['graph']:9.1f} tok/s   eager {row['eager']:9.1f} tok/s   "
            f"hf generate {row['hf']:9.1f} tok/s   (graph/eager {row['graph'] / row['eager']:.2f}x)")
        results.append(row)
    for llm in engines.values():
        llm.close()
    engines.clear()
    free_cuda()
    return results


def section(name, fn, *a, **kw):
    """Run one section; a failure is printed with its traceback and the next section still runs."""
    try:
        return fn(*a, **kw)
    except Exception:  # noqa: BLE001 - a benchmark run must report every section it can
        import traceback
        log(f"SECTION {name} FAILED:")
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        free_cuda()
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="dtype of the throughput and warmup runs (essentials always run fp32)")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the script")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: tiny,smollm2,warmup,throughput,"
                    "profile")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        batches, args.new_tokens = [1, 4], 8
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    summary = {"device": args.device, "dtype": args.dtype}
    ok = True
    if "tiny" not in skip:
        ok &= bool(section("tiny", essentials_tiny, args.device))
    from kvcm.models import ModelNotInstalled, load_smollm2
    try:
        log("loading SmolLM2 (fp32)")
        model, tok = load_smollm2(dtype=torch.float32, device=args.device)
    except ModelNotInstalled as exc:
        log(f"SmolLM2 unavailable: {exc}")
        model = None
    if model is not None:
        prompts = gsm8k_questions(max(batches + [16]))
        if "smollm2" not in skip:
            ok &= bool(section("smollm2", essentials_smollm2, model, tok, args.device,
                               prompts[:4 if args.quick else 16]))
        if args.dtype != "float32":
            model = model.to(getattr(torch, args.dtype))
        if "warmup" not in skip:
            summary["warmup"] = section("warmup", warmup_reports, model, tok, args.device, args.dtype,
                                        8 if args.quick else max(batches), args.max_seq_len)
        if "throughput" not in skip:
            summary["throughput"] = section("throughput", throughput, model, tok, args.device, args.dtype,
                                            batches, args.new_tokens, args.max_seq_len, prompts)
        if "profile" not in skip and args.device == "cuda":
            summary["profile"] = section("profile", profile_decode, model, tok, args.device, args.dtype,
                                         max(batches), args.new_tokens, args.max_seq_len, prompts)
    summary["essentials_ok"] = bool(ok)
    log("== summary (json)")
    print(json.dumps(summary, indent=1), flush=True)
    log(f"done in {time.time() - T0:.0f}s; essentials {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
