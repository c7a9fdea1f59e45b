"""The target and kvcm side by side with reuse on: random prompts that share prefixes, allocated, looked up, freed
and reset on both; every answer (tokens reused, refused or not, free and cached pages) must agree.

The oracle is kvcm with reuse on, whole blocks only, of the version the target's reuse follows
(``reuse_oracle``): V2 for vLLM (both cache a prompt's full blocks with it), V1 for kvcm V1. Prompts are whole
blocks long, which keeps out the documented differences (V1's last prompt block; vLLM never caching a partial
block), and a prompt whose every block is cached already is not allocated (``duplicate_blocks``: the last-token
rule recomputes its last block, which V2 then swaps for the cached page and vLLM keeps as a second copy;
``test_target_reuse.py::test_repeated_block_aligned_prompt`` pins each one's numbers). What is compared is what a
scheduler reads: the hit, the admission, the free and the cached pages. A target that evicts whole radix nodes
(``whole_node_eviction``: SGLang's ``RadixCache``) is compared on the steps that evict nothing or are refused;
``test_target_reuse.py`` pins its eviction.
"""

import pytest

pytest.importorskip("hypothesis", reason="the state machine needs hypothesis: pip install 'hypothesis>=6'")
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from pytest_kvcm.targets import PoolSpec
from pytest_kvcm.targets.kvcm_targets import KvcmV1Target, KvcmV2Target

PS = 16        # the page size asked; prompts are cut at the target's own
POOL = 12
PREFIXES = [[1, 1, 1], [1, 1, 2], [3, 3, 3, 3], [4]]   # families that share blocks: each block's one token id
ORACLES = {"v1": KvcmV1Target, "v2": KvcmV2Target}   # the keys are contract.REUSE_ORACLES, checked at start-up


# A prompt is drawn as three small numbers, not as its token ids: a failing run then prints its steps as
# ``state.allocate_prompt(family=2, keep=1, tail=[5])``, not a screen of single tokens per draw.
PROMPT = {"family": st.integers(0, len(PREFIXES) - 1), "keep": st.integers(0, 4),
          "tail": st.lists(st.sampled_from([5, 6]), min_size=0, max_size=3)}


def _prompt(family: int, keep: int, tail: list[int], ps: int = PS) -> list[int]:
    """The first ``keep`` blocks of prefix ``family`` (as many as it has), then a block per ``tail`` entry, in
    blocks of ``ps`` tokens."""
    blocks = PREFIXES[family][:keep] + list(tail)
    return [t for t in blocks or [7] for _ in range(ps)]


def _blocks(ids: list[int], ps: int = PS) -> str:
    return f"{len(ids) // ps} block(s) {ids[::ps]}"


def _agree(got, want, what: str) -> None:
    """One line naming the step and both answers (no assertion rewriting's token-by-token ``where`` lines)."""
    __tracebackhide__ = True
    if got != want:
        raise AssertionError(f"{what}: target {got!r}, kvcm {want!r}")


def side_by_side_reuse(make_target):
    class SideBySideReuse(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.target = make_target(PoolSpec(num_pages=POOL, page_size=PS, max_model_len=1024, reuse=True))
            self.target.require_reuse()
            self.target.require("free_pages", "every admission and free count is compared with kvcm's one pool")
            oracle, self.ps = ORACLES[self.target.reuse_oracle], self.target.page_size
            self.oracle = oracle(PoolSpec(num_pages=self.target.usable_pages, page_size=self.ps,
                                          max_model_len=64 * self.ps, reuse=True))
            self.count = 0

        def _state(self, side):
            return f"free pages {side.free_pages()}, cached {side.cached_pages()}, requests {sorted(side.requests)}"

        @rule(**PROMPT)
        def allocate_prompt(self, family, keep, tail):
            self.count += 1
            ids, rid = _prompt(family, keep, tail, self.ps), f"r{self.count}"
            assume(self.oracle.lookup(ids + [0]) == self.oracle.lookup(ids))   # not every block cached already
            if self.target.differs("whole_node_eviction", "only steps that evict nothing or are refused"):
                # no step that evicts: a radix tree (SGLang) evicts whole nodes where kvcm evicts block by block
                fresh = -(-len(ids) // self.ps) - self.oracle.lookup(ids) // self.ps
                free, cached = self.oracle.free_pages(), self.oracle.cached_pages()
                assume(fresh <= free - cached or fresh > free)
            got, want = self.target.allocate_prompt(rid, ids), self.oracle.allocate_prompt(rid, ids)
            _agree(got, want, f"allocate_prompt {rid}, {_blocks(ids, self.ps)} (None: refused; target {self._state(self.target)}; "
                              f"kvcm {self.target.reuse_oracle} {self._state(self.oracle)})")

        @rule(**PROMPT)
        def lookup(self, family, keep, tail):
            ids = _prompt(family, keep, tail, self.ps)
            _agree(self.target.lookup(ids), self.oracle.lookup(ids), f"lookup of {_blocks(ids, self.ps)}")

        @precondition(lambda self: self.oracle.requests)
        @rule(pick=st.integers(0, 15))
        def free(self, pick):
            # an index, not a data() draw: a failure then prints ``state.free(pick=3)``, not a ``Draw`` line a step
            rid = self.oracle.requests[pick % len(self.oracle.requests)]
            self.target.free(rid)
            self.oracle.free(rid)

        @rule()
        def reset(self):
            _agree(self.target.reset_cache(), self.oracle.reset_cache(), "reset_cache")

        @invariant()
        def same_pages(self):
            _agree(self.target.free_pages(), self.oracle.free_pages(),
                   f"free pages (target {self._state(self.target)}; kvcm {self._state(self.oracle)})")
            _agree(self.target.cached_pages(), self.oracle.cached_pages(),
                   f"cached pages (target {self._state(self.target)}; kvcm {self._state(self.oracle)})")
            _agree(sorted(self.target.requests), sorted(self.oracle.requests), "requests")

    return SideBySideReuse


def test_target_reuses_what_kvcm_reuses(kvcm_target):
    machine = side_by_side_reuse(kvcm_target)
    machine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
