#!/usr/bin/env bash
# Smoke test of the README's first command: grid_demo with 4 launched ranks
# (pp=2, dp=2) must exit 0 and print a checked row for every rank.
set -euo pipefail
demo="$1"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
out="$("$demo" --nproc_per_node=4 --pp=2 --dp=2 --timeout_s=60 2>&1)" || {
  echo "grid_demo failed:"; echo "$out"; exit 1; }
echo "$out"
rows="$(awk '/^\[rank 0\] +[0-9]+  \([0-9],[0-9],[0-9]\)/ { n++ } END { print n + 0 }' <<<"$out")"
if [[ "$rows" != 4 ]]; then echo "expected 4 table rows, got $rows"; exit 1; fi
if grep -qE '[0-9]!=[0-9]' <<<"$out"; then echo "a group result is wrong"; exit 1; fi
# Rank 2 (stage 1, dp 0) belongs to pipe group [0,2] and data group [2,3].
grep -qE '^\[rank 0\] +2  \(1,0,0\) +1 +0  \[0,2\] +\[2,3\]' <<<"$out" || {
  echo "row of rank 2 is not as expected"; exit 1; }
echo PASS
