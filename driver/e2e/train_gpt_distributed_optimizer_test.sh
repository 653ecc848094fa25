#!/usr/bin/env bash
# train_gpt with the distributed optimizer (issue #39) through the launcher:
# pp 2 x dp 2 (4 processes), AdamW with clipping, against the same run
# without it.
#   - every step's loss within 1e-5 relative (the slices' update is the
#     unsharded one element for element; the gradient norm is summed per
#     slice instead of per parameter, so clipping's factor may differ in the
#     last bits; the runtime's equivalence suite proves the maths schedule by
#     schedule);
#   - its checkpoints hold the weights whole and each data rank's own part
#     of the optimizer state: resumed with it, steps 9-12 equal the straight
#     run's bit for bit; resumed at dp 1 without it (the parts put
#     together), within 1e-5;
#   - the stage-0 rank's measured step peak is below the run's without it;
#   - schedule auto (measured, synthesised, switched) keeps the losses;
#   - a bucket size of 0 is refused before any worker starts.
set -uo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
source driver/e2e/e2e_testing.sh  # losses, close_losses
CORPUS=$TMP/corpus.txt
for i in $(seq 1 200); do echo "Replica $((i % 5)) keeps a slice of the moments; the rest it gathers."; done > "$CORPUS"
COMMON=(--data="$CORPUS" --output_dir="$TMP/runs" --steps=12 --pp=2 --sample_tokens=0)
# dp 2 x 4 micro-batches: the global batch dp 1 x 8 sees too.
SET=eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,gpt.width=32,gpt.num_heads=4,gpt.context_length=16,parallelism.micro_batch_size=2,checkpoint.resume_other_runs=true
fail() { echo "FAIL: $*"; [[ -f ${LOG:-} ]] && tail -30 "$LOG"; exit 1; }
run() {  # run NAME FLAGS...: a run that must succeed
  local name=$1; shift
  LOG=$TMP/$name.log
  timeout 300 "$BIN" "${COMMON[@]}" --set="$SET" --name="$name" "$@" > "$LOG" 2>&1 ||
    fail "$name exited $?"
}
peak() { sed -nE 's/^\[rank 0\]   rank 0 stage 0: step peak ([0-9.]+) MiB.*/\1/p' "$TMP/$1.log"; }

run whole --dp=2 --microbatches=4 --save_interval=4
run sharded --dp=2 --microbatches=4 --distributed_optimizer=true --save_interval=4
grep -q 'pp=2 x dp=2 (distributed optimizer)' "$LOG" || fail "the header does not name the distributed optimizer"
[[ $(losses whole | wc -l) -eq 12 ]] || fail "the run without it has $(losses whole | wc -l) losses, want 12"
close_losses "$(losses whole)" "$(losses sharded)" "distributed optimizer vs without" ||
  fail "the distributed optimizer's losses differ"
python3 -c "import sys; sys.exit(0 if float('$(peak sharded)') < float('$(peak whole)') else 1)" ||
  fail "rank 0's step peak is $(peak sharded) MiB with the distributed optimizer, $(peak whole) MiB without"
echo "ok: rank 0's step peak $(peak sharded) MiB with the distributed optimizer, $(peak whole) MiB without"

# schedule auto measures, synthesises and switches schedules with the
# distributed optimizer on; the losses stay the run's without it.
run auto --dp=2 --microbatches=4 --distributed_optimizer=true --schedule=auto
grep -q 'schedule auto: ' "$LOG" || fail "schedule auto did not report its choice"
close_losses "$(losses whole)" "$(losses auto)" "schedule auto with the distributed optimizer vs 1F1B without" ||
  fail "schedule auto's losses differ"

CKPT=$TMP/runs/checkpoints/sharded/step_00000008
# The weights whole, the optimizer state in each data rank's own parts
# (nothing of it unsharded): every data rank wrote some.
[[ -f $CKPT/layer_01-model_states.pt && ! -e $CKPT/layer_01-optim_states.pt ]] ||
  fail "layer_01's files are not whole weights and per-rank optimizer parts: $(ls "$CKPT" | tr '\n' ' ')"
for d in 00 01; do
  ls "$CKPT"/*-data_$d-optim_states.pt > /dev/null 2>&1 ||
    fail "data rank $d wrote no optimizer part: $(ls "$CKPT" | tr '\n' ' ')"
done
grep -q 'sliced: true' "$CKPT/manifest.textproto" || fail "the manifest records no slices"
run resumed --dp=2 --microbatches=4 --distributed_optimizer=true --resume="$CKPT"
grep -q 'resumed at step 8' "$LOG" || fail "did not resume at step 8"
want=$(losses sharded | awk '$1 > 8')
[[ "$(losses resumed)" == "$want" ]] || fail "resumed losses '$(losses resumed | tr '\n' ' ')' differ from '$(echo $want)'"
echo "ok: resumed with the distributed optimizer, steps 9-12 equal the straight run's bit for bit"
run unsharded --dp=1 --microbatches=8 --resume="$CKPT"  # the same global batch
close_losses "$want" "$(losses unsharded)" "resumed at dp 1 without it, steps 9-12" ||
  fail "steps 9-12 resumed at dp 1 without the distributed optimizer differ"

LOG=$TMP/refused.log
timeout 60 "$BIN" "${COMMON[@]}" --set="$SET,parallelism.ddp_bucket_size=0" --name=refused \
  --dp=2 --microbatches=4 --distributed_optimizer=true > "$LOG" 2>&1
[[ $? -eq 2 ]] && grep -q 'parallelism.ddp_bucket_size (0) must be >= 1' "$LOG" ||
  fail "a bucket size of 0 was not refused naming the field"
echo "ok: a bucket size of 0 is refused before launch"
echo PASS
