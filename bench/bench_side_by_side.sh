#!/usr/bin/env bash
# pipe, PyTorch 2.15 pipelining and DeepSpeed 0.14.1 side by side (issue #30):
#
#   bench/bench_side_by_side.sh [--mode both] [--reps 3] [--steps 6] [--warmup 2] ...
#
# Makes (once) the virtual environments: DeepSpeed 0.14.1 over Debian's
# python3-torch (bench/deepspeed_env.sh) and PyTorch 2.15
# (tools/python_env.sh torch-newest); builds //experiments:train_gpt and
# //experiments:schedule_explorer; then runs bench/bench_side_by_side.py with
# the arguments given. Appends its records to bench/results/side_by_side.jsonl
# (--results), prints a table on stderr and one JSON line on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ds_venv="$(bench/deepspeed_env.sh)"
torch_venv="$(tools/python_env.sh torch-newest)"
./bazelw build //experiments:train_gpt //experiments:schedule_explorer >&2
bin="$(./bazelw info bazel-bin 2>/dev/null)"
# tools/ on the path: bench_side_by_side.py writes its records with tools/results.py.
PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" PIPE_BENCH_COMMAND="bench/bench_side_by_side.sh $*" \
  exec "$ds_venv/bin/python" \
  bench/bench_side_by_side.py --train_gpt="$bin/experiments/train_gpt" \
  --explorer="$bin/experiments/schedule_explorer" --deepspeed="$ds_venv/bin/deepspeed" \
  --torch_python="$torch_venv/bin/python" "$@"
