"""Loads in flight: host-tier hits copied back to the GPU asynchronously (``KvCacheConfig.async_onboard``,
docs/semantics.md 11.8).

An engine that overlaps its copies with compute does not wait for a hit's blocks to come back from host memory:
vLLM keeps such a request ``WAITING_FOR_REMOTE_KVS`` until its connector reports the blocks received, SGLang's
HiCache polls ``loading_check``. kvcm models one copy per matched host block: ``add_sequence`` claims the host block
and a fresh GPU page for it and leaves the copy in flight; the request is *loading* (``is_loading``) and is refused
a context chunk until ``complete_transfers()`` lands every copy, after which the block is on the GPU in that page,
exactly as a synchronous onboard leaves it. A block being loaded is no other request's hit meanwhile (its host copy
is the loader's; vLLM caches received blocks only once they are in).

A request freed while it loads (an abort) keeps every page until its copies land, and is then released as any
request is (vLLM PR #32255: ``finish_requests`` delays the free of a request still receiving, so a late copy
never writes into a page another request was given). The decisions an abort got wrong in the field are declared
at the end (``TransferDecisions``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import validation
from ..errors import ConfigError
from ..policy import Decisions, setting


@dataclass
class Load:
    """One block's copy from the host tier into GPU page ``page`` of group ``group``, for request ``seq``."""

    seq: object
    group: int
    node: object
    page: int


@dataclass
class Loads:
    """A manager's copies in flight and the requests freed before theirs landed (kept with the reuse cache, so a
    state the exhaustive explorer pickles holds them)."""

    in_flight: list = field(default_factory=list)      # Load, in the order the copies started
    aborted: list = field(default_factory=list)        # (request id, its _Sequence): freed while loading

    def pending(self) -> bool:
        return bool(self.in_flight or self.aborted)

    def held_by_aborted(self) -> list:
        """The sequences of aborted requests that still hold their pages."""
        return [seq for _, seq in self.aborted]


class TransferMixin:
    """The manager's side of loads in flight (``BaseKVCacheManager`` inherits it through ``ReuseMixin``)."""

    def is_loading(self, request_id) -> bool:
        """Whether the request's cached prefix is still on its way from the host tier (it may not begin a context
        chunk until ``complete_transfers`` lands it)."""
        state = self._seq(request_id).reuse
        return state is not None and state.loading > 0

    def complete_transfers(self, max_copies: int | None = None) -> list:
        """Land the copies in flight, oldest first: every one (None), or the first ``max_copies`` (what an
        engine's poll of its transfer stream found done). Each landed block is on the GPU in the page its request
        took for it. A request aborted while loading is released once its last copy has landed. Returns the ids of
        the live requests whose loads this call completed, in the order their copies started."""
        if max_copies is not None:
            validation.count("max_copies", max_copies, 1)
        loads = None if self._reuse is None else self._reuse.loads
        if loads is None or not loads.pending():
            return []
        aborted = {id(seq) for seq in loads.held_by_aborted()}
        n = len(loads.in_flight) if max_copies is None else min(max_copies, len(loads.in_flight))
        landed, loads.in_flight = loads.in_flight[:n], loads.in_flight[n:]
        done, touched = [], set()
        for load in landed:
            touched.add(id(load.seq))
            if id(load.seq) in aborted and not self.policy.aborted_completions_settled:
                continue                    # filtered out as a request no longer known: nobody lands or frees it
            self._reuse.onboard(load.node, load.group, load.page)
            load.seq.reuse.loading -= 1
            if load.seq.reuse.loading == 0 and id(load.seq) not in aborted:
                done.append(load.seq)
        if self.policy.aborted_completions_settled:
            still = []
            for rid, seq in loads.aborted:
                finished = seq.reuse.loading == 0 or (id(seq) in touched
                                                      and not self.policy.aborted_freed_after_last_copy)
                if finished:
                    self._release_with_tokens(seq)
                else:
                    still.append((rid, seq))
            loads.aborted = still
        self._settle()
        by_seq = {id(seq): rid for rid, seq in self._seqs.items()}
        return [by_seq[id(seq)] for seq in done if id(seq) in by_seq]

    def _start_loads(self, seq, loads: list) -> None:
        """Put a new request's copies in flight (``_take`` gave each block a fresh page)."""
        for load in loads:
            load.seq = seq
        seq.reuse.loading = len(loads)
        self._reuse.loads.in_flight.extend(loads)

    def _held_for_loads(self, request_id, seq) -> bool:
        """An abort of a loading request: its pages wait for its copies (True), unless the policy frees them now."""
        if not self.policy.abort_waits_for_transfers:
            return False
        self._reuse.loads.aborted.append((request_id, seq))
        return True

    def _refuse_while_loading(self, request_id, seq) -> None:
        if seq.reuse is not None and seq.reuse.loading and self.policy.chunk_waits_for_load:
            raise ConfigError("request_id", request_id, f"is loading {seq.reuse.loading} cached block(s) from the "
                              "host tier; call complete_transfers() before its first context chunk")

    def _loads_pending(self) -> bool:
        return self._reuse is not None and self._reuse.loads.pending()


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class TransferDecisions(Decisions):
    SUBSYSTEM = "transfers in flight"

    abort_waits_for_transfers = setting(
        True, "whether a request freed while its load is in flight keeps its pages until the load completes (vLLM "
        "PR #32255, quoted in #46283: finish_requests delays freeing a WAITING_FOR_REMOTE_KVS request's blocks until "
        "finished_recving); freed at once, the late copy wrote into pages another request had been given")

    aborted_completions_settled = setting(
        True, "whether the completion of an aborted request's load frees that request's pages (vllm-ascend #16662 / "
        "PR #16663: a whitelist of live requests filtered out the late completion, and FINISHED_ABORTED requests "
        "kept their blocks until the instance stopped admitting)")

    aborted_freed_after_last_copy = setting(
        True, "whether an aborted request whose copies land over several completions is released only once the "
        "last one has landed (vLLM PR #56089, issue #46240: with a receive and a send pending, the first completion "
        "freed the request and the second found it gone); released at the first, the copies still in flight wrote "
        "into freed pages")

    chunk_waits_for_load = setting(
        True, "whether a request whose cached prefix is still being loaded from the host is refused a context chunk "
        "(vLLM keeps it WAITING_FOR_REMOTE_KVS until the load completes; 1CatAI/1Cat-vLLM #598: a restore raced with "
        "the compute that used its blocks and the restored KV read as zeros)")
