"""Opt-in per-step record of what the engine asked of the cache and what attention was given.

The capacity regressions this project guards against show up as an off-by-one between a request's capacity
and the KV length attention reads; a trace lets a test assert both on a real forward.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..protocols import StepManager


@dataclass(frozen=True)
class TraceRecord:
    step: int
    request_id: object
    phase: str                    # "prefill", "decode" or "dummy"
    history: int                  # the manager's history before the forward
    capacity: int                 # the manager's capacity during the forward
    blocks_per_group: tuple[int, ...]   # blocks held (non-released) in each layer group
    kv_len: int                   # KV length attention read for this request
    num_new_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


class Tracer:
    """Collects records; ``step`` counts forwards (engine steps and dummy forwards alike)."""

    def __init__(self):
        self.records: list[TraceRecord] = []
        self.step = 0

    def record(self, mgr: StepManager, request_id, phase: str, history: int, kv_len: int, num_new_tokens: int) -> None:
        blocks = tuple(sum(1 for b in table if b >= 0) for table in mgr.block_table(request_id))
        self.records.append(TraceRecord(self.step, request_id, phase, history, mgr.get_capacity(request_id),
                                        blocks, kv_len, num_new_tokens))

    def for_request(self, request_id) -> list[TraceRecord]:
        return [r for r in self.records if r.request_id == request_id]
