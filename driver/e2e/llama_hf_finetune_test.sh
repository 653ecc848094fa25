#!/usr/bin/env bash
# A randomly initialised transformers LlamaForCausalLM (GQA, untied head;
# models/llama/llama_hf_reference.py through checkpoint/hf/hf_check.py make, save_pretrained) imported with hf_convert
# and fine-tuned by train_llama at pp=2 (real processes) on a token file:
#   - the run resumes from the import at step 0, and its first loss is the
#     imported model's (equal to a second fine-tune's, different from a fresh
#     init's);
#   - the import also trains at pp 2 x tp 2: the first two losses equal the
#     tp 1 run's within 1e-5;
#   - the loss is finite and falls;
#   - the fine-tuned checkpoint exports back (hf_convert export) and
#     transformers loads it: its loss on the training tokens is below the
#     original model's.
set -euo pipefail
TRAIN=$1 CONVERT=$2 HF_CHECK=$3 PYENV=$4 LLAMA_REFERENCE=$5
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}
# Bazel runs tests without HOME; the venv lives under the user's ~/.cache.
[[ -n ${HOME:-} ]] || export HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
PY="$("$PYENV" torch-newest)/bin/python"

"$PY" "$HF_CHECK" make "$LLAMA_REFERENCE" "$TMP/hf" "$TMP/case.safetensors"
"$CONVERT" import --model=llama --hf_dir="$TMP/hf" --checkpoint="$TMP/imported" > "$TMP/import.log"
cat "$TMP/import.log"
MODEL_SET=$(sed -n 's/^--set=//p' "$TMP/import.log")
[[ $MODEL_SET == *llama.num_kv_heads=2* && $MODEL_SET == *llama.vocab_size=300* ]] ||
  { echo "FAIL: import printed no llama overrides"; exit 1; }

python3 - "$TMP" <<'PY'
import struct, sys
tokens = []
for doc in range(40):
    tokens += [((doc + j) % 7) * 37 % 251 + 1 + (j % 3) for j in range(50)] + [0]
open(f"{sys.argv[1]}/tokens.bin", "wb").write(struct.pack(f"<{len(tokens)}H", *tokens))
PY

SET="$MODEL_SET,eval_interval=0,lr_schedule.name=constant,lr_schedule.warmup_steps=0"
SET+=",optimizer.lr=3e-3,parallelism.micro_batch_size=2,llama.tokenizer="
COMMON=(--config=experiments/configs/llama_small_pp2.textproto --data="$TMP/tokens.bin"
  --output_dir="$TMP/runs" --sample_tokens=0 --set="$SET")
source driver/e2e/e2e_testing.sh  # close_losses
run() { "$TRAIN" "${COMMON[@]}" "$@" > "$TMP/log" 2>&1 || { cat "$TMP/log"; echo "FAIL: train_llama $* exited non-zero"; exit 1; }; }
losses() { sed -E 's/.*"loss":([^,}]*).*/\1/' "$1"/metrics.jsonl; }  # one run directory's
numbered() { awk '{print NR, $1}'; }  # "i loss" lines, as close_losses compares them

run --steps=20 --resume="$TMP/imported" --save_interval=20 --name=ft
grep -q 'resumed at step 0' "$TMP/log" || { cat "$TMP/log"; echo "FAIL: did not start from the import"; exit 1; }
run --steps=1 --resume="$TMP/imported" --name=again
run --steps=1 --name=fresh
# The import at tp 2 (pp 2 x tp 2): each rank cuts its shards (grouped kv
# heads, the padded vocabulary) from the imported files; its first two
# steps' losses are the tp 1 fine-tune's within 1e-5.
run --steps=2 --resume="$TMP/imported" --tp=2 --name=tp2
close_losses "$(losses "$TMP"/runs/ft-* | head -2 | numbered)" "$(losses "$TMP"/runs/tp2-* | numbered)" \
  "imported at tp 2 vs tp 1, steps 1-2" || { echo "FAIL: the import trained at tp 2 differs from tp 1"; exit 1; }
FT=$(losses "$TMP"/runs/ft-*)
FIRST=$(echo "$FT" | head -1)
AGAIN=$(losses "$TMP"/runs/again-*)
FRESH=$(losses "$TMP"/runs/fresh-*)
LAST=$(echo "$FT" | tail -3 | awk '{s += $1} END {print s / NR}')
echo "fine-tune losses: $(echo $FT)"
echo "first: imported $FIRST, imported again $AGAIN, fresh init $FRESH; mean of the last 3 $LAST"
[[ $FIRST == "$AGAIN" ]] || { echo "FAIL: two runs from the import start at different losses"; exit 1; }
[[ $FIRST != "$FRESH" ]] || { echo "FAIL: the import's first loss equals a fresh init's"; exit 1; }
awk -v a="$FIRST" -v b="$LAST" 'BEGIN {exit !(b == b && b < a - 0.5)}' ||
  { echo "FAIL: the loss did not fall by 0.5 (or is not finite)"; exit 1; }

"$CONVERT" export --checkpoint="$TMP/runs/checkpoints/ft" --hf_dir="$TMP/hf_ft"
"$PY" - "$TMP" <<'PY'
import struct, sys
import torch
from transformers import LlamaForCausalLM
tmp = sys.argv[1]
raw = open(f"{tmp}/tokens.bin", "rb").read()
ids = torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw)[:16 * 8]).view(8, 16)
def loss(folder):
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()
before, after = loss(f"{tmp}/hf"), loss(f"{tmp}/hf_ft")
print(f"transformers loss on the training tokens: original {before:.4f}, fine-tuned {after:.4f}")
sys.exit(0 if after < before - 0.5 else 1)
PY
echo PASS
