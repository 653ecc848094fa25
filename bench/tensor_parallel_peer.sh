#!/usr/bin/env bash
# pipe's tensor parallelism beside PyTorch 2.15's DTensor tensor parallelism
# under torch.distributed.pipelining (issue #38): pp 2 x tp 2 (4 processes,
# Gloo, one thread each) on bench/tensor_parallel.sh's GPT (width 256, 8
# heads, 4 blocks, context 128, vocabulary 260, 4 micro-batches of 4, 1F1B),
# without and with sequence parallelism, on the same synthetic data (pipe's
# data.source synthetic, which bench/torch_tp_gpt.py reproduces) and AdamW:
#   pipe:  train_gpt --pp=2 --tp=2 [--sequence_parallel=true]
#   peer:  bench/torch_tp_gpt.py --pp=2 --tp=2 [--sequence_parallel]
#          (ColwiseParallel / RowwiseParallel / SequenceParallel /
#          loss_parallel on a 2 x 2 DeviceMesh, PipelineStage + Schedule1F1B)
# Alternating, --reps rounds; per configuration the median over rounds of
# each run's median step (pipe: after 5 warm-up steps, the peer: after 5).
# Each system starts from its own seeded weights (the loss-for-loss check
# with shared weights is //bench:torch_tp_gpt_test).
#
# The per-action TP communication cost, from one profiled step per run's
# last round: pipe's --profile_steps (LibTorch's profiler; the "gloo:*"
# events of each rank, summed per pipe action kind F / B and per rank) and
# the peer's torch.profiler step (its Gloo/c10d collectives per rank). Gloo's
# spans run from the collective's start to its completion, so on a loaded
# machine they include waiting for the other rank: an upper bound on what
# the collectives cost, not their wire time.
#
#   bench/tensor_parallel_peer.sh [--reps N] [--steps N] [--record]
#
# PIPE_BASELINE=<a train_gpt binary, e.g. built at an earlier commit> also
# runs it in each round right after pipe, with the same flags (config
# pipe_baseline_pp2_tp2[_sp], speed_vs_baseline on pipe's): a before/after
# comparison that alternates on the same machine, which a loaded machine
# needs. PIPE_BASELINE_COMMIT names its commit in the records.
#
# One record per system and configuration in
# bench/results/tensor_parallel_peer.jsonl (--record).
# shellcheck source=bench/bench_args.sh
source "$(dirname "$0")/bench_args.sh"
REPS=2 STEPS=20
bench_parse_args "reps steps record" "$@"
((STEPS > 6)) || { echo "--steps must be above 6 (5 warm-up steps)" >&2; exit 2; }
bench_build //experiments:train_gpt
BIN=bazel-bin/experiments/train_gpt
VENV=$(tools/python_env.sh torch-newest)
bench_tmp
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
SET="eval_interval=0,log_interval=1,data.source=synthetic,lr_schedule.name=constant"
SET+=",lr_schedule.warmup_steps=0,gpt.width=256,gpt.num_heads=8,gpt.num_layers=4"
SET+=",gpt.context_length=128,parallelism.micro_batch_size=4,parallelism.num_microbatches=4"
PEER=(--pp=2 --tp=2 --width=256 --heads=8 --layers=4 --context=128 --micro_batch_size=4
  --microbatches=4 --warmup=5 --steps=$((STEPS - 5)))
for rep in $(seq 1 "$REPS"); do
  profile=()
  peer_profile=()
  if ((rep == REPS)); then
    profile=(--profile_steps="$STEPS:$STEPS")
    peer_profile=(--profile_step)
  fi
  for sp in false true; do
    name="pipe_${sp}_$rep"
    bench_run "$name" "$BIN" --config=experiments/configs/gpt_small_pp2_tp2.textproto --pp=2 \
      --tp=2 --sequence_parallel=$sp --steps="$STEPS" --save_interval=0 --sample_tokens=0 \
      --output_dir="$TMP/runs" --name="$name" --set="$SET" "${profile[@]}"
    if [[ -n ${PIPE_BASELINE:-} ]]; then
      name="pipe_baseline_${sp}_$rep"
      bench_run "$name" "$PIPE_BASELINE" --config=experiments/configs/gpt_small_pp2_tp2.textproto \
        --pp=2 --tp=2 --sequence_parallel=$sp --steps="$STEPS" --save_interval=0 \
        --sample_tokens=0 --output_dir="$TMP/runs" --name="$name" --set="$SET" "${profile[@]}"
    fi
    name="peer_${sp}_$rep"
    flag=()
    [[ $sp == true ]] && flag=(--sequence_parallel)
    bench_run "$name" "$VENV/bin/python" bench/torch_tp_gpt.py "${PEER[@]}" "${flag[@]}" \
      "${peer_profile[@]}" --master_port=$((29800 + RANDOM % 1000))
  done
done
COMMAND="bench/tensor_parallel_peer.sh --reps $REPS --steps $STEPS"
[[ -n ${PIPE_BASELINE:-} ]] &&
  COMMAND="PIPE_BASELINE=<train_gpt of ${PIPE_BASELINE_COMMIT:-an earlier build}> $COMMAND"
python3 - "$TMP" "$REPS" "$RECORD" "$COMMAND" "${PIPE_BASELINE:+1}" \
  "${PIPE_BASELINE_COMMIT:-}" <<'PY'
