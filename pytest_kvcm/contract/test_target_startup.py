"""The start-up level: the engine's own check that its pool can serve one request of ``max_model_len``, with
kvcm's rule (kvcm/startup.py) as the oracle.

An engine decides this once before serving: vLLM's ``check_enough_kv_cache_memory`` sums each
``KVCacheSpec``'s ``max_memory_usage_bytes``; SGLang compares ``max_total_num_tokens`` with the context length.
A check that admits a pool one page short starts an engine that can never schedule its longest request (vLLM
PR #47272: the null block was counted as usable, fixed in 0.29.0); one that refuses a pool that fits wastes
memory. The allocator-level twin of this file is test_target_max_model_len.py.

A target offers ``startup_accepts(spec, max_num_batched_tokens, async_scheduling)``; one without it skips.
Known differences of a target's rule from kvcm's are ``startup_findings`` entries, run as strict xfails.
"""

import pytest

from kvcm import startup
from kvcm.errors import ConfigError
from pytest_kvcm.targets import PoolSpec

SPARE = pytest.mark.parametrize("spare", [0, -1], ids=["exact", "one-page-short"])


def _sized(kvcm_target, window_pages=None):
    """A probe for the page size and reserved pages, and a geometry where no bound is capped by max_model_len."""
    probe = kvcm_target(PoolSpec(num_pages=8))
    if not hasattr(probe, "startup_accepts"):
        pytest.skip(f"{probe.name}: no start-up check to drive")
    probe.require("exact_pool_size", "every assertion is about a pool of exactly kvcm's start-up bound or one page "
                                     "short, which a pool of another size cannot be judged at")
    ps = probe.page_size
    window = None if window_pages is None else window_pages * ps
    return probe, ps, 12 * ps + ps // 2, window


@SPARE
def test_startup_admits_exactly_the_pool_one_request_needs(kvcm_target, spare):
    probe, ps, max_model_len, _ = _sized(kvcm_target)
    least = startup.least_pool(ps, max_model_len, reserved_pages=probe.reserved_pages)
    pages = least + spare
    assert startup.accepts(pages, ps, max_model_len, reserved_pages=probe.reserved_pages) == (spare == 0), (
        f"kvcm's rule on {pages} pages with {probe.reserved_pages} held back, max_model_len={max_model_len}")
    spec = PoolSpec(num_pages=pages, page_size=ps, max_model_len=max_model_len)
    target = kvcm_target(spec)
    verdict = target.startup_accepts(spec, max_num_batched_tokens=ps)
    assert verdict == (spare == 0), (
        f"{target}: max_model_len={max_model_len} needs {least - probe.reserved_pages} pages of {ps} plus "
        f"{probe.reserved_pages} held back; the start-up check {'accepted' if verdict else 'refused'} {pages}"
        + (f" ({getattr(target, 'last_startup_error', '')[:160]})" if not verdict else ""))
    if verdict:
        assert target.allocate("longest", max_model_len), f"{target}: accepted at start-up, refused at allocation"


@SPARE
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_startup_window_bound_matches_kvcm(kvcm_target, spare, async_scheduling, request):
    probe, ps, max_model_len, window = _sized(kvcm_target, window_pages=2)
    probe.require("startup_window", "no window bound to compare")
    chunk = ps
    windows = (None, window)
    least = startup.least_pool(ps, max_model_len, windows=windows, reserved_pages=probe.reserved_pages,
                               max_num_batched_tokens=chunk)
    finding = getattr(probe, "startup_findings", {}).get("async_window_bound") if async_scheduling else None
    if finding and spare == 0:
        request.applymarker(pytest.mark.xfail(strict=True, reason=finding))
    spec = PoolSpec(num_pages=least + spare, page_size=ps, max_model_len=max_model_len, sliding_window=window)
    target = kvcm_target(spec)
    verdict = target.startup_accepts(spec, max_num_batched_tokens=chunk, async_scheduling=async_scheduling)
    assert verdict == (spare == 0), (
        f"{target}: window {window}, chunk {chunk}, max_model_len {max_model_len}: kvcm's rule needs {least} pages "
        f"({startup.request_pages(ps, max_model_len)} full + {startup.request_pages(ps, max_model_len, window, chunk)}"
        f" window + {probe.reserved_pages} held back); the check {'accepted' if verdict else 'refused'} "
        f"{least + spare}")


