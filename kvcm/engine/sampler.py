"""Greedy sampling. The top1 - top2 logit margin is kept so parity reports can tell a real divergence from a
near tie that bf16 rounding may flip."""
from __future__ import annotations

import torch


def greedy(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """``logits`` [n, vocab] -> (argmax token per row, top1 - top2 margin per row), computed in fp32."""
    logits = logits.float()
    if logits.shape[-1] < 2:
        return logits.argmax(-1).tolist(), [float("inf")] * logits.shape[0]
    top = logits.topk(2, dim=-1)
    tokens = top.indices[:, 0]
    margins = top.values[:, 0] - top.values[:, 1]
    return tokens.tolist(), margins.tolist()
