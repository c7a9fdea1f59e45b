"""Seeded random tiny models of each supported architecture, and truncated drafters.

* ``tiny_model``: 2-layer models for fast exact tests. Weights are drawn with a wide init so logits are peaked:
  greedy parity on random weights is only meaningful when the top-1/top-2 margins are far above fp32 rounding
  noise.
* ``truncated_drafter``: the first k decoder layers of a model, the cheap real drafter for speculative decoding.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

TINY_ARCHS = ("llama", "qwen3", "mistral", "qwen2")

_TINY_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Wide init: random 64-wide models with the usual 0.02 init emit nearly flat logits (margins ~1e-4), where
# fp32 summation order alone flips greedy choices. std 0.2 gives margins of order 1.
TINY_INIT_STD = 0.2


def _tiny_config(arch: str, overrides: dict):
    import transformers as tf

    kw = dict(_TINY_COMMON, initializer_range=TINY_INIT_STD)
    if arch == "llama":  # SmolLM2-shaped: tied embeddings, GQA
        cls, kw = tf.LlamaConfig, dict(kw, tie_word_embeddings=True, head_dim=16)
    elif arch == "qwen3":  # per-head q/k RMSNorm
        cls, kw = tf.Qwen3Config, dict(kw, tie_word_embeddings=False, head_dim=16, use_sliding_window=False)
    elif arch == "mistral":  # sliding window small enough for tests to run past it
        cls, kw = tf.MistralConfig, dict(kw, tie_word_embeddings=False, head_dim=16, sliding_window=16)
    elif arch == "qwen2":  # q/k/v bias
        cls, kw = tf.Qwen2Config, dict(kw, tie_word_embeddings=False, use_sliding_window=False)
    else:
        raise ValueError(f"tiny_model: arch={arch!r} is not supported; choose one of {TINY_ARCHS}")
    kw.update(overrides)
    return cls(**kw)


def tiny_model(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", attn_implementation: str = "sdpa", **overrides):
    """A seeded random tiny model -> ``(model, None)``. Same ``(arch, seed, overrides)`` -> same weights,
    whatever the global RNG state (the draw happens under a forked RNG)."""
    from transformers import AutoModelForCausalLM

    config = _tiny_config(arch, overrides)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Biases and norms keep their init; bias terms too get noise so qwen2's biases matter.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, TINY_INIT_STD)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model.to(device=device, dtype=dtype).eval(), None


def truncated_drafter(model, num_layers: int):
    """A copy of ``model`` keeping its first ``num_layers`` decoder layers, sharing (not copying) their weights,
    the embeddings, the final norm and lm_head. The weights are shared read-only: the drafter must never be
    trained. Its config reports the new layer count, so a kvcm ModelSpec built from it sizes its own pool."""
    layers = model.model.layers
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"truncated_drafter: num_layers={num_layers} must be in [1, {len(layers)}]")
    drafter = copy.copy(model)  # shallow: modules are shared
    drafter._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner.layers = nn.ModuleList(list(layers)[:num_layers])
    drafter.model = inner
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:num_layers]
    drafter.config = config
    inner.config = config
    return drafter


def tiny_llama4(chunk: int = 8, seed: int = 0, num_hidden_layers: int = 4, experts: int = 0):
    """A seeded random text-only Llama 4 (``Llama4ForCausalLM``) at toy size: chunked-local attention of
    ``chunk`` tokens on three layers of four, full attention (no RoPE) on every fourth, as Llama 4 Scout lays them
    out; dense MLPs, or with ``experts`` a top-1 mixture of that many on every other layer (Maverick's
    interleave); attention temperature tuning off (it acts from ``floor_scale``, 8,192 tokens; a test lowers it)."""
    import transformers as tf

    moe = list(range(1, num_hidden_layers, 2)) if experts else []
    cfg = tf.Llama4TextConfig(**dict(_TINY_COMMON, intermediate_size_mlp=128, num_hidden_layers=num_hidden_layers,
                                     head_dim=16, moe_layers=moe, num_local_experts=max(1, experts),
                                     num_experts_per_tok=1, attention_chunk_size=chunk,
                                     attn_temperature_tuning=False, tie_word_embeddings=False))
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.Llama4ForCausalLM(cfg).float().eval()
        with torch.no_grad():  # wide init, as tiny_model's: greedy margins far above fp32 rounding
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, TINY_INIT_STD)
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.generation_config.eos_token_id = cfg.eos_token_id
    return model
