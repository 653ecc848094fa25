#!/usr/bin/env bash
# pipe vs DeepSpeed 0.14.1 on the peer GPT, side by side (issue #16):
#
#   bench/bench_vs_deepspeed.sh [--reps 5] [--steps 10] [--variant name='--schedule=gpipe'] ...
#
# Makes (once) a virtual environment with DeepSpeed 0.14.1 over Debian's
# python3-torch (1.13, the LibTorch pipe builds against) in
# ~/.cache/pipe-python/deepspeed-0.14.1, builds //experiments:train_gpt and
# //experiments:schedule_explorer (the simulator's prediction of each pipe
# run), then runs bench/bench_vs_deepspeed.py with the arguments given.
# Prints one JSON line (both medians and the ratio) on stdout, a table on
# stderr.
# Why 0.14.1: older need Intel's extension on CPU, 0.14.2-0.14.5 JIT-build an op
# that needs ninja, 0.15+ need pydantic 2 (Debian 12 has 1.10).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PIPE_DEEPSPEED_VENV:-$HOME/.cache/pipe-python/deepspeed-0.14.1}"
packages=(python3-torch python3-venv python3-cpuinfo python3-pydantic python3-packaging
  python3-tqdm python3-psutil)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bench_vs_deepspeed: installing ${missing[*]} (DeepSpeed's dependencies)" >&2
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
if [[ ! -x "$venv/bin/deepspeed" ]]; then
  echo "bench_vs_deepspeed: making $venv (deepspeed 0.14.1 over the system torch)" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-deps deepspeed==0.14.1 hjson >&2
fi
./bazelw build //experiments:train_gpt //experiments:schedule_explorer >&2
bin="$(./bazelw info bazel-bin 2>/dev/null)"
exec "$venv/bin/python" bench/bench_vs_deepspeed.py \
  --train_gpt="$bin/experiments/train_gpt" --explorer="$bin/experiments/schedule_explorer" \
  --deepspeed="$venv/bin/deepspeed" "$@"
