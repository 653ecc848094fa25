#!/usr/bin/env bash
# Multi-host (issue #14): two hosts made on this machine with network
# namespaces joined by a veth pair (10.77.0.1 <-> 10.77.0.2; nothing else
# connects them, not even a shared loopback). train_gpt runs with --nnodes=2,
# one rank per host, rank 0's store on host A's veth address:
#   1. its per-step losses equal a one-host run's (metrics.jsonl, every digit);
#   2. cutting the link mid-run (`ip link set pp0 down` on host A) makes both
#      launchers exit non-zero within the p2p timeout (+ the launcher's grace
#      period and slack), each naming the peer it lost by global rank;
#   3. with --max_restarts, a worker killed on host B restarts both hosts
#      together, and the losses equal an uninterrupted one-host run's.
# Needs root (CAP_NET_ADMIN) and iproute2. Where network namespaces cannot be
# made (not root, a container without them) it FAILS saying why: a test that
# did not run never reports a pass. To leave it out there, say so: run with
# --test_env=PP_SKIP_MULTIHOST=1 (it then prints "SKIPPED", exits 0 and
# records the test as skipped in its JUnit XML, Bazel 4 having no skipped
# state) or filter it out with --test_tag_filters=-requires-netns.
set -uo pipefail
BIN=$(realpath "$1")
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run, skip_test
export PATH=$PATH:/usr/sbin:/sbin
TIMEOUT_S=10  # parallelism.timeout_seconds for the link-cut run
cannot_run() {
  local why="$* (the multi-host test needs root and network namespaces)"
  if [[ ${PP_SKIP_MULTIHOST:-} == 1 ]]; then
    skip_test multihost "$why; opted out with PP_SKIP_MULTIHOST=1"
  fi
  echo "CANNOT RUN: $why."
  echo "A test that did not run does not pass. Run it where network namespaces work (as root," \
    "no sandbox), or opt out visibly: --test_env=PP_SKIP_MULTIHOST=1 or" \
    "--test_tag_filters=-requires-netns."
  exit 1
}
fail() {
  echo "FAIL: $*"
  for f in "$TMP"/*.log; do echo "== $f"; cat "$f"; done
  exit 1
}

[[ $(id -u) -eq 0 ]] || cannot_run "not root"
command -v ip > /dev/null || cannot_run "no 'ip' command (iproute2)"
TAG=pp$$ # namespace and interface names unique to this run of the test
NS_A=${TAG}a
NS_B=${TAG}b
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2> /dev/null; done
  ip netns del "$NS_A" 2> /dev/null
  ip netns del "$NS_B" 2> /dev/null
}
trap cleanup EXIT
trap 'exit 1' INT TERM # a killed test (bazel timeout) still removes its namespaces
ip netns add "$NS_A" 2> "$TMP/netns.err" || cannot_run "ip netns add: $(cat "$TMP/netns.err")"
ip netns add "$NS_B" || fail "second namespace"
ip link add "${TAG}a0" type veth peer name "${TAG}b0" || fail "veth pair"
ip link set "${TAG}a0" netns "$NS_A" && ip link set "${TAG}b0" netns "$NS_B" || fail "veth move"
ip -n "$NS_A" link set "${TAG}a0" name pp0 && ip -n "$NS_B" link set "${TAG}b0" name pp0 || fail "rename"
ip -n "$NS_A" addr add 10.77.0.1/24 dev pp0 && ip -n "$NS_B" addr add 10.77.0.2/24 dev pp0 || fail "addr"
for ns in "$NS_A" "$NS_B"; do
  ip -n "$ns" link set lo up && ip -n "$ns" link set pp0 up || fail "link up in $ns"
done

CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS"
SET=eval_interval=0,log_interval=1,lr_schedule.warmup_steps=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2
COMMON=(--config="$PWD/experiments/configs/gpt_small_pp2.textproto" --data="$CORPUS" --sample_tokens=0 --name=mh)
# One rank per host; GLOO_SOCKET_IFNAME is left unset on purpose: the
# rendezvous must advertise the veth address, not the host name's loopback.
node() { # node NS NODE_RANK PORT LOG ARGS...
  local ns=$1 rank=$2 port=$3 log=$4
  shift 4
  ip netns exec "$ns" "$BIN" "${COMMON[@]}" --nnodes=2 --node_rank="$rank" --master_addr=10.77.0.1 \
    --master_port="$port" --run_id="mh-$TAG-$port" "$@" > "$log" 2>&1
}
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"/mh-*/metrics.jsonl; }
# Waits until LOG ($1) shows step $2 (up to 120 s); false if it never does.
wait_for_step() {
  for _ in $(seq 1 600); do
    grep -q "step $2/" "$1" && return 0
    sleep 0.2
  done
  return 1
}

