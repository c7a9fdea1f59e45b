"""How long a request's blocks should stay cached: TensorRT-LLM's ``KvCacheRetentionConfig`` priorities.

TensorRT-LLM (``executor.h``) keeps a priority in [0, 100] per block, default 35; eviction takes the lowest
priority first. A priority is given per request for its prompt blocks, and optionally another one for the
blocks its decode stores (``decode_retention_priority``, TensorRT-LLM's default is the default priority).
Durations (a priority that reverts to 35 after some time) are not modelled: kvcm has no clock.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..validation import Int, config_dataclass

MIN_RETENTION_PRIORITY = 0
MAX_RETENTION_PRIORITY = 100
DEFAULT_RETENTION_PRIORITY = 35

Priority = Annotated[Int, Field(ge=MIN_RETENTION_PRIORITY, le=MAX_RETENTION_PRIORITY)]


@config_dataclass
class KvCacheRetentionConfig:
    """A request's retention priorities: ``priority`` for its prompt blocks, ``decode_retention_priority`` for
    the blocks it stores while decoding (None: ``DEFAULT_RETENTION_PRIORITY``, as TensorRT-LLM)."""

    priority: Priority = Field(DEFAULT_RETENTION_PRIORITY, description="must be an integer in [0, 100]")
    decode_retention_priority: Priority | None = Field(None, description="must be an integer in [0, 100] or None")

    @property
    def decode_priority(self) -> int:
        p = self.decode_retention_priority
        return DEFAULT_RETENTION_PRIORITY if p is None else p
