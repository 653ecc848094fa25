#!/usr/bin/env bash
# train_gpt --schedule=auto: measures its first steps under zb_h1 (zbv for 2
# chunks), synthesises, logs the comparison, saves the schedule as CSV in the
# run and checkpoint directories and trains on with it. Losses equal 1F1B's up
# to round-off (every schedule trains like sequential training); a resumed run
# reuses the saved schedule instead of measuring again and continues with the
# straight run's losses. A shape auto cannot synthesise is refused before launch.
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
SET=eval_interval=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2
BASE=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" --sample_tokens=0 --microbatches=4)
COMMON=("${BASE[@]}" --set=$SET)
run() { must_run "$TMP/log" "$BIN" "${COMMON[@]}" "$@"; }
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"/metrics.jsonl; }
close() {  # two loss lists equal to 1e-4 relative, line by line
  paste <(echo "$1") <(echo "$2") | awk '{d=$1-$2; if (d<0) d=-d; s=$1<0?-$1:$1; if (d>1e-4*s+1e-6) {print "differ: " $0; bad=1}} END {exit bad}'
}

run --steps=6 --schedule=1f1b --name=plain
run --steps=6 --schedule=auto --name=auto
grep -q "schedule auto: measured ms per virtual stage" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no measurement logged"; exit 1; }
grep -Eq "\] zb_h1 +[0-9.]+ " "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no comparison table"; exit 1; }
grep -Eq "chosen: (the synthesised schedule|[a-z0-9_]+ \(the synthesised schedule simulates no faster by more than 3%\))" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no choice logged"; exit 1; }
# The measured costs decide: a synthesised (or other registered) schedule is
# switched to and checked by measurement; a tie with zb_h1 keeps zb_h1 untried.
if grep -q "schedule auto: the synthesised schedule simulates no faster than zb_h1 by more than 3%; training on with zb_h1 (no trial)" "$TMP/log"; then
  ! grep -q "checked by measurement" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: a trial without a switch"; exit 1; }
else
  grep -Eq "schedule auto: training on with (the synthesised schedule|registered schedule [a-z0-9_]+)" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no switch"; exit 1; }
  grep -Eq "schedule auto: checked by measurement: [0-9.]+ ms per step [a-z0-9_]+ \(steps 4-5\) vs [0-9.]+ ms under zb_h1 \(steps 2-3\): (keeping the [a-z0-9_]+ schedule|going back to zb_h1)" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: the chosen schedule was not checked by measurement"; exit 1; }
fi
AUTO_DIR=$(ls -d "$TMP"/runs/auto-*)
[[ -s $AUTO_DIR/auto_schedule.csv ]] || { echo "FAIL: no auto_schedule.csv in the run directory"; exit 1; }
[[ -s $TMP/runs/checkpoints/auto/auto_schedule.csv ]] || { echo "FAIL: no auto_schedule.csv in the checkpoint directory"; exit 1; }
PLAIN=$(losses "$TMP"/runs/plain-*)
AUTO=$(losses "$AUTO_DIR")
echo "1f1b: $(echo $PLAIN)"; echo "auto: $(echo $AUTO)"
[[ $(echo "$AUTO" | wc -l) -eq 6 ]] || { echo "FAIL: expected 6 losses"; exit 1; }
close "$PLAIN" "$AUTO" || { echo "FAIL: auto's losses differ from 1f1b's"; exit 1; }

# The saved schedule is what the run trained on: training with it as a CSV
# file gives the same losses after the switch.
run --steps=6 --schedule=csv:"$AUTO_DIR/auto_schedule.csv" --name=fromcsv
close "$(losses "$TMP"/runs/fromcsv-* | tail -3)" "$(echo "$AUTO" | tail -3)" || { echo "FAIL: the saved CSV trains differently"; exit 1; }

# Two chunks: measured under zbv, synthesised in V placement.
run --steps=4 --schedule=auto --chunks=2 --name=autov
grep -Eq "schedule auto: (training on with|the synthesised schedule simulates no faster than zbv)" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no choice with 2 chunks"; exit 1; }
grep -Eq "\] zbv +[0-9.]+ " "$TMP/log" || { cat "$TMP/log"; echo "FAIL: zbv not compared"; exit 1; }
grep -q "stage_to_rank" "$(ls -d "$TMP"/runs/autov-*)/auto_schedule.csv" || { echo "FAIL: V placement not in the saved CSV"; exit 1; }

# Resume: 4 steps saving every 2, then --resume=auto to step 6 with the saved schedule.
run --steps=4 --schedule=auto --save_interval=2 --name=resumed
run --steps=6 --schedule=auto --resume=auto --name=resumed
grep -q "resumed with the schedule saved in" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: resume did not reuse the saved schedule"; exit 1; }
! grep -q "schedule auto: measured" "$TMP/log" || { echo "FAIL: resume measured again"; exit 1; }
RESUMED=$(for d in $(ls -d "$TMP"/runs/resumed-* | sort); do losses "$d"; done)
close "$AUTO" "$RESUMED" || { echo "FAIL: resumed losses differ"; exit 1; }

# A per-rank cap in MiB: auto synthesises within it (in its activation units),
# and a cap the measurement schedule cannot fit is refused before launch.
"$BIN" "${BASE[@]}" --set=$SET,parallelism.memory_cap_mib=64 --steps=4 --schedule=auto --name=autocap > "$TMP/log" 2>&1 || { cat "$TMP/log"; echo "FAIL: auto under a cap exited non-zero"; exit 1; }
grep -Eq "memory cap [0-9.e+]+ \(x stage: parallelism.memory_cap_mib\)" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: the cap did not reach the synthesiser"; exit 1; }
close "$(echo "$PLAIN" | head -4)" "$(losses "$TMP"/runs/autocap-*)" || { echo "FAIL: auto under a cap trains differently"; exit 1; }
set +e
"$BIN" "${BASE[@]}" --set=$SET,parallelism.memory_cap_mib=0.01 --steps=2 --schedule=auto --name=tiny > "$TMP/tiny.log" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat "$TMP/tiny.log"; echo "FAIL: a tiny cap exit $code, want 2"; exit 1; }
grep -q "parallelism.memory_cap_mib=0.01: pipeline rank" "$TMP/tiny.log" || { cat "$TMP/tiny.log"; echo "FAIL: cap message"; exit 1; }

# Three chunks: refused before launch, naming the value and what works.
set +e
"$BIN" "${BASE[@]}" --set=$SET,gpt.num_layers=6 --steps=6 --schedule=auto --chunks=3 --name=bad > "$TMP/bad.log" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat "$TMP/bad.log"; echo "FAIL: chunks=3 exit $code, want 2"; exit 1; }
grep -q "chunks=3" "$TMP/bad.log" || { cat "$TMP/bad.log"; echo "FAIL: message"; exit 1; }
echo PASS
