#!/usr/bin/env bash
# make_llama_data.sh [OUT_DIR] [CORPUS...]: llama_small_pp2's data in one
# command, offline. Trains a byte-level BPE tokenizer of 8192 tokens on the
# corpus (default: Debian's licence texts, /usr/share/common-licenses) and
# writes into OUT_DIR (default: data/llama_small in the repository):
#
#   tokenizer.json          Hugging Face `tokenizers` format
#   train.bin               flat uint16 token ids (nanoGPT's format)
#   train_megatron.bin/.idx the same tokens as Megatron's indexed dataset
#
# Then: ./bazelw run //experiments:train_llama. The Python packages come from
# the pinned torch-newest venv (tools/python_env.sh makes it once; its first
# making downloads from the Python package index). VOCAB_SIZE=N changes the
# vocabulary (set llama.vocab_size to match).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/data/llama_small}
shift || true
CORPUS=("$@")
[[ ${#CORPUS[@]} -gt 0 ]] || CORPUS=(/usr/share/common-licenses)
VOCAB_SIZE=${VOCAB_SIZE:-8192}
PYTHON="$("$ROOT/tools/python_env.sh" torch-newest)/bin/python"
TOOL="$ROOT/tools/data/tokens.py"
mkdir -p "$OUT"
"$PYTHON" "$TOOL" train --corpus "${CORPUS[@]}" --vocab_size "$VOCAB_SIZE" --out "$OUT/tokenizer.json"
"$PYTHON" "$TOOL" encode --tokenizer "$OUT/tokenizer.json" --corpus "${CORPUS[@]}" \
  --format flat --dtype uint16 --out "$OUT/train.bin"
"$PYTHON" "$TOOL" encode --tokenizer "$OUT/tokenizer.json" --corpus "${CORPUS[@]}" \
  --format megatron --dtype uint16 --out "$OUT/train_megatron"
echo "$OUT: tokenizer.json, train.bin, train_megatron.bin/.idx"
