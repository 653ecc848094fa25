#!/usr/bin/env bash
# python_env.sh: makes (once) and prints the path of one of pipe's Python
# virtual environments, pinned by tools/python_envs/<name>.txt.
#
#   tools/python_env.sh torch-newest               # the venv's path
#   tools/python_env.sh --torch_dir torch-newest   # its torch/ folder (a LibTorch)
#
# The venv lives in ${XDG_CACHE_HOME:-~/.cache}/pipe-python/NAME-<hash of the
# pin file>, shared by every clone, so changing a pin makes a new one and CI
# downloads a wheel once per machine. It is made under a lock (two tests may
# ask at once) and counts only once its marker file is written: an interrupted
# install is redone, never used half-made. pip's output goes to stderr; stdout
# carries only the path.
set -euo pipefail

usage() { echo "usage: $0 [--torch_dir] NAME  (NAME: one of $(ls "$(dirname "$0")/python_envs" | sed 's/\.txt$//' | tr '\n' ' '))" >&2; exit 2; }
torch_dir=0
if [[ ${1:-} == --torch_dir ]]; then torch_dir=1; shift; fi
[[ $# -eq 1 ]] || usage
name=$1
pins="$(cd "$(dirname "$0")" && pwd)/python_envs/$name.txt"
[[ -f $pins ]] || { echo "python_env.sh: no pin file $pins" >&2; usage; }

root="${XDG_CACHE_HOME:-$HOME/.cache}/pipe-python"
hash=$(sha256sum "$pins" | cut -c1-12)
venv="$root/$name-$hash"
mkdir -p "$root"
exec 9>"$root/.$name-$hash.lock"
if ! flock -w 1800 9; then
  echo "python_env.sh: another process has held $root/.$name-$hash.lock for 30 minutes" >&2
  exit 1
fi
if [[ ! -f $venv/.complete ]]; then
  echo "python_env.sh: making $venv from $pins (once)" >&2
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >&2; then
    echo "python_env.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$pins" >&2
  touch "$venv/.complete"
fi
flock -u 9
if ((torch_dir)); then
  "$venv/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))'
else
  echo "$venv"
fi
