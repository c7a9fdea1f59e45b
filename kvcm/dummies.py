"""Warmup requests (``add_dummy_requests``): the batches an engine places to size its pools and capture its
CUDA graphs, placed all or nothing.

A dummy call is a request table write like any other, so a half-done one is a leak: pages held by dummies the
engine never learns of shrink the pool it then sizes from (TensorRT-LLM PR #17162's hang). The call is checked
whole before anything is placed, and a refusal or an exception releases every dummy it made. How a dummy grows is
the version's (``_place_dummy``, ``_dummy_blocks`` in ``manager_v1.py`` / ``manager_v2.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import validation
from .errors import ConfigError
from .policy import Decisions, rule, setting


@dataclass(frozen=True)
class DummyRequest:
    """A warmup request made by ``add_dummy_requests``: ``token_num`` is history plus the current input."""

    request_id: object
    token_num: int
    prompt_len: int
    is_gen: bool
    max_num_draft_tokens: int = 0
    capacity: int = 0


class DummiesMixin:
    """``add_dummy_requests`` for a manager (``BaseKVCacheManager``): the request table, pools and policy are
    the manager's."""

    def add_dummy_requests(self, request_ids, token_nums=None, is_gen: bool = False, max_num_draft_tokens: int = 0,
                           kv_reserve_draft_tokens: int | None = None) -> list[DummyRequest] | None:
        """Warmup requests. ``token_nums[i]`` is history plus the current input (default ``1 + drafts``).

        All or nothing: the whole call is checked before anything is allocated (bad values raise ``ConfigError``),
        a lack of pages returns None, and any exception while placing releases every dummy this call made.
        """
        request_ids, token_nums, is_gen, drafts, reserve = self.policy.checked_dummy_call(
            request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens, self.max_seq_len)
        held = [rid for rid in request_ids if rid in self._seqs]
        if held:
            raise ConfigError("request_ids", held[0], "is already held by this manager; nothing was allocated")
        slots = reserve + self.policy.gen_dummy_extra_slots if is_gen else reserve
        if self._would_evict_in_vain(token_nums, is_gen, slots):
            return None
        made, out = [], []
        try:
            for rid, token_num in zip(request_ids, token_nums):
                self._new_seq(rid)
                made.append(rid)
                if not self._place_dummy(rid, token_num, is_gen, slots):
                    self._release_all(released(made, self.policy.dummies_released_when_refused))
                    return None
                prompt_len = token_num - 1 if is_gen else token_num
                out.append(DummyRequest(rid, token_num, prompt_len, is_gen, drafts, self.get_capacity(rid)))
        except BaseException:
            self._release_all(released(made, self.policy.dummies_released_when_raised))
            raise
        return out

    def _place_dummy(self, request_id, token_num: int, is_gen: bool, reserve: int) -> bool:
        raise NotImplementedError

    def _dummy_blocks(self, token_num: int, is_gen: bool, reserve: int) -> list[int]:
        """Blocks per group one dummy holds once placed (what ``_place_dummy`` allocates)."""
        raise NotImplementedError

    def _would_evict_in_vain(self, token_nums, is_gen: bool, reserve: int) -> bool:
        """A batch that cannot fit where cached blocks would be evicted to place its first dummies: refused
        before any is placed, since an eviction is not undone by releasing the dummies (a refused call changes
        nothing, issue 39). Elsewhere the dummies are placed one by one, and a failure releases every one made."""
        if not self.policy.dummy_batch_checked_first or not any(pool.num_reusable for pool in self.pools):
            return False
        needs = [0] * len(self.pools)
        for token_num in token_nums:
            needs = [a + b for a, b in zip(needs, self._dummy_blocks(token_num, is_gen, reserve))]
        return any(need > pool.num_available for need, pool in zip(needs, self.pools))


RELEASED = ("all", "last", "none")   # which of a failed dummy call's dummies it releases: made, made[-1:], []


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class DummyDecisions(Decisions):
    SUBSYSTEM = "dummies (both versions)"

    @rule("a dummy call checked whole before anything is placed: (request_ids, token_nums, is_gen, drafts, "
          "reserve) as lists and counts, or a ConfigError naming the field (kvcm before 4044276 checked each dummy "
          "while placing it: add_dummy_requests('abc') made three dummies)")
    def checked_dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens,
                           max_seq_len: int) -> tuple:
        return validation.dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens,
                                     max_seq_len)

    dummies_released_when_refused = setting(
        "all", "the dummies a call releases when one does not fit: every one it made ('last': only the one that "
        "failed, TensorRT-LLM PR #17162 leaked those before it and estimation hung)", choices=RELEASED)

    dummies_released_when_raised = setting(
        "all", "the dummies a call releases when placing one raises: every one it made ('none': kvcm before "
        "4044276 kept them held, the pool smaller; 'last' as TensorRT-LLM PR #17162)", choices=RELEASED)

    gen_dummy_extra_slots = setting(
        0, "the slots a generation dummy holds beyond token_num + E + the draft reservation: none (TensorRT-LLM PR "
        "#19213: generation dummies one token too large skipped page-boundary shapes)")

    dummy_batch_checked_first = setting(
        True, "whether a warmup batch that cannot fit is refused before its first dummy is placed when placing "
        "would evict cached blocks: an eviction is not undone by releasing the dummies, so placing first left a "
        "refused add_dummy_requests with fewer cached blocks than before (found by the exhaustive explorer, issue "
        "39)")


def released(made: list, which: str) -> list:
    """The dummies of ``made`` that ``which`` (one of ``RELEASED``) names."""
    return made if which == "all" else made[-1:] if which == "last" else []
