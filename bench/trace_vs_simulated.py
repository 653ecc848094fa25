#!/usr/bin/env python3
"""trace_vs_simulated: one train_gpt run's traced steps against the simulator.

    train_gpt ... --schedule=S --set=trace_step=4,trace_steps=8 --v=1 --name=R
    bench/trace_vs_simulated.py --explorer bazel-bin/experiments/schedule_explorer \\
        --run runs/R-<time> --schedule S [--first 4 --count 8]

S is a registered name or csv:FILE (V placement assumed for csv at 2 chunks,
as train_gpt's --chunks=2). Prints, for every traced step, its span and the
simulated step with that step's own costs (trace_costs.trace_costs: per
virtual stage mean F/I/W, per rank SEND, RECV and tail costs, the vocabulary
passes' and collectives' costs; STEP a collective when the run clips) twice: of the
program as Lower() places receives, and as the CPU runtime executes it
(DeferReceives), and as executed with each micro-batch's own share of the
step's compute (--microbatch_multiplier: variable-length micro-batches,
whose work differs); and the replay with every action's own duration
(trace_costs.replay_step: the model's structure, asynchronous collectives
started and waited for where read, as simulated). Then per rank the
step's time by action kind (compute, RECV waits, SENDs, tail, gaps between
actions) and, with --v=1 logs, per (virtual stage, type) the median wall and
thread CPU of the actions over the traced steps: where two schedules of the
same costs differ, this says whether the actions themselves took longer
(CPU) or the ranks waited. Thread CPU holds on a loaded machine; wall does not.
--json prints one JSON object instead.
"""

import argparse
import collections
import glob
import json
import os
import re
import statistics
import subprocess

import trace_costs

LOG_LINE = re.compile(r"train step (\d+) end (\d+)(F|B|I|W)\d+ mb \d+ (\d+) us "
                      r"\(thread cpu (\d+) us")


def microbatch_multipliers(events, m):
    """Each micro-batch's compute (F, B, I, W summed over stages) over the
    micro-batches' mean: the step's own per-micro-batch multipliers, for
    variable-length micro-batches."""
    work = [0.0] * m
    for e in events:
        if e.get("cat") in ("F", "B", "I", "W"):
            work[e["args"]["microbatch"]] += e["dur"]
    mean = sum(work) / m
    return [w / mean for w in work] if mean > 0 else [1.0] * m


def simulate(explorer, schedule, ranks, m, chunks, costs, defer, multipliers=None,
             step_all_reduce=False, vocab_async=False):
    base = [explorer, f"--schedule={schedule}", f"--stages={ranks}", f"--microbatches={m}",
            f"--chunks={chunks}", "--format=json"]
    if schedule.startswith("csv:") and chunks == 2:
        base.append("--stage_to_rank=v")
    shape = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    placement = shape["stage_to_rank"]
    extra, _ = trace_costs.explorer_args(costs, placement, step_all_reduce)
    if shape.get("vocab_barriers") == 1:
        # The traced OUT_S and OUT_T are the one-barrier algorithm's own.
        extra = [a + ",VOCAB_BARRIERS:1" if a.startswith("--costs=") else a for a in extra]
    if vocab_async:
        # The run's vocabulary collectives were asynchronous
        # (--vocab_async_collectives): simulated as started and waited where read
        # (a trace that shows them in flight says so itself).
        extra = [a + ",VOCAB_ASYNC:1" if a.startswith("--costs=") and "VOCAB_ASYNC" not in a
                 else a for a in extra]
    if not defer:
        extra = [a for a in extra if a != "--defer_receives"]
    if multipliers:
        extra.append("--microbatch_multiplier=" + ",".join(f"{x:.6f}" for x in multipliers))
    out = subprocess.run(base + extra, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["simulation"]["makespan"], placement


def action_cpu(run_dir, first, count):
    """(stage, type) -> [(wall ms, cpu ms)] from the --v=1 logs' traced steps."""
    out = collections.defaultdict(list)
    for path in glob.glob(os.path.join(run_dir, "logs", "rank_*.log")):
        with open(path, errors="replace") as f:
            for line in f:
                m = LOG_LINE.search(line)
                if m and first <= int(m.group(1)) < first + count:
                    out[(int(m.group(2)), m.group(3))].append(
                        (int(m.group(4)) / 1e3, int(m.group(5)) / 1e3))
    return out


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--explorer", required=True)
    ap.add_argument("--run", required=True, help="train_gpt run directory")
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--first", type=int, default=4, help="first traced step (0-based)")
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--untied", action="store_true",
                    help="the model ties no layers across stages (LLaMA with tie_embeddings "
                         "false): REDUCE_TIED synchronises nobody; default: GPT's tied "
                         "embedding and head")
    ap.add_argument("--vocab_async", action="store_true",
                    help="the run had --vocab_async_collectives=true: its vocabulary "
                         "collectives are simulated and replayed as asynchronous "
                         "(VOCAB_ASYNC:1); a "
                         "trace that shows them in flight needs no flag")
    args = ap.parse_args()
    return args


