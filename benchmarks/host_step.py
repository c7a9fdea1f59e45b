"""The host's share of a step, measured without a GPU: the engine's own Python per step.

On the H200 an overlapped CUDA-graph step lasts ``max(GPU time, host time)``, so once the GPU is fast the host's
work per step (schedule, fill, launch, commit, and the previous step's completion) is the period. That work does
not need the GPU to be measured: here the real engine runs (``LLM`` with its scheduler, its V1 or V2 manager, the
static steps and their buffers, the overlapped pipeline) with the model's forward replaced by constants of the
right shape, so every second a step takes is host work. A step's time is the interval between two launches on the
host's clock (``StepPipeline.timeline``).

Two workloads:

* ``decode`` (default): ``batch`` prompts decode ``--new-tokens`` tokens each (EOS ignored); the first and last
  ``--skip`` steps (prefill, the batch finishing) are left out. A shared machine's other work lands on some
  intervals, not all, so the figures are the median and the 10th percentile of every steady interval of
  ``--repeat`` runs; runs alternate between the configurations.
* ``fewshot``: GSM8K 8-shot's shape (``--requests`` prompts of one 1,316-token prefix and a 65-token question, at
  most 256 running, 8,192 tokens a step, token buckets for the mixed steps as on CUDA), each answer ending at a
  seeded EOS (1 in 40 tokens, at most ``--new-tokens``), block reuse off and on. Requests come and go every step,
  so most steps are mixed (decodes beside prefill chunks) and admissions run between steps: the run's host time,
  whole (every step summed) and per step kind, median and slowest.
* ``chat``: the same for the full-GSM8K throughput run's shape: a 30-token shared chat template, then a question
  of 50-190 tokens; answers end at 1 in 300 tokens, so most run to ``--new-tokens`` (256 there).

``--stop-strings`` gives a mixed workload's requests ``fewshot.py``'s stop strings (``Question:``, ``</s>``,
``<|im_end|>``) and the engine SmolLM2's tokenizer to find them (the tiny model's ids are SmolLM2's first 256),
so the host also pays the stop-string check after every token, as the real few-shot run does.

``--same-prompts`` gives a mixed workload's every run the same prompts, as ``throughput.py``'s rounds and a
server's repeated requests do, and runs them all in one process: the runs' totals, printed in order, must not
grow with the runs before them (reuse's books are kept across them).

``--against DIR`` runs the same measurement on another checkout (e.g. a ``git worktree`` of an older commit) in
a subprocess, interleaved with this one, and prints both with the change: a before/after from one invocation.
``--profile N`` prints the ``N`` costliest functions (cProfile, own time) of one run per configuration.

    python benchmarks/host_step.py                                  # V1 and V2 at batch 256 and 1
    python benchmarks/host_step.py --against /tmp/base --repeat 3
    python benchmarks/host_step.py --kvcm-versions v2 --batches 256 --profile 25
    python benchmarks/host_step.py --workload fewshot --kvcm-versions v1 v2 --repeat 3
    python benchmarks/host_step.py --workload chat --kvcm-versions v2 --new-tokens 256 --repeat 3
    python benchmarks/host_step.py --workload fewshot --kvcm-versions v2 --repeat 6 --same-prompts
    python benchmarks/host_step.py --workload fewshot --kvcm-versions v2 --stop-strings --against /tmp/base
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from kvcm.versions import NAMES as ALL_VERSIONS

HERE = Path(__file__).resolve()


def _prompts(batch: int, seed: int = 0) -> list[list[int]]:
    """GSM8K-chat-sized prompts (80..220 tokens), random ids inside the tiny model's vocabulary (256, which
    ``LLM.generate`` checks): the host path never reads their values."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (int(n),), generator=g).tolist() for n in torch.randint(80, 220, (batch,),
                                                                                           generator=g)]


EOS = 2                 # the tiny model's EOS id
STOP_STRINGS = ("Question:", "</s>", "<|im_end|>")     # benchmarks/fewshot.py's


@dataclass(frozen=True)
class Shape:
    """A workload of requests that come and go: every prompt is ``prefix`` shared tokens then ``question``
    (low, high) tokens of its own; each generated token is EOS with chance ``1 / eos_every``."""
    prefix: int
    question: tuple[int, int]
    eos_every: int


SHAPES = {
    "fewshot": Shape(1316, (65, 65), 40),      # GSM8K 8-shot: benchmarks/fewshot.py's workload
    "chat": Shape(30, (50, 190), 300),         # GSM8K questions in a chat template: throughput.py's workload
}


