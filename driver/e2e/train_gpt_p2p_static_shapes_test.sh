#!/usr/bin/env bash
# train_gpt --p2p_static_shapes=true (parallelism.p2p_static_shapes; p2p.h's
# static-shape mode): the same per-step training and evaluation losses as
# without it, for 1f1b and zbv (V placement, split backward) at pp=2, m=4,
# with evaluations between training steps and sampling at the end (forward-
# only passes, other shapes: they keep control words), and across a
# checkpoint resume (a fresh process learns the layouts again). Rank 0's p2p
# counters show the mode at work: on its one outgoing activation channel, all
# training activations but the first (4 steps x 4 micro-batches - 1 = 15) go
# without a control word; without the mode none does.
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" --sample_tokens=3
  --pp=2 --microbatches=4 --eval_interval=2
  --set=lr_schedule.name=constant,lr_schedule.warmup_steps=0,eval_batches=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2)
run() { must_run "$TMP/log" "$BIN" "${COMMON[@]}" "$@"; }
losses() { for d in $(ls -d "$TMP"/runs/"$1"-* | sort); do sed -E 's/.*"loss":([^,}]*).*/\1/' "$d"/metrics.jsonl; done; }
eval_losses() { for d in $(ls -d "$TMP"/runs/"$1"-* | sort); do grep -o '"eval_loss":[^,}]*' "$d"/metrics.jsonl; done; }
counters() {
  grep -q "p2p (rank 0):" "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no p2p counter line"; exit 1; }
  line=$(grep "p2p (rank 0):" "$TMP/log")
}
same() {
  local a b
  a=$(losses "$1"); b=$(losses "$2")
  echo "$1: $(echo $a) | $(echo $(eval_losses "$1"))"
  echo "$2: $(echo $b) | $(echo $(eval_losses "$2"))"
  [[ $(echo "$a" | wc -l) -eq 4 ]] || { echo "FAIL: expected 4 losses for $1"; exit 1; }
  [[ $(eval_losses "$1" | wc -l) -eq 2 ]] || { echo "FAIL: expected 2 eval losses for $1"; exit 1; }
  [[ "$a" == "$b" ]] || { echo "FAIL: $1 and $2 training losses differ"; exit 1; }
  [[ "$(eval_losses "$1")" == "$(eval_losses "$2")" ]] || { echo "FAIL: $1 and $2 eval losses differ"; exit 1; }
}

for sched in 1f1b zbv; do
  chunks=1; [[ $sched == zbv ]] && chunks=2
  run --steps=4 --schedule=$sched --chunks=$chunks --name=dyn_$sched
  counters; echo "dynamic $sched: $line"
  dyn_controls=$(echo "$line" | sed -E 's/.* ([0-9]+) activation control words.*/\1/')
  [[ $line == *" 0 activations as payload only (static shapes off)"* ]] \
    || { echo "FAIL: payload-only activations without the mode: $line"; exit 1; }
  run --steps=4 --schedule=$sched --chunks=$chunks --name=static_$sched --p2p_static_shapes=true
  counters; echo "static $sched: $line"
  [[ $line == *" $((dyn_controls - 15)) activation control words, 15 activations as payload only (static shapes on)"* ]] \
    || { echo "FAIL: want $((dyn_controls - 15)) control words and 15 payload-only activations: $line"; exit 1; }
  same dyn_$sched static_$sched
  cmp "$TMP"/runs/dyn_$sched-*/sample.txt "$TMP"/runs/static_$sched-*/sample.txt \
    || { echo "FAIL: $sched samples differ"; exit 1; }
done

# Resume: 2 steps saving, then a fresh launch to step 4, both with the mode.
run --steps=2 --save_interval=2 --name=resumed --p2p_static_shapes=true
run --steps=4 --resume=auto --name=resumed --p2p_static_shapes=true
grep -q 'resumed at step 2' "$TMP/log" || { cat "$TMP/log"; echo "FAIL: did not resume at step 2"; exit 1; }
same static_1f1b resumed
echo PASS
