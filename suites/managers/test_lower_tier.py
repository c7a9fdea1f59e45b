"""The lower-tier-only mode (``KvCacheConfig.lower_tier_only``, docs/semantics.md 11.8): every cached block that
nobody holds leaves the GPU for the host tier at the end of the call that let it go, so every hit is brought back
from host memory and the onboard paths run on every reuse (the test mode SGLang PR #26977 proposed for HiCache).
On V1's secondary pool and V2's host level; the KV bytes survive the round trip; a bad setting is one
``ConfigError`` and builds nothing."""

from __future__ import annotations

import pytest
import torch

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import ConfigError
from kvcm.model_spec import LayerSpec, ModelSpec

from _observe import check_books

TPB = 4
SPEC = ModelSpec((LayerSpec(1, 64, "float32", None, model_layer=0),), name="one-layer")
BLOCK_BYTES = TPB * 2 * 64 * 4


def build(version, blocks=8, host=8, device="meta", **cfg):
    config = KvCacheConfig(tokens_per_block=TPB, max_tokens=blocks * TPB, dtype="float32",
                           **{"host_cache_size": host * BLOCK_BYTES, "lower_tier_only": True, **cfg})
    return kvcm.create_kv_cache_manager(version, SPEC, config, max_batch_size=8, max_seq_len=256, device=device)


def run(mgr, rid, tokens) -> int:
    n = mgr.add_sequence(rid, tokens)
    mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
    mgr.end_context_chunk(rid, len(tokens))
    return n


PROMPT = list(range(3 * TPB + 1))             # three whole blocks looked up


def test_v1_released_blocks_leave_the_gpu():
    """V1: a freed request's cached blocks wait in the secondary pool, none on the GPU, and the same prompt gets
    all three back from there (counted as reused host blocks and onboards)."""
    mgr = build("v1")
    run(mgr, "a", PROMPT)
    mgr.free_resources("a")
    assert mgr.get_block_counts(0).reusable == 0, "cached blocks stayed on the GPU"
    assert mgr.get_host_block_counts(0).reusable == 3
    check_books(mgr)
    assert mgr.add_sequence("b", PROMPT) == 3 * TPB
    stats = mgr.get_kv_cache_stats()
    assert (stats.reused_host_blocks, stats.onboarded_blocks) == (3, 3)
    check_books(mgr)


def test_v2_every_hit_comes_back_from_the_host():
    """V2: the freed blocks fall to the host level at once (not when an allocation needs their pages), and every
    block of the next hit is migrated back from it."""
    mgr = build("v2")
    run(mgr, "a", PROMPT)
    mgr.free_resources("a")
    assert (mgr.get_block_counts(0).reusable, mgr.get_host_block_counts(0).reusable) == (0, 4), \
        "the freed blocks did not all reach the host level"
    assert mgr.add_sequence("b", PROMPT) == 3 * TPB
    assert mgr.get_kv_cache_stats().reused_host_blocks == 3
    check_books(mgr)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_kv_of_a_hit_is_the_kv_the_prompt_wrote(version):
    """Bytes written on the GPU pool (the CPU pool here) come back byte for byte through the host tier (TRT #8813:
    another prompt's tokens came back from an unsynchronized copy)."""
    mgr = build(version, device="cpu")
    run(mgr, "a", PROMPT)
    pages = mgr.block_table("a")[0][:3]
    storage = mgr.pools[0].storage
    written = [torch.full((BLOCK_BYTES,), 10 + i, dtype=torch.uint8) for i in range(3)]
    for page, data in zip(pages, written):
        storage[page].copy_(data)
    mgr.free_resources("a")
    assert mgr.add_sequence("b", PROMPT) == 3 * TPB
    for i, page in enumerate(mgr.block_table("b")[0][:3]):
        assert torch.equal(storage[page], written[i]), f"block {i} came back with other bytes"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_mode_holds_after_a_window_moves(version):
    """Blocks a sliding window lets go of while its request runs (V2) leave the GPU too, not only at free."""
    spec = ModelSpec((LayerSpec(1, 64, "float32", None, model_layer=0),
                      LayerSpec(1, 64, "float32", 2 * TPB, model_layer=1)), name="full-window")
    per_block = 2 * BLOCK_BYTES
    config = KvCacheConfig(tokens_per_block=TPB, max_tokens=16 * TPB, dtype="float32", lower_tier_only=True,
                           host_cache_size=8 * per_block)
    mgr = kvcm.create_kv_cache_manager(version, spec, config, max_batch_size=8, max_seq_len=256, device="meta")
    run(mgr, "a", list(range(6 * TPB)))
    assert [p.num_reusable for p in mgr.pools] == [0, 0]
    check_books(mgr)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("field, changes, says", [
    ("lower_tier_only", dict(host_cache_size=None), "needs a host tier: host_cache_size > 0 bytes"),
    ("lower_tier_only", dict(enable_block_reuse=False), "needs enable_block_reuse=True"),
    ("async_onboard", dict(host_cache_size=0, lower_tier_only=False, async_onboard=True), "needs a host tier"),
])
def test_a_switch_without_its_host_tier_is_one_config_error(version, field, changes, says):
    with pytest.raises(ConfigError, match=f"{field}.*{says}"):
        build(version, **changes)


def test_a_host_tier_of_no_whole_block_is_refused():
    """V1's secondary pool floors its bytes to whole blocks (V2's host level keeps one a group at least)."""
    with pytest.raises(ConfigError, match=f"lower_tier_only.*host_cache_size={BLOCK_BYTES - 1} bytes holds none"):
        build("v1", host_cache_size=BLOCK_BYTES - 1)


def test_lower_tier_only_with_onboard_blocks_off_is_refused():
    with pytest.raises(ConfigError, match="onboard_blocks.*False.*lower_tier_only"):
        build("v1", onboard_blocks=False)


@pytest.mark.parametrize("field", ["lower_tier_only", "async_onboard"])
def test_a_switch_that_is_not_a_bool_is_refused(field):
    with pytest.raises(ConfigError, match=f"{field}.*must be True or False"):
        KvCacheConfig(**{field: "yes"})
