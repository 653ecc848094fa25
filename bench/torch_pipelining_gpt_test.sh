#!/usr/bin/env bash
# bench/torch_pipelining_gpt.py (PyTorch 2.15 pipelining, 2 ranks) at a tiny
# size under 1F1B, Interleaved1F1B and ZBVZeroBubble: each trains the same
# model as the single process of bench/torch_gpt_reference.py (same seed, same
# rows), so the first and last step's losses must agree with it to 1e-5 (the
# split, the tied embedding's summed gradients, scale_grads, AdamW). No timing.
# The venv is tools/python_env.sh's torch-newest, made once per machine under
# the real home (Bazel points HOME at the test's temporary directory).
set -euo pipefail
home="$(getent passwd "$(id -u)" | cut -d: -f6)"
python="$(HOME="$home" tools/python_env.sh torch-newest)/bin/python"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
size=(--width=32 --layers=4 --heads=4 --context=16 --micro_batch_size=2 --microbatches=4
  --steps=2 --warmup=1)
result() { grep -o '{.*}' | tail -n 1; }
reference="$("$python" bench/torch_gpt_reference.py --threads=1 "${size[@]}" | result)"
port=$((29600 + RANDOM % 2000))
for schedule in 1F1B Interleaved1F1B ZBVZeroBubble; do
  port=$((port + 1))
  got="$("$python" bench/torch_pipelining_gpt.py --schedule="$schedule" --master_port="$port" \
    "${size[@]}" 2>&1 | grep '^RESULT ' | result)"
  python3 - "$schedule" "$reference" "$got" <<'PY'
import json, sys
schedule, want, got = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for key in ("loss_first", "loss_last"):
    if abs(want[key] - got[key]) > 1e-5:
        sys.exit(f"{schedule}: {key} {got[key]} != single process {want[key]}")
if got["tokens_per_step"] != want["tokens_per_step"] or got["tokens_per_s"] <= 0:
    sys.exit(f"{schedule}: bad figures {got}")
print(f"{schedule}: losses {got['loss_first']:.6f} -> {got['loss_last']:.6f} as the single process")
PY
done
