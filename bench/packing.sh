#!/usr/bin/env bash
# Packed variable-length documents on this machine (issue #41): LLaMA small
# (experiments/configs/llama_small_pp2.textproto: pp 2, 1F1B, 4 micro-batches
# of 8 rows of 128 tokens) on two corpora with a realistic length spread,
# each trained three ways: every document padded to the context (the
# baseline, data.packing padded), packed into full rows (documents, equal
# tokens) and packed with cost balancing (documents, cost). One record per
# (corpus, way) in bench/results/packing.jsonl (tools/results.py --record).
#
#   bench/packing.sh [--steps N] [--record]
#
# Corpora: "doc", the copyright files under /usr/share/doc (one document
# each, tokenised with data/llama_small's tokenizer: tools/data/tokens.py
# encode), and "sft", prompt/response pairs made from the licence texts'
# paragraphs (tokens.py pairs + finetune: a loss mask trains the responses).
# And the byte-level GPT of train_gpt (experiments/configs/gpt_small_pp2:
# pp 2, 1F1B) on the licence texts' paragraphs ("paragraphs": data.source
# corpus) at context 256, 8 micro-batches of 2 rows, the same three ways.
# Figures per run: the corpus's document lengths (tokens: median, p90, max);
# trained tokens per second (the driver's tokens/s, which counts the labels
# trained: median of the steps after 3 warm-up steps) and its ratio to the
# padded run's; the fraction of the step's token slots that trained (the
# metrics' trained_tokens over 4 x 8 x 128); per
# traced step the spread of the micro-batches' compute (F + B summed over
# both stages, from the traces of 8 steps: max/min and coefficient of
# variation, median over the steps); and the simulator's error against each
# traced step's span (bench/trace_vs_simulated.py, as executed; --untied for
# LLaMA, whose embedding and head are not tied), with the stages' mean costs
# alone and with each micro-batch's own share (--microbatch_multiplier).
# shellcheck source=bench/bench_args.sh
source "$(dirname "$0")/bench_args.sh"
STEPS=16
bench_parse_args "steps record" "$@"
[[ $STEPS -ge 12 ]] || { echo "--steps must be at least 12 (3 warm-up, 8 traced)" >&2; exit 2; }
bench_build //experiments:train_llama //experiments:train_gpt //experiments:schedule_explorer
tools/data/make_llama_data.sh >/dev/null
PY=$(tools/python_env.sh torch-newest)/bin/python
bench_tmp
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TOK=data/llama_small/tokenizer.json
# shellcheck disable=SC2046  # one argument per file
"$PY" tools/data/tokens.py encode --tokenizer "$TOK" --format megatron --out "$TMP/doc" \
  --corpus $(find /usr/share/doc -name copyright -type f | sort) > /dev/null
"$PY" tools/data/tokens.py pairs --corpus /usr/share/common-licenses --out "$TMP/pairs.jsonl" > /dev/null
"$PY" tools/data/tokens.py finetune --tokenizer "$TOK" --pairs "$TMP/pairs.jsonl" \
  --format megatron --out "$TMP/sft" > /dev/null
COMMAND="bench/packing.sh --steps $STEPS"
RUNS="doc:padded:tokens doc:documents:tokens doc:documents:cost sft:padded:tokens sft:documents:tokens sft:documents:cost paragraphs:padded:tokens paragraphs:documents:tokens paragraphs:documents:cost"
for run in $RUNS; do
  IFS=: read -r corpus packing balance <<< "$run"
  name=${corpus}_${packing}_${balance}
  common="data.packing=$packing,data.packing_balance=$balance,eval_interval=0,log_interval=1,lr_schedule.warmup_steps=2,trace_step=3,trace_steps=8"
  if [[ $corpus == paragraphs ]]; then
    bin=bazel-bin/experiments/train_gpt m=8 ties=""
    set="$common,gpt.context_length=256,parallelism.micro_batch_size=2"
  else
    bin=bazel-bin/experiments/train_llama m=4 ties=--untied  # llama_small: tie_embeddings false
    set="$common,data.path=$TMP/$corpus,data.format=megatron,data.eval_fraction=0"
  fi
  bench_run "$name" "$bin" --steps="$STEPS" --sample_tokens=0 --output_dir="$TMP/runs" \
    --name="$name" --microbatches=$m --set="$set"
  python3 bench/trace_vs_simulated.py --explorer bazel-bin/experiments/schedule_explorer \
    --run "$(ls -d "$TMP"/runs/"$name"-*)" --schedule 1f1b --ranks 2 --chunks 1 \
    --microbatches $m --first 3 --count 8 $ties --json > "$TMP/$name.sim.json"
