"""The paged attention kernel on decode steps, whole versus split keys (flash-decoding), on CUDA.

A decode row is one query block, so without splitting one program per (sequence, KV head) reads the sequence's
whole KV tile after tile; at a few-shot prompt's 1,400 positions that is 44 tiles in a row. With
``split_len`` the keys are read in shares of that many positions, one program each, and a second launch
combines them. Which is faster depends on the batch (how many programs there are already) and the KV length, so
this times every pair in one run, SmolLM2-135M's attention shape (9 query heads, 3 KV heads, 64 dims), bf16,
32-token pages, each KV length the same for every row:

    python benchmarks/decode_attention.py [--batches 1 8 64 256] [--kv-lens 256 1400 4096]
                                          [--split-lens 0 64 128 256 512
                                           | --variants plain:32:4 plain+index:32:4 pipe+index:64:4:3 ...]

prints, per (batch, KV length), each ``split_len``'s time per call (CUDA events over ``--iters`` calls in a
graph-free loop, after a warm-up) and its ratio to the unsplit kernel; outputs are checked equal to the unsplit
ones first. ``--variants`` times launch tunings instead, each ``plain|pipe[+index]:TILE_N:NUM_WARPS[:STAGES]`` (the
first is the baseline; ``plain:32:4`` was the engine's kernel before ``decode_rows_by_index``, ``plain+index:32:4``
is it now).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvcm.engine import triton_attention  # noqa: E402

HEADS, KV_HEADS, DIM, TPB = 9, 3, 64, 32


def case(batch: int, kv_len: int, device: str):
    pages = -(-kv_len // TPB)
    g = torch.Generator(device="cpu").manual_seed(batch * kv_len)
    kv = torch.randn(batch * pages, 2, TPB, KV_HEADS, DIM, generator=g).to(device, torch.bfloat16)
    table = torch.randperm(batch * pages, generator=g).view(batch, pages).to(device)
    q = torch.randn(batch, HEADS, DIM, generator=g).to(device, torch.bfloat16)
    lens = torch.full((batch,), kv_len, device=device)
    starts = torch.arange(batch + 1, device=device)
    return q, kv, table, lens, starts


def time_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def header(script: str, what: str, columns: str, label: str, values: list) -> None:
    """Exit unless CUDA is here; then the table's title (ratios to the first of ``values``) and column heads."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{script} times the Triton kernel on CUDA; no CUDA device here")
    print(f"{torch.cuda.get_device_name()}: paged attention per {what}, bf16, {HEADS}/{KV_HEADS} heads, {DIM} dims, "
          f"{TPB}-token pages; ms (ratio to {label} {values[0]})")
    print(columns + " " + " ".join(f"{(label + ' ' + str(v)).strip():>18}" for v in values))


def variant(text: str) -> dict:
    """``plain|pipe[+index]:TILE_N:NUM_WARPS[:STAGES]`` -> paged_attention's tuning keywords (``+index``: the
    decode rows taken by index, ``uniform_q_len=1``, instead of searched)."""
    kind, *numbers = text.split(":")
    loop, _, rows = kind.partition("+")
    if loop not in ("plain", "pipe") or rows not in ("", "index") or not 2 <= len(numbers) <= 3 \
            or not all(n.isdigit() for n in numbers):
        raise argparse.ArgumentTypeError(f"variant {text!r}: expected plain|pipe[+index]:TILE_N:NUM_WARPS[:STAGES], "
                                         "e.g. pipe+index:64:4:3")
    tuning = {"pipelined": loop == "pipe", "tile_n": int(numbers[0]), "num_warps": int(numbers[1]),
              "uniform_q_len": 1 if rows else 0}
    if len(numbers) == 3:
        tuning["stages"] = int(numbers[2])
    return tuning


def timed_cells(inputs, keyword: str | None, values: list, iters: int) -> list[str]:
    """The kernel on ``inputs`` (q, pages, table, KV lengths, query starts) with ``keyword`` set to each of
    ``values`` (``keyword`` None: each value is a dict of keywords, a ``variant``'s): its output checked against the
    first value's, its ms per call and its ratio to the first's."""
    q, kv, table, lens, starts = inputs

    def call(v):
        return triton_attention.paged_attention(q, kv, table, lens, starts, scale=DIM ** -0.5, window=None, tpb=TPB,
                                                **(v if keyword is None else {keyword: v}))
    first = call(values[0])
    times = []
    for v in values:
        torch.testing.assert_close(call(v), first, atol=2e-2, rtol=2e-2)
        times.append(time_ms(lambda: call(v), iters))
    return [f"{ms:8.4f} ({ms / times[0]:4.2f}x)" for ms in times]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--kv-lens", type=int, nargs="+", default=[256, 1400, 4096])
    ap.add_argument("--split-lens", type=int, nargs="+", default=[0, 64, 128, 256, 512])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--variants", nargs="+", metavar="KIND:TILE_N:WARPS[:STAGES]",
                    help="time these launch tunings (plain|pipe[+index]:TILE_N:NUM_WARPS[:STAGES]) against the first, "
                         "keys whole, instead of the split lengths")
    args = ap.parse_args(argv)
    bad = [s for s in args.split_lens if s < 0 or s % triton_attention.TILE_N]
    if bad:
        ap.error(f"--split-lens {bad[0]}: must be 0 or a positive multiple of {triton_attention.TILE_N}")
    args.split_lens = sorted(set(args.split_lens) | {0})      # 0 first: the others' ratios are to it
    if args.variants:
        try:
            values = [variant(text) for text in args.variants]
        except argparse.ArgumentTypeError as e:
            ap.error(f"--variants: {e}")
        keyword, label, names = None, "", args.variants
    else:
        keyword, label, names, values = "split_len", "split", args.split_lens, args.split_lens
    header("decode_attention.py", "decode call", f"{'batch':>6} {'kv_len':>7}", label, names)
    for batch in args.batches:
        for kv_len in args.kv_lens:
            cells = timed_cells(case(batch, kv_len, "cuda"), keyword, values, args.iters)
            print(f"{batch:>6} {kv_len:>7} " + " ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
