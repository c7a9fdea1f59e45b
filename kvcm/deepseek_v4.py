"""DeepSeek-V4's cache: compressed, indexer and sliding roles, and the longest-decode constraint
(docs/semantics.md 5, after TensorRT-LLM's ``deepseek_v4/cache_manager.py``).

Every layer keeps a sliding window of W + D latent tokens. A layer with compress ratio r = 4 (compressed
sparse attention) also keeps compressed entries (one per 4 tokens) for its whole length plus its indexer's
(fp8 keys with per-128 fp32 scales), and fp32 overlap-compressor states, twice as wide, for the last
``2 * 4 + D`` tokens; r = 128 (heavily compressed) keeps one compressed entry per 128 tokens and its compressor
states inside the sliding window. Roles with the same life cycle share one pool, so V4 has up to three groups,
numbered as first seen: window ``W + D``, full length, window ``8 + D``.

The longest-decode constraint lives here and only here: in generic V2 it inflated every ordinary model's
estimation pool past its budget (docs/semantics.md 6).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import BeforeValidator, Field

from .config import KvCacheConfig
from .constraints import NamedConstraint, longest_decode
from .errors import ConfigError
from .limits import Limits
from .manager_v2 import KVCacheManagerV2
from .model_spec import LayerSpec, ModelSpec, PositiveInt
from .policy import Decisions, resolve, rule
from .validation import MAX_LAYERS, MAX_LAYERS_WHY, _integer, config_dataclass


def _flash_compress_ratios() -> tuple[int, ...]:
    """DeepSeek-V4-Flash's 43 layers: two heavily compressed, then CSA (4) and HCA (128) interleaved."""
    return (128, 128) + tuple(4 if i % 2 else 128 for i in range(41))


Ratio = Annotated[Literal[1, 4, 128], BeforeValidator(_integer)]


@config_dataclass
class DeepseekV4Spec:
    """The cache-relevant shape of a DeepSeek-V4 model; defaults are DeepSeek-V4-Flash's published config
    (transformers' ``DeepseekV4Config``: 43 layers, one 512-wide latent KV head, window 128, indexer head 128)."""

    compress_ratios: Annotated[tuple[Ratio, ...], Field(min_length=1, max_length=MAX_LAYERS)] = Field(
        default_factory=_flash_compress_ratios, description=f"1 to {MAX_LAYERS} layers, each ratio one of 1, 4, 128")
    window_size: PositiveInt = 128
    head_dim: PositiveInt = 512
    index_head_dim: PositiveInt = 128
    max_position_embeddings: PositiveInt = 1048576
    name: str = "DeepSeek-V4-Flash"
    indexer_k_dtype: Literal["fp8", "fp4"] = "fp8"
    num_attention_heads: PositiveInt = 64

    @classmethod
    def from_hf_config(cls, config) -> "DeepseekV4Spec":
        cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128, "sliding_attention": 1}
        rates.update(cfg.get("compress_rates") or {})
        if cfg.get("layer_types"):
            ratios = tuple(int(rates[t]) or 1 for t in cfg["layer_types"])
        elif cfg.get("compress_ratios"):
            ratios = tuple(int(r) or 1 for r in cfg["compress_ratios"])
        else:
            ratios = _flash_compress_ratios()
        return cls(ratios, int(cfg.get("sliding_window", 128)), int(cfg.get("head_dim", 512)),
                   int(cfg.get("index_head_dim", 128)), int(cfg.get("max_position_embeddings", 1048576)),
                   cfg.get("_name_or_path") or "deepseek_v4",
                   num_attention_heads=int(cfg.get("num_attention_heads", 64)))

    def layer_ratios(self, max_draft_len: int, policy=None) -> tuple[int, ...]:
        """Per cached layer its ratio: with drafts, ``D - 1`` MTP layers that repeat the last layer's ratio are
        cached too (TensorRT-LLM's ``DeepseekV4CacheManager.__init__``). ``policy``: None, the active one."""
        extra = resolve(policy).v4_mtp_layers(max_draft_len)
        if len(self.compress_ratios) + extra > MAX_LAYERS:
            raise ConfigError("max_draft_len", max_draft_len, f"caches D - 1 MTP layers beside the model's "
                              f"{len(self.compress_ratios)}, at most {MAX_LAYERS} in all ({MAX_LAYERS_WHY})")
        return self.compress_ratios + (self.compress_ratios[-1],) * extra

    @staticmethod
    def state_factor(ratio: int, policy=None) -> int:
        """The ratio-4 compressor overlaps its windows: its states are twice as wide (``is_overlap_compressor``)."""
        return resolve(policy).v4_state_factor(ratio)

    def indexer_entry_bytes(self, policy=None) -> int:
        """One compressed indexer key: fp8 values plus one fp32 scale per 128 (``fp4``: packed E2M1 values
        plus one byte per 32), TensorRT-LLM's ``get_token_bytes`` for INDEXER_COMPRESS."""
        return resolve(policy).v4_indexer_entry_bytes(self.index_head_dim, self.indexer_k_dtype)

    def to_model_spec(self, max_draft_len: int, policy=None) -> ModelSpec:
        """One LayerSpec per stored role, in TensorRT-LLM's order (``_build_cache_config``).

        Widths follow ``get_attn_dim``: the ratio-4 compressor overlaps its windows, so its compressor and
        indexer-compressor states are twice as wide; they are fp32 whatever the cache dtype. Compressed roles
        keep ``tpb // ratio`` entries a block. The KV dtype of SWA and COMPRESS comes from the cache config.
        """
        policy = resolve(policy)
        w, d, hd, ihd = self.window_size + max_draft_len, max_draft_len, self.head_dim, self.index_head_dim
        roles: list[LayerSpec] = []

        def add(layer, role, width, *, window=None, ratio=1, dtype=None):
            roles.append(LayerSpec(1, width, dtype or torch.bfloat16, window, compress_ratio=ratio, role=role,
                                   model_layer=layer, fixed_dtype=dtype is not None))

        for i, r in enumerate(self.layer_ratios(max_draft_len, policy)):
            state = self.state_factor(r, policy)
            add(i, "SWA", hd, window=w)
            if r == 4:
                add(i, "COMPRESS", hd, ratio=4)
                add(i, "INDEXER_COMPRESS", self.indexer_entry_bytes(policy), ratio=4, dtype=torch.float8_e4m3fn)
                for role, width in (("COMPRESSOR_KV", hd), ("COMPRESSOR_SCORE", hd), ("INDEXER_COMPRESSOR_KV", ihd),
                                    ("INDEXER_COMPRESSOR_SCORE", ihd)):
                    add(i, role, state * width, window=state * r + d, dtype=torch.float32)
            elif r == 128:
                add(i, "COMPRESSOR_KV", state * hd, window=w, dtype=torch.float32)
                add(i, "COMPRESSOR_SCORE", state * hd, window=w, dtype=torch.float32)
                add(i, "COMPRESS", hd, ratio=128)
        return ModelSpec(tuple(roles), name=self.name, max_position_embeddings=self.max_position_embeddings,
                         preferred_manager="v2", num_attention_heads=self.num_attention_heads,
                         num_model_layers=len(self.compress_ratios))


