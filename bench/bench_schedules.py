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
    traced = load_traced_steps(run, steps, first, count, chunks, args.pp)
    return {
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in timed),
        "step_s": statistics.median(s["step_s"] for s in timed),
        "tokens_per_step": tokens_per_step,
        "chunks": chunks,
        "step_all_reduce": any("grad_norm" in s for s in steps),
        "traced": traced,
    }


def load_traced_steps(run_dir, metrics, first, count, chunks, ranks):
    """(measured step_s, trace_costs) for the steps first .. first + count - 1
    (0-based) that train_gpt traced with trace_step=first,trace_steps=count."""
    traced = []
    for k in range(first, first + count):
        path = (os.path.join(run_dir, "traces", f"step_{k}.json") if count > 1
                else os.path.join(run_dir, "trace.json"))
        trace = json.load(open(path))
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        step_s = next(s["step_s"] for s in metrics if s["step"] == k + 1)
        traced.append((step_s, trace_costs([e for e in events if e.get("ph") == "X" and
                                            e.get("pid", 0) == 0], chunks,
                                           ranks)))
    return traced


# Vocabulary parallelism's passes (one cost each, every rank alike) and its
# collectives over all pipe ranks (one cost, VOCAB_COMM), by trace category.
VOCAB_PASSES = ("OUT_S", "OUT_T", "IN_F", "IN_B")
VOCAB_COLLECTIVES = ("OUT_BCAST", "OUT_STATS", "OUT_REDUCE", "IN_REDUCE", "IN_BCAST")


def vocab_costs(events):
    """The vocabulary passes' mean durations and VOCAB_COMM, the mean over
    the collectives of each rank's end minus the latest start among the
    ranks (its own cost, the waiting left to the simulator), in seconds;
    empty without vocabulary passes."""
    passes, collectives = {}, {}
    for e in events:
        if e.get("cat") in VOCAB_PASSES:
            passes.setdefault(e["cat"], []).append(e["dur"] * 1e-6)
        elif e.get("cat") in VOCAB_COLLECTIVES:
            collectives.setdefault((e["cat"], e["args"]["microbatch"]), []).append(e)
    out = {k: statistics.mean(v) for k, v in passes.items()}
    own = []
    for evs in collectives.values():
        latest = max(e["ts"] for e in evs)
        own += [max(0.0, e["ts"] + e["dur"] - latest) * 1e-6 for e in evs]
    if own:
        out["VOCAB_COMM"] = statistics.mean(own)
    return out


def trace_costs(events, chunks, ranks):
    """Simulator inputs from one traced step's "X" events (tid = rank, cat =
    action type, args.stage = virtual stage), in seconds."""
    num_stages = ranks * chunks
    compute = {}  # (stage, type) -> durations
    tail = {}  # (rank, type) -> (start, end); REDUCE_GRAD: per stage
    reduce_grad = {}
    sends, recvs = {}, {}
    send_end = {}  # (SEND_F/SEND_B, stage, mb) -> end
    for e in events:
        cat, rank = e.get("cat"), e["tid"]
        start, dur = e["ts"] * 1e-6, e["dur"] * 1e-6
        if cat in ("F", "B", "I", "W"):
            compute.setdefault((e["args"]["stage"], cat), []).append(dur)
        elif cat in ("SEND_F", "SEND_B"):
            sends.setdefault(rank, []).append(dur)
            send_end[(cat, e["args"]["stage"], e["args"]["microbatch"])] = e["ts"] + e["dur"]
        elif cat in ("RECV_F", "RECV_B"):
            recvs.setdefault(rank, []).append(e)
        elif cat == "REDUCE_GRAD":
            reduce_grad.setdefault(int(e["name"].split("REDUCE_GRAD")[0]), []).append(dur)
        elif cat in ("STEP", "REDUCE_TIED"):
            tail[(rank, cat)] = (start, start + dur)
    # Per RECV its own cost: the time from its start, or from its message's
    # SEND end if that came later (the wait), to its end: the transfer and
    # the unpacking. The model's RECV cost is their mean per rank, with no
    # separate message latency.
    recv_costs = {}
    for rank, evs in recvs.items():
        own = []
        for e in evs:
            start, end = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
            own.append(max(0.0, end - max(start, send_end.get(message_of(e), start) * 1e-6)))
        recv_costs[rank] = statistics.mean(own)
    stage_costs = {s: {t: statistics.mean(d) for (st, t), d in compute.items() if st == s}
                   for s in range(num_stages)}
    for s, d in reduce_grad.items():
        stage_costs.setdefault(s, {})["REDUCE_GRAD"] = statistics.mean(d)
    # The GPT ties its embedding (stage 0) and head (last stage): REDUCE_TIED
    # is a collective of their ranks (one rank under V placement).
    return {"stage_costs": stage_costs, "tail": tail, "sends": sends, "recvs": recv_costs,
            "tie_groups": f"0,{num_stages - 1}", "ranks": ranks, "events": events,
            "vocab": vocab_costs(events)}


