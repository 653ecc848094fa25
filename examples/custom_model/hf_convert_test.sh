#!/usr/bin/env bash
# The custom model's Hugging Face conversion, from this package only: a short
# pp=2 run saves a checkpoint; this package's hf_convert exports it to a
# folder whose config.json fields and safetensors tensors (names, shapes,
# values) are the checkpoint's; the folder imports back (the model picked by
# config.json's model_type) to the same values, and training resumes from it.
set -euo pipefail
TRAIN=$1 CONVERT=$2 CHECK=$3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

"$TRAIN" --config=examples/custom_model/autoencoder_pp2.textproto --steps=3 --save_interval=3 \
  --output_dir="$TMP/runs" --name=ae > "$TMP/train.log" 2>&1 ||
  { cat "$TMP/train.log"; fail "train_autoencoder exited non-zero"; }
CKPT=$TMP/runs/checkpoints/ae
[[ -e $CKPT/latest ]] || fail "no checkpoint under $CKPT: $(ls -R "$TMP/runs" | head -20)"

"$CONVERT" export --checkpoint="$CKPT" --hf_dir="$TMP/hf" > "$TMP/export.log" 2>&1 ||
  { cat "$TMP/export.log"; fail "hf_convert export"; }
cat "$TMP/export.log"
grep -q "(tied_autoencoder) to $TMP/hf" "$TMP/export.log" || fail "export line"
"$CHECK" "$CKPT" "$TMP/hf" 2 || fail "the exported folder differs from the checkpoint"

# No --model: config.json's model_type picks the model.
"$CONVERT" import --hf_dir="$TMP/hf" --checkpoint="$TMP/imported" > "$TMP/import.log" 2>&1 ||
  { cat "$TMP/import.log"; fail "hf_convert import"; }
cat "$TMP/import.log"
grep -qx -- '--set=tied_autoencoder.blocks=2' "$TMP/import.log" || fail "import's overrides"
"$CHECK" "$CKPT" "$TMP/hf" 2 "$TMP/imported" || fail "the import differs from the checkpoint"

"$TRAIN" --config=examples/custom_model/autoencoder_pp2.textproto --steps=1 \
  --resume="$TMP/imported" --set=tied_autoencoder.blocks=2 --output_dir="$TMP/runs" \
  --name=from_import > "$TMP/resume.log" 2>&1 || { cat "$TMP/resume.log"; fail "resume"; }
grep -q 'resumed at step 0' "$TMP/resume.log" || { cat "$TMP/resume.log"; fail "not resumed"; }

# A model this binary does not link: refused, naming the ones it converts.
set +e
"$CONVERT" import --model=gpt2 --hf_dir="$TMP/hf" --checkpoint="$TMP/other" > "$TMP/bad.log" 2>&1
code=$?
set -e
cat "$TMP/bad.log"
[[ $code -eq 2 ]] || fail "import --model=gpt2 exited $code, want 2"
grep -q 'Hugging Face import: tied_autoencoder (tied_autoencoder)' "$TMP/bad.log" ||
  fail "the refusal does not name the models with an import"
echo PASS
