#!/usr/bin/env bash
# Vocabulary parallelism on this machine (issue #40): LLaMA with a 32768-token
# vocabulary (synthetic uniform token ids: the timing and memory do not depend
# on the text) and an untied head, through train_llama, each schedule with and
# without parallelism.vocab_parallel:
#   pp 2: 1f1b and 1f1b + passes, 1f1b_vocab1 (the one-barrier output
#   algorithm), zbv, zbv_vocab and zbv_vocab1 (chunks 2); and, without
#   it, the other registered schedules zb_h1 and interleaved_1f1b and 1f1b
#   over the partition `profile` finds (the best a partition can do about
#   the head);
#   pp 4: 1f1b, 1f1b + passes and 1f1b_vocab1; zbv and zbv_vocab;
#   at pp 2 and 4 vhalf and vhalf_vocab (V-Half: p + 2 activations per
#   rank where zbv holds 2p, the paper's balanced-memory pairing);
#   with --async also pp 2's 1f1b_vocab, 1f1b_vocab1, zbv_vocab and
#   zbv_vocab1 with --vocab_async_collectives=true (named *_async; each
#   records its speedup over the same run with blocking collectives), the
#   paper's 1F1B placements 1f1b_vocab_overlap and 1f1b_vocab1_overlap with
#   it at pp 2, and pp 4's 1f1b_vocab1 and 1f1b_vocab1_overlap with it; at
#   pp 2 and 4 vhalf_vocab and the paper's V-Half placements
#   vhalf_vocab_overlap and vhalf_vocab1_overlap with it.
# Each run is one record in bench/results/vocab_parallel.jsonl
# (tools/results.py --record).
#
#   bench/vocab_parallel.sh [--steps N] [--width W] [--async] [--reps N]
#                           [--only REGEX] [--record]
#
# --only keeps the runs whose name matches REGEX (bash =~); --reps N runs the
# kept list N times, alternating, and a run's tokens/s is then the median of
# its repetitions' (each repetition's own in tokens_per_s_per_rep; its speedup
# over blocking collectives also per repetition); the traces, peaks and
# simulator figures are its first repetition's. Figures against a run the
# filter left out are not recorded.
# Figures per run: the median step time and tokens/s after 5 warm-up steps;
# each rank's compute time per step (its compute actions in the traces of 10
# steps, median per rank; the max/min ratio is the balance); each rank's
# measured step peak and the memory planner's prediction; the last loss and
# its relative difference from the run without vocabulary parallelism under
# the same schedule; the simulator's error on the traced steps
# (bench/trace_vs_simulated.py: each step simulated with its own measured
# costs, the vocabulary passes and collectives included, against its span).
# A run with vocabulary parallelism also records its tokens/s over the best
# run without it at the same pp. One thread per rank: at pp 4 four ranks share 2 cores,
# so step times there say what the passes cost under contention, and the
# per-rank compute times carry the balance.
# shellcheck source=bench/bench_args.sh
source "$(dirname "$0")/bench_args.sh"
STEPS=20 WIDTH=256 VOCAB=32768 REPS=1 ONLY=""
bench_parse_args "steps width async reps only record" "$@"
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "--reps must be a positive integer, not '$REPS'" >&2; exit 2; }
[[ $STEPS -ge 16 ]] || { echo "--steps must be at least 16 (5 warm-up, 10 traced)" >&2; exit 2; }
bench_build //experiments:train_llama //experiments:schedule_explorer
BIN=bazel-bin/experiments/train_llama
EXPLORER=bazel-bin/experiments/schedule_explorer
bench_tmp
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
python3 - "$TMP/tokens.bin" "$VOCAB" <<'PY'
import random, struct, sys
rng = random.Random(40)
ids = [rng.randrange(int(sys.argv[2])) for _ in range(200000)]
open(sys.argv[1], "wb").write(struct.pack(f"<{len(ids)}H", *ids))
PY
SET="eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,llama.vocab_size=$VOCAB,llama.width=$WIDTH,llama.tokenizer=,llama.context_length=64,parallelism.micro_batch_size=2,data.path=$TMP/tokens.bin,data.eval_fraction=0,trace_step=6,trace_steps=10"
COMMAND="bench/vocab_parallel.sh --steps $STEPS --width $WIDTH"
[[ $ASYNC == 0 ]] || COMMAND+=" --async"
[[ $REPS == 1 ]] || COMMAND+=" --reps $REPS"
[[ -z $ONLY ]] || COMMAND+=" --only '$ONLY'"
# name:pp:chunks:schedule:vocab_parallel:partition_method
RUNS="pp2_1f1b:2:1:1f1b:false:type:LlamaBlock pp2_1f1b_vocab:2:1:1f1b:true:type:LlamaBlock
pp2_1f1b_vocab1:2:1:1f1b_vocab1:true:type:LlamaBlock
pp2_zbv:2:2:zbv:false:type:LlamaBlock pp2_zbv_vocab:2:2:zbv_vocab:true:type:LlamaBlock
pp2_zbv_vocab1:2:2:zbv_vocab1:true:type:LlamaBlock
pp2_zb_h1:2:1:zb_h1:false:type:LlamaBlock pp2_interleaved_1f1b:2:2:interleaved_1f1b:false:type:LlamaBlock
pp2_1f1b_profile:2:1:1f1b:false:profile
pp4_1f1b:4:1:1f1b:false:type:LlamaBlock pp4_1f1b_vocab:4:1:1f1b:true:type:LlamaBlock
pp4_1f1b_vocab1:4:1:1f1b_vocab1:true:type:LlamaBlock
pp4_zbv:4:2:zbv:false:type:LlamaBlock pp4_zbv_vocab:4:2:zbv_vocab:true:type:LlamaBlock
pp2_vhalf:2:2:vhalf:false:type:LlamaBlock pp2_vhalf_vocab:2:2:vhalf_vocab:true:type:LlamaBlock
pp4_vhalf:4:2:vhalf:false:type:LlamaBlock pp4_vhalf_vocab:4:2:vhalf_vocab:true:type:LlamaBlock"
if [[ $ASYNC == 1 ]]; then
  RUNS+="
