"""The engine API's input checks: what ``LLM``, ``LLM.generate``, ``SamplingParams`` and the drafters accept.

Users of this API come from vLLM's ``LLM`` and transformers' ``generate``, so the forms those libraries take are
accepted (a string prompt with a tokenizer, one prompt not wrapped in a list, vLLM's ``{"prompt_token_ids":
...}`` and ``{"prompt": ...}`` dicts, a 1-D or 2-D integer tensor of ids, a dict of sampling fields, a local model
directory); everything else raises ``kvcm.ConfigError`` naming the argument, the value and the limit before any
page is allocated or any forward runs. Before these checks a bad value surfaced as an ``AttributeError`` on
``model.to``, an ``IndexError`` deep in the embedding, or was accepted (negative or float token ids ran; a bool
for ``overlap`` or a pool size was taken as truthy).

``generate`` runs these every call, so the common case (a list of plain ``int`` lists) costs one type test and a
``min``/``max`` per prompt; only a bad value pays for the explanation.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch

from .. import validation
from . import triton_attention
from ..errors import ConfigError


def _kind(value) -> str:
    """A short name for a value too large to print (a model, a tensor)."""
    return value if isinstance(value, (str, int, float, type(None))) else type(value).__name__


def load_model(model, tokenizer):
    """``model`` as a causal LM module, and the tokenizer: a loaded model passes through; a local directory
    (``save_pretrained``'s output, what vLLM's ``LLM(model=path)`` reads) is loaded from disk only, with its
    tokenizer when it has one and none was given. Anything else is a ``ConfigError``."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ConfigError("model", path, "must be a loaded causal LM or a local model directory holding "
                                             "config.json (nothing is downloaded)")
        from transformers import AutoModelForCausalLM, AutoTokenizer
        loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        if tokenizer is None and any(os.path.isfile(os.path.join(path, f))
                                     for f in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = loaded
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise ConfigError("model", _kind(model), "must be a transformers causal LM (a torch.nn.Module with a "
                                                 ".config) or a local model directory")
    check_tokenizer(tokenizer)
    return model, tokenizer


def check_tokenizer(tokenizer) -> None:
    if tokenizer is not None and not (callable(getattr(tokenizer, "encode", None))
                                      and callable(getattr(tokenizer, "decode", None))):
        raise ConfigError("tokenizer", _kind(tokenizer), "must be None or have encode() and decode() "
                                                         "(a transformers tokenizer)")


def check_prefill_block_m(block_m, model, what: str = "") -> None:
    """None, or a query tile the kernel takes for ``model``'s heads (a draft model's too: ``what`` names it)."""
    if block_m is None:
        return
    if type(block_m) is not int:
        raise ConfigError("prefill_block_m", block_m, "must be None (the kernel's least tile) or an integer, not "
                                                      f"{type(block_m).__name__}")
    cfg = model.config
    heads = cfg.num_attention_heads
    try:
        triton_attention.tile_shape(heads, getattr(cfg, "num_key_value_heads", None) or heads, block_m)
    except ValueError as exc:        # the kernel's own rule, in its words
        raise ConfigError("prefill_block_m", block_m, f"must be None (the kernel's least tile) or{what} "
                          + str(exc).split(" must be ", 1)[1]) from None


def check_positions(field: str, length, model, what: str = "the model's") -> None:
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and type(length) is int and length > positions:
        raise ConfigError(field, length, f"must be <= {positions} ({what} max_position_embeddings)")


def int_list(field: str, values, low: int = 0, high: int | None = None, why: str = "") -> tuple[int, ...]:
    """A list or tuple of integers in ``[low, high]``; a string or a lone int is not a list."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise ConfigError(field, values, "must be a list of integers")
    return tuple(validation.count(f"{field}[{i}]", v, low, high, why) for i, v in enumerate(values))


def check_drafter(drafter, max_draft_len, model, prefill_block_m=None) -> None:
    """A drafter needs ``max_draft_len >= 1``; a draft model must share the target's vocabulary, and its caches
    take the target's kernel options, so its heads must suit ``prefill_block_m`` too."""
    if drafter is None:
        return
    if isinstance(max_draft_len, bool) or not isinstance(max_draft_len, int) or max_draft_len < 1:
        raise ConfigError("max_draft_len", max_draft_len, f"needs max_draft_len >= 1 with drafter={_kind(drafter)!r}")
    if isinstance(drafter, torch.nn.Module):
        config = getattr(drafter, "config", None)
        if config is None:
            raise ConfigError("drafter", _kind(drafter), "a draft model must be a transformers causal LM")
        if config.vocab_size != model.config.vocab_size:
            raise ConfigError("drafter.config.vocab_size", config.vocab_size,
                              f"must equal the target's vocab_size={model.config.vocab_size}: the draft must "
                              f"share the target's tokenizer")
        check_prefill_block_m(prefill_block_m, drafter, " (for the draft model)")
    elif isinstance(drafter, str) and drafter != "ngram":
        raise ConfigError("drafter", drafter, "expected 'ngram', an NgramDrafter or a draft model")
    elif not isinstance(drafter, str) and not callable(getattr(drafter, "draft", None)):
        raise ConfigError("drafter", _kind(drafter), "expected 'ngram', an NgramDrafter or a draft model")


def sampling_params(params, cls):
    """None, a ``SamplingParams`` or a dict of its fields (transformers' ``generate`` takes keywords)."""
    if params is None:
        return cls()
    if isinstance(params, cls):
        return params
    if isinstance(params, Mapping):
        return cls(**params)
    raise ConfigError("params", _kind(params), "must be a kvcm.engine.SamplingParams, a dict of its fields "
                                               "or None")


def _one_prompt(i: int, prompt, tokenizer, vocab_size: int) -> list[int]:
    field = f"prompts[{i}]"
    if isinstance(prompt, Mapping):
        if "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
        else:
            raise ConfigError(field, dict(prompt), "a dict prompt needs 'prompt_token_ids' or 'prompt'")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ConfigError(field, prompt, "a string prompt needs a tokenizer: pass tokenizer= to LLM, or "
                                             "give token ids")
        prompt = tokenizer.encode(prompt)
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.is_floating_point() or prompt.dtype == torch.bool:
            raise ConfigError(field, f"tensor{list(prompt.shape)} {prompt.dtype}", "must be a 1-D integer tensor")
        prompt = prompt.tolist()
    elif isinstance(prompt, bytes) or not isinstance(prompt, Sequence):
        raise ConfigError(field, _kind(prompt), "must be a list of token ids, a string (with a tokenizer) or "
                                                "a vLLM prompt dict")
    ids = list(prompt)
    if not ids:
        raise ConfigError(field, ids, "must hold at least one token")
    if not set(map(type, ids)) <= {int}:     # at C speed: a few-shot batch holds millions of ids
        ids = [validation.count(f"{field}[{j}]", t) for j, t in enumerate(ids)]
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        j = next(j for j, t in enumerate(ids) if t < 0 or t >= vocab_size)
        raise ConfigError(f"{field}[{j}]", ids[j], f"must be a token id in [0, {vocab_size - 1}] (the model's "
                                                   f"vocab_size is {vocab_size})")
    return ids


def prompts(value, tokenizer, vocab_size: int, max_seq_len: int) -> list[list[int]]:
    """Every prompt as a list of token ids in ``[0, vocab_size)`` shorter than ``max_seq_len``. One prompt
    (a string, a list of ints, a 1-D tensor, a dict) is a batch of one; a 2-D tensor is one prompt a row."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 2:
            value = list(value)
        elif value.dim() == 1:
            value = [value]
        else:
            raise ConfigError("prompts", f"tensor{list(value.shape)}", "a tensor of ids must be 1-D or 2-D")
    elif isinstance(value, (str, Mapping)):
        value = [value]
    elif isinstance(value, Sequence) and value and all(type(t) is int for t in value):
        value = [value]
    elif value is None or isinstance(value, bytes) or not isinstance(value, Sequence):
        raise ConfigError("prompts", _kind(value), "must be a list of prompts (token-id lists, strings with a "
                                                   "tokenizer, vLLM prompt dicts) or one prompt")
    out = [_one_prompt(i, p, tokenizer, vocab_size) for i, p in enumerate(value)]
    for i, ids in enumerate(out):
        if len(ids) >= max_seq_len:
            raise ConfigError(f"len(prompts[{i}])", len(ids), f"must be below max_seq_len={max_seq_len}")
    return out
