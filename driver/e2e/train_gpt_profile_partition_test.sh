#!/usr/bin/env bash
# train_gpt --partition=profile: rank 0 times every layer on the first training
# micro-batch and broadcasts the bounds, so every rank builds its stage from
# the same cut (looped 1F1B and V-placed zbv); the losses equal a run cut by
# type (a layer's initial weights do not depend on the cut); and a bad profile
# argument is refused before launch.
set -euo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS" ''
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --steps=2
  --sample_tokens=0 --eval_interval=0
  --set=lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2)

losses() { sed 's/.*"loss":\([0-9.]*\).*/\1/' "$1"/metrics.jsonl | tr '\n' ' '; }

run() {  # run NAME ARGS...: trains, prints the log, sets RUN to the run directory
  local name=$1
  shift
  "$BIN" "${COMMON[@]}" --output_dir="$TMP/$name" "$@" > "$TMP/$name.log" 2>&1 ||
    { cat "$TMP/$name.log"; echo "FAIL: train_gpt $name exited non-zero"; exit 1; }
  cat "$TMP/$name.log"
  RUN=$(ls -d "$TMP/$name"/gpt_small_pp2-*)
}

for sched in "1f1b 1" "zbv 2"; do
  set -- $sched
  run "type_$1" --schedule="$1" --chunks="$2"
  TYPE_LOSSES=$(losses "$RUN")
  run "profile_$1" --schedule="$1" --chunks="$2" --partition=profile
  PROFILE_LOSSES=$(losses "$RUN")
  # Every rank logs the bounds it got; they are rank 0's, one per part + 1.
  parts=$((2 * $2))
  lines=()
  for rank in 0 1; do
    line=$(grep -o "partition 'profile' measured by rank 0 on the first training micro-batch: explicit:[0-9,]*" \
      "$RUN/logs/rank_$rank.log") || { echo "FAIL: $1: no resolved partition in rank $rank's log"; exit 1; }
    lines+=("$line")
  done
  [[ ${lines[0]} == "${lines[1]}" ]] || { echo "FAIL: $1: ranks disagree: ${lines[*]}"; exit 1; }
  bounds=${lines[0]##*explicit:}
  IFS=, read -r -a b <<< "$bounds"
  [[ ${#b[@]} -eq $((parts + 1)) && ${b[0]} -eq 0 && ${b[-1]} -eq 7 ]] ||
    { echo "FAIL: $1: bounds '$bounds' for $parts parts of 7 layers"; exit 1; }
  # The partition printed on the console is the broadcast one.
  grep -q "(part 0) layers=\[0, ${b[1]})" "$TMP/profile_$1.log" ||
    { echo "FAIL: $1: console partition is not explicit:$bounds"; exit 1; }
  echo "$1: type losses $TYPE_LOSSES, profile losses $PROFILE_LOSSES (bounds $bounds)"
  python3 - "$TYPE_LOSSES" "$PROFILE_LOSSES" <<'PY' || { echo "FAIL: $1: losses differ"; exit 1; }
import sys
a, b = [list(map(float, x.split())) for x in sys.argv[1:]]
assert len(a) == len(b) == 2 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)), (a, b)
PY
done

# A bad profile argument is refused by the launcher before any worker starts
# (issue 29: it used to fail in rank 0's profile, after launch).
set +e
timeout 120 "$BIN" "${COMMON[@]}" --output_dir="$TMP/bad" --partition=profile:3 > "$TMP/bad.log" 2>&1
code=$?
set -e
cat "$TMP/bad.log"
[[ $code -eq 2 ]] || { echo "FAIL: bad profile exited $code, want 2"; exit 1; }
grep -q "partition method 'profile': unknown argument '3'; valid: 'profile' or 'profile:cap_mib=N" "$TMP/bad.log" ||
  { echo "FAIL: the reason is missing"; exit 1; }
if grep -q '\[launcher\] starting\|\[rank ' "$TMP/bad.log"; then
  echo "FAIL: workers were started for a bad profile argument"; exit 1
fi
echo PASS
