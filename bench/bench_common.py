"""What the bench scripts share: the peer GPT in pipe's config language and its
model flags, pipe's and DeepSpeed's runs of it, machine facts (load, CPU model,
UTC times), argument checks and appending a record to a result file.

The scripts beside this file import it by name (Python puts a script's own
folder first on its path; under Bazel, //bench:bench_py's `imports`). Debian's
python3 only, no third-party modules: the DeepSpeed and PyTorch venvs import
it too. The trace -> simulator inputs are trace_costs.py's, the PyTorch peer
GPT is peer_gpt.py's.
"""
import datetime
import glob
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import trace_costs

HERE = Path(__file__).resolve().parent

# --------------------------------------------------------------------------- the peer GPT

# The peer GPT's shape (../shared/peers/README.md) in pipe's config language.
PEER_GPT_SHAPE = ("gpt.width=256,gpt.num_layers=8,gpt.num_heads=4,gpt.context_length=128,"
                  "gpt.mlp_ratio=4")

# The peer GPT with the training settings its peers use.
PEER_GPT = (PEER_GPT_SHAPE + ",optimizer.max_grad_norm=0,optimizer.weight_decay=0,"
            "optimizer.lr=1e-3,lr_schedule.name=constant,eval_interval=0,eval_batches=1,"
            "sample_tokens=0,data.source=synthetic,log_interval=1000")

# The model's size and batch, shared by every system's command line (defaults:
# the peer GPT above); bench_side_by_side.py's overhead mode shrinks them.
MODEL_DEFAULTS = {"width": 256, "layers": 8, "heads": 4, "context": 128, "micro_batch_size": 4,
                  "microbatches": 8}


def add_model_arguments(parser):
    for name, default in MODEL_DEFAULTS.items():
        parser.add_argument(f"--{name}", type=int, default=default,
                            help=f"model/batch size for every system (default {default})")


def pipe_model_set(args):
    """PEER_GPT with the model size of args (--width, --layers, ...)."""
    fields = dict(item.split("=", 1) for item in PEER_GPT.split(","))
    fields.update({"gpt.width": args.width, "gpt.num_layers": args.layers,
                   "gpt.num_heads": args.heads, "gpt.context_length": args.context})
    return ",".join(f"{k}={v}" for k, v in fields.items())


def tokens_per_step(args):
    return args.micro_batch_size * args.microbatches * args.context


# --------------------------------------------------------------------------- arguments


def require_positive(parser, args, *names):
    """parser.error naming the first of the flags `names` below 1."""
    for name in names:
        value = getattr(args, name)
        if value < 1:
            parser.error(f"--{name}={value} must be >= 1")


# --------------------------------------------------------------------------- machine facts


def load_average():
    """The 1, 5 and 15 minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def loadavg_line():
    """/proc/loadavg as it reads."""
    with open("/proc/loadavg") as f:
        return f.read().strip()


def cpu_model():
    """The CPU's model name from /proc/cpuinfo ('' when not named)."""
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f
                     if line.startswith("model name")), "")


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def utc_seconds(when=None):
    """`when` (default now) as 2026-11-24T08:16:05Z."""
    return (when or utc_now()).isoformat(timespec="seconds").replace("+00:00", "Z")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- records


def append_record(path, record):
    """Appends one JSON line to the result file `path` ('' or None: nowhere)."""
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------- runs


