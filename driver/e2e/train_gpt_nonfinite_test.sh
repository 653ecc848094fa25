#!/usr/bin/env bash
# Non-finite training (issue #14) with the real train_gpt: SGD at lr 10
# without clipping diverges (deterministically, seeded) within 8 steps. With
# nonfinite.policy=fail the run stops at the first non-finite step naming the
# step, the value and the first stage/rank/tensor, and never saves a
# non-finite state (keep_last=1 keeps the last finite checkpoint). With
# policy=skip the updates are skipped, counted, and the run fails after
# max_skipped_steps in a row.
set -uo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS" ''
SET=optimizer.name=sgd,optimizer.max_grad_norm=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0,eval_interval=0,log_interval=1,gpt.width=32,gpt.context_length=32,parallelism.micro_batch_size=2
fail() { echo "FAIL: $*"; cat "$TMP/log"; exit 1; }
run() {  # run POLICY: trains 20 steps, saving every step, keeping 1
  timeout 300 "$BIN" --config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" \
    --output_dir="$TMP/runs-$1" --name=n --sample_tokens=0 --steps=20 --lr=10 --save_interval=1 \
    --keep_last=1 --set="$SET,nonfinite.policy=$1,nonfinite.max_skipped_steps=3" > "$TMP/log" 2>&1
  code=$?
  [[ $code -ne 0 ]] || fail "policy $1: a diverging run exited 0"
}
expect_log() { grep -qE -- "$1" "$TMP/log" || fail "log lacks /$1/"; }
# The step named in the error, and the newest checkpoint, must be finite.
finite_latest() {
  local ckpt=$TMP/runs-$1/checkpoints/n
  [[ -f $ckpt/latest ]] || fail "no checkpoint was kept"
  local latest; latest=$(cat "$ckpt/latest")
  [[ $(ls -d "$ckpt"/step_* | wc -l) -eq 1 ]] || fail "keep_last=1 kept $(ls "$ckpt")"
  echo "$latest"
}

run fail
# One of loss / gradient norm, or both ("loss nan, gradient norm nan": where the
# divergence lands depends on the LibTorch version and kernels).
expect_log "error: .*step [0-9]+: (loss [^ ]+|gradient norm [^ ]+|loss [^ ]+, gradient norm [^ ]+) is not finite; first at stage [0-9] \(rank [0-9], data-parallel id 0\): layers\.[0-9]+\.[a-z0-9_.]+ \((gradient|weight)\)"
expect_log "Stopped before saving \(nonfinite.policy=fail\)"
step=$(grep -m1 -oE "error: .*step [0-9]+:" "$TMP/log" | grep -oE "[0-9]+:$" | tr -d :)
latest=$(finite_latest fail)
[[ $latest == $(printf 'step_%08d' $((step - 1))) ]] || fail "latest $latest, want the step before $step"
# Every step before the failing one logged a finite loss.
grep "step [0-9]*/20  loss" "$TMP/log" | grep -qi "nan\|inf" && fail "a non-finite loss was logged"
echo "ok: fail policy stopped at step $step, latest $latest"

run skip
expect_log "update skipped \(nonfinite.policy=skip, 1 in a row, 1 in all\)"
expect_log "update skipped \(nonfinite.policy=skip, 3 in a row, 3 in all\)"
expect_log "3 steps in a row had no finite gradient \(nonfinite.max_skipped_steps = 3\)"
latest=$(finite_latest skip)
echo "ok: skip policy gave up after 3 skipped steps, latest $latest"
echo PASS
