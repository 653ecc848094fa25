#!/usr/bin/env bash
# Restarts across nodes (issue #42): two launchers on this machine as nodes 0
# and 1 (--nnodes=2, 2 workers each: pp 2 x dp 2), agreeing on every restart
# through the store node 0's launcher hosts on --master_port + 1
# (topology/restart_rounds.h):
#   1. SIGKILL to rank 3 (node 1) at a step past the first checkpoint: node 1
#      posts the failure, node 0 stops its workers at once, both restart
#      together from the newest checkpoint, and every step's loss and the
#      final checkpoint's tensor files equal a one-node uninterrupted run's;
#   2. node 1's launcher killed (SIGKILL, its workers with it): node 0 ends the
#      run within --restart_join_timeout, naming node 1.
set -uo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
CORPUS=$TMP/corpus.txt
for i in $(seq 1 200); do echo "Stage $((i % 5)) sends activations on; the bubble shrinks."; done > "$CORPUS"
STEPS=30
COMMON=(--config=experiments/configs/gpt_small_pp2_dp2.textproto --data="$CORPUS"
  --output_dir="$TMP/runs" --sample_tokens=0 --steps=$STEPS --save_interval=5
  --set=eval_interval=0,log_interval=1,gpt.width=16,gpt.num_heads=2,gpt.num_layers=2,gpt.context_length=16,gpt.dropout=0.1,parallelism.micro_batch_size=2)
fail() {
  echo "FAIL: $*"
  for f in "$TMP"/*.log; do echo "--- $f"; tail -25 "$f"; done
  exit 1
}
source driver/e2e/e2e_testing.sh  # losses NAME: "step loss" lines, by step
# Two consecutive free ports: the workers' store and the launchers' own,
# below the kernel's ephemeral range, so that no outgoing connection (nor a
# bind to port 0, as the launcher's own pick) takes them while the nodes start.
PORT=$(python3 - <<'PY'
import os, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
start = 10000 + os.getpid() % max(2, low - 10002)
# (Anywhere else if that range is full.)
for p in list(range(start, low - 1, 2)) + list(range(10000, start, 2)) + list(range(low, 65000, 2)):
    ok = True
    for q in (p, p + 1):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", q))
        except OSError:
            ok = False
        s.close()
    if ok:
        print(p)
        break
else:
    raise SystemExit("no two consecutive free ports")
PY
)
node() {  # node NAME RANK FLAGS...: a launcher in the background, its pid in NODE_PID
  local name=$1 rank=$2
  shift 2
  timeout 300 "$BIN" "${COMMON[@]}" --name="$name" --nnodes=2 --node_rank="$rank" \
    --nproc_per_node=2 --master_addr=127.0.0.1 --master_port="$PORT" "$@" \
    > "$TMP/$name-node$rank.log" 2>&1 &
  NODE_PID=$!
}
# The pid of the running worker of global rank $2 under launcher (timeout) pid $1.
worker_pid() {
  local launcher child try
  for try in $(seq 1 200); do
    launcher=$(pgrep -P "$1" | head -1)
    for child in $(pgrep -P "${launcher:-0}"); do
      if tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$child"; return; fi
    done
    sleep 0.02
  done
}
wait_for_step() {  # wait_for_step LOG STEP
  for _ in $(seq 1 3000); do
    grep -qE "^\[rank 0\] step $2/" "$1" && return 0
    sleep 0.02
  done
  return 1
}

LOG=$TMP/straight.log
timeout 300 "$BIN" "${COMMON[@]}" --name=straight > "$LOG" 2>&1 || fail "the one-node run failed"
declare -A WANT
while read -r step loss; do WANT[$step]=$loss; done < <(losses straight)
[[ ${#WANT[@]} -eq $STEPS ]] || fail "the one-node run has ${#WANT[@]} losses, want $STEPS"

# 1. A worker of node 1 killed: both nodes restart together.
node killed 0 --max_restarts=2 --restart_join_timeout=60s
N0=$NODE_PID
node killed 1 --max_restarts=2 --restart_join_timeout=60s
N1=$NODE_PID
wait_for_step "$TMP/killed-node0.log" 12 || fail "the two-node run did not reach step 12"
VICTIM=$(worker_pid "$N1" 3)
[[ -n $VICTIM ]] || fail "no worker of rank 3 under node 1's launcher"
kill -KILL "$VICTIM"
wait "$N0"; c0=$?
wait "$N1"; c1=$?
[[ $c0 -eq 0 && $c1 -eq 0 ]] || fail "the launchers exited $c0 and $c1, want 0 and 0"
# Both name the same root cause (node 0's own workers may have failed first
# of the lost peer, or been stopped for node 1's failure).
RESTART="^\[launcher\] restart 1/2 in 1s after node 1: rank 3 (pipeline stage 1, data-parallel index 1; .*) (pid $VICTIM) was killed by signal 9"
grep -q "$RESTART" "$TMP/killed-node0.log" || fail "node 0 did not restart naming node 1's rank 3"
grep -q "$RESTART" "$TMP/killed-node1.log" || fail "node 1 did not restart naming its rank 3"
seen=0
while read -r step loss; do
  [[ ${WANT[$step]} == "$loss" ]] || fail "step $step loss $loss, the one-node run's ${WANT[$step]}"
  seen=$((seen + 1))
done < <(losses killed)
[[ $(losses killed | cut -d' ' -f1 | sort -un | wc -l) -eq $STEPS ]] || fail "not every step has a loss"
files=0
for f in "$TMP/runs/checkpoints/straight/step_000000$STEPS"/*.pt; do
  cmp -s "$f" "$TMP/runs/checkpoints/killed/step_000000$STEPS/$(basename "$f")" ||
    fail "$(basename "$f") differs from the one-node run's"
  files=$((files + 1))
done
[[ $files -gt 4 ]] || fail "only $files tensor files compared"
echo "ok: rank 3 of node 1 killed at step 12; both nodes restarted together; $seen step losses and $files final tensor files equal the one-node run's"

# 2. Node 1's launcher killed: node 0 ends the run naming it.
node gone 0 --max_restarts=2 --restart_join_timeout=5s
N0=$NODE_PID
node gone 1 --max_restarts=2 --restart_join_timeout=5s
N1=$NODE_PID
wait_for_step "$TMP/gone-node0.log" 8 || fail "the second two-node run did not reach step 8"
kill -KILL "$(pgrep -P "$N1" | head -1)"
wait "$N1" 2> /dev/null
start=$SECONDS
wait "$N0"; c0=$?
[[ $c0 -ne 0 ]] || fail "node 0 exited 0 with node 1 gone"
grep -q "FAILED: node(s) 1 did not report the end of restart round 0 within 5s (--restart_join_timeout); ending the run" \
  "$TMP/gone-node0.log" || fail "node 0 did not name node 1"
echo "ok: node 1's launcher killed: node 0 exited $c0 after $((SECONDS - start)) s naming node 1"
