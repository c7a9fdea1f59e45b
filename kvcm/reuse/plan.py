"""What block reuse does to a ``kvcm plan`` (docs/semantics.md 11.5): nothing to the pools, which are sized the same
with reuse on or off, and what it changes once requests run. Written here so the plan's text and its ``--json``
say the same thing."""

from __future__ import annotations

AT_RUN_TIME = (
    "cached blocks stay out of the free list until an allocation evicts them (lowest priority, least recently "
    "released leaf first); get_num_free_blocks and KvCacheStats.free_num_blocks count them as free",
    "a request made with add_sequence and its token ids reuses its cached prefix (its prompt less the last token) "
    "and needs ceil(len / tpb) - reused new blocks, plus one per partial copy",
    "requests without token ids (context chunks, add_request, warmup dummies) are never matched or stored",
)


def plan_entry(cfg, deepseek: bool) -> dict:
    """The ``block_reuse`` key of the plan: the config's switches, what the managers apply, and the effect."""
    on = bool(cfg.enable_block_reuse)
    return {"enable_block_reuse": on,
            "enable_partial_reuse": on and bool(cfg.enable_partial_reuse) and not deepseek,
            "copy_on_partial_reuse": on and bool(cfg.copy_on_partial_reuse),
            "changes_pools": False,
            "at_run_time": list(AT_RUN_TIME) if on else []}


def plan_lines(d: dict) -> list[str]:
    if not d["enable_block_reuse"]:
        return ["  block reuse off [--no-block-reuse]: nothing is cached between requests"]
    partial = "on" if d["enable_partial_reuse"] else "off (whole blocks only)"
    return [f"  block reuse on [--no-block-reuse], partial reuse {partial} [--no-partial-reuse]: the pools are sized "
            "the same with reuse off; at run time:"] + [f"    {line}" for line in d["at_run_time"]]
