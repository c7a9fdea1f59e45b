"""Cost of the two calls an engine makes every step, on a pool of 1M blocks and on one of 1K blocks.

Not part of the regression suites (``benchmarks/`` is outside ``testpaths``). Run:

    python -m pytest benchmarks/test_manager_ops.py --kvcm-version=both -q -s

Both pools are half held by a filler request, so the free lists are realistic. ``get_num_available_tokens`` is
asked for S = 131072 tokens: the 1M pool has room (answered at once), the 1K pool does not (a binary search over
at most ceil(S / tpb) blocks): its cost is bounded by S, not by the pool. The generation step crosses a block
boundary every time (capacity 1023 -> 1026 -> 1024), so it allocates and releases one block a call.
"""

from __future__ import annotations

import statistics
import time

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import ModelSpec

pytestmark = pytest.mark.slow

TPB, S = 32, 131072
SIZES = {"1M": 1 << 20, "1K": 1 << 10}


def make(kvcm_version: str, num_blocks: int):
    mgr = kvcm.create_kv_cache_manager(kvcm_version, ModelSpec.uniform(2, 1, 16),
                                       KvCacheConfig(max_tokens=num_blocks * TPB), max_batch_size=256, max_seq_len=S,
                                       device="meta")
    assert mgr.get_num_free_blocks() == num_blocks
    mgr.begin_context_chunk("filler", 0, num_blocks // 2 * TPB, num_blocks // 2 * TPB)
    return mgr


def reset(mgr):
    if mgr.has_request("r"):
        mgr.free_resources("r")
    mgr.begin_context_chunk("r", 0, 1023, 1023)
    mgr.end_context_chunk("r", 1023)


def step(mgr):
    mgr.begin_generation("r", num_draft=2)  # 1023 + 1 + 2 = 1026: a 33rd block
    mgr.end_generation("r", num_tokens=1025, num_draft=2, num_accepted=0)  # back to 1024: 32 blocks


def available(mgr):
    return mgr.get_num_available_tokens(token_num_upper_bound=S, batch_size=8, max_num_draft_tokens=2)


@pytest.fixture(scope="module")
def managers():
    return {}


def _mgr(managers, kvcm_version, size):
    key = (kvcm_version, size)
    if key not in managers:
        managers[key] = make(kvcm_version, SIZES[size])
    return managers[key]


@pytest.mark.parametrize("size", list(SIZES))
def test_get_num_available_tokens(benchmark, managers, kvcm_version, size):
    mgr = _mgr(managers, kvcm_version, size)
    reset(mgr)
    result = benchmark(available, mgr)
    assert result > 0
    benchmark.extra_info.update(kvcm_version=kvcm_version, pool_blocks=SIZES[size])


@pytest.mark.parametrize("size", list(SIZES))
def test_generation_resize(benchmark, managers, kvcm_version, size):
    mgr = _mgr(managers, kvcm_version, size)
    benchmark.pedantic(step, args=(mgr,), setup=lambda: reset(mgr), rounds=3000, iterations=1, warmup_rounds=50)
    assert mgr.get_capacity("r") == 1024
    benchmark.extra_info.update(kvcm_version=kvcm_version, pool_blocks=SIZES[size])


def _per_call(fn, mgr, calls=2000, repeats=7, prepare=None):
    times = []
    for _ in range(repeats):
        total = 0.0
        for _ in range(calls):
            if prepare:
                prepare(mgr)
            t0 = time.perf_counter()
            fn(mgr)
            total += time.perf_counter() - t0
        times.append(total / calls)
    return statistics.median(times)


def test_cost_independent_of_pool_size(managers, kvcm_version, capsys):
    ratios = {}
    for name, fn, prepare in (("get_num_available_tokens", available, None), ("generation resize", step, reset)):
        big = _per_call(fn, _mgr(managers, kvcm_version, "1M"), prepare=prepare)
        small = _per_call(fn, _mgr(managers, kvcm_version, "1K"), prepare=prepare)
        ratios[name] = big / small
        with capsys.disabled():
            print(f"\n[{kvcm_version}] {name}: 1M blocks {big * 1e6:.2f} us, 1K blocks {small * 1e6:.2f} us, "
                  f"ratio 1M/1K = {big / small:.2f}")
    assert all(r < 3.0 for r in ratios.values()), ratios
