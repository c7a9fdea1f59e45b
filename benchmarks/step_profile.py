"""How much of each CUDA-graph step the GPU spends waiting for the host: the host share, a median over steps.

The engine's pipeline can record two CUDA events per step (``StepPipeline.timeline``,
``kvcm/engine/pipeline.py``): one right before a graph's replay (after the step's buffers were copied) and one
right after its forward. ``start`` to ``done`` is the step's own GPU time, on the step's real data (a token
bucket's attention costs what its rows' KV lengths make it cost). ``done`` of one step to ``done`` of the next
is a step's *period* on the GPU's clock: its GPU time, plus the time the GPU sat idle because the host had not
queued it yet. A step's host share is ``1 - gpu / period``, and the figure reported is the median over the steps a
graph ran, so a stall (a garbage collection, a page fault, a noisy neighbour) moves it only when it is the common
case, which a single ``(time(n2) - time(n1)) / (n2 - n1)`` over a whole run could not tell apart.

* :func:`step_profile`: ``batch`` prompts decoding together (EOS ignored), overlapped and not; the steps that
  are full-batch decodes on the batch's decode graph;
* :func:`run_profile`: one run of any workload (``throughput.py``: all of GSM8K), every graph step, and apart
  its full-batch decodes and its mixed steps (token buckets: decodes beside prefill chunks).
"""
from __future__ import annotations

import statistics

import torch


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


def _timeline(llm, prompts, params) -> list:
    pipe = llm.pipeline
    pipe.timeline = []
    try:
        llm.generate(prompts, params)
        torch.cuda.synchronize()
        return pipe.timeline
    finally:
        pipe.timeline = None


def _steps(launches, keep=lambda launch: True) -> list[tuple[float, float, object]]:
    """(period ms, GPU ms, launch) of each graph step after the first that ``keep`` accepts."""
    return [(prev.done.elapsed_time(cur.done), cur.start.elapsed_time(cur.done), cur)
            for prev, cur in zip(launches, launches[1:]) if cur.start is not None and keep(cur)]


def _summary(rows) -> dict:
    if not rows:
        return {"error": "no graph step was timed"}
    shares = sorted(max(0.0, 1.0 - g / p) for p, g, _ in rows)
    return {"steps": len(rows), "gpu_total_ms": sum(g for _, g, _ in rows),
            "period_total_ms": sum(p for p, _, _ in rows),
            "median_period_ms": statistics.median(p for p, _, _ in rows),
            "median_gpu_ms": statistics.median(g for _, g, _ in rows),
            "host_share": statistics.median(shares), "host_share_p90": shares[int(0.9 * (len(shares) - 1))]}


def step_profile(llm, prompts, *, n: int = 80) -> dict:
    """Decode steps of ``len(prompts)`` rows, ``n`` new tokens, overlapped and serial: medians over the steps
    whose every row decoded on the batch's graph."""
    from kvcm.engine import SamplingParams
    batch = len(prompts)
    shape = llm.graphs.shapes.get((batch, 1)) if llm.graphs is not None else None
    if shape is None or shape.graph is None:
        return {"error": f"no captured decode graph for batch {batch}"}
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    out = {"batch": batch}
    saved = llm.pipeline.overlap
    try:
        for overlap in (False, True):
            llm.pipeline.overlap = overlap
            llm.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))     # warm
            launches = _timeline(llm, prompts, params)
            out["overlap" if overlap else "serial"] = _summary(
                _steps(launches, lambda s: s.static is shape and s.rows == batch))
    finally:
        llm.pipeline.overlap = saved
    return out


def run_profile(llm, prompts, params) -> dict:
    """One run of ``prompts``: the medians over every step a graph ran, and over its full-batch decode steps."""
    return profile_launches(_timeline(llm, prompts, params))


def profile_launches(launches: list) -> dict:
    """``run_profile``'s figures from a timeline recorded by the caller (``fewshot.py --profile`` records its timed
    run's): the events cost the host a few microseconds a step."""
    rows = _steps(launches)
    top = max((s.rows for _, _, s in rows), default=0)
    out = {"launches": len(launches), "all": _summary(rows),
           "full_decode": _summary([r for r in rows if r[2].static.q_len is not None and r[2].rows == top]),
           "mixed": _summary([r for r in rows if r[2].static.q_len is None])}
    out["full_decode"]["rows"] = top
    return out


def _line(s: dict) -> str:
    if "error" in s:
        return s["error"]
    return (f"host share {100 * s['host_share']:.0f}% (p90 {100 * s['host_share_p90']:.0f}%), period "
            f"{s['median_period_ms']:.2f} ms, GPU {s['median_gpu_ms']:.2f} ms, median of {s['steps']} steps; "
            f"in all GPU {s['gpu_total_ms'] / 1e3:.2f} s of {s['period_total_ms'] / 1e3:.2f} s")


def describe(p: dict) -> str:
    if "error" in p:
        return f"   step profile: {p['error']}"
    return (f"   graph decode steps at batch {p['batch']}: overlapped {_line(p['overlap'])}; serial "
            f"{_line(p['serial'])}")


def describe_run(p: dict) -> str:
    return (f"   every graph step of the run ({p['launches']} launches): {_line(p['all'])}\n"
            f"     full-batch decode steps ({p['full_decode']['rows']} rows): {_line(p['full_decode'])}\n"
            f"     mixed steps (token buckets): {_line(p['mixed'])}")
