"""Seeded random prompts over a tiny model's vocabulary (ids 3..255: clear of BOS/EOS/pad)."""

import torch


def random_prompts(seed: int, lengths) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]
