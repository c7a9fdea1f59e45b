# Sourced by the ci/ scripts that delete a directory to rebuild it (the vLLM and SGLang venvs, staged wheels and
# model parts). A directory a user names may hold their own files (KVCM_VLLM_VENV=~/work once lost a home
# directory's contents to `rm -rf`), so a script removes only what it made: a directory that is absent, empty,
# or holds the stamp the script wrote into it when it created it. Any other is refused with one line, before
# anything is installed or downloaded.
#
#   claim_dir DIR WHO     refuse DIR unless it is absent, empty or stamped; then remove it, create it empty and
#                         stamp it (DIR/.kvcm-made-by holds WHO), so an interrupted build is still ours to redo
#   check_own_dir DIR WHO the refusal alone (to refuse before a long download)
#   own_out_dir DIR WHO   for a folder a script writes its logs into (OUT): refuse DIR unless it is absent, empty
#                         or stamped, then create and stamp it, keeping what an earlier run of ours left there
# Stamps accepted: .kvcm-made-by, and .kvcm-built-from (what finished venvs of earlier versions hold).

check_own_dir() {
    local dir=$1 who=$2
    if [[ -L "$dir" ]]; then
        echo "$who: $dir is a symbolic link; refusing to replace it (give the directory's own path)" >&2
        exit 2
    fi
    [[ -e "$dir" ]] || return 0
    if [[ ! -d "$dir" ]]; then
        echo "$who: $dir is a file, not a directory this script made; refusing to remove it (move it or choose another path)" >&2
        exit 2
    fi
    [[ -f "$dir/.kvcm-made-by" || -f "$dir/.kvcm-built-from" ]] && return 0
    if [[ -n "$(ls -A "$dir" 2>/dev/null)" ]]; then
        echo "$who: $dir holds files this script did not make (no .kvcm-made-by stamp); refusing to remove it (move it or choose another path)" >&2
        exit 2
    fi
}

claim_dir() {
    local dir=$1 who=$2
    check_own_dir "$dir" "$who"
    rm -rf -- "$dir"
    mkdir -p -- "$dir"
    echo "$who" > "$dir/.kvcm-made-by"
}

own_out_dir() {
    local dir=$1 who=$2
    check_own_dir "$dir" "$who"
    mkdir -p -- "$dir"
    [[ -f "$dir/.kvcm-made-by" || -f "$dir/.kvcm-built-from" ]] || echo "$who" > "$dir/.kvcm-made-by"
}
