#!/usr/bin/env python3
"""bench_schedules' trace -> simulator inputs (trace_costs.py), checked by a
round trip: a step traced from the simulator itself (schedule_explorer
--format=chrome, the same event layout as train_gpt's trace.json) with known
costs must give back those costs and the same makespan when trace_costs
derives the explorer's flags from it. Would fail if an estimator (per-stage
compute, collective tail costs, SEND/RECV costs, REDUCE_GRAD per stage, the
vocabulary passes and their collectives), a flag or the replay
(trace_costs.replay_step) were wrong or ignored.

    python3 bench/bench_schedules_test.py path/to/schedule_explorer
"""
import json
import subprocess
import sys

import trace_costs

EXPLORER = sys.argv[1]


def explore(schedule, stages, m, chunks, extra):
    base = [EXPLORER, f"--schedule={schedule}", f"--stages={stages}", f"--microbatches={m}",
            f"--chunks={chunks}"]
    chrome = json.loads(subprocess.run(base + extra + ["--format=chrome"], capture_output=True,
                                       text=True, check=True).stdout)
    out = json.loads(subprocess.run(base + extra + ["--format=json"], capture_output=True,
                                    text=True, check=True).stdout)
    # The actions, with what the background process says of them (collectives
    # in flight), as load_traced_steps reads train_gpt's traces.
    return (trace_costs.attach_completions(chrome["traceEvents"]),
            out["simulation"]["makespan"], out["stage_to_rank"])


def check(schedule, stages, m, chunks, stage_costs, rank_costs, step_all_reduce, vocab=""):
    # Costs in ms: the chrome trace's ts/dur are in us, 1000 per unit.
    last = stages * chunks - 1
    extra = ["--costs=F:1,B:2,I:1,W:1,comm:0" + ("," + vocab if vocab else ""),
             f"--stage_costs={stage_costs}",
             f"--rank_costs={rank_costs}", f"--tie_groups=0,{last}", "--defer_receives"]
    if step_all_reduce:
        extra.append("--step_all_reduce")
    events, makespan_ms, placement = explore(schedule, stages, m, chunks, extra)
    costs = trace_costs.trace_costs(events, chunks, stages)
    predicted, errors, replay_errors, (stage_out, rank_out) = trace_costs.simulate_steps(
        EXPLORER, schedule, stages, m, chunks, [(makespan_ms / 1000, costs)], step_all_reduce)
    name = f"{schedule} p={stages} m={m} v={chunks}"
    assert abs(predicted[0] * 1000 - makespan_ms) < 1e-6, (name, predicted, makespan_ms)
    assert abs(errors[0]) < 1e-9, (name, errors)
    # The replay of the simulator's own step is the step, asynchronous
    # collectives included (started, waited for where read).
    assert abs(replay_errors[0]) < 1e-9, (name, replay_errors)
    if "VOCAB_ASYNC:1" in vocab:
        # The same trace replayed with every collective a barrier (the
        # blocking form, costing its time in flight) is the blocking step,
        # which is longer: the test tells the two models apart.
        tied = sorted({placement[str(s)] for s in (0, last)})
        blocking_ms = 1000 * trace_costs.replay_step(events, tied, step_all_reduce,
                                                     asynchronous=False)
        blocking_extra = [a.replace("VOCAB_ASYNC:1", "VOCAB_ASYNC:0") for a in extra]
        _, simulated_blocking_ms, _ = explore(schedule, stages, m, chunks, blocking_extra)
        assert abs(blocking_ms - simulated_blocking_ms) < 1e-6, (name, blocking_ms,
                                                                 simulated_blocking_ms)
        assert blocking_ms > 1.02 * makespan_ms, (name, blocking_ms, makespan_ms)
    # The derived costs themselves, in ms.
    for part in stage_costs.split(";"):
        stage, _, items = part.partition(":")
        for item in items.split(","):
            key, value = item.split(":")
            got = stage_out[int(stage)][key] * 1000
            assert abs(got - float(value)) < 1e-6, (name, stage, key, got, value)
    for part in rank_costs.split(";"):
        rank, _, items = part.partition(":")
        for item in items.split(","):
            key, value = item.split(":")
            got = rank_out[int(rank)].get(key, 0) * 1000
            assert abs(got - float(value)) < 1e-6, (name, rank, key, got, value)
    for item in vocab.split(",") if vocab else []:
        key, value = item.split(":")
        got = costs["vocab"][key] * (1 if key == "VOCAB_ASYNC" else 1000)
        assert abs(got - float(value)) < 1e-6, (name, key, got, value)
    print(f"ok {name}: makespan {makespan_ms:g}")


