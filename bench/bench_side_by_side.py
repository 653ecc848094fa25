"""pipe, PyTorch 2.15 pipelining and DeepSpeed 0.14.1 side by side (issue #30).

Two benchmarks in one rotation (--mode peer, overhead or both):

  peer      the peer GPT (bench_common.py's PEER_GPT: width 256, 8 blocks,
            sequence 128, 8 micro-batches of 4), pp = 2: tokens/s per schedule,
            and each system's single process on its own kernels, 1 thread:
            pipe pp = 1 (Debian's LibTorch 1.13 + OpenBLAS), PyTorch 2.15's wheel
            and Debian's python3-torch 1.13 (DeepSpeed's kernels), both running
            bench/torch_gpt_reference.py.
  overhead  the same GPT with negligible compute (--overhead_width 32, 4 blocks,
            sequence 16, micro-batch 1) at m = --overhead_microbatches (32, 64),
            pp = 2: step time per executed compute action (F, B, I, W) and per
            message, each per rank. 4 blocks, not 2: pipe needs a block per model
            part, and the 2-chunk schedules cut pp = 2 into 4 parts.

pipe's pipeline runs (both modes) trace every timed step: each is simulated
with its own measured costs (bench_common.simulate_pipe: simulator
error per step), and the traces say where each rank's step went (compute
actions, sends, receives, tail, executor between actions: trace_*_ms).

The systems: pipe's train_gpt (--pipe NAME='flags', default 1F1B, interleaved
1F1B and ZB-V with 2 chunks, all with --pipe_common, pipe's fastest settings
on the peer GPT: static shapes, receives posted ahead; a flag a configuration
gives itself replaces the common one), PyTorch 2.15 pipelining
(bench/torch_pipelining_gpt.py in the torch-newest venv, --torch_schedule) and
DeepSpeed's 1F1B (bench/deepspeed_gpt.py). Every repetition runs every
configuration once, in the same order, so slow periods of a shared machine
hit all; each run's figure is the median of its timed steps, a
configuration's the median over repetitions. Ranks get one thread each.

Records (tools/results.py's schema) go to --results as they are measured: one
per run ("kind": "run": its steps, tokens/s, per-action time, load at start
and end; machine.state "loaded" when the 1-minute load passed --loaded_above)
and, at the end, one per configuration ("kind": "summary": medians, ratios to
its own single process, to PyTorch's same and best schedule, to DeepSpeed,
paired repetitions won). All records of one invocation share "run". A table
goes to stderr, the summaries as one JSON line to stdout.

Use bench/bench_side_by_side.sh (it makes the virtual environments and builds
train_gpt and schedule_explorer).
"""
import argparse
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_common as bc
import results  # tools/results.py (the record format), on PYTHONPATH: bench_side_by_side.sh

HERE = Path(__file__).resolve().parent

PIPE_DEFAULT = ["1f1b=--schedule=1f1b", "interleaved_1f1b=--schedule=interleaved_1f1b --chunks=2",
                "zbv=--schedule=zbv --chunks=2"]
TORCH_DEFAULT = ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"]
# pipe's schedule -> PyTorch's class of the same schedule.
SAME_SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved_1f1b": "Interleaved1F1B",
                 "interleaved_zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble",
                 "dualpipev": "DualPipeV"}
# schedule -> (stages per rank, placement, compute actions per micro-batch and
# stage: F + B, or F + I + W when the backward is split). DualPipeV is left
# out: it fuses F and B of two micro-batches, so its action count is its own.
SHAPE = {"1f1b": (1, "loop", 2), "gpipe": (1, "loop", 2), "zb_h1": (1, "loop", 3),
         "interleaved_1f1b": (2, "loop", 2), "interleaved_zb": (2, "loop", 3),
         "zbv": (2, "v", 3)}
SINGLES = {"pipe": "pipe_single", "pytorch": "pytorch_single", "deepspeed": "torch113_single"}


def work_per_rank(schedule, pp, m):
    """(compute actions, messages sent or received) per rank per step, or
    (None, None) for a schedule of unknown shape."""
    pipe_name = {v: k for k, v in SAME_SCHEDULE.items()}.get(schedule, schedule)
    shape = SHAPE.get(pipe_name)
    if shape is None:
        return None, None
    per_rank, placement, ops = shape
    stages = pp * per_rank
    # Loop placement puts neighbouring stages on different ranks; V placement
    # keeps stages pp - 1 and pp on one rank.
    crossing = stages - 1 if placement == "loop" or pp == 1 else stages - 2
    return per_rank * m * ops, 2 * (2 * m * crossing) // pp


