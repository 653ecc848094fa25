#!/usr/bin/env bash
# The golden-value suite has teeth: two cases run clean, then with each
# planted change (PP_PLANTED_FAULT, driver/run_experiment.h), must differ:
#   - grad_norm_order: the gradient norm's squares summed in reverse order
#     (the same norm up to its last bits): caught bit for bit;
#   - dropped_microbatch: the last micro-batch's gradient left out: caught
#     bit for bit, and also within the cross-machine tolerances (--tolerant).
# Another BLAS kernel (OPENBLAS_CORETYPE=Prescott) stays within the
# tolerances on the case that moved most when they were measured, and a bad
# PP_PLANTED_FAULT is refused before any worker starts.
set -euo pipefail
TMP=${TEST_TMPDIR:-$(mktemp -d)}
GOLDEN=(python3 experiments/golden/golden_values.py --bin_dir=experiments)
CASES=gpt_pp1,gpt_pp2_zb_h1
"${GOLDEN[@]}" --cases=$CASES,gpt_pp2_looped_bfs --regenerate --why="the clean run" --golden_dir="$TMP/clean"
PP_PLANTED_FAULT=grad_norm_order "${GOLDEN[@]}" --cases=$CASES --golden_dir="$TMP/clean" --expect_differences
PP_PLANTED_FAULT=dropped_microbatch "${GOLDEN[@]}" --cases=$CASES --golden_dir="$TMP/clean" --expect_differences --tolerant
OPENBLAS_CORETYPE=Prescott "${GOLDEN[@]}" --cases=gpt_pp2_looped_bfs --golden_dir="$TMP/clean" --tolerant

set +e
PP_PLANTED_FAULT=bogus experiments/train_gpt --steps=21 --output_dir="$TMP/runs" > "$TMP/bad.log" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat "$TMP/bad.log"; echo "FAIL: PP_PLANTED_FAULT=bogus exited $code, not 2"; exit 1; }
grep -q "PP_PLANTED_FAULT='bogus' is not a planted fault (testing only: grad_norm_order or dropped_microbatch, or unset)" "$TMP/bad.log" ||
  { cat "$TMP/bad.log"; echo "FAIL: message"; exit 1; }
! ls -d "$TMP"/runs/* 2> /dev/null || { echo "FAIL: a worker started with a bad PP_PLANTED_FAULT"; exit 1; }
echo "ok: PP_PLANTED_FAULT=bogus refused before launch"