done
"$PY" - "$TMP" "$RECORD" "$COMMAND" "$RUNS" <<'PY'
import glob, json, statistics, subprocess, sys
import numpy as np
tmp, record, command, runs = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4].split()
CAPACITY = {"doc": 4 * 8 * 128, "sft": 4 * 8 * 128, "paragraphs": 8 * 2 * 256}  # token slots per step

def lengths(corpus):
    if corpus == "paragraphs":  # bytes of the licence texts' paragraphs
        import pathlib
        sizes = []
        for f in sorted(pathlib.Path("/usr/share/common-licenses").rglob("*")):
            if f.is_file():
                # As models/data/corpus.h SplitParagraphs: runs of non-blank lines.
                size = 0
                for line in f.read_bytes().splitlines(keepends=True):
                    if line.strip():
                        size += len(line)
                    elif size:
                        sizes.append(size)
                        size = 0
                if size:
                    sizes.append(size)
        sizes = np.array(sizes)
        return {"documents": len(sizes), "median_tokens": int(np.median(sizes)),
                "p90_tokens": int(np.percentile(sizes, 90)), "max_tokens": int(sizes.max())}
    idx = open(f"{tmp}/{corpus}.idx", "rb").read()
    count = int.from_bytes(idx[18:26], "little")
    sizes = np.frombuffer(idx[34:34 + 4 * count], dtype="<i4")
    return {"documents": int(count), "median_tokens": int(np.median(sizes)),
            "p90_tokens": int(np.percentile(sizes, 90)), "max_tokens": int(sizes.max())}

def spread(run_dir):
    ratios, cvs = [], []
    for path in sorted(glob.glob(f"{run_dir}/traces/step_*.json")):
        work = {}
        for e in json.load(open(path))["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") in ("F", "B", "I", "W"):
                mb = e["args"]["microbatch"]
                work[mb] = work.get(mb, 0) + e["dur"]
        w = list(work.values())
        ratios.append(max(w) / min(w))
        cvs.append(statistics.pstdev(w) / statistics.mean(w))
    return round(statistics.median(ratios), 3), round(statistics.median(cvs), 3)

out = {}
for run in runs:
    corpus, packing, balance = run.split(":")
    name = f"{corpus}_{packing}_{balance}"
    run_dir = glob.glob(f"{tmp}/runs/{name}-*")[0]
    metrics = sorted((json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")), key=lambda m: m["step"])
    sim = json.load(open(f"{tmp}/{name}.sim.json"))
    tps = statistics.median(m["tokens_per_s"] for m in metrics[3:])
    step_s = statistics.median(m["step_s"] for m in metrics[3:])
    ratio, cv = spread(run_dir)
    out[name] = {
        "corpus": corpus, "packing": packing, "balance": balance, **lengths(corpus),
        "trained_tokens_per_s": round(tps, 1), "median_step_s": round(step_s, 3),
        "model": "gpt" if corpus == "paragraphs" else "llama",
        "trained_fraction": round(statistics.mean(m["trained_tokens"] for m in metrics) / CAPACITY[corpus], 3),
        "microbatch_compute_max_over_min": ratio, "microbatch_compute_cv": cv,
        "sim_error_stage_means": round(sim["sim_deferred_err"], 4),
        "sim_error_per_microbatch": round(sim["sim_microbatches_err"], 4),
        "last_loss": metrics[-1]["loss"], "steps": len(metrics),
    }
for name, f in out.items():
    base = out[f"{f['corpus']}_padded_tokens"]
    f["trained_tokens_per_s_vs_padded"] = round(f["trained_tokens_per_s"] / base["trained_tokens_per_s"], 3)
    print(f"{name}: {json.dumps(f)}")
if record:
    for name, f in out.items():
        subprocess.run([sys.executable, "tools/results.py", "--record", "bench/results/packing.jsonl",
                        "--bench", "packing", "--command", command, "--config", name,
                        "--figures", json.dumps(f)], check=True)
PY
