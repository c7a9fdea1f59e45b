"""DeepSeek-V4's closed-form numbers (docs/semantics.md 5): its groups and windows, what drafts add, the embedded
Flash config, its block size, constraints and typical step, each computed by hand and compared to kvcm.

The other sections' numbers are in ``test_formulas.py``; the rule is the same: every expected number is arithmetic
written out, never a value read back from the code under test.
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import BatchDesc, KVCacheDesc, KvCacheConfig
from kvcm.embedded import load_config

from _manager_specs import GiB


V4_SMALL = kvcm.DeepseekV4Spec(compress_ratios=(4, 128), window_size=128, head_dim=512, index_head_dim=128)


def _v4(cfg=None, **kw):
    kw.setdefault("max_batch_size", 4)
    kw.setdefault("max_seq_len", 4096)
    kw.setdefault("device", "meta")
    return kvcm.DeepseekV4CacheManager(V4_SMALL, cfg or KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=GiB),
                                       **kw)


def test_v4_groups_and_windows():
    mgr = _v4()
    # numbered as first seen (layer 0 is r=4): window W = 128, full length, compressor states window 2 x 4
    assert [g.window for g in mgr.layer_groups] == [128, None, 8]
    roles = [[mgr.model.layers[i].role for i in g.layers] for g in mgr.layer_groups]
    assert roles[0] == ["SWA", "SWA", "COMPRESSOR_KV", "COMPRESSOR_SCORE"]
    assert roles[1] == ["COMPRESS", "INDEXER_COMPRESS", "COMPRESS"]
    assert roles[2] == ["COMPRESSOR_KV", "COMPRESSOR_SCORE", "INDEXER_COMPRESSOR_KV", "INDEXER_COMPRESSOR_SCORE"]
    # bytes a block at tpb 128 (TensorRT-LLM's get_token_bytes x tpb // ratio entries):
    #   window W: 2 x SWA 512 x 2 x 128 = 131072 each; r=128 compressor KV/SCORE fp32 512 x 4 x 128 = 262144 each
    #   full: r=4 COMPRESS 512 x 2 x 32 = 32768; INDEXER fp8 (128 + 4 scale bytes) x 32 = 4224; r=128 COMPRESS 1024
    #   window 8: overlap compressor KV/SCORE fp32 1024 x 4 x 128 = 524288 each; indexer KV/SCORE 256 x 4 x 128
    #   = 131072 each
    assert [g.bytes_per_block for g in mgr.layer_groups] == [786432, 38016, 1310720]


def test_v4_drafts_widen_windows_and_add_mtp_layers():
    mgr = _v4(max_draft_len=2)
    # D = 2: windows W + D and 8 + D; D - 1 = 1 MTP layer repeating the last layer's ratio (128) is cached too
    assert mgr.v4_spec.layer_ratios(2) == (4, 128, 128)
    assert [g.window for g in mgr.layer_groups] == [130, None, 10]
    # window group: + 131072 + 2 x 262144 for the MTP layer; full: + 1024
    assert [g.bytes_per_block for g in mgr.layer_groups] == [786432 + 655360, 38016 + 1024, 1310720]


def test_v4_flash_embedded_config():
    spec = kvcm.DeepseekV4Spec.from_hf_config(load_config("deepseek-v4-flash"))
    # 43 layers: two r=128, then 41 alternating (odd index r=4): 20 CSA (r=4) and 2 + 21 = 23 HCA (r=128)
    assert len(spec.compress_ratios) == 43
    assert (spec.compress_ratios.count(4), spec.compress_ratios.count(128)) == (20, 23)
    mgr = kvcm.DeepseekV4CacheManager(spec, KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=64 * GiB),
                                      max_batch_size=8, max_seq_len=65536, max_draft_len=3, device="meta")
    assert [g.window for g in mgr.layer_groups] == [131, None, 11]  # W + D = 128 + 3, 2 x 4 + D = 11
    # D = 3 caches two MTP layers (r = 128, as the last layer): 45 layers, 25 HCA
    # window W+D: 45 x 131072 + 25 x 2 x 262144 = 19005440; full: 20 x (32768 + 4224) + 25 x 1024 = 765440;
    # window 8+D: 20 x 1310720 = 26214400
    assert [g.bytes_per_block for g in mgr.layer_groups] == [19005440, 765440, 26214400]
    assert mgr.pool_bytes <= mgr.budget_bytes == 64 * GiB


@pytest.mark.parametrize("tpb", [32, 64, 512])
def test_v4_tokens_per_block_must_be_128_or_256(tpb):
    with pytest.raises(kvcm.ConfigError) as info:
        _v4(KvCacheConfig(tokens_per_block=tpb, max_gpu_total_bytes=GiB))
    assert info.value.field == "tokens_per_block" and info.value.value == tpb
    assert "128 or 256" in str(info.value)
    assert _v4(KvCacheConfig(tokens_per_block=256, max_gpu_total_bytes=GiB)).tokens_per_block == 256


def test_v4_constraints_context_and_longest_decode():
    mgr = _v4(max_num_tokens=1024, max_draft_len=2, num_extra_kv_tokens=1)
    assert mgr.constraint_names == ["context", "longest_decode"]
    # context: (N + E, 0) = (1025, 0); longest: (S, S - 1) + (1 + D + E, 0) x (B - 1) = (4096, 4095) + (4, 0) x 3
    assert mgr.constraints == [BatchDesc([KVCacheDesc(1025, 0)]),
                               BatchDesc([KVCacheDesc(4096, 4095)] + [KVCacheDesc(4, 0)] * 3)]
    assert _v4().constraint_names == ["longest_decode"]  # no N: no context constraint


def test_v4_typical_step_always():
    mgr = _v4(max_num_tokens=1024, max_draft_len=2)
    # T = S = 4096: [(N + E, 0)] + [(T, T - D - 1)] x 3 = [(1024, 0)] + [(4096, 4093)] x 3
    assert mgr.typical_step == BatchDesc([KVCacheDesc(1024, 0)] + [KVCacheDesc(4096, 4093)] * 3)
    mgr = _v4(KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=GiB, avg_seq_len=2048))
    # T = 2048, N unset: [(T + E, 0)] + [(T, T - 1)] x 3
    assert mgr.typical_step == BatchDesc([KVCacheDesc(2048, 0)] + [KVCacheDesc(2048, 2047)] * 3)


def test_v4_explicit_pool_ratio_has_no_constraints():
    cfg = KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=GiB, pool_ratio=(1, 1, 1))
    mgr = _v4(cfg, max_num_tokens=1024, max_draft_len=2)
    assert mgr.constraints == [] and mgr.constraint_names == []
    assert mgr.typical_step is None
    # the ratio as given: GiB / 3 a group -> floor(357913941.33 / bpb) blocks (D = 2: one MTP layer, r = 128)
    assert [g.num_blocks for g in mgr.layer_groups] == [357913941 // 1441792, 357913941 // 39040,
                                                        357913941 // 1310720]  # 248, 9167, 273
