"""The host's share of a speculative decode step at batch 1, measured without a GPU.

A speculative step is not overlapped with the GPU (``pipeline.py``): between reading one step's tokens and
launching the next the host verifies (both caches' end-of-step calls, the accepted tokens appended), schedules
(capacity for ``1 + D`` slots), drafts (the n-gram pool learns the new tokens and looks up the tail), fills the
step's buffers and launches. On the H200 that time is added to every step's GPU time, so it decides whether an
acceptance length pays.

Here the real engine runs (``LLM`` with its scheduler, V2 manager, static decode steps, pipeline and the n-gram
drafter) and only the forward is replaced: a static step's launch fills its buffers as usual and returns chosen
tokens instead of running the model. The chosen tokens make the target *accept* a seeded number of each step's
drafts (mean acceptance length ``--acceptance``, like the n-gram pool's on GSM8K) and then say something new,
so the drafter learns and looks up text as it would. Plain graph decoding (overlapped) runs beside it with the
same stub.

A step's time is ``(time(n2) - time(n1)) / (steps(n2) - steps(n1))`` over ``--prompts`` prompts one after
another at batch 1, so prefill drops out. Each figure is the fastest of ``--repeat`` runs with the median beside.

    python benchmarks/spec_host.py                     # plain vs n-gram D = 1, 2, 4
    python benchmarks/spec_host.py --drafts 4 --profile 25
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 4000


class Stub:
    """What the replaced forward answers: a decode's drafts accepted ``a`` at a time (``a`` from a seeded
    geometric-like draw with the asked mean), then a fresh token from a small phrase-like vocabulary."""

    def __init__(self, acceptance: float, seed: int = 0):
        self.rng = random.Random(seed)
        self.p = 1 - 1 / acceptance          # chance of accepting one more draft
        self.steps = 0

    def reset(self):
        self.rng.seed(0)
        self.steps = 0

    def fresh(self) -> int:
        return 3 + int(self.rng.paretovariate(1.2)) % VOCAB

    def tokens(self, items) -> list[int]:
        out = []
        for it in items:
            k = it.num_logits - 1
            if it.decode and k > 0:
                a = 0
                while a < k and self.rng.random() < self.p:
                    a += 1
                drafts = it.token_ids[1:]
                new = self.fresh()
                if a < k and new == drafts[a]:
                    new = 3 + (new + 1) % VOCAB
                out += drafts[:a] + [new] + [0] * (k - a)
            else:
                out += [self.fresh() for _ in range(it.num_logits)]
        return out


def install(stub: Stub) -> None:
    import torch
    from kvcm.engine.cuda_graph import StaticStep

    def launch(self, items):
        k = self.fill(items, checked=True)
        stub.steps += 1
        toks = stub.tokens(items)
        packed = torch.zeros(2, self.buf.num_logits, dtype=torch.float64)
        packed[0, :len(toks)] = torch.tensor(toks, dtype=torch.float64)
        packed[1] = 1.0
        return packed, k

    StaticStep.launch = launch


def _prompts(n: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[3 + int(rng.paretovariate(1.2)) % VOCAB for _ in range(rng.randint(80, 220))] for _ in range(n)]


class Bench:
    def __init__(self, d: int, prompts, n2: int, stub: Stub):
        import torch
        import kvcm
        from kvcm.engine import LLM
        from kvcm.models import tiny_model
        torch.set_num_threads(1)
        self.prompts, self.stub = prompts, stub
        max_seq = max(len(p) for p in prompts) + n2 + 16
        model, _ = tiny_model("llama", seed=0, vocab_size=VOCAB + 8)
        cfg = kvcm.KvCacheConfig(tokens_per_block=32, max_tokens=4 * (max_seq + 64), dtype="float32")
        self.llm = LLM(model, kv_cache_config=cfg, max_batch_size=1, max_seq_len=max_seq, cuda_graph=True,
                       cuda_graph_batch_sizes=[1], max_draft_len=d, drafter="ngram" if d else None,
                       cuda_graph_token_buckets=[256])

    def run(self, n: int) -> tuple[float, int]:
        """Seconds and steps for every prompt, one after another (batch 1), each ``n`` new tokens."""
        from kvcm.engine import SamplingParams
        if self.llm.drafter is not None:
            self.llm.drafter.clear()
        self.stub.reset()
        t = time.perf_counter()
        outs = self.llm.generate(self.prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
        dt = time.perf_counter() - t
        assert all(len(o.token_ids) == n for o in outs)
        return dt, self.stub.steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafts", nargs="+", type=int, default=[1, 2, 4], help="draft lengths D (0: plain)")
    ap.add_argument("--acceptance", type=float, default=1.9, help="mean acceptance length the stub produces")
    ap.add_argument("--prompts", type=int, default=4, help="prompts run one after another at batch 1")
    ap.add_argument("--n1", type=int, default=16)
    ap.add_argument("--n2", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's N costliest functions")
    args = ap.parse_args(argv)
    if args.n2 <= args.n1:
        ap.error(f"--n2={args.n2} must exceed --n1={args.n1}")
    stub = Stub(args.acceptance)
    install(stub)
    prompts = _prompts(args.prompts)
    configs = [0] + [d for d in args.drafts if d]
    benches = {d: Bench(d, prompts, args.n2, stub) for d in configs}
    for b in benches.values():
        b.run(args.n1)
    per_step = {d: [] for d in configs}
    per_token = {d: [] for d in configs}
    for _ in range(args.repeat):
        for d, b in benches.items():
            (t1, s1), (t2, s2) = b.run(args.n1), b.run(args.n2)
            per_step[d].append((t2 - t1) / (s2 - s1) * 1e6)
            per_token[d].append((t2 - t1) / (len(prompts) * (args.n2 - args.n1)) * 1e6)
    print(f"host work at batch 1, µs: fastest (median) of {args.repeat} runs; {len(prompts)} prompts, "
          f"{args.n2} vs {args.n1} new tokens, stub acceptance length {args.acceptance}")
    for d in configs:
        name = "plain" if d == 0 else f"ngram D={d}"
        st = benches[d].llm.spec_stats
        al = f", acceptance length {st.mean_acceptance_length:.2f}" if st is not None else ""
        print(f"  {name:>11}: {min(per_step[d]):6.0f} ({statistics.median(per_step[d]):6.0f}) a step, "
              f"{min(per_token[d]):6.0f} ({statistics.median(per_token[d]):6.0f}) a token{al}")
    if args.profile:
        import cProfile
        import pstats
        for d, b in benches.items():
            prof = cProfile.Profile()
            prof.enable()
            b.run(args.n2)
            prof.disable()
            print(f"---- {'plain' if d == 0 else f'ngram D={d}'}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
