"""The engine-neutral contract of a KV cache manager under test, and the pool a test asks for."""

from __future__ import annotations

from dataclasses import dataclass

from kvcm import startup
from kvcm.errors import UserCallbackError


REUSE_ORACLES = ("v1", "v2")  # kvcm versions the reuse state machine can compare a target with


class TargetUnavailable(Exception):
    """The engine is not installed (or cannot run here); the message is the install hint."""


@dataclass(frozen=True)
class PoolSpec:
    """What a contract test asks of a target.

    ``num_pages`` is the pool as the engine would be configured with it (vLLM's ``num_gpu_blocks``), reserved
    pages included; ``sliding_window`` adds a sliding-window layer group beside the full-attention one;
    ``max_lookahead`` is the most lookahead a test will ask for (kvcm's ``max_draft_len``); ``reuse`` turns the
    engine's block reuse (prefix caching) on, whole blocks only (the behaviour every target shares);
    ``window_pages`` sizes the sliding-window pool of an engine that keeps one apart from the full pool (SGLang's
    SWA pool; None: the engine's own split), and is ignored by engines whose groups share one pool; ``events``
    turns the engine's KV cache events on (with reuse), ``host_pages`` adds a host tier of that many pages a group
    (engines that have one).
    """

    num_pages: int
    page_size: int = 16
    max_model_len: int = 4096
    sliding_window: int | None = None
    max_lookahead: int = 4
    max_batch_size: int = 4
    reuse: bool = False
    window_pages: int | None = None
    events: bool = False
    host_pages: int = 0


