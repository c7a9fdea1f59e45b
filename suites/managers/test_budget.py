"""The budget regression (docs/semantics.md 4.3, 6): an ordinary model's estimation cache stays inside its budget.

Llama-3-8B: 131072 bytes a token, 4 MiB a block of 32 tokens. The estimation cache uses 0.9 of free memory.
"""

from __future__ import annotations

import json

import pytest

import kvcm
import kvcm.cli
from kvcm.config import KvCacheConfig
from kvcm.model_spec import LayerSpec, ModelSpec

from _manager_specs import GiB, build, swa_spec, tiny_spec

def _llama():
    from kvcm.plan import load_model

    return load_model("llama-3-8b")


def _estimate(kvcm_version, free_gib, **kw):
    return kvcm.build_with_estimation(kvcm_version, _llama(), KvCacheConfig(), max_batch_size=256, max_seq_len=131072,
                                      max_num_tokens=8192, device="meta", free_memory_bytes=free_gib * GiB, **kw)


@pytest.mark.parametrize("free_gib, budget, blocks", [
    (40, 38654705664, 9216),  # 0.9 x 40 GiB = 36 GiB; 36 GiB / 4 MiB = 36 x 256 = 9216 blocks
    # 0.9 x 16 GiB = 15461882265.6 -> 15461882265 bytes; / 4194304 = 3686.4 -> 3686 blocks. A longest-decode
    # floor here would need (131072 / 32 = 4096) + 255 = 4351 blocks = 18249416704 bytes: past the budget.
    (16, 15461882265, 3686),
])
def test_ordinary_model_estimation_within_budget(kvcm_version, free_gib, budget, blocks):
    est = _estimate(kvcm_version, free_gib)
    e = est.estimation
    assert e["budget_bytes"] == budget
    assert e["pool_bytes"] <= e["budget_bytes"]
    assert [g["num_blocks"] for g in e["groups"]] == [blocks]
    names = [c["name"] for c in e["constraints"]]
    assert "longest_decode" not in names
    if est.manager.kvcm_version == "v2":
        assert e["constraints"] == [{"name": "context", "requests": [{"count": 1, "capacity": 8192, "history": 0}]}]
        # typical step with avg_seq_len = S: (N, 0) + 255 x (S, S - 1)
        assert e["typical_step"] == [{"count": 1, "capacity": 8192, "history": 0},
                                     {"count": 255, "capacity": 131072, "history": 131071}]
    else:
        assert e["constraints"] == [] and e["typical_step"] is None
    final = est.manager
    assert final.pool_bytes <= final.budget_bytes == budget
    assert [w.skipped for w in est.warmups] == [[], []]
    assert [len(w.planned) for w in est.warmups] == [9, 9]  # 1, 2, 4, ..., 256


V4_SMALL = kvcm.DeepseekV4Spec(compress_ratios=(4, 128), window_size=128, head_dim=512, index_head_dim=128)


def test_deepseek_v4_floors_past_budget_raise():
    # longest_decode (8192, 8191) + 15 x (1, 0) at tpb 128, bytes a block 786432 / 38016 / 1310720 (test_formulas):
    #   window 128: 64 - stale (8192 - 128) // 128 = 63 -> 1, + 15 = 16 x 786432 = 12582912
    #   full group: 8192 / 128 = 64 + 15 = 79 blocks x 38016 = 3003264
    #   window 8:   64 - (8192 - 8) // 128 = 63 -> 1, + 15 = 16 x 1310720 = 20971520
    #   total 36557696 bytes; budget 0.9 x 20_000_000 = 18_000_000
    with pytest.raises(kvcm.BudgetExceededError) as info:
        kvcm.build_with_estimation("v2", V4_SMALL, KvCacheConfig(tokens_per_block=128), max_batch_size=16,
                                   max_seq_len=8192, max_num_tokens=1024, device="meta", free_memory_bytes=20_000_000)
    err = info.value
    assert (err.constraint, err.needed_bytes, err.budget_bytes) == ("longest_decode", 36557696, 18000000)
    msg = str(err)
    assert "'longest_decode'" in msg and "36557696" in msg and "18000000" in msg
    assert isinstance(err, MemoryError)


