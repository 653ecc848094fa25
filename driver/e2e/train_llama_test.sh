#!/usr/bin/env bash
# train_llama at pp=2 through the launcher over a small flat uint16 token file
# (ids below 300, documents of a repeating pattern) with a tiny LLaMA (GQA,
# dropout on):
#   1. a token id at llama.vocab_size is refused before any worker starts,
#      naming the file and the byte offset;
#   2. 6 steps straight equal 4 steps saving a checkpoint, then a fresh launch
#      resuming at step 4 (the data source resumes exactly mid-epoch: each
#      step draws 8 of ~2000 windows); losses identical;
#   3. the loss decreases over 30 steps and the sample is decoded with a
#      byte-level tokenizer.json;
#   4. vocabulary parallelism with the untied head (two tables): the
#      checkpoint holds both whole (layer 0's embedding, the last layer's
#      head, as a run without it writes them); resumed with it, the losses
#      equal its straight run's; resumed without it, within 1e-5; at
#      pp 2 x tp 2 within 1e-5 of tp 1, its checkpoint resumed at tp 4 with
#      it and at tp 1 without it, continuing tp 1's losses;
#   5. multi-query attention (one kv head) at pp 2 x tp 2, the kv head held
#      by both ranks: losses within 1e-5 of tp 1's; its checkpoint resumes at
#      tp 1 and at tp 4 (the kv head on 4 ranks), continuing tp 1's losses
#      (pp stays 2: dropout's streams are per stage).
set -euo pipefail
BIN=$1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}

python3 - "$TMP" <<'PY'
import json, struct, sys
tmp = sys.argv[1]
tokens = []
for doc in range(40):
    tokens += [((doc + j) % 7) * 37 % 251 + 1 + (j % 3) for j in range(50)] + [0]
with open(f"{tmp}/tokens.bin", "wb") as f:
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
bad = list(tokens)
bad[1000] = 300
with open(f"{tmp}/bad.bin", "wb") as f:
    f.write(struct.pack(f"<{len(bad)}H", *bad))
# A byte-level vocabulary (GPT-2's byte map): <|endoftext|> 0, byte b at b + 1.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = list(bs), 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {"<|endoftext|>": 0}
vocab.update({chr(c): b + 1 for b, c in zip(bs, cs)})
json.dump({"added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
           "model": {"type": "BPE", "vocab": vocab, "merges": []}},
          open(f"{tmp}/tokenizer.json", "w"))
PY

SET="eval_interval=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0,optimizer.lr=3e-3"
SET+=",llama.width=32,llama.num_layers=2,llama.num_heads=4,llama.num_kv_heads=2"
SET+=",llama.intermediate_size=48,llama.vocab_size=300,llama.context_length=16,llama.dropout=0.1"
SET+=",llama.tokenizer=$TMP/tokenizer.json,parallelism.micro_batch_size=2"
COMMON=(--config=experiments/configs/llama_small_pp2.textproto --output_dir="$TMP/runs")
source driver/e2e/e2e_testing.sh  # close_losses
run() { "$BIN" "${COMMON[@]}" --data="$TMP/tokens.bin" "$@" > "$TMP/log" 2>&1 || { cat "$TMP/log"; echo "FAIL: train_llama $* exited non-zero"; exit 1; }; }
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"/metrics.jsonl; }  # one run directory's
numbered() { awk '{print NR, $1}'; }  # "i loss" lines, as close_losses compares them

# 1. Token 1000 is 300: refused by the launcher (exit 2), no run directory.
set +e
"$BIN" "${COMMON[@]}" --set="$SET" --sample_tokens=0 --data="$TMP/bad.bin" --steps=2 --name=bad > "$TMP/bad.log" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat "$TMP/bad.log"; echo "FAIL: bad token file exited $code, not 2"; exit 1; }
grep -q "bad.bin: token 1000 (byte offset 2000) is 300, outside the model's vocabulary \[0, 300)" \
  "$TMP/bad.log" || { cat "$TMP/bad.log"; echo "FAIL: message"; exit 1; }
! ls -d "$TMP"/runs/bad-* 2> /dev/null || { echo "FAIL: a worker started for a bad token file"; exit 1; }

# 2. Exact resume.
run --set="$SET" --sample_tokens=0 --steps=6 --name=straight
run --set="$SET" --sample_tokens=0 --steps=4 --save_interval=4 --name=resumed
run --set="$SET" --sample_tokens=0 --steps=6 --resume=auto --name=resumed
grep -q 'resumed at step 4' "$TMP/log" || { cat "$TMP/log"; echo "FAIL: did not resume at step 4"; exit 1; }
STRAIGHT=$(losses "$TMP"/runs/straight-*)
RESUMED=$(for d in $(ls -d "$TMP"/runs/resumed-* | sort); do losses "$d"; done)
echo "straight: $(echo $STRAIGHT)"
echo "resumed:  $(echo $RESUMED)"
[[ $(echo "$STRAIGHT" | wc -l) -eq 6 ]] || { echo "FAIL: expected 6 losses"; exit 1; }
[[ "$STRAIGHT" == "$RESUMED" ]] || { echo "FAIL: resumed losses differ from the straight run"; exit 1; }

# 3. Learning and a decoded sample.
# Dropout off for the learning check: each field once per --set (a field given
# twice is refused).
run --steps=30 --name=learn --sample_tokens=12 --set="${SET/llama.dropout=0.1/llama.dropout=0},sample_prompt=ab"
L=$(losses "$TMP"/runs/learn-*)
FIRST=$(echo "$L" | head -1)
LAST=$(echo "$L" | tail -3 | awk '{s += $1} END {print s / NR}')
echo "loss: first $FIRST, mean of the last 3 $LAST"
awk -v a="$FIRST" -v b="$LAST" 'BEGIN {exit !(b < a - 0.5)}' ||
  { echo "FAIL: the loss did not decrease by 0.5"; exit 1; }
