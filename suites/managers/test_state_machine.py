"""Random request life cycles on small pools (hypothesis stateful), checked against hand-written block rules.

Pools of 12 blocks of 4 tokens run out often, so the out-of-pages paths (which must change nothing) get as much
exercise as the happy ones. The expected capacity and history of every request are tracked here from
SEMANTICS 3 / 4.1, and the block table of every group is checked against the stale-window formula written
out again below, independently of ``kvcm.layer_groups``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

TPB, WINDOW, SINKS, E, MAX_DRAFT, BLOCKS = 4, 10, 3, 1, 2, 12
# one layer of 1 head x 8 dims, bf16: 2 x 8 x 2 x 4 tokens = 128 bytes a block a layer
SETTINGS = settings(max_examples=60, stateful_step_count=30, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _ceil(a, b):
    return -(-a // b)


def expected_stale(window, sinks, history):
    """Logical blocks [lo, hi) released at this history (SEMANTICS 4.1), written out again on purpose."""
    if window is None:
        return range(0)
    lo = min(_ceil(history, TPB), _ceil(sinks, TPB))
    hi = max(lo, (history + 1 - window) // TPB)
    return range(lo, hi)


def make_manager(version: str, kind: str):
    full = LayerSpec(1, 8, "bfloat16", model_layer=0)
    if kind == "full":
        spec = ModelSpec((full,), name="full")
        cfg = KvCacheConfig(tokens_per_block=TPB, max_tokens=BLOCKS * TPB)
    else:
        spec = ModelSpec((full, LayerSpec(1, 8, "bfloat16", WINDOW, sink_tokens=SINKS, model_layer=1)), name="swa")
        if version == "v1":
            cfg = KvCacheConfig(tokens_per_block=TPB, max_tokens=BLOCKS * TPB)  # V1: 12 blocks in every pool
        else:
            cfg = KvCacheConfig(tokens_per_block=TPB, max_gpu_total_bytes=2 * BLOCKS * 128, pool_ratio=(1, 1))
    mgr = kvcm.create_kv_cache_manager(version, spec, cfg, max_batch_size=8, max_seq_len=64, max_draft_len=MAX_DRAFT,
                                       num_extra_kv_tokens=E, device="meta")
    assert [g.num_blocks for g in mgr.layer_groups] == [BLOCKS] * len(mgr.layer_groups)
    return mgr


def snapshot(mgr):
    return ({r: (mgr.get_capacity(r), mgr.get_history(r), mgr.block_table(r)) for r in mgr.request_ids},
            [p.num_free for p in mgr.pools])


def machine(version: str, kind: str):
    version = make_manager(version, kind).version  # "auto" resolves to the model's version (V1 here)

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.mgr = make_manager(version, kind)
            self.expect: dict[int, tuple[int, int]] = {}  # rid -> (capacity, history)
            self.step: dict[int, tuple[int, int, int]] = {}  # rid in a generation step -> (d, capacity, history)
            self.next_id = 0
            self.failures = 0

        def _idle(self):
            return sorted(r for r in self.expect if r not in self.step)

        def _fails_cleanly(self, before, call):
            try:
                ok = call()
            except kvcm.OutOfPagesError:
                ok = False
            if ok is False:
                self.failures += 1
                assert snapshot(self.mgr) == before, "a failed operation changed the manager"
            return ok is not False

        @rule(n=st.integers(1, 20))
        def add(self, n):
            rid, before = self.next_id, snapshot(self.mgr)
            self.next_id += 1

            def call():
                self.mgr.begin_context_chunk(rid, 0, n, n)
                self.mgr.end_context_chunk(rid, n)

            if self._fails_cleanly(before, call):
                self.expect[rid] = (n + E, n)  # prompt + E slots (V1 and V2 alike without drafts)
            else:
                assert not self.mgr.has_request(rid)

        @precondition(lambda self: self._idle())
        @rule(data=st.data(), d=st.integers(0, 3))
        def grow(self, data, d):
            rid = data.draw(st.sampled_from(self._idle()))
            cap, hist = self.expect[rid]
            before = snapshot(self.mgr)
            if self._fails_cleanly(before, lambda: self.mgr.begin_generation(rid, num_draft=d)):
                reserve = max(d, MAX_DRAFT) if version == "v1" else d  # V1 always reserves max_draft_len
                self.expect[rid] = (cap + 1 + reserve, hist)
                self.step[rid] = (d, cap, hist)

        @precondition(lambda self: self.step)
        @rule(data=st.data())
        def rewind(self, data):
            rid = data.draw(st.sampled_from(sorted(self.step)))
            d, cap, hist = self.step.pop(rid)
            a = data.draw(st.integers(0, d))
            self.mgr.end_generation(rid, num_tokens=hist + 1 + a + 1, num_draft=d, num_accepted=a)
            self.expect[rid] = (cap + 1 + a, hist + 1 + a)  # the rejected drafts' slots are rewound

        @precondition(lambda self: self._idle())
        @rule(data=st.data())
        def resize(self, data):
            rid = data.draw(st.sampled_from(self._idle()))
            cap, hist = self.expect[rid]
            before = snapshot(self.mgr)
            if version == "v2":
                new_cap = data.draw(st.integers(hist, hist + 24))
                new_hist = data.draw(st.integers(hist, new_cap))
                if self._fails_cleanly(before, lambda: self.mgr.resize(rid, new_cap, new_hist)):
                    self.expect[rid] = (new_cap, new_hist)
            elif data.draw(st.booleans()):
                n = data.draw(st.integers(0, 12))
                if self._fails_cleanly(before, lambda: self.mgr.add_tokens(rid, n)):
                    self.expect[rid] = (cap + n, hist)
            else:
                n = data.draw(st.integers(0, cap - hist))
                self.mgr.rewind(rid, n)
                self.expect[rid] = (cap - n, hist)

        @precondition(lambda self: self.expect)
        @rule(data=st.data())
        def free(self, data):
            rid = data.draw(st.sampled_from(sorted(self.expect)))
            self.mgr.free_resources(rid)
            del self.expect[rid]
            self.step.pop(rid, None)

        @invariant()
        def capacity_and_history(self):
            assert sorted(self.mgr.request_ids) == sorted(self.expect)
            for rid, (cap, hist) in self.expect.items():
                assert (self.mgr.get_capacity(rid), self.mgr.get_history(rid)) == (cap, hist)
                assert hist <= cap

        @invariant()
        def block_tables(self):
            for rid, (cap, hist) in self.expect.items():
                for g, table in zip(self.mgr.layer_groups, self.mgr.block_table(rid)):
                    assert len(table) == _ceil(cap, TPB)
                    stale = range(0) if version == "v1" else expected_stale(g.window, g.sink_tokens, hist)
                    # released exactly the stale blocks: the sinks and the window of the in-flight token stay
                    assert [i for i, b in enumerate(table) if b < 0] == list(stale), (rid, cap, hist, g.window)

        @invariant()
        def pools(self):
            for gi, (g, pool) in enumerate(zip(self.mgr.layer_groups, self.mgr.pools)):
                held = [b for rid in self.expect for b in self.mgr.block_table(rid)[gi] if b >= 0]
                assert len(held) == len(set(held)), "a block is held twice"
                assert all(0 <= b < g.num_blocks for b in held)
                assert pool.num_free + len(held) == g.num_blocks == BLOCKS
            assert self.mgr.get_num_free_blocks() == self.mgr.pools[0].num_free  # group 0 is the full group

        def teardown(self):
            for rid in list(self.expect):
                self.mgr.free_resources(rid)
            assert [p.num_free for p in self.mgr.pools] == [BLOCKS] * len(self.mgr.pools)
            Lifecycle.total_failures += self.failures

    Lifecycle.total_failures = 0
    return Lifecycle


@pytest.mark.parametrize("kind", ["full", "swa"])
def test_request_lifecycle_state_machine(kvcm_version, kind):
    cls = machine(kvcm_version, kind)
    run_state_machine_as_test(cls, settings=SETTINGS)
    assert cls.total_failures > 0  # the pools really ran out along the way: the failure path was exercised
