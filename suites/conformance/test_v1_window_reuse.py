"""V1 block reuse with sliding windows, ported from TensorRT-LLM ``kvCacheManagerTest.cpp``
(``KVCacheManagerMaxAttentionWindowWithReuseTest``, ``KVCacheManagerVariableWindowAttentionWithReuseTest``; tpb 4,
16 primary and 16 secondary blocks a window): context positions and block ids, with V1's free queue and host
tier (``test_v1_free_queue.py``, ``test_v1_host_tier.py``). What still differs is docs/semantics.md 10's "reuse: V1
sliding windows" row: upstream releases a block a request slid past; kvcm's V1 keeps it."""

from __future__ import annotations

import kvcm
from _reuse_steps import add, manager
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec


def _gen(mgr, rid, *tokens):
    """``addNewToken`` + ``addToken`` for each token."""
    for tok in tokens:
        mgr.append_tokens(rid, [tok])
        history = mgr.get_history(rid)
        mgr.begin_generation(rid)
        mgr.end_generation(rid, history + 2)


def _ids(mgr, rid):
    return mgr.get_cache_block_ids(rid)


def test_kv_cache_manager_max_attention_window_with_reuse_test():
    """Window 16: [1000..1019] takes 0..4 and, sliding by four tokens, 5; [1000..1006] reuses 0 and a copy of
    1's [1004, 1005] (position 6) in block 6, then 7; [1000..1009] reuses 0, 1 and a copy (position 9) in 8;
    [1000..1014] reuses 0, 1, 2 and a copy (position 14) in 9, then 10."""
    mgr = manager("v1", blocks=16, window=16, host_blocks=16)
    assert add(mgr, 0, list(range(1000, 1020))) == 0 and _ids(mgr, 0) == [[0, 1, 2, 3, 4]]
    _gen(mgr, 0, 1020, 1021, 1022, 1023)
    assert _ids(mgr, 0) == [[0, 1, 2, 3, 4, 5]]
    mgr.free_resources(0)
    assert add(mgr, 1, list(range(1000, 1007))) == 6 and _ids(mgr, 1) == [[0, 6]]
    _gen(mgr, 1, 1007, 1008)
    assert _ids(mgr, 1) == [[0, 6, 7]]
    mgr.free_resources(1)
    assert add(mgr, 2, list(range(1000, 1010))) == 9 and _ids(mgr, 2) == [[0, 1, 8]]
    mgr.free_resources(2)
    assert add(mgr, 3, list(range(1000, 1015))) == 14 and _ids(mgr, 3) == [[0, 1, 2, 9]]
    _gen(mgr, 3, 1015, 1016)
    assert _ids(mgr, 3) == [[0, 1, 2, 9, 10]]


def test_kv_cache_manager_variable_window_attention_with_reuse_test():
    """Windows 16 and 8: [1000..1010] takes 0, 1, 2 in both, 3 after four tokens; [1000..1006] reuses 0 and a copy
    of block 1 (not a leaf, partly used) in 4 in both windows (position 6), then 5."""
    spec = ModelSpec((LayerSpec(1, 64, "bfloat16", None, model_layer=0),
                      LayerSpec(1, 64, "bfloat16", 8, model_layer=1)), name="two-windows")
    block = 4 * 2 * 64 * 2 * 2           # both layers' K and V of one block, bf16
    mgr = kvcm.create_kv_cache_manager("v1", spec, KvCacheConfig(tokens_per_block=4, max_tokens=64,
                                                                 host_cache_size=16 * block),
                                       max_batch_size=8, max_seq_len=128, device="meta")
    assert add(mgr, 0, list(range(1000, 1011))) == 0 and _ids(mgr, 0) == [[0, 1, 2]] * 2
    _gen(mgr, 0, 1011, 1012, 1013, 1014)
    assert _ids(mgr, 0) == [[0, 1, 2, 3]] * 2
    mgr.free_resources(0)
    assert add(mgr, 1, list(range(1000, 1007))) == 6 and _ids(mgr, 1) == [[0, 4]] * 2
    _gen(mgr, 1, 1008, 1009)
    assert _ids(mgr, 1) == [[0, 4, 5]] * 2
