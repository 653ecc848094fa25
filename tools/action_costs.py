#!/usr/bin/env python3
"""action_costs: what each compute action of a train_gpt/train_bert run cost.

    ./bazelw run //experiments:train_gpt -- --schedule=zbv --chunks=2 --v=1 --steps=20
    python3 tools/action_costs.py runs/gpt_small_pp2-<time> [--skip 4] [--json]

Reads logs/rank_<N>.log, where --v=1 makes the executor log every action's
end with its wall time and, for F/B/I/W, this thread's CPU time, page faults
and preemptions (pipeline/runtime/stage_executor.cc). With one intra-op and
one BLAS thread every kernel runs on the executor's thread, so

  - thread CPU is the action's own work, even on a loaded machine;
  - wall - CPU is time the thread was off the CPU inside the action
    (preempted by another thread or process: the other rank, Gloo's
    transport threads, anything else on the machine).

Prints, per (rank, virtual stage, action type), the median wall and CPU
milliseconds over the training steps after --skip, and per rank the medians
over steps of the step's summed compute wall and CPU; --json prints one JSON
object instead.

Each rank's log also says how far its thread CPU clock moves at a time
(about 1 us on a plain kernel; a sandbox may move it in scheduler ticks). Where
that step is coarser than COARSE_CLOCK_US, per-action CPU reads 0 or whole
ticks and means little: the summary says so.
"""

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys

LINE = re.compile(
    r"train step (\d+) end (\d+)(F|B|I|W)\d+ mb \d+ (\d+) us "
    r"\(thread cpu (\d+) us, (\d+) page faults, (\d+) preemptions\)")
CLOCK_STEP = re.compile(r"thread cpu clock step (-?\d+) us")
COARSE_CLOCK_US = 100


def parse(run_dir, skip):
    actions = collections.defaultdict(lambda: collections.defaultdict(list))
    steps = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0, 0]))
    clock_steps = {}
    logs = sorted(glob.glob(os.path.join(run_dir, "logs", "rank_*.log")))
    if not logs:
        raise SystemExit(f"action_costs: no logs/rank_*.log under {run_dir}")
    for path in logs:
        rank = int(re.search(r"rank_(\d+)\.log$", path).group(1))
        with open(path, errors="replace") as f:
            for line in f:
                c = CLOCK_STEP.search(line)
                if c:
                    clock_steps[rank] = int(c.group(1))
                    continue
                m = LINE.search(line)
                if not m:
                    continue
                step, stage, kind, wall, cpu, faults, preempted = m.groups()
                if int(step) < skip:
                    continue
                key = (rank, int(stage), kind)
                for name, value in (("wall", wall), ("cpu", cpu), ("faults", faults),
                                    ("preemptions", preempted)):
                    actions[key][name].append(int(value))
                total = steps[rank][int(step)]
                total[0] += int(wall)
                total[1] += int(cpu)
                total[2] += int(faults)
                total[3] += int(preempted)
    if not actions:
        raise SystemExit(f"action_costs: no compute action with thread CPU in {run_dir}'s logs "
                         f"after step {skip} (run with --v=1)")
    return actions, steps, clock_steps


def summarize(actions, steps, clock_steps):
    rows = []
    for (rank, stage, kind), v in sorted(actions.items()):
        rows.append({"rank": rank, "stage": stage, "action": kind, "count": len(v["wall"]),
                     "wall_ms": statistics.median(v["wall"]) / 1e3,
                     "cpu_ms": statistics.median(v["cpu"]) / 1e3,
                     "page_faults": statistics.median(v["faults"]),
                     "preemptions": statistics.median(v["preemptions"])})
    ranks = []
    for rank, by_step in sorted(steps.items()):
        totals = list(by_step.values())
        ranks.append({"rank": rank, "steps": len(totals),
                      "compute_wall_ms": statistics.median(t[0] for t in totals) / 1e3,
                      "compute_cpu_ms": statistics.median(t[1] for t in totals) / 1e3,
                      "page_faults": statistics.median(t[2] for t in totals),
                      "preemptions": statistics.median(t[3] for t in totals),
                      # -1: the clock never moved while measured; None: not logged.
                      "cpu_clock_step_us": clock_steps.get(rank)})
    return {"actions": rows, "ranks": ranks}


def coarse_clock(rank_summary):
    step = rank_summary["cpu_clock_step_us"]
    return step is None or step < 0 or step > COARSE_CLOCK_US


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--skip", type=int, default=2, help="ignore training steps below this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    summary = summarize(*parse(args.run_dir, args.skip))
    if args.json:
        print(json.dumps(summary))
        return
    print("rank stage action  count   wall ms    cpu ms  off-cpu  faults  preempt")
    for r in summary["actions"]:
        print(f"{r['rank']:4d} {r['stage']:5d} {r['action']:>6} {r['count']:6d} "
              f"{r['wall_ms']:9.2f} {r['cpu_ms']:9.2f} {r['wall_ms'] - r['cpu_ms']:8.2f} "
              f"{r['page_faults']:7.0f} {r['preemptions']:8.0f}")
    print("per step (median over steps): compute of each rank")
    for r in summary["ranks"]:
        print(f"  rank {r['rank']}: wall {r['compute_wall_ms']:.1f} ms, thread cpu "
              f"{r['compute_cpu_ms']:.1f} ms, {r['page_faults']:.0f} page faults, "
              f"{r['preemptions']:.0f} preemptions ({r['steps']} steps)")
    for r in summary["ranks"]:
        if coarse_clock(r):
            step = r["cpu_clock_step_us"]
            how = ("was not logged" if step is None else
                   "never moved while measured" if step < 0 else f"moves in steps of {step} us")
            print(f"warning: rank {r['rank']}'s thread CPU clock {how}: per-action CPU is "
                  f"rounded to it (0 for most short actions); compare wall times instead")


if __name__ == "__main__":
    sys.exit(main())