pp2_1f1b_vocab_async:2:1:1f1b:true:type:LlamaBlock pp2_1f1b_vocab1_async:2:1:1f1b_vocab1:true:type:LlamaBlock
pp2_zbv_vocab_async:2:2:zbv_vocab:true:type:LlamaBlock pp2_zbv_vocab1_async:2:2:zbv_vocab1:true:type:LlamaBlock
pp2_1f1b_vocab_overlap_async:2:1:1f1b_vocab_overlap:true:type:LlamaBlock
pp2_1f1b_vocab1_overlap_async:2:1:1f1b_vocab1_overlap:true:type:LlamaBlock
pp4_1f1b_vocab1_async:4:1:1f1b_vocab1:true:type:LlamaBlock
pp4_1f1b_vocab1_overlap_async:4:1:1f1b_vocab1_overlap:true:type:LlamaBlock
pp2_vhalf_vocab_async:2:2:vhalf_vocab:true:type:LlamaBlock
pp2_vhalf_vocab_overlap_async:2:2:vhalf_vocab_overlap:true:type:LlamaBlock
pp2_vhalf_vocab1_overlap_async:2:2:vhalf_vocab1_overlap:true:type:LlamaBlock
pp4_vhalf_vocab_async:4:2:vhalf_vocab:true:type:LlamaBlock
pp4_vhalf_vocab_overlap_async:4:2:vhalf_vocab_overlap:true:type:LlamaBlock
pp4_vhalf_vocab1_overlap_async:4:2:vhalf_vocab1_overlap:true:type:LlamaBlock"
fi
if [[ -n $ONLY ]]; then
  kept=""
  for run in $RUNS; do [[ ${run%%:*} =~ $ONLY ]] && kept+="$run "; done
  RUNS=$kept
  [[ -n $RUNS ]] || { echo "--only '$ONLY' matches no run" >&2; exit 2; }
fi
for ((rep = 1; rep <= REPS; ++rep)); do
  for run in $RUNS; do
    IFS=: read -r name pp chunks schedule vocab partition <<< "$run"
    async=()
    [[ $name == *_async ]] && async=(--vocab_async_collectives=true)
    tag=$name.r$rep
    bench_run "$tag" "$BIN" --pp="$pp" --chunks="$chunks" --schedule="$schedule" \
      --vocab_parallel="$vocab" --microbatches=8 --steps="$STEPS" --sample_tokens=0 \
      --output_dir="$TMP/runs" --name="$tag" --set="$SET,parallelism.partition_method=$partition" \
      "${async[@]}"
  done
done
python3 - "$TMP" "$RECORD" "$COMMAND" "$RUNS" "$VOCAB" "$WIDTH" "$EXPLORER" "$REPS" <<'PY'
import glob, json, re, statistics, subprocess, sys
tmp, record, command, runs = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4].split()
vocab, width, explorer, reps = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], int(sys.argv[8])
COMPUTE = re.compile(r"^(\d+(F|B|I|W)\d+|(OUT_S|OUT_T|IN_F|IN_B)\d+)$")

