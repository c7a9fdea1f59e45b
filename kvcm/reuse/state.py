"""What a request given its token ids carries besides its blocks (``_Sequence.reuse``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .stats import ReuseCounters


@dataclass
class ReuseState:
    tokens: list[int]
    scope: tuple                       # (lora_task_id, cache_salt): the root the request matches and stores under
    prompt_len: int
    priority: int
    decode_priority: int
    explicit_priority: bool            # a retention config was given: claimed blocks take its priority
    prepopulated: int = 0
    counters: ReuseCounters = field(default_factory=ReuseCounters)
    started: bool = False              # its first context chunk began (V1 reserves then; V2 pages are LOCKED)
    stored_full: int = 0               # V1: full blocks already offered to the tree
    path: list = field(default_factory=list)   # the tree nodes of its leading blocks, as matched or last stored

    def block_priorities(self, n: int, tpb: int) -> list[int]:
        """The priority each of its first ``n`` blocks was taken with (TensorRT-LLM's ``getFreeBlock`` claims a
        context block at its prompt priority and a decode block at the decode priority)."""
        return [self.priority if i * tpb < self.prompt_len else self.decode_priority for i in range(n)]
