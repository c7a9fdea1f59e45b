"""The event-consistency contract: a KV-aware router (NVIDIA Dynamo's indexer, llm-d) that replays a worker's KV
cache events into its own index must hold, whenever it has read them, exactly the blocks the worker would match:
per group and per cache level (GPU or host). A removal not sent routes requests to a worker that recomputes the
prefix; a store not sent hides a hit; a removal sent for a block still cached elsewhere, or out of order with the
stores around it, does either.

Each target reports its engine's own events (``take_events``: kvcm's TensorRT-LLM events, vLLM's ``BlockPool``
events, SGLang's ``RadixCache`` events) and its own cached blocks (``cached_blocks``); the router's index is
``pytest_kvcm.targets.events.RouterIndex``. The index is checked after every call (``test_events_follow_...``), and
with several calls between reads, as an engine publishes once a step (``test_events_read_once_a_step`` and the
state machine). A target without events skips ("has no KV cache events").
"""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis", reason="the state machine needs hypothesis: pip install 'pytest-kvcm[test]'")
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from pytest_kvcm.targets import PoolSpec
from pytest_kvcm.targets.events import RouterIndex

PS = 16


def _spec(num_pages: int, **kw) -> PoolSpec:
    return PoolSpec(num_pages=num_pages, page_size=PS, max_model_len=1024, reuse=True, events=True, **kw)


class Router:
    """The router's index of one target; ``check`` reads the events since the last read and compares."""

    def __init__(self, target):
        self.target, self.index = target, RouterIndex()
        self.check("start")

    def check(self, what: str) -> None:
        __tracebackhide__ = True
        events = self.target.take_events()
        problems = self.index.apply(events).differences(self.target.cached_blocks())
        if problems:
            raise AssertionError(f"{self.target.name}: after {what}, the router's index disagrees with the cache "
                                 f"({len(events)} events read): {problems[:6]}")


def _blocks(*families, ps: int = PS) -> list[int]:
    """A whole-block prompt: one block of ``ps`` tokens ``f`` for each ``f``."""
    return [f for f in families for _ in range(ps)]


def _page_blocks(target):
    """``_blocks`` at the target's own page size: DeepSeek-V4's pages hold 128 or 256 tokens, and a block of 16
    would be an eighth of one, so its prompts would store nearly nothing for the router to follow."""
    return lambda *families: _blocks(*families, ps=target.page_size)


def test_events_follow_the_cache_through_reuse_eviction_and_reset(kvcm_target):
    """Read after every call: prompts that share blocks, a hit, evictions under pressure, frees and a reset."""
    target = kvcm_target(_spec(9))
    target.require_events()
    blocks = _page_blocks(target)
    router = Router(target)
    steps = [("allocate", "a", blocks(1, 1, 1)), ("free", "a"),
             ("allocate", "b", blocks(1, 1, 2)), ("allocate", "c", blocks(3, 3, 3, 3)), ("free", "b"),
             ("allocate", "d", blocks(4, 4, 4)), ("free", "c"), ("free", "d"),
             ("allocate", "e", blocks(5, 5, 5, 5, 5, 5, 5)), ("free", "e"),
             ("allocate", "f", blocks(1, 1, 2, 6)), ("free", "f"), ("reset",), ("allocate", "g", blocks(1, 1))]
    for step in steps:
        if step[0] == "allocate":
            assert target.allocate_prompt(step[1], step[2]) is not None, step
        elif step[0] == "free":
            target.free(step[1])
        else:
            assert target.reset_cache()
        router.check(" ".join(map(str, step[:2])))
        if step[:2] == ("allocate", "a"):
            assert router.index.blocks, f"{target.name}: a 3-block prompt cached nothing the router heard of"


def test_events_read_once_a_step(kvcm_target):
    """Several calls between reads, as an engine publishes once a step: a block evicted by one call, blocks stored
    by the next and evicted by a third must reach the router in that order (TensorRT-LLM PR #11883 fixed removals
    batched past later stores)."""
    target = kvcm_target(_spec(4))
    target.require_events()
    blocks = _page_blocks(target)
    router = Router(target)
    target.allocate_prompt("a", blocks(1, 1))
    target.free("a")
    router.check("a cached")
    for rid, prompt in (("b", blocks(2, 2, 2)), ("c", blocks(3, 3, 3))):   # b evicts a's, c evicts b's
        assert target.allocate_prompt(rid, prompt) is not None
        target.free(rid)
    router.check("two prompts that evict, read once")


