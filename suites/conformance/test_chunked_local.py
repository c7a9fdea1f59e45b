"""Chunked local attention (Llama 4's ``attention_chunk_size``): a query reads only its own chunk.

The numbers are vLLM's (``vllm/v1/core/single_type_kv_cache_manager.py`` ``ChunkedLocalAttentionManager``:
``get_num_skipped_tokens`` docstring examples, chunk 8; ``find_longest_cache_hit`` docstring examples, chunk 8 and
block 4), applied to kvcm's type (``kvcm/attention_types.py``) and to the managers: V2 releases a request's pages
of earlier chunks as history crosses a chunk boundary and a reuse match leaves them out; V1 keeps every page.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.attention_types import ChunkedLocal
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.versions import NAMES as ALL_VERSIONS

CHUNK, TPB = 8, 4


def chunked_spec(chunk: int = CHUNK) -> ModelSpec:
    return ModelSpec((LayerSpec(1, 64, "bfloat16", model_layer=0),
                      LayerSpec(1, 64, "bfloat16", attention_chunk=chunk, model_layer=1)), name="chunked")


def build(version: str, blocks: int = 64, **cfg):
    return kvcm.create_kv_cache_manager(version, chunked_spec(), KvCacheConfig(tokens_per_block=TPB,
                                                                               max_tokens=blocks * TPB, **cfg),
                                        max_batch_size=4, max_seq_len=256, device="meta")


@pytest.mark.parametrize("computed, skipped", [(13, 8), (8, 8), (7, 0)])
def test_the_tokens_before_the_query_chunk_are_skipped(computed, skipped):
    """vLLM ``get_num_skipped_tokens``: chunk 8, 13 computed -> 8; 8 -> 8; 7 -> 0."""
    assert ChunkedLocal(CHUNK, tokens_per_block=TPB).first_live_token(computed) == skipped


@pytest.mark.parametrize("max_length, null_blocks", [(15, 2), (16, 4)])
def test_a_cache_hit_skips_the_blocks_before_the_last_chunk(max_length, null_blocks):
    """vLLM ``find_longest_cache_hit``: chunk 8, block 4; max length 15 -> [null, null] then lookups from block 2;
    max length 16 -> four null blocks."""
    assert ChunkedLocal(CHUNK, tokens_per_block=TPB).stale_range(max_length) == (0, null_blocks)


@pytest.mark.parametrize("chunk, page, bound", [(8, 4, 3), (6, 4, 3), (64, 16, 5), (5, 4, 3), (7, 4, 4)])
def test_one_request_holds_a_chunk_at_its_worst_alignment_plus_one_page(chunk, page, bound):
    """Chunks start at multiples of ``chunk``, so the page offset of a chunk's start is a multiple of
    gcd(chunk, page): 6 on pages of 4 starts at offsets 0 and 2 (2 pages either way), 7 at offset 2 spans 3
    pages; plus the page of one token in flight past the chunk."""
    worst = max(-(-((k * chunk) % page + chunk) // page) for k in range(page))
    assert ChunkedLocal(chunk, tokens_per_block=page).max_pages() == bound == worst + 1


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_v2_releases_the_earlier_chunk_at_the_boundary_and_v1_keeps_it(kvcm_version):
    mgr = build(kvcm_version, enable_block_reuse=False)
    mgr.begin_context_chunk("a", 0, 15, 15)
    mgr.end_context_chunk("a", 15)
    mgr.begin_generation("a")
    mgr.end_generation("a", 16)                   # history 15: the in-flight token 15 is still in chunk [8, 16)
    chunked = lambda: mgr.block_table("a")[1]     # noqa: E731
    releases = kvcm.versions.get(kvcm_version).cls.releases_window_pages
    assert chunked()[:2] == ([-1, -1] if releases else chunked()[:2]) and min(chunked()[:2]) == (-1 if releases else 0)
    mgr.begin_generation("a")                     # token 16 opens chunk [16, 24): pages 0-3 are stale
    mgr.end_generation("a", 17)
    held = [b for b in chunked() if b >= 0]
    assert len(held) == (1 if releases else 5)
    assert mgr.stale_released[1] == (4 if releases else 0)
    assert mgr.block_table("a")[0] == [b for b in mgr.block_table("a")[0] if b >= 0]   # full attention keeps all


def test_v2_holds_at_most_the_bound_at_every_step():
    mgr = build("v2", enable_block_reuse=False)
    bound = mgr.layer_groups[1].max_pages()
    mgr.begin_context_chunk("a", 0, 3, 3)
    mgr.end_context_chunk("a", 3)
    for n in range(3, 120):
        mgr.begin_generation("a", num_draft=2)
        assert sum(b >= 0 for b in mgr.block_table("a")[1]) <= bound
        mgr.end_generation("a", n + 1, num_draft=2)


def test_v2_pool_holds_a_chunk_per_request():
    """The capacity rule: for ``max_tokens`` the full group holds the tokens, the chunked one B bounds."""
    mgr = build("v2")
    full, chunked = mgr.layer_groups
    assert (full.num_blocks, chunked.num_blocks) == (64, 4 * ChunkedLocal(CHUNK, tokens_per_block=TPB).max_pages())
    assert (chunked.name, chunked.attention, chunked.is_full, chunked.window) == ("chunk8", ChunkedLocal(8, tokens_per_block=TPB), False, None)


def test_v2_reuses_a_prefix_whose_earlier_chunks_were_released():
    """The match needs the chunked group's pages only from the last chunk's start (vLLM's rule): request a's
    pages 0-1 there were released, and the prefix still hits."""
    mgr = build("v2")
    prompt = list(range(100, 115))
    assert mgr.add_sequence("a", prompt) == 0
    mgr.begin_context_chunk("a", 0, 15, 15)
    mgr.end_context_chunk("a", 15)
    assert mgr.block_table("a")[1][:2] == [-1, -1]
    mgr.free_resources("a")
    hit = mgr.add_sequence("b", prompt + [1, 2, 3])
    assert hit == 15
    mgr.begin_context_chunk("b", hit, 3, 18)
    mgr.end_context_chunk("b", 18)
    assert mgr.block_table("b")[1][:4] == [-1, -1, -1, -1]


def test_plan_sizes_a_chunked_model(tmp_path, capsys):
    import json

    import kvcm.cli

    config = {"model_type": "llama4_text", "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 512, "attention_chunk_size": 1024,
              "layer_types": ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"],
              "max_position_embeddings": 8192}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert kvcm.cli.main(["plan", "--model", str(path), "--max-seq-len", "8192", "--max-batch-size", "8",
                          "--max-num-tokens", "8192", "--max-tokens", str(8 * 8192), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by = {m["kvcm_version"]: m for m in out["managers"]}
    groups = {g["name"]: g for g in by["v2"]["final"]["groups"]}
    assert groups["chunk1024"]["num_blocks"] == 8 * ChunkedLocal(1024, tokens_per_block=32).max_pages()
    assert by["v2"]["max_concurrency"] >= by["v1"]["max_concurrency"]

