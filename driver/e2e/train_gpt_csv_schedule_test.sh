#!/usr/bin/env bash
# train_gpt --schedule=csv:FILE (pipeline/schedule/formats/csv.h): a schedule written
# by hand as a CSV file trains with the same per-step losses as the registered
# schedule it spells out, in both CSV forms:
#   - 1F1B for pp=2, m=4 written by hand (compute-only, idle cells, comments)
#     against --schedule=1f1b;
#   - zbv for pp=2, m=4 in the compute + comms form written by the explorer
#     (V placement from its '# stage_to_rank: v' line; the file's sends and
#     receives are the program that runs) against --schedule=zbv.
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
EXPLORER=$2
HAND_1F1B=$3
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" --sample_tokens=0
  --steps=4 --pp=2
  --set=eval_interval=0,lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2)
run() { must_run "$TMP/log" "$BIN" "${COMMON[@]}" --microbatches=4 "$@"; }
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"/metrics.jsonl; }
same() {
  local a b
  a=$(losses "$TMP"/runs/"$1"-*)
  b=$(losses "$TMP"/runs/"$2"-*)
  echo "$1: $(echo $a)"
  echo "$2: $(echo $b)"
  [[ $(echo "$a" | wc -l) -eq 4 ]] || { echo "FAIL: expected 4 losses for $1"; exit 1; }
  [[ "$a" == "$b" ]] || { echo "FAIL: $1 and $2 differ"; exit 1; }
}

run --schedule=1f1b --name=reg_1f1b
run --schedule=csv:"$HAND_1F1B" --name=csv_1f1b
grep -q "schedule csv:" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: the run does not name the CSV schedule"; exit 1; }
same reg_1f1b csv_1f1b

"$EXPLORER" --schedule=zbv --stages=2 --microbatches=4 --chunks=2 --format=csv_comms > "$TMP/zbv_comms.csv"
run --schedule=zbv --chunks=2 --name=reg_zbv
run --schedule=csv:"$TMP/zbv_comms.csv" --chunks=2 --name=csv_zbv
same reg_zbv csv_zbv

# A shape the file does not have: exit 2 before any worker, both shapes named.
if "$BIN" "${COMMON[@]}" --schedule=csv:"$HAND_1F1B" --microbatches=8 > "$TMP/bad.log" 2>&1; then
  echo "FAIL: m=8 with a 4-micro-batch file was accepted"; exit 1
fi
grep -q "micro-batches 0..3" "$TMP/bad.log" && grep -q "m=8" "$TMP/bad.log" \
  || { cat "$TMP/bad.log"; echo "FAIL: shape mismatch message"; exit 1; }
echo PASS
