#!/usr/bin/env bash
# train_gpt --borrow_idle_cores=true (threads.borrow_idle_cores;
# pipeline/runtime/idle_core_threads.h) at pp = 2 on this machine's cores: the
# same per-step training and evaluation losses, bit for bit, and the same
# sample as without it, for 1f1b and zbv (V placement, split backward), with
# evaluations between training steps. The model is wide enough (width 64,
# 4 x 64 tokens per micro-batch) for OpenBLAS to split its matrix products
# over the lent threads. With 2 cores or more, rank 0 lends threads to 1F1B's
# first F and last B and reports it; every lent action ran. On MKL it is
# refused before launch.
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run, losses
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs" --sample_tokens=3
  --pp=2 --microbatches=4 --eval_interval=2
  --set=lr_schedule.name=constant,lr_schedule.warmup_steps=0,eval_batches=1,gpt.width=64,gpt.context_length=64,parallelism.micro_batch_size=4)
run() { must_run "$TMP/log" "$BIN" "${COMMON[@]}" --steps=4 "$@"; }
eval_losses() { grep -o '"eval_loss":[^,}]*' "$TMP"/runs/"$1"-*/metrics.jsonl; }
cores=$(nproc)

# A LibTorch on MKL (the 2.x wheels, CI's --config=cuda job) refuses the
# option before launch: MKL's threads may change a product's bits.
if ! "$BIN" "${COMMON[@]}" --steps=1 --name=probe --borrow_idle_cores=true > "$TMP/probe" 2>&1; then
  grep -q "threads.borrow_idle_cores needs OpenBLAS" "$TMP/probe" || { cat "$TMP/probe"; echo "FAIL: refused for another reason"; exit 1; }
  echo "PASS (this LibTorch's BLAS is not OpenBLAS; refused before launch: $(grep -o 'computes with [^(]*' "$TMP/probe"))"
  exit 0
fi

for sched in 1f1b zbv; do
  chunks=1; [[ $sched == zbv ]] && chunks=2
  run --schedule=$sched --chunks=$chunks --name=off_$sched
  if grep -rq "idle cores" "$TMP"/runs/off_$sched-*/logs; then echo "FAIL: $sched: idle cores without the option"; exit 1; fi
  run --schedule=$sched --chunks=$chunks --name=on_$sched --borrow_idle_cores=true
  plan=$(grep -rh "rank 0: idle cores lend" "$TMP"/runs/on_$sched-*/logs) \
    || { cat "$TMP/log"; echo "FAIL: $sched: rank 0 reports no idle-core plan"; exit 1; }
  done_line=$(grep -rh "rank 0: idle cores lent" "$TMP"/runs/on_$sched-*/logs) \
    || { echo "FAIL: $sched: rank 0 reports no lent actions"; exit 1; }
  echo "$sched: ${plan#*] } / ${done_line#*] }"
  if (( cores >= 2 )); then
    if [[ $sched == 1f1b ]]; then
      [[ $plan == *"2 action(s) per step (0B3:"*" 0F0:"* ]] || { echo "FAIL: 1f1b plan: $plan"; exit 1; }
    fi
    # Every planned action ran with its threads, in each of the 4 steps.
    per_step=$(echo "$plan" | sed -E 's/.*lend BLAS threads to ([0-9]+) action.*/\1/')
    lent=$(echo "$done_line" | sed -E 's/.*lent BLAS threads to ([0-9]+) action.*/\1/')
    (( lent == 4 * per_step )) || { echo "FAIL: $sched: lent $lent, planned $per_step x 4"; exit 1; }
  fi
  a=$(losses off_$sched); b=$(losses on_$sched)
  echo "off: $(echo $a) | $(echo $(eval_losses off_$sched))"
  echo "on:  $(echo $b) | $(echo $(eval_losses on_$sched))"
  [[ $(echo "$a" | wc -l) -eq 4 ]] || { echo "FAIL: expected 4 losses for $sched"; exit 1; }
  [[ "$a" == "$b" ]] || { echo "FAIL: $sched training losses differ with the option"; exit 1; }
  [[ "$(eval_losses off_$sched)" == "$(eval_losses on_$sched)" ]] || { echo "FAIL: $sched eval losses differ"; exit 1; }
  cmp "$TMP"/runs/off_$sched-*/sample.txt "$TMP"/runs/on_$sched-*/sample.txt \
    || { echo "FAIL: $sched samples differ"; exit 1; }
done
echo PASS
