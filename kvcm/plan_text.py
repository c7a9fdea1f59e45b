"""The text of ``kvcm plan``: what a capacity planner reads, verdict first.

It only formats the dict that :func:`kvcm.plan.plan` returns (the same dict ``--json`` prints), so the
numbers live in one place. Order: one verdict line per manager version, the defaults assumed (with the option
that changes each), then each version in detail with its constraints and typical step spelled out in words
(the ``count x (capacity, history)`` notation of the spec follows in brackets).
"""

from __future__ import annotations

from .units import human_bytes as size

#: Why each named constraint exists, in words (kvcm/constraints.py, kvcm/deepseek_v4.py).
CONSTRAINT_WHY = {
    "context": "a whole prefill chunk of N new tokens must always fit",
    "longest_decode": "the longest request must keep decoding while every other batch slot admits a new one",
}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def request_words(r: dict, short: int) -> str:
    """One ``count x (capacity, history)`` entry in words; ``short`` is a just-admitted request's size (1 + D + E)."""
    count, cap, hist = r["count"], r["capacity"], r["history"]
    if hist == 0 and cap <= short:
        return f"{_plural(count, 'new request')} of {_plural(cap, 'token')}"
    if hist == 0:
        return f"{_plural(count, 'prefill')} of {cap:,} tokens (nothing cached)"
    new = cap - hist
    if new <= short:
        return f"{_plural(count, 'decode')} at {cap:,} tokens ({hist:,} cached)"
    return f"{_plural(count, 'request')} of {cap:,} tokens ({hist:,} cached, {new:,} new)"


def batch_words(requests: list[dict], short: int) -> str:
    words = " + ".join(request_words(r, short) for r in requests)
    notation = " + ".join(f"{r['count']}x({r['capacity']},{r['history']})" for r in requests)
    return f"{words}   [{notation}]"


def warmup_fit(m: dict) -> str:
    final = [w for w in m["warmup"] if w["cache"] != "estimation"] or m["warmup"]
    if not final:
        return "no warmup planned"
    w = final[-1]
    return f"warmup fits: {w['captured']}/{w['planned']} shapes"


def concurrency_words(m: dict, result: dict) -> str:
    mc, b = m["max_concurrency"], result["max_batch_size"]
    if mc > b:
        return f"{b} requests at once (B binds; the pools would hold {mc:,})"
    return f"{_plural(mc, 'request')} at once"


def verdict(m: dict, result: dict) -> str:
    v = m["kvcm_version"].upper() + (" per rank" if "deployment" in m else "")
    if "error" in m:
        return f"{v}: does not fit: {m['error']}"
    f = m["final"]
    draft = f" (+ draft model's {size(m['draft']['pool_bytes'])})" if "draft" in m else ""
    line = (f"{v}: KV cache {size(f['pool_bytes'])}{draft} = {f['max_tokens']:,} tokens at "
            f"S={result['max_seq_len']:,}: {concurrency_words(m, result)}; {warmup_fit(m)}")
    if "deployment" not in m:
        return line
    from .plan_parallel import verdict_line
    return line + "\n" + verdict_line(m, result)


def draft_lines(result: dict) -> list[str]:
    """``--draft-model``: how one budget was split between the target's cache and the draft's."""
    split = result.get("draft_split")
    if split is None:
        return []
    if split["total_bytes"] is None:
        lines = [f"draft model {split['draft_model']}: a token budget, so each cache holds max_tokens"]
    else:
        lines = [f"draft model {split['draft_model']}: one budget of {size(split['total_bytes'])} split by KV bytes "
                 f"per token: target {size(split['target_bytes'])}, draft {size(split['draft_bytes'])}"]
    for m in result["managers"]:
        if "draft" in m:
            d, f = m["draft"], m["final"]
            lines.append(f"  {m['kvcm_version'].upper()} draft cache: {size(d['pool_bytes'])}, "
                         f"{d['max_tokens']:,} tokens; target cache: {size(f['pool_bytes'])}, "
                         f"{f['max_tokens']:,} tokens")
    return lines


def assumptions(result: dict) -> list[str]:
    free = result["free_memory_bytes"]
    frac = result.get("free_gpu_memory_fraction")
    share = 0.9 if frac is None else frac
    lines = ["assumed (the option that changes it in brackets):",
             f"  {size(free)} free device memory [--free-gib], {share:.0%} of it for the KV cache [--fraction]"
             f" = {size(int(share * free))} budget"]
    caps = []
    if result.get("max_tokens") is not None:
        caps.append(f"at most {result['max_tokens']:,} tokens [--max-tokens]")
    if result.get("max_gpu_total_bytes") is not None:
        caps.append(f"at most {size(result['max_gpu_total_bytes'])} [--max-gpu-total-gib]")
    if caps:
        lines.append("  capped at " + " and ".join(caps) + " (the smallest budget wins)")
    if "dtype" in result:
        lines.append(f"  KV cache in {result['dtype']} [--dtype], {result['tokens_per_block']} tokens a block [--tpb]")
    lines.append(f"  B={result['max_batch_size']} requests at once [-B], S={result['max_seq_len']:,} tokens a request "
                 f"[-S], N={result['max_num_tokens']:,} tokens a step [-N],")
    lines.append(f"  D={result['max_draft_len']} draft tokens a request [-D], "
                 f"E={result.get('num_extra_kv_tokens', 0)} extra KV tokens a request [-E]")
    if "parallel" in result:
        from .plan_parallel import assumption_lines
        lines += assumption_lines(result)
    if "block_reuse" in result:
        from .reuse.plan import plan_lines
        lines += plan_lines(result["block_reuse"])
    return lines