def trace_breakdown(run_dir):
    """Where a pipe rank's traced steps went, ms per step (median over the
    traced steps; per rank): compute actions (F, B, I, W), sends, receives
    (mostly waiting for the peer), the tail (tied and data-parallel gradient
    reductions, optimizer step) and the rest of the span: the executor
    between actions."""
    files = sorted(Path(run_dir, "traces").glob("step_*.json")) or [Path(run_dir, "trace.json")]
    groups = {"F": "compute", "B": "compute", "I": "compute", "W": "compute",
              "SEND_F": "send", "SEND_B": "send", "RECV_F": "recv", "RECV_B": "recv",
              "REDUCE_GRAD": "tail", "REDUCE_TIED": "tail", "STEP": "tail"}
    per_rank = {}
    for path in files:
        trace = json.loads(path.read_text())
        events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)
                  if e.get("ph") == "X" and e.get("pid", 0) == 0]  # actions, not background
        for rank in sorted({e["tid"] for e in events}):
            mine = [e for e in events if e["tid"] == rank]
            sums = {g: 0.0 for g in ("compute", "send", "recv", "tail")}
            for e in mine:
                if e.get("cat") in groups:
                    sums[groups[e["cat"]]] += e["dur"]
            span = max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)
            sums["between"] = span - sum(sums.values())
            per_rank.setdefault(rank, []).append(sums)
    return {f"trace_{g}_ms": [round(statistics.median(s[g] for s in steps) / 1e3, 3)
                              for _, steps in sorted(per_rank.items())]
            for g in ("compute", "send", "recv", "tail", "between")}


def pipe_schedule(flags):
    for token in shlex.split(flags):
        if token.startswith("--schedule="):
            return token.split("=", 1)[1]
    return "1f1b"


def configurations(args):
    """Per mode, the configurations in rotation order: dicts of name, system,
    schedule, flags, single."""
    pipes = []
    for spec in args.pipe or PIPE_DEFAULT:
        name, sep, flags = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--pipe '{spec}' must look like name='train_gpt flags'")
        # A flag the configuration sets itself overrides the common one (pipe
        # refuses a flag given twice).
        own = {t.split("=", 1)[0] for t in shlex.split(flags)}
        common = [t for t in shlex.split(args.pipe_common) if t.split("=", 1)[0] not in own]
        pipes.append({"name": f"pipe_{name}", "system": "pipe", "single": False,
                      "schedule": pipe_schedule(flags),
                      "flags": " ".join([shlex.quote(t) for t in common] + [flags])})
    torch_runs = [{"name": f"pytorch_{s}", "system": "pytorch", "single": False, "schedule": s}
                  for s in (args.torch_schedule or TORCH_DEFAULT)]
    ds = [] if args.no_deepspeed else [
        {"name": "deepspeed_1F1B", "system": "deepspeed", "single": False, "schedule": "1F1B"}]
    singles = [{"name": SINGLES[s], "system": s, "single": True, "schedule": "single"}
               for s in ("pipe", "pytorch", "deepspeed") if s != "deepspeed" or ds]
    pipelines = pipes + torch_runs + ds
    modes = []
    if args.mode in ("peer", "both"):
        modes.append(("peer", {}, singles + pipelines))
    if args.mode in ("overhead", "both"):
        for m in args.overhead_microbatches:
            model = {"width": args.overhead_width, "layers": args.overhead_layers,
                     "heads": args.overhead_heads, "context": args.overhead_context,
                     "micro_batch_size": 1, "microbatches": m}
            modes.append((f"overhead_m{m}", model,
                          ([] if args.no_overhead_singles else singles) + pipelines))
    return modes


