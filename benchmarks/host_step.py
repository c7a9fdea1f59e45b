"""The host's share of a decode step, measured without a GPU: the engine's own Python per step.

On the H200 an overlapped CUDA-graph decode step lasts ``max(GPU time, host time)``, so once the GPU is fast
the host's work per step (schedule, fill, launch, commit, and the previous step's completion) is the period.
That work does not need the GPU to be measured: here the real engine runs (``LLM`` with its scheduler, its V1
or V2 manager, the static decode steps and their buffers, the overlapped pipeline) with the model's forward
replaced by a constant tensor of the right shape, so every second a step takes is host work.

A decode step's time is ``(time(n2) - time(n1)) / (n2 - n1)``: ``batch`` prompts decode ``n2`` and ``n1`` new
tokens (EOS ignored), and the difference leaves the prefill out (``step_profile.py`` measures the GPU the same
way). The clock is the process's CPU time, not the wall: with no device to wait for, the loop is all CPU, and a
shared machine's other work then costs it cache misses but not the seconds it waited for a core. Runs alternate
between the configurations; each figure is the fastest of ``--repeat`` runs, with the median beside it.

``--against DIR`` runs the same measurement on another checkout (e.g. a ``git worktree`` of an older commit) in
a subprocess, interleaved with this one, and prints both with the change: a before/after from one invocation.
``--profile N`` prints the ``N`` costliest functions (cProfile, own time) of one ``n2`` run per configuration.

    python benchmarks/host_step.py                                  # V1 and V2 at batch 256 and 1
    python benchmarks/host_step.py --against /tmp/base --repeat 7
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
    """GSM8K-chat-sized prompts (80..220 tokens), random ids: the host path never reads their values."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 1000, (int(n),), generator=g).tolist() for n in torch.randint(80, 220, (batch,),
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

    def seconds(self, n: int) -> float:
        from kvcm.engine import SamplingParams
        t = time.process_time()
        outs = self.llm.generate(self.prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
        dt = time.process_time() - t
        assert all(len(o.token_ids) == n for o in outs)
        return dt


def measure(configs, *, n1: int, n2: int, repeat: int, profile: int = 0) -> dict:
    _no_forward()
    benches = {key: Bench(*key, n2) for key in configs}
    for b in benches.values():
        b.seconds(n1)     # warm
    samples = {key: [] for key in configs}
    for _ in range(repeat):
        for key, b in benches.items():
            samples[key].append((b.seconds(n2) - b.seconds(n1)) / (n2 - n1) * 1e6)
    out = {f"{v}/{bs}": {"runs": s} for (v, bs), s in samples.items()}
    if profile:
        import cProfile
        import io
        import pstats
        for (v, bs), b in benches.items():
            prof = cProfile.Profile()
            prof.enable()
            b.seconds(n2)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(profile)
            out[f"{v}/{bs}"]["profile"] = text.getvalue()
    return out


def _figure(runs: list[float]) -> str:
    return f"{min(runs):6.0f} ({statistics.median(runs):6.0f})"


def _sources(src: str):
    sys.path.insert(0, str(Path(src).resolve()))
    sys.path.insert(1, str(HERE.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvcm-versions", nargs="+", default=["v1", "v2"])
    ap.add_argument("--batches", nargs="+", type=int, default=[256, 1])
    ap.add_argument("--n1", type=int, default=16)
    ap.add_argument("--n2", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--against", metavar="DIR", help="another checkout to measure beside this one")
    ap.add_argument("--src", default=str(HERE.parents[1]), help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.n2 <= args.n1:
        ap.error(f"--n2={args.n2} must exceed --n1={args.n1}")
    _sources(args.src)
    configs = [(v, b) for b in args.batches for v in args.kvcm_versions]
    if args.json:   # one repeat of a measurement driven by another invocation
        print(json.dumps(measure(configs, n1=args.n1, n2=args.n2, repeat=args.repeat, profile=args.profile)))
        return 0
    if args.against is None:
        res = {"this": measure(configs, n1=args.n1, n2=args.n2, repeat=args.repeat, profile=args.profile)}
    else:   # alternate the two checkouts run by run, each in its own process
        res = {"this": {}, "against": {}}
        for _ in range(args.repeat):
            for name, src in (("against", args.against), ("this", args.src)):
                cmd = [sys.executable, str(HERE), "--src", src, "--json", "--repeat", "1", "--n1", str(args.n1),
                       "--n2", str(args.n2), "--kvcm-versions", *args.kvcm_versions, "--batches", *map(str, args.batches)]
                one = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                env={**os.environ, "PYTHONPATH": src}).stdout)
                for key, r in one.items():
                    res[name].setdefault(key, []).extend(r["runs"])
        res = {name: {k: {"runs": s} for k, s in r.items()} for name, r in res.items()}
    print(f"host work per decode step, µs: fastest (median) of {args.repeat} runs, {args.n2} vs {args.n1} new tokens")
    for key in res["this"]:
        this = res["this"][key]["runs"]
        line = f"  {key:>8}: {_figure(this)}"
        if "against" in res:
            before = res["against"][key]["runs"]
            line = (f"  {key:>8}: {_figure(before)} -> {_figure(this)}   {100 * (min(this) / min(before) - 1):+.0f}% "
                    f"({100 * (statistics.median(this) / statistics.median(before) - 1):+.0f}%)")
        print(line)
        if "profile" in res["this"][key]:
            print(res["this"][key]["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
