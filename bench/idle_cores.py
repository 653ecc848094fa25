"""What threads.borrow_idle_cores buys per action (issue #43): the peer GPT at
pp = 2 under a schedule, with and without --borrow_idle_cores, alternately.
Each run traces its timed steps; the record holds, per setting, the median
duration of the actions rank 0 lends threads to (from its plan) and of the
same kind of action elsewhere on rank 0 (what they cost without threads),
the per-rank compute and the tokens/s.

  bench/idle_cores.sh --reps 5 --schedule 1f1b   # builds train_gpt, records

Appends one record per setting to bench/results/idle_cores.jsonl and prints a
table, then one JSON line.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import bench_common as bc
import results


def run(args, borrow, out):
    name = f"{'on' if borrow else 'off'}"
    trace = f",trace_step={args.warmup + 1},trace_steps={args.steps}"
    cmd = [args.train_gpt, f"--set={bc.pipe_model_set(args)}{trace}", "--pp=2",
           f"--schedule={args.schedule}", f"--chunks={args.chunks}",
           f"--microbatches={args.microbatches}", f"--micro_batch_size={args.micro_batch_size}",
           f"--steps={args.warmup + args.steps}", f"--output_dir={out}", f"--name={name}",
           "--p2p_static_shapes=true", "--p2p_post_receives_ahead=true",
           f"--borrow_idle_cores={'true' if borrow else 'false'}"]
    proc, rundir, metrics, before, after = bc.run_train_gpt(cmd, out, name, args.timeout)
    events = json.load(open(os.path.join(rundir, "trace.json")))
    events = events["traceEvents"] if isinstance(events, dict) else events
    durations = {}
    for e in events:
        if e.get("ph") == "X" and e.get("tid") == 0:
            durations.setdefault(e["name"], []).append(e["dur"] / 1000)
    plan = []
    for log in glob.glob(os.path.join(rundir, "logs", "*")):
        for line in open(log, errors="replace"):
            m = re.search(r"rank 0: idle cores lend BLAS threads to \d+ action\(s\) per step \((.*)\)",
                          line)
            if m:
                plan = [a.split(":")[0] for a in m.group(1).split()]
    timed = [m for m in metrics if m["step"] > args.warmup]
    return {"tokens_per_s": statistics.median(m["tokens_per_s"] for m in timed),
            "durations": durations, "plan": plan, "load": [before[0], after[0]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_gpt", required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "results",
                                                          "idle_cores.jsonl"))
    bc.add_model_arguments(parser)
    args = parser.parse_args()
    bc.require_positive(parser, args, "reps", "steps")
    runs = {False: [], True: []}
    with tempfile.TemporaryDirectory() as out:
        for rep in range(args.reps):
            for borrow in (False, True):
                r = run(args, borrow, out)
                runs[borrow].append(r)
                print(f"rep {rep + 1}/{args.reps} borrow={borrow}: {r['tokens_per_s']:.1f} tokens/s",
                      file=sys.stderr)
    plan = runs[True][0]["plan"]
    figures = {}
    for borrow, rs in runs.items():
        key = "on" if borrow else "off"
        per_action = {}
        for action in plan:
            lent = [d for r in rs for d in r["durations"].get(action, [])]
            kind = re.sub(r"\d+$", "", action)  # 0F0 -> 0F: the same stage's F
            others = [d for r in rs for name, ds in r["durations"].items()
                      if re.sub(r"\d+$", "", name) == kind and name not in plan for d in ds]
            per_action[action] = {"ms": round(statistics.median(lent), 2),
                                  "same_kind_elsewhere_ms": round(statistics.median(others), 2)}
        figures[key] = {"tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rs), 1),
                        "runs_tokens_per_s": [round(r["tokens_per_s"]) for r in rs],
                        "lent_actions_ms": per_action,
                        "load_1min": [r["load"] for r in rs]}
    figures["speedup"] = round(figures["on"]["tokens_per_s"] / figures["off"]["tokens_per_s"], 4)
    figures["plan"] = plan
    command = os.environ.get("PIPE_BENCH_COMMAND", " ".join(sys.argv))
    for key in ("off", "on"):
        record = results.make_record(
            "idle_cores", command,
            {"borrow_idle_cores": key == "on", "schedule": args.schedule, "reps": args.reps,
             "plan": plan, **figures[key], "speedup_on_over_off": figures["speedup"]},
            config=f"{args.schedule}_{key}")
        bc.append_record(args.results, record)
    print(f"{'action':>8} {'off ms':>8} {'on ms':>8} {'elsewhere ms':>13}", file=sys.stderr)
    for action in plan:
        off, on = figures["off"]["lent_actions_ms"][action], figures["on"]["lent_actions_ms"][action]
        print(f"{action:>8} {off['ms']:8.1f} {on['ms']:8.1f} {off['same_kind_elsewhere_ms']:13.1f}",
              file=sys.stderr)
    print(f"tokens/s off {figures['off']['tokens_per_s']}, on {figures['on']['tokens_per_s']} "
          f"({figures['speedup']:.3f}x)", file=sys.stderr)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
