#!/usr/bin/env bash
# The distributed optimizer's savings and costs on this machine (issue #39):
# the same GPT through train_gpt at pp 2 x dp 2 and pp 2 x dp 4, each with
# and without parallelism.distributed_optimizer, and pp 2 x dp 2 in bf16 both
# ways; each configuration one record in bench/results/distributed_optimizer.jsonl
# (tools/results.py --record).
#
#   bench/distributed_optimizer.sh [--steps N] [--width W] [--record]
#
# Figures per run: every rank's optimizer state in bytes, measured from the
# tensors' storage (the driver's mem_optimizer_state_bytes: AdamW's moments,
# and under bf16 the fp32 masters) and, with the distributed optimizer, its
# ratio to the same run without it (the target: at most 1/dp plus the
# buckets' padding); every rank's measured step peak and the memory
# planner's prediction for it (the driver's memory lines); the median step
# time after 5 warm-up steps; the step's tail (REDUCE_TIED + REDUCE_GRAD +
# STEP, from the traces of 10 steps: median per rank, then the largest
# rank); the last loss and its relative difference from the run without it.
# On a 2-core machine dp 4 x pp 2 runs 8 processes on 2 cores: step and tail
# times say what the collectives cost here, not on a node of GPUs.
# shellcheck source=bench/bench_args.sh
source "$(dirname "$0")/bench_args.sh"
STEPS=30 WIDTH=256
bench_parse_args "steps width record" "$@"
[[ $STEPS -ge 20 ]] || { echo "--steps must be at least 20 (5 warm-up, 10 traced)" >&2; exit 2; }
bench_build //experiments:train_gpt
BIN=bazel-bin/experiments/train_gpt
bench_tmp
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
SET="eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,gpt.width=$WIDTH,gpt.num_heads=8,gpt.num_layers=4,gpt.context_length=128,parallelism.micro_batch_size=4,trace_step=6,trace_steps=10"
COMMAND="bench/distributed_optimizer.sh --steps $STEPS --width $WIDTH"
RUNS="dp2:2:false:fp32 dp2_zero1:2:true:fp32 dp4:4:false:fp32 dp4_zero1:4:true:fp32 dp2_bf16:2:false:bf16 dp2_zero1_bf16:2:true:bf16"
for run in $RUNS; do
  IFS=: read -r name dp zero1 precision <<< "$run"
  bench_run "$name" "$BIN" --pp=2 --dp="$dp" --microbatches=4 --distributed_optimizer="$zero1" \
    --precision="$precision" --steps="$STEPS" --sample_tokens=0 --data=/usr/share/common-licenses \
    --output_dir="$TMP/runs" --name="$name" --set="$SET"
done
python3 - "$TMP" "$RECORD" "$COMMAND" "$RUNS" <<'PY'
import glob, json, re, statistics, subprocess, sys
tmp, record, command, runs = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4].split()
TAIL = re.compile(r"^(REDUCE_TIED|\d+REDUCE_GRAD|STEP)$")

def figures(name, dp, zero1, precision):
    log = open(f"{tmp}/{name}.log").read()
    run_dir = glob.glob(f"{tmp}/runs/{name}-*")[0]
    metrics = sorted((json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")), key=lambda m: m["step"])
    gathered = [m for m in metrics if "mem_optimizer_state_bytes" in m]
    lines = re.findall(r"rank (\d+) stage \d+: step peak ([\d.]+) MiB.*?planner: peak ([\d.]+) MiB \(([+-]\d+)%\)", log)
    tails = {}
    for path in glob.glob(f"{run_dir}/traces/step_*.json"):
        per_rank = {}
        for e in json.load(open(path))["traceEvents"]:
            if e.get("ph") == "X" and TAIL.match(e["name"]):
                per_rank[e["tid"]] = per_rank.get(e["tid"], 0) + e["dur"]
        for r, us in per_rank.items():
            tails.setdefault(r, []).append(us / 1000)
    return {
        "dp": dp, "distributed_optimizer": zero1, "precision": precision,
        "optimizer_state_bytes_per_rank": gathered[-1]["mem_optimizer_state_bytes"],
        "peak_mib_per_rank": [float(p) for _, p, _, _ in lines],
        "planner_peak_mib_per_rank": [float(p) for _, _, p, _ in lines],
        "planner_error_pct_per_rank": [int(e) for _, _, _, e in lines],
        "median_step_s": round(statistics.median(m["step_s"] for m in metrics[5:]), 4),
        "tail_ms": round(max(statistics.median(v) for v in tails.values()), 2),
        "traced_steps": len(glob.glob(f"{run_dir}/traces/step_*.json")),
        "last_loss": metrics[-1]["loss"],
        "steps": len(metrics),
    }

out = {}
for run in runs:
    name, dp, zero1, precision = run.split(":")
    out[name] = figures(name, int(dp), zero1 == "true", precision)
for name, f in out.items():
    if not f["distributed_optimizer"]:
        continue
    base = out[name.replace("_zero1", "")]
    f["state_ratio_per_rank"] = [round(a / b, 4) for a, b in zip(f["optimizer_state_bytes_per_rank"],
                                                                 base["optimizer_state_bytes_per_rank"])]
    f["peak_ratio_per_rank"] = [round(a / b, 3) for a, b in zip(f["peak_mib_per_rank"], base["peak_mib_per_rank"])]
    f["step_time_ratio"] = round(f["median_step_s"] / base["median_step_s"], 3)
    f["tail_ratio"] = round(f["tail_ms"] / base["tail_ms"], 3)
    f["last_loss_rel_diff"] = abs(f["last_loss"] - base["last_loss"]) / abs(base["last_loss"])
for name, f in out.items():
    print(f"{name}: {json.dumps(f)}")
if record:
    for name, f in out.items():
        subprocess.run([sys.executable, "tools/results.py", "--record", "bench/results/distributed_optimizer.jsonl",
                        "--bench", "distributed_optimizer", "--command", command, "--config", name,
                        "--figures", json.dumps(f)], check=True)
PY
