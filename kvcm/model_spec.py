"""What a manager serves: the attention layers of a model and the bytes their KV takes per token."""

from __future__ import annotations

from dataclasses import field, replace
from typing import Annotated, Literal

import torch
from pydantic import BeforeValidator, Field, Strict

from .config import dtype_bytes, resolve_dtype
from .errors import ConfigError
from .parallel import shard
from .versions import NAMES
from .validation import MAX_LAYERS, MAX_LAYERS_WHY, Int, config_dataclass, count


def _layer_dtype(value) -> torch.dtype:
    return resolve_dtype(value, "LayerSpec.dtype")


PositiveInt = Annotated[Int, Field(ge=1)]
Flag = Annotated[bool, Strict()]


@config_dataclass
class LayerSpec:
    """One attention layer's KV: heads x head_dim per token, or one MLA latent of ``kv_lora_rank + rope`` width.

    ``entries_per_token`` < 1 models compressed roles that keep one entry per ``1 / entries_per_token`` tokens.
    ``role`` names what the layer stores (plain ``KV`` for ordinary models, DeepSeek-V4 role names otherwise).
    """

    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    dtype: Annotated[torch.dtype, BeforeValidator(_layer_dtype)] = torch.bfloat16
    sliding_window: PositiveInt | None = Field(None, description="must be >= 1 or None")
    sink_tokens: Annotated[Int, Field(ge=0)] = 0
    # Llama 4's chunked local attention: a query reads only its own chunk of this many positions
    attention_chunk: PositiveInt | None = Field(None, description="must be >= 1 or None")
    kv_lora_rank: PositiveInt | None = None
    qk_rope_head_dim: Annotated[Int, Field(ge=0)] | None = None
    compress_ratio: PositiveInt = 1
    role: str = "KV"
    model_layer: Annotated[Int, Field(ge=0)] | None = None
    fixed_dtype: Flag = False  # keeps its dtype when the cache config sets one (V4's fp32 compressor states)

    def __post_init__(self):
        if self.sliding_window is not None and self.attention_chunk is not None:
            raise ConfigError("attention_chunk", self.attention_chunk, f"a layer is sliding-window or chunked-local, not "
                              f"both (sliding_window={self.sliding_window} was given too; transformers gives each "
                              f"layer one of layer_types)")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_factor(self) -> int:
        """2 for separate K and V; 1 for one latent (MLA) or a single-tensor role."""
        return 1 if self.is_mla or self.role != "KV" else 2

    @property
    def entry_width(self) -> int:
        if self.is_mla:
            return self.kv_lora_rank + (self.qk_rope_head_dim or 0)
        return self.num_kv_heads * self.head_dim

    @property
    def bytes_per_entry(self) -> int:
        return self.kv_factor * self.entry_width * dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """docs/semantics.md 2: ``kv_factor * num_kv_heads * head_dim * dtype_bytes`` (MLA: latent width, factor 1)."""
        if self.compress_ratio != 1:
            raise ConfigError("compress_ratio", self.compress_ratio, "has no per-token size; use bytes_per_block")
        return self.bytes_per_entry

    def bytes_per_block(self, tokens_per_block: int) -> int:
        return self.bytes_per_entry * (tokens_per_block // self.compress_ratio)

    def kv_shape(self, tokens_per_block: int) -> tuple[int, ...]:
        """Shape of one block of this layer, as the engine indexes it: [kv_factor, slots, heads, dim]."""
        heads, dim = (1, self.entry_width) if self.is_mla else (self.num_kv_heads, self.head_dim)
        return (self.kv_factor, tokens_per_block // self.compress_ratio, heads, dim)


@config_dataclass
class ModelSpec:
    """The attention layers of a model, in layer order.

    ``preferred_manager`` is the model's declared manager version for ``create_kv_cache_manager('auto', ...)``.
    ``num_attention_heads`` (query heads) bounds tensor parallelism; ``num_model_layers`` is what pipeline
    parallelism splits (None: one per distinct ``model_layer``; layers past it, such as MTP layers, go to the last
    stage). Both matter only to :meth:`for_rank`.
    """

    layers: Annotated[tuple[LayerSpec, ...], Field(min_length=1)] = Field(
        description="a model needs at least one attention layer (a tuple of LayerSpec)")
    name: str = "model"
    max_position_embeddings: PositiveInt | None = None
    preferred_manager: Literal[NAMES] | None = Field(None, description=f"one of None, {', '.join(map(repr, NAMES))}")
    extra: dict = field(default_factory=dict, compare=False)
    num_attention_heads: PositiveInt | None = None
    num_model_layers: PositiveInt | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def bytes_per_token(self) -> int:
        return sum(layer.bytes_per_token for layer in self.layers)

    def for_rank(self, mapping, pp_rank: int = 0, policy=None) -> "ModelSpec":
        """What one rank of pipeline stage ``pp_rank`` stores under ``mapping`` (a ``kvcm.parallel.Mapping``):
        its stage's layers, each with its share of the KV heads (``kvcm.parallel.shard``; ``policy``: the
        manager's decisions, None the active ones)."""
        return shard(self, mapping, pp_rank, policy)

    def with_dtype(self, dtype) -> "ModelSpec":
        """The same layers with every KV stored in ``dtype`` (the cache config's dtype)."""
        dtype = resolve_dtype(dtype)
        return replace(self, layers=tuple(layer if layer.fixed_dtype else replace(layer, dtype=dtype)
                                          for layer in self.layers))

    @classmethod
    def uniform(cls, num_layers: int, num_kv_heads: int, head_dim: int, dtype="bfloat16", sliding_window=None,
                name: str = "uniform", attention_chunk=None) -> "ModelSpec":
        num_layers = count("num_layers", num_layers, 1, MAX_LAYERS, MAX_LAYERS_WHY)
        layer = LayerSpec(num_kv_heads, head_dim, dtype, sliding_window, attention_chunk=attention_chunk)
        return cls(tuple(replace(layer, model_layer=i) for i in range(num_layers)), name=name)

    @classmethod
    def from_hf_config(cls, config) -> "ModelSpec":
        """Read a transformers config object or a ``config.json`` dict.

        Handles Llama, Qwen2/3 (``use_sliding_window`` / ``max_window_layers``), Mistral (``sliding_window``),
        Gemma-style per-layer ``layer_types`` / ``sliding_window_pattern`` and DeepSeek MLA (``kv_lora_rank``).
        """
        cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        if "text_config" in cfg and "num_hidden_layers" not in cfg:
            cfg = dict(cfg["text_config"])
        model_type = cfg.get("model_type", "")
        if model_type == "deepseek_v4":
            raise ConfigError("model_type", model_type, "use kvcm.DeepseekV4Spec.from_hf_config for DeepSeek-V4")
        required = ("num_hidden_layers", "num_attention_heads") + (() if cfg.get("head_dim") else ("hidden_size",))
        for key in required:
            if cfg.get(key) is None:
                raise ConfigError(key, None, "is required in the model config")
        n = count("num_hidden_layers", cfg["num_hidden_layers"], 1, MAX_LAYERS, MAX_LAYERS_WHY)
        heads = count("num_attention_heads", cfg["num_attention_heads"], 1)
        kv_heads = count("num_key_value_heads", cfg.get("num_key_value_heads") or heads, 1)
        head_dim = cfg.get("head_dim") or count("hidden_size", cfg["hidden_size"], 1) // heads
        dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
        dtype = "bfloat16" if str(dtype).removeprefix("torch.") not in (
            "float16", "float32", "bfloat16") else str(dtype).removeprefix("torch.")
        cfg = _llama4_layer_types(cfg, n)
        windows, chunks = _sliding_layers(cfg, n), _chunked_layers(cfg, n)
        mla = cfg.get("kv_lora_rank")
        layers = []
        for i in range(n):
            if mla:
                layers.append(LayerSpec(1, int(mla) + int(cfg.get("qk_rope_head_dim") or 0), dtype,
                                        kv_lora_rank=int(mla), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
                                        model_layer=i))
            else:
                layers.append(LayerSpec(kv_heads, int(head_dim), dtype, windows[i], model_layer=i,
                                        attention_chunk=chunks[i]))
        return cls(tuple(layers), name=cfg.get("_name_or_path") or cfg.get("name") or model_type or "model",
                   max_position_embeddings=cfg.get("max_position_embeddings"),
                   preferred_manager=cfg.get("kv_cache_manager_version"), num_attention_heads=heads)


LLAMA4_CHUNK = 8192
"""``Llama4TextConfig.attention_chunk_size``'s default, taken when a Llama 4 config has no such key."""


def _llama4_layer_types(cfg: dict, n: int) -> dict:
    """A Llama 4 text config as ``Llama4TextConfig.__post_init__`` completes it (transformers 5.24): no
    ``layer_types`` are derived from ``no_rope_layers`` (a RoPE layer, 1, is chunked; a NoPE one, 0, full), which when
    empty or absent is a NoPE layer every ``no_rope_layer_interval`` (4) layers; no ``attention_chunk_size`` key is
    8192, and null makes every layer full. Checkpoints ship config.json files without ``layer_types``."""
    if cfg.get("model_type") != "llama4_text":
        return cfg
    cfg = {"attention_chunk_size": LLAMA4_CHUNK} | cfg
    if not cfg.get("layer_types"):
        interval = count("no_rope_layer_interval", cfg.get("no_rope_layer_interval", 4), 1)
        rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        if len(rope) != n:
            raise ConfigError("no_rope_layers", len(rope), f"must list num_hidden_layers={n} entries (0: a NoPE "
                              f"layer, full attention; 1: a RoPE layer, chunked)")
        chunked = cfg["attention_chunk_size"] is not None
        cfg["layer_types"] = ["chunked_attention" if r and chunked else "full_attention" for r in rope]
    return cfg


def _chunked_layers(cfg: dict, n: int) -> list[int | None]:
    """Per layer the attention chunk of a ``"chunked_attention"`` layer (Llama 4's ``layer_types`` with its
    ``attention_chunk_size``), else None. A chunk size is set whatever its value (transformers reads 0 as set,
    then its mask divides by it), so one below 1 is refused, and chunked layers without one too."""
    chunk, types = cfg.get("attention_chunk_size"), cfg.get("layer_types")
    if not types or "chunked_attention" not in types:
        return [None] * n
    if chunk is None:
        raise ConfigError("attention_chunk_size", None, "must be set: layer_types names chunked_attention layers")
    chunk = count("attention_chunk_size", chunk, 1)
    return [chunk if t == "chunked_attention" else None for t in types]


def _sliding_layers(cfg: dict, n: int) -> list[int | None]:
    """Per layer the sliding window, or None for full attention."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types:
        if len(types) != n:
            raise ConfigError("layer_types", len(types), f"must list num_hidden_layers={n} entries")
        return [window if t == "sliding_attention" and window else None for t in types]
    if not window:
        return [None] * n
    if "use_sliding_window" in cfg:  # Qwen2 / Qwen3: off unless asked; layers past max_window_layers slide
        if not cfg["use_sliding_window"]:
            return [None] * n
        start = int(cfg.get("max_window_layers") or 0)
        return [window if i >= start else None for i in range(n)]
    pattern = cfg.get("sliding_window_pattern")
    if pattern:  # Gemma 3: every pattern-th layer is global
        return [None if (i + 1) % int(pattern) == 0 else window for i in range(n)]
    if cfg.get("model_type") == "gemma2":  # Gemma 2: even layers slide
        return [window if i % 2 == 0 else None for i in range(n)]
    return [window] * n
