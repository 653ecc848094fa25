#!/usr/bin/env python3
"""bench_schedules: the README's main GPT trained under several schedules.

    ./bazelw run //bench:bench_schedules -- --reps 3 --steps 12 --warmup 4

For each micro-batch count (--microbatches, default 4 and 8) and repetition,
runs train_gpt (the config of the README's main command, pp = 2 or --pp) once per
schedule, the schedules alternating so that machine load hits all of them,
and reports per schedule:
  - tokens/s: median over the steps after --warmup, then median over the
    repetitions; its ratio to 1f1b;
  - the simulator's prediction: every step after the warm-up is traced
    (train_gpt --set=trace_step=W,trace_steps=N: traces/step_<k>.json), and
    each traced step is simulated with its own costs: per virtual stage the
    mean F, B, I, W durations (a 2-chunk schedule has 2 stages per rank); per
    rank the tail (STEP, REDUCE_TIED: a collective's cost on a rank is its end
    minus the latest start among the collective's ranks; REDUCE_GRAD per
    stage), the median SEND duration and the RECV cost (per RECV its end
    minus the later of its start and its message's SEND end; the smallest per
    rank); the message latency (comm: the median of the rest of those RECVs
    that were posted before their SEND ended; the waits themselves are the
    simulator's to reproduce). schedule_explorer gets them as --costs,
    --stage_costs, --rank_costs, --tie_groups=0,<last stage> (the GPT ties
    its embedding and head), --step_all_reduce when the run computes the
    gradient norm, and --defer_receives (as the runtime executes). A run's
    predicted step is the median of its steps' makespans (predicted tokens/s
    = tokens per step / that); "sim err" compares it with the median measured
    step, "vs traced" is the median over all traced steps of simulated /
    measured - 1 for the same step (the model's own error, without
    step-to-step variation); "replay" the same for replay_step (the model
    run with every action's own duration: the model's structural error).
The trace -> simulator inputs are trace_costs.py's.
Schedules not registered in this build (e.g. dualpipev before it lands) are
listed as skipped. Prints a table on stdout and one JSON line at the end.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

import trace_costs

TWO_CHUNKS = {"zbv", "vhalf", "dualpipev", "interleaved_1f1b", "interleaved_zb"}


def run_train(args, schedule, m, out_dir, name):
    chunks = 2 if schedule in TWO_CHUNKS else 1
    # Every timed step is traced (0-based step numbers: metrics step k+1).
    first, count = args.warmup, args.steps - args.warmup
    cmd = [args.train_gpt, f"--config={args.config}", f"--schedule={schedule}", f"--pp={args.pp}",
           f"--chunks={chunks}", f"--microbatches={m}", f"--steps={args.steps}",
           "--eval_interval=0", "--sample_tokens=0", f"--output_dir={out_dir}", f"--name={name}",
           f"--set=lr_schedule.warmup_steps={min(20, args.steps - 1)},trace_step={first},"
           f"trace_steps={count}" + (f",{args.set}" if args.set else "")] + args.train_flag
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"train_gpt failed for {schedule} m={m}: {' '.join(cmd)}")
    run = sorted(glob.glob(os.path.join(out_dir, name + "-*")))[-1]
    steps = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    timed = [s for s in steps if s["step"] > args.warmup] or steps
    tokens_per_step = statistics.median(s["tokens_per_s"] * s["step_s"] for s in timed)
    traced = trace_costs.load_traced_steps(run, steps, first, count, chunks, args.pp)
    return {
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in timed),
        "step_s": statistics.median(s["step_s"] for s in timed),
        "tokens_per_step": tokens_per_step,
        "chunks": chunks,
        "step_all_reduce": any("grad_norm" in s for s in steps),
        "traced": traced,
    }


def predict(args, schedule, m, run):
    """The run's prediction: the median of its traced steps' makespans."""
    (predicted, run["traced_errors"], run["replay_errors"],
     (run["stage_costs"], run["rank_costs"])) = trace_costs.simulate_steps(
        args.explorer, schedule, args.pp, m, run["chunks"], run["traced"], run["step_all_reduce"])
    return statistics.median(predicted)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train_gpt", required=True)
    ap.add_argument("--explorer", required=True)
    ap.add_argument("--config", default="experiments/configs/gpt_small_pp2.textproto")
    ap.add_argument("--pp", type=int, default=2, help="pipeline ranks (the simulator follows)")
    ap.add_argument("--set", default="",
                    help="config assignments added to the harness's own --set (train_gpt takes one)")
    ap.add_argument("--schedules", default="1f1b,zb_h1,zbv,dualpipev")
    ap.add_argument("--microbatches", default="4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4,
                    help="steps left out of the medians (the later ones are traced)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--train_flag", action="append", default=[],
                    help="extra train_gpt flag (repeatable)")
    return ap.parse_args()


def measure(args, schedules):
    """(schedule, m) -> the runs of every repetition, each logged on stderr."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_schedules_") as tmp:
        for m in (int(x) for x in args.microbatches.split(",")):
            for rep in range(args.reps):
                for s in schedules:
                    r = run_train(args, s, m, tmp, f"{s}_m{m}_r{rep}")
                    r["predicted_step_s"] = predict(args, s, m, r)
                    results.setdefault((s, m), []).append(r)
                    costs = " ".join(
                        f"{st}{k}:{v * 1e3:.1f}"
                        for st, c in sorted(r["stage_costs"].items())
                        for k, v in sorted(c.items()) if k in "FBIW") + " " + " ".join(
                        f"r{rk}{k}:{v * 1e3:.2f}" for rk, c in sorted(r["rank_costs"].items())
                        for k, v in sorted(c.items()))
                    err = statistics.median(r["traced_errors"])
                    replay = statistics.median(r["replay_errors"])
                    print(f"m={m} rep {rep} {s:10s} {r['tokens_per_s']:8.0f} tok/s  step "
                          f"{r['step_s']:.3f} s  simulated {r['predicted_step_s']:.3f} s "
                          f"(per traced step {100 * err:+.1f}%, replay {100 * replay:+.1f}%)  "
                          f"last step's costs (ms) {costs}",
                          file=sys.stderr, flush=True)
    return results