# 1F1B, p = 2: uneven stages, every tail cost, a collective STEP.
check("1f1b", 2, 4, 1, "0:F:1,B:2,REDUCE_GRAD:0.1;1:F:1.5,B:2.5,REDUCE_GRAD:0.2",
      "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,REDUCE_TIED:0.4,SEND:0.07,"
      "RECV:0.03", True)
# The same with a local STEP.
check("1f1b", 2, 4, 1, "0:F:1,B:2;1:F:1.5,B:2.5",
      "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,REDUCE_TIED:0.4,SEND:0.07,"
      "RECV:0.03", False)
# ZB-V: 2 stages per rank, V placement (the tie of stages 0 and 3 is local to
# rank 0), split backward.
if "zbv" in subprocess.run([EXPLORER, "--list"], capture_output=True, text=True).stdout:
    check("zbv", 2, 4, 2, "0:F:0.5,I:0.1,W:0.6;1:F:0.6,I:0.7,W:0.4;2:F:0.7,I:0.8,W:0.5;"
          "3:F:0.9,I:1,W:0.6",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,SEND:0.07,RECV:0.03", True)
# Vocabulary parallelism: its passes' costs and its collectives (barriers of
# every rank, each with its own cost after the last rank arrives), under
# 1F1B with the passes placed and under ZB-V's.
listed = subprocess.run([EXPLORER, "--list"], capture_output=True, text=True).stdout
if "1f1b_vocab" in listed:
    check("1f1b_vocab", 2, 4, 1, "0:F:1,B:2;1:F:1.5,B:2.5",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,REDUCE_TIED:0.4,SEND:0.07,"
          "RECV:0.03", True,
          "OUT_S:0.5,OUT_T:1,IN_F:0.2,IN_B:0.3,VOCAB_COMM:0.05")
if "zbv_vocab" in listed:
    check("zbv_vocab", 2, 4, 2, "0:F:0.5,I:0.1,W:0.6;1:F:0.6,I:0.7,W:0.4;2:F:0.7,I:0.8,W:0.5;"
          "3:F:0.9,I:1,W:0.6",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,SEND:0.07,RECV:0.03", True,
          "OUT_S:0.4,OUT_T:0.9,IN_F:0.1,IN_B:0.2,VOCAB_COMM:0.03")
# Asynchronous collectives (VOCAB_ASYNC:1): each rank's post is a span of no
# time and the collective shows in flight in the background process until it
# completes; VOCAB_COMM comes back from the completions, VOCAB_ASYNC from
# their presence, and the simulated step and the replay are the step.
if "1f1b_vocab" in listed:
    check("1f1b_vocab", 2, 4, 1, "0:F:1,B:2;1:F:1.5,B:2.5",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,REDUCE_TIED:0.4,SEND:0.07,"
          "RECV:0.03", True,
          "OUT_S:0.5,OUT_T:1,IN_F:0.2,IN_B:0.3,VOCAB_COMM:0.05,VOCAB_ASYNC:1")
if "zbv_vocab" in listed:
    check("zbv_vocab", 2, 4, 2, "0:F:0.5,I:0.1,W:0.6;1:F:0.6,I:0.7,W:0.4;2:F:0.7,I:0.8,W:0.5;"
          "3:F:0.9,I:1,W:0.6",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,SEND:0.07,RECV:0.03", True,
          "OUT_S:0.4,OUT_T:0.9,IN_F:0.1,IN_B:0.2,VOCAB_COMM:0.03,VOCAB_ASYNC:1")
# The one-barrier algorithm at p = 4 (OUT_REDUCE waits for OUT_STATS; the
# paper's placement starts the next F meanwhile): the replay of each form's
# trace is its step.
for schedule, chunks in (("1f1b_vocab1", 1), ("zbv_vocab1", 2), ("1f1b_vocab1_overlap", 1)):
    if schedule not in listed:
        continue
    for form in (0, 1):
        flags = [f"--costs=F:1,B:2,I:1,W:1,comm:0,OUT_S:0.5,OUT_T:1,IN_F:0.2,IN_B:0.3,"
                 f"VOCAB_COMM:0.2,VOCAB_ASYNC:{form}",
                 "--rank_costs=0:STEP:0.5;1:STEP:0.5;2:STEP:0.5;3:STEP:0.5",
                 f"--tie_groups=0,{4 * chunks - 1}", "--defer_receives"]
        events, makespan_ms, placement = explore(schedule, 4, 8, chunks, flags)
        tied = sorted({placement[str(s)] for s in (0, 4 * chunks - 1)})
        replay_ms = 1000 * trace_costs.replay_step(events, tied, False)
        assert abs(replay_ms - makespan_ms) < 1e-6, (schedule, form, replay_ms, makespan_ms)
        print(f"ok {schedule} p=4 m=8 VOCAB_ASYNC:{form}: replay {replay_ms:g} = makespan")


# Asynchronous vocabulary collectives (--vocab_async_collectives): a trace
# shows each start as an action and the collective in flight as a background
# span (pid 1, args.started_by) to its completion. VOCAB_COMM is then the
# completion minus the latest start (rank 1's at 300 us): (350 - 300 and
# 352 - 300) / 2 = 51 us; without the spans it would be the starts' ends (0).
def async_collective(rank, start_us, completed_us):
    start = {"ph": "X", "pid": 0, "tid": rank, "name": "OUT_STATS0", "cat": "OUT_STATS",
             "ts": start_us, "dur": 1, "args": {"stage": 0, "microbatch": 0}}
    flight = {"ph": "X", "pid": 1, "tid": rank, "name": "OUT_STATS0 in flight",
              "cat": "background", "ts": start_us, "dur": completed_us - start_us,
              "args": {"started_by": "OUT_STATS0", "stage": 0, "microbatch": 0}}
    return [start, flight]


trace = async_collective(0, 100, 350) + async_collective(1, 300, 352)
without = trace_costs.vocab_costs([e for e in trace if e["pid"] == 0])["VOCAB_COMM"] * 1e6
assert without < 1, without
actions = trace_costs.attach_completions(trace)
assert [e["pid"] for e in actions] == [0, 0], actions
got = trace_costs.vocab_costs(actions)["VOCAB_COMM"] * 1e6
assert abs(got - 51) < 1e-9, got
print("ok asynchronous collectives: VOCAB_COMM from their completions")


# The replay of an asynchronous trace, by hand (us): rank 0 starts OUT_STATS0
# (10 us) and runs W (240 us) while it is in flight; rank 1 starts it last, at
# 200, and it completes at 300 on both (own cost 100). OUT_T0 reads it: rank
# 0's waits to 300 and ends at 400, rank 1's at 350. OUT_REDUCE0, read by
# nobody here, completes at 500: each rank's STEP (the tail) waits for it.
# Replayed so the step is the trace's 520 us; as barriers (the blocking
# model) rank 0's W would start only at 300, and the step would be 760.
def action(rank, cat, name, ts, dur, completed_us=None, stage=-1):
    args = {"stage": stage, "microbatch": 0}
    if completed_us is not None:
        args["completed_us"] = completed_us
    return {"ph": "X", "pid": 0, "tid": rank, "name": name, "cat": cat, "ts": ts, "dur": dur,
            "args": args}


trace = [action(0, "OUT_STATS", "OUT_STATS0", 0, 10, 300), action(0, "W", "0W0", 10, 240, stage=0),
         action(0, "OUT_T", "OUT_T0", 300, 100),
         action(0, "OUT_REDUCE", "OUT_REDUCE0", 400, 5, 500), action(0, "STEP", "STEP", 500, 20),
         action(1, "OUT_STATS", "OUT_STATS0", 200, 10, 300), action(1, "OUT_T", "OUT_T0", 300, 50),
         action(1, "OUT_REDUCE", "OUT_REDUCE0", 350, 5, 500), action(1, "STEP", "STEP", 500, 20)]
assert trace_costs.is_async(trace)
got = trace_costs.replay_step(trace, [], False) * 1e6
assert abs(got - 520) < 1e-6, got
blocking = trace_costs.replay_step(trace, [], False, asynchronous=False) * 1e6
assert abs(blocking - 760) < 1e-6, blocking
print("ok replay of asynchronous collectives: waited for where read and before the tail")
print("PASS")
