# Sourced by ci/vllm_venv.sh, ci/sglang_venv.sh and ci/transformers_venv.sh, the steps they share: each builds a venv
# outside the checkout from wheels kept in one cache, stamps it with a key of what it was built from, and rebuilds
# only when the key changes; a directory it did not make is refused, never removed (ci/owned_dir.sh). The sourcing
# script sets ROOT, VENV, CACHE, PY and SPEC first, and names its venv variable (KVCM_VLLM_VENV, ...) where it refuses.
#
#   venv_key ITEM...              16 hex digits of the items and the interpreter's version: the stamp's key
#   venv_up_to_date NAME PROBE    the venv holds the stamp of $key and PROBE (Python) runs in it: say so, print its
#                                 path and succeed (the script then exits)
#   venv_refuse_foreign VAR       refuse $VENV unless it is ours, before any download; make the cache folder
#   venv_fill_cache MARKER WHAT CMD...  run CMD (the downloads) unless $CACHE/MARKER says a run finished, then mark it
#   venv_create VAR               remove our old $VENV, make and stamp it, create the venv
#   venv_finish NAME PROBE        PROBE and the plugin import in the new venv, the stamp of $key, its path printed
. "$(dirname "${BASH_SOURCE[0]}")/owned_dir.sh"

venv_key() {
    printf '%s\n' "$@" "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16
}

venv_up_to_date() {
    [[ -f "$VENV/.kvcm-built-from" && "$(cat "$VENV/.kvcm-built-from")" == "$key" ]] || return 1
    "$VENV/bin/python" -c "$2" 2>/dev/null || return 1
    echo "$1 venv up to date ($SPEC)" >&2
    echo "$VENV"
}

venv_refuse_foreign() {
    check_own_dir "$VENV" "$(basename "$0") ($1)"
    mkdir -p "$CACHE"
    venv_t0=$SECONDS
}

venv_fill_cache() {
    local marker=$CACHE/$1 what=$2
    shift 2
    if [[ ! -f "$marker" ]]; then
        echo "filling the wheel cache $CACHE $what" >&2
        "$@"
        touch "$marker"
    fi
}

venv_create() {
    claim_dir "$VENV" "$(basename "$0") ($1)"
    "$PY" -m venv "$VENV"
}

venv_finish() {
    PYTHONPATH="$ROOT" "$VENV/bin/python" -c "$2; import pytest_kvcm.plugin" >&2
    echo "$key" > "$VENV/.kvcm-built-from"
    echo "$1 venv built in $((SECONDS - venv_t0)) s ($SPEC)" >&2
    echo "$VENV"
}
