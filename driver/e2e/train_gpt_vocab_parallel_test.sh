#!/usr/bin/env bash
# train_gpt with vocabulary parallelism (issue #40) through the launcher: the
# tied token table split by rows over the pipeline's ranks, its passes in the
# schedule.
#   - pp 2, 1F1B with the passes placed (AddVocabularyPasses): every step's
#     loss within 1e-5 relative of the same run without it (the runtime's
#     vocab_equivalence_test proves the maths case by case);
#   - the same under 1f1b_vocab1 (the one-barrier output algorithm, OUT_T
#     after the last stage's backward), and with
#     --vocab_async_collectives=true the same run's losses exactly, and
#     (zbv_vocab1, a wider model) no more memory on any rank;
#   - the same over the partition `profile` finds for the body; and the
#     one-barrier passes placed into ZB-H1 (--vocab_barriers=1: a schedule
#     without its own, split backward) over that partition (one run covers
#     both: the profile partitioner with one barrier, and the flag);
#   - pp 2 x dp 2 under zbv_vocab (V placement, split backward) against
#     1F1B at dp 2 without it, and the same with the distributed optimizer
#     and with schedule auto (measured, synthesised, switched, passes added
#     to its choice; the registered one-barrier schedules among its
#     candidates);
#   - checkpoints: the vocabulary run's are the dense model's (the table
#     whole): resumed with it, steps 6-10 equal the straight run's bit for
#     bit; resumed without it, within 1e-5; hf_convert exports it;
#   - sampling: greedy text from the gathered logits equals the run's
#     without it;
#   - composed with tensor parallelism: pp 2 x tp 2, the table over pipe x
#     tensor (a quarter of the rows per rank), every step's loss within 1e-5
#     of the tp 1 vocabulary run's; the same with sequence parallelism; its
#     checkpoint (the table written as tp 2 writes it, a row shard per tensor
#     rank) resumed exactly at tp 2, within 1e-5 at tp 1 and at tp 2 without
#     vocab_parallel; the tp 1 run's resumed at tp 2 within 1e-5; schedule
#     auto over the profile partition at tp 2, asked for one barrier (no
#     two-barrier schedule weighed), within 1e-5 of the tp 1 run;
#   - refused before launch, by name: a vocabulary schedule without
#     vocab_parallel, a bad --vocab_barriers, --vocab_async_collectives
#     without vocab_parallel, and for a model without a
#     vocabulary split (BERT is not linked here: the message names the models
#     that support it).
set -uo pipefail
BIN=$1 CONVERT=$2
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
source driver/e2e/e2e_testing.sh  # losses, close_losses
CORPUS=$TMP/corpus.txt
for i in $(seq 1 200); do echo "Rank $((i % 5)) keeps rows of the vocabulary; the head is everyone's."; done > "$CORPUS"
COMMON=(--data="$CORPUS" --output_dir="$TMP/runs" --steps=10 --pp=2 --sample_tokens=0)
SET=eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,gpt.width=32,gpt.num_heads=4,gpt.context_length=16,parallelism.micro_batch_size=2,checkpoint.resume_other_runs=true
fail() { echo "FAIL: $*"; [[ -f ${LOG:-} ]] && tail -30 "$LOG"; exit 1; }
# run NAME FLAGS...: a run that must succeed. STEPS, SAMPLE_TOKENS and SET
# may be given for one call (STEPS=3 run ...), as train_gpt takes each flag once.
run() {
  local name=$1; shift
  LOG=$TMP/$name.log
  timeout 300 "$BIN" --data="$CORPUS" --output_dir="$TMP/runs" --pp=2 --steps="${STEPS:-10}" \
    --sample_tokens="${SAMPLE_TOKENS:-0}" --set="$SET" --name="$name" "$@" > "$LOG" 2>&1 ||
    fail "$name exited $?"
}
refused() {  # refused NAME MESSAGE FLAGS...: exit 2 before launch, naming MESSAGE
  local name=$1 message=$2; shift 2
  LOG=$TMP/$name.log
  timeout 60 "$BIN" "${COMMON[@]}" --set="$SET" --name="$name" "$@" > "$LOG" 2>&1
  local rc=$?
  [[ $rc -eq 2 ]] || fail "$name exited $rc, want 2 (refused before launch)"
  grep -qF "$message" "$LOG" || fail "$name's refusal does not say '$message'"
  echo "ok: refused: $(grep -F "$message" "$LOG" | head -1)"
}

