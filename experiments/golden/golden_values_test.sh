#!/usr/bin/env bash
# Every case of the golden-value suite against its committed golden file
# (experiments/golden/README.md): bit for bit on the machine facts the file
# was made on, within the stated tolerances elsewhere.
set -euo pipefail
exec python3 experiments/golden/golden_values.py --bin_dir=experiments
