"""TensorRT-LLM's V1 pools for a model with several attention windows (docs/semantics.md 10, "V1 windows").

kvcm's V1 gives every layer group the same number of blocks (its requests hold the same tokens in every pool
and never recycle an out-of-window block). TensorRT-LLM's V1 with variable sliding windows
(``resource_manager.py`` ``calculate_max_num_blocks_for_vswa``) sizes each window's pool on its own:

* the pool bytes are ``max_gpu_total_bytes`` when it is set (> 0), else ``free_gpu_memory_fraction`` (0.9 when
  unset) of free memory: not the smaller of the two, and ``max_tokens`` is ignored on this path;
* each window gets an equal share of those bytes (``TRTLLM_WINDOW_SIZE_SHARES`` overrides the shares);
* its blocks are ``share / (bytes a token of its layers) // tokens_per_block``.

This module gives that number for kvcm's layer groups so a plan can be compared with upstream's; it does not
model ``adjust_window_sizes_for_vswa`` (windows cut down when the memory cannot hold one of each).
"""

from __future__ import annotations

from .errors import ConfigError


def trtllm_v1_window_blocks(groups, tpb: int, *, max_gpu_total_bytes: int | None = None,
                            free_memory_bytes: int | None = None, fraction: float | None = None,
                            shares=None) -> dict[int, int]:
    """Blocks per layer group (by index) of TensorRT-LLM's V1 variable-window pools."""
    if max_gpu_total_bytes:
        pool_bytes = max_gpu_total_bytes
    elif free_memory_bytes is not None:
        pool_bytes = int(free_memory_bytes * (fraction or 0.9))
    else:
        raise ConfigError("free_memory_bytes", None, "is required when max_gpu_total_bytes is not set")
    shares = [1.0 / len(groups)] * len(groups) if shares is None else list(shares)
    if len(shares) != len(groups):
        raise ConfigError("shares", tuple(shares), f"needs one share per layer group ({len(groups)})")
    ordered = sorted(groups, key=lambda g: (g.window is None, g.window or 0))   # windows ascending, full last
    out = {}
    for share, group in zip(shares, ordered):
        bytes_per_token = group.bytes_per_block / tpb
        out[group.index] = int(pool_bytes * share / bytes_per_token // tpb)
    return out