run dense --microbatches=4
run vocab --microbatches=4 --vocab_parallel=true --save_interval=5
grep -q 'pp=2 x dp=1 (vocabulary parallel)' "$LOG" || fail "the header does not name vocabulary parallelism"
[[ $(losses dense | wc -l) -eq 10 ]] || fail "the dense run has $(losses dense | wc -l) losses, want 10"
close_losses "$(losses dense)" "$(losses vocab)" "vocabulary parallel vs dense, pp 2 1F1B" ||
  fail "vocabulary parallelism changes the losses"

run vocab1 --microbatches=4 --vocab_parallel=true --schedule=1f1b_vocab1
close_losses "$(losses dense)" "$(losses vocab1)" "one-barrier vocabulary parallel (1f1b_vocab1) vs dense, pp 2" ||
  fail "the one-barrier algorithm changes the losses"
# Asynchronous collectives (each waited for where its result is read): the
# same run's losses, every step to the printed digit.
run vocab1_async --microbatches=4 --vocab_parallel=true --schedule=1f1b_vocab1 \
  --vocab_async_collectives=true
grep -q 'pp=2 x dp=1 (vocabulary parallel, asynchronous collectives)' "$LOG" ||
  fail "the header does not name the asynchronous collectives"
[[ "$(losses vocab1_async)" == "$(losses vocab1)" ]] ||
  fail "asynchronous collectives change the losses: '$(losses vocab1_async | tr '\n' ' ')' vs '$(losses vocab1 | tr '\n' ' ')'"
echo "ok: 1f1b_vocab1 with asynchronous collectives gives the blocking run's losses exactly"
# Its trace shows each collective in flight, from the action that started it
# to its completion, in the background process; the blocking run's has none.
in_flight() {  # in_flight NAME: "<collectives> <spans in flight>" of the run's trace.json
  python3 - "$(ls -d "$TMP"/runs/"$1"-*/ | head -1)trace.json" <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
started = {(e["tid"], e["name"]) for e in events if e.get("pid", 0) == 0 and
           e["cat"] in ("OUT_BCAST", "OUT_STATS", "OUT_REDUCE", "IN_REDUCE", "IN_BCAST")}
flights = [e for e in events if e.get("pid", 0) == 1 and "started_by" in e.get("args", {})]
assert all((e["tid"], e["args"]["started_by"]) in started and e["dur"] >= 0 for e in flights), flights
print(len(started), len(flights))
PY
}
read -r collectives flights <<< "$(in_flight vocab1_async)" || fail "vocab1_async's trace.json is unreadable"
[[ $collectives -gt 0 && $flights -eq $collectives ]] ||
  fail "vocab1_async's trace shows $flights collectives in flight of $collectives started"
