#!/usr/bin/env bash
# pipe's distributed optimizer beside PyTorch 2.15's ZeRO-1 on Gloo (issue
# #39): the same GPT shape (width 256, 4 blocks, 8 heads, context 128, 4
# micro-batches of 4 per replica) data-parallel over 2 ranks without a
# pipeline, each system with and without sharding its optimizer state:
# pipe's train_gpt --pp=1 --dp=2 [--distributed_optimizer=true], and
# bench/torch_zero1_peer.py --mode=adamw|zero1 (DDP with AdamW, or with
# ZeroRedundancyOptimizer). Alternating, --reps rounds; per configuration
# the medians over rounds, one record each in
# bench/results/distributed_optimizer.jsonl (--record). DeepSpeed 0.14.1's
# ZeRO-1 does not run here (Gloo in Debian's torch 1.13 has no
# _allgather_base), so PyTorch's is the peer.
#
#   bench/distributed_optimizer_peer.sh [--reps N] [--steps N] [--record]
#
# Figures: every rank's optimizer-state bytes (each system measures its state
# tensors' storage), their ratio to the same system's unsharded run, the
# median step time (pipe: after 5 warm-up steps; the peer: after 3) and its
# ratio. The models differ in detail (pipe's GPT and the peer's
# nn.TransformerEncoderLayer), so compare ratios across systems, times only
# within one.
# shellcheck source=bench/bench_args.sh
source "$(dirname "$0")/bench_args.sh"
REPS=2 STEPS=20
bench_parse_args "reps steps record" "$@"
bench_build //experiments:train_gpt
BIN=bazel-bin/experiments/train_gpt
VENV=$(tools/python_env.sh torch-newest)
bench_tmp
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
SET="eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,gpt.width=256,gpt.num_heads=8,gpt.num_layers=4,gpt.context_length=128,parallelism.micro_batch_size=4"
for rep in $(seq 1 "$REPS"); do
  for zero1 in false true; do
    bench_run "pipe_${zero1}_$rep" "$BIN" --pp=1 --dp=2 --microbatches=4 \
      --distributed_optimizer=$zero1 --steps="$STEPS" --sample_tokens=0 \
      --data=/usr/share/common-licenses --output_dir="$TMP/runs" --name="pipe_${zero1}_$rep" \
      --set="$SET"
  done
  for mode in adamw zero1; do
    bench_run "peer_${mode}_$rep" "$VENV/bin/python" bench/torch_zero1_peer.py --dp=2 \
      --mode=$mode --width=256 --layers=4 --heads=8 --context=128 --micro_batch_size=4 \
      --microbatches=4 --steps=$((STEPS - 5))
  done
done
python3 - "$TMP" "$REPS" "$RECORD" "bench/distributed_optimizer_peer.sh --reps $REPS --steps $STEPS" <<'PY'
import glob, json, statistics, subprocess, sys
tmp, reps, record, command = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]

def pipe(zero1, rep):
    d = glob.glob(f"{tmp}/runs/pipe_{zero1}_{rep}-*")[0]
    m = sorted((json.loads(l) for l in open(f"{d}/metrics.jsonl")), key=lambda x: x["step"])
    state = [x for x in m if "mem_optimizer_state_bytes" in x][-1]["mem_optimizer_state_bytes"]
    return state, statistics.median(x["step_s"] for x in m[5:]), m[-1]["loss"]

def peer(mode, rep):
    line = [l for l in open(f"{tmp}/peer_{mode}_{rep}.log") if l.startswith("RESULT ")][-1]
    r = json.loads(line[len("RESULT "):])
    return r["optimizer_state_bytes_per_rank"], r["median_step_s"], r["last_loss_rank0"], r["torch"]

out = {}
for key, get in (("pipe_pp1_dp2", lambda rep: pipe("false", rep)),
                 ("pipe_pp1_dp2_zero1", lambda rep: pipe("true", rep)),
                 ("torch_ddp_dp2", lambda rep: peer("adamw", rep)),
                 ("torch_zero1_dp2", lambda rep: peer("zero1", rep))):
    runs = [get(rep) for rep in range(1, reps + 1)]
    f = {"optimizer_state_bytes_per_rank": runs[-1][0],
         "median_step_s": round(statistics.median(r[1] for r in runs), 4),
         "runs_step_s": [round(r[1], 4) for r in runs], "last_loss": runs[-1][2]}
    if key.startswith("torch"):
        f["torch"] = runs[-1][3]
    out[key] = f
for key, base in (("pipe_pp1_dp2_zero1", "pipe_pp1_dp2"), ("torch_zero1_dp2", "torch_ddp_dp2")):
    f, b = out[key], out[base]
    f["state_ratio_per_rank"] = [round(x / y, 4) for x, y in zip(f["optimizer_state_bytes_per_rank"],
                                                                 b["optimizer_state_bytes_per_rank"])]
    f["step_time_ratio"] = round(f["median_step_s"] / b["median_step_s"], 3)
for key, f in out.items():
    print(f"{key}: {json.dumps(f)}")
if record:
    for key, f in out.items():
        subprocess.run([sys.executable, "tools/results.py", "--record", "bench/results/distributed_optimizer.jsonl",
                        "--bench", "distributed_optimizer_peer", "--command", command, "--config", key,
                        "--figures", json.dumps(f)], check=True)
PY