def _shaped_prompts(shape: Shape, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``shape`` (ids of the tiny model), their shared prefix drawn from ``seed``."""
    import torch
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 256, (shape.prefix,), generator=g).tolist()
    lo, hi = shape.question
    return [shared + torch.randint(3, 256, (int(k),), generator=g).tolist()
            for k in torch.randint(lo, hi + 1, (n,), generator=g)]


def _no_forward(eos_every: int | None = None) -> None:
    """Replace the model's forward with constants of the right shape, so only the host's work is left: a
    static step returns its ``[2, R]`` greedy tensor (what a replayed graph hands back), an eager step
    ``[R, 2]`` logits. ``eos_every``: each token is EOS with chance ``1 / eos_every`` (seeded), so requests end
    at different steps; None: never EOS, one tensor for every step."""
    import torch
    from kvcm.engine.cuda_graph import StaticStep
    from kvcm.engine.runner import ModelRunner
    rng = torch.Generator().manual_seed(0)

    def tokens(r: int) -> torch.Tensor:
        t = (7 + torch.arange(r) % 97).double()
        if eos_every is not None:
            t[torch.rand(r, generator=rng) < 1 / eos_every] = EOS
        return torch.stack([t, torch.ones(r, dtype=torch.float64)])

    def static_forward(self):
        if self.greedy is None or eos_every is not None:
            self.greedy = tokens(self.buf.num_logits)
        return self.greedy

    def eager_forward(self, buf, ctx):
        logits = torch.zeros(buf.num_logits, 256)
        logits[torch.arange(buf.num_logits), tokens(buf.num_logits)[0].long()] = 1.0
        return logits

    StaticStep.forward = static_forward
    ModelRunner.forward = eager_forward


def _launch_times(llm, run) -> list[tuple[float, str]]:
    """Each launch's host clock and kind (``decode``: a decode shape; ``mixed``: a token bucket; ``eager``) over
    ``run()``, from the pipeline's timeline."""
    from kvcm.engine import pipeline
    pipe = llm.pipeline
    if "host" not in pipeline.Launch.__dataclass_fields__:   # a checkout measured with --against may predate it
        return _wrapped_launch_times(pipe, run)
    pipe.timeline = []
    try:
        run()
        return [(t.host, "eager" if t.static is None else "mixed" if t.static.q_len is None else "decode")
                for t in pipe.timeline]
    finally:
        pipe.timeline = None


def _wrapped_launch_times(pipe, run) -> list[tuple[float, str]]:
    """For an older pipeline without the host clock in its timeline: note each launch as it is called."""
    launch, times = pipe._launch, []

    def timed(*args):
        times.append((time.perf_counter(), "step"))
        return launch(*args)
    pipe._launch = timed
    try:
        run()
    finally:
        del pipe._launch
    return times


def _new_llm(kvcm_version: str, *, batch: int, max_seq: int, **kw):
    import dataclasses
    import inspect

    import torch
    from kvcm.engine import LLM
    from kvcm.models import tiny_model
    torch.set_num_threads(1)
    model, _ = tiny_model("llama", seed=0)
    # a checkout measured with --against may predate the kvcm_version spelling, or LLM's options as EngineConfig's
    try:
        from kvcm.engine.config import EngineConfig
        names = {f.name for f in dataclasses.fields(EngineConfig)}
    except ImportError:
        names = set(inspect.signature(LLM).parameters)
    key = "kvcm_version" if "kvcm_version" in names else "manager_version"
    return LLM(model, **{key: kvcm_version}, max_batch_size=batch, max_seq_len=max_seq, cuda_graph=True,
               cuda_graph_batch_sizes=sorted({1, batch}), **kw)


class Bench:
    """One engine per (kvcm_version, batch), built once, as ``throughput.py`` builds its kvcm graph engine."""

    def __init__(self, kvcm_version: str, batch: int, n2: int):
        import kvcm
        self.prompts = _prompts(batch)
        max_seq = max(len(p) for p in self.prompts) + n2 + 8
        cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=batch * (max_seq + 64), dtype="float32")
        self.llm = _new_llm(kvcm_version, batch=batch, max_seq=max_seq, kv_cache_config=cfg)

    def step_us(self, n: int, skip: int) -> list[float]:
        """Each steady decode step's host time, µs, over one ``generate`` of ``n`` new tokens."""
        from kvcm.engine import SamplingParams
        outs = []
        starts = _launch_times(self.llm, lambda: outs.extend(
            self.llm.generate(self.prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))))
        assert all(len(o.token_ids) == n for o in outs)
        gaps = [(b - a) * 1e6 for (a, _), (b, _) in zip(starts, starts[1:])]
        return gaps[skip:len(gaps) - skip]


