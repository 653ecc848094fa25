#!/usr/bin/env bash
# train_from_libraries: two launched ranks train the GPT composed from pipe's
# library targets; the loss falls, and a Trainer resumed from its checkpoint
# takes the next step exactly as the original does.
set -uo pipefail
binary="$1"
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
dir="${TEST_TMPDIR:-/tmp}/library_api_ckpt"
rm -rf "$dir"
out="$("$binary" --steps=30 --checkpoint_dir="$dir" 2>&1)"
status=$?
echo "$out"
if [[ $status != 0 ]]; then echo "FAIL: exit status $status"; exit 1; fi
grep -qE '^\[rank 0\] checkpoint .*: the resumed step [0-9]+ has loss .* \(equal\)$' <<<"$out" || {
  echo "FAIL: no equal resumed step"; exit 1; }
read -r first last < <(sed -nE 's/^\[rank 0\] first loss ([0-9.]+), last loss ([0-9.]+)$/\1 \2/p' <<<"$out")
if [[ -z "${first:-}" ]]; then echo "FAIL: no loss line"; exit 1; fi
python3 -c "import sys; f, l = $first, $last; sys.exit(0 if l < 0.5 * f else 1)" || {
  echo "FAIL: the loss did not halve ($first -> $last)"; exit 1; }
# The partition report names both stages.
grep -qE '^\[rank 0\] stage=1 chunk=0 \(part 1\) layers=' <<<"$out" || { echo "FAIL: no partition report"; exit 1; }
echo PASS
