"""Random request life cycles on small pools (hypothesis stateful), checked against hand-written block rules.

Pools of 12 blocks run out often, so the out-of-pages paths (which must change nothing) get as much exercise
as the happy ones. The expected capacity and history of every request are tracked here from docs/semantics.md
3 / 4.1, and the block table of every group is checked against the stale-window formula written out again below,
independently of ``kvcm.layer_groups``. V1, V2 and DeepSeek-V4 (its full, window W + D and window 8 + D
groups, 128-token blocks) run the same rules; so do warmup dummies, and malformed calls that must raise
``ConfigError`` / ``UnknownRequestError`` and leave everything as it was.

Example counts are hypothesis profiles: ``kvcm-ci`` (300 a version and kind, the default run) and
``kvcm-nightly`` (2,000, the tests marked slow).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import kvcm
from kvcm import versions
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

TPB, WINDOW, SINKS, E, MAX_DRAFT, BLOCKS = 4, 10, 3, 1, 2, 12
V4_TPB = 128  # DeepSeek-V4 takes 128 or 256; its token counts are scaled by V4_TPB // TPB
MAX_SEQ_LEN = 64  # in units of TPB-token pages: x32 for DeepSeek-V4
# one layer of 1 head x 8 dims, bf16: 2 x 8 x 2 x 4 tokens = 128 bytes a block a layer
settings.register_profile("kvcm-ci", max_examples=100, stateful_step_count=30, derandomize=True, deadline=None,
                          database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("kvcm-nightly", settings.get_profile("kvcm-ci"), max_examples=2000)
PROFILES = {"ci": settings.get_profile("kvcm-ci"), "nightly": settings.get_profile("kvcm-nightly")}


def _ceil(a, b):
    return -(-a // b)


def expected_stale(window, sinks, history, tpb=TPB):
    """Logical blocks [lo, hi) released at this history (docs/semantics.md 4.1), written out again on purpose."""
    if window is None:
        return range(0)
    lo = min(_ceil(history, tpb), _ceil(sinks, tpb))
    hi = max(lo, (history + 1 - window) // tpb)
    return range(lo, hi)


V4_SPEC = kvcm.DeepseekV4Spec(compress_ratios=(4, 128), window_size=256, head_dim=64, index_head_dim=32,
                              max_position_embeddings=4096)


def make_v4_manager():
    """Groups full, window 258 and window 10, 12 blocks each: the pool ratio is each group's bytes a block."""
    def build(cfg):
        return kvcm.create_kv_cache_manager("v2", V4_SPEC, cfg, max_batch_size=8, max_seq_len=MAX_SEQ_LEN * V4_TPB // TPB,
                                            max_draft_len=MAX_DRAFT, num_extra_kv_tokens=E, device="meta")

    probe = build(KvCacheConfig(tokens_per_block=V4_TPB, max_gpu_total_bytes=1 << 30))
    per_block = [g.bytes_per_block for g in probe.layer_groups]
    mgr = build(KvCacheConfig(tokens_per_block=V4_TPB, max_gpu_total_bytes=BLOCKS * sum(per_block) + min(per_block) // 2,
                              pool_ratio=tuple(per_block)))
    assert sorted(g.window or 0 for g in mgr.layer_groups) == [0, 8 + MAX_DRAFT, 256 + MAX_DRAFT]
    assert [g.num_blocks for g in mgr.layer_groups] == [BLOCKS] * 3
    return mgr


def make_manager(version: str, kind: str):
    if kind == "v4":
        return make_v4_manager()
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
    mgr = kvcm.create_kv_cache_manager(version, spec, cfg, max_batch_size=8, max_seq_len=MAX_SEQ_LEN, max_draft_len=MAX_DRAFT,
                                       num_extra_kv_tokens=E, device="meta")
    assert [g.num_blocks for g in mgr.layer_groups] == [BLOCKS] * len(mgr.layer_groups)
    return mgr


def snapshot(mgr):
    return ({r: (mgr.get_capacity(r), mgr.get_history(r), mgr.block_table(r)) for r in mgr.request_ids},
            [p.num_free for p in mgr.pools])


