"""Greedy sampling. The top1 - top2 logit margin is kept so parity reports can tell a real divergence from a
near tie that bf16 rounding may flip.

``greedy_packed`` is tensors only (a CUDA graph captures it after the logits, so a replayed step hands the host
one small tensor); ``unpack`` is the one device-to-host copy.
"""
from __future__ import annotations

import torch


def greedy_packed(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` [n, vocab] -> [2, n] float64: the argmax token of each row and its top1 - top2 margin (fp32).

    Two row maxima, not ``topk(2)``: on CUDA a top-k over a 49,152-wide vocabulary is a radix select (the
    ``mbtopk`` kernels, ``computeBlockDigitCounts`` and ``gatherTopK``), which took ~230 us of a 2.1 ms decode step
    at batch 256 on an H100, where a row maximum is one read of the logits. The row's maximum and its first index
    (``argmax``'s, the token Hugging Face picks), then the maximum with that one entry set to -inf (restored after,
    so the caller's logits are unchanged), give topk's values exactly, so the same margins; a tie for the top
    gives margin 0 either way. Both maxima are taken in the logits' own dtype and widened after, which is exact
    (widening keeps the order), so bf16 logits are not copied to fp32 first."""
    if logits.shape[-1] < 2:
        return torch.stack([logits.argmax(-1).double(), torch.full_like(logits[:, 0], float("inf")).double()])
    with torch.inference_mode():        # the engine's logits are inference tensors: written in place only in it
        logits = logits if logits.is_contiguous() else logits.contiguous()
        best, token = logits.max(-1, keepdim=True)
        logits.scatter_(-1, token, float("-inf"))
        second = logits.amax(-1, keepdim=True)
        logits.scatter_(-1, token, best)
        margin = best.float() - second.float()
        return torch.stack([token[:, 0].double(), margin[:, 0].double()])


def unpack(packed: torch.Tensor, n: int) -> tuple[list[int], list[float]]:
    """Tokens and margins of the first ``n`` rows as Python lists, with one copy off the device. The ids are
    floats in ``packed``: converting them row by row in Python costs more than a torch conversion from a few
    dozen rows on (about 40 against 15 µs at 256), less below it (each torch op is microseconds)."""
    rows = packed[:, :n]
    if n < 64:
        tokens, margins = rows.tolist()
        return list(map(int, tokens)), margins
    if rows.device.type != "cpu":
        rows = rows.cpu()
    return rows[0].long().tolist(), rows[1].tolist()


def greedy(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """``logits`` [n, vocab] -> (argmax token per row, top1 - top2 margin per row), computed in fp32."""
    return unpack(greedy_packed(logits), logits.shape[0])
