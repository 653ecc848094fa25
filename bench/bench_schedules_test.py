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
    sim = json.loads(subprocess.run(base + extra + ["--format=json"], capture_output=True,
                                    text=True, check=True).stdout)["simulation"]
    # The actions, with what the background process says of them (collectives
    # in flight), as load_traced_steps reads train_gpt's traces.
    return trace_costs.attach_completions(chrome["traceEvents"]), sim["makespan"]


def check(schedule, stages, m, chunks, stage_costs, rank_costs, step_all_reduce, vocab="",
          replay=True):
    # Costs in ms: the chrome trace's ts/dur are in us, 1000 per unit.
    last = stages * chunks - 1
    extra = ["--costs=F:1,B:2,I:1,W:1,comm:0" + ("," + vocab if vocab else ""),
             f"--stage_costs={stage_costs}",
             f"--rank_costs={rank_costs}", f"--tie_groups=0,{last}", "--defer_receives"]
    if step_all_reduce:
        extra.append("--step_all_reduce")
    events, makespan_ms = explore(schedule, stages, m, chunks, extra)
    costs = trace_costs.trace_costs(events, chunks, stages)
    predicted, errors, replay_errors, (stage_out, rank_out) = trace_costs.simulate_steps(
        EXPLORER, schedule, stages, m, chunks, [(makespan_ms / 1000, costs)], step_all_reduce)
    name = f"{schedule} p={stages} m={m} v={chunks}"
    assert abs(predicted[0] * 1000 - makespan_ms) < 1e-6, (name, predicted, makespan_ms)
    assert abs(errors[0]) < 1e-9, (name, errors)
    # The replay of the simulator's own step is the step (replay_step models
    # the blocking form: each collective a barrier; see the async case below).
    if replay:
        assert abs(replay_errors[0]) < 1e-9, (name, replay_errors)
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
# their presence, and the simulated step is the step. The replay runs every
# collective as a barrier (the blocking form), so it is not asked to match.
if "1f1b_vocab" in listed:
    check("1f1b_vocab", 2, 4, 1, "0:F:1,B:2;1:F:1.5,B:2.5",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,REDUCE_TIED:0.4,SEND:0.07,"
          "RECV:0.03", True,
          "OUT_S:0.5,OUT_T:1,IN_F:0.2,IN_B:0.3,VOCAB_COMM:0.05,VOCAB_ASYNC:1", replay=False)
if "zbv_vocab" in listed:
    check("zbv_vocab", 2, 4, 2, "0:F:0.5,I:0.1,W:0.6;1:F:0.6,I:0.7,W:0.4;2:F:0.7,I:0.8,W:0.5;"
          "3:F:0.9,I:1,W:0.6",
          "0:STEP:0.5,REDUCE_TIED:0.3,SEND:0.05,RECV:0.02;1:STEP:0.8,SEND:0.07,RECV:0.03", True,
          "OUT_S:0.4,OUT_T:0.9,IN_F:0.1,IN_B:0.2,VOCAB_COMM:0.03,VOCAB_ASYNC:1", replay=False)


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
print("PASS")