def machine(version: str, kind: str):
    version = make_manager(version, kind).kvcm_version  # "auto" resolves to the model's version (V1 here)
    tpb = V4_TPB if kind == "v4" else TPB
    scale = tpb // TPB  # token counts grow with the page so that pools run out as often
    max_seq_len = MAX_SEQ_LEN * scale

    class Lifecycle(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.mgr = make_manager(version, kind)
            self.expect: dict[int, tuple[int, int]] = {}  # rid -> (capacity, history)
            self.step: dict[int, tuple[int, int, int]] = {}  # rid in a generation step -> (d, capacity, history)
            self.next_id = 0
            self.failures = 0
            self.malformed = 0

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

        @rule(n=st.integers(1, 20 * scale))
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
                reserve = max(d, MAX_DRAFT) if versions.get(version).cls.reserves_max_draft_len else d
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
                new_cap = data.draw(st.integers(hist, hist + 24 * scale))
                new_hist = data.draw(st.integers(hist, new_cap))
                if self._fails_cleanly(before, lambda: self.mgr.resize(rid, new_cap, new_hist)):
                    self.expect[rid] = (new_cap, new_hist)
            elif data.draw(st.booleans()):
                n = data.draw(st.integers(0, 12 * scale))
                if self._fails_cleanly(before, lambda: self.mgr.add_tokens(rid, n)):
                    self.expect[rid] = (cap + n, hist)
            else:
                n = data.draw(st.integers(0, cap - hist))
                self.mgr.rewind(rid, n)
                self.expect[rid] = (cap - n, hist)

        @rule(data=st.data(), k=st.integers(1, 3), is_gen=st.booleans())
        def dummies(self, data, k, is_gen):
            """Warmup dummies (TensorRT-LLM's add_dummy_requests): all of them or, out of pages, none."""
            ids = list(range(self.next_id, self.next_id + k))
            self.next_id += k
            tokens = [data.draw(st.integers(1, max_seq_len)) for _ in ids]
            before = snapshot(self.mgr)
            out = self.mgr.add_dummy_requests(ids, token_nums=tokens, is_gen=is_gen, max_num_draft_tokens=MAX_DRAFT)
            if out is None:
                self.failures += 1
                assert snapshot(self.mgr) == before, "a failed dummy call changed the manager"
                return
            for rid, t in zip(ids, tokens):  # generation dummies reserve the draft slots and have t - 1 computed
                self.expect[rid] = (t + E + MAX_DRAFT, t - 1) if is_gen else (t + E, 0)

        @rule(data=st.data())
        def malformed(self, data):
            """A bad call raises ConfigError (or UnknownRequestError) and changes nothing at all."""
            mgr, new = self.mgr, ("new", self.next_id)
            held = sorted(self.expect)
            rid = data.draw(st.sampled_from(held)) if held else None
            calls = [
                lambda: mgr.begin_generation(("nobody",)),
                lambda: mgr.free_resources(("nobody",)),
                lambda: mgr.add_dummy_requests([new], token_nums=[max_seq_len + 1]),
                lambda: mgr.add_dummy_requests([new, ("new2",)], token_nums=[1, "2"]),
                lambda: mgr.add_dummy_requests("ab"),
                lambda: mgr.add_dummy_requests([new], is_gen=True, kv_reserve_draft_tokens=-1),
                lambda: mgr.begin_context_chunk(new, 0, 2.0, 2),
                lambda: mgr.get_num_available_tokens(token_num_upper_bound=8, batch_size=0),
            ]
            if rid is not None:
                cap, hist = self.expect[rid]
                calls += [
                    lambda: mgr.add_dummy_requests([new, rid]),
                    lambda: mgr.begin_generation(rid, num_draft=-1),
                    lambda: mgr.end_generation(rid, num_tokens=hist + 1, num_draft=1, num_accepted=2),
                ]
                if hist > 0:  # history never moves back
                    calls.append((lambda: mgr.resize(rid, cap, hist - 1)) if version == "v2"
                                 else (lambda: mgr.end_context_chunk(rid, hist - 1)))
                if version == "v1":
                    calls.append(lambda: mgr.rewind(rid, cap - hist + 1))
            call = data.draw(st.sampled_from(calls))
            before = snapshot(mgr)
            with pytest.raises((kvcm.ConfigError, kvcm.UnknownRequestError)):
                call()
            assert snapshot(mgr) == before, "a malformed call changed the manager"
            self.malformed += 1

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
                    assert len(table) == _ceil(cap, tpb)
                    stale = range(0) if version == "v1" else expected_stale(g.window, g.sink_tokens, hist, tpb)
                    # released exactly the stale blocks: the sinks and the window of the in-flight token stay
                    assert [i for i, b in enumerate(table) if b < 0] == list(stale), (rid, cap, hist, g.window)

        @invariant()
        def pools(self):
            for gi, (g, pool) in enumerate(zip(self.mgr.layer_groups, self.mgr.pools)):
                held = [b for rid in self.expect for b in self.mgr.block_table(rid)[gi] if b >= 0]
                assert len(held) == len(set(held)), "a block is held twice"
                assert all(0 <= b < g.num_blocks for b in held)
                assert pool.num_free + len(held) == g.num_blocks == BLOCKS
            full = [p.num_free for g, p in zip(self.mgr.layer_groups, self.mgr.pools) if g.window is None]
            assert self.mgr.get_num_free_blocks() == min(full)

        def teardown(self):
            for rid in list(self.expect):
                self.mgr.free_resources(rid)
            assert [p.num_free for p in self.mgr.pools] == [BLOCKS] * len(self.mgr.pools)
            Lifecycle.total_failures += self.failures
            Lifecycle.total_malformed += self.malformed
            Lifecycle.examples += 1
            if Lifecycle.bar is not None and Lifecycle.examples <= Lifecycle.bar_total:
                Lifecycle.bar.update(1)  # hypothesis runs a few examples past max_examples: the bar stops at it

    Lifecycle.total_failures = Lifecycle.total_malformed = Lifecycle.examples = 0
    Lifecycle.bar, Lifecycle.bar_total = None, 0
    return Lifecycle


def _run(version: str, kind: str, profile: str, progress=None):
    """``progress``: the kvcm_progress fixture, for the nightly profile's minute-long runs (a step an example)."""
    cls = machine(version, kind)
    if progress is not None:
        cls.bar_total = PROFILES[profile].max_examples
        cls.bar = progress(total=cls.bar_total, desc=f"state machine {version} {kind}", unit="example")
    run_state_machine_as_test(cls, settings=PROFILES[profile])
    assert cls.examples >= PROFILES[profile].max_examples
    assert cls.total_failures > 0  # the pools really ran out along the way: the failure path was exercised
    assert cls.total_malformed > 0  # and malformed calls were made and refused


@pytest.mark.parametrize("kind", ["full", "swa"])
def test_request_lifecycle_state_machine(kvcm_version, kind):
    _run(kvcm_version, kind, "ci")


def test_deepseek_v4_lifecycle_state_machine():
    _run("v2", "v4", "ci")


@pytest.mark.slow
@pytest.mark.parametrize("version, kind", [("v1", "full"), ("v1", "swa"), ("v2", "full"), ("v2", "swa"),
                                           ("v2", "v4")])
def test_request_lifecycle_state_machine_nightly(version, kind, kvcm_progress):
    _run(version, kind, "nightly", kvcm_progress)
