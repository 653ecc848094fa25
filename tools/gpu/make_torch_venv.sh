#!/usr/bin/env bash
# Makes (once) a virtual environment with PyTorch 2.11.0 from PyPI, laid out
# like the lent GPU machines' image: site-packages/torch/lib beside
# site-packages/nvidia/*/lib (the cu130 wheel and the nvidia-* wheels its
# metadata pins). The GPU kit's CPU rehearsal (tools/gpu/rehearse.sh) and its
# self-containment check run the bundle against it, so the plumbing of
# run_on_device.sh is proven here before any GPU time is spent.
#
#   tools/gpu/make_torch_venv.sh            # prints the venv's python
#
# Where: $PIPE_TORCH_VENV, else ${XDG_CACHE_HOME:-~/.cache}/pipe-python/torch-2.11.0
# (about 4 GB: the CUDA libraries come with the wheel even for CPU use).
set -euo pipefail
version=2.11.0
venv="${PIPE_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pipe-python/torch-$version}"
if [[ ! -x "$venv/bin/python3" ]] ||
  [[ "$("$venv/bin/python3" -c 'import torch; print(torch.__version__)' 2>/dev/null)" != "$version"* ]]; then
  echo "make_torch_venv: installing torch==$version into $venv (pip, about 4 GB, once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check "torch==$version" >&2
fi
echo "$venv/bin/python3"
