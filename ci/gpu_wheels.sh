#!/usr/bin/env bash
# Wheels the GPU lane needs that the GPU machine's image lacks, for a machine that cannot reach a registry.
#
#   bash ci/gpu_wheels.sh stage [DEST]      # here (with PyPI): download into DEST (default .whl, git-ignored)
#   bash ci/gpu_wheels.sh install [DEST]    # there: install DEST's wheels into /tmp/site, then
#   export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
#
# What they unlock in `pytest --kvcm-lane=l0_h200`: the project itself (pydantic validates its configs), the
# GSM8K accuracy gates and the data-set tests (datasets), the GGUF model loader (gguf), the lane's stage files
# (pytest-split: ci/gpu_lane.sh passes its options on every run) and, with
# GPU_WHEELS=all, the dashboard test (selenium, ~12 MiB; it still needs a browser, see ci/install_browser.sh).
# Only what the image lacks is carried: its pyarrow, pandas, fsspec, xxhash, huggingface-hub,
# requests, certifi, urllib3, attrs, h11 and the rest of datasets' and selenium's needs are already there
# (pyarrow alone would be ~40 MiB of the 64 MiB a device call may carry; a device call is one command sent to
# the GPU machine together with a copy of the working tree and the staged paths it names, 64 MiB in all). Pins: the versions the CPU lane
# runs, inside datasets' own bounds (dill<0.4.2, multiprocess<0.70.20).
# Target: PY_VERSION (default 3.12, the image's python3) on manylinux x86-64; every wheel here is pure Python
# except multiprocess and pydantic-core, whose wheels are per Python version.
set -euo pipefail
cmd=${1:-}
dest=${2:-.whl}
WHEELS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  pytest-split==0.11.0
  gguf==0.19.0
)
if [ "${GPU_WHEELS:-core}" = all ]; then
  WHEELS+=(selenium==4.51.0 trio==0.35.0 trio-websocket==0.12.2 outcome==1.3.0.post0 sniffio==1.3.1 wsproto==1.3.2
           websocket-client==1.9.2 PySocks==1.7.1)
fi
LIMIT_MIB=17   # leaves the rest of a call's 64 MiB for the model half that travels beside it

case "$cmd" in
  stage)
    case "$dest" in /*|*..*) echo "gpu_wheels: DEST must be a folder inside the repository (it travels)" >&2; exit 2;; esac
    root=$(git rev-parse --show-toplevel)
    . "$root/ci/owned_dir.sh"   # DEST is removed and made again: only when this script made it
    (cd "$root" && check_own_dir "$dest" gpu_wheels)
    exclude="$(git rev-parse --git-common-dir)/info/exclude"
    mkdir -p "$(dirname "$exclude")"
    grep -qx "/${dest#./}/" "$exclude" 2>/dev/null || echo "/${dest#./}/" >> "$exclude"
    cd "$root"
    claim_dir "$dest" gpu_wheels
    py=${PY_VERSION:-3.12}
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
      platforms+=(--platform "$p")
    done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
      "${platforms[@]}" -d "$dest" "${WHEELS[@]}"
    mib=$(( $(du -sb "$dest" | cut -f1) / 1048576 ))
    ls "$dest"
    if [ "$mib" -ge "$LIMIT_MIB" ]; then
      echo "gpu_wheels: $dest holds ${mib} MiB, over the ${LIMIT_MIB} MiB left beside a model half" >&2
      exit 1
    fi
    echo "gpu_wheels: ${#WHEELS[@]} wheels, ${mib} MiB in $dest (python $py); carry \"$dest\" in the device call"
    ;;
  install)
    ls "$dest"/*.whl >/dev/null 2>&1 || { echo "gpu_wheels: no wheels in $dest (carry it)" >&2; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$dest"/*.whl
    PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} python3 -c \
      "import pydantic, datasets, gguf; print('gpu_wheels: pydantic', pydantic.__version__, 'datasets', datasets.__version__)"
    ;;
  *)
    echo "usage: bash ci/gpu_wheels.sh stage|install [DEST]" >&2
    exit 2
    ;;
esac
