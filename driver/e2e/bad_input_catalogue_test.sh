#!/usr/bin/env bash
# The bad-input catalogue (issue #14): each case is a train_gpt command line
# that used to train garbage with exit 0, crash a worker or hang. Each must
# exit 2 from the launcher, before any worker starts, with a message naming
# the field or path at fault.
set -uo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
CONFIG=--config=experiments/configs/gpt_small_pp2.textproto

# Data and output paths that are wrong in each way.
mkdir -p "$TMP/empty" "$TMP/binary"
mkfifo "$TMP/fifo"
printf 'ab\0cd%.0s' $(seq 1 100) > "$TMP/binary/a.bin"
echo "too short for a context of 128 bytes" > "$TMP/short.txt"
echo "a file" > "$TMP/file"
printf '0F0,0B0\n1F0,1X0\n' > "$TMP/bad_schedule.csv"
# GPipe as a schedule file, 65536 micro-batches (awk: 0F0..0F65535 then the
# backwards, each rank a row; rank 1's row as rank 0's).
awk 'BEGIN { m = 65536; for (r = 0; r < 2; r++) {
  for (i = 0; i < m; i++) printf "%s%dF%d", (i ? "," : ""), r, i;
  for (i = 0; i < m; i++) printf ",%dB%d", r, i; printf "\n" } }' > "$TMP/gpipe_65536.csv"
# Whitespace only, in a folder with two links to itself (walked forever once).
mkdir -p "$TMP/blank" && printf '   \n\n\t\n%.0s' $(seq 1 100) > "$TMP/blank/a.txt"
ln -sfn . "$TMP/blank/s1" && ln -sfn . "$TMP/blank/s2"

