"""Parallel deployments: which layers and which KV one GPU (a *rank*) holds, as TensorRT-LLM computes them.

A model served on ``tp_size x pp_size`` GPUs is cut two ways (TensorRT-LLM ``tensorrt_llm/mapping.py``,
``Mapping``, with ``cp_size = 1``):

* **pipeline parallelism** gives each stage a run of layers: ``pp_layers`` splits the model's layers as
  ``torch.tensor_split`` does, the first ``num_layers % pp_size`` stages one layer more. Layers past the model's
  own (MTP / draft layers) go to the last stage (``resource_manager.py`` ``get_pp_layers``).
* **tensor parallelism** splits each attention layer's heads over the ``tp_size`` ranks of a stage. A rank keeps
  ``ceil(num_kv_heads / tp)`` KV heads (``KVCacheManager.__init__``: ``(num_kv_heads + tp_size - 1) //
  tp_size``), so a model with fewer KV heads than ranks replicates them. An MLA latent (and every DeepSeek-V4
  role) is one head shared by all query heads: every rank stores all of it (``_util.py`` builds the MLA cache
  with ``num_kv_heads=1``).
* **attention data parallelism** (``enable_attention_dp``): each of the ``tp_size`` ranks runs attention for its
  own requests with every head (the KV manager's ``tp_size`` is 1), so the deployment holds ``dp_size =
  tp_size`` separate pools, each its own requests.

The per-rank sizing is then the single-GPU sizing of a smaller model (:func:`shard`), so V1, V2 and DeepSeek-V4
managers size a rank exactly as they size one GPU. The split's decisions (KV heads a rank keeps, whether a latent
is split) are the manager's policy's (``kvcm.policy``: ``kv_heads_per_rank``, ``latent_sharded``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from pydantic import Field, Strict

from .errors import ConfigError
from .policy import Decisions, resolve, rule, setting
from .validation import Int, config_dataclass

PositiveInt = Annotated[Int, Field(ge=1, description="must be an integer >= 1")]


@config_dataclass
class Mapping:
    """The shape of a deployment: ``tp_size`` ranks per pipeline stage, ``pp_size`` stages.

    Ranks are numbered as TensorRT-LLM's ``MpiTopology`` numbers them (``cp_size = 1``): ``tp_rank = rank %
    tp_size``, ``pp_rank = rank // tp_size``; a TP group is consecutive ranks, a PP group every ``tp_size``-th.
    """

    tp_size: PositiveInt = 1
    pp_size: PositiveInt = 1
    enable_attention_dp: Annotated[bool, Strict()] = False

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def attn_tp_size(self) -> int:
        """Ranks that split one layer's KV: 1 with attention DP (``tp_size = 1`` in ``KVCacheManager``)."""
        return 1 if self.enable_attention_dp else self.tp_size

    @property
    def dp_size(self) -> int:
        """Separate KV pools per stage, each its own requests (``MappingBase.dp_size``)."""
        return self.tp_size if self.enable_attention_dp else 1

    def _rank(self, rank: int) -> int:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ConfigError("rank", rank, f"must be an integer in [0, {self.world_size - 1}] (world_size "
                              f"{self.world_size} = tp_size {self.tp_size} x pp_size {self.pp_size})")
        return rank

    def tp_rank(self, rank: int) -> int:
        return self._rank(rank) % self.tp_size

    def pp_rank(self, rank: int) -> int:
        return self._rank(rank) // self.tp_size

    def tp_group(self, rank: int) -> list[int]:
        first = self.pp_rank(rank) * self.tp_size
        return list(range(first, first + self.tp_size))

    def pp_group(self, rank: int) -> list[int]:
        return list(range(self.tp_rank(rank), self.world_size, self.tp_size))

    def prev_pp_rank(self, rank: int) -> int:
        return (self._rank(rank) - self.tp_size) % self.world_size

    def next_pp_rank(self, rank: int) -> int:
        return (self._rank(rank) + self.tp_size) % self.world_size

    def pp_layers(self, num_layers: int, pp_rank: int) -> list[int]:
        """The layers of stage ``pp_rank``: ``torch.tensor_split(arange(num_layers), pp_size)[pp_rank]``."""
        check_layers(self, num_layers)
        if not isinstance(pp_rank, int) or isinstance(pp_rank, bool) or not 0 <= pp_rank < self.pp_size:
            raise ConfigError("pp_rank", pp_rank, f"must be an integer in [0, {self.pp_size - 1}]")
        base, extra = divmod(num_layers, self.pp_size)
        start = pp_rank * base + min(pp_rank, extra)
        return list(range(start, start + base + (pp_rank < extra)))

    def as_dict(self) -> dict:
        return {"tp_size": self.tp_size, "pp_size": self.pp_size, "enable_attention_dp": self.enable_attention_dp,
                "world_size": self.world_size, "attn_tp_size": self.attn_tp_size, "dp_size": self.dp_size}


