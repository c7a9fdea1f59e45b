"""Capacity along the engine's request life cycle (docs/semantics.md 3, 4.1, 4.2), the same calls on V1 and V2."""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig

from _manager_specs import tiny_spec


def _mgr(factory, **kw):
    kw.setdefault("max_batch_size", 4)
    kw.setdefault("max_seq_len", 4096)
    return factory(tiny_spec(), KvCacheConfig(max_tokens=kw.pop("max_tokens", 4096)), device="meta", **kw)


def test_decode_from_history_31_grows_to_32(kvcm_manager_factory):
    mgr = _mgr(kvcm_manager_factory)
    mgr.begin_context_chunk("r", 0, 31, 31)
    mgr.end_context_chunk("r", 31)
    assert (mgr.get_capacity("r"), mgr.get_history("r")) == (31, 31)
    mgr.begin_generation("r")
    assert mgr.get_capacity("r") == 32  # history 31 + 1 in-flight token: attention sees KV length 32
    assert mgr.num_blocks_held("r") == [1]  # ceil(32 / 32) = 1
    mgr.end_generation("r", num_tokens=33)  # 31 prompt + 2 sampled; KV final for positions 0..31
    assert (mgr.get_capacity("r"), mgr.get_history("r")) == (32, 32)
    mgr.begin_generation("r")
    assert mgr.get_capacity("r") == 33 and mgr.num_blocks_held("r") == [2]  # crosses into block 1


def test_generation_dummy_history_31_holds_32(kvcm_manager_factory):
    mgr = _mgr(kvcm_manager_factory)
    dummies = mgr.add_dummy_requests(["d"], token_nums=[32], is_gen=True)
    assert dummies is not None and dummies[0].prompt_len == 31
    assert mgr.get_history("d") == 31
    assert mgr.get_capacity("d") == 32  # token_num + E + K = 32 + 0 + 0: the input is counted once
    assert mgr.num_blocks_held("d") == [1]


def test_generation_dummy_with_extra_and_drafts(kvcm_manager_factory):
    mgr = _mgr(kvcm_manager_factory, num_extra_kv_tokens=2, max_draft_len=3)
    mgr.add_dummy_requests(["d"], token_nums=[27], is_gen=True, max_num_draft_tokens=3)
    assert mgr.get_capacity("d") == 32  # 27 + E 2 + K 3
    assert mgr.num_blocks_held("d") == [1]
    mgr.add_dummy_requests(["k"], token_nums=[20], is_gen=True, max_num_draft_tokens=3, kv_reserve_draft_tokens=10)
    assert mgr.get_capacity("k") == 32  # 20 + E 2 + K 10 (kv_reserve_draft_tokens overrides the draft count)


def test_default_dummies_are_one_plus_drafts(kvcm_manager_factory):
    mgr = _mgr(kvcm_manager_factory, max_draft_len=2)
    out = mgr.add_dummy_requests(["a", "b"], is_gen=True, max_num_draft_tokens=2)
    assert [d.token_num for d in out] == [3, 3]  # 1 + drafts
    assert [mgr.get_capacity(r) for r in "ab"] == [5, 5]  # 3 + E 0 + K 2


def test_failed_dummy_call_releases_everything(kvcm_manager_factory):
    mgr = _mgr(kvcm_manager_factory, max_tokens=128)  # 4 blocks
    assert mgr.add_dummy_requests(["a", "b", "c"], token_nums=[32, 32, 97], is_gen=True) is None  # 1 + 1 + 4 > 4
    assert mgr.request_ids == [] and mgr.get_num_free_blocks() == 4


@pytest.mark.parametrize("ids", [["a", "b", "a"], ["a", "held"]])
def test_duplicate_dummy_id_releases_the_call(kvcm_manager_factory, ids):
    mgr = _mgr(kvcm_manager_factory, max_tokens=128)  # 4 blocks
    mgr.begin_context_chunk("held", 0, 10, 10)  # 1 block
    try:
        out = mgr.add_dummy_requests(ids, is_gen=True)
    except kvcm.ConfigError:
        out = None
    assert out is None
    assert mgr.request_ids == ["held"] and mgr.get_num_free_blocks() == 3  # nothing of the call is left


@pytest.mark.parametrize("extra", [0, 3])
def test_context_chunks_with_extra_tokens(kvcm_manager_factory, extra):
    mgr = _mgr(kvcm_manager_factory, num_extra_kv_tokens=extra)
    caps = []
    for start, n in ((0, 40), (40, 40), (80, 20)):  # a 100-token prompt in three chunks
        mgr.begin_context_chunk("r", start, n, 100)
        caps.append(mgr.get_capacity("r"))
        mgr.end_context_chunk("r", start + n)
    if mgr.kvcm_version == "v1":  # the real version ("auto" resolves per model)
        assert caps == [100 + extra] * 3  # V1 reserves prompt_len + E at the first chunk
    else:
        assert caps == [40 + extra, 80 + extra, 100 + extra]  # V2: max(capacity, p + n + E) per chunk
    assert (mgr.get_capacity("r"), mgr.get_history("r")) == (100 + extra, 100)


@pytest.mark.parametrize("d, a", [(3, 0), (3, 2), (3, 3), (0, 0)])
def test_drafts_leave_capacity_plus_one_plus_accepted(kvcm_manager_factory, d, a):
    mgr = _mgr(kvcm_manager_factory, max_draft_len=4)
    mgr.begin_context_chunk("r", 0, 31, 31)
    mgr.end_context_chunk("r", 31)
    c = mgr.get_capacity("r")
    mgr.begin_generation("r", num_draft=d)
    if mgr.kvcm_version == "v1":  # the real version ("auto" resolves per model)
        assert mgr.get_capacity("r") == c + 1 + max(d, 4)  # V1 reserves max(d, max_draft_len)
    else:
        assert mgr.get_capacity("r") == c + 1 + d
    mgr.end_generation("r", num_tokens=31 + 1 + 1 + a, num_draft=d, num_accepted=a)
    assert mgr.get_capacity("r") == c + 1 + a  # the rejected draft slots rewound
    assert mgr.get_history("r") == 31 + 1 + a



@pytest.mark.kvcm_versions("v1")
def test_v1_context_start_reserves_prompt_extra_draft(kvcm_version):
    from _manager_specs import build

    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=4096), num_extra_kv_tokens=2, max_draft_len=4)
    mgr.begin_context_chunk("r", 0, 10, 50, draft_len=4)
    assert mgr.get_capacity("r") == 56  # prompt_len 50 + E 2 + draft_len 4
    assert mgr.num_blocks_held("r") == [2]  # ceil(56 / 32)
