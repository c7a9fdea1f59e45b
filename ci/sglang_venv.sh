#!/usr/bin/env bash
# Builds the separate virtual environment in which the SGLang contract target runs (`--kvcm-target=sglang`).
#
# Why a separate venv and why `--no-deps`: the pinned sglang release pins torch==2.14.1 (CUDA) and a long list of serving
# packages (flashinfer, sgl-kernel, xgrammar, ...). The target drives only its memory pools and radix cache
# (sglang.srt.mem_cache) on device="cpu", so the venv holds the CPU torch this project uses (2.13.0, installed
# first so nothing can replace it), sglang itself without its requirements, and then only the packages that the
# mem_cache modules import when they load (found by importing them until nothing is missing; mostly pure Python,
# plus triton, which sglang's kernels module imports at top level although the CPU pools never launch a kernel).
#
# Why a torchvision stub: sglang/srt/configs/__init__.py imports every model config, and two of them
# (deepseek_ocr, internvl via multimodal/internvl_utils) import torchvision.transforms at module level for image
# preprocessing. No torchvision build loads against this CPU torch 2.13, and the pools never touch images, so the
# stub provides just the names those imports bind (transforms, transforms.functional, InterpolationMode) and
# raises on any real use.
#
# Wheels are fetched once into $KVCM_WHEEL_CACHE (shared with ci/vllm_venv.sh); a finished venv is stamped with
# what it was built from (a directory without this script's stamp is never removed: ci/owned_dir.sh), so a second run with nothing changed only re-checks the imports.
# First build measured here: ~8 minutes with an empty wheel cache on an idle machine (751 s on 2026-12-04 with
# other jobs running), 315 s from a filled one; up to date: 14 s.
#
#   KVCM_SGLANG_VENV  where the venv goes          (default: ~/.cache/kvcm/venv-sglang)
#   KVCM_WHEEL_CACHE  where the wheels are kept    (default: ~/.cache/kvcm/wheels)
#   KVCM_SGLANG_SPEC  the SGLang requirement       (default: the release pytest_kvcm/targets/declared.py pins)
#   PYTHON            the interpreter for the venv (default: python3)
#
# Prints the venv's path on its last line: `VENV=$(bash ci/sglang_venv.sh | tail -1)`; then
#   PYTHONPATH=$PWD "$VENV/bin/python" -m pytest -p pytest_kvcm.plugin --pyargs pytest_kvcm.contract --kvcm-target=sglang
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${KVCM_SGLANG_VENV:-$HOME/.cache/kvcm/venv-sglang}
CACHE=${KVCM_WHEEL_CACHE:-$HOME/.cache/kvcm/wheels}
PY=${PYTHON:-python3}
SPEC=${KVCM_SGLANG_SPEC:-$("$PY" "$ROOT/pytest_kvcm/targets/declared.py" sglang)}

BASE=("torch==2.13.0" "numpy" "pytest>=8" "hypothesis>=6" "pyyaml>=6")
# What importing sglang.srt.mem_cache.{allocator,memory_pool,swa_memory_pool,radix_cache} asks for, at the pinned release.
# transformers at the version sglang pins (its configs subclass transformers' config classes).
MEMCACHE=(orjson psutil pybase64 requests triton pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp dill
          apache-tvm-ffi sentencepiece compressed-tensors gguf
          "transformers==5.19.0")

. "$ROOT/ci/venv_lib.sh"
key=$(venv_key "$SPEC" "${BASE[@]}" "${MEMCACHE[@]}" stub-3)
probe='import sglang.srt.mem_cache.allocator, sglang.srt.mem_cache.memory_pool, sglang.srt.mem_cache.swa_memory_pool, sglang.srt.mem_cache.radix_cache'
venv_up_to_date sglang "$probe" && exit 0

venv_refuse_foreign KVCM_SGLANG_VENV    # before the download, the install or any removal
fill() {
    "$PY" -m pip wheel -q --find-links "$CACHE" -w "$CACHE" "${BASE[@]}" >&2
    "$PY" -m pip wheel -q --no-deps --find-links "$CACHE" -w "$CACHE" "$SPEC" >&2
    "$PY" -m pip wheel -q --find-links "$CACHE" -w "$CACHE" "torch==2.13.0" "${MEMCACHE[@]}" >&2
}
venv_fill_cache ".complete-sglang-$key" "for $SPEC (once; minutes)" fill
venv_create KVCM_SGLANG_VENV
pip_() { "$VENV/bin/python" -m pip "$@"; }
pip_ install -q --no-index --find-links "$CACHE" "${BASE[@]}" >&2
pip_ install -q --no-index --no-deps --find-links "$CACHE" "$SPEC" >&2
pip_ install -q --no-index --find-links "$CACHE" "torch==2.13.0" "${MEMCACHE[@]}" >&2

site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# One file per module name that is imported at load time (sglang's configs: transforms, transforms.functional;
# transformers' image_utils, which imports torchvision once it finds the package: io). Every other name resolves
# to a placeholder that raises when called, so nothing can silently run image code on the stub.
stub() {  # stub MODULE_PATH: a module whose unknown names are placeholders
    mkdir -p "$(dirname "$site/$1")"
    cat > "$site/$1" <<'PY'
"""Stub written by ci/sglang_venv.sh: sglang's config modules import torchvision for image preprocessing only, and
no torchvision build loads against this CPU torch. The KV pools never touch images; any call here raises."""
import enum

__version__ = "0.0.0+kvcm-stub"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    NEAREST_EXACT = "nearest-exact"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    RGB = 3


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{__name__}.{name}: torchvision is a stub in the kvcm SGLang venv (ci/sglang_venv.sh)")

    return unavailable
PY
}
for m in torchvision/__init__.py torchvision/io.py torchvision/transforms/__init__.py \
         torchvision/transforms/functional.py torchvision/transforms/v2/__init__.py \
         torchvision/transforms/v2/functional.py; do stub "$m"; done
venv_finish sglang "$probe"
