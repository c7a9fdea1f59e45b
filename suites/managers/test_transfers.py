"""Loads in flight (``KvCacheConfig.async_onboard``, docs/semantics.md 11.8): a hit whose blocks are on the host tier
leaves its request loading until ``complete_transfers()``; a loading request is refused a context chunk; a block
being loaded is no other request's hit; a request freed while its copies are in flight (an abort) keeps the pages
they write until they land, and then frees everything. On V1's secondary pool and V2's host level, with the
lower-tier-only mode so that every hit comes from the host."""

from __future__ import annotations

import pytest
import torch

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import ConfigError

from _observe import all_free_after_reset, check_books
from test_lower_tier import BLOCK_BYTES, PROMPT, SPEC, TPB, run

VERSIONS = pytest.mark.parametrize("version", ["v1", "v2"])


def build(version, blocks=8, device="meta"):
    config = KvCacheConfig(tokens_per_block=TPB, max_tokens=blocks * TPB, dtype="float32", lower_tier_only=True,
                           async_onboard=True, host_cache_size=8 * BLOCK_BYTES)
    return kvcm.create_kv_cache_manager(version, SPEC, config, max_batch_size=8, max_seq_len=256, device=device)


def _loading(version, device="meta"):
    """PROMPT computed and freed (its blocks now on the host), then admitted again: three copies in flight."""
    mgr = build(version, device=device)
    run(mgr, "a", PROMPT)
    mgr.free_resources("a")
    assert mgr.add_sequence("b", PROMPT) == 3 * TPB
    assert mgr.is_loading("b")
    return mgr


@VERSIONS
def test_a_loading_request_is_refused_a_chunk(version):
    """Its first chunk would read pages the copies have not written: a ConfigError naming the request, nothing
    changed; once complete_transfers() names it, the chunk runs."""
    mgr = _loading(version)
    with pytest.raises(ConfigError, match="request_id.*'b'.*loading 3 cached block"):
        mgr.begin_context_chunk("b", 3 * TPB, 1, len(PROMPT))
    assert mgr.get_capacity("b") == 3 * TPB and mgr.is_loading("b")
    assert mgr.complete_transfers() == ["b"]
    assert not mgr.is_loading("b")
    mgr.begin_context_chunk("b", 3 * TPB, 1, len(PROMPT))
    check_books(mgr)


@VERSIONS
def test_a_block_being_loaded_is_nobody_elses_hit(version):
    """A second request of the same prompt while the first one's copies are in flight computes its own: the
    blocks become the loader's when they land (vLLM caches received blocks only then)."""
    mgr = _loading(version)
    assert mgr.add_sequence("c", PROMPT) == 0
    assert mgr.complete_transfers() == ["b"]
    assert mgr.add_sequence("d", PROMPT) == 3 * TPB
    check_books(mgr)


@VERSIONS
def test_the_kv_lands_when_the_copy_completes(version):
    """Device pages: the copy writes the host bytes into the loading request's pages at completion."""
    mgr = build(version, device="cpu")
    run(mgr, "a", PROMPT)
    storage = mgr.pools[0].storage
    for i, page in enumerate(mgr.block_table("a")[0][:3]):
        storage[page].fill_(20 + i)
    mgr.free_resources("a")
    mgr.add_sequence("b", PROMPT)
    mgr.complete_transfers()
    for i, page in enumerate(mgr.block_table("b")[0][:3]):
        assert torch.all(storage[page] == 20 + i), f"block {i} holds other bytes after its copy landed"


@VERSIONS
def test_an_abort_in_flight_keeps_the_pages_the_copy_writes(version):
    """b is freed while its three copies are in flight: the pages they write stay out of the free list (no other
    request can be given one) until complete_transfers(), and are freed then (vLLM PR #32255)."""
    mgr = _loading(version)
    writing = set(mgr.block_table("b")[0][:3])
    mgr.free_resources("b")
    assert not mgr.has_request("b")
    free = mgr.get_block_counts(0).free + mgr.get_block_counts(0).reusable
    mgr.begin_context_chunk("plain", 0, free * TPB, free * TPB)
    given = set(mgr.block_table("plain")[0])
    assert not given & writing, f"pages {sorted(given & writing)} were given out while copies wrote into them"
    check_books(mgr)
    mgr.free_resources("plain")
    assert mgr.reset_prefix_cache() is False, "a reset with copies in flight"
    mgr.complete_transfers()
    check_books(mgr)


@VERSIONS
def test_an_aborted_load_frees_everything_once_it_lands(version):
    """After the copies of an aborted request land, its pages are free or cached and the cache resets to empty
    (vllm-ascend #16662: a filtered completion left them held for good)."""
    mgr = _loading(version)
    mgr.free_resources("b")
    assert mgr.complete_transfers() == []
    check_books(mgr)
    counts = mgr.get_block_counts(0)
    assert counts.in_use == 0, f"an aborted request still holds {counts.in_use} pages after its copies landed"
    all_free_after_reset(mgr)


@VERSIONS
def test_an_aborted_request_keeps_its_pages_until_its_last_copy_lands(version):
    """A poll that lands one of an aborted request's three copies releases nothing: the two still in flight write
    pages the request keeps; the last one landing frees it all (vLLM PR #56089: the first of two completions freed
    the request)."""
    mgr = _loading(version)
    writing = mgr.block_table("b")[0][:3]
    mgr.free_resources("b")
    assert mgr.complete_transfers(1) == []
    check_books(mgr)
    freed = [page for page in writing[1:] if not mgr.pools[0].is_used(page)]
    assert not freed, f"pages {freed} are free while copies in flight write into them"
    mgr.complete_transfers()
    all_free_after_reset(mgr)


@VERSIONS
def test_a_poll_of_some_copies_lands_the_oldest_first(version):
    mgr = _loading(version)
    assert mgr.complete_transfers(2) == [] and mgr.is_loading("b")
    assert mgr.complete_transfers(5) == ["b"] and not mgr.is_loading("b")
    with pytest.raises(ConfigError, match="max_copies.*0"):
        mgr.complete_transfers(0)
    assert mgr.complete_transfers() == []
    check_books(mgr)
