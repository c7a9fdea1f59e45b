"""A GGUF de-quantized once into safetensors under ``~/.cache/kvcm/<prefix>-<digest>``, then loaded from there.

transformers reads the GGUF (with the ``gguf`` package) and de-quantizes every tensor type the file holds; the
copy is named by the GGUF's digest, so a different file never reuses a stale conversion, and it is complete
only once ``kvcm_meta.json`` is in it (written last, then the directory renamed into place: xdist workers and
two engines may race). A machine that only has a copied conversion (the GPU machine) loads it without the GGUF.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

META = "kvcm_meta.json"


class ModelNotInstalled(RuntimeError):
    """The model's weights are not on this machine; the message says how to install them."""


GGUF_MAGIC = b"GGUF"


def checked_gguf(path: Path, source: str) -> Path:
    """``path`` when it starts as a GGUF file does (``GGUF``), else ``ModelNotInstalled`` naming ``source`` (the
    variable that named it): a corrupt or wrong file used to end in a trace from deep inside transformers."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ModelNotInstalled(f"{source}: {path} cannot be read ({exc.strerror or exc})") from None
    if head != GGUF_MAGIC:
        raise ModelNotInstalled(f"{source}: {path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); "
                                "give the model's .gguf file or unset it")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("KVCM_CACHE_DIR") or Path.home() / ".cache" / "kvcm")


def file_digest(path: Path) -> str:
    """The first 16 hex digits of the file's sha256 (the name of its conversion)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def complete(cache_dir: Path) -> bool:
    return (cache_dir / META).is_file()


def converted(prefix: str) -> list[Path]:
    """Complete conversions named ``<prefix>-*`` in the cache root, oldest name first."""
    root = cache_root()
    return sorted(p for p in root.glob(f"{prefix}-*") if complete(p)) if root.is_dir() else []


def gguf_tensor_types(gguf: Path) -> list[str]:
    """The quantization types the file's tensors use (``Q4_K``, ``Q6_K``, ``F32`` ...), for the record."""
    from gguf import GGUFReader

    return sorted({t.tensor_type.name for t in GGUFReader(str(gguf)).tensors})


def cache_dir(gguf: Path | None, prefix: str, model_name: str, install_hint: str, convert_now: bool = True) -> Path:
    """The conversion of ``gguf`` (``<prefix>-<digest>``), made on first use unless ``convert_now`` is False.
    Without a GGUF, the first complete ``<prefix>-*`` conversion there is (a machine that only has a staged
    copy); with neither, ``ModelNotInstalled`` naming ``install_hint``."""
    if gguf is None:
        done = converted(prefix)
        if done:
            return done[0]
        raise ModelNotInstalled(f"{model_name} is not installed (no GGUF, no converted copy under {cache_root()}); "
                                f"install it with: {install_hint}")
    target = cache_root() / f"{prefix}-{file_digest(gguf)}"
    if complete(target) or not convert_now:
        return target
    return convert(gguf, target, model_name, install_hint)


def convert(gguf: Path, target: Path, model_name: str, install_hint: str) -> Path:
    """De-quantize ``gguf`` to fp32 safetensors (model + tokenizer) in ``target``; returns ``target``."""
    if complete(target):
        return target
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read the file)
    except ModuleNotFoundError as exc:
        raise ModelNotInstalled(f"converting {gguf.name} needs the `gguf` package: pip install 'gguf>=0.10' "
                                f"({install_hint})") from exc
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        try:
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        except Exception as exc:  # a damaged or truncated file past its magic: transformers' and gguf's own errors
            raise ModelNotInstalled(f"{gguf} cannot be read as {model_name}'s GGUF ({type(exc).__name__}: "
                                    f"{str(exc)[:200]}); give an intact file or reinstall: {install_hint}") from None
        # the weights are de-quantized now: drop the GGUF marker so a plain from_pretrained loads the copy
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        meta = {"gguf": str(gguf), "transformers": transformers.__version__, "model": model_name,
                "tensor_types": gguf_tensor_types(gguf)}
        (tmp / META).write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
