#!/usr/bin/env bash
# deepspeed_env.sh: makes (once) and prints the path of the virtual
# environment with DeepSpeed 0.14.1 over Debian's python3-torch (1.13, the
# LibTorch pipe builds against): ${PIPE_DEEPSPEED_VENV:-~/.cache/pipe-python/deepspeed-0.14.1}.
# Used by bench_vs_deepspeed.sh and bench_side_by_side.sh. Installs DeepSpeed's
# Debian dependencies first if they are missing (apt-get, as root or by sudo).
# Why 0.14.1: older need Intel's extension on CPU, 0.14.2-0.14.5 JIT-build an op
# that needs ninja, 0.15+ need pydantic 2 (Debian 12 has 1.10).
# Progress goes to stderr; stdout carries only the path.
set -euo pipefail
venv="${PIPE_DEEPSPEED_VENV:-$HOME/.cache/pipe-python/deepspeed-0.14.1}"
packages=(python3-torch python3-venv python3-cpuinfo python3-pydantic python3-packaging
  python3-tqdm python3-psutil numactl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deepspeed_env: installing ${missing[*]} (DeepSpeed's dependencies)" >&2
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
if [[ ! -x "$venv/bin/deepspeed" ]]; then
  echo "deepspeed_env: making $venv (deepspeed 0.14.1 over the system torch)" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-deps deepspeed==0.14.1 hjson >&2
fi
echo "$venv"