def test_deepseek_v4_floors_within_budget_hold():
    # 0.9 x 45_000_000 = 40_500_000 >= 36557696: the floors fit and the pools stay inside the budget
    est = kvcm.build_with_estimation("v2", V4_SMALL, KvCacheConfig(tokens_per_block=128), max_batch_size=16,
                                     max_seq_len=8192, max_num_tokens=1024, device="meta",
                                     free_memory_bytes=45_000_000)
    e = est.estimation
    assert [c["name"] for c in e["constraints"]] == ["context", "longest_decode"]
    assert e["pool_bytes"] <= e["budget_bytes"] == 40_500_000
    floors = [16, 79, 16]
    assert all(g["num_blocks"] >= f for g, f in zip(e["groups"], floors))


def test_deepseek_v4_explicit_ratio_has_no_floors():
    # the same 18_000_000-byte budget that the floors (36557696 bytes) exceed, but with an explicit ratio 1:1:1:
    # no constraints, so the pools are simply 6_000_000 bytes each:
    #   6_000_000 // 786432 = 7, 6_000_000 // 38016 = 157, 6_000_000 // 1310720 = 4
    cfg = KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=18_000_000, pool_ratio=(1, 1, 1))
    mgr = kvcm.DeepseekV4CacheManager(V4_SMALL, cfg, max_batch_size=16, max_seq_len=8192, max_num_tokens=1024,
                                      device="meta")
    assert mgr.constraints == []
    assert [g.num_blocks for g in mgr.layer_groups] == [7, 157, 4]


def test_plan_reports_v4_budget_error(capsys):
    rc = kvcm.cli.main(["plan", "--model", "deepseek-v4-flash", "--free-gib", "1", "-S", "1048576", "-B", "64",
                        "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert "BudgetExceededError" in out["managers"][0]["error"] and "longest_decode" in out["managers"][0]["error"]


def test_plan_reports_the_pool_tensorrt_llm_would_build(capsys):
    """The same refusal in ``kvcm plan --json`` carries the finding: TensorRT-LLM's storage manager builds the
    floors in whole 2 MiB grains (the full group's 8,255-slot floor is 8,256 slots of those grains), a quota
    enlarged to exactly that pool, 8,147,854,951 bytes past the 0.9 GiB budget (docs/semantics.md 4.4)."""
    kvcm.cli.main(["plan", "--model", "deepseek-v4-flash", "--free-gib", "1", "-S", "1048576", "-B", "64", "--json"])
    entry = json.loads(capsys.readouterr().out)["managers"][0]
    pool = entry["trtllm_pool"]
    assert pool["granularity"] == 2 << 20 and pool["pool_bytes"] % pool["granularity"] == 0
    assert pool["quota_bytes"] == pool["pool_bytes"] == 9114222592
    assert pool["excess_bytes"] == pool["pool_bytes"] - pool["budget_bytes"] == 8147854951
    assert [(g["min_slots"], g["num_slots"]) for g in pool["pool_groups"]] == [(64, 64), (8255, 8256), (64, 64)]
    assert "over the budget" in entry["error"]


# ---- a failed operation restores state ------------------------------------------------------------------------
def _snapshot(mgr):
    return ({r: (mgr.get_capacity(r), mgr.get_history(r), mgr.block_table(r)) for r in mgr.request_ids},
            [p.num_free for p in mgr.pools])


def test_failed_growth_restores_state(kvcm_version):
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=128))  # 4 blocks
    mgr.begin_context_chunk("a", 0, 64, 64)
    mgr.end_context_chunk("a", 64)
    mgr.begin_context_chunk("b", 0, 40, 40)  # 2 blocks: pool full
    before = _snapshot(mgr)
    with pytest.raises(kvcm.OutOfPagesError) as info:
        mgr.begin_generation("a")  # 65 tokens need a third block
    assert info.value.needed == 1 and info.value.free == 0
    assert _snapshot(mgr) == before
    with pytest.raises(kvcm.OutOfPagesError):
        mgr.begin_context_chunk("c", 0, 10, 10)
    assert _snapshot(mgr) == before and not mgr.has_request("c")
    assert mgr.add_dummy_requests(["d"], token_nums=[1], is_gen=True) is None
    assert _snapshot(mgr) == before


