"""How much of a CUDA-graph decode step is the GPU waiting for the host.

The step period is measured end to end: ``batch`` prompts decode ``n2`` and ``n1`` new tokens (EOS ignored),
and ``(time(n2) - time(n1)) / (n2 - n1)`` leaves prefill out. The GPU's own time for the same step is the
decode graph of that batch replayed back to back (nothing on the host between replays). The host share is the
rest of the period: ``1 - gpu / period``, the fraction of each step the GPU sits idle. Both loops are measured
on the same engine: overlapped (step n + 1 prepared while the GPU runs step n) and not.
"""
from __future__ import annotations

import time

import torch


def _timed(llm, prompts, n):
    from kvcm.engine import SamplingParams
    cuda = llm.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def graph_gpu_ms(static, replays: int = 50) -> float:
    """Mean GPU time of one replay of ``static``'s graph, replays back to back."""
    static.graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        static.graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def host_ms(llm, prompts, n) -> float:
    """Host time per step of the overlapped loop (launch, and completion less its wait for the GPU), over a
    run of ``n`` new tokens: below the GPU's time per step, the host is hidden."""
    from kvcm.engine import pipeline, scheduler
    spent, steps = [0.0], [0]
    launch, complete = pipeline.StepPipeline._launch, scheduler.Scheduler.complete

    def timed(f, count):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t
                steps[0] += count
        return wrapper
    pipeline.StepPipeline._launch = timed(launch, 1)
    scheduler.Scheduler.complete = timed(complete, 0)
    try:
        _timed(llm, prompts, n)
    finally:
        pipeline.StepPipeline._launch, scheduler.Scheduler.complete = launch, complete
    return spent[0] / max(1, steps[0]) * 1e3


def step_profile(llm, prompts, *, n1: int = 16, n2: int = 80) -> dict:
    """Period and host share of a decode step at ``len(prompts)`` rows, overlapped and not."""
    batch = len(prompts)
    shape = llm.graphs.shapes.get((batch, 1)) if llm.graphs is not None else None
    if shape is None or shape.graph is None:
        return {"error": f"no captured decode graph for batch {batch}"}
    out = {"batch": batch}
    saved = llm.pipeline.overlap
    try:
        for overlap in (False, True):
            llm.pipeline.overlap = overlap
            _timed(llm, prompts, n1)                     # warm
            period = (_timed(llm, prompts, n2) - _timed(llm, prompts, n1)) / (n2 - n1) * 1e3
            out["overlap" if overlap else "serial"] = {"period_ms": period}
    finally:
        llm.pipeline.overlap = saved
    llm.pipeline.overlap = True
    try:
        out["overlap"]["host_ms"] = host_ms(llm, prompts, n2)
    finally:
        llm.pipeline.overlap = saved
    gpu = graph_gpu_ms(shape)
    out["gpu_ms"] = gpu
    for key in ("serial", "overlap"):
        p = out[key]["period_ms"]
        out[key]["host_share"] = max(0.0, 1.0 - gpu / p)
    return out


def describe(p: dict) -> str:
    if "error" in p:
        return f"   step profile: {p['error']}"
    s, o = p["serial"], p["overlap"]
    return (f"   graph decode step at batch {p['batch']}: GPU {p['gpu_ms']:.2f} ms (replays back to back); period "
            f"{o['period_ms']:.2f} ms overlapped (host share {100 * o['host_share']:.0f}%; host work {o['host_ms']:.2f} "
            f"ms a step, prefill included), {s['period_ms']:.2f} ms not (host share {100 * s['host_share']:.0f}%)")
