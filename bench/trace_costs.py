"""Simulator inputs from train_gpt's traced steps: per virtual stage the mean
F, B, I, W durations, per rank the tail, SEND and RECV costs, the vocabulary
passes' and collectives' costs; schedule_explorer's flags from them; and the
replay of a traced step with every action's own duration (the method:
bench_schedules.py's docstring).

Used by bench_schedules.py, bench_vs_deepspeed.py (through bench_common.py),
trace_vs_simulated.py and bench_schedules_test.py. Debian's python3 only.
"""
import json
import os
import statistics
import subprocess

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
        traced.append((step_s, trace_costs(attach_completions(events), chunks, ranks)))
    return traced


def attach_completions(events):
    """The actions (pid 0's complete events) of a trace, each that started a
    collective without waiting for it (--vocab_async_collectives) with
    args["completed_us"]: the end of its span in flight (pid 1's event whose
    args name it as "started_by", on the same rank)."""
    actions = [e for e in events if e.get("ph") == "X" and e.get("pid", 0) == 0]
    done = {(e["tid"], e["args"]["started_by"]): e["ts"] + e["dur"] for e in events
            if e.get("ph") == "X" and e.get("pid", 0) == 1 and "started_by" in e.get("args", {})}
    for e in actions:
        if (e["tid"], e["name"]) in done:
            e.setdefault("args", {})["completed_us"] = done[(e["tid"], e["name"])]
    return actions


# Vocabulary parallelism's passes (one cost each, every rank alike) and its
# collectives over all pipe ranks (one cost, VOCAB_COMM), by trace category.
VOCAB_PASSES = ("OUT_S", "OUT_T", "IN_F", "IN_B")
VOCAB_COLLECTIVES = ("OUT_BCAST", "OUT_STATS", "OUT_REDUCE", "IN_REDUCE", "IN_BCAST")
# The step's tail: with asynchronous collectives a rank waits for every one it
# started before any of these.
TAIL = ("REDUCE_TIED", "REDUCE_GRAD", "STEP")


def collective_key(e):
    """A collective: its kind and, for the vocabulary's, its micro-batch."""
    return (e["cat"], e["args"]["microbatch"]) if e["cat"] in VOCAB_COLLECTIVES else e["cat"]


def completion_us(e):
    """When a collective's action's collective completed (us): the end of its
    span in flight if it started one without waiting (attach_completions),
    else the end of its own span."""
    return e.get("args", {}).get("completed_us", e["ts"] + e["dur"])


def is_async(events):
    """Whether the trace's vocabulary collectives were asynchronous
    (--vocab_async_collectives): some show a completion in flight."""
    return any("completed_us" in e.get("args", {}) for e in events
               if e.get("cat") in VOCAB_COLLECTIVES)


def vocab_collective_costs(events):
    """Per (rank, collective_key) of each vocabulary collective its own cost
    (us): its completion minus the latest start among the ranks (the waiting
    for the last rank is left to the model)."""
    collectives = {}
    for e in events:
        if e.get("cat") in VOCAB_COLLECTIVES:
            collectives.setdefault(collective_key(e), []).append(e)
    own = {}
    for key, evs in collectives.items():
        latest = max(e["ts"] for e in evs)
        for e in evs:
            own[(e["tid"], key)] = max(0, completion_us(e) - latest)
    return own


def vocab_costs(events):
    """The vocabulary passes' mean durations and VOCAB_COMM, the mean over
    the collectives of each rank's end minus the latest start among the
    ranks (its own cost, the waiting left to the simulator), in seconds;
    empty without vocabulary passes. A collective started without waiting
    (attach_completions) ends when it completed, not when its start did, and
    VOCAB_ASYNC is 1 (the simulator's asynchronous model)."""
    passes = {}
    for e in events:
        if e.get("cat") in VOCAB_PASSES:
            passes.setdefault(e["cat"], []).append(e["dur"] * 1e-6)
    out = {k: statistics.mean(v) for k, v in passes.items()}
    own = vocab_collective_costs(events)
    if own:
        out["VOCAB_COMM"] = statistics.mean(own.values()) * 1e-6
    if is_async(events):
        out["VOCAB_ASYNC"] = 1  # the run's collectives were asynchronous: simulate them so
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


# The collective each vocabulary pass reads, which an asynchronous collective's
# reader waits for (VocabCollectiveReadBy in pipeline/schedule/ir/action.h);
# stage 0's F reads IN_REDUCE, the last stage's B or I OUT_REDUCE (read_by).
# OUT_REDUCE reads OUT_STATS in the one-barrier algorithm only; in the
# two-barrier one its rank's OUT_T has waited for OUT_STATS already, so the
# wait costs nothing there and the trace need not say which algorithm ran.
VOCAB_READS = {"OUT_S": "OUT_BCAST", "OUT_T": "OUT_STATS", "OUT_REDUCE": "OUT_STATS",
               "IN_B": "IN_BCAST"}


