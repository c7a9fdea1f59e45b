"""Managers built for one rank (``mapping=`` / ``pp_rank=``): a rank's cache is one GPU's cache of the rank's
layers and heads; the worked numbers are in suites/conformance/test_parallel_*."""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.versions import NAMES as ALL_VERSIONS

GiB = 2**30


def _groups(mgr):
    return [(g.window, len(g.layers), g.bytes_per_block, g.num_blocks) for g in mgr.layer_groups]


def test_deepseek_v4_rank_without_attention_dp_is_one_gpu():
    """Every DeepSeek-V4 role is a latent: 8 TP ranks each store all of it, the same pools as one GPU."""
    cfg = KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=8 * GiB)
    one = kvcm.DeepseekV4CacheManager(None, cfg, max_batch_size=8, max_seq_len=8192, device="meta")
    rank = kvcm.DeepseekV4CacheManager(None, cfg, max_batch_size=8, max_seq_len=8192, device="meta",
                                       mapping=kvcm.Mapping(tp_size=8))
    assert _groups(rank) == _groups(one) and rank.max_tokens == one.max_tokens


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_rank_of_a_gqa_model_holds_its_share(kvcm_version):
    """Llama-3-8B (32 layers, 8 KV heads of 128) at tp 4: 2 heads a rank, a quarter of the bytes a token, four
    times the tokens of one GPU at the same budget; its describe() names the stage and the rank's layers."""
    spec, cfg = kvcm.load_spec("llama-3-8b"), KvCacheConfig(max_gpu_total_bytes=4 * GiB)
    one = kvcm.create_kv_cache_manager(kvcm_version, spec, cfg, max_batch_size=4, max_seq_len=8192, device="meta")
    rank = kvcm.create_kv_cache_manager(kvcm_version, spec, cfg, max_batch_size=4, max_seq_len=8192, device="meta",
                                        mapping=kvcm.Mapping(tp_size=4))
    d = rank.describe()
    assert (d["pp_rank"], d["num_layers"], d["bytes_per_token"]) == (0, 32, 32 * 2 * 2 * 128 * 2)
    assert rank.max_tokens == 4 * one.max_tokens and "pp_rank" not in one.describe()


def test_last_stage_of_a_pipeline():
    """Llama-3-8B at pp 3: 11, 11, 10 layers; the last stage's manager holds layers 22-31."""
    spec = kvcm.load_spec("llama-3-8b")
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(max_gpu_total_bytes=GiB), max_batch_size=4,
                                       max_seq_len=4096, device="meta", mapping=kvcm.Mapping(pp_size=3), pp_rank=2)
    assert [layer.model_layer for layer in mgr.model.layers] == list(range(22, 32))


def test_a_bad_mapping_names_its_field():
    with pytest.raises(kvcm.ConfigError, match="pp_rank=3 is invalid: must be an integer in \\[0, 2\\]"):
        kvcm.create_kv_cache_manager("v1", kvcm.load_spec("llama-3-8b"), KvCacheConfig(max_gpu_total_bytes=GiB),
                                     max_batch_size=4, max_seq_len=4096, device="meta",
                                     mapping=kvcm.Mapping(pp_size=3), pp_rank=3)
    with pytest.raises(kvcm.ConfigError, match="tp_size=True is invalid"):
        kvcm.Mapping(tp_size=True)