def check_layers(mapping: Mapping, num_layers: int) -> None:
    """``pp_size <= num_layers`` (``Mapping.pp_layers``: "pp size cannot be larger than num_hidden_layers")."""
    if mapping.pp_size > num_layers:
        raise ConfigError("pp_size", mapping.pp_size, f"must be <= the model's {num_layers} layers (a pipeline stage "
                          "needs at least one layer; TensorRT-LLM Mapping.pp_layers)")


def check_heads(mapping: Mapping, num_attention_heads: int | None) -> None:
    """Query heads must split evenly over the attention TP ranks (TensorRT-LLM ``Attention.__init__`` asserts
    ``num_heads % tp_size == 0``; with attention DP its ``tp_size`` is 1). KV heads need not: they round up."""
    tp = mapping.attn_tp_size
    if num_attention_heads is not None and num_attention_heads % tp:
        divisors = [d for d in range(1, num_attention_heads + 1) if num_attention_heads % d == 0]
        raise ConfigError("tp_size", mapping.tp_size, f"must divide the model's {num_attention_heads} attention "
                          f"heads (one of {', '.join(map(str, divisors))}), or use attention DP")


def model_layer_of(spec, index: int) -> int:
    layer = spec.layers[index]
    return index if layer.model_layer is None else layer.model_layer


def num_model_layers(spec) -> int:
    """The layers ``pp_layers`` splits: the spec's ``num_model_layers``, or one per distinct model layer."""
    if spec.num_model_layers is not None:
        return spec.num_model_layers
    return max(model_layer_of(spec, i) for i in range(len(spec.layers))) + 1


def shard_layer(layer, attn_tp: int, policy=None):
    """One layer as one rank stores it: its share of the KV heads, or the whole latent (MLA, V4 roles)."""
    policy = resolve(policy)
    if layer.is_mla or layer.role != "KV":
        ways = attn_tp if policy.latent_sharded else 1
        if ways == 1:
            return layer
        return replace(layer, head_dim=max(1, layer.head_dim // ways),
                       kv_lora_rank=None if layer.kv_lora_rank is None else max(1, layer.kv_lora_rank // ways),
                       qk_rope_head_dim=None if layer.qk_rope_head_dim is None else layer.qk_rope_head_dim // ways)
    heads = policy.kv_heads_per_rank(layer.num_kv_heads, attn_tp)
    if heads < 1:
        raise ConfigError("num_kv_heads", heads, f"per rank must be >= 1 ({layer.num_kv_heads} KV heads over "
                          f"{attn_tp} attention-TP ranks)")
    return replace(layer, num_kv_heads=heads)


def stage_layers(spec, mapping: Mapping, pp_rank: int) -> list[int]:
    """Indices into ``spec.layers`` that stage ``pp_rank`` holds: its model layers, plus the layers past the
    model's own on the last stage (``get_pp_layers`` appends the speculative layers there)."""
    n = num_model_layers(spec)
    local = set(mapping.pp_layers(n, pp_rank))
    last = pp_rank == mapping.pp_size - 1
    return [i for i in range(len(spec.layers))
            if model_layer_of(spec, i) in local or (last and model_layer_of(spec, i) >= n)]


def shard(spec, mapping: Mapping, pp_rank: int = 0, policy=None):
    """The ``ModelSpec`` one rank of stage ``pp_rank`` sizes its cache for (every TP rank of a stage holds the
    same shape). Checks the mapping against the model first; ``ConfigError`` names the field and the limit.
    ``policy``: the manager's (None: the active one)."""
    policy = resolve(policy)
    check_heads(mapping, spec.num_attention_heads)
    keep = stage_layers(spec, mapping, pp_rank)
    layers = tuple(shard_layer(spec.layers[i], mapping.attn_tp_size, policy) for i in keep)
    return replace(spec, layers=layers, num_model_layers=num_model_layers(spec))


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class ParallelDecisions(Decisions):
    SUBSYSTEM = "parallel ranks"

    @rule("KV heads one rank keeps of a layer's num_kv_heads over attn_tp attention-TP ranks: rounded up, so heads "
          "are replicated when there are fewer than ranks (TensorRT-LLM resource_manager.py KVCacheManager.__init__: "
          "(num_kv_heads + tp_size - 1) // tp_size; PR #3002 fixed a kv_head_num of 0 when the ranks outnumbered "
          "the KV heads of an MQA model)")
    def kv_heads_per_rank(num_kv_heads: int, attn_tp: int) -> int:
        return -(-num_kv_heads // attn_tp)

    latent_sharded = setting(
        False, "whether one latent entry (MLA's kv_lora_rank + rope, every DeepSeek-V4 role) is split over the "
        "attention-TP ranks: no, every rank stores all of it (TensorRT-LLM _util.py builds the MLA cache with "
        "num_kv_heads=1; tenstorrent/tt-xla #5861 budgeted the replicated latent as sharded, a tp_size-fold "
        "over-commit)")