import collections, glob, json, re, statistics, subprocess, sys
tmp, reps, record, command = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
baseline, baseline_commit = sys.argv[5] == "1", sys.argv[6]

MAPPING = re.compile(r"^torch::autograd::CppNode<pp::tensor_parallel::.*Mapping<\(.*?Op\)(\d), \(.*?Op\)(\d)> >$")
BACKWARD_OPS = {"1": "all_reduce", "3": "all_gather", "4": "reduce_scatter"}  # mappings.cc's Op

def union_ms(intervals, lo, hi):
    covered, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            covered += b - a
            end = b
    return covered / 1000.0

def pipe_collectives(run_dir):
    """Per rank and action kind (F, B) of the profiled step: count, mean
    duration; B: the tensor-parallel mappings' backward collectives (their
    autograd nodes' spans); F and B: the time inside the action that no
    LibTorch operator covers (the forward collectives run there, unprofiled,
    with pipe's own code)."""
    trace = json.load(open(f"{run_dir}/profile/merged.json"))
    events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace) if e.get("ph") == "X"]
    out = {}
    for pid in sorted({e["pid"] for e in events}):
        mine = [e for e in events if e["pid"] == pid]
        ops = collections.defaultdict(list)
        for e in mine:
            if e.get("tid") != 0 and "pipe_action" in (e.get("args") or {}):
                ops[e["args"]["pipe_action"]].append(e)
        rank = {}
        for kind in ("F", "B"):
            actions = [e for e in mine if e.get("tid") == 0 and e.get("cat") == kind]
            if not actions:
                continue
            tp, uncovered = collections.defaultdict(lambda: [0, 0.0]), 0.0
            for a in actions:
                inside = ops[a["name"]]
                top = [(e["ts"], e["ts"] + e["dur"]) for e in inside if not e["name"].startswith("gloo:")]
                uncovered += a["dur"] / 1000.0 - union_ms(top, a["ts"], a["ts"] + a["dur"])
                for e in inside:
                    m = MAPPING.match(e["name"])
                    if m and m.group(2) in BACKWARD_OPS:
                        cell = tp[BACKWARD_OPS[m.group(2)]]
                        cell[0] += 1
                        cell[1] += e["dur"] / 1000.0
            n = len(actions)
            f = {"count": n, "mean_ms": round(sum(a["dur"] for a in actions) / n / 1000.0, 3),
                 "uncovered_ms_per_action": round(uncovered / n, 3)}
            if kind == "B":
                f["tp_collectives_per_action"] = {k: {"count": c / n, "ms": round(ms / n, 3)}
                                                  for k, (c, ms) in sorted(tp.items())}
                f["tp_collective_ms_per_action"] = round(sum(ms for _, ms in tp.values()) / n, 3)
            rank[kind] = f
        out[str(pid)] = rank
    return out

def pipe(sp, rep, prefix="pipe"):
    d = glob.glob(f"{tmp}/runs/{prefix}_{sp}_{rep}-*")[0]
    m = sorted((json.loads(l) for l in open(f"{d}/metrics.jsonl")), key=lambda x: x["step"])
    comm = pipe_collectives(d) if rep == reps else None
    return statistics.median(x["step_s"] for x in m[5:]), m[-1]["loss"], comm

def peer(sp, rep):
    line = [l for l in open(f"{tmp}/peer_{sp}_{rep}.log") if l.startswith("RESULT ")][-1]
    r = json.loads(line[len("RESULT "):])
    return r["median_step_s"], r["losses"][-1], r["tp_collectives_per_rank"], r["torch"]

def summary(sp, runs):
    return {"pp": 2, "tp": 2, "sequence_parallel": sp == "true",
            "median_step_s": round(statistics.median(r[0] for r in runs), 4),
            "runs_step_s": [round(r[0], 4) for r in runs], "last_loss": runs[-1][1],
            "collectives_profiled_step_per_rank": runs[-1][2]}

out = {}
for sp in ("false", "true"):
    suffix = "_sp" if sp == "true" else ""
    for key, get in ((f"pipe_pp2_tp2{suffix}", pipe), (f"torch_dtensor_pp2_tp2{suffix}", peer)):
        runs = [get(sp, rep) for rep in range(1, reps + 1)]
        f = summary(sp, runs)
        if key.startswith("torch"):
            f["torch"] = runs[-1][3]
        out[key] = f
    p, t = out[f"pipe_pp2_tp2{suffix}"], out[f"torch_dtensor_pp2_tp2{suffix}"]
    p["speed_vs_torch"] = round(t["median_step_s"] / p["median_step_s"], 3)
    if baseline:
        b = summary(sp, [pipe(sp, rep, "pipe_baseline") for rep in range(1, reps + 1)])
        if baseline_commit:
            b["baseline_commit"] = baseline_commit
        b["speed_vs_torch"] = round(t["median_step_s"] / b["median_step_s"], 3)
        p["speed_vs_baseline"] = round(b["median_step_s"] / p["median_step_s"], 3)
        out[f"pipe_baseline_pp2_tp2{suffix}"] = b
for key, f in out.items():
    print(f"{key}: {json.dumps(f)}")
if record:
    for key, f in out.items():
        subprocess.run([sys.executable, "tools/results.py", "--record",
                        "bench/results/tensor_parallel_peer.jsonl", "--bench", "tensor_parallel_peer",
                        "--command", command, "--config", key, "--figures", json.dumps(f)], check=True)
PY
