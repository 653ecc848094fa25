#!/usr/bin/env bash
# The GPU kit's one command on a lent GPU machine (docs/gpus_and_libtorch.md "The GPU kit"; issue #31).
# Lives at the root of the bundle tools/gpu/bundle.sh makes; runs there with
# the machine's python3 (PyTorch 2.11.0+cu130) and nothing else: no Bazel,
# no network.
#
#   gpu_bundle/run_on_device.sh [--device=cuda|cpu] [--out=DIR] [--budget_s=420]
#       [--train_steps=300] [--compare_steps=20] [--bench_steps=20]
#       [--stages=tests,train,compare,bench,llama]
#       [--stage_scale=1]
#   gpu_bundle/run_on_device.sh --print_library_path
#
# 1. Checks that python3's torch is the version the bundle was built against
#    (PINNED_TORCH), and points LD_LIBRARY_PATH (for pipe's binaries only) at
#    the bundle's lib/, then the image's torch/lib and nvidia/*/lib.
# 2. tests:   every binary of cuda_tests.txt with its gtest filter (XML).
# 3. train:   train_gpt --device=<device> at pp = 1 for --train_steps steps,
#             and at pp = 2 with both ranks on one GPU (--ranks_per_device=2)
#             for a third of them.
# 4. compare: the same --compare_steps-step run on the CPU and on <device>
#             (NVIDIA_TF32_OVERRIDE=0): pp = 1 and pp = 2 (shared GPU) in fp32,
#             losses within 1e-4 relative; pp = 2 in bf16 within 2e-2; pp = 2
#             (shared GPU) with vocabulary parallelism (zbv_vocab1,
#             asynchronous collectives) in fp32 within 1e-4.
# 5. bench:   bin/gpu_pp1 (pipe, pp = 1) and py/torch_gpt_reference.py (the
#             same GPT in PyTorch) on <device>, alternating rounds, for the
#             kit's small GPT and a wide one; tokens/s ratio against the 0.95
#             target.
# 6. llama:   (issue #43) bf16 LLaMA at pp = 1: bin/gpu_pp1 --model=llama
#             against py/torch_llama_reference.py (autocast bf16, fused
#             AdamW, fused attention), alternating rounds; on cuda TinyLlama
#             1.1B's shape at context 2048, with each side's model FLOPs
#             utilisation in summary.json; then train_llama at pp = 2 with
#             both ranks on the GPU (--ranks_per_device=2) beside it. Not in
#             the default --stages (its own device call: about 3 minutes).
# Writes <out>/summary.json (kit_summary.py assemble), <out>/logs.tar.gz
# (every log, gtest XML and metrics file) and <out>/run_on_device.log. <out>
# is --out, else $OUT (the device machine sets it), else ./gpu_kit_out. Each
# stage has its own timeout, all inside --budget_s (default 7 min: with the
# machine's start, a failed first call leaves room for a short rerun inside the
# 15-minute lease), so one hung stage never eats the rest of the lease.
# --device=cpu is the rehearsal (tools/gpu/rehearse.sh): the same plumbing
# against a pip-installed PyTorch, CUDA cases skipping. Exit status 0 only
# when every stage passed.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
device=cuda
out=${OUT:-$PWD/gpu_kit_out}
budget_s=420
train_steps=300
compare_steps=20
bench_steps=20
stages=tests,train,compare,bench
llama_steps=10
scale=1
print_library_path=0
for arg in "$@"; do
  case "$arg" in
    --device=cuda | --device=cpu) device=${arg#--device=} ;;
    --out=*) out=${arg#--out=} ;;
    --budget_s=*) budget_s=${arg#--budget_s=} ;;
    --train_steps=*) train_steps=${arg#--train_steps=} ;;
    --compare_steps=*) compare_steps=${arg#--compare_steps=} ;;
    --bench_steps=*) bench_steps=${arg#--bench_steps=} ;;
    --stages=*) stages=${arg#--stages=} ;;
    --llama_steps=*) llama_steps=${arg#--llama_steps=} ;;
    --stage_scale=*) scale=${arg#--stage_scale=} ;;
    --print_library_path) print_library_path=1 ;;
    *)
      echo "run_on_device: unknown argument '$arg'; valid: --device=cuda|cpu, --out=DIR, --budget_s=N," \
        "--train_steps=N, --compare_steps=N, --bench_steps=N, --llama_steps=N," \
        "--stages=tests,train,compare,bench,llama," \
        "--stage_scale=N (multiplies every stage's own limit; the rehearsal on a slow CPU)," \
        "--print_library_path" >&2
      exit 2
      ;;
  esac
