#!/usr/bin/env bash
# Builds the separate virtual environment in which the `hf-5.17` contract target runs: transformers 5.17, the
# release whose continuous-batching cache still allocates from one block pool, with the block count its scheduler
# decides (pytest_kvcm/targets/hf_blocks_target.py). The main venv carries a later transformers (the sector pool,
# the `hf` target), so 5.17 gets a venv of its own, as vLLM and SGLang do.
#
# The wheels are fetched once into $KVCM_WHEEL_CACHE (shared with ci/vllm_venv.sh and ci/sglang_venv.sh) and every
# later build installs offline from there; a finished venv is stamped with what it was built from (a directory
# without this script's stamp is never removed: ci/owned_dir.sh), so a second run with nothing changed returns in
# about a second. The project is not installed into it: run the suites with the checkout on the path:
#   PYTHONPATH=$PWD "$VENV/bin/python" -m pytest -p pytest_kvcm.plugin --pyargs pytest_kvcm.contract --kvcm-target=hf-5.17
#
#   KVCM_TRANSFORMERS_VENV  where the venv goes               (default: ~/.cache/kvcm/venv-transformers)
#   KVCM_WHEEL_CACHE        where the wheels are kept         (default: ~/.cache/kvcm/wheels)
#   KVCM_TRANSFORMERS_SPEC  the transformers requirement      (default: the release pytest_kvcm/targets/declared.py pins)
#   PYTHON                  the interpreter for the venv      (default: python3)
#
# Prints the venv's path on its last line: `VENV=$(bash ci/transformers_venv.sh | tail -1)`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${KVCM_TRANSFORMERS_VENV:-$HOME/.cache/kvcm/venv-transformers}
CACHE=${KVCM_WHEEL_CACHE:-$HOME/.cache/kvcm/wheels}
PY=${PYTHON:-python3}
SPEC=${KVCM_TRANSFORMERS_SPEC:-$("$PY" "$ROOT/pytest_kvcm/targets/declared.py" hf-5.17)}

# the CPU torch first in the list, so the resolver never reaches for a CUDA build; what kvcm and the plugin import;
# psutil, without which 5.17's cache sizes itself on a CPU from 0 bytes of memory ("more than available memory 0")
REQS=("torch==2.13.0" "$SPEC" "psutil" "numpy>=1.24" "pydantic>=2.5" "pytest>=8" "hypothesis>=6" "pyyaml>=6")

. "$ROOT/ci/venv_lib.sh"
key=$(venv_key "${REQS[@]}")
probe='import transformers.generation.continuous_batching.scheduler'
venv_up_to_date transformers "$probe" && exit 0

venv_refuse_foreign KVCM_TRANSFORMERS_VENV
venv_fill_cache ".complete-transformers-$key" "with $SPEC and its dependencies (once)" \
    "$PY" -m pip wheel -q --find-links "$CACHE" -w "$CACHE" "${REQS[@]}" >&2
venv_create KVCM_TRANSFORMERS_VENV
"$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE" "${REQS[@]}" >&2
venv_finish transformers "$probe"
