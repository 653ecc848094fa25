#!/usr/bin/env bash
# pipe vs DeepSpeed 0.14.1 on the peer GPT, side by side (issue #16):
#
#   bench/bench_vs_deepspeed.sh [--reps 5] [--steps 10] [--variant name='--schedule=gpipe'] ...
#
# Makes (once) a virtual environment with DeepSpeed 0.14.1 over Debian's
# python3-torch (1.13, the LibTorch pipe builds against; bench/deepspeed_env.sh)
# in ~/.cache/pipe-python/deepspeed-0.14.1, builds //experiments:train_gpt and
# //experiments:schedule_explorer (the simulator's prediction of each pipe
# run), then runs bench/bench_vs_deepspeed.py with the arguments given.
# Prints one JSON line (both medians and the ratio) on stdout, a table on
# stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(bench/deepspeed_env.sh)"
./bazelw build //experiments:train_gpt //experiments:schedule_explorer >&2
bin="$(./bazelw info bazel-bin 2>/dev/null)"
exec "$venv/bin/python" bench/bench_vs_deepspeed.py \
  --train_gpt="$bin/experiments/train_gpt" --explorer="$bin/experiments/schedule_explorer" \
  --deepspeed="$venv/bin/deepspeed" "$@"