class MixedBench:
    """One engine per (kvcm_version, reuse) for a workload ``Shape``, built once."""

    def __init__(self, shape: Shape, kvcm_version: str, reuse: str, requests: int, n2: int, same: bool = False,
                 stops: bool = False):
        import kvcm
        from kvcm.engine.cuda_graph import default_token_buckets
        self.shape, self.requests, self.n2, self.runs, self.same = shape, requests, n2, 1, same
        self.stops = STOP_STRINGS if stops else ()
        max_seq = shape.prefix + shape.question[1] + n2 + 8
        cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=256 * max_seq, dtype="float32",
                                 enable_block_reuse=reuse == "reuse")
        self.llm = _new_llm(kvcm_version, batch=256, max_seq=max_seq, kv_cache_config=cfg, max_num_tokens=8192,
                            cuda_graph_token_buckets=default_token_buckets(256, 8192))
        self.llm.eos_token_ids = (EOS,)
        if stops:
            from transformers import AutoTokenizer
            from kvcm.models.smollm2 import smollm2_cache_dir
            self.llm.tokenizer = AutoTokenizer.from_pretrained(str(smollm2_cache_dir()))

    def steps(self) -> list[tuple[float, str]]:
        """(host µs, kind) of every step of one run but the last (its end has no next launch)."""
        from kvcm.engine import SamplingParams
        # every run has a prefix of its own, so it starts with nothing of it cached and its first requests compute
        # it (not LLM.reset_prefix_cache: an older checkout measured with --against may not have it)
        self.runs += 1
        prompts = _shaped_prompts(self.shape, self.requests, seed=2 if self.same else self.runs)
        params = SamplingParams(max_new_tokens=self.n2, stop_strings=self.stops)
        starts = _launch_times(self.llm, lambda: self.llm.generate(prompts, params))
        return [((b - a) * 1e6, kind) for (a, kind), (b, _) in zip(starts, starts[1:])]


def measure(configs, *, new_tokens: int, skip: int, repeat: int, profile: int = 0, workload: str = "decode",
            requests: int = 1319, same_prompts: bool = False, stop_strings: bool = False) -> dict:
    shape = SHAPES.get(workload)
    mixed = shape is not None
    _no_forward(shape.eos_every if mixed else None)
    if mixed:
        benches = {key: MixedBench(shape, *key, requests, new_tokens, same_prompts, stop_strings) for key in configs}
        for b in benches.values():
            b.llm.generate(_shaped_prompts(shape, 4, seed=1), {"max_new_tokens": 4})     # warm
        run = lambda b: b.steps()                                       # noqa: E731
    else:
        benches = {key: Bench(*key, new_tokens) for key in configs}
        for b in benches.values():
            b.step_us(2 * skip + 4, skip)     # warm
        run = lambda b: b.step_us(new_tokens, skip)                     # noqa: E731
    samples = {key: [] for key in configs}
    for _ in range(repeat):
        for key, b in benches.items():
            samples[key].append(run(b)) if mixed else samples[key].extend(run(b))
    out = {f"{v}/{bs}": {"steps": s} for (v, bs), s in samples.items()}
    if profile:
        import cProfile
        import io
        import pstats
        for (v, bs), b in benches.items():
            prof = cProfile.Profile()
            prof.enable()
            run(b)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(profile)
            out[f"{v}/{bs}"]["profile"] = text.getvalue()
    return out


def _mixed_figure(runs: list[list[tuple[float, str]]]) -> str:
    """Per run the host's total; over the runs' steps of each kind the median, and the slowest step."""
    total = statistics.median(_totals_ms(runs))
    parts = [f"{total:6.0f} ms a run, {statistics.median(len(r) for r in runs):4.0f} steps"]
    for kind in ("decode", "mixed", "eager", "step"):
        us = [t for r in runs for t, k in r if k == kind]
        if us:
            parts.append(f"{kind} {len(us) // len(runs)} x {statistics.median(us):5.0f} us")
    parts.append(f"slowest {max(t for r in runs for t, _ in r) / 1e3:5.1f} ms")
    return ", ".join(parts)


def _totals_ms(runs: list[list[tuple[float, str]]]) -> list[float]:
    return [sum(us for us, _ in r) / 1e3 for r in runs]


def _p10(steps: list[float]) -> float:
    return statistics.quantiles(steps, n=10)[0]


def _figure(steps: list[float]) -> str:
    return f"{statistics.median(steps):6.0f} ({_p10(steps):6.0f})"