# 1. Losses across two hosts equal the one-host run.
"$BIN" "${COMMON[@]}" --output_dir="$TMP/one" --steps=8 --set="$SET" > "$TMP/one.log" 2>&1 ||
  fail "one-host run exited non-zero"
node "$NS_A" 0 29500 "$TMP/hostA.log" --output_dir="$TMP/A" --steps=8 --set="$SET" &
PIDS+=($!)
node "$NS_B" 1 29500 "$TMP/hostB.log" --output_dir="$TMP/B" --steps=8 --set="$SET" &
PIDS+=($!)
wait "${PIDS[0]}" || fail "host A exited non-zero"
wait "${PIDS[1]}" || fail "host B exited non-zero"
grep -q 'ranks 0-0 of 2 on node 0/2, store 10.77.0.1:29500' "$TMP/hostA.log" || fail "host A's launcher line"
grep -q 'ranks 1-1 of 2 on node 1/2, store 10.77.0.1:29500' "$TMP/hostB.log" || fail "host B's launcher line"
[[ $(losses "$TMP/one" | wc -l) -eq 8 ]] || fail "one-host run: $(losses "$TMP/one" | wc -l) losses, want 8"
diff <(losses "$TMP/one") <(losses "$TMP/A") > "$TMP/diff.log" || fail "two-host losses differ from one host's"
# The activations really crossed the veth (tens of kB per step).
rx=$(ip -n "$NS_A" -s -j link show pp0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
[[ $rx -gt 100000 ]] || fail "host A received only $rx bytes over the veth"
echo "ok: 8 steps on two hosts, losses equal the one-host run's ($(losses "$TMP/one" | head -1) .. $(losses "$TMP/one" | tail -1)); host A received $rx bytes over the veth"

# 2. The link goes down mid-run: both hosts fail within the timeout, naming the lost peer.
PIDS=()
SET2="$SET,parallelism.timeout_seconds=$TIMEOUT_S"
node "$NS_A" 0 29501 "$TMP/cutA.log" --output_dir="$TMP/cutA" --steps=100000 --set="$SET2" &
PIDS+=($!)
node "$NS_B" 1 29501 "$TMP/cutB.log" --output_dir="$TMP/cutB" --steps=100000 --set="$SET2" &
PIDS+=($!)
wait_for_step "$TMP/cutA.log" 3 || fail "the link-cut run did not reach step 3 in 120 s"
ip -n "$NS_A" link set pp0 down || fail "link down"
cut_at=$(date +%s.%N)
# Timeout, then the launcher's grace period (5 s) and slack for a loaded machine.
LIMIT=$((TIMEOUT_S + 5 + 25))
codes=()
for i in 0 1; do
  while kill -0 "${PIDS[$i]}" 2> /dev/null; do
    awk -v a="$cut_at" -v b="$(date +%s.%N)" -v l="$LIMIT" 'BEGIN { exit !(b - a > l) }' &&
      fail "host $i still running ${LIMIT} s after the link went down"
    sleep 0.2
  done
  wait "${PIDS[$i]}"
  codes+=($?)
done
elapsed=$(awk -v a="$cut_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
[[ ${codes[0]} -ne 0 ]] || fail "host A exited 0 after the link went down"
[[ ${codes[1]} -ne 0 ]] || fail "host B exited 0 after the link went down"
grep -qE '\[rank 0\] .*global rank 1\b' "$TMP/cutA.log" || fail "host A's rank 0 does not name global rank 1"
grep -qE '\[rank 1\] .*global rank 0\b' "$TMP/cutB.log" || fail "host B's rank 1 does not name global rank 0"
# Each launcher names its rank's place in the grid and the action it was in
# (a stage's action, or the step's tail: the cut can land in either).
grep -qE 'FAILED: rank 0 \(pipeline stage 0, data-parallel index 0; last action train step [0-9]+ (0[A-Z_]+[0-9]*|REDUCE_TIED|STEP)\)' \
  "$TMP/cutA.log" || fail "host A's launcher verdict"
grep -qE 'FAILED: rank 1 \(pipeline stage 1, data-parallel index 0; last action train step [0-9]+ (1[A-Z_]+[0-9]*|REDUCE_TIED|STEP)\)' \
  "$TMP/cutB.log" || fail "host B's launcher verdict"
echo "ok: link down after step 3; hosts exited ${codes[0]} and ${codes[1]} within ${elapsed} s (timeout ${TIMEOUT_S} s, limit ${LIMIT} s)"
grep -hE 'error|FAILED' "$TMP/cutA.log" "$TMP/cutB.log"

# 3. Restarts across hosts (--max_restarts, topology/restart_rounds.h): host
#    B's worker killed after the step-5 checkpoint; both launchers restart
#    together through the store host A's launcher hosts on port + 1, and the
#    run's losses equal an uninterrupted one-host run's. (A checkpoint dir both
#    hosts reach, as on shared storage.)
ip -n "$NS_A" link set pp0 up || fail "link up again after case 2"
PIDS=()
"$BIN" "${COMMON[@]}" --output_dir="$TMP/rone" --steps=12 --save_interval=5 --set="$SET" \
  > "$TMP/rone.log" 2>&1 || fail "one-host restart reference exited non-zero"
node "$NS_A" 0 29502 "$TMP/restartA.log" --output_dir="$TMP/restart" --steps=12 --save_interval=5 \
  --max_restarts=1 --restart_join_timeout=60s --set="$SET" &
PIDS+=($!)
node "$NS_B" 1 29502 "$TMP/restartB.log" --output_dir="$TMP/restart" --steps=12 --save_interval=5 \
  --max_restarts=1 --restart_join_timeout=60s --set="$SET" &
PIDS+=($!)
wait_for_step "$TMP/restartA.log" 7 || fail "the restart run did not reach step 7 in 120 s"
victim=""  # the worker of global rank 1 of this run (its store port says which run)
for p in $(pgrep -f "$(basename "$BIN")"); do
  env_of=$(tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null)
  grep -qx "RANK=1" <<< "$env_of" && grep -qx "MASTER_PORT=29502" <<< "$env_of" && victim=$p
done
[[ -n $victim ]] || fail "no worker of rank 1 under host B's launcher"
kill -9 "$victim"
wait "${PIDS[0]}" || fail "host A exited non-zero after the restart"
wait "${PIDS[1]}" || fail "host B exited non-zero after the restart"
for log in restartA restartB; do
  grep -q "restart 1/1 in 1s after node 1: rank 1 (.*) (pid $victim) was killed by signal 9" "$TMP/$log.log" ||
    fail "$log: no restart naming node 1's rank 1"
done
want=$(losses "$TMP/rone")
got=$(sed 's/.*"loss":\([^,]*\),.*"step":\([0-9]*\).*/\2 \1/' "$TMP"/restart/mh-*/metrics.jsonl | sort -n | awk '!seen[$1]++ {print $2}')
[[ $(echo "$want" | wc -l) -eq 12 && "$got" == "$want" ]] || fail "losses after the restart differ: '$got' vs '$want'"
echo "ok: host B's rank 1 killed after step 7; both hosts restarted together and the 12 losses equal the one-host run's"
echo PASS
