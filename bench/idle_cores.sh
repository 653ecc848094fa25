#!/usr/bin/env bash
# threads.borrow_idle_cores per action (issue #43): builds train_gpt, then runs
# bench/idle_cores.py with the arguments given (--reps, --schedule, --chunks).
# Appends to bench/results/idle_cores.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
./bazelw build //experiments:train_gpt >&2
bin="$(./bazelw info bazel-bin 2>/dev/null)"
PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" PIPE_BENCH_COMMAND="bench/idle_cores.sh $*" \
  exec python3 bench/idle_cores.py --train_gpt="$bin/experiments/train_gpt" "$@"
