#!/usr/bin/env bash
# Runs a pp_cc_fuzz_test binary: BIN --runs=N --seconds=S CORPUS_FILE...
# (the driver's arguments), failing on any crash or sanitizer report.
set -euo pipefail
exec "$@"
