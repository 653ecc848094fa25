#!/usr/bin/env bash
# Restarts that resume (issue #42), with the real train_gpt on pp 2 x dp 2
# (4 processes) and the smallest GPT that has a block per stage. Every case
# compares with one uninterrupted 40-step run: each step's loss (every time a
# step ran, before and after a restart) and the final checkpoint's tensor
# files must be equal byte for byte. Dropout is on, so the RNG state must
# resume too.
#
#   chaos: SIGKILL to a random worker at 3 random steps (seeded), with
#          --max_restarts=3, --save_interval=5; then --max_restarts=0 keeps
#          today's behaviour (the first kill ends the run).
#   cases: a SIGSTOP stall caught by the timeout; a bit flipped in the newest
#          checkpoint between restarts (the restart falls back to the one
#          before); SIGTERM to a worker with --save_on_signal=true (the
#          restart resumes from the step it saved).
set -uo pipefail
BIN=$1 MODE=${2:-chaos} SEED=${3:-42}  # SEED: the chaos kills' steps and ranks
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
CORPUS=$TMP/corpus.txt
for i in $(seq 1 200); do echo "Stage $((i % 5)) sends activations on; the bubble shrinks."; done > "$CORPUS"
STEPS=40
COMMON=(--config=experiments/configs/gpt_small_pp2_dp2.textproto --data="$CORPUS"
  --output_dir="$TMP/runs" --sample_tokens=0 --steps=$STEPS --save_interval=5)
SET=eval_interval=0,log_interval=1,gpt.width=16,gpt.num_heads=2,gpt.num_layers=2,gpt.context_length=16,gpt.dropout=0.1,parallelism.micro_batch_size=2
EXTRA_SET=""  # more --set fields for the next start (the flag may be given once)
# Every run is bounded well inside the test's own limit, so that a run that
# hangs fails with its log (exit 124) instead of the whole test timing out
# silently (CI's loaded 2.11 job did once). A run takes 3-15 s alone.
RUN_TIMEOUT=90
fail() { echo "FAIL: $*"; [[ -f ${LOG:-} ]] && tail -40 "$LOG"; exit 1; }

# "step loss" for every metrics line of every run directory of `name`.
step_losses() {
  cat "$TMP"/runs/"$1"-*/metrics.jsonl 2>/dev/null |
    sed -E 's/^\{.*"loss":([^,}]*).*"step":([0-9]+).*$/\2 \1/' | sort -n
}

