#!/usr/bin/env bash
# train_gpt's observability (issue 15) through the launcher, pp=2: TensorBoard
# read back by the real TensorBoard against metrics.jsonl, per-rank logs with
# every action of a step at --v=1 (rank 1 silent on the console but for the
# launcher's thread report), operator profiles and the merged trace,
# memory per rank that grows with the micro-batch size, errors on the console
# and in the log of each rank that hit them, and bad
# --profile_steps refused before any worker starts.
set -euo pipefail
BIN=$1 CHECK=$2 READBACK=$3 TRACE_SVG=$4
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
SMALL="--set=eval_interval=3,lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32"

run() {  # run NAME LOG ARGS...
  local name=$1 log=$2
  shift 2
  "$BIN" --config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" \
    --name="$name" "$SMALL" "$@" > "$log" 2>&1 || { cat "$log"; echo "FAIL: train_gpt $name exited non-zero"; exit 1; }
}

run obs "$TMP/obs.log" --steps=6 --sample_tokens=16 --micro_batch_size=2 --v=1 --profile_steps=2:3
cat "$TMP/obs.log"
python3 "$CHECK" "$(ls -d "$TMP"/runs/obs-*)" "$TMP/obs.log" "$READBACK" --profile
# The merged trace draws: both lanes, the actions' tracks, actions and the
# operators that ran in them (tooltips name the action).
"$TRACE_SVG" --trace="$(ls -d "$TMP"/runs/obs-*)/profile/merged.json" --out="$TMP/step2.svg" --step=2 \
  --min_span_px=0
for want in '>rank 0<' '>rank 1<' '>pipe actions<' '<title>0F0 ' '<title>1B3 ' \
            '<title>aten::[a-z_]+ .* in 0F[0-9]</title>' '<title>[A-Za-z]+Backward0 .* in 1B[0-9]</title>'; do
  grep -qE "$want" "$TMP/step2.svg" || { echo "FAIL: the merged trace's SVG lacks /$want/"; exit 1; }
done

run big "$TMP/big.log" --steps=2 --sample_tokens=0 --micro_batch_size=8
python3 "$CHECK" --memory-grows "$(ls -d "$TMP"/runs/obs-*)" "$(ls -d "$TMP"/runs/big-*)"

# An error reaches the console of every rank that hit it ("[rank N] error: ...")
# and that rank's log as an E line: SGD at lr 10 without clipping diverges
# (seeded) within 8 steps, and nonfinite.policy=fail stops every rank.
set +e
"$BIN" --config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" \
  --name=err --sample_tokens=0 --steps=20 --lr=10 \
  --set=optimizer.name=sgd,optimizer.max_grad_norm=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0,eval_interval=0,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2,nonfinite.policy=fail \
  > "$TMP/err.log" 2>&1
code=$?
set -e
cat "$TMP/err.log"
[[ $code -ne 0 ]] || { echo "FAIL: a diverging run exited 0"; exit 1; }
for r in 0 1; do
  grep -qE "^\[rank $r\] error: .*is not finite" "$TMP/err.log" ||
    { echo "FAIL: rank $r's error is not on its console"; exit 1; }
  grep -qE "^E[0-9]{4} [0-9:.]+ rank=$r stage=$r data=0 [a-z_]+\.cc:[0-9]+\] .*is not finite" \
    "$(ls -d "$TMP"/runs/err-*)/logs/rank_$r.log" || { echo "FAIL: rank $r's error is not in its log"; exit 1; }
done

# Bad profile ranges: exit 2 from the launcher, naming the value, no worker.
for bad in 0:2 5:7 3:2 x; do
  set +e
  "$BIN" --config=experiments/configs/gpt_small_pp2.textproto "$SMALL" --steps=6 --profile_steps=$bad > "$TMP/bad.log" 2>&1
  code=$?
  set -e
  cat "$TMP/bad.log"
  [[ $code -eq 2 ]] || { echo "FAIL: --profile_steps=$bad exited $code, want 2"; exit 1; }
  grep -q "^error: .*profile.steps.*$bad" "$TMP/bad.log" || { echo "FAIL: message for $bad"; exit 1; }
  if grep -q '\[launcher\] starting' "$TMP/bad.log"; then echo "FAIL: workers were started"; exit 1; fi
done
echo PASS