class KVCacheTarget:
    """Base of every adapter: keeps each request's token count; subclasses do the engine calls.

    Required (checked when the session starts, ``adapter_check.py``; every contract test uses them):

    * ``page_size`` (int >= 1), ``total_pages`` (the full-attention pool, reserved pages included),
      ``reserved_pages`` (pages no request gets, vLLM's null block; default 0);
    * ``free_pages() -> int``: pages a new request could still take;
    * ``held_pages(rid) -> {"full": n}`` (plus ``"window": m`` with a sliding-window group);
    * ``_allocate(rid, num_tokens, lookahead) -> bool``, ``_grow(rid, have, num_tokens, lookahead) -> bool``
      (all or nothing: False leaves the request as it was), ``_free(rid)``.

    Optional, each unlocking tests that otherwise skip with the reason:

    * ``available_tokens(bound, batch_size=1, lookahead=0) -> int`` together with
      ``allocate_generation(rids, token_nums, lookahead=0) -> bool`` (TensorRT-LLM's ``get_num_available_tokens``
      and generation dummies): the 14 tests of ``test_target_available_tokens.py`` ("has no available-tokens query"
      when absent);
    * ``allocate_batch(rids, token_nums, lookahead=0) -> bool``: the engine's own all-or-none batch (default:
      one ``allocate`` after another, undone on a refusal);
    * ``releases_window_pages`` (default True; False skips ``test_target_sliding_window.py``), ``window_is_ring``
      and ``window_tokens`` (a ring of pages or a widened window, checked as such);
    * ``supports_reuse = True`` with ``_allocate_prompt(rid, token_ids) -> int | None``, ``lookup(token_ids)``,
      ``cached_pages()`` and ``reset_cache()`` (block reuse, built with reuse on when ``spec.reuse`` is set;
      ``reuse_oracle`` names the kvcm version the state machine compares with, default ``"v2"``): the tests of
      ``test_target_reuse.py`` and ``test_target_reuse_state_machine.py`` ("has no block reuse" when absent);
    * ``startup_accepts(spec, max_num_batched_tokens, async_scheduling=False) -> bool``: the engine's own check
      that a pool serves one ``max_model_len`` request, for ``test_target_startup.py`` ("no start-up check to
      drive" when absent); ``startup_findings = {case: why}`` runs a known difference from kvcm's rule as a
      strict xfail; ``split_window_pool`` when the window has a pool of its own, sized by
      ``PoolSpec.window_pages``;
    * ``supports_events = True`` with ``take_events()`` (the events since the last call, as
      ``pytest_kvcm.targets.events``' ``Stored`` / ``Removed`` / ``Moved`` / ``Cleared``) and ``cached_blocks()``
      (``{(group, block hash): level}`` of every block the engine would match now), built with events on when
      ``spec.events`` is set: ``test_target_events.py`` ("has no KV cache events" when absent);
      ``supports_host_tier = True`` builds ``spec.host_pages`` host pages a group (its tier test skips without);
      ``event_findings = {case: why}`` runs a known inconsistency of the engine's events as a strict xfail;
    * ``allocation_findings = {case: why}``: a known bug of the engine's page accounting, cited; the tests that
      meet it (``xfail_finding``) run as strict xfails, so the run shows it and fails once the engine is fixed
      (``"block_count"``: a request holds more pages than its tokens need, transformers 5.17);
    * ``differences = {key: why}``: a documented difference of design. Each key relaxes only the assertions it
      names (``differs(key, how)`` in the tests; ``require(key, because)`` skips only a test that cannot run at
      all under the key), the refused-allocation checks run whatever is declared, and the run ends with every
      test a declaration relaxed or skipped, by outcome. Keys (``differences.KEYS`` has what each relaxes; an unknown
      key is refused at start-up): ``exact_pool_size``, ``free_pages``, ``page_size``, ``sliding_window``,
      ``last_prompt_block``, ``duplicate_blocks``, ``private_recomputed_block``, ``partial_blocks_cached``,
      ``whole_node_eviction``, ``window_stored_at_release``, ``window_reuse``, ``startup_window``,
      ``startup_window_chunk``, ``reuse``; and notes for the reader that relax nothing: ``units``, ``window``,
      ``lookahead``, ``max_model_len``, ``failed_allocation``, ``shared_pool``. ``python -m pytest_kvcm.contract
      --keys`` prints the table (docs/contract.md shows it).
    """

    name = "target"
    page_size: int
    total_pages: int
    reserved_pages: int = 0
    releases_window_pages = True
    supports_reuse = False       # the adapter implements the reuse methods below
    supports_events = False      # the adapter implements take_events and cached_blocks
    supports_host_tier = False   # PoolSpec.host_pages builds a host tier
    event_findings: dict[str, str] = {}
    allocation_findings: dict[str, str] = {}
    reuse_oracle = "v2"          # the kvcm version whose reuse the state machine compares this target with
    differences: dict[str, str] = {}

    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self.max_model_len = spec.max_model_len
        self.sliding_window = spec.sliding_window
        self._tokens: dict[str, int] = {}

    # ---- what tests call --------------------------------------------------------------------------------------
    def allocate(self, rid: str, num_tokens: int, lookahead: int = 0) -> bool:
        """A new request of ``num_tokens`` tokens (its prompt) plus ``lookahead`` slots; False when it does not
        fit, with nothing allocated."""
        if rid in self._tokens:
            raise ValueError(f"request {rid!r} is already allocated")
        if num_tokens < 1 or lookahead < 0:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1 and lookahead={lookahead} >= 0")
        ok = self._hook("_allocate", rid, num_tokens, lookahead)
        if ok:
            self._tokens[rid] = num_tokens
        return ok

    def allocate_batch(self, rids: list[str], token_nums: list[int], lookahead: int = 0) -> bool:
        """Several new requests at once, all or none (a warmup batch): a refusal or an exception frees the ones
        already made."""
        done = []
        try:
            for rid, n in zip(rids, token_nums):
                if not self.allocate(rid, n, lookahead):
                    break
                done.append(rid)
            else:
                return True
        except BaseException:
            for r in done:
                self.free(r)
            raise
        for r in done:
            self.free(r)
        return False

    def grow(self, rid: str, num_tokens: int = 1, lookahead: int = 0) -> bool:
        """The request's tokens so far are computed; make room for ``num_tokens`` more plus ``lookahead`` slots.
        False when they do not fit, with the request as it was."""
        if num_tokens < 1 or lookahead < 0:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1 and lookahead={lookahead} >= 0")
        ok = self._hook("_grow", rid, self._tokens[rid], num_tokens, lookahead)
        if ok:
            self._tokens[rid] += num_tokens
        return ok

    def free(self, rid: str) -> None:
        self._hook("_free", rid)
        del self._tokens[rid]

    def xfail_finding(self, request, case: str) -> None:
        """Run the calling test as a strict xfail where this target declares ``case`` in ``allocation_findings``:
        a known, cited bug of the engine fails the test as it should, and a release that fixes it fails the run
        until the finding goes (a finding is reported, never relaxed into a pass)."""
        why = self.allocation_findings.get(case)
        if why is not None:
            import pytest

            request.applymarker(pytest.mark.xfail(strict=True, reason=f"{self.name}: {why}"))

    def _hook(self, name: str, *args):
        """Call the adapter's own ``name``: what it raises comes up as a ``UserCallbackError`` naming the adapter and
        the hook (its cause is the original), with this base's books unchanged; a skip or an interrupt passes."""
        try:
            return getattr(self, name)(*args)
        except Exception as exc:
            raise UserCallbackError(f"adapter {type(self).__name__}, {name}",
                                    f"raised {type(exc).__name__}: {exc}") from exc

    # ---- block reuse (optional: adapters with ``supports_reuse``; built with ``PoolSpec(reuse=True)``) -------------
    def allocate_prompt(self, rid: str, token_ids) -> int | None:
        """A new request given its prompt's token ids, computed at once (its blocks become reusable as the engine
        decides): returns the prompt tokens whose KV came from the cache, or None when it does not fit, with
        nothing changed (no reference, no cached block, no free page touched)."""
        if rid in self._tokens:
            raise ValueError(f"request {rid!r} is already allocated")
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("a prompt needs at least one token id")
        reused = self._hook("_allocate_prompt", rid, ids)
        if reused is not None:
            self._tokens[rid] = len(ids)
        return reused

    def require_reuse(self) -> None:
        """Skip the calling test unless this target reuses blocks (and was built with ``PoolSpec(reuse=True)``)."""
        import pytest

        if not self.supports_reuse:
            pytest.skip(f"{self.name} has no block reuse" + (f": {self.differences['reuse']}"
                                                              if "reuse" in self.differences else ""))
        if not self.spec.reuse:
            raise ValueError(f"{self.name}: build it with PoolSpec(reuse=True) to test reuse")

    def lookup(self, token_ids) -> int:
        """Prompt tokens a new request with these ids would reuse now; changes nothing."""
        raise NotImplementedError

    def cached_pages(self) -> int:
        """Pages that hold cached blocks no request holds (counted in ``free_pages``, evicted on demand)."""
        raise NotImplementedError

    def reset_cache(self) -> bool:
        """Drop every cached block; False, with nothing changed, while a request holds pages."""
        raise NotImplementedError

    def _allocate_prompt(self, rid: str, token_ids: list[int]) -> int | None:
        raise NotImplementedError

    # ---- KV cache events (optional: adapters with ``supports_events``; built with ``PoolSpec(events=True)``) -----
    def require_events(self) -> None:
        """Skip the calling test unless this target reports KV cache events (built with ``PoolSpec(events=True)``)."""
        import pytest

        self.require_reuse()
        if not self.supports_events:
            pytest.skip(f"{self.name} has no KV cache events")
        if not self.spec.events:
            raise ValueError(f"{self.name}: build it with PoolSpec(events=True) to test its events")

    def take_events(self) -> list:
        """The engine's events since the last call, oldest first, as ``pytest_kvcm.targets.events`` names them."""
        raise NotImplementedError

    def cached_blocks(self) -> dict:
        """``{(group, block hash): level}`` (0: GPU, 1: host) of every block the engine would match now."""
        raise NotImplementedError

    def tokens(self, rid: str) -> int:
        return self._tokens[rid]

    @property
    def requests(self) -> list[str]:
        return list(self._tokens)

    @property
    def usable_pages(self) -> int:
        return self.total_pages - self.reserved_pages

    def differs(self, what: str, how: str) -> bool:
        """True when this engine declares a difference on ``what``: the calling test then relaxes what ``how``
        says (and only that), and the run's summary lists it."""
        if what not in self.differences:
            return False
        from .differences import record

        record(getattr(self, "_kvcm_node", None), self.name, what, self.differences[what], how)
        return True

    def require(self, what: str, because: str) -> None:
        """Skip the calling test when this engine declares ``what``: only for a test that cannot run at all under
        it (``because`` says why; the key's entry in ``differences.KEYS`` names the test). A single assertion is
        relaxed with ``differs``, never by skipping the test around it."""
        if what in self.differences:
            import pytest

            self.differs(what, f"skipped: {because}")
            pytest.skip(f"{self.name} differs on {what} ({self.differences[what]}): skipped: {because}")

    def free_pages(self) -> int:
        """Pages of the full-attention pool a new request could still take."""
        raise NotImplementedError

    def held_pages(self, rid: str) -> dict[str, int]:
        """Pages the request holds: ``{"full": n}`` plus ``"window": m`` when a sliding-window group exists."""
        raise NotImplementedError

    # ---- what adapters implement ------------------------------------------------------------------------------
    def _allocate(self, rid: str, num_tokens: int, lookahead: int) -> bool:
        raise NotImplementedError

    def _grow(self, rid: str, have: int, num_tokens: int, lookahead: int) -> bool:
        raise NotImplementedError

    def _free(self, rid: str) -> None:
        raise NotImplementedError

    def __repr__(self):
        return (f"{self.name}(page_size={self.page_size}, pages={self.total_pages}, reserved={self.reserved_pages}, "
                f"window={self.sliding_window})")


def pages_for_max_model_len(max_model_len: int, page_size: int, reserved_pages: int) -> int:
    """The smallest pool (in the engine's own count, reserved pages included) that admits one request of
    ``max_model_len`` tokens (vLLM PR #47272: the null block is not a page any request can use): kvcm's start-up
    rule for full attention, ``kvcm.startup.least_pool``."""
    return startup.least_pool(page_size, max_model_len, reserved_pages=reserved_pages)