grep -q "sample (top-5, 12 " "$TMP/log" || { cat "$TMP/log"; echo "FAIL: no sample"; exit 1; }
SAMPLE=$(cat "$TMP"/runs/learn-*/sample.txt)
[[ $SAMPLE == ab* && $SAMPLE != *"token ids"* ]] ||
  { echo "FAIL: sample '$SAMPLE' not decoded from the prompt 'ab'"; exit 1; }

# 4. Vocabulary parallelism's checkpoints (LLaMA: embedding and head untied).
V=(--set="$SET" --sample_tokens=0 --vocab_parallel=true)
run "${V[@]}" --steps=6 --name=vocab_straight
run "${V[@]}" --steps=4 --save_interval=4 --name=vocab_resumed
CKPT=$(ls -d "$TMP"/runs/checkpoints/vocab_resumed/step_00000004)
for f in layer_00-model_states.pt layer_00-optim_states.pt layer_04-model_states.pt layer_04-optim_states.pt; do
  [[ -f $CKPT/$f ]] || { ls "$CKPT"; echo "FAIL: no $f (a table, whole) in the checkpoint"; exit 1; }
done
run "${V[@]}" --steps=6 --resume=auto --name=vocab_resumed
STRAIGHT=$(losses "$TMP"/runs/vocab_straight-*)
RESUMED=$(for d in $(ls -d "$TMP"/runs/vocab_resumed-* | sort); do losses "$d"; done)
[[ "$STRAIGHT" == "$RESUMED" ]] ||
  { echo "FAIL: vocabulary-parallel resume '$(echo $RESUMED)' differs from '$(echo $STRAIGHT)'"; exit 1; }
echo "ok: vocabulary parallelism (untied head) resumes exactly"
run --set="$SET,checkpoint.resume_other_runs=true" --sample_tokens=0 --steps=6 --resume="$CKPT" --name=vocab_dense
close_losses "$(echo "$STRAIGHT" | tail -2 | numbered)" "$(losses "$TMP"/runs/vocab_dense-* | numbered)" \
  "resumed without vocabulary parallelism, steps 5-6" ||
  { echo "FAIL: resumed without vocabulary parallelism, the losses differ"; exit 1; }

# ... and over pipe x tensor: at pp 2 x tp 2 each rank holds a quarter of
# both tables' rows; its checkpoint (each table written as tp 2 writes it, a
# row shard per tensor rank) resumes at pp 2 x tp 4 with vocabulary
# parallelism (an eighth of the rows per rank, the 2 kv heads replicated) and
# at tp 1 without it.
run "${V[@]}" --steps=4 --tp=2 --save_interval=4 --name=vocab_tp2
close_losses "$(echo "$STRAIGHT" | head -4 | numbered)" "$(losses "$TMP"/runs/vocab_tp2-* | numbered)" \
  "vocabulary parallel (untied head) at pp 2 x tp 2 vs tp 1, steps 1-4" ||
  { echo "FAIL: vocabulary parallelism at tp 2 differs from tp 1"; exit 1; }
CKPT=$(ls -d "$TMP"/runs/checkpoints/vocab_tp2/step_00000004)
for to in "--tp=4 --vocab_parallel=true" "--tp=1 --vocab_parallel=false"; do
  # shellcheck disable=SC2086  # two flags
  run --set="$SET,checkpoint.resume_other_runs=true" --sample_tokens=0 --steps=6 --resume="$CKPT" $to \
    --name=vocab_from_tp2
  grep -q 'resumed at step 4' "$TMP/log" || { cat "$TMP/log"; echo "FAIL: $to did not resume at step 4"; exit 1; }
  close_losses "$(echo "$STRAIGHT" | tail -2 | numbered)" \
    "$(losses "$(ls -td "$TMP"/runs/vocab_from_tp2-* | head -1)" | numbered)" \
    "the untied vocabulary's tp 2 checkpoint resumed with $to, steps 5-6" ||
    { echo "FAIL: the tp 2 vocabulary checkpoint resumed with $to differs"; exit 1; }
done

# 5. One kv head under tensor parallelism (replicated on the model group).
MQA=(--set="${SET/llama.num_kv_heads=2/llama.num_kv_heads=1},checkpoint.resume_other_runs=true" --sample_tokens=0)
run "${MQA[@]}" --steps=6 --name=mqa_tp1
run "${MQA[@]}" --steps=4 --tp=2 --save_interval=4 --name=mqa_tp2
TP1=$(losses "$TMP"/runs/mqa_tp1-*)
close_losses "$(echo "$TP1" | head -4 | numbered)" "$(losses "$TMP"/runs/mqa_tp2-* | numbered)" \
  "one kv head at tp 2 vs tp 1, steps 1-4" || { echo "FAIL: one kv head at tp 2 differs from tp 1"; exit 1; }
CKPT=$(ls -d "$TMP"/runs/checkpoints/mqa_tp2/step_00000004)
for to in --tp=1 --tp=4; do
  run "${MQA[@]}" --steps=6 --resume="$CKPT" "$to" --name=mqa_from_tp2
  grep -q 'resumed at step 4' "$TMP/log" || { cat "$TMP/log"; echo "FAIL: $to did not resume at step 4"; exit 1; }
  close_losses "$(echo "$TP1" | tail -2 | numbered)" "$(losses "$(ls -td "$TMP"/runs/mqa_from_tp2-* | head -1)" | numbered)" \
    "one kv head, tp 2 checkpoint resumed with $to, steps 5-6" ||
    { echo "FAIL: the tp 2 checkpoint resumed with $to differs"; exit 1; }
done
echo PASS