def test_removing_one_copy_keeps_the_block(kvcm_target, request):
    """A block-aligned prompt computed twice at once: its last block is recomputed by the second request. Once
    both are freed and one page of it is evicted, the router must still hold every block the engine matches."""
    target = kvcm_target(_spec(7))
    target.require_events()
    blocks = _page_blocks(target)
    if "duplicate_copy" in target.event_findings:
        request.applymarker(pytest.mark.xfail(strict=True, reason=target.event_findings["duplicate_copy"]))
    router = Router(target)
    prompt = blocks(8, 8)
    assert target.allocate_prompt("a", prompt) is not None
    assert target.allocate_prompt("b", prompt) is not None
    target.free("a")
    target.free("b")
    router.check("the same prompt twice, freed")
    cached = target.cached_pages()
    fill = target.free_pages() - cached + 1          # every free page and one cached one
    assert target.allocate_prompt("c", blocks(*[9] * fill)) is not None
    if not target.differs("free_pages", "whether the fill evicted is not counted (a sliding pool's stale pages join "
                                        "the cache as the prompt grows); the router is checked as always"):
        assert target.cached_pages() < cached, f"{target}: a prompt of {fill} pages evicted none of {cached} cached"
    router.check("an allocation that evicts one cached page")


def test_host_tier_moves_reach_the_router(kvcm_target):
    """With a host tier (kvcm's V1 secondary pool, V2's host level): evicted blocks fall to the host as level moves,
    a hit brings them back; the router's index follows each tier."""
    target = kvcm_target(_spec(4, host_pages=2))
    target.require_events()
    blocks = _page_blocks(target)
    if not target.supports_host_tier:
        pytest.skip(f"{target.name} has no host tier behind the contract")
    router = Router(target)
    for rid, prompt in (("a", blocks(1, 1, 1)), ("b", blocks(2, 2, 2)), ("c", blocks(1, 1, 1, 3))):
        assert target.allocate_prompt(rid, prompt) is not None
        router.check(f"allocate {rid}")
        target.free(rid)
        router.check(f"free {rid}")
    assert any(level == 1 for level in router.index.blocks.values()), "nothing reached the host tier"


# ---- the state machine: random prompts sharing prefixes, reads at random steps -------------------------------------
PREFIXES = [(1, 1, 1), (1, 1, 2), (3, 3, 3, 3), (4,)]     # block families: prompts that share whole blocks
PROMPT = {"family": st.integers(0, len(PREFIXES) - 1), "keep": st.integers(0, 4),
          "tail": st.lists(st.sampled_from([5, 6]), min_size=0, max_size=3)}


def _prompt(family: int, keep: int, tail: list[int], ps: int) -> list[int]:
    return _blocks(*PREFIXES[family][:keep], *tail, ps=ps) or _blocks(7, ps=ps)


def events_machine(make_target, spec: PoolSpec):
    class RouterFollowsTheCache(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.target = make_target(spec)
            self.target.require_events()
            self.router = Router(self.target)
            self.live, self.count = [], 0

        @rule(**PROMPT, read=st.booleans())
        def allocate_prompt(self, family, keep, tail, read):
            ids = _prompt(family, keep, tail, self.target.page_size)
            if self.target.differs("duplicate_blocks", "no prompt whose every block is cached already"):
                assume(self.target.lookup(ids + [0]) == self.target.lookup(ids))
            self.count += 1
            if self.target.allocate_prompt(f"r{self.count}", ids) is not None:
                self.live.append(f"r{self.count}")
            if read:
                self.router.check(f"allocate_prompt r{self.count} ({len(ids) // self.target.page_size} blocks)")

        @precondition(lambda self: self.live)
        @rule(pick=st.integers(0, 15), read=st.booleans())
        def free(self, pick, read):
            rid = self.live.pop(pick % len(self.live))
            self.target.free(rid)
            if read:
                self.router.check(f"free {rid}")

        @rule()
        def reset(self):
            self.target.reset_cache()
            self.router.check("reset")

        @rule()
        def read(self):
            self.router.check("a read")

        def teardown(self):
            self.router.check("the last step")

    return RouterFollowsTheCache


@pytest.mark.parametrize("host_pages", [0, 2], ids=["gpu", "host"])
def test_router_index_follows_the_cache(kvcm_target, host_pages):
    spec = _spec(10, host_pages=host_pages)
    if host_pages:
        probe = kvcm_target(_spec(4))
        probe.require_events()
        if not probe.supports_host_tier:
            pytest.skip(f"{probe.name} has no host tier behind the contract")
    machine = events_machine(kvcm_target, spec)
    machine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)
