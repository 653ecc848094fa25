#!/usr/bin/env python3
"""Checks a train_gpt run directory's observability outputs (issue 15).

  check_observability_run.py RUN_DIR CONSOLE_LOG READBACK_SCRIPT [--profile]
  check_observability_run.py --memory-grows SMALL_RUN_DIR LARGE_RUN_DIR

Checks: TensorBoard (through tensorboard_readback.py, the real TensorBoard)
holds every number of metrics.jsonl at its step and wall time and the sample;
logs/rank_<N>.log exist with "rank=N stage=S data=D" in every line and, with
--v=1, every action of the traced step (trace.json) starts and ends in its
rank's log; rank 1 printed nothing on the console; the memory figures are in
metrics.jsonl and the summary, on exactly the steps that log, evaluate or
trace (with the bubble); with --profile, per-rank operator traces and the
merged trace hold pipe's actions and the operators they ran.
--memory-grows: every rank's step peak is larger in the second run.
Exit 0 pass, 1 fail (printed); a TensorBoard that cannot be installed is a
printed SKIP of that part only.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_tensorboard(run, readback):
    lines = metrics(run)
    scalars = {}

    def add(tag, step, value, wall):
        scalars.setdefault(tag, []).append([step, value, wall])

    names = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
             "tokens_per_s": "train/tokens_per_s", "step_s": "train/step_time_s",
             "eval_loss": "eval/loss"}
    per_rank = {"bubble": "bubble_fraction", "mem_peak_bytes": "peak_memory_bytes",
                "mem_current_bytes": "current_memory_bytes",
                "mem_optimizer_state_bytes": "optimizer_state_bytes"}
    for line in lines:
        step, wall = line["step"], line["time"]
        for key, tag in names.items():
            if key in line:
                add(tag, step, line[key], wall)
        for key, name in per_rank.items():
            for r, value in enumerate(line.get(key, [])):
                add("rank_%d/%s" % (r, name), step, value, wall)
    with open(os.path.join(run, "sample.txt")) as f:
        sample = f.read()[:-1]  # the file ends with a newline the event does not have
    expected = {"scalars": scalars, "texts": {"sample": [[lines[-1]["step"], sample]]}}
    check(len(scalars) == 6 + 4 * len(lines[0]["bubble"]),
          "expected scalar series: %s" % sorted(scalars))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(expected, f)
    proc = subprocess.run([sys.executable, readback, os.path.join(run, "tb"), f.name],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout.strip())
    if proc.returncode == 77:
        print("SKIP (TensorBoard part only): the real TensorBoard is unavailable")
    else:
        check(proc.returncode == 0, "TensorBoard read-back failed (exit %d)" % proc.returncode)


LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} rank=(\d+) stage=(\d+) data=(\d+) "
                  r"[\w.]+:\d+\] ")


def check_logs(run, console, world):
    with open(os.path.join(run, "trace.json")) as f:
        trace = json.load(f)["traceEvents"]
    with open(os.path.join(run, "config.textproto")) as f:
        trace_step = int(re.search(r"trace_step: (\d+)", f.read()).group(1))
    steps = len(metrics(run))
    trace_step = min(trace_step, steps - 1)
    for r in range(world):
        path = os.path.join(run, "logs", "rank_%d.log" % r)
        check(os.path.isfile(path), "missing %s" % path)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            log = f.read().splitlines()
        bad = [l for l in log if not (LINE.match(l) and LINE.match(l).group(1) == str(r))]
        check(not bad, "%s: lines without the rank prefix: %s" % (path, bad[:3]))
        check(any("stage=%d" % (r % 2) in l for l in log[:1]), "%s: stage label" % path)
        actions = [e["name"] for e in trace
                   if e.get("ph") == "X" and e.get("pid", 0) == 0 and e.get("tid") == r]
        check(len(actions) >= 8, "rank %d: only %d actions in trace.json" % (r, len(actions)))
        text = "\n".join(log)
        for name in actions:
            for what in ("start", "end"):
                pattern = r"\] train step %d %s %s mb " % (trace_step, what, re.escape(name))
                check(re.search(pattern, text),
                      "%s: no '%s' line for %s in train step %d" % (path, what, name, trace_step))
        recv = [l for l in log if re.search(r"train step %d end \dRECV_\w+ mb \d+ peer \d+ \d+ us"
                                            r"( cpu live \d+ B peak \d+ B)?$"
                                            % trace_step, l)]
        check(recv, "%s: receives lack their peer and duration" % path)
    # Other ranks' glog lines stay in their files; the only console line of a
    # rank other than 0 is the launcher's per-worker thread report.
    others = [l for l in console.splitlines() if re.match(r"^\[rank [1-9]", l) and
              not re.match(r"^\[rank \d+\] threads: ", l)]
    check(not others, "ranks other than 0 printed to the console: %s" % others[:3])
    check("memory per rank" in console and "simulator: peak activations" in console,
          "no memory summary on the console")


def config_int(run, field, default):
    with open(os.path.join(run, "config.textproto")) as f:
        m = re.search(r"^%s: (\d+)" % field, f.read(), re.M)
    return int(m.group(1)) if m else default


def observed_steps(run):
    """The metrics steps (1-based) that log, evaluate or trace: only they carry
    the busy/idle and memory figures (two world all-gathers)."""
    lines = metrics(run)
    last = lines[-1]["step"]
    log_interval = config_int(run, "log_interval", 10)
    trace_step = min(config_int(run, "trace_step", 2), last - 1)
    trace_steps = config_int(run, "trace_steps", 1)
    return {l["step"] for l in lines
            if l["step"] == 1 or l["step"] % log_interval == 0 or l["step"] == last or
            "eval_loss" in l or trace_step < l["step"] <= trace_step + trace_steps}


def check_memory(run, world):
    observed = observed_steps(run)
    for line in metrics(run):
        if line["step"] not in observed:
            check(not any(k in line for k in ("bubble", "mem_peak_bytes", "mem_current_bytes",
                                              "mem_optimizer_state_bytes")),
                  "step %d logs, evaluates and traces nothing but gathered figures"
                  % line["step"])
            continue
        check(len(line.get("bubble", [])) == world, "step %d: bubble = %s"
              % (line["step"], line.get("bubble")))
        for key in ("mem_peak_bytes", "mem_current_bytes"):
            check(len(line.get(key, [])) == world and all(v > 0 for v in line[key]),
                  "step %d: %s = %s" % (line["step"], key, line.get(key)))
        check(all(p >= c for p, c in zip(line["mem_peak_bytes"], line["mem_current_bytes"])),
              "step %d: peak below current" % line["step"])
        check(len(line.get("mem_optimizer_state_bytes", [])) == world,
              "step %d: mem_optimizer_state_bytes = %s"
              % (line["step"], line.get("mem_optimizer_state_bytes")))


def check_profile(run, world):
    prof = os.path.join(run, "profile")
    for r in range(world):
        with open(os.path.join(prof, "rank_%d.json" % r)) as f:
            t = json.load(f)
        check(t["otherData"]["rank"] == r, "rank_%d.json: otherData.rank" % r)
        check(any(e.get("name", "").startswith("aten::") for e in t["traceEvents"]),
              "rank_%d.json has no aten:: operator" % r)
    with open(os.path.join(prof, "merged.json")) as f:
        merged = json.load(f)["traceEvents"]
    for r in range(world):
        lane = [e for e in merged if e.get("pid") == r and e.get("ph") == "X"]
        names = {e["name"] for e in lane}
        check(any(re.match(r"^\dF\d+$", n) for n in names), "merged: rank %d has no F" % r)
        check(any(re.match(r"^\dB\d+$", n) for n in names), "merged: rank %d has no B" % r)
        check(any(re.match(r"^\d(SEND|RECV)_[FB]\d+$", n) for n in names),
              "merged: rank %d has no SEND/RECV" % r)
        # The actions' track is the lane's top one ("pipe actions", lowest sort index).
        meta = [e for e in merged if e.get("pid") == r and e.get("ph") == "M"]
        tracks = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
        order = sorted((e["args"]["sort_index"], e["tid"]) for e in meta
                       if e["name"] == "thread_sort_index")
        check(order and tracks.get(order[0][1]) == "pipe actions",
              "merged: rank %d's top track is %s, not pipe actions" %
              (r, tracks.get(order[0][1]) if order else None))
        action_tids = {e["tid"] for e in lane if re.match(r"^\d(F|B|SEND_|RECV_)", e["name"])}
        check(action_tids == {order[0][1]} if order else False,
              "merged: rank %d's actions are on tracks %s" % (r, sorted(action_tids)))
        fwd = [e for e in lane if e["name"].startswith("aten::") and
               re.match(r"^\dF\d+$", e.get("args", {}).get("pipe_action", ""))]
        bwd = [e for e in lane if "Backward" in e["name"] and
               re.match(r"^\dB\d+$", e.get("args", {}).get("pipe_action", ""))]
        check(fwd, "merged: rank %d has no operator attributed to a forward" % r)
        check(bwd, "merged: rank %d has no backward node attributed to a B" % r)


def main():
    if sys.argv[1] == "--memory-grows":
        small, large = metrics(sys.argv[2]), metrics(sys.argv[3])
        world = len(small[0]["mem_peak_bytes"])
        for r in range(world):
            a = max(l["mem_peak_bytes"][r] for l in small if "mem_peak_bytes" in l)
            b = max(l["mem_peak_bytes"][r] for l in large if "mem_peak_bytes" in l)
            print("rank %d step peak: %d -> %d bytes" % (r, a, b))
            check(b > 1.5 * a, "rank %d: peak %d with the larger micro-batch, %d with the smaller"
                  % (r, b, a))
    else:
        run, console_path, readback = sys.argv[1:4]
        with open(console_path) as f:
            console = f.read()
        world = len(metrics(run)[0]["bubble"])
        check_tensorboard(run, readback)
        check_logs(run, console, world)
        check_memory(run, world)
        if "--profile" in sys.argv[4:]:
            check_profile(run, world)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
