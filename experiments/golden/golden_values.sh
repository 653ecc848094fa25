#!/usr/bin/env bash
# ./bazelw run //experiments:golden_values -- [golden_values.py flags]: the
# golden-value suite with the binaries of this build (experiments/golden/).
set -euo pipefail
cd "${RUNFILES_DIR:-$0.runfiles}/pipe"
exec python3 experiments/golden/golden_values.py --bin_dir=experiments "$@"
