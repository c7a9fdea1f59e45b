"""The closed-form numbers of docs/semantics.md 2-4 and 7, each computed by hand in a comment and compared to kvcm
(section 5's, DeepSeek-V4's, are in ``test_formulas_deepseek_v4.py``).

Every expected number here is arithmetic written out, never a value read back from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvcm
from kvcm.config import BatchDesc, KVCacheDesc, KvCacheConfig
from kvcm.attention_types import SlidingWindow
from kvcm.layer_groups import LayerGroup
from kvcm.model_spec import ModelSpec
from kvcm.warmup import cuda_graph_batch_sizes, warmup_shapes

from _manager_specs import GiB, build, swa_spec, tiny_spec

CONFIGS = Path(kvcm.__file__).parent / "configs"


# ---- 2. bytes per token -------------------------------------------------------------------------------------
def _embedded(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("name, expected, window", [
    ("llama-3-8b", 32 * 2 * 8 * 128 * 2, None),      # 32 layers x K,V x 8 kv heads x 128 dims x bf16 = 131072
    ("mistral-7b-v0.1", 32 * 2 * 8 * 128 * 2, 4096),  # same shape as Llama-3-8B, every layer slides over 4096
    ("qwen3-0.6b", 28 * 2 * 8 * 128 * 2, None),       # 28 layers, 8 kv heads, head_dim 128 = 114688
    ("seed-oss-36b", 64 * 2 * 8 * 128 * 2, None),     # 64 layers, 8 kv heads, head_dim 128 = 262144
])
def test_embedded_configs_bytes_per_token(name, expected, window):
    spec = ModelSpec.from_hf_config(_embedded(name))
    assert spec.bytes_per_token() == expected
    assert {layer.sliding_window for layer in spec.layers} == {window}


def test_llama3_8b_is_131072_bytes_a_token():
    spec = ModelSpec.from_hf_config(_embedded("llama-3-8b"))
    assert spec.bytes_per_token() == 131072  # 32 x 2 x 8 x 128 x 2
    assert spec.layers[0].bytes_per_token == 4096  # one layer: 2 x 8 x 128 x 2


@pytest.mark.parametrize("dtype, expected", [
    ("fp8", 32 * 2 * 8 * 128 * 1),       # 65536: fp8 is one byte an element
    ("bfloat16", 32 * 2 * 8 * 128 * 2),  # 131072
    ("float32", 32 * 2 * 8 * 128 * 4),   # 262144
])
def test_kv_dtype_bytes(dtype, expected):
    spec = ModelSpec.from_hf_config(_embedded("llama-3-8b")).with_dtype(dtype)
    assert spec.bytes_per_token() == expected


def test_mla_latent_is_one_entry_of_rank_plus_rope():
    # DeepSeek-V3: 61 layers, kv_lora_rank 512 + qk_rope_head_dim 64, kv_factor 1, bf16:
    # (512 + 64) x 1 x 2 = 1152 bytes a layer; 61 x 1152 = 70272
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
           "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.layers[0].kv_factor == 1
    assert spec.layers[0].bytes_per_token == 1152
    assert spec.bytes_per_token() == 70272
    # fp8 latent: 576 x 1 x 1 = 576 a layer
    assert spec.with_dtype("fp8").layers[0].bytes_per_token == 576


def test_transformers_llama_and_qwen3_configs():
    from transformers import LlamaConfig, Qwen3Config

    llama = LlamaConfig(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=512)
    spec = ModelSpec.from_hf_config(llama)
    # head_dim = 512 / 8 = 64; 4 layers x 2 x 2 heads x 64 x 2 bytes = 2048
    assert spec.bytes_per_token() == 2048
    assert [layer.sliding_window for layer in spec.layers] == [None] * 4

    qwen = Qwen3Config(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=512,
                       head_dim=96, use_sliding_window=True, sliding_window=128, max_window_layers=2)
    spec = ModelSpec.from_hf_config(qwen)
    # explicit head_dim 96 wins over 512 / 8: 4 x 2 x 2 x 96 x 2 = 3072; layers 2 and 3 (>= max_window_layers) slide
    assert spec.bytes_per_token() == 3072
    assert [layer.sliding_window for layer in spec.layers] == [None, None, 128, 128]


def test_transformers_mistral_sliding_window():
    from transformers import MistralConfig

    cfg = MistralConfig(num_hidden_layers=3, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
                        sliding_window=4096)
    spec = ModelSpec.from_hf_config(cfg)
    assert [layer.sliding_window for layer in spec.layers] == [4096] * 3
    assert spec.bytes_per_token() == 3 * 2 * 8 * 128 * 2  # 3 layers x 4096 = 12288


def test_gemma_style_layer_types():
    cfg = {"model_type": "gemma3_text", "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
           "head_dim": 256, "hidden_size": 2048, "sliding_window": 512,
           "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    spec = ModelSpec.from_hf_config(cfg)
    assert [layer.sliding_window for layer in spec.layers] == [512] * 5 + [None]
    groups = kvcm.KVCacheManagerV2(spec, KvCacheConfig(max_gpu_total_bytes=GiB), max_batch_size=2,
                                   max_seq_len=1024).layer_groups
    # numbered as first seen (TensorRT-LLM's LifeCycleRegistry): group 0 the five sliding layers, group 1 layer 5
    assert [(g.layers, g.window) for g in groups] == [((0, 1, 2, 3, 4), 512), ((5,), None)]
    # per block (tpb 32): 2 x 4 x 256 x 2 x 32 = 131072 bytes a layer
    assert [g.bytes_per_block for g in groups] == [5 * 131072, 131072]


# ---- 3. V1 pool sizes (tiny spec: 2 layers x 64 bytes a token = 128 bytes a token, 4096 bytes a block) -----------
@pytest.mark.kvcm_versions("v1")
def test_v1_max_tokens_is_floor_of_blocks(kvcm_version):
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=1000))
    assert [g.num_blocks for g in mgr.layer_groups] == [31]  # whole blocks, as TensorRT-LLM: 1000 // 32 = 31


@pytest.mark.kvcm_versions("v1")
def test_v1_fraction_of_free_bytes_is_floored(kvcm_version):
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(free_gpu_memory_fraction=0.5), free_memory_bytes=1_000_000)
    assert mgr.layer_groups[0].num_blocks == 122  # floor(0.5 x 1_000_000 / 4096) = floor(122.07) = 122
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(), free_memory_bytes=1_000_000)
    assert mgr.layer_groups[0].num_blocks == 219  # default 0.9: floor(900_000 / 4096) = floor(219.7) = 219


@pytest.mark.kvcm_versions("v1")
def test_v1_smallest_budget_wins(kvcm_version):
    cfg = KvCacheConfig(max_tokens=1000, max_gpu_total_bytes=40960)
    assert build(kvcm_version, tiny_spec(), cfg).layer_groups[0].num_blocks == 10  # min(31, 40960 / 4096 = 10)
    cfg = KvCacheConfig(max_tokens=100, free_gpu_memory_fraction=0.9)
    mgr = build(kvcm_version, tiny_spec(), cfg, free_memory_bytes=10**9)
    assert mgr.layer_groups[0].num_blocks == 3  # min(100 // 32 = 3, 900e6 / 4096 = 219726)


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, -0.1])
def test_fraction_outside_open_unit_interval_rejected(fraction):
    with pytest.raises(kvcm.ConfigError) as info:
        KvCacheConfig(free_gpu_memory_fraction=fraction)
    assert isinstance(info.value, ValueError)
    assert f"free_gpu_memory_fraction={fraction!r}" in str(info.value)
    assert "(0, 1)" in str(info.value)


# ---- 4.3 V2 quota and split -----------------------------------------------------------------------------------
@pytest.mark.kvcm_versions("v2")
@pytest.mark.parametrize("max_tokens, blocks", [(1000, 32), (1024, 32), (1025, 33), (1, 1)])  # ceil(T / 32)
def test_v2_max_tokens_single_full_group(kvcm_version, max_tokens, blocks):
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=max_tokens))
    assert [g.num_blocks for g in mgr.layer_groups] == [blocks]
    assert mgr.pool_bytes == blocks * 4096 <= mgr.budget_bytes


@pytest.mark.kvcm_versions("v2")
def test_v2_max_tokens_with_window_group_keeps_its_quota(kvcm_version):
    # quota = ceil(1000 / 32) = 32 full blocks + B 4 x (ceil(64 / 32) + 1) = 12 window blocks, 2048 bytes each
    mgr = build(kvcm_version, swa_spec(64), KvCacheConfig(max_tokens=1000))
    assert mgr.budget_bytes == 44 * 2048
    assert [g.num_blocks for g in mgr.layer_groups] == [32, 12]
    # a request of 1000 tokens must fit in a cache asked to hold 1000 tokens
    assert mgr.get_num_available_tokens(token_num_upper_bound=1000) == 1000


@pytest.mark.kvcm_versions("v2")
def test_v2_explicit_pool_ratio_is_used_as_given(kvcm_version):
    # two groups of 2048 bytes a block; budget 100 blocks' worth = 204800 bytes; ratio 3:1 -> 75 and 25
    cfg = KvCacheConfig(max_gpu_total_bytes=204800, pool_ratio=(3, 1))
    mgr = build(kvcm_version, swa_spec(), cfg, max_num_tokens=4096)
    assert [g.num_blocks for g in mgr.layer_groups] == [75, 25]
    assert mgr.constraints == [] and mgr.typical_step is None


@pytest.mark.kvcm_versions("v2")
def test_v2_default_split_is_one_long_request(kvcm_version):
    # default split request (2049, 2048): full group ceil(2049/32) = 65 blocks; window-64 group keeps
    # 65 - stale[0, (2048 + 1 - 64) // 32 = 62) = 3 blocks. Budget 68 blocks x 2048 bytes -> 65 and 3.
    mgr = build(kvcm_version, swa_spec(), KvCacheConfig(max_gpu_total_bytes=68 * 2048))
    assert [g.num_blocks for g in mgr.layer_groups] == [65, 3]


@pytest.mark.kvcm_versions("v2")
@pytest.mark.parametrize("extra, expected", [
    (0, [52, 16]),  # context floor (512, 0): 16 blocks in both groups; window group lifted 3 -> 16, full 68 - 16
    (8, [51, 17]),  # context floor (520, 0): ceil(520 / 32) = 17 blocks; full gets 68 - 17 = 51
])
def test_v2_floor_lifts_a_group(kvcm_version, extra, expected):
    mgr = build(kvcm_version, swa_spec(), KvCacheConfig(max_gpu_total_bytes=68 * 2048), max_num_tokens=512,
                num_extra_kv_tokens=extra)
    assert [g.num_blocks for g in mgr.layer_groups] == expected
    assert mgr.pool_bytes <= mgr.budget_bytes == 68 * 2048


@pytest.mark.kvcm_versions("v2")
def test_v2_budget_exceeded_names_constraint_bytes_budget(kvcm_version):
    # context (4096, 0) needs 128 blocks in each group: 256 x 2048 = 524288 bytes; budget 68 x 2048 = 139264
    with pytest.raises(kvcm.BudgetExceededError) as info:
        build(kvcm_version, swa_spec(), KvCacheConfig(max_gpu_total_bytes=139264), max_num_tokens=4096)
    err = info.value
    assert (err.constraint, err.needed_bytes, err.budget_bytes) == ("context", 524288, 139264)
    assert "'context'" in str(err) and "524288" in str(err) and "139264" in str(err)


# ---- 4.1 stale sliding-window blocks: [min(ceil(h/tpb), sink_blocks), max(that, (h + 1 - W) // tpb)) ----------
def _group(window, sinks):
    return LayerGroup(index=0, layers=(0,), attention=SlidingWindow(window, sinks, tokens_per_block=32),
                      bytes_per_block=1)


@pytest.mark.parametrize("h, sinks, expected", [
    (0, 0, (0, 0)),     # (0 + 1 - 64) // 32 = -2 -> nothing stale
    (63, 0, (0, 0)),    # (63 + 1 - 64) // 32 = 0
    (94, 0, (0, 0)),    # (94 + 1 - 64) // 32 = 31 // 32 = 0: the in-flight token at 94 still reads position 31
    (95, 0, (0, 1)),    # (95 + 1 - 64) // 32 = 1: block 0 (positions 0..31) is out of every future window
    (200, 0, (0, 4)),   # (200 + 1 - 64) // 32 = 137 // 32 = 4
    (0, 4, (0, 0)),     # sinks: lo = min(ceil(0/32) = 0, 1) = 0
    (95, 4, (1, 1)),    # lo = min(3, ceil(4/32) = 1) = 1; hi = max(1, 1) = 1: block 0 holds sinks
    (127, 4, (1, 2)),   # hi = (127 + 1 - 64) // 32 = 2
    (200, 4, (1, 4)),   # lo = min(7, 1) = 1, hi = max(1, 4) = 4
    (200, 40, (2, 4)),  # sink_blocks = ceil(40 / 32) = 2
    (20, 40, (1, 1)),   # lo = min(ceil(20/32) = 1, 2) = 1, hi = max(1, -1) = 1
])
def test_stale_range_formula(h, sinks, expected):
    assert _group(64, sinks).stale_range(h) == expected


def test_stale_blocks_released_by_v2_resize():
    mgr = kvcm.KVCacheManagerV2(swa_spec(64), KvCacheConfig(max_gpu_total_bytes=64 * 2048, pool_ratio=(1, 1)),
                                max_batch_size=2, max_seq_len=1024)  # 32 blocks in each group
    mgr.add_request("r")
    assert mgr.resize("r", 96, 94)
    assert mgr.block_table("r")[1].count(-1) == 0  # history 94: query at 94 reads 31..94, block 0 stays
    assert mgr.num_blocks_held("r") == [3, 3]       # ceil(96 / 32) = 3 in both
    assert mgr.resize("r", 96, 95)
    assert mgr.block_table("r")[1][0] == -1         # history 95: block 0 released
    assert mgr.num_blocks_held("r") == [3, 2]
    assert mgr.resize("r", 201, 200)                # ceil(201/32) = 7; stale [0, 4): 3 held, new ones never made
    assert mgr.num_blocks_held("r") == [7, 3]
    assert mgr.block_table("r")[1][:4] == [-1] * 4


# ---- 4.3 generic V2 constraints ----------------------------------------------------------------------------
def _v2(**kw):
    cfg = KvCacheConfig(max_gpu_total_bytes=64 * 2**20, avg_seq_len=kw.pop("avg_seq_len", None))
    kw.setdefault("max_seq_len", 16384)
    return build("v2", tiny_spec(), cfg, **kw)


@pytest.mark.kvcm_versions("v2")
@pytest.mark.parametrize("extra", [0, 3])
def test_generic_context_constraint_is_n_plus_e(kvcm_version, extra):
    mgr = _v2(max_num_tokens=8192, num_extra_kv_tokens=extra)
    assert mgr.constraint_names == ["context"]
    assert mgr.constraints == [BatchDesc([KVCacheDesc(8192 + extra, 0)])]  # N + E tokens, nothing computed yet


@pytest.mark.kvcm_versions("v2")
def test_generic_context_floor_counts_extra_tokens(kvcm_version):
    # N = 1024, E = 1: the context floor is ceil(1025 / 32) = 33 blocks; a 32-block budget cannot hold it
    with pytest.raises(kvcm.BudgetExceededError) as info:
        build(kvcm_version, tiny_spec(), KvCacheConfig(max_gpu_total_bytes=32 * 4096), max_num_tokens=1024,
              num_extra_kv_tokens=1)
    assert info.value.needed_bytes == 33 * 4096  # 135168


@pytest.mark.kvcm_versions("v2")
def test_generic_v2_has_no_longest_decode(kvcm_version):
    mgr = _v2(max_num_tokens=2048, max_batch_size=64, max_draft_len=3, avg_seq_len=4096)
    assert "longest_decode" not in mgr.constraint_names
    assert mgr.constraint_names == ["context"]
    assert _v2(max_num_tokens=None).constraints == []  # no N: no constraint at all


@pytest.mark.kvcm_versions("v2")
def test_typical_step_only_with_avg_seq_len(kvcm_version):
    assert _v2(max_num_tokens=256).typical_step is None
    mgr = _v2(max_num_tokens=256, avg_seq_len=1024, max_batch_size=4, max_draft_len=2, num_extra_kv_tokens=3)
    # [(N + E, 0)] + [(T, T - D - 1)] x (B - 1) = [(259, 0)] + [(1024, 1021)] x 3
    assert mgr.typical_step == BatchDesc([KVCacheDesc(259, 0)] + [KVCacheDesc(1024, 1021)] * 3)
    mgr = _v2(max_num_tokens=None, avg_seq_len=1024, max_batch_size=2, num_extra_kv_tokens=3)
    assert mgr.typical_step == BatchDesc([KVCacheDesc(1027, 0), KVCacheDesc(1024, 1023)])  # (T + E, 0), (T, T-1)


@pytest.mark.kvcm_versions("v2")
def test_avg_seq_len_above_max_seq_len_rejected(kvcm_version):
    with pytest.raises(kvcm.ConfigError) as info:
        _v2(avg_seq_len=20000, max_seq_len=16384)
    assert info.value.field == "avg_seq_len" and info.value.value == 20000
    assert "avg_seq_len=20000" in str(info.value) and "16384" in str(info.value)


# ---- 3 / 4.2 get_num_available_tokens (tiny spec, 10 blocks of 32 tokens) -----------------------------------

@pytest.mark.kvcm_versions("v1")
def test_v1_available_tokens(kvcm_version):
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=320), num_extra_kv_tokens=3)
    assert mgr.get_num_free_blocks() == 10
    # min(ub, free x tpb - E - drafts) = min(10000, 320 - 3 - 4) = 313
    assert mgr.get_num_available_tokens(token_num_upper_bound=10000, max_num_draft_tokens=4) == 313
    assert mgr.get_num_available_tokens(token_num_upper_bound=10000, max_num_draft_tokens=4, batch_size=5) == 313
    assert mgr.get_num_available_tokens(token_num_upper_bound=100, max_num_draft_tokens=4) == 100
    assert mgr.get_num_available_tokens(token_num_upper_bound=10000) == 317  # 320 - 3
    mgr.begin_context_chunk("r", 0, 30, 30)  # 30 + E 3 = 33 tokens: 2 blocks
    assert mgr.get_num_available_tokens(token_num_upper_bound=10000, max_num_draft_tokens=4) == 249  # 256 - 7


@pytest.mark.kvcm_versions("v2")
def test_v2_available_tokens(kvcm_version):
    mgr = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=320), num_extra_kv_tokens=3)
    avail = lambda **kw: mgr.get_num_available_tokens(**{"token_num_upper_bound": 10000, **kw})  # noqa: E731
    # extra = E + drafts = 7; clamp(1, 10007): 10 blocks fit 320 -> 320 - 7 = 313
    assert avail(max_num_draft_tokens=4) == 313
    assert (avail(max_num_draft_tokens=4) + 7) % 32 == 0  # a page boundary
    # batch_size 3: two one-token requests take 2 blocks -> 8 x 32 - 7 = 249
    assert avail(max_num_draft_tokens=4, batch_size=3) == 249
    assert avail(max_num_draft_tokens=4, batch_size=10) == 32 - 7  # 1 block left = 25
    assert avail(max_num_draft_tokens=4, batch_size=11) == 0  # 10 one-token requests leave nothing
    assert avail(token_num_upper_bound=100, max_num_draft_tokens=4) == 100  # 107 tokens fit: the bound itself
    assert avail() == 317  # extra 3: 320 - 3
    # max_tokens clamp: T = 300 still makes ceil(300/32) = 10 blocks, but the answer is min(313, 300 - 7) = 293
    mgr300 = build(kvcm_version, tiny_spec(), KvCacheConfig(max_tokens=300), num_extra_kv_tokens=3)
    assert mgr300.layer_groups[0].num_blocks == 10
    assert mgr300.get_num_available_tokens(token_num_upper_bound=10000, max_num_draft_tokens=4) == 293


@pytest.mark.kvcm_versions("v2")
def test_v2_available_tokens_with_window_group(kvcm_version):
    # window 64, pool_ratio 1:1 of 20 blocks: 10 full, 10 window blocks. A long request at history c - E - 1 keeps
    # in the window group ceil(c/32) - (c - E - 1 + 1 - 64) // 32 blocks, so the full group (10 blocks) binds:
    # 320 - extra.
    mgr = build(kvcm_version, swa_spec(64), KvCacheConfig(max_gpu_total_bytes=20 * 2048, pool_ratio=(1, 1)))
    assert [g.num_blocks for g in mgr.layer_groups] == [10, 10]
    assert mgr.get_num_available_tokens(token_num_upper_bound=10000, max_num_draft_tokens=4) == 316  # 320 - 4


# ---- 7. warmup planner ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("b, kw, expected", [
    (20, {}, [1, 2, 4, 8, 16, 20]),                              # powers of two, padded with B
    (16, {}, [1, 2, 4, 8, 16]),
    (1, {}, [1]),
    (20, {"max_num_tokens": 40, "max_draft_len": 4}, [1, 2, 4, 8]),  # drop above min(20, 40 // (1 + 4) = 8)
    (20, {"max_num_tokens": 7}, [1, 2, 4]),                          # 7 // 1 = 7
    (20, {"batch_sizes": [3, 1, 3, 50]}, [1, 3]),                    # given list, deduplicated, 50 > B dropped
])
def test_cuda_graph_batch_sizes(b, kw, expected):
    assert cuda_graph_batch_sizes(b, **kw) == expected


def test_warmup_shapes_largest_first_two_model(kvcm_manager_factory):
    mgr = kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=4096), max_batch_size=4, max_seq_len=2048,
                               max_draft_len=2, device="meta")
    shapes = [(s.batch_size, s.draft_len) for s in warmup_shapes(mgr)]
    assert shapes == [(4, 2), (2, 2), (1, 2)]
    shapes = [(s.batch_size, s.draft_len) for s in warmup_shapes(mgr, two_model=True)]
    assert shapes == [(4, 2), (4, 0), (2, 2), (2, 0), (1, 2), (1, 0)]


def test_warmup_normal_config_skips_nothing(kvcm_manager_factory):
    # 128 blocks; B = 8, S = 2048, D = 2: the long dummy is min(available, S - 1 - E - K = 2045) tokens
    mgr = kvcm_manager_factory(tiny_spec(), KvCacheConfig(max_tokens=4096), max_batch_size=8, max_seq_len=2048,
                               max_draft_len=2, device="meta")
    report = kvcm.plan_warmup(mgr, two_model=True)
    assert len(report.planned) == 8 and len(report.captured) == 8 and report.skipped == []  # 4 sizes x 2 drafts
    assert report.long_token_nums[kvcm.WarmupShape(8, 2)] == 2045
    assert mgr.get_num_free_blocks() == 128  # everything released
