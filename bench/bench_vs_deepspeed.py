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

The runs are bench_common.py's (run_pipe, run_deepspeed).

With --explorer (the .sh passes it), every timed pipe step is traced and
simulated with its own measured costs (trace_costs.simulate_steps): each
pipe run also reports the simulated step and the median per-step error.

Use bench/bench_vs_deepspeed.sh (it makes the virtual environment and
builds train_gpt and schedule_explorer); this script needs --train_gpt and
--deepspeed.
"""
import argparse
import json
import statistics
import sys
import tempfile

import bench_common
from bench_common import load_average


def parse_args():
    """The arguments and the systems in rotation order: (name, flags), flags
    None for DeepSpeed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_gpt", required=True, help="pipe's train_gpt binary")
    parser.add_argument("--deepspeed", required=True, help="DeepSpeed's launcher (venv/bin)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    bench_common.add_model_arguments(parser)
    parser.add_argument("--pipe_flags", default="", help="flags for the main pipe run")
    parser.add_argument("--variant", action="append", default=[],
                        help="name='train_gpt flags': another pipe run per repetition")
    parser.add_argument("--no_deepspeed", action="store_true", help="pipe variants only")
    parser.add_argument("--explorer", default="",
                        help="schedule_explorer binary: trace pipe's timed steps and report "
                             "the simulator's prediction for each pipe run")
    args = parser.parse_args()
    bench_common.require_positive(parser, args, "reps", "steps", "stages")

    systems = [] if args.no_deepspeed else [("deepspeed", None)]
    systems.append(("pipe", args.pipe_flags))
    for v in args.variant:
        name, sep, flags = v.partition("=")
        if not sep or not name or name in ("deepspeed", "pipe"):
            parser.error(f"--variant '{v}' must look like name='flags' (name not pipe/deepspeed)")
        systems.append((name, flags))
    return args, systems


def system_summary(runs, flags):
    """One system's medians over its runs."""
    tps = [r["tokens_per_s"] for r in runs]
    summary = {"median_tokens_per_s": round(statistics.median(tps), 1),
               "runs_tokens_per_s": [round(x, 1) for x in tps],
               "busy_s_per_rank": [round(statistics.median(b), 4) for b in
                                   zip(*(r["busy_s"] for r in runs))],
               "threads": runs[0]["threads"],
               "flags": flags}
    if "simulated_step_s" in runs[0]:
        # Medians over runs: measured and simulated step, and the per-step
        # error simulated / measured - 1.
        summary["median_step_s"] = round(statistics.median(
            statistics.median(r["step_s"]) for r in runs), 4)
        for key in ("simulated_step_s", "simulated_error", "replay_error"):
            summary[key] = round(statistics.median(r[key] for r in runs), 4)
    return summary


def main():
    args, systems = parse_args()
    runs = {name: [] for name, _ in systems}
    load = {"start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench_vs_deepspeed") as workdir:
        for rep in range(args.reps):
            for name, flags in systems:
                r = (bench_common.run_deepspeed(args) if flags is None else
                     bench_common.run_pipe(args, flags, workdir))
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
              "warmup": args.warmup, "stages": args.stages,
              "tokens_per_step": bench_common.tokens_per_step(args), "load_average": load}
    for name, flags in systems:
        result[name] = system_summary(runs[name], flags)
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