def run_one(config, args, model_args, workdir):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    model = [f"--{k}={getattr(model_args, k)}" for k in bc.MODEL_DEFAULTS]
    common = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--seed={args.seed}"]
    system = config["system"]
    if system == "pipe":
        # model_args.stages is 1 for the single process.
        flags = "--intra_op_threads=1 --blas_threads=1" if config["single"] else config["flags"]
        result = bc.run_pipe(model_args, flags, workdir)
        if not config["single"]:
            result.update(trace_breakdown(result["run_dir"]))
        return result
    if system == "deepspeed" and not config["single"]:
        return bc.run_deepspeed(model_args)
    python = args.torch_python if system == "pytorch" else str(Path(args.deepspeed).parent /
                                                                  "python")
    if config["single"]:
        command = [python, str(HERE / "torch_gpt_reference.py"), "--threads=1"] + model + common
    else:
        command = [python, str(HERE / "torch_pipelining_gpt.py"), f"--schedule={config['schedule']}",
                   f"--pp={args.stages}", f"--master_port={bc.free_port()}"] + model + common
    started = time.time()
    result = bc.run_for_result(config["name"], command, env, args.timeout)
    result["wall_s"] = time.time() - started
    result.setdefault("threads", [result.get("intra_op_threads")])
    return result


def utc_now():
    return bc.utc_seconds()


def load_1min():
    return bc.load_average()[0]


def label(config):
    names = {"pipe_single": "single process, pipe pp = 1 (LibTorch 1.13 + OpenBLAS)",
             "pytorch_single": "single process, PyTorch 2.15 wheel",
             "torch113_single": "single process, Debian's PyTorch 1.13 (DeepSpeed's kernels)"}
    if config["single"]:
        return names[config["name"]]
    system = {"pipe": "pipe", "pytorch": "PyTorch 2.15 pipelining",
              "deepspeed": "DeepSpeed 0.14.1"}[config["system"]]
    return f"{system} {config['name'].split('_', 1)[1]}"


def summarize(mode, configs, runs, args):
    """Per configuration: medians over repetitions and ratios (see the module
    comment). runs: name -> list of run figures, one per repetition."""
    def median(name, key):
        return statistics.median(r[key] for r in runs[name]) if runs.get(name) else None

    pytorch = [c["name"] for c in configs if c["system"] == "pytorch" and not c["single"]]
    best_pytorch = max(pytorch, key=lambda n: median(n, "tokens_per_s"), default=None)
    ds = "deepspeed_1F1B" if "deepspeed_1F1B" in runs else None
    summaries, peers = [], {}
    for c in configs:
        name = c["name"]
        tps = [r["tokens_per_s"] for r in runs[name]]
        s = {"mode": mode, "label": label(c), "system": c["system"], "schedule": c["schedule"],
             "tokens_per_s": round(statistics.median(tps), 1),
             "runs_tokens_per_s": [round(x) for x in tps],
             "median_step_s": round(median(name, "median_step_s"), 5), "reps": len(tps)}
        for key in ("us_per_action", "us_per_message", "simulated_error", "cpu_s_per_step",
                    "run_cpu_user_s", "run_cpu_sys_s"):
            values = [r[key] for r in runs[name] if r.get(key) is not None]
            if values:
                s[key] = round(statistics.median(values), 4 if key == "simulated_error" else 2)
        for key in [k for k in runs[name][0] if k.startswith("trace_")]:
            s[key] = [round(statistics.median(v), 3) for v in zip(*(r[key] for r in runs[name]))]
        # Step-to-step spread within a run (the timed steps' coefficient of
        # variation), median over repetitions: how steady a system's steps are.
        spreads = [statistics.pstdev(r["step_s"]) / statistics.mean(r["step_s"])
                   for r in runs[name] if len(r.get("step_s") or []) > 1]
        if spreads:
            s["step_cv"] = round(statistics.median(spreads), 4)
        worst = [r["simulated_error_max"] for r in runs[name] if "simulated_error_max" in r]
        if worst:
            s["simulated_error_max"] = round(max(worst, key=abs), 4)
        own = SINGLES[c["system"]]
        if not c["single"] and runs.get(own):
            s["vs_own_single"] = round(s["tokens_per_s"] / median(own, "tokens_per_s"), 3)
            if "us_per_action" in s:
                # The step less this rank's share of its own single process's
                # step (its kernels and framework), per action: the pipeline
                # runtime's own cost, bubble included.
                s["us_per_action_beyond_single"] = round(
                    1e6 * (s["median_step_s"] - median(own, "median_step_s") / runs[name][0]["pp"])
                    / runs[name][0]["actions_per_rank"], 2)
        if c["system"] == "pipe" and not c["single"]:
            same = f"pytorch_{SAME_SCHEDULE.get(c['schedule'], '')}"
            for key, peer in (("pytorch_same", same if same in runs else None),
                              ("pytorch_best", best_pytorch), ("deepspeed", ds)):
                if peer is None:
                    continue
                s[f"vs_{key}"] = round(s["tokens_per_s"] / median(peer, "tokens_per_s"), 3)
                s[f"pairs_faster_{key}"] = sum(
                    a["tokens_per_s"] > b["tokens_per_s"] for a, b in zip(runs[name], runs[peer]))
                if "us_per_action" in s and runs[peer][0].get("us_per_action"):
                    s[f"action_ratio_{key}"] = round(
                        s["us_per_action"] / median(peer, "us_per_action"), 3)
                peers[name, key] = peer
            if best_pytorch:
                s["pytorch_best"] = best_pytorch
        summaries.append((name, s))
    by_name = dict(summaries)
    for (name, key), peer in peers.items():
        mine, theirs = (by_name[n].get("us_per_action_beyond_single") for n in (name, peer))
        if mine is not None and theirs:
            by_name[name][f"beyond_single_ratio_{key}"] = round(mine / theirs, 3)
    return summaries


