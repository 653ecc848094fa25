#!/usr/bin/env bash
# The physical limits on this machine for the peer GPT (issue #16):
#
#   bench/bench_limits.sh [--reps 3] [--steps 8] [--deepspeed_tokens_per_s 3110] ...
#
# Builds //experiments:train_gpt and //bench:bench_memcpy, then runs
# bench/bench_limits.py (see there): pp = 1 alone and two at once (the
# 2-core ceiling), memcpy bandwidth alone and two at once, pp = 2 runs with
# every thread's CPU per step. Prints one JSON line on stdout, a table on
# stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
./bazelw build //experiments:train_gpt //bench:bench_memcpy >&2
bin="$(./bazelw info bazel-bin 2>/dev/null)"
exec python3 bench/bench_limits.py --train_gpt="$bin/experiments/train_gpt" \
  --bench_memcpy="$bin/bench/bench_memcpy" "$@"
