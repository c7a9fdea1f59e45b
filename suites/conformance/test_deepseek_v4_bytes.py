"""DeepSeek-V4's bytes per role and its groups, as TensorRT-LLM's
``tensorrt_llm/_torch/attention/backends/sparse/deepseek_v4/cache_manager.py`` computes them (``get_attn_dim``,
``get_token_bytes``, ``_get_attn_bytes_per_block``, ``_get_window_size``, ``_build_cache_config``) and its unit
test ``tests/unittest/_torch/attention/sparse/deepseek_v4/test_deepseek_v4_cache_manager.py`` lays them out
(docs/semantics.md 5).
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig

from _build import GiB, v4


def _role_bytes(mgr) -> dict[tuple[int, str], int]:
    """Bytes a block of each (model layer, role)."""
    tpb = mgr.tokens_per_block
    return {(layer.model_layer, layer.role): layer.bytes_per_block(tpb) for layer in mgr.model.layers}


def test_overlap_compressor_states_are_twice_as_wide():
    """``get_attn_dim``: compressor and indexer-compressor states of a ratio-4 layer (``is_overlap_compressor``)
    are ``2 * head_dim`` and ``2 * index_head_dim`` wide, fp32; the ratio-128 compressor's are ``head_dim``.
    At tpb 128: 2 x 512 x 4 x 128 = 524288, 2 x 128 x 4 x 128 = 131072, 512 x 4 x 128 = 262144 bytes a block."""
    b = _role_bytes(v4((4, 128)))
    assert b[0, "COMPRESSOR_KV"] == b[0, "COMPRESSOR_SCORE"] == 524288
    assert b[0, "INDEXER_COMPRESSOR_KV"] == b[0, "INDEXER_COMPRESSOR_SCORE"] == 131072
    assert b[1, "COMPRESSOR_KV"] == b[1, "COMPRESSOR_SCORE"] == 262144


@pytest.mark.parametrize("indexer_k_dtype, entry", [("fp8", 128 + 4), ("fp4", 64 + 4)])
def test_indexer_keys_pack_values_and_scales(indexer_k_dtype, entry):
    """``get_token_bytes`` for INDEXER_COMPRESS: fp8 is ``index_head_dim + index_head_dim // 128 * 4`` (values
    and one fp32 scale per 128), fp4 ``index_head_dim // 2 + index_head_dim // 32``; 32 entries a 128-token
    block at ratio 4."""
    spec = kvcm.DeepseekV4Spec(compress_ratios=(4,), indexer_k_dtype=indexer_k_dtype)
    mgr = kvcm.DeepseekV4CacheManager(spec, KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=GiB),
                                      max_batch_size=4, max_seq_len=8192, device="meta")
    assert _role_bytes(mgr)[0, "INDEXER_COMPRESS"] == entry * 32


@pytest.mark.parametrize("tpb, r4, r128", [(128, 32 * 1024, 1024), (256, 64 * 1024, 2 * 1024)])
def test_compressed_roles_keep_tpb_over_ratio_entries(tpb, r4, r128):
    """``_get_attn_bytes_per_block``: COMPRESS keeps ``tpb // ratio`` entries of ``head_dim`` bf16 (1024 bytes):
    at tpb 128, 32 (ratio 4) and 1 (ratio 128); at tpb 256, 64 and 2."""
    b = _role_bytes(v4((4, 128), KvCacheConfig(tokens_per_block=tpb, max_gpu_total_bytes=GiB)))
    assert (b[0, "COMPRESS"], b[1, "COMPRESS"]) == (r4, r128)


def test_fp8_cache_shrinks_latents_not_states():
    """``get_token_bytes``: ``has_fp8_kv_cache`` makes SWA and COMPRESS one byte an element; compressor states
    stay fp32 and indexer keys keep their own packing."""
    b = _role_bytes(v4((4, 128), KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=GiB, dtype="fp8")))
    assert (b[0, "SWA"], b[0, "COMPRESS"], b[1, "COMPRESS"]) == (512 * 128, 512 * 32, 512)
    assert b[0, "COMPRESSOR_KV"] == 524288 and b[0, "INDEXER_COMPRESS"] == 132 * 32


@pytest.mark.parametrize("d", [0, 3])
def test_windows_per_role(d):
    """``_get_window_size``: SWA keeps ``window + D``; compressor states ``state_factor * ratio + D`` (8 + D at
    ratio 4); the ratio-128 compressor shares its layer's SWA life cycle (``_build_cache_config``)."""
    mgr = v4((4, 128), max_draft_len=d)
    windows = {(mgr.model.layers[i].model_layer, mgr.model.layers[i].role): g.window
               for g in mgr.layer_groups for i in g.layers}
    assert windows[0, "SWA"] == windows[1, "COMPRESSOR_KV"] == 128 + d
    assert windows[0, "COMPRESSOR_KV"] == windows[0, "INDEXER_COMPRESSOR_SCORE"] == 8 + d
    assert windows[0, "COMPRESS"] is None and windows[1, "COMPRESS"] is None


def test_groups_follow_the_first_layers_roles():
    """``_build_cache_config`` adds, per ratio-4 layer, [SWA], [COMPRESS, INDEXER_COMPRESS], [compressor states];
    the life-cycle registry numbers them as met: window W, full length, window 8."""
    mgr = v4((4, 128))
    roles = [[mgr.model.layers[i].role for i in g.layers] for g in mgr.layer_groups]
    assert [g.window for g in mgr.layer_groups] == [128, None, 8]
    assert roles == [["SWA", "SWA", "COMPRESSOR_KV", "COMPRESSOR_SCORE"], ["COMPRESS", "INDEXER_COMPRESS", "COMPRESS"],
                     ["COMPRESSOR_KV", "COMPRESSOR_SCORE", "INDEXER_COMPRESSOR_KV", "INDEXER_COMPRESSOR_SCORE"]]


def test_drafts_add_mtp_layers_with_the_last_ratio():
    """``DeepseekV4CacheManager.__init__``: with ``max_draft_len`` D > 0, D - 1 MTP layers repeating the last
    layer's ratio are cached; ratios (4, 128) at D = 3 cache (4, 128, 128, 128)."""
    mgr = v4((4, 128), max_draft_len=3)
    assert mgr.v4_spec.layer_ratios(3) == (4, 128, 128, 128)
    assert sorted({layer.model_layer for layer in mgr.model.layers}) == [0, 1, 2, 3]


def test_flash_group_sizes():
    """The sums of ``_get_attn_bytes_per_block`` over DeepSeek-V4-Flash's 43 layers (23 at ratio 128, 20 at
    ratio 4), tpb 128, bf16: window 128: 43 x 131072 + 23 x 2 x 262144 = 17,694,720; full: 23 x 1024 +
    20 x (32768 + 4224) = 763,392; window 8: 20 x (2 x 524288 + 2 x 131072) = 26,214,400 bytes a block."""
    mgr = kvcm.DeepseekV4CacheManager(kvcm.DeepseekV4Spec(), KvCacheConfig(tokens_per_block=128,
                                                                          max_gpu_total_bytes=64 * GiB),
                                      max_batch_size=8, max_seq_len=8192, device="meta")
    assert [g.bytes_per_block for g in mgr.layer_groups] == [17_694_720, 763_392, 26_214_400]