done
for n in "$budget_s" "$train_steps" "$compare_steps" "$bench_steps" "$llama_steps" "$scale"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_on_device: '$n' is not a positive whole number" >&2; exit 2; }
done
for s in ${stages//,/ }; do
  [[ $s =~ ^(tests|train|compare|bench|llama)$ ]] ||
    { echo "run_on_device: stage '$s' is not known; valid: tests, train, compare, bench, llama" >&2; exit 2; }
done

# --- 1. PyTorch version and library path -----------------------------------
pinned=$(cat "$HERE/PINNED_TORCH")
# One import (seconds on a loaded machine): the version, then site-packages.
torch_facts=$("$PYTHON" -c 'import os, torch; print(torch.__version__); print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null | tail -n2)
found=$(head -n1 <<< "$torch_facts")
if [[ -z $found ]]; then
  echo "run_on_device: '$PYTHON -c \"import torch\"' failed: this machine's python3 has no PyTorch;" \
    "the bundle needs PyTorch $pinned (its torch/lib and nvidia/*/lib)" >&2
  exit 3
fi
if [[ $found != "$pinned" ]]; then
  echo "run_on_device: python3's PyTorch is $found, but this bundle was built against $pinned;" \
    "its binaries load that LibTorch by soname and would fail or misbehave on another version" >&2
  exit 3
fi
site=$(tail -n1 <<< "$torch_facts")
library_path=$HERE/lib:$site/torch/lib
for d in "$site"/nvidia/*/lib; do
  [[ -d $d ]] && library_path=$library_path:$d
done
if ((print_library_path)); then
  echo "$library_path"
  exit 0
fi
# The environment of pipe's binaries: the library path above only for them
# (python3 keeps its own), and TF32 off in cuBLAS/cuDNN whatever the defaults.
pipe_env=(env LD_LIBRARY_PATH="$library_path" NVIDIA_TF32_OVERRIDE=0)

# --- Output, work folder, budget --------------------------------------------
mkdir -p "$out" || { echo "run_on_device: cannot make output folder $out" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/pipe_gpu_kit.XXXXXX")
records=$work/records.jsonl
: > "$records"
mkdir -p "$work/logs" "$work/tmp"
exec > >(tee "$out/run_on_device.log") 2>&1
start=$(date +%s)
deadline=$((start + budget_s))
say() { echo "[run_on_device $(date -u +%H:%M:%S)] $*"; }
# Seconds a stage may take: its own limit, cut to what is left of the budget
# (less 15 s for the summary); 0 when nothing is left.
stage_limit() {
  local left=$((deadline - $(date +%s) - 15))
  local own=$(($1 * scale))
  ((left < 0)) && left=0
  echo $((own < left ? own : left))
}
record() { "$PYTHON" "$HERE/py/kit_summary.py" "$@" >> "$records" || say "kit_summary.py $1 failed"; }
finish() {
  local host_json
  host_json=$work/header.json
  "$PYTHON" - "$host_json" "$device" "$pinned" "$found" "$start" "$budget_s" "$HERE" <<'PY'
import json, os, platform, subprocess, sys, time
path, device, pinned, found, start, budget, here = sys.argv[1:]
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:  # the summary must be written whatever is missing
        return "unavailable: %s" % e
gpu = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]) if device == "cuda" else ""
cpu_model = ""
try:
    cpu_model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
except OSError:
    pass
# The BLAS of the CPU runs: the pip PyTorch's (MKL where it has it).
blas = run([sys.executable, "-c", "import torch; print('MKL' if torch.backends.mkl.is_available() else 'not MKL (see torch.__config__.show())')"])
try:
    manifest = json.load(open(os.path.join(here, "MANIFEST.json")))
except Exception as e:
    manifest = {"error": str(e)}
header = {"kit": "pipe GPU kit (issue #31)", "device_flag": device,
          "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(start))),
          "seconds": round(time.time() - int(start), 1), "budget_s": int(budget),
          "torch_pinned": pinned, "torch_found": found, "bundle": manifest,
          "machine": {"hostname": platform.node(), "nproc": os.cpu_count(),
                      "loadavg": os.getloadavg(), "kernel": platform.release(),
                      "python": platform.python_version(), "gpu": gpu,
                      "cpu_model": cpu_model, "blas": blas}}
json.dump(header, open(path, "w"))
PY
  "$PYTHON" "$HERE/py/kit_summary.py" assemble "$records" "$host_json" "$out/summary.json" > /dev/null ||
    say "could not assemble summary.json"
  tar -czf "$out/logs.tar.gz" -C "$work" logs records.jsonl 2>/dev/null || say "could not pack the logs"
  say "summary: $out/summary.json; logs: $out/logs.tar.gz"
}
trap finish EXIT
trap 'say "stopped by a signal"; exit 143' TERM INT
say "device $device, PyTorch $found at $site, budget ${budget_s}s, output $out"
if [[ $device == cuda ]]; then
  nvidia-smi -L 2>&1 | sed 's/^/  /'
  "$PYTHON" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"; print("  torch sees", torch.cuda.get_device_name(0))' ||
    say "python3's torch sees no GPU; the CUDA cases will skip or fail"
fi
stage_wanted() { [[ ,$stages, == *,$1,* ]]; }
# run_limited NAME LIMIT LOG COMMAND...: runs pipe's binary with a timeout.
run_limited() {
  local name=$1 limit=$2 log=$3
  shift 3
  if ((limit <= 0)); then
    say "$name: not run, the budget is spent"
    echo "not run: budget spent" > "$log"
    return 124
  fi
  timeout -k 10 "$limit" "$@" < /dev/null > "$log" 2>&1
  local rc=$?
  ((rc == 124 || rc == 137)) && say "$name: TIMED OUT after ${limit}s"
  return $rc
}

# --- 2. tests -----------------------------------------------------------------
if stage_wanted tests; then
  while read -r label filter; do
    [[ -z $label || $label == \#* ]] && continue
    name=${label##*:}
    limit=$(stage_limit $([[ $name == equivalence_suite_test ]] && echo 200 || echo 60))
    t0=$(date +%s)
    mkdir -p "$work/tmp/$name"
    # In the bundle root, as Bazel runs a test in its runfiles root (data
    # dependencies such as experiments/configs/ are there).
    (cd "$HERE" && run_limited "$name" "$limit" "$work/logs/test_$name.log" \
      "${pipe_env[@]}" TEST_TMPDIR="$work/tmp/$name" "$HERE/bin/$name" --gtest_filter="$filter" --gtest_output="xml:$work/logs/test_$name.xml")
    rc=$?
    record tests "$name" "$filter" "$work/logs/test_$name.xml" "$rc" $(($(date +%s) - t0)) "$limit"
    say "$name ($filter): $(tail -n1 "$records" | "$PYTHON" -c 'import json,sys; r=json.load(sys.stdin); print("%d cases, %d failed, %d skipped, rc %d%s" % (r["tests"], r["failures"], r["skipped"], r["rc"], "" if r["ok"] else "  <-- FAIL " + r.get("error", "")))')"
  done < "$HERE/cuda_tests.txt"
fi

# --- 3./4. train_gpt ----------------------------------------------------------
# The README's GPT on synthetic data (no corpus on the machine needed), at
# pp = 1, and at pp = 2 with both ranks on one GPU (--ranks_per_device=2:
# host-staged groups) when the device is cuda.
train() {  # train NAME DEVICE STEPS LIMIT PP [PRECISION [FLAG...]]
  local name=$1 dev=$2 steps=$3 limit=$4 pp=$5 precision=${6:-fp32} t0 rc
  local extra=("${@:7}")
  t0=$(date +%s)
  [[ -x $HERE/bin/train_gpt ]] || limit=0  # a partial bundle (bundle.sh --only)
  # The config's 20 warm-up steps, fewer in a short run (the schedule needs
  # warmup_steps < steps).
  local warmup=$((steps / 2 < 20 ? steps / 2 : 20))
  local shared=()
  [[ $dev == cuda && $pp -gt 1 ]] && shared=(--ranks_per_device="$pp")
  run_limited "$name" "$limit" "$work/logs/$name.log" "${pipe_env[@]}" "$HERE/bin/train_gpt" \
    --config="$HERE/experiments/configs/gpt_small_pp2.textproto" --pp="$pp" --device="$dev" \
    "${shared[@]}" --precision="$precision" --steps="$steps" "${extra[@]}" \
    --output_dir="$work/$name" --name="$name" --sample_tokens=0 --eval_interval=0 \
    --set=data.source=synthetic,log_interval=50,lr_schedule.warmup_steps=$warmup
  rc=$?
  local metrics
  metrics=$(ls "$work/$name"/*/metrics.jsonl 2>/dev/null | head -n1)
  [[ -n $metrics ]] && cp "$metrics" "$work/logs/$name.metrics.jsonl"
  record train "$name" "${metrics:-/missing}" "$rc" $(($(date +%s) - t0)) "$limit"
  say "$name: $(tail -n1 "$records")"
}
if stage_wanted train; then
  train "train_${device}_pp1" "$device" "$train_steps" "$(stage_limit 120)" 1
  train "train_${device}_pp2_shared" "$device" "$((train_steps / 3))" "$(stage_limit 120)" 2
