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

key=$(printf '%s\n' "${REQS[@]}" "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
stamp="$VENV/.kvcm-built-from"
probe='import transformers.generation.continuous_batching.scheduler'
if [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]] && "$VENV/bin/python" -c "$probe" 2>/dev/null; then
    echo "transformers venv up to date ($SPEC)" >&2
    echo "$VENV"
    exit 0
fi

. "$ROOT/ci/owned_dir.sh"
check_own_dir "$VENV" "$(basename "$0") (KVCM_TRANSFORMERS_VENV)"
mkdir -p "$CACHE"
cached="$CACHE/.complete-transformers-$key"
t0=$SECONDS
if [[ ! -f "$cached" ]]; then
    echo "filling the wheel cache $CACHE with $SPEC and its dependencies (once)" >&2
    "$PY" -m pip wheel -q --find-links "$CACHE" -w "$CACHE" "${REQS[@]}" >&2
    touch "$cached"
fi

claim_dir "$VENV" "$(basename "$0") (KVCM_TRANSFORMERS_VENV)"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE" "${REQS[@]}" >&2
PYTHONPATH="$ROOT" "$VENV/bin/python" -c "$probe; import pytest_kvcm.plugin" >&2
echo "$key" > "$stamp"
echo "transformers venv built in $((SECONDS - t0)) s ($SPEC)" >&2
echo "$VENV"
