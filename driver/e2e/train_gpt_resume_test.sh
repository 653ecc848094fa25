#!/usr/bin/env bash
# train_gpt --save_interval / --keep_last / --resume: 6 steps straight versus
# 4 steps saving every 2 (keeping 1), then a fresh launch with --resume=auto to
# step 6. Dropout is on; the per-step losses must be identical (a constant
# learning rate, since the schedule's length is --steps).
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" --sample_tokens=0
  --set=eval_interval=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0,gpt.dropout=0.1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2)
run() { must_run "$TMP/log" "$BIN" "${COMMON[@]}" "$@"; }
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"/metrics.jsonl; }

run --steps=6 --name=straight
run --steps=4 --save_interval=2 --keep_last=1 --name=resumed
CKPT=$TMP/runs/checkpoints/resumed
[[ $(cat "$CKPT/latest") == step_00000004 ]] || { echo "FAIL: latest is $(cat "$CKPT/latest")"; exit 1; }
[[ ! -e $CKPT/step_00000002 ]] || { echo "FAIL: keep_last=1 did not prune step 2"; exit 1; }
grep -q 'format_version: 1' "$CKPT/step_00000004/manifest.textproto" || { echo "FAIL: manifest"; exit 1; }
run --steps=6 --resume=auto --name=resumed
grep -q 'resumed at step 4' "$TMP/log" || { cat "$TMP/log"; echo "FAIL: did not resume at step 4"; exit 1; }

STRAIGHT=$(losses "$TMP"/runs/straight-*)
RESUMED=$(for d in $(ls -d "$TMP"/runs/resumed-* | sort); do losses "$d"; done)
echo "straight: $(echo $STRAIGHT)"
echo "resumed:  $(echo $RESUMED)"
[[ $(echo "$STRAIGHT" | wc -l) -eq 6 ]] || { echo "FAIL: expected 6 losses"; exit 1; }
[[ "$STRAIGHT" == "$RESUMED" ]] || { echo "FAIL: resumed losses differ from the straight run"; exit 1; }

# A path that is not a checkpoint is refused with its name.
set +e
"$BIN" "${COMMON[@]}" --steps=6 --resume="$TMP/runs" --name=bad > "$TMP/bad.log" 2>&1
code=$?
set -e
[[ $code -ne 0 ]] || { echo "FAIL: --resume of a non-checkpoint succeeded"; exit 1; }
grep -q "is not a checkpoint" "$TMP/bad.log" || { cat "$TMP/bad.log"; echo "FAIL: message"; exit 1; }
echo PASS
