#!/usr/bin/env bash
# Runs bench_schedules_test.py (see there) with this build's schedule_explorer.
set -euo pipefail
exec python3 bench/bench_schedules_test.py "$1"