def message_of(recv):
    """The (SEND type, stage, micro-batch) key of the SEND that a RECV event
    receives."""
    st, mb = recv["args"]["stage"], recv["args"]["microbatch"]
    return ("SEND_F", st - 1, mb) if recv["cat"] == "RECV_F" else ("SEND_B", st + 1, mb)


def replay_step(events, tied_ranks, step_all_reduce):
    """The simulator's model run with every action's own measured duration
    instead of per-stage means (in seconds): each rank runs its traced actions
    in order; a compute or SEND takes its duration; a RECV completes at
    max(its rank's clock, its SEND's replayed end) + its own cost (as in
    trace_costs); REDUCE_TIED (over tied_ranks), STEP (over all ranks with
    step_all_reduce) and each vocabulary collective (over all ranks, per kind
    and micro-batch) start at the latest arrival and take each rank's end
    minus the latest traced start. A replay that matches the measured step
    says the model's structure is right, so that what the mean-cost
    prediction misses is the variation of the durations."""
    ranks = sorted({e["tid"] for e in events})
    prog = {r: sorted((e for e in events if e["tid"] == r), key=lambda e: e["ts"]) for r in ranks}
    send_end = {(e["cat"], e["args"]["stage"], e["args"]["microbatch"]): e["ts"] + e["dur"]
                for e in events if e["cat"] in ("SEND_F", "SEND_B")}
    groups = {"REDUCE_TIED": tied_ranks if len(tied_ranks) > 1 else [],
              "STEP": ranks if step_all_reduce else []}
    groups.update({c: ranks for c in VOCAB_COLLECTIVES})

    def collective_key(e):  # a collective: its kind and, for the vocabulary's, its micro-batch
        return (e["cat"], e["args"]["microbatch"]) if e["cat"] in VOCAB_COLLECTIVES else e["cat"]

    own = {}  # (rank, collective key) -> cost after the gathering
    latest = {}
    for e in events:
        if e["cat"] in groups and e["tid"] in groups[e["cat"]]:
            latest[collective_key(e)] = max(latest.get(collective_key(e), e["ts"]), e["ts"])
    for e in events:
        if e["cat"] in groups:
            own[(e["tid"], collective_key(e))] = (max(0, e["ts"] + e["dur"] - latest[collective_key(e)])
                                       if e["tid"] in groups[e["cat"]] else e["dur"])
    t0 = min(e["ts"] for e in events)
    clock = {r: prog[r][0]["ts"] - t0 for r in ranks}
    pos = {r: 0 for r in ranks}
    sent = {}
    progress = True
    while progress:
        progress = False
        for r in ranks:
            while pos[r] < len(prog[r]):
                e = prog[r][pos[r]]
                cat = e["cat"]
                if cat in ("SEND_F", "SEND_B"):
                    clock[r] += e["dur"]
                    sent[(cat, e["args"]["stage"], e["args"]["microbatch"])] = clock[r]
                elif cat in ("RECV_F", "RECV_B"):
                    key = message_of(e)
                    if key not in sent:
                        break
                    cost = e["ts"] + e["dur"] - max(e["ts"], send_end.get(key, e["ts"]))
                    clock[r] = max(clock[r], sent[key]) + max(0, cost)
                elif cat in groups and r in groups[cat]:
                    group = groups[cat]
                    if not all(pos[q] < len(prog[q]) and collective_key(prog[q][pos[q]]) == collective_key(e)
                               for q in group):
                        break
                    t = max(clock[q] for q in group)
                    for q in group:
                        clock[q] = t + own[(q, collective_key(e))]
                        pos[q] += 1
                    progress = True
                    continue
                elif cat in groups:
                    clock[r] += own[(r, collective_key(e))]
                else:
                    clock[r] += e["dur"]
                pos[r] += 1
                progress = True
    if any(pos[r] < len(prog[r]) for r in ranks):
        raise ValueError(f"replay stuck at {pos} (a RECV without its SEND?)")
    return max(clock.values()) * 1e-6


def collective_costs(tail, kind, participants):
    """Per rank: its end minus the latest start among `participants`."""
    latest = max(tail[(r, kind)][0] for r in participants if (r, kind) in tail)
    return {r: max(0.0, tail[(r, kind)][1] - latest) for r in participants if (r, kind) in tail}


