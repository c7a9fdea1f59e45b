"""Ranks, layers and KV heads of a parallel deployment, as TensorRT-LLM computes them (docs/semantics.md,
"Parallel deployments"): ``tensorrt_llm/mapping.py`` (``Mapping``, its unit test
``tests/unittest/others/test_mapping.py``), ``tensorrt_llm/_torch/pyexecutor/resource_manager.py``
(``get_pp_layers``, ``KVCacheManager.__init__``'s ``num_kv_heads_per_layer``, ``get_cache_bytes_per_token``),
``_util.py`` (the MLA cache: ``num_kv_heads=1``) and ``_torch/modules/attention.py`` (``Attention.__init__``).
"""

from __future__ import annotations

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import ConfigError
from kvcm.model_spec import ModelSpec

from _build import GiB


def _mla(num_layers: int = 4) -> ModelSpec:
    """A DeepSeek-V3-shaped MLA config: one 512 + 64 latent a layer, 16 query heads."""
    return ModelSpec.from_hf_config({"num_hidden_layers": num_layers, "num_attention_heads": 16, "hidden_size": 1024,
                                     "kv_lora_rank": 512, "qk_rope_head_dim": 64, "model_type": "deepseek_v3"})


@pytest.mark.upstream("test_mapping.py::test_mapping")
def test_ranks_and_groups_as_mapping_numbers_them():
    """``test_mapping.py::test_mapping`` (cp_size 1): tp 8 is one TP group of all ranks; tp 4 x pp 2 at rank 0 has
    TP group [0..3] and PP group [0, 4], first stage, neighbours 4 and 4; tp 2 x pp 4 at rank 6 has TP group
    [6, 7], PP group [0, 2, 4, 6], last stage, previous stage rank 4, next 0."""
    m = kvcm.Mapping(tp_size=8)
    assert m.world_size == 8 and m.tp_group(0) == list(range(8)) and m.pp_group(0) == [0]
    m = kvcm.Mapping(tp_size=4, pp_size=2)
    assert (m.tp_group(0), m.pp_group(0), m.pp_rank(0)) == ([0, 1, 2, 3], [0, 4], 0)
    assert (m.prev_pp_rank(0), m.next_pp_rank(0)) == (4, 4)
    m = kvcm.Mapping(tp_size=2, pp_size=4)
    assert (m.tp_group(6), m.pp_group(6), m.pp_rank(6), m.tp_rank(6)) == ([6, 7], [0, 2, 4, 6], 3, 0)
    assert (m.prev_pp_rank(6), m.next_pp_rank(6)) == (4, 0)


@pytest.mark.parametrize("num_layers, pp, sizes", [(64, 3, [22, 21, 21]), (43, 2, [22, 21]), (28, 4, [7] * 4),
                                                   (5, 5, [1] * 5)])
def test_pp_layers_split_as_tensor_split(num_layers, pp, sizes):
    """``Mapping.pp_layers``: ``torch.tensor_split(torch.arange(num_layers), pp_size)[pp_rank]``, so the first
    ``num_layers % pp_size`` stages get one layer more, and the stages are consecutive runs."""
    m = kvcm.Mapping(pp_size=pp)
    stages = [m.pp_layers(num_layers, r) for r in range(pp)]
    assert [len(s) for s in stages] == sizes
    assert sum(stages, []) == list(range(num_layers))


def test_draft_layers_go_to_the_last_stage():
    """``get_pp_layers``: the speculative layers (DeepSeek-V4's ``D - 1`` MTP layers, numbered after the model's)
    are appended to the last stage only. V4-Flash (43 layers) at pp 2 with D = 3: stage 0 holds layers 0-21,
    stage 1 layers 22-42 and MTP layers 43, 44."""
    spec = kvcm.DeepseekV4Spec().to_model_spec(max_draft_len=3)
    m = kvcm.Mapping(pp_size=2)
    held = [sorted({layer.model_layer for layer in spec.for_rank(m, r).layers}) for r in range(2)]
    assert held == [list(range(22)), list(range(22, 45))]


