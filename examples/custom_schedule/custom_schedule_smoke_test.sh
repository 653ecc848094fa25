#!/usr/bin/env bash
# The example schedule in the binaries built by pp_experiment_binary: the
# explorer lists and draws it, and train_gpt trains 3 steps with it on 2
# pipeline stages through the launcher.
set -euo pipefail
EXPLORER=$1
TRAIN=$2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

"$EXPLORER" --list | grep -q '^eager_1f1b' || fail "explorer --list lacks eager_1f1b"
"$EXPLORER" --list | grep -q '^1f1b' || fail "explorer --list lacks the built-in 1f1b"
[[ "$("$EXPLORER" --schedule=eager_1f1b --stages=2 --microbatches=3 --format=csv)" == \
   $'0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1F1,1B0,1F2,1B1,1B2' ]] || fail "eager_1f1b csv"

CORPUS=$TMP/corpus.txt
for i in $(seq 1 200); do echo "Stage $((i % 3)) warms up one micro-batch early."; done > "$CORPUS"
"$TRAIN" --schedule=eager_1f1b --pp=2 --microbatches=4 --steps=3 --data="$CORPUS" \
  --output_dir="$TMP/runs" --name=eager --sample_tokens=0 --eval_interval=0 \
  --set=lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2 \
  > "$TMP/out.log" 2>&1 || { cat "$TMP/out.log"; fail "train_gpt exited non-zero"; }
cat "$TMP/out.log"
RUN=$(ls -d "$TMP"/runs/eager-*)
grep -q 'schedule: "eager_1f1b"' "$RUN/config.textproto" || fail "config does not name eager_1f1b"
[[ $(wc -l < "$RUN/metrics.jsonl") -eq 3 ]] || fail "expected 3 metrics lines"
python3 - "$RUN/metrics.jsonl" <<'PY' || fail "losses"
import json, math, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1])]
assert len(losses) == 3 and all(math.isfinite(l) and 0 < l < 10 for l in losses), losses
PY
grep -q 'done: 3 steps' "$TMP/out.log" || fail "no summary line"
echo PASS