fi
# compare NAME PP PRECISION RTOL [FLAG...]: the same run on the CPU and on <device>.
compare() {
  local name=$1 pp=$2 precision=$3 rtol=$4
  local extra=("${@:5}")
  train "${name}_cpu" cpu "$compare_steps" "$(stage_limit 90)" "$pp" "$precision" "${extra[@]}"
  train "${name}_on_$device" "$device" "$compare_steps" "$(stage_limit 60)" "$pp" "$precision" \
    "${extra[@]}"
  record compare "$work/logs/${name}_cpu.metrics.jsonl" "$work/logs/${name}_on_$device.metrics.jsonl" \
    "$rtol" "$compare_steps" "$name"
  say "$name: $(tail -n1 "$records" | cut -c1-400)"
}
if stage_wanted compare; then
  # fp32 with TF32 off: within 1e-4 relative. bf16: the CPU's and cuBLAS's
  # bf16 kernels round differently, so a looser bound.
  compare compare_pp1 1 fp32 1e-4
  compare compare_pp2_shared 2 fp32 1e-4
  compare compare_pp2_shared_bf16 2 bf16 2e-2
  # Vocabulary parallelism (the tied table split over both ranks): the
  # paper's one-barrier ZB-V with asynchronous collectives.
  compare compare_pp2_shared_vocab 2 fp32 1e-4 --vocab_parallel=true --schedule=zbv_vocab1 \
    --chunks=2 --vocab_async_collectives=true
