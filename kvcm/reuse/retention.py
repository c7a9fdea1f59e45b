"""How long a request's blocks should stay cached: TensorRT-LLM's ``KvCacheRetentionConfig`` priorities.

TensorRT-LLM (``executor.h``, ``kvCacheRetentionConfig.cpp``) keeps a priority in [0, 100] per block, default
35; eviction takes the lowest priority first. A request gives token ranges (``TokenRangeRetentionConfig(start,
end, priority, duration_ms)``): a context block takes the range holding its first token (none: a fresh block gets
35, a matched one keeps its own); its decode blocks take ``decode_retention_priority`` and ``decode_duration_ms``.
A duration makes a block fall back to 35 once it has waited that long unheld (``refreshBlocks``: the timer starts
when the block is released, and only for a priority other than 35). kvcm's shorthand ``priority=`` is one range
over the whole prompt.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..errors import ConfigError
from ..validation import Int, config_dataclass
from ..policy import Decisions, resolve, setting

MIN_RETENTION_PRIORITY = 0
MAX_RETENTION_PRIORITY = 100
DEFAULT_RETENTION_PRIORITY = 35
MAX_DURATION_MS = 1 << 40
"""The longest duration accepted (about 35 years): anything longer never expires in practice."""

Priority = Annotated[Int, Field(ge=MIN_RETENTION_PRIORITY, le=MAX_RETENTION_PRIORITY)]
Duration = Annotated[Int, Field(ge=1, le=MAX_DURATION_MS)]
TokenIndex = Annotated[Int, Field(ge=0)]


@config_dataclass
class TokenRangeRetentionConfig:
    """Tokens ``[token_start, token_end)`` (``None``: to the end of the prompt) keep ``priority`` for
    ``duration_ms`` once released (``None``: until evicted)."""

    token_start: TokenIndex = Field(description="must be an integer >= 0")
    token_end: TokenIndex | None = Field(None, description="must be an integer > token_start or None")
    priority: Priority = Field(DEFAULT_RETENTION_PRIORITY, description="must be an integer in [0, 100]")
    duration_ms: Duration | None = Field(None, description="must be an integer in [1, 2**40] or None")

    def __post_init__(self):
        if self.token_end is not None and self.token_end <= self.token_start:
            raise ConfigError("token_end", self.token_end, f"must be > token_start ({self.token_start}): a range "
                              "must have a positive length")


@config_dataclass
class KvCacheRetentionConfig:
    """A request's retention: ``token_range_retention_configs`` for its prompt blocks (or kvcm's ``priority``,
    one range over the whole prompt), ``decode_retention_priority`` / ``decode_duration_ms`` for the blocks it
    stores while decoding (None: ``DEFAULT_RETENTION_PRIORITY``, as TensorRT-LLM)."""

    priority: Priority = Field(DEFAULT_RETENTION_PRIORITY, description="must be an integer in [0, 100]")
    decode_retention_priority: Priority | None = Field(None, description="must be an integer in [0, 100] or None")
    token_range_retention_configs: tuple[TokenRangeRetentionConfig, ...] = Field(
        (), description="must be a tuple of kvcm.TokenRangeRetentionConfig")
    decode_duration_ms: Duration | None = Field(None, description="must be an integer in [1, 2**40] or None")

    def __post_init__(self):
        ranges = sorted(self.token_range_retention_configs, key=lambda r: r.token_start)
        if ranges and self.priority != DEFAULT_RETENTION_PRIORITY:
            raise ConfigError("priority", self.priority, "must be left at 35 when token_range_retention_configs "
                              "are given (priority= is the shorthand for one range over the whole prompt)")
        for i, r in enumerate(ranges[:-1]):
            if r.token_end is None:
                raise ConfigError(f"token_range_retention_configs[{i}].token_end", None, "may be None only in the "
                                  "last range (TensorRT-LLM: invalid use of end indicator)")
            if r.token_end > ranges[i + 1].token_start:
                raise ConfigError(f"token_range_retention_configs[{i}].token_end", r.token_end,
                                  f"must be <= the next range's token_start ({ranges[i + 1].token_start}): "
                                  "ranges must not overlap")
        object.__setattr__(self, "token_range_retention_configs", tuple(ranges))

    @property
    def decode_priority(self) -> int:
        p = self.decode_retention_priority
        return DEFAULT_RETENTION_PRIORITY if p is None else p

    def per_block(self, tokens_per_block: int, seq_len: int, policy=None) -> list[tuple[int | None, int | None]]:
        """(priority, duration_ms) of each context block of a ``seq_len``-token prompt (TensorRT-LLM
        ``getPerBlockRetentionPriorityDuration``): the range holding the block's first token, else (None, None).
        ``policy``: the manager's (None: the active one; its ``retention_by_first_token``)."""
        starts = range(0, seq_len, tokens_per_block)
        ranges = self.token_range_retention_configs
        if not ranges:
            p = None if self.priority == DEFAULT_RETENTION_PRIORITY else self.priority
            return [(p, None) for _ in starts]
        by_first = resolve(policy).retention_by_first_token
        out = []
        for start in starts:
            first = start if by_first else start + tokens_per_block - 1
            hit = next((r for r in ranges if r.token_start <= first and (r.token_end is None or first < r.token_end)),
                       None)
            out.append((None, None) if hit is None else (hit.priority, hit.duration_ms))
        return out


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class RetentionDecisions(Decisions):
    SUBSYSTEM = "retention priorities"

    retention_by_first_token = setting(
        True, "whether the token range a context block takes its retention from is its first token's "
        "(KvCacheRetentionConfig getPerBlockRetentionPriorityDuration walks block starts); by its last token a "
        "block straddling two ranges took the later one")