# expected text in stderr | arguments after --config (no spaces inside one)
CASES=$(cat <<CASES_END
optimizer.lr (inf) must be finite and in (0, 10]|--lr=inf
optimizer.lr (1e+30) must be finite and in (0, 10]|--lr=1e30
lr_schedule.min_lr (-0.1) must be finite|--set=lr_schedule.min_lr=-0.1
lr_schedule.min_lr (0.5) must be finite and in [0, 0.003]|--set=lr_schedule.min_lr=0.5
optimizer.max_grad_norm (nan) must be finite and >= 0 (0 = no clipping)|--set=optimizer.max_grad_norm=nan
optimizer.eps (inf) must be finite and in (0, 1)|--set=optimizer.eps=1e400
optimizer.eps (-1e-08)|--set=optimizer.eps=-1e-8
optimizer.eps (nan)|--set=optimizer.eps=nan
optimizer.beta1 (1) must be finite and in [0, 1)|--set=optimizer.beta1=1
optimizer.beta2 (1.57) must be finite and in [0, 1)|--set=optimizer.beta2=1.57
log_interval (0) must be at least 1|--set=log_interval=0
gpt.num_layers (100000000) must be at most 100000|--set=gpt.num_layers=100000000
gpt.vocab_size (100) must be at least 260 and at most 16777216 (each of the byte tokenizer's 260 ids needs a row)|--set=gpt.vocab_size=100
parallelism.num_microbatches (1000000000) must be at most 65536|--microbatches=1000000000
the run needs an estimated|--set=gpt.num_layers=50000,gpt.width=8192,gpt.num_heads=64 --partition=uniform
config 'experiments/configs' is not a regular file (a directory)|--config=experiments/configs
flag --set is given 2 times|--set=steps=3 --set=lr_schedule.warmup_steps=1
flag --set is given 2 times (--set=lr_schedule.warmup_steps=1 --set=gpt.num_layers=8)|--steps=3 --set=lr_schedule.warmup_steps=1 --set=gpt.num_layers=8
data.path '$TMP/fifo' is a FIFO|--data=$TMP/fifo
data.path '$TMP/empty' is an empty folder|--data=$TMP/empty
data.path '$TMP/binary': none of its 1 file(s) is non-empty text|--data=$TMP/binary
data.path '$TMP/short.txt' holds 38 bytes of training text (after data.eval_fraction 0.05), shorter than context_length (64) + 1|--data=$TMP/short.txt
data.path '$TMP/nothing' does not exist|--data=$TMP/nothing
output_dir '$TMP/file/runs' cannot be created|--output_dir=$TMP/file/runs
parallelism.schedule 'zigzag' is not a registered schedule|--schedule=zigzag
precision 'fp16' is not supported: fp16 needs dynamic loss scaling|--precision=fp16
precision 'int8' is unknown; valid: fp32, bf16|--precision=int8
line 2, column 2 (rank 1): "1X0": malformed action|--schedule=csv:$TMP/bad_schedule.csv
optimizer.lr (inf) must be finite and in (0, 10]|--nproc_per_node=2 --lr=inf
nonfinite.policy 'maybe' must be 'fail' or 'skip'|--set=nonfinite.policy=maybe
nonfinite.max_skipped_steps (0) must be at least 1|--set=nonfinite.max_skipped_steps=0
parallelism.pp (2) x parallelism.dp (1) = 2 ranks, but 3 were started|--nproc_per_node=3
the experiment needs 2 ranks, which --nnodes=4 does not divide|--nnodes=4 --master_port=1
data.path '$TMP/blank': its 1 text file(s) hold only whitespace|--data=$TMP/blank
threads.intra_op (4096) must be at most|--set=threads.intra_op=4096
--intra_op_threads=100000 is more threads than this machine can run; valid: 0 (automatic) to|--intra_op_threads=100000
the run needs an estimated|--microbatches=65536 --chunks=2 --schedule=looped_bfs
the run needs an estimated|--microbatches=65536 --schedule=csv:$TMP/gpipe_65536.csv
parallelism.memory_cap_mib=60: pipeline rank 1 is predicted to peak at|--schedule=gpipe --microbatches=8 --set=parallelism.memory_cap_mib=60
checkpointable_types '[' does not compile as an ECMAScript regex|--ckpt_interval=1 --set=parallelism.activation_checkpointing.checkpointable_types=[
checkpointable_types 'NoSuchLayer' matches none of this model's layer types (GptEmbedding, TransformerBlock, FinalLayerNorm, LmHead)|--ckpt_interval=1 --set=parallelism.activation_checkpointing.checkpointable_types=NoSuchLayer
name '../../escape/x' (14 characters) is not a run name|--name=../../escape/x
(300 characters) is not a run name|--name=$(printf 'n%.0s' $(seq 1 300))
unknown argument 'garbage'; valid: 'profile' or 'profile:cap_mib=N|--partition=profile:garbage
sample_prompt is empty, but sample_tokens (|--set=sample_prompt=
checkpoint.resume '/nonexistent' does not exist|--resume=/nonexistent
checkpoint.dir '$TMP/file/ckpt' cannot be created|--save_interval=2 --set=checkpoint.dir=$TMP/file/ckpt
config field 'precision' is given twice, by --set=precision=bf16 and by --precision=fp32|--precision=fp32 --set=precision=bf16
config field 'steps' is given twice, by --set=steps=2 and by --steps=4|--steps=4 --set=steps=2
gpt.num_heads (4) must be a multiple of parallelism.tp (3)|--tp=3
parallelism.tp (0) must be at least 1|--tp=0
threads.borrow_idle_cores lends a rank the cores of its idle peers, but the launcher's --bind_cores pins every rank to its own|--borrow_idle_cores=true --bind_cores
threads.borrow_idle_cores lends CPU cores to BLAS threads; parallelism.device is 'cuda'|--borrow_idle_cores=true --device=cuda
parallelism.pp (2) x parallelism.dp (1) x parallelism.tp (2) = 4 ranks, but 2 were started|--tp=2 --nproc_per_node=2
parallelism.memory_cap_mib=12: pipeline rank 0 is predicted to peak at|--tp=2 --set=parallelism.memory_cap_mib=12
parallelism.auto_costs ('F:1,I:1,W:1') is for parallelism.schedule 'auto'|--auto_costs=F:1,I:1,W:1
parallelism.auto_costs 'F:0,B:2' needs F > 0 and B > 0|--schedule=auto --auto_costs=F:0,B:2
parallelism.sequence_parallel needs parallelism.tp > 1|--sequence_parallel=true
parallelism.ddp_bucket_size (-5) must be >= 1|--distributed_optimizer=true --set=parallelism.ddp_bucket_size=-5
data.packing 'packed' is unknown; valid: none, documents, padded|--set=data.packing=packed
data.packing_order 'longest' is unknown; valid: seed, cost|--set=data.packing=documents,data.packing_order=longest
data.packing_balance 'flops' is unknown; valid: tokens, cost|--set=data.packing=documents,data.packing_balance=flops
makes micro-batches of varying shapes, which parallelism.p2p_static_shapes cannot send|--set=data.packing=documents --p2p_static_shapes=true
data.packing 'documents' needs documents: data.source corpus or tokens, not synthetic|--set=data.packing=documents,data.source=synthetic
parallelism.vocab_async_collectives (true) is set without parallelism.vocab_parallel|--vocab_async_collectives=true
CASES_END
)

failures=0
count=0
while IFS='|' read -r want args; do
  count=$((count + 1))
  # shellcheck disable=SC2086  # the arguments are split on purpose
  out=(--output_dir="$TMP/runs")
  [[ $args == *--output_dir=* ]] && out=()
  config=("$CONFIG")
  [[ $args == *--config=* ]] && config=()
  timeout 120 "$BIN" "${config[@]}" "${out[@]}" $args > "$TMP/out.log" 2>&1
  code=$?
  if [[ $code -ne 2 ]]; then
    echo "FAIL: [$args] exited $code, want 2"; cat "$TMP/out.log"; failures=$((failures + 1)); continue
  fi
  if ! grep -qF -- "$want" "$TMP/out.log"; then
    echo "FAIL: [$args] message lacks '$want':"; cat "$TMP/out.log"; failures=$((failures + 1)); continue
  fi
  if grep -q '\[launcher\] starting\|\[rank ' "$TMP/out.log"; then
    echo "FAIL: [$args] workers were started"; cat "$TMP/out.log"; failures=$((failures + 1)); continue
  fi
  echo "ok: [$args] -> $(grep -m1 '^error' "$TMP/out.log")"
done <<< "$CASES"
[[ $count -ge 20 ]] || { echo "FAIL: only $count cases ran"; exit 1; }
[[ $failures -eq 0 ]] || { echo "FAIL: $failures of $count cases"; exit 1; }
echo "PASS: $count cases"
