"""The host's share of a decode step, measured without a GPU: the engine's own Python per step.

On the H200 an overlapped CUDA-graph decode step lasts ``max(GPU time, host time)``, so once the GPU is fast
the host's work per step (schedule, fill, launch, commit, and the previous step's completion) is the period.
That work does not need the GPU to be measured: here the real engine runs (``LLM`` with its scheduler, its V1
or V2 manager, the static decode steps and their buffers, the overlapped pipeline) with the model's forward
replaced by a constant tensor of the right shape, so every second a step takes is host work.

A decode step's time is the interval between two step launches (``StepPipeline._launch``) while ``batch``
prompts decode ``--new-tokens`` tokens each (EOS ignored): one step's schedule, fill, launch and commit and the
previous step's completion. The first and last ``--skip`` steps (prefill, the batch finishing) are left out. A
shared machine's other work lands on some intervals, not all, so the figures are the median and the 10th
percentile of every steady interval of ``--repeat`` runs; runs alternate between the configurations.

``--against DIR`` runs the same measurement on another checkout (e.g. a ``git worktree`` of an older commit) in
a subprocess, interleaved with this one, and prints both with the change: a before/after from one invocation.
``--profile N`` prints the ``N`` costliest functions (cProfile, own time) of one run per configuration.

    python benchmarks/host_step.py                                  # V1 and V2 at batch 256 and 1
    python benchmarks/host_step.py --against /tmp/base --repeat 3
    python benchmarks/host_step.py --kvcm-versions v2 --batches 256 --profile 25
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def _prompts(batch: int, seed: int = 0) -> list[list[int]]:
    """GSM8K-chat-sized prompts (80..220 tokens), random ids inside the tiny model's vocabulary (256, which
    ``LLM.generate`` checks): the host path never reads their values."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (int(n),), generator=g).tolist() for n in torch.randint(80, 220, (batch,),
                                                                                           generator=g)]


def _no_forward() -> None:
    """Replace the model's forward with constants of the right shape, so only the host's work is left: a
    static step returns its ``[2, R]`` greedy tensor (what a replayed graph hands back), an eager step
    ``[R, 2]`` logits."""
    import torch
    from kvcm.engine.cuda_graph import StaticStep
    from kvcm.engine.runner import ModelRunner

    def static_forward(self):
        if self.greedy is None:
            r = self.buf.num_logits
            self.greedy = torch.stack([(7 + torch.arange(r) % 97).double(), torch.ones(r, dtype=torch.float64)])
        return self.greedy

    def eager_forward(self, buf, ctx):
        return torch.zeros(buf.num_logits, 2)

    StaticStep.forward = static_forward
    ModelRunner.forward = eager_forward


class Bench:
    """One engine per (kvcm_version, batch), built once, as ``throughput.py`` builds its kvcm graph engine."""

    def __init__(self, kvcm_version: str, batch: int, n2: int):
        import inspect

        import torch
        import kvcm
        from kvcm.engine import LLM
        from kvcm.models import tiny_model
        torch.set_num_threads(1)
        self.prompts = _prompts(batch)
        max_seq = max(len(p) for p in self.prompts) + n2 + 8
        model, _ = tiny_model("llama", seed=0)
        cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=batch * (max_seq + 64), dtype="float32")
        # a checkout measured with --against may predate the kvcm_version spelling
        key = "kvcm_version" if "kvcm_version" in inspect.signature(LLM).parameters else "manager_version"
        self.llm = LLM(model, **{key: kvcm_version}, kv_cache_config=cfg, max_batch_size=batch,
                       max_seq_len=max_seq, cuda_graph=True, cuda_graph_batch_sizes=sorted({1, batch}))

    def step_us(self, n: int, skip: int) -> list[float]:
        """Each steady decode step's host time, µs, over one ``generate`` of ``n`` new tokens."""
        from kvcm.engine import SamplingParams
        _STARTS.clear()
        outs = self.llm.generate(self.prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
        assert all(len(o.token_ids) == n for o in outs)
        gaps = [(b - a) * 1e6 for a, b in zip(_STARTS, _STARTS[1:])]
        return gaps[skip:len(gaps) - skip]


_STARTS: list[float] = []


def _time_launches() -> None:
    """Note when each step starts: the pipeline launches once per step."""
    from kvcm.engine.pipeline import StepPipeline
    launch = StepPipeline._launch

    def timed(self, scheduler):
        _STARTS.append(time.perf_counter())
        return launch(self, scheduler)
    StepPipeline._launch = timed


def measure(configs, *, new_tokens: int, skip: int, repeat: int, profile: int = 0) -> dict:
    _no_forward()
    _time_launches()
    benches = {key: Bench(*key, new_tokens) for key in configs}
    for b in benches.values():
        b.step_us(2 * skip + 4, skip)     # warm
    samples = {key: [] for key in configs}
    for _ in range(repeat):
        for key, b in benches.items():
            samples[key] += b.step_us(new_tokens, skip)
    out = {f"{v}/{bs}": {"steps": s} for (v, bs), s in samples.items()}
    if profile:
        import cProfile
        import io
        import pstats
        for (v, bs), b in benches.items():
            prof = cProfile.Profile()
            prof.enable()
            b.step_us(new_tokens, skip)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(profile)
            out[f"{v}/{bs}"]["profile"] = text.getvalue()
    return out


def _p10(steps: list[float]) -> float:
    return statistics.quantiles(steps, n=10)[0]


def _figure(steps: list[float]) -> str:
    return f"{statistics.median(steps):6.0f} ({_p10(steps):6.0f})"


def _sources(src: str):
    sys.path.insert(0, str(Path(src).resolve()))
    sys.path.insert(1, str(HERE.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvcm-versions", nargs="+", default=["v1", "v2"])
    ap.add_argument("--batches", nargs="+", type=int, default=[256, 1])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--skip", type=int, default=8, help="steps left out at each end of a run (default: 8)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--against", metavar="DIR", help="another checkout to measure beside this one")
    ap.add_argument("--src", default=str(HERE.parents[1]), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.new_tokens < 2 * args.skip + 4:
        ap.error(f"--new-tokens={args.new_tokens} leaves no steady steps after --skip={args.skip} at each end")
    _sources(args.src)
    configs = [(v, b) for b in args.batches for v in args.kvcm_versions]
    if args.json:   # one repeat of a measurement driven by another invocation
        print(json.dumps(measure(configs, new_tokens=args.new_tokens, skip=args.skip, repeat=args.repeat,
                                 profile=args.profile)))
        return 0
    if args.against is None:
        res = {"this": measure(configs, new_tokens=args.new_tokens, skip=args.skip, repeat=args.repeat,
                               profile=args.profile)}
    else:   # alternate the two checkouts run by run, each in its own process
        res = {"this": {}, "against": {}}
        for _ in range(args.repeat):
            for name, src in (("against", args.against), ("this", args.src)):
                cmd = [sys.executable, str(HERE), "--src", src, "--json", "--repeat", "1", "--new-tokens",
                       str(args.new_tokens), "--skip", str(args.skip), "--kvcm-versions", *args.kvcm_versions,
                       "--batches", *map(str, args.batches)]
                one = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                env={**os.environ, "PYTHONPATH": src}).stdout)
                for key, r in one.items():
                    res[name].setdefault(key, {"steps": []})["steps"] += r["steps"]
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
