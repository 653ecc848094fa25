#!/usr/bin/env bash
# Resume safety (issue #14) with the real train_gpt: a broken `latest` or a
# corrupted newest checkpoint never makes --resume=auto start over (it takes
# the newest checkpoint whose files verify and says so), a fresh run never
# saves into a directory holding another run's checkpoints, a re-saved step
# keeps the old directory, and a checkpoint of another model or seed, or of
# another run (name), is refused naming the fields or the runs.
set -uo pipefail
BIN=$1
source driver/e2e/e2e_testing.sh  # TMP, write_corpus, must_run
CORPUS=$TMP/corpus.txt
write_corpus "$CORPUS" ''
COMMON=(--config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" --output_dir="$TMP/runs"
  --sample_tokens=0 --name=r --save_interval=2)
SET=eval_interval=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0,gpt.width=32,gpt.num_heads=4,gpt.context_length=32,parallelism.micro_batch_size=2
EXTRA=""  # more --set fields for the next run (the flag may be given once)
CKPT=$TMP/runs/checkpoints/r
fail() { echo "FAIL: $*"; cat "$TMP/log"; exit 1; }
# SET with the fields of $1 (",field=value,...") replaced: a field given twice
# in one --set is refused (issue #42 class 9).
merged_set() {
  local s=",$SET," kv
  for kv in ${1//,/ }; do s=$(sed "s/,${kv%%=*}=[^,]*,/,/" <<< "$s"); done
  s=${s#,}; echo "${s%,}$1"
}
# run WANT_EXIT args...: train_gpt's exit status must be WANT_EXIT (0 or non-zero).
run() {
  local want=$1; shift
  timeout 300 "$BIN" "${COMMON[@]}" --set="$(merged_set "$EXTRA")" "$@" > "$TMP/log" 2>&1
  local code=$?
  if [[ $want == 0 && $code -ne 0 ]]; then fail "train_gpt $* exited $code, want 0"; fi
  if [[ $want != 0 && $code -eq 0 ]]; then fail "train_gpt $* exited 0, want an error"; fi
  echo "ok: [$*] exit $code"
}
expect_log() { grep -qF -- "$1" "$TMP/log" || fail "log lacks '$1'"; }

run 0 --steps=4
[[ -d $CKPT/step_00000002 && -d $CKPT/step_00000004 ]] || fail "steps 2 and 4 not saved"

# 1. `latest` garbage: resume from the newest verified one (step 4), loudly.
echo "garbage" > "$CKPT/latest"
run 0 --steps=6 --resume=auto
expect_log "resumed at step 4"
expect_log "should hold a checkpoint directory name"
expect_log "resuming from $CKPT/step_00000004, the newest checkpoint whose files all verify"
[[ $(cat "$CKPT/latest") == step_00000006 ]] || fail "latest is $(cat "$CKPT/latest")"

# 2. `latest` gone and the newest checkpoint truncated: step 6 is skipped,
# step 4 resumed, and the new step 6 does not delete the damaged one.
rm "$CKPT/latest"
f=$(ls "$CKPT"/step_00000006/layer_*-model_states.pt | head -1)
head -c 100 "$f" > "$f.cut" && mv "$f.cut" "$f"
run 0 --steps=6 --resume=auto
expect_log "resumed at step 4"
expect_log "is missing"
expect_log "skipped: step_00000006: checkpoint file"
[[ -d $CKPT/step_00000006.replaced-1 ]] || fail "the damaged step 6 was deleted, not kept"

# 3. `latest` naming `..`, the newest manifest deleted: still step 4.
echo ".." > "$CKPT/latest"
rm "$CKPT/step_00000006/manifest.textproto"
run 0 --steps=5 --resume=auto
expect_log "resumed at step 4"

# 4. A fresh run that saves is refused in a directory holding checkpoints.
run 1 --steps=2
expect_log "already holds"
expect_log "resume=auto"
[[ -d $CKPT/step_00000002 && -d $CKPT/step_00000004 ]] || fail "checkpoints were touched"

# 5. Another model shape or seed: refused, each field named; allowed with
# checkpoint.allow_config_change.
EXTRA=,gpt.num_heads=2
run 1 --steps=8 --resume=auto --seed=7
expect_log "gpt.num_heads: 4 in the checkpoint, 2 now"
expect_log "seed: 1234 in the checkpoint, 7 now"
run 1 --steps=8 --resume=auto --lr=1e-3
expect_log "optimizer.lr: "
EXTRA=,gpt.num_heads=2,checkpoint.allow_config_change=true
run 0 --steps=6 --resume=auto
expect_log "resumed at step 4"
expect_log "gpt.num_heads: 4 in the checkpoint, 2 now"
EXTRA=""

# 8. Found by the launcher before any worker starts (issue #42 class 7): a
# config that does not match, a named checkpoint whose file fails its
# checksum, and a checkpoint dir a live run holds.
no_workers() { ! grep -q '\[launcher\] starting' "$TMP/log" || fail "workers were started"; }
EXTRA=,gpt.width=64
run 1 --steps=8 --resume=auto
expect_log "gpt.width: 32 in the checkpoint, 64 now"
no_workers
EXTRA=""
cp -r "$CKPT/step_00000004" "$TMP/flipped"
f=$(ls "$TMP"/flipped/layer_*-model_states.pt | head -1)
printf '\xff\xfe' | dd of="$f" bs=1 seek=200 conv=notrunc status=none
run 1 --steps=8 --resume="$TMP/flipped"
expect_log "checkpoint file $f has CRC32C"
no_workers
# The holder is the process that has the lock open (flock(1)'s own child would
# outlive a kill of flock and keep holding it for later cases).
(flock 9 && exec sleep 120) 9> "$CKPT/.lock" &
holder=$!
for _ in $(seq 100); do flock -n "$CKPT/.lock" true || break; sleep 0.1; done
run 1 --steps=8 --resume=auto
kill "$holder"
wait "$holder" 2> /dev/null
flock -n "$CKPT/.lock" true || fail "the test's lock holder still holds $CKPT/.lock"
expect_log "checkpoint dir $CKPT is in use by"
no_workers

# 7. Another run (another name) continuing from r's checkpoints: refused,
# naming both runs; allowed with checkpoint.resume_other_runs (issue 29).
other() {
  timeout 300 "$BIN" --config=experiments/configs/gpt_small_pp2.textproto --data="$CORPUS" \
    --output_dir="$TMP/runs" --sample_tokens=0 --name=other --steps=8 --resume=auto \
    --set="$(merged_set ",gpt.num_heads=2,checkpoint.dir=$CKPT$1")" > "$TMP/log" 2>&1
}
other ""
code=$?
[[ $code -ne 0 ]] || fail "run 'other' continued from run 'r's checkpoint"
expect_log "was written by run 'r', not by this run ('other')"
expect_log "--set=checkpoint.resume_other_runs=true"
echo "ok: another run's checkpoint refused (exit $code)"
other ",checkpoint.resume_other_runs=true" || fail "resume_other_runs=true: exit $?"
expect_log "resumed at step 6"
echo "ok: checkpoint.resume_other_runs=true continues from it"

# 6. Every checkpoint unusable: an error, never a fresh start.
for d in "$CKPT"/step_*; do rm -f "$d/manifest.textproto"; done
echo "step_00000004" > "$CKPT/latest"
run 1 --steps=6 --resume=auto
expect_log "holds no usable checkpoint"
echo PASS
