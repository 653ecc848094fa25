#!/usr/bin/env bash
# Two launches with the same --master_port and the same PP_RUN_ID (issue 29,
# "another run killed"), with real processes: while run A trains, launch B
# with A's port and run id. B must fail, naming why (its rank 0 cannot host
# the store on a port in use; its rank 1, which reaches A's store, is refused
# as another launch before it writes there), and A must finish every step
# with exit 0. In 1 of 8 tries B used to kill A. Repeated TRIES times.
set -uo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
TRIES=${2:-3}
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS" ''
STEPS=100
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --sample_tokens=0
  --set=eval_interval=0,log_interval=1,lr_schedule.name=constant,lr_schedule.warmup_steps=0,gpt.width=32,gpt.num_heads=4,gpt.context_length=32,parallelism.micro_batch_size=2)
fail() { echo "FAIL: $*"; echo "--- A:"; cat "$TMP/a.log"; echo "--- B:"; cat "$TMP/b.log"; exit 1; }

for try in $(seq 1 "$TRIES"); do
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  export PP_RUN_ID=shared-run-$try
  rm -rf "$TMP/a" "$TMP/b"
  timeout 300 "$BIN" "${COMMON[@]}" --output_dir="$TMP/a" --name=a --steps=$STEPS \
    --master_port="$PORT" > "$TMP/a.log" 2>&1 &
  a_pid=$!
  # B starts once A's ranks have joined its store and trained a step.
  for _ in $(seq 1 600); do
    metrics=$(ls "$TMP"/a/a-*/metrics.jsonl 2> /dev/null | head -1)
    [[ -n $metrics && -s $metrics ]] && break
    kill -0 "$a_pid" 2> /dev/null || break
    sleep 0.2
  done
  kill -0 "$a_pid" 2> /dev/null || { wait "$a_pid"; fail "try $try: A ended before B was launched"; }
  timeout 120 "$BIN" "${COMMON[@]}" --output_dir="$TMP/b" --name=b --steps=$STEPS \
    --master_port="$PORT" > "$TMP/b.log" 2>&1
  b_code=$?
  wait "$a_pid"
  a_code=$?
  [[ $b_code -ne 0 && $b_code -ne 124 ]] || fail "try $try: B exited $b_code, want a refusal"
  grep -q "started by another launch\|cannot open the TCP store\|address already in use\|Address already in use" "$TMP/b.log" ||
    fail "try $try: B's log does not say why it stopped"
  [[ $a_code -eq 0 ]] || fail "try $try: A exited $a_code after B's launch, want 0"
  metrics=$(ls "$TMP"/a/a-*/metrics.jsonl)
  lines=$(wc -l < "$metrics")
  [[ $lines -eq $STEPS ]] || fail "try $try: A logged $lines of $STEPS steps"
  echo "ok: try $try: B exit $b_code ($(grep -o 'started by another launch\|cannot open the TCP store' "$TMP/b.log" | sort -u | tr '\n' ' ')), A exit 0 with $lines steps"
done
echo PASS