@pytest.mark.kvcm_versions("v2")
def test_failed_resize_returns_false_unchanged(kvcm_version):
    mgr = build(kvcm_version, swa_spec(64), KvCacheConfig(max_gpu_total_bytes=16 * 2048, pool_ratio=(1, 1)))
    mgr.add_request("a")
    # 8 blocks a group. Full: ceil(200/32) = 7 blocks; window: 7 less stale [0, (150 + 1 - 64) // 32 = 2) = 5
    assert mgr.resize("a", 200, 150)
    assert mgr.num_blocks_held("a") == [7, 5]
    before = _snapshot(mgr)
    assert mgr.resize("a", 300, 150) is False  # full needs ceil(300/32) = 10 blocks: 3 more, 1 free
    assert _snapshot(mgr) == before
    with pytest.raises(ValueError):
        mgr.resize("a", 200, 100)  # history must not decrease
    with pytest.raises(ValueError):
        mgr.resize("a", 140, 150)  # history above capacity
    assert _snapshot(mgr) == before


# ---- bad config values name field, value and limit ------------------------------------------------------------
@pytest.mark.parametrize("make, field, value, limit", [
    (lambda: KvCacheConfig(tokens_per_block=48), "tokens_per_block", 48, "power of two"),
    (lambda: KvCacheConfig(tokens_per_block=0), "tokens_per_block", 0, "positive integer"),
    (lambda: KvCacheConfig(max_tokens=0), "max_tokens", 0, ">= 1"),
    (lambda: KvCacheConfig(max_gpu_total_bytes=-5), "max_gpu_total_bytes", -5, ">= 1"),
    (lambda: KvCacheConfig(pool_ratio=(1, -1)), "pool_ratio", (1, -1), "positive weight"),
    (lambda: KvCacheConfig(avg_seq_len=0), "avg_seq_len", 0, ">= 1"),
    (lambda: KvCacheConfig(dtype="int4"), "dtype", "int4", "one of"),
    (lambda: LayerSpec(0, 128), "num_kv_heads", 0, ">= 1"),
    (lambda: build("v2", tiny_spec(), KvCacheConfig(max_tokens=64), max_batch_size=0), "max_batch_size", 0, ">= 1"),
    (lambda: build("v1", tiny_spec(), KvCacheConfig(max_tokens=64), max_num_tokens=0), "max_num_tokens", 0, ">= 1"),
    (lambda: build("v2", tiny_spec(), KvCacheConfig(max_tokens=64), num_extra_kv_tokens=-1),
     "num_extra_kv_tokens", -1, ">= 0"),
    (lambda: build("v2", swa_spec(), KvCacheConfig(max_tokens=64, pool_ratio=(1, 1, 1))), "pool_ratio",
     (1.0, 1.0, 1.0), "exactly 2 weights"),
    (lambda: build("v1", tiny_spec(), KvCacheConfig(max_gpu_total_bytes=100)), "kv_cache_config", "budget",
     "4096 bytes"),  # one block takes 2 x 64 x 32 = 4096 > 100
    (lambda: build("v2", tiny_spec(), KvCacheConfig()), "free_memory_bytes", None, "required on device 'meta'"),
    (lambda: kvcm.create_kv_cache_manager("v3", tiny_spec(), KvCacheConfig(max_tokens=64), max_batch_size=1,
                                          max_seq_len=64), "kvcm_version", "v3", "one of"),
    (lambda: kvcm.create_kv_cache_manager("v1", V4_SMALL, KvCacheConfig(tokens_per_block=128, max_tokens=1024),
                                          max_batch_size=1, max_seq_len=64), "kvcm_version", "v1", "V2-based"),
])
def test_config_errors_name_field_value_limit(make, field, value, limit):
    with pytest.raises(kvcm.ConfigError) as info:
        make()
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.field, err.value) == (field, value)
    assert f"{field}={value!r}" in str(err) and limit in str(err)


def test_model_spec_needs_layers():
    with pytest.raises(kvcm.ConfigError, match="num_hidden_layers"):
        ModelSpec.from_hf_config({"num_attention_heads": 8})