def cache_lines(title: str, d: dict, short: int) -> list[str]:
    label = [g.get("label") or g["name"] for g in d["groups"]]
    width = max([len("group"), *map(len, label)]) + 2
    lines = [f"  {title}: pools {size(d['pool_bytes'])} of a {size(d['budget_bytes'])} budget, "
             f"{d['max_tokens']:,} tokens",
             f"    {'group':<{width}}{'window':>8}{'layers':>8}{'blocks':>10}{'a block':>11}{'total':>11}"]
    for name, g in zip(label, d["groups"]):
        window = f"{g['window']:,}" if g["window"] else "-"
        lines.append(f"    {name:<{width}}{window:>8}{g['layers']:>8}{g['num_blocks']:>10,}"
                     f"{size(g['bytes_per_block']):>11}{size(g['bytes']):>11}")
    if len(d["groups"]) > 1:
        lines.append("    groups numbered in first-seen layer order, as TensorRT-LLM numbers life cycles (pool_ratio "
                     "follows it)")
    for g in d["groups"]:
        if g.get("roles", ["KV"]) != ["KV"]:
            lines.append(f"      {g['index']}: {', '.join(g['roles'])}: {g['bytes_per_block']:,} bytes a block")
    if d["constraints"]:
        lines.append("    must always fit (each constraint puts a floor under every group's pool):")
        for c in d["constraints"]:
            why = CONSTRAINT_WHY.get(c["name"])
            lines.append(f"      {c['name']}" + (f" ({why})" if why else "") + ":")
            lines.append(f"        {batch_words(c['requests'], short)}")
    if d["typical_step"]:
        lines.append("    the rest of the budget is split among the groups in proportion to a typical step:")
        lines.append(f"      {batch_words(d['typical_step'], short)}")
    return lines


def concurrency_detail(m: dict, result: dict) -> str:
    mc, b, s = m["max_concurrency"], result["max_batch_size"], result["max_seq_len"]
    if mc > b:
        return (f"  requests at once: memory is not the limit. The pools would hold {mc:,} requests of "
                f"S={s:,} tokens,\n    more than B={b}, and the scheduler never runs more than B at once.")
    return (f"  requests at once: {mc:,} of S={s:,} tokens fit in the pools (B={b} is reached only by shorter "
            f"requests)")


def version_lines(m: dict, result: dict) -> list[str]:
    lines = [f"== {m['kvcm_version'].upper()} in detail =="]
    if "error" in m:
        return lines + [f"  {m['error']}"]
    short = 1 + result["max_draft_len"] + result.get("num_extra_kv_tokens", 0)
    if "stages" in m:
        from .plan_parallel import stage_lines
        lines += stage_lines(m, result)
    lines += cache_lines("final cache" + (" (one rank of stage 0)" if "stages" in m else ""), m["final"], short)
    est, final = dict(m["estimation"]), dict(m["final"])
    same = {k: v for k, v in est.items() if k != "typical_step"} == {k: v for k, v in final.items()
                                                                       if k != "typical_step"}
    if same:
        lines.append("  estimation cache (the temporary one warmup runs on before the final one is sized): "
                     "the same pools")
        if est["typical_step"] and not final["typical_step"]:
            lines.append("    split among the groups by a typical step:")
            lines.append(f"      {batch_words(est['typical_step'], short)}")
    else:
        lines += cache_lines("estimation cache (the temporary one warmup runs on before the final one is sized)",
                             est, short)
    lines.append(concurrency_detail(m, result))
    from .plan_host_tier import lines as host_tier_lines
    lines += host_tier_lines(m)
    for w in m["warmup"]:
        lines.append(f"  warmup on the {w['cache']} cache: {w['captured']} of {w['planned']} CUDA-graph shapes fit, "
                     f"{len(w['skipped'])} skipped")
        lines += [f"    skipped batch {s['batch_size']} draft {s['draft_len']}: {s['reason']}" for s in w["skipped"]]
    return lines


def render(result: dict) -> str:
    lines = [f"kvcm plan {result['model']} (on paper: no GPU, no weights)"]
    lines += [verdict(m, result) for m in result["managers"]]
    lines += [f"note: {n}" for n in result.get("notes", [])]
    lines.append("")
    lines += assumptions(result)
    for m in result["managers"]:
        lines.append("")
        lines += version_lines(m, result)
    draft = draft_lines(result)
    if draft:
        lines += [""] + draft
    return "\n".join(lines)