def explorer_args(t, stage_to_rank, step_all_reduce):
    stage_part = ";".join(
        f"{s}:" + ",".join(f"{k}:{v:.6f}" for k, v in sorted(c.items()))
        for s, c in sorted(t["stage_costs"].items()) if c)
    ranks = range(t["ranks"])
    # "none": an untied model (LLaMA's default), whose REDUCE_TIED syncs nobody.
    tied_stages = [] if t["tie_groups"] == "none" else [int(x) for x in t["tie_groups"].split(",")]
    tied_ranks = sorted({stage_to_rank[str(s)] for s in tied_stages})
    rank_costs = {r: {} for r in ranks}
    if len(tied_ranks) > 1:
        for r, c in collective_costs(t["tail"], "REDUCE_TIED", tied_ranks).items():
            rank_costs[r]["REDUCE_TIED"] = c
    else:
        for r in tied_ranks:
            start, end = t["tail"].get((r, "REDUCE_TIED"), (0, 0))
            rank_costs[r]["REDUCE_TIED"] = end - start
    if step_all_reduce:
        for r, c in collective_costs(t["tail"], "STEP", list(ranks)).items():
            rank_costs[r]["STEP"] = c
    else:
        for r in ranks:
            start, end = t["tail"].get((r, "STEP"), (0, 0))
            rank_costs[r]["STEP"] = end - start
    for r in ranks:
        if t["sends"].get(r):
            rank_costs[r]["SEND"] = statistics.mean(t["sends"][r])
        if r in t["recvs"]:
            rank_costs[r]["RECV"] = t["recvs"][r]
    rank_part = ";".join(f"{r}:" + ",".join(f"{k}:{v:.6f}" for k, v in sorted(c.items()))
                         for r, c in sorted(rank_costs.items()) if c)
    out = [f"--stage_costs={stage_part}", f"--rank_costs={rank_part}",
           f"--tie_groups={t['tie_groups']}", "--defer_receives"]
    if t.get("vocab"):
        # Every other key of --costs keeps its default; the stage costs replace F, B, I, W.
        out.append("--costs=" + ",".join(f"{k}:{v:.6f}" for k, v in sorted(t["vocab"].items())))
    if step_all_reduce:
        out.append("--step_all_reduce")
    return out, rank_costs


def simulate_steps(explorer, schedule, stages, m, chunks, traced, step_all_reduce):
    """Simulates every traced step with its own costs. Returns the predicted
    step times, the errors simulated / measured - 1 per step, the errors of
    the replays (replay_step) per step, and the last step's costs (stage
    costs, rank costs) for the log."""
    base = [explorer, f"--schedule={schedule}", f"--stages={stages}", f"--microbatches={m}",
            f"--chunks={chunks}", "--format=json"]
    placement = json.loads(subprocess.run(base, capture_output=True, text=True,
                                          check=True).stdout)["stage_to_rank"]
    predicted, errors, replay_errors = [], [], []
    for step_s, costs in traced:
        extra, rank_costs = explorer_args(costs, placement, step_all_reduce)
        out = subprocess.run(base + extra, capture_output=True, text=True, check=True).stdout
        predicted.append(json.loads(out)["simulation"]["makespan"])
        errors.append(predicted[-1] / step_s - 1)
        tied = sorted({placement[x] for x in costs["tie_groups"].split(",")})
        replay_errors.append(replay_step(costs["events"], tied, step_all_reduce) / step_s - 1)
    return predicted, errors, replay_errors, (costs["stage_costs"], rank_costs)


def predict(args, schedule, m, run):
    """The run's prediction: the median of its traced steps' makespans."""
    (predicted, run["traced_errors"], run["replay_errors"],
     (run["stage_costs"], run["rank_costs"])) = simulate_steps(
        args.explorer, schedule, args.pp, m, run["chunks"], run["traced"], run["step_all_reduce"])
    return statistics.median(predicted)


def main():
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

    summary = []
    print(f"{'m':>3} {'schedule':10} {'tokens/s':>9} {'vs 1f1b':>8} {'simulated tok/s':>16} "
          f"{'sim vs 1f1b':>12} {'step s':>8} {'sim step s':>11} {'sim err':>8} {'vs traced':>9} "
          f"{'replay':>7}  runs (tok/s)")
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
        err = x["simulated_step_s"] / x["step_s"] - 1
        x["simulated_error"] = err
        traced_err = (f"{100 * statistics.median(x['traced_errors']):.1f}%"
                      if x["traced_errors"] else "-")
        ratio = f"{x['ratio_to_1f1b']:.3f}x" if base else "-"
        sim_ratio = f"{x['simulated_ratio_to_1f1b']:.3f}x" if base else "-"
        print(f"{x['microbatches']:>3} {x['schedule']:10} {x['tokens_per_s']:9.0f} {ratio:>8} "
              f"{x['simulated_tokens_per_s']:16.0f} {sim_ratio:>12} {x['step_s']:8.3f} "
              f"{x['simulated_step_s']:11.3f} {100 * err:7.1f}% {traced_err:>9} "
              f"{100 * statistics.median(x['replay_errors']):6.1f}%  "
              + ", ".join(f"{v:.0f}" for v in x["runs_tokens_per_s"]))
    if skipped:
        print("not registered in this build, skipped: " + ", ".join(skipped))
    print(json.dumps({"results": summary, "skipped": skipped, "reps": args.reps,
                      "steps": args.steps, "warmup": args.warmup}))


if __name__ == "__main__":
    main()
