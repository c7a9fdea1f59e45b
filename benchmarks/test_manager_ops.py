"""Cost of the two calls an engine makes every step, on a pool of 1M blocks and on one of 1K blocks.

Not part of the regression suites (``benchmarks/`` is outside ``testpaths``). Run:

    python -m pytest benchmarks/test_manager_ops.py --kvcm-version=both -q -s

Both pools are half held by a filler request, so the free lists are realistic. ``get_num_available_tokens`` is
asked for S = 131072 tokens: the 1M pool has room (answered at once), the 1K pool does not (a binary search over
at most ceil(S / tpb) blocks): its cost is bounded by S, not by the pool. The generation step crosses a block
boundary every time (capacity 1023 -> 1026 -> 1024), so it allocates and releases one block a call.

Block reuse (docs/semantics.md 11): ``test_reuse_off_costs_nothing`` times the same calls on this tree with reuse
off and on (requests without token ids) and on main before reuse existed (``PRE_REUSE``, extracted with ``git
archive``), back to back in one run, and the reuse check itself; ``test_match_scales_with_prompt_not_pool`` times
a full-hit match on a 1K and a 1M block pool (the 1M one with 256K other blocks cached) at three prompt lengths,
and ``test_fixed_prompt_match_on_10k_100k_1m_pools`` one 2048-token prompt on pools of 10K, 100K and 1M blocks.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import timeit
from pathlib import Path

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


# ---- block reuse --------------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
PRE_REUSE = "a876cff"      # main just before block reuse landed (the commit after it added kvcm/reuse)


def _pre_reuse_tree(tmp: Path) -> Path | None:
    """kvcm as it was before reuse, extracted from git; None where the history is not there."""
    archive = tmp / "pre.tar"
    with open(archive, "wb") as f:
        done = subprocess.run(["git", "-C", str(ROOT), "archive", PRE_REUSE, "kvcm"], stdout=f, stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        return None
    with tarfile.open(archive) as tar:
        tar.extractall(tmp / "pre", filter="data")
    return tmp / "pre"


def _peer(root: Path, version: str, reuse: str) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "_ops_peer.py"), str(root), version, reuse],
                         capture_output=True, text=True, check=True, cwd=root, env={**os.environ, "PYTHONPATH": ""})
    return json.loads(out.stdout)


def test_reuse_off_costs_nothing(kvcm_version, capsys):
    """Reuse off (and reuse on for requests without token ids) against main before reuse: the same calls, each
    peer run 3 times in turn, the fastest of each kept (the machine is shared, so the minimum is the honest one),
    and the function calls each makes, counted (at most 8 more than before reuse: no loop, no scan was added).
    The check reuse added to these paths (``seq.reuse is None or self._reuse is None``) is timed on its own."""
    with tempfile.TemporaryDirectory() as tmp:
        pre = _pre_reuse_tree(Path(tmp))
        peers = {"reuse off": (ROOT, "off"), "reuse on, no token ids": (ROOT, "on")}
        if pre is not None:
            peers["main before reuse"] = (pre, "absent")
        best: dict = {}
        calls: dict = {}
        for _ in range(3):
            for name, (root, reuse) in peers.items():
                got = _peer(root, kvcm_version, reuse)
                for op, t in got["seconds"].items():
                    best[(name, op)] = min(best.get((name, op), t), t)
                    calls[(name, op)] = got["calls"][op]
    seq = type("Seq", (), {"reuse": None})()
    mgr = type("Mgr", (), {"_reuse": None})()
    check = min(timeit.repeat("seq.reuse is None or mgr._reuse is None", number=100000, repeat=5,
                              globals={"seq": seq, "mgr": mgr})) / 100000
    ops = sorted({op for _, op in best})
    with capsys.disabled():
        print(f"\n[{kvcm_version}] reuse check alone: {check * 1e9:.0f} ns a call")
        for op in ops:
            row = ", ".join(f"{name} {best[(name, op)] * 1e6:.2f} us ({calls[(name, op)]:.0f} calls)"
                            for name in peers)
            print(f"[{kvcm_version}] {op}: {row}")
    for op in ops:
        off = best[("reuse off", op)]
        base_calls = calls.get(("main before reuse", op), calls[("reuse off", op)])
        # the gate: the calls a path makes (timings on a shared machine swing by 2x; the figures are printed). At
        # most a few more than main before reuse: V2's generation resize makes 6 more, 4 of them the reuse-aware free
        # count (pool.num_available) and 2 the peak-usage record added since (LLM.page_usage)
        assert calls[("reuse off", op)] <= base_calls + 8, (op, calls[("reuse off", op)], base_calls)
        if op != "get_num_available_tokens":             # the paths the check was added to
            assert check < 0.02 * off                    # under 2% of the call


def _cached_manager(version: str, num_blocks: int, others: int):
    """A pool of ``num_blocks`` with ``others`` distinct 64-block prompts cached (run and freed)."""
    mgr = kvcm.create_kv_cache_manager(version, ModelSpec.uniform(2, 1, 16), KvCacheConfig(max_tokens=num_blocks * TPB),
                                       max_batch_size=256, max_seq_len=S, device="meta")
    for k in range(others):
        tokens = list(range((k + 1) * 10**6, (k + 1) * 10**6 + 64 * TPB))
        mgr.add_sequence(("o", k), tokens)
        mgr.begin_context_chunk(("o", k), 0, len(tokens), len(tokens))
        mgr.end_context_chunk(("o", k), len(tokens))
        mgr.free_resources(("o", k))
    return mgr


def test_match_scales_with_prompt_not_pool(kvcm_version, capsys):
    """A prompt cached in full, matched again: ``count_reusable_blocks`` (the walk alone) and ``add_sequence`` +
    ``free_resources`` (walk, claim, release), at 256, 2048 and 8192 tokens, on a 1K block pool and on a 1M one
    holding 4096 other cached prompts (262,144 blocks). Cost per prompt length must not grow with the pool."""
    lengths = (256, 2048, 8192)
    pools = {"1K": _cached_manager(kvcm_version, 1 << 10, 0), "1M": _cached_manager(kvcm_version, 1 << 20, 4096)}
    times = {}
    for size, mgr in pools.items():
        for n in lengths:
            walk, whole, _ = _time_full_hit(mgr, n)
            times[(size, n)] = (walk, whole)
            mgr.reset_prefix_cache() if size == "1K" else None
    with capsys.disabled():
        print(f"\n[{kvcm_version}] full-hit match, 1K-block pool vs 1M-block pool (262,144 other blocks cached):")
        for n in lengths:
            (w1, h1), (w2, h2) = times[("1K", n)], times[("1M", n)]
            print(f"[{kvcm_version}]   {n:5d} tokens: walk {w1 * 1e6:8.1f} / {w2 * 1e6:8.1f} us "
                  f"({w2 / w1:.2f}x), add_sequence+free {h1 * 1e6:8.1f} / {h2 * 1e6:8.1f} us ({h2 / h1:.2f}x)")
    for n in lengths:
        assert times[("1M", n)][0] < 3 * times[("1K", n)][0] and times[("1M", n)][1] < 3 * times[("1K", n)][1]
    # proportional to the prompt: 32x the tokens costs far more than 32 / 4 = 8x, far less than 32 * 4 = 128x
    assert 4 < times[("1M", 8192)][0] / times[("1M", 256)][0] < 128


def test_fixed_prompt_match_on_10k_100k_1m_pools(kvcm_version, capsys):
    """One prompt (2048 tokens, 64 blocks) cached in full and matched again on pools of 10K, 100K and 1M blocks,
    each with a quarter of its blocks cached by other prompts: the walk (``count_reusable_blocks``) and the whole
    hit (``add_sequence`` + ``free_resources``) must cost the same on every pool (a match follows the prompt's
    blocks down the tree; nothing in it scans the pool or the cache)."""
    n, sizes = 2048, {"10K": 10_000, "100K": 100_000, "1M": 1 << 20}
    times = {}
    for size, blocks in sizes.items():
        mgr = _cached_manager(kvcm_version, blocks, blocks // 4 // 64)
        walk, whole, hit = _time_full_hit(mgr, n)
        times[size] = (walk, whole, mgr.get_block_counts().reusable, _count_calls(hit))
        del mgr
    with capsys.disabled():
        print(f"\n[{kvcm_version}] full-hit match of one {n}-token prompt, a quarter of each pool cached:")
        for size, (walk, whole, cached, calls) in times.items():
            print(f"[{kvcm_version}]   {size:>4} blocks ({cached:,} cached): walk {walk * 1e6:7.1f} us, "
                  f"add_sequence+free {whole * 1e6:7.1f} us ({calls:,} function calls)")
    calls = [t[3] for t in times.values()]
    assert max(calls) - min(calls) <= 8, calls      # 100x the pool, the same work (timings: printed, noisy here)


def _time_full_hit(mgr, n: int):
    """Cache one ``n``-token prompt, then time matching it again: the walk alone (``count_reusable_blocks``) and
    the whole hit (``add_sequence`` + ``free_resources``), best of 7 rounds of 20; returns both and the hit."""
    prompt = list(range(7, 7 + n))
    mgr.add_sequence("warm", prompt)
    mgr.begin_context_chunk("warm", 0, n, n)
    mgr.end_context_chunk("warm", n)
    mgr.free_resources("warm")

    def hit():
        assert mgr.add_sequence("hit", prompt) == n - 1
        mgr.free_resources("hit")

    walk = min(timeit.repeat(lambda: mgr.count_reusable_blocks(prompt, only_allocated=False), number=20, repeat=7))
    return walk / 20, min(timeit.repeat(hit, number=20, repeat=7)) / 20, hit


def _count_calls(fn) -> int:
    """Python and C function calls one ``fn()`` makes: a cost no other process on the machine can change."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    fn()
    sys.setprofile(None)
    return count - 1