fi

# --- 5. bench -----------------------------------------------------------------
# Two GPTs: the kit's small one (launch-bound on a GPU: it measures the host
# side of a step) and a wider one whose kernels dominate. Rounds alternate.
# bench NAME ROUNDS MODEL TARGET LIMIT STEPS ARGS...: gpu_pp1 --model=MODEL and
# the PyTorch reference of MODEL (gpt or llama), the same ARGS, alternating.
bench() {
  local name=$1 rounds=$2 model=$3 target=$4 limit=$5 steps=$6 round
  shift 6
  for ((round = 1; round <= rounds; round++)); do
    run_limited "gpu_pp1 $name round $round" "$(stage_limit "$limit")" "$work/logs/bench_${name}_pipe_$round.log" \
      "${pipe_env[@]}" "$HERE/bin/gpu_pp1" --model="$model" --device="$device" --steps="$steps" "$@"
    run_limited "torch reference $name round $round" "$(stage_limit "$limit")" \
      "$work/logs/bench_${name}_torch_$round.log" env NVIDIA_TF32_OVERRIDE=0 "$PYTHON" \
      "$HERE/py/torch_${model}_reference.py" --device="$device" --steps="$steps" "$@"
  done
  cat "$work"/logs/bench_"${name}"_pipe_*.log > "$work/logs/bench_${name}_pipe.log"
  cat "$work"/logs/bench_"${name}"_torch_*.log > "$work/logs/bench_${name}_torch.log"
  record bench "$work/logs/bench_${name}_pipe.log" "$work/logs/bench_${name}_torch.log" "$target" "$name"
  say "bench $name: $(tail -n1 "$records" | cut -c1-400)"
}
if stage_wanted bench; then
  # The same intra-op threads on both sides (on a GPU they only launch).
  if [[ $device == cuda ]]; then
    bench small 3 gpt 0.95 60 "$bench_steps" --micro_batch_size=16 --threads=4
    bench wide 3 gpt 0.95 60 "$bench_steps" --width=1024 --layers=8 --heads=16 --context=512 \
      --micro_batch_size=8 --microbatches=4 --threads=4
  else
    bench small 2 gpt 0.95 60 "$bench_steps" --micro_batch_size=4 --threads=1
    bench wide 1 gpt 0.95 60 "$bench_steps" --width=512 --layers=2 --heads=8 --context=128 \
      --micro_batch_size=2 --microbatches=2 --threads=1
  fi
