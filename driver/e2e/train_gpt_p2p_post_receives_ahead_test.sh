#!/usr/bin/env bash
# train_gpt --p2p_post_receives_ahead=true (parallelism.p2p_post_receives_ahead;
# StageExecutorOptions::post_receives_ahead): the same per-step training and
# evaluation losses and the same sample as without it, for 1f1b and zbv (V
# placement, split backward, local hand-over) at pp=2, m=4, with dynamic and
# with static p2p shapes, evaluations between training steps (forward-only
# passes must not mix with training ones) and sampling at the end. Rank 0's p2p
# counters show receives went through posted receives with the option, and
# none without.
set -euo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
CORPUS=$TMP/corpus.txt
for i in $(seq 1 300); do echo "Pipeline stage $((i % 5)) receives activations ahead of need. The bubble shrinks."; done > "$CORPUS"
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" --sample_tokens=3
  --pp=2 --microbatches=4 --eval_interval=2 --steps=4
  --set=lr_schedule.name=constant,lr_schedule.warmup_steps=0,eval_batches=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2)
run() { "$BIN" "${COMMON[@]}" "$@" > "$TMP/log" 2>&1 || { cat "$TMP/log"; echo "FAIL: train_gpt $* exited non-zero"; exit 1; }; }
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$TMP"/runs/"$1"-*/metrics.jsonl; }
eval_losses() { grep -o '"eval_loss":[^,}]*' "$TMP"/runs/"$1"-*/metrics.jsonl; }
# Payloads ($p) and control words ($c) rank 0 received into receives posted
# ahead; $line: its p2p counter line.
posted() {
  line=$(grep "p2p (rank 0):" "$TMP/log") || { cat "$TMP/log"; echo "FAIL: no p2p counter line"; exit 1; }
  read -r p c <<< "$(echo "$line" | sed -E 's/.* ([0-9]+) payloads and ([0-9]+) control words received into receives posted ahead.*/\1 \2/')"
}

for sched in 1f1b zbv; do
  chunks=1; [[ $sched == zbv ]] && chunks=2
  for static in false true; do
    name=${sched}_static_$static
    run --schedule=$sched --chunks=$chunks --name=off_$name --p2p_static_shapes=$static
    posted
    [[ $p == 0 && $c == 0 ]] || { echo "FAIL: $name: posted ahead without the option: $line"; exit 1; }
    run --schedule=$sched --chunks=$chunks --name=on_$name --p2p_static_shapes=$static --p2p_post_receives_ahead=true
    posted
    echo "$name with the option: $p payloads, $c control words posted ahead on rank 0"
    [[ $line == *"(post receives ahead on)"* ]] || { echo "FAIL: option not reported: $line"; exit 1; }
    # Rank 0 receives 4 steps x 4 micro-batches of gradients (payloads, posted
    # ahead in every mode) on each of its stages' gradient channels.
    (( p >= 16 )) || { echo "FAIL: $name: want >= 16 payloads posted ahead: $line"; exit 1; }
    a=$(losses off_$name); b=$(losses on_$name)
    echo "off: $(echo $a) | $(echo $(eval_losses off_$name))"
    echo "on:  $(echo $b) | $(echo $(eval_losses on_$name))"
    [[ $(echo "$a" | wc -l) -eq 4 ]] || { echo "FAIL: expected 4 losses for $name"; exit 1; }
    [[ $(eval_losses off_$name | wc -l) -eq 2 ]] || { echo "FAIL: expected 2 eval losses for $name"; exit 1; }
    [[ "$a" == "$b" ]] || { echo "FAIL: $name training losses differ with the option"; exit 1; }
    [[ "$(eval_losses off_$name)" == "$(eval_losses on_$name)" ]] || { echo "FAIL: $name eval losses differ"; exit 1; }
    cmp "$TMP"/runs/off_$name-*/sample.txt "$TMP"/runs/on_$name-*/sample.txt \
      || { echo "FAIL: $name samples differ"; exit 1; }
  done
done
echo PASS