# The straight run every case is compared with.
LOG=$TMP/straight.log
timeout $RUN_TIMEOUT "$BIN" "${COMMON[@]}" --set="$SET" --name=straight > "$LOG" 2>&1 || fail "the straight run failed"
declare -A WANT
while read -r step loss; do WANT[$step]=$loss; done < <(step_losses straight)
[[ ${#WANT[@]} -eq $STEPS ]] || fail "the straight run has ${#WANT[@]} losses, want $STEPS"

# Every step of `name` ran with the straight run's loss, and its last
# checkpoint's tensor files equal the straight run's byte for byte.
same_as_straight() {
  local name=$1 seen=0 step loss
  while read -r step loss; do
    [[ ${WANT[$step]} == "$loss" ]] || fail "$name: step $step loss $loss, straight ${WANT[$step]}"
    seen=$((seen + 1))
  done < <(step_losses "$name")
  [[ $(step_losses "$name" | cut -d' ' -f1 | sort -un | wc -l) -eq $STEPS ]] ||
    fail "$name: not every step of $STEPS has a loss"
  local want_dir=$TMP/runs/checkpoints/straight/step_000000$STEPS
  local got_dir=$TMP/runs/checkpoints/$name/step_000000$STEPS
  local files=0 f
  for f in "$want_dir"/*.pt; do
    cmp -s "$f" "$got_dir/$(basename "$f")" || fail "$name: $(basename "$f") differs from the straight run's"
    files=$((files + 1))
  done
  [[ $files -gt 4 ]] || fail "$name: only $files tensor files compared"
  echo "ok: $name: $seen step losses (re-run steps included) and $files final tensor files equal the straight run's"
}

# Starts train_gpt in the background (pid in LAUNCHER, output in LOG).
start() {
  local name=$1; shift
  LOG=$TMP/$name.log
  timeout $RUN_TIMEOUT "$BIN" "${COMMON[@]}" --set="$SET$EXTRA_SET" --name="$name" "$@" > "$LOG" 2>&1 &
  LAUNCHER=$!
}
# The last step rank 0 finished in the current attempt (0: none yet).
current_step() {
  local after
  after=$(grep -n '^\[launcher\] restart ' "$LOG" | tail -1 | cut -d: -f1)
  tail -n +"${after:-1}" "$LOG" | sed -nE 's/^\[rank 0\] step ([0-9]+)\/.*/\1/p' | tail -1 | grep . || echo 0
}
# Waits until the current attempt has finished step $1 (false if the run ended).
wait_for_step() {
  while kill -0 "$LAUNCHER" 2>/dev/null; do
    [[ $(current_step) -ge $1 ]] && return 0
    sleep 0.05
  done
  return 1
}
# The pid of the running worker of rank $1 (the launcher's child with RANK=$1).
# Looks again for up to 2 s while the launcher runs: one CI run (2.11 build,
# loaded machine) found no worker of a rank at step 17 of 40 with the run
# still going; if that happens again, the process tree goes to the log.
worker_pid() {
  local launcher_pid child try
  for try in $(seq 1 100); do
    launcher_pid=$(pgrep -P "$LAUNCHER" | head -1)  # `timeout` runs the launcher
    for child in $(pgrep -P "${launcher_pid:-0}"); do
      if tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$1"; then echo "$child"; return; fi
    done
    kill -0 "$LAUNCHER" 2>/dev/null || return 0
    sleep 0.02
  done
  {
    echo "worker_pid: no child of launcher '$launcher_pid' (under timeout $LAUNCHER) has RANK=$1; the tree:"
    ps -o pid,ppid,stat,etime,args -p "$LAUNCHER,${launcher_pid:-0}" --ppid "${launcher_pid:-0}" 2>&1
    for child in $(pgrep -P "${launcher_pid:-0}"); do
      echo "  $child: $(tr '\0' '\n' < "/proc/$child/environ" 2>&1 | grep -E '^(RANK|LOCAL_RANK)=|No such|denied' | tr '\n' ' ')"
    done
  } >&2
}
# Waits until the launcher has said it restarts $1 times.
wait_for_restarts() {
  while kill -0 "$LAUNCHER" 2>/dev/null; do
    [[ $(grep -c '^\[launcher\] restart ' "$LOG") -ge $1 ]] && return 0
    sleep 0.05
  done
  return 1
}
# Starts case $1 with the flags after $3, waits for step $2 and sets VICTIM to
# rank $3's worker pid. The 40 steps take ~3 s: on a loaded machine the run
# can end between the poll that sees the step and the signal; then the case
# starts again (its directories removed), up to three times.
start_until_caught() {
  local name=$1 step=$2 rank=$3 attempt
  shift 3
  for attempt in 1 2 3; do
    start "$name" "$@"
    wait_for_step "$step" || fail "$name: the run ended before step $step"
    VICTIM=$(worker_pid "$rank")
    [[ -n $VICTIM ]] && return 0
    wait "$LAUNCHER"
    echo "note: $name: the run ended before the signal (attempt $attempt); again"
    rm -rf "$TMP"/runs/"$name"-* "$TMP/runs/checkpoints/$name"
  done
  fail "$name: the run ended before the signal three times"
}
finish() {  # finish WANT_EXIT: waits for the launcher; its exit status must be WANT_EXIT
  wait "$LAUNCHER"
  local code=$?
  [[ $code -ne 124 ]] || fail "$(basename "$LOG" .log): still running after ${RUN_TIMEOUT} s (timeout killed it)"
  [[ $code -eq $1 ]] || fail "$(basename "$LOG" .log): exit $code, want $1"
}

if [[ $MODE == chaos ]]; then
  RANDOM=$SEED
  # Three kill steps, each past the checkpoint the previous attempt resumes from.
  KILLS=($((3 + RANDOM % 8)) $((15 + RANDOM % 8)) $((27 + RANDOM % 8)))
  start chaos --max_restarts=3 --restart_delay=0.2s --launcher_grace_period=2s
  for i in 0 1 2; do
    wait_for_step "${KILLS[$i]}" || fail "the run ended before kill $((i + 1))"
    rank=$((RANDOM % 4))
    pid=$(worker_pid $rank)
    [[ -n $pid ]] || fail "no worker of rank $rank"
    kill -KILL "$pid"
    echo "kill $((i + 1)): SIGKILL to rank $rank (pid $pid) after step $(current_step) (target ${KILLS[$i]})"
    wait_for_restarts $((i + 1)) || fail "no restart after kill $((i + 1))"
  done
  finish 0
  grep -q '^\[launcher\] restart 3/3 in ' "$LOG" || fail "no third restart"
  [[ $(grep -c '^\[launcher\] rank [0-3] .*was killed by signal 9' "$LOG") -eq 3 ]] || fail "the launcher did not name 3 killed workers"
  grep -q '\[rank 0\] restart 3/3 after .*; continuing at step [1-9]' "$LOG" || fail "rank 0 did not report the restart"
  grep -h '"restart":{' "$TMP"/runs/chaos-*/metrics.jsonl | grep -q '"count":3' || fail "no restart record in the metrics"
  same_as_straight chaos

  # --max_restarts=0: the first kill ends the run with the worker's status.
  start once --launcher_grace_period=2s
  wait_for_step 3 || fail "the run ended before the kill"
  kill -KILL "$(worker_pid 1)"
  finish 137
  grep -q '^\[launcher\] FAILED: rank 1 .*was killed by signal 9' "$LOG" || fail "no FAILED verdict"
  ! grep -q '^\[launcher\] restart' "$LOG" || fail "restarted with --max_restarts=0"
  echo "ok: --max_restarts=0 ends the run at the first failure"
elif [[ $MODE == cases ]]; then
  # A stalled worker (SIGSTOP): its peers time out (parallelism.timeout_seconds),
  # the launcher names it, and the restart resumes.
  EXTRA_SET=,parallelism.timeout_seconds=10
  start_until_caught stall 12 2 --max_restarts=1 --restart_delay=0.2s --launcher_grace_period=2s
  EXTRA_SET=""
  kill -STOP "$VICTIM"
  finish 0
  grep -q 'restart 1/1 after rank 2 .*was stopped by signal 19' "$LOG" || fail "the stall is not the named cause"
  same_as_straight stall

  # A bit flipped in the newest checkpoint between restarts: the restart
  # resumes from the one before it.
  start_until_caught broken 13 3 --max_restarts=1 --restart_delay=2s --launcher_grace_period=2s
  kill -KILL "$VICTIM"
  wait_for_restarts 1 || fail "no restart"
  CKPT=$TMP/runs/checkpoints/broken
  newest=$CKPT/$(cat "$CKPT/latest")
  victim=$(ls "$newest"/layer_*-model_states.pt | head -1)
  python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0x10; open(p,'wb').write(b)" "$victim"
  finish 0
  older=$(ls -d "$CKPT"/step_* | sort | grep -B1 -x "$newest" | head -1)
  grep -q "which is unusable: checkpoint file $victim has CRC32C" "$LOG" || fail "no warning naming the flipped file"
  grep -q "\[rank 0\] resumed at step $((10#${older##*step_})) " "$LOG" || fail "did not resume from $older"
  same_as_straight broken

  # SIGTERM to one worker with save-on-signal: every rank finishes the step,
  # saves it (a step no save_interval hits) and exits 143; the restart
  # continues from that step.
  start_until_caught term 17 1 --max_restarts=1 --restart_delay=0.2s --launcher_grace_period=20s --save_on_signal=true
  kill -TERM "$VICTIM"
  finish 0
  saved_step=$(sed -nE 's/^\[rank [0-3]\] stopped by SIGTERM after step ([0-9]+) .*/\1/p' "$LOG" | head -1)
  [[ -n $saved_step ]] || fail "no rank said it stopped by SIGTERM after saving"
  grep -q "restart 1/1 after rank [0-3] .*exited with status 143" "$LOG" || fail "no restart after the SIGTERM"
  grep -q "\[rank 0\] resumed at step $saved_step " "$LOG" || fail "did not resume at the saved step $saved_step"
  echo "ok: SIGTERM saved step $saved_step and the restart resumed there"
  same_as_straight term
else
  fail "unknown mode $MODE (chaos or cases)"
fi
echo PASS
