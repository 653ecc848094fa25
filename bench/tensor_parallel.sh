#!/usr/bin/env bash
# Tensor parallelism's costs and savings on this machine (issue #38): the same
# GPT through train_gpt at pp 2 x tp 1, pp 2 x tp 2 and pp 2 x tp 2 with
# sequence parallelism, side by side, each
# recorded in bench/results/tensor_parallel.jsonl (tools/results.py --record).
#
#   bench/tensor_parallel.sh [--steps N] [--width W] [--record]
#
# Figures per run: stage 0's transformer-block bytes per rank (parameters +
# gradients + AdamW's two moments, from the checkpoint manifest's tensor
# shapes of tp rank 0: what that rank holds), the ratio to tp 1; the median
# step time after 5 warm-up steps; each rank's measured step peak (the
# driver's memory lines); rank 0's p2p payload bytes; the last loss, and its
# relative difference from tp 1. On a 2-core machine tp 2 runs 4 processes on
# 2 cores: its step time says what the collectives cost here, not what a
# node of GPUs would see.
# shellcheck source=bench/bench_args.sh
source "$(dirname "$0")/bench_args.sh"
STEPS=30 WIDTH=256
bench_parse_args "steps width record" "$@"
bench_build //experiments:train_gpt
BIN=bazel-bin/experiments/train_gpt
bench_tmp
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
SET="eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,gpt.width=$WIDTH,gpt.num_heads=8,gpt.num_layers=4,gpt.context_length=128,parallelism.micro_batch_size=4"
COMMAND="bench/tensor_parallel.sh --steps $STEPS --width $WIDTH"
for run in tp1:1:false tp2:2:false tp2sp:2:true; do
  IFS=: read -r name tp sp <<< "$run"
  bench_run "$name" "$BIN" --config=experiments/configs/gpt_small_pp2_tp2.textproto --tp="$tp" \
    --steps="$STEPS" --sequence_parallel="$sp" --save_interval="$STEPS" --sample_tokens=0 \
    --data=/usr/share/common-licenses --output_dir="$TMP/runs" --name="$name" --set="$SET"
done
python3 - "$TMP" "$STEPS" "$RECORD" "$COMMAND" <<'PY'
import glob, json, os, re, statistics, subprocess, sys
tmp, steps, record, command = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]

def run_figures(name, tp, sp):
    log = open(f"{tmp}/{name}.log").read()
    metrics = [json.loads(l) for d in glob.glob(f"{tmp}/runs/{name}-*") for l in open(f"{d}/metrics.jsonl")]
    metrics.sort(key=lambda m: m["step"])
    manifest = open(glob.glob(f"{tmp}/runs/checkpoints/{name}/step_*/manifest.textproto")[0]).read()
    # Stage 0's blocks are layers 1.. (layer 0: the embedding); files of tp rank 0.
    suffix = "-model_00" if tp > 1 else ""
    block_bytes = 0
    for f in re.finditer(r'files \{(.*?)\n\}', manifest, re.S):
        body = f.group(1)
        path = re.search(r'path: "([^"]+)"', body).group(1)
        m = re.match(r"layer_(\d+)%s-(model|optim)_states\.pt$" % suffix, path)
        if not m or int(m.group(1)) not in (1, 2):
            continue
        for t in re.finditer(r'tensors \{(.*?)\n  \}', body, re.S):
            shape = [int(x) for x in re.findall(r"shape: (\d+)", t.group(1))]
            n = 1
            for s in shape:
                n *= s
            copies = 2 if m.group(2) == "model" else 1  # a parameter's gradient is its size
            block_bytes += 4 * n * copies if shape else 0
    peaks = [float(x) for x in re.findall(r"rank \d+ stage \d+: step peak ([\d.]+) MiB", log)]
    p2p = re.search(r"p2p \(rank 0\): (\d+) messages sent \((\d+) payload bytes", log)
    step_s = [m["step_s"] for m in metrics[5:]]
    return {
        "tp": tp,
        "sequence_parallel": sp,
        "block_state_bytes_per_rank": block_bytes,
        "median_step_s": round(statistics.median(step_s), 4),
        "peak_mib_per_rank": peaks,
        "p2p_payload_bytes_rank0": int(p2p.group(2)),
        "last_loss": metrics[-1]["loss"],
        "steps": len(metrics),
    }

runs = {"pp2_tp1": run_figures("tp1", 1, False), "pp2_tp2": run_figures("tp2", 2, False),
        "pp2_tp2_sp": run_figures("tp2sp", 2, True)}
base = runs["pp2_tp1"]
for key in ("pp2_tp2", "pp2_tp2_sp"):
    f = runs[key]
    f["block_state_ratio_to_tp1"] = round(f["block_state_bytes_per_rank"] / base["block_state_bytes_per_rank"], 4)
    f["stage0_peak_ratio_to_tp1"] = round(f["peak_mib_per_rank"][0] / base["peak_mib_per_rank"][0], 3)
    f["step_time_ratio_to_tp1"] = round(f["median_step_s"] / base["median_step_s"], 3)
    f["p2p_bytes_ratio_to_tp1"] = round(f["p2p_payload_bytes_rank0"] / base["p2p_payload_bytes_rank0"], 3)
    f["last_loss_rel_diff_to_tp1"] = abs(f["last_loss"] - base["last_loss"]) / abs(base["last_loss"])
for key, f in runs.items():
    print(f"{key}: {json.dumps(f)}")
if record:
    for key, f in runs.items():
        subprocess.run([sys.executable, "tools/results.py", "--record", "bench/results/tensor_parallel.jsonl",
                        "--bench", "tensor_parallel", "--command", command, "--config", key,
                        "--figures", json.dumps(f)], check=True)
PY
