"""The paged attention kernel on the steps that carry prefill, by query tile (``block_m``), on CUDA.

A program of the kernel takes one KV head and ``block_m`` rows of queries: the KV head's query heads (3 for
SmolLM2) times ``block_m // 3`` query tokens. At the least tile, 16 rows, a prefill chunk reads each key tile once
per 5 of its tokens; a larger tile reads it once per 10, 21 or 42, at the price of empty rows in every decode
row's program (a decode fills 3 rows of the tile). Which wins depends on the step, so this times the kernel on
the steps the benchmarks run, SmolLM2-135M's attention shape (9 query heads, 3 KV heads, 64 dims), bf16,
32-token pages:

* ``fewshot-reuse``: GSM8K 8-shot with reuse on: 192 decodes at 1,400 positions beside 64 admissions that each
  compute their last 65 tokens over 1,316 cached ones (``fewshot.py``'s mixed step);
* ``fewshot-cold``: the same prompts with reuse off: an 8,192-token step of whole 1,381-token prompts;
* ``chat``: the full-GSM8K chat run's admissions: 48 prompts of 80-220 tokens beside 208 decodes at 300;
* ``decode``: 256 decodes at 1,400 positions, where a larger tile only costs.

    python benchmarks/prefill_attention.py [--block-ms 16 32 64 128] [--iters 100]

prints each step's time per call at each ``block_m`` (CUDA events, after a warm-up) and its ratio to the least
tile; outputs are checked equal to the least tile's first.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode_attention import DIM, HEADS, KV_HEADS, TPB, header, timed_cells  # noqa: E402
from kvcm.engine import triton_attention  # noqa: E402

STEPS = {   # name: rows of (queries, KV length after the step)
    "fewshot-reuse": [(1, 1400)] * 192 + [(65, 1381)] * 64,
    "fewshot-cold": [(1381, 1381)] * 5 + [(8192 - 5 * 1381, 1381)],
    "chat": [(1, 300)] * 208 + [(80 + (i * 37) % 141, 80 + (i * 37) % 141) for i in range(48)],
    "decode": [(1, 1400)] * 256,
}


def step(rows: list[tuple[int, int]], device: str):
    """The kernel's arguments for one packed step of ``rows``: every row its own pages, in a shuffled order."""
    g = torch.Generator(device="cpu").manual_seed(len(rows))
    widths = [-(-kv // TPB) for _, kv in rows]
    pages = sum(widths)
    kv = torch.randn(pages, 2, TPB, KV_HEADS, DIM, generator=g).to(device, torch.bfloat16)
    order = torch.randperm(pages, generator=g)
    table = torch.full((len(rows), max(widths)), -1, dtype=torch.long)
    at = 0
    for s, w in enumerate(widths):
        table[s, :w] = order[at:at + w]
        at += w
    starts = torch.tensor([0] + [q for q, _ in rows]).cumsum(0)
    q = torch.randn(int(starts[-1]), HEADS, DIM, generator=g).to(device, torch.bfloat16)
    lens = torch.tensor([kv for _, kv in rows])
    return q, kv, table.to(device), lens.to(device), starts.to(device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-ms", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args(argv)
    least = triton_attention.tile_shape(HEADS, KV_HEADS)[0]
    for m in args.block_ms:
        try:
            triton_attention.tile_shape(HEADS, KV_HEADS, m)
        except ValueError as exc:
            ap.error(f"--block-ms: {exc}")
    args.block_ms = sorted(set(args.block_ms) | {least})      # the least first: the others' ratios are to it
    header("prefill_attention.py", "step", f"{'step':>14} {'tokens':>7}", "block_m", args.block_ms)
    for name in args.steps:
        cells = timed_cells(step(STEPS[name], "cuda"), "block_m", args.block_ms, args.iters)
        tokens = sum(q for q, _ in STEPS[name])
        print(f"{name:>14} {tokens:>7} " + " ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