def run_for_result(what, command, env, timeout):
    """Runs a Python driver and returns its result: the JSON of its last
    `RESULT {...}` line, or else of its last line that is a JSON object."""
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [l.split("RESULT ", 1)[1] for l in (proc.stdout + proc.stderr).splitlines()
             if "RESULT {" in l]
    lines = lines or [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {' '.join(command)}\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def run_train_gpt(cmd, out_dir, name, timeout, tail=3000, load=os.getloadavg):
    """Runs train_gpt's command line `cmd` (OMP_NUM_THREADS=1), whose run
    folder is out_dir/name-<time>. Returns its output (CompletedProcess), the
    run folder, its metrics.jsonl lines and load() just before and after the
    run; SystemExit with the last `tail` characters of its output when it
    fails."""
    load_before = load()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    load_after = load()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-tail:]}{proc.stderr[-tail:]}")
    rundir = sorted(glob.glob(os.path.join(out_dir, name + "-*")))[-1]
    with open(os.path.join(rundir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    return proc, rundir, metrics, load_before, load_after


def pipe_command(args, flags, out):
    """train_gpt's command line and environment for one run of the peer GPT
    (args: the model flags, --stages, --warmup, --steps, --seed, --explorer).
    `flags` may start with NAME=value environment settings and name another
    build of train_gpt with --binary=PATH (e.g. -c opt vs fastbuild)."""
    tokens = shlex.split(flags)
    env = dict(os.environ)
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    binary = args.train_gpt
    for t in [t for t in tokens if t.startswith("--binary=")]:
        binary = t.split("=", 1)[1]
        tokens.remove(t)
    trace = (f",trace_step={args.warmup},trace_steps={args.steps}" if args.explorer else "")
    command = [binary, f"--set={pipe_model_set(args)}{trace}", f"--pp={args.stages}",
               f"--microbatches={args.microbatches}", f"--micro_batch_size={args.micro_batch_size}",
               f"--steps={args.warmup + args.steps}", f"--output_dir={out}", "--name=bench",
               f"--seed={args.seed}"] + tokens
    return command, env


def run_pipe(args, flags, workdir):
    """One train_gpt run (pipe_command) in a fresh folder of `workdir`: its
    median tokens/s after the warm-up, per-rank busy time, losses, threads and,
    with args.explorer, the simulator's prediction (simulate_pipe)."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    command, env = pipe_command(args, flags, out)
    started = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"pipe failed ({proc.returncode}): {' '.join(command)}\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = next(out.glob("bench-*"))
    metrics = [json.loads(line) for line in run_dir.joinpath(
        "metrics.jsonl").read_text().splitlines()]
    timed = [m for m in metrics if m["step"] > args.warmup]
    threads = sorted({line.split("threads: ", 1)[1].split(" (")[0]
                      for line in proc.stderr.splitlines()
                      if line.startswith("[launcher] rank ") and " threads: " in line})
    # Per rank: the step's time in compute (step time minus that rank's idle
    # share), the median over the timed steps: how even the stages are.
    # Steps without a bubble figure (untraced runs skip some) are left out.
    measured = [m for m in timed if "bubble" in m]
    ranks = len(measured[0]["bubble"]) if measured else 0
    busy = [round(statistics.median(m["step_s"] * (1 - m["bubble"][r]) for m in measured), 4)
            for r in range(ranks)]
    simulated = simulate_pipe(args, run_dir, metrics) if args.explorer else {}
    return {"tokens_per_s": statistics.median(m["tokens_per_s"] for m in timed),
            "busy_s": busy, **simulated,
            "step_s": [m["step_s"] for m in timed], "loss_first": metrics[0]["loss"],
            "loss_last": metrics[-1]["loss"], "threads": threads,
            "wall_s": time.time() - started, "run_dir": str(run_dir)}


def simulate_pipe(args, run_dir, metrics):
    """The simulator's prediction for a pipe run (--explorer): every timed
    step was traced; each is simulated with its own measured costs as
    bench_schedules does (per-stage compute, per-rank tail, send and receive
    costs). Returns the median predicted step, the median of simulated /
    measured - 1 over the steps (and the one farthest from 0), and the same
    for trace_costs.replay_step (the model with every action's own
    duration)."""
    config = run_dir.joinpath("config.textproto").read_text()

    def field(name, default):
        found = re.search(rf"\b{name}: \"?([\w.]+)\"?", config)
        return found.group(1) if found else default

    schedule, chunks = field("schedule", "1f1b"), int(field("chunks", "1"))
    stages, m = int(field("pp", "1")), int(field("num_microbatches", "1"))
    traced = trace_costs.load_traced_steps(str(run_dir), metrics, args.warmup, args.steps,
                                           chunks, stages)
    predicted, errors, replay_errors, _ = trace_costs.simulate_steps(
        args.explorer, schedule, stages, m, chunks, traced,
        any("grad_norm" in m for m in metrics))
    return {"simulated_step_s": statistics.median(predicted),
            "simulated_error": statistics.median(errors),
            "simulated_error_max": max(errors, key=abs),
            "replay_error": statistics.median(replay_errors)}


def run_deepspeed(args):
    """One run of bench/deepspeed_gpt.py under DeepSpeed's launcher
    (args.deepspeed) on CPU: its result line's figures."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", DS_ACCELERATOR="cpu",
               DS_BUILD_OPS="0")
    command = [args.deepspeed, "--num_gpus", str(args.stages), "--master_port",
               str(free_port()), str(HERE / "deepspeed_gpt.py"), f"--steps={args.steps}",
               f"--warmup={args.warmup}", f"--stages={args.stages}", f"--seed={args.seed}"]
    command += [f"--{name}={getattr(args, name)}" for name in MODEL_DEFAULTS]
    started = time.time()
    result = run_for_result("deepspeed", command, env, args.timeout)
    return {"tokens_per_s": result["tokens_per_s"], "step_s": result["step_s"],
            "loss_first": result["loss_first"], "loss_last": result["loss_last"],
            "threads": result["threads"], "cpu_s_per_step": result["cpu_s_per_step"],
            "busy_s": [], "wall_s": time.time() - started}