def _sources(src: str):
    sys.path.insert(0, str(Path(src).resolve()))
    sys.path.insert(1, str(HERE.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["decode", *SHAPES], default="decode")
    ap.add_argument("--kvcm-versions", nargs="+", default=list(ALL_VERSIONS),
                    help=f"{' '.join(ALL_VERSIONS)}, space- or comma-separated (as fewshot.py takes them)")
    ap.add_argument("--batches", nargs="+", type=int, default=[256, 1], help="decode: batch sizes")
    ap.add_argument("--requests", type=int, default=1319, help="fewshot, chat: requests a run")
    ap.add_argument("--new-tokens", type=int, default=128, help="decode: tokens each; fewshot, chat: at most")
    ap.add_argument("--skip", type=int, default=8, help="decode: steps left out at each end of a run (default: 8)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--same-prompts", action="store_true", help="fewshot, chat: every run the same prompts, all "
                    "runs in one process; prints each run's total in order")
    ap.add_argument("--stop-strings", action="store_true", help="fewshot, chat: the requests stop at fewshot.py's "
                    "stop strings (SmolLM2's tokenizer finds them)")
    ap.add_argument("--against", metavar="DIR", help="another checkout to measure beside this one")
    ap.add_argument("--src", default=str(HERE.parents[1]), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.kvcm_versions = [v for given in args.kvcm_versions for v in given.split(",") if v]
    if not args.kvcm_versions or set(args.kvcm_versions) - set(ALL_VERSIONS):
        ap.error(f"--kvcm-versions: give some of {', '.join(ALL_VERSIONS)}")
    mixed = args.workload in SHAPES
    if not mixed and args.new_tokens < 2 * args.skip + 4:
        ap.error(f"--new-tokens={args.new_tokens} leaves no steady steps after --skip={args.skip} at each end")
    if mixed and args.requests < 1:
        ap.error(f"--requests={args.requests} must be at least 1")
    _sources(args.src)
    configs = [(v, r) for r in ("no-reuse", "reuse") for v in args.kvcm_versions] if mixed else \
        [(v, b) for b in args.batches for v in args.kvcm_versions]
    if args.same_prompts and not mixed:
        ap.error("--same-prompts is for the fewshot and chat workloads")
    if args.stop_strings and not mixed:
        ap.error("--stop-strings is for the fewshot and chat workloads")
    opts = dict(new_tokens=args.new_tokens, skip=args.skip, profile=args.profile, workload=args.workload,
                requests=args.requests, same_prompts=args.same_prompts, stop_strings=args.stop_strings)
    if args.json:   # one repeat of a measurement driven by another invocation
        print(json.dumps(measure(configs, repeat=args.repeat, **opts)))
        return 0
    if args.against is None:
        res = {"this": measure(configs, repeat=args.repeat, **opts)}
    else:   # alternate the two checkouts run by run, each in its own process
        res = {"this": {}, "against": {}}
        # one run a process, alternating; a soak (--same-prompts) keeps every run of a checkout in one process
        rounds, per = (1, args.repeat) if args.same_prompts else (args.repeat, 1)
        for _ in range(rounds):
            for name, src in (("against", args.against), ("this", args.src)):
                cmd = [sys.executable, str(HERE), "--src", src, "--json", "--repeat", str(per), "--new-tokens",
                       str(args.new_tokens), "--skip", str(args.skip), "--kvcm-versions", *args.kvcm_versions,
                       "--batches", *map(str, args.batches), "--workload", args.workload, "--requests",
                       str(args.requests)] + (["--same-prompts"] if args.same_prompts else []) \
                    + (["--stop-strings"] if args.stop_strings else [])
                one = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                env={**os.environ, "PYTHONPATH": src}).stdout)
                for key, r in one.items():
                    res[name].setdefault(key, {"steps": []})["steps"] += r["steps"]
    if mixed:
        print(f"host work of a {args.workload} run ({args.requests} requests), µs a step: median of {args.repeat} runs")
        for key in res["this"]:
            for name in ("against", "this") if "against" in res else ("this",):
                label = f"{key} ({name})" if "against" in res else key
                print(f"  {label:>24}: {_mixed_figure(res[name][key]['steps'])}")
                if args.same_prompts:
                    print(f"  {'':>24}  each run, ms: "
                          + ", ".join(f"{t:.0f}" for t in _totals_ms(res[name][key]["steps"])))
            if "profile" in res["this"][key]:
                print(res["this"][key]["profile"])
        return 0
    print(f"host work per decode step, µs: median (10th percentile) of every steady step of {args.repeat} runs of "
          f"{args.new_tokens} new tokens")
    for key in res["this"]:
        this = res["this"][key]["steps"]
        line = f"  {key:>8}: {_figure(this)}"
        if "against" in res:
            before = res["against"][key]["steps"]
            line = (f"  {key:>8}: {_figure(before)} -> {_figure(this)}   "
                    f"{100 * (statistics.median(this) / statistics.median(before) - 1):+.0f}% "
                    f"({100 * (_p10(this) / _p10(before) - 1):+.0f}%)")
        print(line)
        if "profile" in res["this"][key]:
            print(res["this"][key]["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