def summarize(results):
    """Per (schedule, m): medians over the repetitions, ratios to 1f1b's and
    the simulator's errors."""
    summary = []
    for (s, m), runs in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        step = statistics.median(r["step_s"] for r in runs)
        sim_step = statistics.median(r["predicted_step_s"] for r in runs)
        sim_tps = statistics.median(r["tokens_per_step"] / r["predicted_step_s"] for r in runs)
        summary.append({"schedule": s, "microbatches": m, "tokens_per_s": tps, "step_s": step,
                        "simulated_step_s": sim_step, "simulated_tokens_per_s": sim_tps,
                        "runs_tokens_per_s": [r["tokens_per_s"] for r in runs],
                        # Per traced step of every run: simulated / measured - 1.
                        "traced_errors": [e for r in runs for e in r["traced_errors"]],
                        "replay_errors": [e for r in runs for e in r["replay_errors"]]})
    by_key = {(x["schedule"], x["microbatches"]): x for x in summary}
    for x in summary:
        base = by_key.get(("1f1b", x["microbatches"]))
        x["ratio_to_1f1b"] = x["tokens_per_s"] / base["tokens_per_s"] if base else None
        x["simulated_ratio_to_1f1b"] = (x["simulated_tokens_per_s"] /
                                        base["simulated_tokens_per_s"] if base else None)
        x["simulated_error"] = x["simulated_step_s"] / x["step_s"] - 1
    return summary


def print_table(summary):
    print(f"{'m':>3} {'schedule':10} {'tokens/s':>9} {'vs 1f1b':>8} {'simulated tok/s':>16} "
          f"{'sim vs 1f1b':>12} {'step s':>8} {'sim step s':>11} {'sim err':>8} {'vs traced':>9} "
          f"{'replay':>7}  runs (tok/s)")
    for x in summary:
        has_base = x["ratio_to_1f1b"] is not None
        traced_err = (f"{100 * statistics.median(x['traced_errors']):.1f}%"
                      if x["traced_errors"] else "-")
        ratio = f"{x['ratio_to_1f1b']:.3f}x" if has_base else "-"
        sim_ratio = f"{x['simulated_ratio_to_1f1b']:.3f}x" if has_base else "-"
        print(f"{x['microbatches']:>3} {x['schedule']:10} {x['tokens_per_s']:9.0f} {ratio:>8} "
              f"{x['simulated_tokens_per_s']:16.0f} {sim_ratio:>12} {x['step_s']:8.3f} "
              f"{x['simulated_step_s']:11.3f} {100 * x['simulated_error']:7.1f}% "
              f"{traced_err:>9} {100 * statistics.median(x['replay_errors']):6.1f}%  "
              + ", ".join(f"{v:.0f}" for v in x["runs_tokens_per_s"]))


def main():
    args = parse_args()
    listed = subprocess.run([args.explorer, "--list"], capture_output=True, text=True,
                            check=True).stdout.split()
    schedules = [s for s in args.schedules.split(",") if s in listed]
    skipped = [s for s in args.schedules.split(",") if s not in listed]
    summary = summarize(measure(args, schedules))
    print_table(summary)
    if skipped:
        print("not registered in this build, skipped: " + ", ".join(skipped))
    print(json.dumps({"results": summary, "skipped": skipped, "reps": args.reps,
                      "steps": args.steps, "warmup": args.warmup}))


if __name__ == "__main__":
    main()