read -r collectives flights <<< "$(in_flight vocab1)" || fail "vocab1's trace.json is unreadable"
[[ $flights -eq 0 ]] || fail "the blocking run's trace shows $flights collectives in flight"
echo "ok: the asynchronous run's trace shows its $collectives collectives in flight"
# ... and hold no more memory than the blocking run: a result a rank never
# reads (IN_REDUCE off stage 0's rank, OUT_REDUCE off the last stage's) is
# released once complete, not kept to the step's tail (which held 8 of these
# 256 KiB sums, 2 MiB, at rank 1's peak under zbv_vocab1 at this width).
peaks() {  # peaks NAME: every rank's peak bytes, from the run's summary.json
  python3 -c 'import json, sys; print(*[r["peak_bytes"] for r in json.load(open(sys.argv[1]))["ranks"]])' \
    "$(ls -d "$TMP"/runs/"$1"-*/ | head -1)summary.json"
}
mem_run() {  # mem_run NAME FLAGS...: zbv_vocab1 at the width where a sum is 256 KiB
  STEPS=3 SET=eval_interval=0,log_interval=1,lr_schedule.warmup_steps=1,gpt.width=128,gpt.num_heads=4,gpt.context_length=64,parallelism.micro_batch_size=8 \
    run "$@" --microbatches=4 --vocab_parallel=true --schedule=zbv_vocab1 --chunks=2
}
mem_run mem_blocking
mem_run mem_async --vocab_async_collectives=true
read -r -a blocking_peaks <<< "$(peaks mem_blocking)" || fail "mem_blocking has no summary.json"
read -r -a async_peaks <<< "$(peaks mem_async)" || fail "mem_async has no summary.json"
[[ ${#async_peaks[@]} -eq 2 && ${#blocking_peaks[@]} -eq 2 ]] ||
  fail "want 2 ranks' peaks, got '${blocking_peaks[*]}' and '${async_peaks[*]}'"
for r in 0 1; do
  # Two sums' slack (524288 bytes): a collective still in flight when polled.
  ((async_peaks[r] <= blocking_peaks[r] + 524288)) ||
    fail "rank $r's peak with asynchronous collectives is ${async_peaks[r]} bytes, blocking ${blocking_peaks[r]}"
done
echo "ok: asynchronous collectives' peaks ${async_peaks[*]} bytes, blocking ${blocking_peaks[*]}"

# partition_method profile times the body's layers (rank 0 on its share of
# the sample's embeddings); the losses stay the dense run's.
run profile --microbatches=4 --vocab_parallel=true --partition=profile
# (grep on the files, not on a pipe: grep -q's early exit would fail cat
# under pipefail.)
grep -qs "partition 'profile' measured by rank 0" "$LOG" "$TMP"/runs/profile-*/logs/* ||
  fail "rank 0 did not profile the partition: $(ls "$TMP"/runs/profile-*/logs 2>&1 | tr '\n' ' ')"
close_losses "$(losses dense)" "$(losses profile)" "vocabulary parallel over the profile partition vs dense" ||
  fail "the profile-partitioned vocabulary run's losses differ"
run profile_vocab1 --microbatches=4 --vocab_parallel=true --vocab_barriers=1 --schedule=zb_h1 \
  --partition=profile
grep -q 'pp=2 x dp=1 (vocabulary parallel, 1 barrier)' "$LOG" ||
  fail "the header does not name the one-barrier form"
grep -qs "partition 'profile' measured by rank 0" "$LOG" "$TMP"/runs/profile_vocab1-*/logs/* ||
  fail "rank 0 did not profile the partition under ZB-H1 with one barrier"
close_losses "$(losses dense)" "$(losses profile_vocab1)" \
  "one-barrier passes placed into ZB-H1 over the profile partition vs dense" ||
  fail "the one-barrier passes placed into ZB-H1 change the losses"

run dense_dp2 --dp=2 --microbatches=4
run zbv_vocab --dp=2 --microbatches=4 --vocab_parallel=true --schedule=zbv_vocab --chunks=2
close_losses "$(losses dense_dp2)" "$(losses zbv_vocab)" "zbv_vocab at pp 2 x dp 2 vs dense 1F1B" ||
  fail "zbv_vocab's losses differ"
run zero1 --dp=2 --microbatches=4 --vocab_parallel=true --distributed_optimizer=true
close_losses "$(losses dense_dp2)" "$(losses zero1)" "with the distributed optimizer at pp 2 x dp 2 vs dense 1F1B" ||
  fail "vocabulary parallelism with the distributed optimizer differs"
run auto --dp=2 --microbatches=4 --vocab_parallel=true --schedule=auto
grep -q 'schedule auto: ' "$LOG" || fail "schedule auto did not report its choice"
# The passes were measured and every candidate simulated with them.
grep -Eq 'schedule auto: vocabulary passes OUT_S=[0-9.]+,OUT_T=[0-9.]+,IN_F=[0-9.]+,IN_B=[0-9.]+' "$LOG" &&
  grep -q 'lower bound .* (without the passes)' "$LOG" ||
  fail "schedule auto did not cost the vocabulary passes"
# The registered one-barrier schedule is a candidate as it is.
grep -Eq '1f1b_vocab1 +[0-9.]+ ' "$LOG" || fail "schedule auto did not simulate 1f1b_vocab1"
close_losses "$(losses dense_dp2)" "$(losses auto)" "schedule auto with vocabulary parallelism vs dense 1F1B" ||
  fail "schedule auto's losses differ"

CKPT=$TMP/runs/checkpoints/vocab/step_00000005
[[ -f $CKPT/tied_embed-model_states.pt && -f $CKPT/tied_embed-optim_states.pt ]] ||
  fail "no tied_embed files (the whole table) in $(ls "$CKPT" | tr '\n' ' ')"
run resumed --microbatches=4 --vocab_parallel=true --resume="$CKPT"
grep -q 'resumed at step 5' "$LOG" || fail "did not resume at step 5"
want=$(losses vocab | awk '$1 > 5')
[[ "$(losses resumed)" == "$want" ]] || fail "resumed losses '$(losses resumed | tr '\n' ' ')' differ from '$(echo $want)'"
echo "ok: resumed with vocabulary parallelism, steps 6-10 equal the straight run's bit for bit"
run resumed_dense --microbatches=4 --resume="$CKPT"
close_losses "$want" "$(losses resumed_dense)" "resumed without vocabulary parallelism, steps 6-10" ||
  fail "steps 6-10 resumed without vocabulary parallelism differ"
"$CONVERT" export --checkpoint="$CKPT" --hf_dir="$TMP/hf_vocab" > "$TMP/export.log" 2>&1 ||
  { LOG=$TMP/export.log; fail "hf_convert export of the vocabulary run's checkpoint failed"; }
[[ -s $TMP/hf_vocab/model.safetensors ]] || fail "the export wrote no model.safetensors"
echo "ok: hf_convert exports the vocabulary run's checkpoint"

# Composed with tensor parallelism: the table over pipe x tensor.
run vocab_tp2 --microbatches=4 --vocab_parallel=true --tp=2 --save_interval=5
grep -q 'pp=2 x dp=1 x tp=2 (vocabulary parallel)' "$LOG" ||
  fail "the header does not name tp 2 with vocabulary parallelism"
close_losses "$(losses vocab)" "$(losses vocab_tp2)" "vocabulary parallel at pp 2 x tp 2 vs tp 1" ||
  fail "vocabulary parallelism at tp 2 changes the losses"
CKPT_TP=$TMP/runs/checkpoints/vocab_tp2/step_00000005
for m in 00 01; do
  [[ -f $CKPT_TP/tied_embed-model_$m-model_states.pt ]] ||
    fail "no tied_embed file of tensor-parallel rank $m in $(ls "$CKPT_TP" | tr '\n' ' ')"
done
run resumed_vocab_tp2 --microbatches=4 --vocab_parallel=true --tp=2 --resume="$CKPT_TP"
want_tp2=$(losses vocab_tp2 | awk '$1 > 5')
[[ "$(losses resumed_vocab_tp2)" == "$want_tp2" ]] ||
  fail "resumed at tp 2: '$(losses resumed_vocab_tp2 | tr '\n' ' ')' differ from '$(echo $want_tp2)'"
echo "ok: resumed at pp 2 x tp 2 with vocabulary parallelism, steps 6-10 equal the straight run's bit for bit"
run resumed_dense_tp2 --microbatches=4 --tp=2 --resume="$CKPT_TP"
close_losses "$want" "$(losses resumed_dense_tp2)" "tp 2's vocabulary checkpoint resumed at tp 2 without it, steps 6-10" ||
  fail "steps 6-10 resumed at tp 2 without vocabulary parallelism differ"
run vocab_sp --microbatches=4 --vocab_parallel=true --tp=2 --sequence_parallel=true
close_losses "$(losses vocab)" "$(losses vocab_sp)" "vocabulary parallel at pp 2 x tp 2 + sequence parallel vs tp 1" ||
  fail "vocabulary parallelism with sequence parallelism changes the losses"
# Schedule auto and the profile partitioner at pp 2 x tp 2, asked for the
# one-barrier form: tensor rank 0 of stage 0 profiles the body, every rank
# measures the passes, auto weighs no two-barrier schedule, and the losses
# stay the tp 1 vocabulary run's.
run vocab_tp2_auto --microbatches=4 --vocab_parallel=true --tp=2 --schedule=auto --partition=profile \
  --vocab_barriers=1
grep -q 'vocabulary parallel, 1 barrier' "$LOG" || fail "auto at tp 2 did not report the asked form"
grep -Eq '1f1b_vocab1 +[0-9.]+ ' "$LOG" || fail "schedule auto did not simulate 1f1b_vocab1 at tp 2"
if grep -Eq '(1f1b|zbv)_vocab +[0-9.]+ ' "$LOG"; then fail "schedule auto weighed a two-barrier schedule"; fi
grep -qs "partition 'profile' measured by rank 0" "$LOG" "$TMP"/runs/vocab_tp2_auto-*/logs/* ||
  fail "rank 0 did not profile the partition at tp 2"
grep -Eq 'schedule auto: vocabulary passes OUT_S=[0-9.]+,OUT_T=[0-9.]+,IN_F=[0-9.]+,IN_B=[0-9.]+' "$LOG" ||
  fail "schedule auto did not cost the vocabulary passes at tp 2"
close_losses "$(losses vocab)" "$(losses vocab_tp2_auto)" "schedule auto over the profile partition at pp 2 x tp 2 vs tp 1" ||
  fail "schedule auto with the profile partition at tp 2 changes the losses"
run resumed_tp1 --microbatches=4 --vocab_parallel=true --resume="$CKPT_TP"
close_losses "$want" "$(losses resumed_tp1)" "tp 2's checkpoint resumed at tp 1, steps 6-10" ||
  fail "steps 6-10 resumed at tp 1 from the tp 2 vocabulary checkpoint differ"
run resumed_tp2 --microbatches=4 --vocab_parallel=true --tp=2 --resume="$CKPT"
close_losses "$want" "$(losses resumed_tp2)" "tp 1's checkpoint resumed at tp 2, steps 6-10" ||
  fail "steps 6-10 resumed at tp 2 from the tp 1 vocabulary checkpoint differ"

sample() {  # sample NAME FLAGS...: 4 steps, then 24 tokens of greedy text
  STEPS=4 SAMPLE_TOKENS=24 run "$@" --microbatches=4
}
sample dense_sample
sample vocab_sample --vocab_parallel=true
DENSE_SAMPLE=$(cat "$TMP"/runs/dense_sample-*/sample.txt)
VOCAB_SAMPLE=$(cat "$TMP"/runs/vocab_sample-*/sample.txt)
[[ -n $DENSE_SAMPLE && "$VOCAB_SAMPLE" == "$DENSE_SAMPLE" ]] ||
  fail "the vocabulary-parallel sample '$VOCAB_SAMPLE' differs from the dense run's '$DENSE_SAMPLE'"
echo "ok: sampling with vocabulary parallelism gives the dense run's text: '$VOCAB_SAMPLE'"

refused vocab_schedule "has vocabulary passes; set parallelism.vocab_parallel=true" \
  --microbatches=4 --schedule=1f1b_vocab
refused vocab_barriers "parallelism.vocab_barriers (3) must be 1" \
  --microbatches=4 --vocab_parallel=true --vocab_barriers=3
refused vocab_async "parallelism.vocab_async_collectives (true) is set without parallelism.vocab_parallel" \
  --microbatches=4 --vocab_async_collectives=true
echo PASS
