"""Llama 4's attention temperature tuning, at the positions the paged path knows.

Llama 4 scales the queries of its no-RoPE layers by ``log1p(floor((p + 1) / floor_scale)) * attn_scale + 1`` at
position ``p`` (``Llama4TextAttention.forward``, from arXiv 2501.19399), and counts ``p`` from Hugging Face's cache
(``cache.get_seq_length``). The engine runs the model without one (``use_cache=False``), so the module counted
the step's packed tokens from 0; the paged attention undoes that scale and applies the true positions' before
it attends. Below ``floor_scale - 1`` both scales are 1 and nothing changes.
"""
from __future__ import annotations

import torch


def tuned(module) -> bool:
    """Whether the module scales its queries by position (a Llama 4 no-RoPE layer with tuning on)."""
    return bool(getattr(module, "attn_temperature_tuning", False)) and not getattr(module, "use_rope", True)


def _scale(module, positions: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.floor((positions.float() + 1.0) / module.floor_scale)) * module.attn_scale + 1.0


def retune(module, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """q [T, H, D] as the module scaled it (packed index ``0 .. T-1`` for position) -> scaled at ``positions``
    [T]. Every scale is at least 1, so the division is safe."""
    packed = torch.arange(q.shape[0], device=q.device)
    return q * (_scale(module, positions[:q.shape[0]]) / _scale(module, packed)).to(q.dtype)[:, None, None]
