#!/usr/bin/env bash
# The custom model through the experiment driver: pp=2 via the launcher, the
# run directory, a falling loss; and a bad config refused before any worker.
set -euo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" --config=examples/custom_model/autoencoder_pp2.textproto --steps=40 --output_dir="$TMP/runs" \
  > "$TMP/out.log" 2>&1 || { cat "$TMP/out.log"; fail "train_autoencoder exited non-zero"; }
cat "$TMP/out.log"
grep -q 'tied_autoencoder, pp=2 x dp=1, schedule 1f1b' "$TMP/out.log" || fail "header line"
grep -q 'Encoder \[tied code\]' "$TMP/out.log" || fail "partition report lacks the tied encoder"
RUN=$(ls -d "$TMP"/runs/autoencoder_pp2-*)
for f in config.textproto metrics.jsonl loss.svg trace.json; do
  [[ -s $RUN/$f ]] || fail "$RUN/$f missing or empty"
done
python3 - "$RUN/metrics.jsonl" <<'PY' || fail "loss did not fall"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 40, len(rows)
first, last = rows[0]["loss"], rows[-1]["loss"]
assert last < 0.3 * first, (first, last)
assert "eval_loss" in rows[-1], rows[-1]
PY

# A config with more stages than the model has layers: exit 2, no worker.
set +e
"$BIN" --config=examples/custom_model/autoencoder_pp2.textproto --pp=8 > "$TMP/bad.log" 2>&1
code=$?
set -e
cat "$TMP/bad.log"
[[ $code -eq 2 ]] || fail "bad config exited $code, want 2"
grep -q 'model parts, but the model has only 4 layers' "$TMP/bad.log" || fail "message"
if grep -q '\[launcher\] starting' "$TMP/bad.log"; then fail "workers were started"; fi

# The model reads its own config fields: 5 blocks are 7 layers.
set +e
"$BIN" --config=examples/custom_model/autoencoder_pp2.textproto --pp=8 \
  --set=tied_autoencoder.blocks=5 > "$TMP/bad.log" 2>&1
code=$?
set -e
cat "$TMP/bad.log"
[[ $code -eq 2 ]] || fail "bad config exited $code, want 2"
grep -q 'model parts, but the model has only 7 layers' "$TMP/bad.log" || fail "blocks not read"
echo PASS
