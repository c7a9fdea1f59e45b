"""Block reuse in the engine: an admitted request starts its prefill where the manager's cached prefix ends.

At admission the scheduler makes the request with its token ids (``add_sequence``), which claims the cached
blocks of its longest cached prefix and returns the prepopulated prompt length ``p`` (TensorRT-LLM's
``prepopulatedPromptLen``, vLLM's ``num_computed_tokens`` after ``get_computed_blocks``). The prefill then
computes tokens ``p ..`` only; attention reads positions ``< p`` through the block table, as it reads an
earlier chunk of a chunked prefill. ``p`` is always below the prompt length (the policy's ``lookup_length``), so the
last prompt token is computed and its logits sampled.

When a request leaves (finished or preempted) the scheduler tells the manager the tokens it generated
(``append_tokens``, once), so V1 stores the blocks of the generated text too (TensorRT-LLM's release stores
every block) and a preempted request finds its own blocks when it is readmitted. V2 commits prompt blocks only.

A request whose known tokens still hold a placeholder (an overlapped step's token not read yet, possible only
when it is readmitted in the step after a preemption) is admitted without reuse: its tokens must be real to
match or store.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..policy import Decisions, resolve, setting
from ..protocols import ReuseManager, StepManager


@dataclass
class ReuseStats:
    """One ``generate``'s reuse figures, over every admission (a request readmitted after a preemption counts
    again): prompt tokens to prefill, of them found cached, and prefill tokens actually computed; blocks
    matched and missed (the manager's per-request stats, TensorRT-LLM's ``reusedBlocks`` / ``missedBlocks``)."""
    admissions: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    computed_tokens: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        total = self.reused_blocks + self.missed_blocks
        return self.reused_blocks / total if total else 0.0

    def __str__(self) -> str:
        return (f"reuse: {self.reused_tokens}/{self.prompt_tokens} prompt tokens cached "
                f"({self.token_hit_rate:.1%}), {self.reused_blocks}/{self.reused_blocks + self.missed_blocks} "
                f"blocks ({self.block_hit_rate:.1%}), {self.computed_tokens} prefill tokens computed over "
                f"{self.admissions} admissions")


def can_reuse(mgr: StepManager) -> bool:
    """Whether ``mgr`` reuses blocks: it has the reuse API and its config turned reuse on."""
    return bool(getattr(mgr, "enable_block_reuse", False)) and hasattr(mgr, "add_sequence")


def real_tokens(tokens: list[int]) -> bool:
    return not tokens or min(tokens) >= 0


def admit(mgr: ReuseManager, request_id, tokens: list[int], policy=None) -> int | None:
    """Make ``request_id`` with its tokens on ``mgr`` and return where its prefill starts (the engine policy's
    ``prefill_after_hit``; None: the active policy); None (nothing made) when its tokens are not all known yet.
    ``OutOfPagesError`` (a partial copy found no page) changes nothing."""
    if not real_tokens(tokens):
        return None
    p = mgr.add_sequence(request_id, tokens)
    where = resolve(policy).prefill_after_hit
    if not p or where == "cached_length":
        return p
    return min(p + 1, len(tokens) - 1) if where == "one_past" else len(tokens) - 1


def append_generated(mgr: ReuseManager, request_id, tokens: list[int], admitted: int) -> None:
    """Before a request made with its tokens is freed: tell the manager the real tokens after the ``admitted``
    ones it was made with (the first placeholder and what follows are not known yet)."""
    if not mgr.has_request(request_id):
        return
    new = tokens[admitted:]
    for i, t in enumerate(new):
        if t < 0:
            new = new[:i]
            break
    if new:
        mgr.append_tokens(request_id, new)


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class EngineReuseDecisions(Decisions):
    SUBSYSTEM = "engine: reuse hand-over"

    prefill_after_hit = setting(
        "cached_length", "where the prefill of a request admitted with a cached prefix starts: at the prepopulated "
        "prompt length the manager returned ('one_past': a token later, never past the last; 'last_token': at the "
        "prompt's last token whatever was cached). vLLM #5543 / #7845 and TensorRT-LLM #8813 / #15503: an engine "
        "whose computed-token count disagreed with the cached blocks skipped or misplaced prompt tokens and greedy "
        "outputs changed on repeat", choices=("cached_length", "one_past", "last_token"))
