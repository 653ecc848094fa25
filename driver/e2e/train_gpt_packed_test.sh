#!/usr/bin/env bash
# train_gpt on packed documents (issue #41, data.packing) through the
# launcher, on a corpus of paragraphs of 1 to 12 lines:
#   - the same global batches under every layout: pp 2 (8 micro-batches),
#     pp 1 x dp 2 (4 each), pp 2 x tp 2 with sequence parallelism (rows
#     padded to even lengths) and pp 2 with vocabulary parallelism train to
#     losses within 1e-5 of each other;
#   - resume continues mid-epoch with the same packing: resumed at step 4,
#     steps 5-12 equal the straight run's bit for bit;
#   - cost balancing and the padded baseline run and say so in the header.
set -uo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
source driver/e2e/e2e_testing.sh  # losses, close_losses
CORPUS=$TMP/corpus.txt
awk 'BEGIN { srand(7); for (p = 0; p < 150; p++) { n = 1 + int(rand() * 12);
  for (l = 0; l < n; l++) printf "Paragraph %d line %d packs whole documents.\n", p, l; printf "\n" } }' > "$CORPUS"
COMMON=(--data="$CORPUS" --output_dir="$TMP/runs" --steps=12 --sample_tokens=0)
SET=eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,gpt.width=32,gpt.num_heads=4,gpt.context_length=64,parallelism.micro_batch_size=2,checkpoint.resume_other_runs=true,data.packing=documents
fail() { echo "FAIL: $*"; [[ -f ${LOG:-} ]] && tail -30 "$LOG"; exit 1; }
run() {  # run NAME FLAGS...: a run that must succeed
  local name=$1; shift
  LOG=$TMP/$name.log
  timeout 300 "$BIN" "${COMMON[@]}" --name="$name" "$@" > "$LOG" 2>&1 || fail "$name exited $?"
}

run pp2 --set="$SET" --pp=2 --microbatches=8 --save_interval=4
grep -q 'paragraphs packed (documents, tokens)' "$LOG" || fail "the header does not name the packing"
[[ $(losses pp2 | wc -l) -eq 12 ]] || fail "pp2 has $(losses pp2 | wc -l) losses, want 12"
run dp2 --set="$SET" --pp=1 --dp=2 --microbatches=4
close_losses "$(losses pp2)" "$(losses dp2)" "packed, pp 1 x dp 2 vs pp 2" || fail "pp 1 x dp 2 differs"
run tp2 --set="$SET" --pp=2 --tp=2 --sequence_parallel=true --microbatches=8
close_losses "$(losses pp2)" "$(losses tp2)" "packed, pp 2 x tp 2 + SP vs pp 2" || fail "tp 2 differs"
run vocab --set="$SET" --pp=2 --vocab_parallel=true --microbatches=8
close_losses "$(losses pp2)" "$(losses vocab)" "packed, pp 2 with vocabulary parallelism vs pp 2" ||
  fail "vocabulary parallelism differs"

CKPT=$TMP/runs/checkpoints/pp2/step_00000004
run resumed --set="$SET" --pp=2 --microbatches=8 --resume="$CKPT"
grep -q 'resumed at step 4' "$LOG" || fail "did not resume at step 4"
want=$(losses pp2 | awk '$1 > 4')
[[ "$(losses resumed)" == "$want" ]] || fail "resumed losses '$(losses resumed | tr '\n' ' ')' differ from '$(echo $want)'"
echo "ok: resumed at step 4, steps 5-12 equal the straight run's bit for bit"

run cost --set="$SET,data.packing_balance=cost" --pp=2 --microbatches=8
grep -q 'paragraphs packed (documents, cost)' "$LOG" || fail "the header does not name cost balancing"
run padded --set="${SET/data.packing=documents/data.packing=padded}" --pp=2 --microbatches=8
grep -q 'paragraphs packed (padded, tokens)' "$LOG" || fail "the header does not name the padded baseline"
echo PASS