def test_kvcm_startup_counts_the_held_back_page():
    """kvcm's rule with one page held back the way vLLM's BlockPool holds block 0 (vLLM PR #47272)."""
    ps, max_model_len = 16, 5 * 16 + 3
    least = startup.least_pool(ps, max_model_len, reserved_pages=1)
    assert least == 7
    assert startup.accepts(least, ps, max_model_len, reserved_pages=1)
    assert not startup.accepts(least - 1, ps, max_model_len, reserved_pages=1), (
        "a pool of cdiv(max_model_len, page_size) pages with one held back cannot serve max_model_len")
    with pytest.raises(ConfigError, match=r"num_pages=6 .*must be >= 7"):
        startup.check(least - 1, ps, max_model_len, reserved_pages=1)


SPLIT_CASES = [pytest.param("full", 0, id="full-exact"), pytest.param("full", -1, id="full-one-page-short"),
               pytest.param("window", 0, id="window-exact"), pytest.param("window", -1, id="window-one-page-short"),
               pytest.param("window", -2, id="window-two-pages-short")]


@pytest.mark.parametrize("chunk_pages", [0, 1], ids=["decode", "chunk-of-a-page"])
@pytest.mark.parametrize("pool, spare", SPLIT_CASES)
def test_startup_split_window_pool(kvcm_target, pool, chunk_pages, spare):
    """An engine that keeps the window in a pool of its own (SGLang's SWA pool) is checked pool by pool: the full
    pool against one ``max_model_len`` request, the window pool against kvcm's per-request window bound, the
    other pool ample. An accepted pool then serves the longest request, in chunks, with the window released as it
    slides. A declared ``startup_window_chunk`` difference (the window pool's floor does not grow with the chunk)
    is held to exactly one page below kvcm's bound when chunks are a page long."""
    probe, ps, max_model_len, window = _sized(kvcm_target, window_pages=2)
    if not getattr(probe, "split_window_pool", False):
        pytest.skip(f"{probe.name}: every group draws from one pool (test_startup_window_bound_matches_kvcm)")
    chunk = max(1, chunk_pages * ps)
    full = startup.request_pages(ps, max_model_len) + probe.reserved_pages
    windowed = startup.request_pages(ps, max_model_len, window, chunk)
    slack = 1 if chunk > 1 and probe.differs("startup_window_chunk", "the window pool may be one page below kvcm's "
                                                                    "bound") else 0
    if pool == "full":
        pages, window_pages, want = full + spare, windowed + 4, spare == 0
    else:
        pages, window_pages, want = full + 8, windowed + spare, spare >= -slack
    spec = PoolSpec(num_pages=pages, page_size=ps, max_model_len=max_model_len, sliding_window=window,
                    window_pages=window_pages)
    target = kvcm_target(spec)
    verdict = target.startup_accepts(spec, max_num_batched_tokens=chunk)
    assert verdict == want, (
        f"{target}: window {window}, chunks of {chunk}, max_model_len {max_model_len}: full pool {pages} pages "
        f"(kvcm: {full}), window pool {window_pages} (kvcm: {windowed}, {slack} declared below it); the check "
        f"{'accepted' if verdict else 'refused'}" + (f" ({getattr(target, 'last_startup_error', '')[:160]})"
                                                     if not verdict else ""))
    if verdict:
        assert target.allocate("longest", min(chunk, max_model_len)), f"{target}: accepted, refused its first chunk"
        while target.tokens("longest") < max_model_len:
            step = min(chunk, max_model_len - target.tokens("longest"))
            assert target.grow("longest", step), (
                f"{target}: accepted at start-up, refused at {target.tokens('longest')} + {step} tokens "
                f"(held {target.held_pages('longest')})")
