#!/usr/bin/env bash
# The GPU kit's CPU rehearsal (docs/gpus_and_libtorch.md "The GPU kit"): the bundle and its
# run_on_device.sh, run here exactly as on a lent GPU machine but against a
# pip-installed PyTorch 2.11.0+cu130 (tools/python_env.sh torch-2.11: the
# device's site-packages layout, its python3 first on PATH) and with
# --device=cpu, so the plumbing (version check, library path, test filters,
# XML, training, loss comparison, bench, summary) is proven before any GPU
# time is spent. Appends one record to bench/results/gpu_kit_rehearsal.jsonl.
#
#   tools/gpu/rehearse.sh [--no_bundle] [run_on_device.sh arguments]
# Defaults sized for the loaded 2-core machine: --budget_s=900 --stage_scale=4 --train_steps=30 --compare_steps=5
# --bench_steps=3 (later arguments win).
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=1
if [[ ${1:-} == --no_bundle ]]; then
  bundle=0
  shift
fi
venv=$(tools/python_env.sh torch-2.11) || exit 1
python=$venv/bin/python3
if ((bundle)); then
  tools/gpu/bundle.sh || exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/gpu_kit_rehearsal.XXXXXX")
args=(--device=cpu --out="$out" --budget_s=900 --stage_scale=4 --train_steps=30 --compare_steps=5 --bench_steps=3 "$@")
command="PATH=$(dirname "$python"):\$PATH gpu_bundle/run_on_device.sh ${args[*]}"
PATH="$(dirname "$python"):$PATH" gpu_bundle/run_on_device.sh "${args[@]}"
rc=$?
tools/gpu/record_run.py "$out/summary.json" --bench=gpu_kit_rehearsal --command="tools/gpu/rehearse.sh -> $command" \
  --exit_status="$rc" --machine="the 2-core development machine, shared with other builds; no GPU" \
  >> bench/results/gpu_kit_rehearsal.jsonl
echo "rehearse: exit $rc; summary $out/summary.json; record appended to bench/results/gpu_kit_rehearsal.jsonl" >&2
exit $rc
