#!/usr/bin/env python3
"""action_costs: what each compute action of a train_gpt/train_bert run cost.

    ./bazelw run //experiments:train_gpt -- --schedule=zbv --chunks=2 --v=1 --steps=20
    python3 experiments/action_costs.py runs/gpt_small_pp2-<time> [--skip 4] [--json]

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


def parse(run_dir, skip):
    actions = collections.defaultdict(lambda: collections.defaultdict(list))
    steps = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0, 0, 0]))
    logs = sorted(glob.glob(os.path.join(run_dir, "logs", "rank_*.log")))
    if not logs:
        raise SystemExit(f"action_costs: no logs/rank_*.log under {run_dir}")
    for path in logs:
        rank = int(re.search(r"rank_(\d+)\.log$", path).group(1))
        with open(path, errors="replace") as f:
            for line in f:
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
    return actions, steps


def summarize(actions, steps):
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
                      "preemptions": statistics.median(t[3] for t in totals)})
    return {"actions": rows, "ranks": ranks}


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


if __name__ == "__main__":
    sys.exit(main())