fi

# --- 6. llama -------------------------------------------------------------------
# Issue #43's GPU measurement: bf16 LLaMA at pp = 1, pipe against PyTorch eager
# (target 1.0x, model FLOPs utilisation of each in summary.json), then pp = 2
# with both ranks on the GPU. On cuda TinyLlama 1.1B's shape; on the CPU (the
# rehearsal) a small one with the same plumbing.
if stage_wanted llama; then
  if [[ $device == cuda ]]; then
    llama=(--vocab=32000 --width=2048 --layers=22 --heads=32 --kv_heads=4 --intermediate=5632
      --context=2048 --micro_batch_size=4 --microbatches=4 --threads=4)
    llama_rounds=2 llama_limit=150
  else
    llama=(--vocab=2048 --width=128 --layers=2 --heads=4 --kv_heads=2 --intermediate=344
      --context=64 --micro_batch_size=2 --microbatches=2 --threads=1)
    llama_rounds=1 llama_limit=60
  fi
  bench llama_bf16 "$llama_rounds" llama 1.0 "$llama_limit" "$llama_steps" --precision=bf16 \
    --warmup=3 "${llama[@]}"
  # pp = 2, both ranks on the device (host-staged groups on cuda), through
  # train_llama over a synthetic uint16 token file of the same vocabulary.
  declare -A flag=()
  for a in "${llama[@]}"; do flag[${a%%=*}]=${a#*=}; done
  "$PYTHON" - "$work/llama_tokens.bin" "${flag[--vocab]}" <<'PY'
import random, struct, sys
rng = random.Random(43)
ids = [rng.randrange(int(sys.argv[2])) for _ in range(1 << 19)]
open(sys.argv[1], "wb").write(struct.pack(f"<{len(ids)}H", *ids))
PY
  name=llama_bf16_pp2_shared
  t0=$(date +%s)
  limit=$(stage_limit "$llama_limit")
  [[ -x $HERE/bin/train_llama ]] || limit=0  # a partial bundle (bundle.sh --only)
  shared=()
  [[ $device == cuda ]] && shared=(--ranks_per_device=2)
  run_limited "$name" "$limit" "$work/logs/$name.log" "${pipe_env[@]}" "$HERE/bin/train_llama" \
    --config="$HERE/experiments/configs/llama_small_pp2.textproto" --pp=2 --device="$device" \
    "${shared[@]}" --precision=bf16 --steps=$((llama_steps + 12)) --data="$work/llama_tokens.bin" \
    --output_dir="$work/$name" --name="$name" --sample_tokens=0 --eval_interval=0 \
    --microbatches="${flag[--microbatches]}" \
    --set=llama.vocab_size=${flag[--vocab]},llama.width=${flag[--width]},llama.num_layers=${flag[--layers]},llama.num_heads=${flag[--heads]},llama.num_kv_heads=${flag[--kv_heads]},llama.intermediate_size=${flag[--intermediate]},llama.context_length=${flag[--context]},llama.tokenizer=,parallelism.micro_batch_size=${flag[--micro_batch_size]},data.eval_fraction=0,log_interval=1,lr_schedule.warmup_steps=2
  rc=$?
  metrics=$(ls "$work/$name"/*/metrics.jsonl 2>/dev/null | head -n1)
  [[ -n $metrics ]] && cp "$metrics" "$work/logs/$name.metrics.jsonl"
  record train "$name" "${metrics:-/missing}" "$rc" $(($(date +%s) - t0)) "$limit"
  say "$name: $(tail -n1 "$records")"
fi

ok=$("$PYTHON" -c 'import json,sys; rs=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(int(bool(rs) and all(r.get("ok") for r in rs)))' "$records")
say "done in $(($(date +%s) - start))s: $([[ $ok == 1 ]] && echo "every stage passed" || echo "SOME STAGE FAILED (summary.json says which)")"
[[ $ok == 1 ]]