@pytest.mark.parametrize("kv_heads, tp, per_rank", [(8, 8, 1), (8, 4, 2), (8, 16, 1), (1, 4, 1), (8, 3, 3)])
def test_kv_heads_round_up_and_replicate(kv_heads, tp, per_rank):
    """``KVCacheManager.__init__``: ``(num_kv_heads + tp_size - 1) // tp_size`` heads a rank: split when the ranks
    divide them, replicated when there are fewer KV heads than ranks (8 over 16: one each; an MQA model's one
    head on every rank), rounded up otherwise (8 over 3: 3). Query heads: 48, which every tp here divides."""
    spec = ModelSpec.uniform(2, kv_heads, 128)
    spec = ModelSpec(spec.layers, num_attention_heads=48)
    rank = spec.for_rank(kvcm.Mapping(tp_size=tp))
    assert [layer.num_kv_heads for layer in rank.layers] == [per_rank, per_rank]
    assert rank.bytes_per_token() == 2 * 2 * per_rank * 128 * 2


def test_attention_dp_keeps_every_head():
    """``KVCacheManager.__init__`` and ``get_cache_size_per_token``: ``if mapping.enable_attention_dp: tp_size =
    1``, so each attention-DP rank keeps all 8 KV heads of Seed-OSS-36B; ``MappingBase.dp_size`` is tp_size."""
    spec = kvcm.load_spec("seed-oss-36b")
    m = kvcm.Mapping(tp_size=8, enable_attention_dp=True)
    assert (m.attn_tp_size, m.dp_size) == (1, 8)
    assert spec.for_rank(m).bytes_per_token() == spec.bytes_per_token() == 64 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_mla_latent_is_replicated(tp):
    """``_util.py`` builds the MLA cache with ``num_kv_heads=1`` and ``head_dim = kv_lora_rank +
    qk_rope_head_dim`` (``ceil(1 / tp) = 1``), and ``get_cache_size_per_token``'s MLA branch never divides by
    tp: every rank stores the whole 576-wide latent, 4 x 576 x 2 = 4608 bytes a token, at any tp."""
    rank = _mla().for_rank(kvcm.Mapping(tp_size=tp))
    assert [(layer.num_kv_heads, layer.entry_width) for layer in rank.layers] == [(1, 576)] * 4
    assert rank.bytes_per_token() == 4608


def test_rank_bytes_per_token_as_get_cache_bytes_per_token():
    """``get_cache_bytes_per_token``: ``kv_factor * sum(num_kv_heads_per_layer) * head_dim * dtype`` over the
    rank's own layers. Seed-OSS-36B at tp 4 x pp 3: stage 0 holds 22 layers of 2 heads, 2 x 44 x 128 x 2 = 22528
    bytes a token; stages 1, 2 hold 21 (21504). A V1 manager of stage 1 sizes 72 GiB at 21 KiB a token:
    72 GiB / (32 x 21504) = 112,347 blocks."""
    spec, m = kvcm.load_spec("seed-oss-36b"), kvcm.Mapping(tp_size=4, pp_size=3)
    assert [spec.for_rank(m, r).bytes_per_token() for r in range(3)] == [22528, 21504, 21504]
    mgr = kvcm.create_kv_cache_manager("v1", spec, KvCacheConfig(max_gpu_total_bytes=72 * GiB), max_batch_size=4,
                                       max_seq_len=8192, device="meta", mapping=m, pp_rank=1)
    assert (mgr.model.num_layers, mgr.layer_groups[0].num_blocks) == (21, 72 * GiB // (32 * 21504))


@pytest.mark.parametrize("mapping, field, fragment", [
    (dict(tp_size=3), "tp_size", "must divide the model's 80 attention heads"),
    (dict(tp_size=160), "tp_size", "must divide the model's 80 attention heads"),
    (dict(pp_size=65), "pp_size", "must be <= the model's 64 layers"),
])
def test_refused_as_upstream_refuses(mapping, field, fragment):
    """``Attention.__init__`` asserts ``num_heads % tp_size == 0`` (query heads; KV heads round up instead) and
    ``Mapping.pp_layers`` asserts "pp size cannot be larger than num_hidden_layers"; with attention DP the
    attention's tp_size is 1, so tp 3 is fine there."""
    spec = kvcm.load_spec("seed-oss-36b")
    with pytest.raises(ConfigError, match=fragment) as err:
        spec.for_rank(kvcm.Mapping(**mapping))
    assert err.value.field == field
    assert spec.for_rank(kvcm.Mapping(tp_size=3, enable_attention_dp=True)).num_layers == 64
