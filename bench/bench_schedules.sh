#!/usr/bin/env bash
# ./bazelw run //bench:bench_schedules -- [--reps 3 --steps 12 --warmup 4 ...]
# Runs bench_schedules.py (see there) with this build's train_gpt and
# schedule_explorer; bazel run starts it in the runfiles tree.
set -euo pipefail
exec python3 bench/bench_schedules.py --train_gpt experiments/train_gpt \
  --explorer experiments/schedule_explorer "$@"
