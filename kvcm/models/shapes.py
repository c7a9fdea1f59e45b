"""Seeded random models at the shapes of real ones: SmolLM2-135M, Gemma 3 270M and (in part) Llama 4 Scout.

A timing run or a GPU smoke test needs a model's shapes, not its weights, and nothing staged: these are built from
the configs alone. Every weight matrix is drawn wide (``std``, as ``tiny.py``'s models) so greedy choices stand
far above fp32 rounding: at the usual 0.02 a random model's logits are nearly flat, and the summation order alone
flips tokens.

* ``smollm2_shape``: ``SMOLLM2_135M`` (HuggingFaceTB/SmolLM2-135M's config.json: 30 layers of 576, 9 query heads
  and 3 KV heads of 64, tied embeddings over 49,152 ids); fewer layers on request.
* ``gemma3_shape``: the embedded ``gemma-3-270m`` config (``kvcm/configs``): 18 layers, five sliding (window 512)
  to one global, one KV head of 256, 262,144 ids; fewer layers keep the pattern's order, a shorter window on
  request. Its LM head is its own matrix (of the same shape), not the embeddings': with random tied weights every
  generated token predicts itself again (Gemma scales the embeddings by sqrt(640)), a run attention could get
  wrong without changing a token.
* ``llama4_shape``: a layer of Llama 4 Scout as ``transformers.Llama4TextConfig``'s defaults give it (they are
  meta-llama/Llama-4-Scout-17B-16E's): hidden 5,120, 40 query and 8 KV heads of 128, attention chunks of 8,192,
  queries and keys L2-normed, no RoPE and full attention on every fourth layer, attention temperature tuning
  from position 8,192, experts of 8,192 and dense MLPs of 16,384. The whole model (48 layers, 16 experts a layer,
  202,048 ids: 109B parameters) fits no one GPU, so it keeps the per-layer shapes with fewer layers (four: three
  chunked, one global), two experts (top-1, with the shared expert) on every other layer (Maverick's interleave:
  dense and mixture layers both present) and a vocabulary of 2,048 ids.
"""
from __future__ import annotations

import torch

from .tiny import TINY_INIT_STD, tiny_model

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                    rms_norm_eps=1e-5)
GEMMA3_INIT_STD = 0.15           # the tiny Gemma's: sandwich norms, embeddings scaled by sqrt(hidden)
LLAMA4_VOCAB = 2048


def smollm2_shape(*, num_hidden_layers: int = 30, seed: int = 0, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu"):
    """A random llama at SmolLM2-135M's shape (``tiny_model``'s init), with ``num_hidden_layers`` of its 30."""
    return tiny_model("llama", seed=seed, dtype=dtype, device=device,
                      **dict(SMOLLM2_135M, num_hidden_layers=num_hidden_layers))[0]


def _wide_init(model, std: float, seed: int, device) -> None:
    """Every weight matrix (and expert stack) ~ N(0, std), drawn on ``device`` from a seeded generator."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std, generator=gen)


def gemma3_shape(*, num_hidden_layers: int = 18, sliding_window: int | None = None, seed: int = 0,
                 device: str | torch.device = "cpu"):
    """A random ``Gemma3ForCausalLM`` from the embedded Gemma 3 270M config, fp32: its first ``num_hidden_layers``
    layer types (6 or more keep a global layer), its window unless ``sliding_window`` is given."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from ..embedded import load_config

    raw = load_config("gemma-3-270m")
    raw = {k: v for k, v in raw.items() if not k.startswith("_") and k not in ("architectures", "torch_dtype")}
    raw.update(num_hidden_layers=num_hidden_layers, layer_types=raw["layer_types"][:num_hidden_layers],
               tie_word_embeddings=False)
    if sliding_window is not None:
        raw["sliding_window"] = sliding_window
    cfg = Gemma3TextConfig(**raw)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = Gemma3ForCausalLM(cfg).float().eval()
    _wide_init(model, GEMMA3_INIT_STD, seed, device)
    return model


def llama4_shape(*, num_hidden_layers: int = 4, experts: int = 2, chunk: int = 8192, vocab_size: int = LLAMA4_VOCAB,
                 mlp_width: int | None = None, seed: int = 0, device: str | torch.device = "cpu"):
    """A random text-only ``Llama4ForCausalLM`` at Scout's per-layer shapes (module docstring), fp32. ``chunk``
    and ``mlp_width`` (both MLP widths) shrink a CPU run; every other shape stays Scout's."""
    import transformers as tf

    base = tf.Llama4TextConfig()
    widths = {} if mlp_width is None else dict(intermediate_size=mlp_width, intermediate_size_mlp=mlp_width)
    cfg = tf.Llama4TextConfig(**dict(
        vocab_size=vocab_size, num_hidden_layers=num_hidden_layers, attention_chunk_size=chunk,
        moe_layers=list(range(1, num_hidden_layers, 2)), num_local_experts=experts, num_experts_per_tok=1,
        floor_scale=min(chunk, base.floor_scale), max_position_embeddings=4 * 8192,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, **widths))
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = tf.Llama4ForCausalLM(cfg).float().eval()
    _wide_init(model, TINY_INIT_STD, seed, device)
    model.generation_config.pad_token_id = cfg.pad_token_id
    model.generation_config.eos_token_id = cfg.eos_token_id
    return model