class DeepseekV4CacheManager(KVCacheManagerV2):
    """V2's manager with DeepSeek-V4's roles and constraints; no host tier (``kvcm.versions``: V2's ``deepseek_v4``
    entry says why)."""

    def __init__(self, spec: DeepseekV4Spec | None = None, kv_cache_config: KvCacheConfig | None = None,
                 limits: Limits | None = None, *, free_memory_bytes: int | None = None, mapping=None,
                 pp_rank: int = 0, policy=None, **limit_fields):
        spec = spec or DeepseekV4Spec()
        policy = resolve(policy)
        cfg = kv_cache_config or KvCacheConfig(tokens_per_block=128)
        if cfg.tokens_per_block not in (128, 256):
            raise ConfigError("tokens_per_block", cfg.tokens_per_block, "DeepSeek-V4 needs 128 or 256")
        self.v4_spec = spec
        limits = Limits.of(limits, **limit_fields)
        super().__init__(spec.to_model_spec(limits.max_draft_len, policy), cfg, limits,
                         free_memory_bytes=free_memory_bytes, mapping=mapping, pp_rank=pp_rank, policy=policy)

    def _typical_seq_len(self) -> int:
        """V4 always builds a typical step (unless a pool ratio is set): ``avg_seq_len or max_seq_len``."""
        return self.kv_cache_config.avg_seq_len or self.max_seq_len

    def _named_constraints(self) -> list[NamedConstraint]:
        """The inherited context constraint and the longest decode beside ``B - 1`` short requests.

        Only reached when ``kv_cache_config.pool_ratio is None``: the gate in ``_size_pools`` reads the same field
        the user set, so an explicit ratio means no constraints at all.
        """
        return super()._named_constraints() + [longest_decode(self.limits)]


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class DeepseekV4Decisions(Decisions):
    SUBSYSTEM = "DeepSeek-V4 bytes"

    @rule("how many MTP layers DeepSeek-V4 caches beside its own: max_draft_len - 1, repeating the last layer's "
          "ratio (DeepseekV4CacheManager.__init__)")
    def v4_mtp_layers(max_draft_len: int) -> int:
        return max(0, max_draft_len - 1)

    @rule("how much wider a compressor's fp32 states are than its head: twice for the overlapping ratio-4 one "
          "(get_attn_dim: state_factor 2 for is_overlap_compressor)")
    def v4_state_factor(ratio: int) -> int:
        return 2 if ratio == 4 else 1

    @rule("the bytes of one compressed indexer key: fp8 values and an fp32 scale per 128 (fp4: packed E2M1 values "
          "and a byte per 32), get_token_bytes for INDEXER_COMPRESS")
    def v4_indexer_entry_bytes(index_head_dim: int, indexer_k_dtype: str) -> int:
        ihd = index_head_dim
        return ihd + ihd // 128 * 4 if indexer_k_dtype == "fp8" else ihd // 2 + ihd // 32
