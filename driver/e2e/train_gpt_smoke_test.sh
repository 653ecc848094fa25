#!/usr/bin/env bash
# train_gpt through the launcher: 2 pipeline stages, a few steps on a small
# generated corpus; checks the run directory and that a bad config fails
# before any worker starts, with a message naming the field.
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"

"$BIN" --config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" \
  --steps=6 --sample_tokens=16 --set=eval_interval=3,lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2,trace_steps=3 \
  > "$TMP/out.log" 2>&1 || { cat "$TMP/out.log"; echo "FAIL: train_gpt exited non-zero"; exit 1; }
cat "$TMP/out.log"
RUN=$(ls -d "$TMP"/runs/gpt_small_pp2-*)
for f in config.textproto metrics.jsonl loss.svg trace.json sample.txt; do
  [[ -s $RUN/$f ]] || { echo "FAIL: $RUN/$f missing or empty"; exit 1; }
done
[[ $(wc -l < "$RUN/metrics.jsonl") -eq 6 ]] || { echo "FAIL: expected 6 metrics lines"; exit 1; }
# trace_steps=3: steps 2, 3, 4 (0-based, from the default trace_step 2) in
# traces/, the first of them also as trace.json.
[[ $(ls "$RUN/traces") == $'step_2.json\nstep_3.json\nstep_4.json' ]] ||
  { echo "FAIL: traces/ holds $(ls "$RUN/traces")"; exit 1; }
cmp -s "$RUN/trace.json" "$RUN/traces/step_2.json" || { echo "FAIL: trace.json is not step 2's"; exit 1; }
grep -q '"eval_loss"' "$RUN/metrics.jsonl" || { echo "FAIL: no eval loss in metrics"; exit 1; }
# The loss falls by a clear margin within the 6 steps.
first=$(head -n1 "$RUN/metrics.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(tail -n1 "$RUN/metrics.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || { echo "FAIL: loss $first -> $last"; exit 1; }
grep -q 'width: 32' "$RUN/config.textproto" || { echo "FAIL: override not in resolved config"; exit 1; }
# Both stages ran: the launcher started 2 workers, and rank 1's part of the step
# trace reached rank 0 (a bubble per rank); rank 1 itself prints nothing by design.
grep -q '\[launcher\] starting 2 worker(s)' "$TMP/out.log" || { echo "FAIL: launcher did not start 2 workers"; exit 1; }
grep -qE '"bubble":\[[^],]+,[^],]+\]' "$RUN/metrics.jsonl" || { echo "FAIL: no bubble for both ranks"; exit 1; }
grep -q 'done: 6 steps' "$TMP/out.log" || { echo "FAIL: no summary line"; exit 1; }
# The report names the BLAS, its kernel and the CPU (issue #43).
grep -qE '^\[rank 0\] BLAS .+, kernel [A-Za-z0-9_]+.*, CPU .+ \(' "$TMP/out.log" || { echo "FAIL: no BLAS kernel line"; exit 1; }
grep -q '<svg' "$RUN/loss.svg" || { echo "FAIL: loss.svg is not SVG"; exit 1; }

# The peer benchmark's synthetic data needs no corpus and is learnable; the
# config's threads reach the workers (over OPENBLAS_NUM_THREADS=1 above) and
# each worker reports what the libraries read back.
"$BIN" --config=experiments/configs/gpt_small_pp2.textproto --data=/no/such/corpus --output_dir="$TMP/synthetic" \
  --steps=30 --lr=0.01 --sample_tokens=0 --eval_interval=0 --set=data.source=synthetic,threads.intra_op=1,threads.blas=2,lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2 \
  > "$TMP/synthetic.log" 2>&1 || { cat "$TMP/synthetic.log"; echo "FAIL: synthetic train_gpt exited non-zero"; exit 1; }
cat "$TMP/synthetic.log"
grep -q 'synthetic data (arithmetic progressions' "$TMP/synthetic.log" || { echo "FAIL: no synthetic data line"; exit 1; }
for rank in 0 1; do
  grep -q "\[launcher\] rank $rank threads: 1 intra-op + 2 BLAS thread(s)" "$TMP/synthetic.log" || { echo "FAIL: rank $rank threads"; exit 1; }
done
SRUN=$(ls -d "$TMP"/synthetic/gpt_small_pp2-*)
first=$(head -n1 "$SRUN/metrics.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(tail -n1 "$SRUN/metrics.jsonl" | sed 's/.*"loss":\([0-9.]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || { echo "FAIL: synthetic loss $first -> $last"; exit 1; }

# Bad configs: exit code 2 from the launcher, before any worker.
set +e
"$BIN" --config=experiments/configs/gpt_small_pp2.textproto --schedule=zigzag > "$TMP/bad.log" 2>&1
code=$?
set -e
cat "$TMP/bad.log"
[[ $code -eq 2 ]] || { echo "FAIL: bad schedule exited $code, want 2"; exit 1; }
grep -q "parallelism.schedule 'zigzag' is not a registered schedule; valid: " "$TMP/bad.log" || { echo "FAIL: message"; exit 1; }
if grep -q '\[launcher\] starting' "$TMP/bad.log"; then echo "FAIL: workers were started"; exit 1; fi
echo PASS