def simulate_traced(args):
    """Per traced step its span, simulations and replay; per rank and kind of
    action the step's time (ms), a list over the steps."""
    metrics = [json.loads(l) for l in open(os.path.join(args.run, "metrics.jsonl"))]
    # A run that clips computes the global gradient norm: its STEP is a
    # collective of every rank (as bench_schedules.run_train detects it).
    step_all_reduce = any("grad_norm" in m for m in metrics)
    traced = trace_costs.load_traced_steps(args.run, metrics, args.first, args.count,
                                               args.chunks, args.ranks)
    steps = []
    by_kind = collections.defaultdict(lambda: collections.defaultdict(list))
    for step_s, costs in traced:
        if args.untied:
            costs["tie_groups"] = "none"
        ev = costs["events"]
        span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) * 1e-6
        lowered, placement = simulate(args.explorer, args.schedule, args.ranks,
                                      args.microbatches, args.chunks, costs, False,
                                      step_all_reduce=step_all_reduce,
                                      vocab_async=args.vocab_async)
        deferred, _ = simulate(args.explorer, args.schedule, args.ranks, args.microbatches,
                               args.chunks, costs, True, step_all_reduce=step_all_reduce,
                               vocab_async=args.vocab_async)
        multipliers = microbatch_multipliers(ev, args.microbatches)
        varlen, _ = simulate(args.explorer, args.schedule, args.ranks, args.microbatches,
                             args.chunks, costs, True, multipliers, step_all_reduce,
                             vocab_async=args.vocab_async)
        tied = ([] if costs["tie_groups"] == "none" else
                sorted({placement[s] for s in costs["tie_groups"].split(",")}))
        # Asynchronous collectives replay as such when the trace shows them
        # in flight, or when --vocab_async says the run had them.
        replay = trace_costs.replay_step(ev, tied, step_all_reduce, args.vocab_async or None)
        steps.append({"span_s": span, "sim_lowered_s": lowered, "sim_deferred_s": deferred,
                      "sim_microbatches_s": varlen, "microbatch_multipliers": multipliers,
                      "replay_s": replay})
        for r in sorted({e["tid"] for e in ev}):
            mine = sorted((e for e in ev if e["tid"] == r), key=lambda e: e["ts"])
            kinds = collections.Counter()
            for e in mine:
                c = e["cat"]
                kind = ("compute" if c in ("F", "B", "I", "W") + trace_costs.VOCAB_PASSES else
                        "recv" if c.startswith("RECV") else
                        "send" if c.startswith("SEND") else
                        "vocab_comm" if c in trace_costs.VOCAB_COLLECTIVES else "tail")
                kinds[kind] += e["dur"] / 1e3
            kinds["gaps"] = (mine[-1]["ts"] + mine[-1]["dur"] - mine[0]["ts"]) / 1e3 - sum(
                e["dur"] for e in mine) / 1e3
            for k, v in kinds.items():
                by_kind[r][k].append(v)
    return steps, by_kind


def print_report(args, result, cpu):
    print(f"{args.schedule} ({args.run}): median traced span {result['median_span_ms']:.0f} ms")
    print("  step span    simulated as lowered    as executed (deferred)    per micro-batch    replay")
    for s in result["steps"]:
        print(f"  {1e3 * s['span_s']:8.0f}    {1e3 * s['sim_lowered_s']:8.0f} "
              f"({100 * (s['sim_lowered_s'] / s['span_s'] - 1):+5.1f}%)"
              f"    {1e3 * s['sim_deferred_s']:8.0f} "
              f"({100 * (s['sim_deferred_s'] / s['span_s'] - 1):+5.1f}%)"
              f"    {1e3 * s['sim_microbatches_s']:8.0f} "
              f"({100 * (s['sim_microbatches_s'] / s['span_s'] - 1):+5.1f}%)"
              f"    {1e3 * s['replay_s']:8.0f} ({100 * (s['replay_s'] / s['span_s'] - 1):+5.1f}%)")
    print(f"  median error: as lowered {100 * result['sim_lowered_err']:+.1f}%, as executed "
          f"{100 * result['sim_deferred_err']:+.1f}%, per micro-batch "
          f"{100 * result['sim_microbatches_err']:+.1f}%, replay {100 * result['replay_err']:+.1f}%")
    for r, kinds in sorted(result["per_rank_ms"].items()):
        print(f"  rank {r} per step (median ms): " +
              ", ".join(f"{k} {v:.0f}" for k, v in sorted(kinds.items())))
    if cpu:
        print("  per action (median ms, wall / thread CPU): " +
              ", ".join(f"{a} {x['wall']:.1f}/{x['cpu']:.1f}"
                        for a, x in result["actions_ms"].items()))


def main():
    args = parse_args()
    steps, by_kind = simulate_traced(args)

    def err(key):
        return statistics.median(s[key] / s["span_s"] - 1 for s in steps)

    cpu = action_cpu(args.run, args.first, args.count)
    result = {
        "schedule": args.schedule, "run": args.run,
        "median_span_ms": 1e3 * statistics.median(s["span_s"] for s in steps),
        "sim_lowered_err": err("sim_lowered_s"), "sim_deferred_err": err("sim_deferred_s"),
        "sim_microbatches_err": err("sim_microbatches_s"),
        "replay_err": err("replay_s"),
        "per_rank_ms": {r: {k: statistics.median(v) for k, v in kinds.items()}
                        for r, kinds in by_kind.items()},
        "actions_ms": {f"{s}{t}": {"wall": statistics.median(w for w, _ in xs),
                                   "cpu": statistics.median(c for _, c in xs), "n": len(xs)}
                       for (s, t), xs in sorted(cpu.items())},
        "steps": steps,
    }
    if args.json:
        print(json.dumps(result))
        return
    print_report(args, result, cpu)


if __name__ == "__main__":
    main()
