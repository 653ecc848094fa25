"""pipe vs DeepSpeed 0.14.1 on the peer GPT, side by side (issue #16).

Runs DeepSpeed's pipeline engine (bench/deepspeed_gpt.py) and pipe's
train_gpt on the same model, data kind and batch, alternately: every
repetition runs each system once, in the same order, so slow periods of a
shared machine hit both. Each run's figure is the median tokens/s of its steps
after warm-up; a system's figure is the median over repetitions.

Prints a table on stderr and one JSON line on stdout:
  {"deepspeed": {...}, "pipe": {...}, "ratio": pipe / deepspeed, "pipe_faster_pairs": "k/n", ...}
Extra pipe variants (--variant name='flags') are measured in the same
rotation and get their own ratio; a variant's flags may start with NAME=value
environment settings and may name another train_gpt build with --binary=PATH.

With --explorer (the .sh passes it), every timed pipe step is traced and
simulated with its own measured costs (bench_schedules.simulate_steps): each
pipe run also reports the simulated step and the median per-step error.

Use bench/bench_vs_deepspeed.sh (it makes the virtual environment and
builds train_gpt and schedule_explorer); this script needs --train_gpt and
--deepspeed.
"""
import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_schedules  # noqa: E402  (trace costs -> simulator, shared)

# The peer GPT in pipe's config language (../shared/peers/README.md).
PEER_GPT = ("gpt.width=256,gpt.num_layers=8,gpt.num_heads=4,gpt.context_length=128,"
            "gpt.mlp_ratio=4,optimizer.max_grad_norm=0,optimizer.weight_decay=0,"
            "optimizer.lr=1e-3,lr_schedule.name=constant,eval_interval=0,eval_batches=1,"
            "sample_tokens=0,data.source=synthetic,log_interval=1000")


# The model's size and batch, shared by both systems' command lines (defaults:
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_average():
    return [round(x, 2) for x in os.getloadavg()]


def run_pipe(args, flags, workdir):
    out = Path(tempfile.mkdtemp(dir=workdir))
    # A variant may start with NAME=value environment settings and name
    # another build of train_gpt with --binary=PATH (e.g. -c opt vs fastbuild).
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
    for bench_schedules.replay_step (the model with every action's own
    duration)."""
    config = run_dir.joinpath("config.textproto").read_text()

    def field(name, default):
        found = re.search(rf"\b{name}: \"?([\w.]+)\"?", config)
        return found.group(1) if found else default

    schedule, chunks = field("schedule", "1f1b"), int(field("chunks", "1"))
    stages, m = int(field("pp", "1")), int(field("num_microbatches", "1"))
    traced = bench_schedules.load_traced_steps(str(run_dir), metrics, args.warmup, args.steps,
                                               chunks, stages)
    predicted, errors, replay_errors, _ = bench_schedules.simulate_steps(
        args.explorer, schedule, stages, m, chunks, traced,
        any("grad_norm" in m for m in metrics))
    return {"simulated_step_s": statistics.median(predicted),
            "simulated_error": statistics.median(errors),
            "simulated_error_max": max(errors, key=abs),
            "replay_error": statistics.median(replay_errors)}


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


def run_deepspeed(args):
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_gpt", required=True, help="pipe's train_gpt binary")
    parser.add_argument("--deepspeed", required=True, help="DeepSpeed's launcher (venv/bin)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    add_model_arguments(parser)
    parser.add_argument("--pipe_flags", default="", help="flags for the main pipe run")
    parser.add_argument("--variant", action="append", default=[],
                        help="name='train_gpt flags': another pipe run per repetition")
    parser.add_argument("--no_deepspeed", action="store_true", help="pipe variants only")
    parser.add_argument("--explorer", default="",
                        help="schedule_explorer binary: trace pipe's timed steps and report "
                             "the simulator's prediction for each pipe run")
    args = parser.parse_args()
    for value, name in ((args.reps, "--reps"), (args.steps, "--steps"), (args.stages, "--stages")):
        if value < 1:
            parser.error(f"{name}={value} must be >= 1")

    systems = [] if args.no_deepspeed else [("deepspeed", None)]
    systems.append(("pipe", args.pipe_flags))
    for v in args.variant:
        name, sep, flags = v.partition("=")
        if not sep or not name or name in ("deepspeed", "pipe"):
            parser.error(f"--variant '{v}' must look like name='flags' (name not pipe/deepspeed)")
        systems.append((name, flags))

    runs = {name: [] for name, _ in systems}
    load = {"start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench_vs_deepspeed") as workdir:
        for rep in range(args.reps):
            for name, flags in systems:
                r = run_deepspeed(args) if flags is None else run_pipe(args, flags, workdir)
                runs[name].append(r)
                sim = (f"  simulated step {r['simulated_step_s']:.3f} s (per step "
                       f"{100 * r['simulated_error']:+.1f}%, replay {100 * r['replay_error']:+.1f}%)"
                       if "simulated_step_s" in r else "")
                print(f"rep {rep + 1}/{args.reps} {name:>12}: {r['tokens_per_s']:8.1f} tokens/s"
                      f"{sim}  loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}  threads "
                      f"{r['threads']}  busy per rank {r['busy_s']}  load {load_average()}",
                      file=sys.stderr, flush=True)
    load["end"] = load_average()

    result = {"bench": "pipe_vs_deepspeed", "reps": args.reps, "steps": args.steps,
              "warmup": args.warmup, "stages": args.stages, "tokens_per_step": tokens_per_step(args),
              "load_average": load}
    for name, _ in systems:
        tps = [r["tokens_per_s"] for r in runs[name]]
        result[name] = {"median_tokens_per_s": round(statistics.median(tps), 1),
                        "runs_tokens_per_s": [round(x, 1) for x in tps],
                        "busy_s_per_rank": [round(statistics.median(b), 4) for b in
                                            zip(*(r["busy_s"] for r in runs[name]))],
                        "threads": runs[name][0]["threads"],
                        "flags": dict(systems)[name]}
        if "simulated_step_s" in runs[name][0]:
            # Medians over runs: measured and simulated step, and the per-step
            # error simulated / measured - 1.
            result[name]["median_step_s"] = round(statistics.median(
                statistics.median(r["step_s"]) for r in runs[name]), 4)
            result[name]["simulated_step_s"] = round(statistics.median(
                r["simulated_step_s"] for r in runs[name]), 4)
            result[name]["simulated_error"] = round(statistics.median(
                r["simulated_error"] for r in runs[name]), 4)
            result[name]["replay_error"] = round(statistics.median(
                r["replay_error"] for r in runs[name]), 4)
    if not args.no_deepspeed:
        ds = runs["deepspeed"]
        for name, _ in systems[1:]:
            key = "ratio" if name == "pipe" else f"ratio_{name}"
            result[key] = round(result[name]["median_tokens_per_s"] /
                                result["deepspeed"]["median_tokens_per_s"], 3)
            faster = sum(p["tokens_per_s"] > d["tokens_per_s"] for p, d in zip(runs[name], ds))
            result[f"{name}_faster_pairs"] = f"{faster}/{args.reps}"
    print(f"{'system':>12} {'median tok/s':>13}  runs", file=sys.stderr)
    for name, _ in systems:
        print(f"{name:>12} {result[name]['median_tokens_per_s']:13.1f}  "
              f"{result[name]['runs_tokens_per_s']}", file=sys.stderr)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