def read_by(e, last_stage):
    """The vocabulary collective (collective_key) whose result action e reads,
    or None."""
    cat, args = e["cat"], e.get("args", {})
    if cat in VOCAB_READS:
        return (VOCAB_READS[cat], args["microbatch"])
    if cat == "F" and args.get("stage") == 0:
        return ("IN_REDUCE", args["microbatch"])
    if cat in ("B", "I") and args.get("stage") == last_stage:
        return ("OUT_REDUCE", args["microbatch"])
    return None


def replay_step(events, tied_ranks, step_all_reduce, asynchronous=None):
    """The simulator's model run with every action's own measured duration
    instead of per-stage means (in seconds): each rank runs its traced actions
    in order; a compute or SEND takes its duration; a RECV completes at
    max(its rank's clock, its SEND's replayed end) + its own cost (as in
    trace_costs); REDUCE_TIED (over tied_ranks) and STEP (over all ranks with
    step_all_reduce) start at the latest arrival and take each rank's end
    minus the latest traced start. A vocabulary collective (over all ranks,
    per kind and micro-batch) is, blocking, such a barrier too; asynchronous
    (asynchronous=True, or None and is_async: the trace shows them in
    flight), as the simulator's VOCAB_ASYNC:1, its action takes its own span
    (the start) and the collective completes, per rank, at the latest
    replayed start plus that rank's completion minus the latest traced
    start; only the action that reads it (read_by), and the tail (every one
    the rank started) and the step's end, wait for that. A replay that
    matches the measured step says the model's structure is right, so that
    what the mean-cost prediction misses is the variation of the
    durations."""
    if asynchronous is None:
        asynchronous = is_async(events)
    ranks = sorted({e["tid"] for e in events})
    prog = {r: sorted((e for e in events if e["tid"] == r), key=lambda e: e["ts"]) for r in ranks}
    send_end = {(e["cat"], e["args"]["stage"], e["args"]["microbatch"]): e["ts"] + e["dur"]
                for e in events if e["cat"] in ("SEND_F", "SEND_B")}
    groups = {"REDUCE_TIED": tied_ranks if len(tied_ranks) > 1 else [],
              "STEP": ranks if step_all_reduce else []}
    if not asynchronous:
        groups.update({c: ranks for c in VOCAB_COLLECTIVES})

    own = vocab_collective_costs(events)  # (rank, collective key) -> cost after the gathering
    latest = {}
    for e in events:
        if e["cat"] in groups and e["tid"] in groups[e["cat"]]:
            latest[collective_key(e)] = max(latest.get(collective_key(e), e["ts"]), e["ts"])
    for e in events:
        if e["cat"] in groups and e["cat"] not in VOCAB_COLLECTIVES:
            own[(e["tid"], collective_key(e))] = (max(0, e["ts"] + e["dur"] - latest[collective_key(e)])
                                       if e["tid"] in groups[e["cat"]] else e["dur"])
    # Asynchronous: each collective's replayed starts by rank, how many ranks
    # start it, and what each rank started (in order).
    starts, participants, started = {}, {}, {r: [] for r in ranks}
    if asynchronous:
        for e in events:
            if e["cat"] in VOCAB_COLLECTIVES:
                participants[collective_key(e)] = participants.get(collective_key(e), 0) + 1
    last_stage = max((e["args"]["stage"] for e in events if e["cat"] in ("F", "B", "I", "W")),
                     default=0)

    def ready(r, keys):
        """When rank r has the results of the collectives `keys` (0 if none),
        or None while one of them is not started by every rank."""
        t = 0
        for key in keys:
            if len(starts.get(key, ())) < participants[key]:
                return None
            t = max(t, max(starts[key].values()) + own[(r, key)])
        return t

    def waits_for(r, e):
        """The collectives rank r waits for before action e: as the simulator
        (the executor also finishes the same kind's earlier ones first, which
        it does not model)."""
        if not asynchronous:
            return []
        if e["cat"] in TAIL:
            return started[r]
        key = read_by(e, last_stage)
        return [key] if key in participants else []

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
                wait = ready(r, waits_for(r, e))
                if wait is None:
                    break  # for a collective that a rank has not started yet
                clock[r] = max(clock[r], wait)
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
                               and ready(q, waits_for(q, prog[q][pos[q]])) is not None
                               for q in group):
                        break
                    t = max(max(clock[q], ready(q, waits_for(q, prog[q][pos[q]]))) for q in group)
                    for q in group:
                        clock[q] = t + own[(q, collective_key(e))]
                        pos[q] += 1
                    progress = True
                    continue
                elif cat in VOCAB_COLLECTIVES:  # asynchronous: started, not waited for
                    starts.setdefault(collective_key(e), {})[r] = clock[r]
                    started[r].append(collective_key(e))
                    clock[r] += e["dur"]
                elif cat in groups:
                    clock[r] += own[(r, collective_key(e))]
                else:
                    clock[r] += e["dur"]
                pos[r] += 1
                progress = True
    if any(pos[r] < len(prog[r]) for r in ranks):
        raise ValueError(f"replay stuck at {pos} (a RECV without its SEND, or a collective "
                         "a rank never reaches?)")
    # A step ends once every collective its ranks started has completed.
    return max(max(clock[r], ready(r, started[r])) for r in ranks) * 1e-6


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
