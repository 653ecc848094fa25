#!/usr/bin/env python3
"""bench_schedules: the README's main GPT trained under several schedules.

    ./bazelw run //experiments:bench_schedules -- --reps 3 --steps 12 --warmup 4

For each micro-batch count (--microbatches, default 4 and 8) and repetition,
runs train_gpt (the config of the README's main command, pp = 2) once per
schedule, the schedules alternating so that machine load hits all of them,
and reports per schedule:
  - tokens/s: median over the steps after --warmup, then median over the
    repetitions; its ratio to 1f1b;
  - the simulator's prediction: each run's measured compute costs (mean F, B,
    I, W durations of its traced step over both ranks; a chunk action of a
    2-chunk schedule counts as half a rank's share) given to
    schedule_explorer --costs; predicted step = makespan, predicted tokens/s
    = tokens per step / makespan, and the measured step time against it.
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

TWO_CHUNKS = {"zbv", "dualpipev", "interleaved_1f1b", "interleaved_zb"}


def run_train(args, schedule, m, out_dir, name):
    chunks = 2 if schedule in TWO_CHUNKS else 1
    cmd = [args.train_gpt, f"--config={args.config}", f"--schedule={schedule}", "--pp=2",
           f"--chunks={chunks}", f"--microbatches={m}", f"--steps={args.steps}",
           "--eval_interval=0", "--sample_tokens=0", f"--output_dir={out_dir}", f"--name={name}",
           f"--set=lr_schedule.warmup_steps={min(20, args.steps - 1)}"] + args.train_flag
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"train_gpt failed for {schedule} m={m}: {' '.join(cmd)}")
    run = sorted(glob.glob(os.path.join(out_dir, name + "-*")))[-1]
    steps = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    timed = [s for s in steps if s["step"] > args.warmup] or steps
    tokens_per_step = statistics.median(s["tokens_per_s"] * s["step_s"] for s in timed)
    trace = json.load(open(os.path.join(run, "trace.json")))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    durations = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("F", "B", "I", "W"):
            durations.setdefault(e["cat"], []).append(e["dur"] * 1e-6 * chunks)
    costs = {k: statistics.mean(v) for k, v in durations.items()}
    return {
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in timed),
        "step_s": statistics.median(s["step_s"] for s in timed),
        "tokens_per_step": tokens_per_step,
        "costs": costs,
        "chunks": chunks,
    }


def predict(args, schedule, m, run):
    c = run["costs"]
    parts = [f"F:{c['F']:.6f}"]
    if "I" in c:
        parts += [f"I:{c['I']:.6f}", f"W:{c['W']:.6f}"]
        if "B" in c:
            parts.append(f"B:{c['B']:.6f}")
    else:
        parts += [f"B:{c['B']:.6f}"]
    cmd = [args.explorer, f"--schedule={schedule}", "--stages=2", f"--microbatches={m}",
           f"--chunks={run['chunks']}", "--costs=" + ",".join(parts), "--format=json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["simulation"]["makespan"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train_gpt", required=True)
    ap.add_argument("--explorer", required=True)
    ap.add_argument("--config", default="experiments/configs/gpt_small_pp2.textproto")
    ap.add_argument("--schedules", default="1f1b,zb_h1,zbv,dualpipev")
    ap.add_argument("--microbatches", default="4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4, help="steps left out of the medians")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--train_flag", action="append", default=[],
                    help="extra train_gpt flag (repeatable)")
    args = ap.parse_args()

    listed = subprocess.run([args.explorer, "--list"], capture_output=True, text=True,
                            check=True).stdout.split()
    schedules = [s for s in args.schedules.split(",") if s in listed]
    skipped = [s for s in args.schedules.split(",") if s not in listed]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_schedules_") as tmp:
        for m in (int(x) for x in args.microbatches.split(",")):
            for rep in range(args.reps):
                for s in schedules:
                    r = run_train(args, s, m, tmp, f"{s}_m{m}_r{rep}")
                    r["predicted_step_s"] = predict(args, s, m, r)
                    results.setdefault((s, m), []).append(r)
                    print(f"m={m} rep {rep} {s:10s} {r['tokens_per_s']:8.0f} tok/s  step "
                          f"{r['step_s']:.3f} s  simulated {r['predicted_step_s']:.3f} s  costs "
                          + " ".join(f"{k}:{v * 1e3:.1f}ms" for k, v in sorted(r['costs'].items())),
                          file=sys.stderr, flush=True)

    summary = []
    print(f"{'m':>3} {'schedule':10} {'tokens/s':>9} {'vs 1f1b':>8} {'simulated tok/s':>16} "
          f"{'sim vs 1f1b':>12} {'step s':>8} {'sim step s':>11} {'sim err':>8}  runs (tok/s)")
    for (s, m), runs in results.items():
        tps = statistics.median(r["tokens_per_s"] for r in runs)
        step = statistics.median(r["step_s"] for r in runs)
        sim_step = statistics.median(r["predicted_step_s"] for r in runs)
        sim_tps = statistics.median(r["tokens_per_step"] / r["predicted_step_s"] for r in runs)
        summary.append({"schedule": s, "microbatches": m, "tokens_per_s": tps, "step_s": step,
                        "simulated_step_s": sim_step, "simulated_tokens_per_s": sim_tps,
                        "runs_tokens_per_s": [r["tokens_per_s"] for r in runs]})
    by_key = {(x["schedule"], x["microbatches"]): x for x in summary}
    for x in summary:
        base = by_key.get(("1f1b", x["microbatches"]))
        x["ratio_to_1f1b"] = x["tokens_per_s"] / base["tokens_per_s"] if base else None
        x["simulated_ratio_to_1f1b"] = (x["simulated_tokens_per_s"] /
                                        base["simulated_tokens_per_s"] if base else None)
        err = x["simulated_step_s"] / x["step_s"] - 1
        ratio = f"{x['ratio_to_1f1b']:.3f}x" if base else "-"
        sim_ratio = f"{x['simulated_ratio_to_1f1b']:.3f}x" if base else "-"
        print(f"{x['microbatches']:>3} {x['schedule']:10} {x['tokens_per_s']:9.0f} {ratio:>8} "
              f"{x['simulated_tokens_per_s']:16.0f} {sim_ratio:>12} {x['step_s']:8.3f} "
              f"{x['simulated_step_s']:11.3f} {100 * err:7.1f}%  "
              + ", ".join(f"{v:.0f}" for v in x["runs_tokens_per_s"]))
    if skipped:
        print("not registered in this build, skipped: " + ", ".join(skipped))
    print(json.dumps({"results": summary, "skipped": skipped, "reps": args.reps,
                      "steps": args.steps, "warmup": args.warmup}))


if __name__ == "__main__":
    main()
