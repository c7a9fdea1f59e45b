"""What a request given its token ids carries besides its blocks (``_Sequence.reuse``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .stats import ReuseCounters


@dataclass
class ReuseState:
    tokens: list[int]
    scope: tuple                       # (lora_task_id, cache_salt): the root the request matches and stores under
    prompt_len: int
    priority: int                      # kept for callers: the first context block's priority
    decode_priority: int
    explicit_priority: bool            # a retention config was given: claimed blocks take its priority
    context_retention: list = field(default_factory=list)   # per context block: (priority | None, duration_ms | None)
    decode_duration_ms: int | None = None
    onboarded: list = field(default_factory=list)   # per group: matched blocks brought back from the host tier
    kept_retention: dict = field(default_factory=dict)   # block index -> (priority, duration) a taken-over block kept
    prepopulated: int = 0
    counters: ReuseCounters = field(default_factory=ReuseCounters)
    started: bool = False              # its first context chunk began (V1 reserves then; V2 pages are LOCKED)
    stored_full: int = 0               # V1: full blocks already offered to the tree
    path: list = field(default_factory=list)   # the tree nodes of its leading blocks, as matched or last stored
    loading: int = 0                   # its blocks still being copied back from the host tier (async_onboard)

    def block_retention(self, i: int, tpb: int) -> tuple[int, int | None]:
        """(priority, duration_ms) block ``i`` is taken or stored with (TensorRT-LLM's ``getFreeBlock`` claims a
        context block at its range's priority, 35 where no range holds its first token, and a decode block at the
        decode priority and duration)."""
        if i in self.kept_retention:
            return self.kept_retention[i]
        if i * tpb >= self.prompt_len:
            return self.decode_priority, self.decode_duration_ms
        if i < len(self.context_retention):
            p, d = self.context_retention[i]
            return (35 if p is None else p), d
        return self.priority, None

    def block_priorities(self, n: int, tpb: int) -> list[tuple[int, int | None]]:
        """``block_retention`` of its first ``n`` blocks: what a private page goes back to the queue with."""
        return [self.block_retention(i, tpb) for i in range(n)]