def make_record(args, run_id, config_key, kind, figures, started, loads, command):
    record = results.make_record("bench_side_by_side", command, figures, config=config_key)
    record.update({"date": started, "date_end": utc_now(), "run": run_id, "kind": kind})
    record["machine"]["loadavg_1min_range"] = f"{min(loads)}-{max(loads)}"
    record["machine"]["state"] = "loaded" if max(loads) > args.loaded_above else "idle"
    return record


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_gpt", required=True, help="pipe's train_gpt binary")
    parser.add_argument("--explorer", default="", help="schedule_explorer: simulate pipe's peer runs")
    parser.add_argument("--deepspeed", required=True, help="DeepSpeed's launcher (its venv's bin)")
    parser.add_argument("--torch_python", required=True, help="python of a PyTorch 2.15 venv")
    parser.add_argument("--mode", choices=("peer", "overhead", "both"), default="both")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--stages", type=int, default=2, help="pp")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    bc.add_model_arguments(parser)  # the peer mode's model (default: the peer GPT)
    parser.add_argument("--pipe", action="append", default=[],
                        help="name='train_gpt flags': a pipe configuration (default: "
                             + "; ".join(PIPE_DEFAULT) + ")")
    parser.add_argument("--pipe_common", default="--p2p_static_shapes=true "
                        "--p2p_post_receives_ahead=true", help="flags every pipe pp run gets")
    parser.add_argument("--torch_schedule", action="append", default=[],
                        help="a PyTorch schedule class (default: " + ", ".join(TORCH_DEFAULT) + ")")
    parser.add_argument("--no_deepspeed", action="store_true")
    parser.add_argument("--overhead_microbatches", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--overhead_width", type=int, default=32)
    parser.add_argument("--overhead_layers", type=int, default=4)
    parser.add_argument("--overhead_heads", type=int, default=4)
    parser.add_argument("--overhead_context", type=int, default=16)
    parser.add_argument("--no_overhead_singles", action="store_true",
                        help="no single processes in the overhead mode")
    parser.add_argument("--results", default=str(HERE / "results" / "side_by_side.jsonl"),
                        help="file the records are appended to ('' = none)")
    parser.add_argument("--loaded_above", type=float, default=2.5,
                        help="1-minute load above which a run is recorded as loaded")
    args = parser.parse_args()
    bc.require_positive(parser, args, "reps", "steps", "stages")
    return args


def run_figures(c, args, mode, values, rep, workdir):
    """Runs configuration `c` once; its run record's figures, the run's result
    and the 1-minute load at its start and end."""
    simulate = c["system"] == "pipe" and not c["single"]
    model_args = argparse.Namespace(**{
        **vars(args), **values, "explorer": args.explorer if simulate else "",
        "stages": 1 if c["single"] else args.stages})
    load_start = load_1min()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_one(c, args, model_args, workdir)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_end = load_1min()
    pp = 1 if c["single"] else args.stages
    actions, messages = work_per_rank(c["schedule"], pp, values["microbatches"])
    if c["single"]:
        actions = 2 * values["microbatches"]
    step = statistics.median(r["step_s"])
    figures = {"mode": mode, "system": c["system"], "schedule": c["schedule"],
               "label": label(c), "rep": rep + 1, "pp": pp, **values,
               "tokens_per_s": round(r["tokens_per_s"], 1),
               "median_step_s": round(step, 5),
               "step_s": [round(x, 5) for x in r["step_s"]],
               "loss_first": r["loss_first"], "loss_last": r["loss_last"],
               "threads": r["threads"], "wall_s": round(r["wall_s"], 1),
               "load_1min_start": load_start, "load_1min_end": load_end,
               # CPU of the whole run (start-up included), every
               # process of it: system time shows transport
               # threads spinning (topology/transport_thread.h).
               "run_cpu_user_s": round(cpu_after.ru_utime - cpu_before.ru_utime, 2),
               "run_cpu_sys_s": round(cpu_after.ru_stime - cpu_before.ru_stime, 2)}
    if actions:
        figures["actions_per_rank"] = actions
        figures["us_per_action"] = round(1e6 * step / actions, 2)
    if messages:
        figures["messages_per_rank"] = messages
        figures["us_per_message"] = round(1e6 * step / messages, 2)
    for key in ("cpu_s_per_step", "simulated_step_s", "simulated_error",
                "simulated_error_max", "replay_error", "torch"):
        if r.get(key) is not None:
            figures[key] = r[key]
    figures.update({k: v for k, v in r.items() if k.startswith("trace_")})
    return figures, r, load_start, load_end


def print_summary_row(mode, name, s):
    def cell(key, width, fmt="{:.2f}x"):
        return f"{fmt.format(s[key]) if key in s else '':>{width}}"
    print(f"{mode:>13} {name:>24} {s['tokens_per_s']:9.1f} {s['median_step_s']:8.4f} "
          f"{cell('us_per_action', 8, '{:.1f}')} {cell('vs_own_single', 9)} "
          f"{cell('vs_pytorch_same', 10)} {cell('vs_pytorch_best', 10)} "
          f"{cell('vs_deepspeed', 7)}", file=sys.stderr)


def main():
    args = parse_args()
    command = os.environ.get("PIPE_BENCH_COMMAND") or " ".join(
        shlex.quote(a) for a in sys.argv)
    modes = configurations(args)
    run_id = utc_now()
    runs = {mode: {c["name"]: [] for c in configs} for mode, _, configs in modes}
    loads_all = [load_1min()]
    with tempfile.TemporaryDirectory(prefix="bench_side_by_side") as workdir:
        for rep in range(args.reps):
            for mode, model, configs in modes:
                values = {**{k: getattr(args, k) for k in bc.MODEL_DEFAULTS}, **model}
                for c in configs:
                    started = utc_now()
                    figures, r, load_start, load_end = run_figures(c, args, mode, values, rep,
                                                                   workdir)
                    loads_all += [load_start, load_end]
                    runs[mode][c["name"]].append(figures)
                    bc.append_record(args.results, make_record(
                        args, run_id, f"{mode}/{c['name']}", "run", figures, started,
                        [load_start, load_end], command))
                    per_action = (f"  {figures['us_per_action']:8.1f} us/action"
                                  if "us_per_action" in figures else "")
                    sim = (f"  simulated {100 * r['simulated_error']:+.1f}%"
                           if "simulated_error" in r else "")
                    print(f"rep {rep + 1}/{args.reps} {mode:>13} {c['name']:>24}: "
                          f"{r['tokens_per_s']:8.1f} tokens/s  step "
                          f"{statistics.median(r['step_s']):.4f} s{per_action}"
                          f"{sim}  loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}  "
                          f"load {load_start}-{load_end}", file=sys.stderr, flush=True)
    summary = {"bench": "bench_side_by_side", "run": run_id, "configs": {}}
    header = (f"{'mode':>13} {'configuration':>24} {'tokens/s':>9} {'step s':>8} {'us/act':>8}"
              f" {'vs own 1p':>9} {'vs PT same':>10} {'vs PT best':>10} {'vs DS':>7}")
    print(header, file=sys.stderr)
    for mode, _, configs in modes:
        for name, s in summarize(mode, configs, runs[mode], args):
            summary["configs"][f"{mode}/{name}"] = s
            bc.append_record(args.results, make_record(args, run_id, f"{mode}/{name}", "summary",
                                                       s, run_id, loads_all, command))
            print_summary_row(mode, name, s)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