def simulated(run_dir, pp, chunks, schedule, vocab_parallel, vocab_async):
    """trace_vs_simulated's median errors over the traced steps (LLaMA's head is untied)."""
    if vocab_parallel == "true" and not re.search(r"_vocab1?(_overlap)?$", schedule):
        schedule += "_vocab"  # the Trainer placed the passes as the registered one does
    out = subprocess.run(["python3", "bench/trace_vs_simulated.py", "--explorer", explorer,
                          "--run", run_dir, "--schedule", schedule, "--ranks", pp,
                          "--chunks", chunks, "--microbatches", "8", "--first", "6",
                          "--count", "10", "--untied", "--json"] +
                         (["--vocab_async"] if vocab_async else []),
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    return {"simulated_schedule": schedule,
            "sim_err_median": round(r["sim_deferred_err"], 4),
            "replay_err_median": round(r["replay_err"], 4)}


def metrics_of(run_dir):
    return sorted((json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")), key=lambda m: m["step"])


def step_median(metrics):
    return statistics.median(m["step_s"] for m in metrics if "step_s" in m and m["step"] > 5)


def figures(name, pp, chunks, schedule, vocab_parallel, partition):
    log = open(f"{tmp}/{name}.r1.log").read()
    run_dir = glob.glob(f"{tmp}/runs/{name}.r1-*")[0]
    metrics = metrics_of(run_dir)
    # Each repetition's median step (the first's is run_dir's).
    rep_steps = [step_median(metrics_of(glob.glob(f"{tmp}/runs/{name}.r{k}-*")[0]))
                 for k in range(1, reps + 1)]
    lines = re.findall(r"rank (\d+) stage \d+: step peak ([\d.]+) MiB.*?planner: peak ([\d.]+) MiB", log)
    compute = {}
    for path in glob.glob(f"{run_dir}/traces/step_*.json"):
        per_rank = {}
        for e in json.load(open(path))["traceEvents"]:
            if e.get("ph") == "X" and COMPUTE.match(e["name"]):
                per_rank[e["tid"]] = per_rank.get(e["tid"], 0) + e["dur"]
        for r, us in per_rank.items():
            compute.setdefault(r, []).append(us / 1000)
    busy = [round(statistics.median(compute[r]), 1) for r in sorted(compute)]
    step_s = statistics.median(rep_steps)
    tokens = metrics[-1].get("tokens_per_step") or 8 * 2 * 64
    vocab_async = name.endswith("_async")
    return {
        "pp": int(pp), "chunks": int(chunks), "schedule": schedule, "partition_method": partition,
        "vocab_parallel": vocab_parallel == "true", "vocab_size": vocab, "width": width,
        **({"vocab_async_collectives": True} if vocab_async else {}),
        "step_s_median": round(step_s, 4), "tokens_per_s": round(tokens / step_s, 1),
        **({"reps": reps, "step_s_per_rep": [round(x, 4) for x in rep_steps],
            "tokens_per_s_per_rep": [round(tokens / x, 1) for x in rep_steps]} if reps > 1 else {}),
        "compute_ms_per_rank": busy,
        "compute_max_over_min": round(max(busy) / min(busy), 3) if busy else None,
        "peak_mib_per_rank": [float(p) for _, p, _ in lines],
        "planned_peak_mib_per_rank": [float(p) for _, _, p in lines],
        "last_loss": metrics[-1]["loss"],
        **simulated(run_dir, pp, chunks, schedule, vocab_parallel, vocab_async),
    }

results = {}
for run in runs:
    name, pp, chunks, schedule, vocab_parallel, partition = run.split(":", 5)
    results[name] = figures(name, pp, chunks, schedule, vocab_parallel, partition)
for name, f in results.items():
    if f["vocab_parallel"]:
        # The overlap placements against their blocking base schedule.
        blocking = results.get(re.sub(r"(_overlap)?_async$", "", name))
        if name.endswith("_async") and blocking:
            f["speedup_vs_blocking"] = round(blocking["step_s_median"] / f["step_s_median"], 3)
            if reps > 1:  # repetition k against blocking's repetition k
                f["speedup_vs_blocking_per_rep"] = [
                    round(b / a, 3) for a, b in zip(f["step_s_per_rep"], blocking["step_s_per_rep"])]
            f["last_loss_equals_blocking"] = f["last_loss"] == blocking["last_loss"]
        base = results.get(re.sub(r"_vocab1?(_overlap)?(_async)?$", "", name))
        if base:
            f["speedup_vs_same_schedule"] = round(base["step_s_median"] / f["step_s_median"], 3)
            f["last_loss_rel_diff"] = abs(f["last_loss"] / base["last_loss"] - 1)
        without = [n for n, g in results.items() if g["pp"] == f["pp"] and not g["vocab_parallel"]]
        if without:
            best = max(without, key=lambda n: results[n]["tokens_per_s"])
            f["best_without"] = best
            f["speedup_vs_best_without"] = round(f["tokens_per_s"] / results[best]["tokens_per_s"], 3)
    print(name, json.dumps(f))
if record:
    for name, f in results.items():
        subprocess.run(["python3", "tools/results.py", "--record", "bench/results/vocab_parallel.jsonl",
                        "--bench", "vocab_parallel", "--command", command, "--config", name,
                        "--figures", json.dumps(f)], check=True)
PY
