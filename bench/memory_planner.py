#!/usr/bin/env python3
"""memory_planner: the byte planner's predicted peak per rank vs the measured one
(issue 27), for every registered training schedule at pp = 2 and 4, with and
without activation checkpointing; with --tp 2, at tp = 2 and pp = 2 and 4
(--tp_pp picks), with and without sequence parallelism (every rank of each
model group).

    ./bazelw build //experiments:train_gpt && cp -L bazel-bin/experiments/train_gpt /tmp/tg
    bench/memory_planner.py --train_gpt /tmp/tg --commit $(git rev-parse --short HEAD) \\
        --out bench/results/memory_planner.jsonl

Each configuration trains a few steps of the README's GPT (width 128, 4 blocks
at pp = 2, 8 blocks at pp = 4, context 64, micro-batch 8, m = 2p) and reads the
run summary's lines

    rank R stage S: step peak X MiB, current ... planner: peak Y MiB (+E%)

where the step peak is the largest live CPU tensor bytes of any step (the
memory tracker's) and the planner's peak is driver/memory_budget.h's
prediction for the schedule trained. Memory does not depend on machine load,
so this runs on a shared machine. One record per invocation (a table of
configurations); `figures.worst_abs_error_pct` is the largest |E| over every
rank of every configuration.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import bench_common as bc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import results  # noqa: E402  (tools/results.py)

# (schedule, chunks): every registered training schedule.
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("zb_h2", 1), ("interleaved_1f1b", 2),
             ("interleaved_zb", 2), ("looped_bfs", 2), ("zbv", 2), ("vhalf", 2), ("dualpipev", 2)]
LINE = re.compile(r"rank (\d+) stage (\d+): step peak ([0-9.]+) MiB, current [0-9.]+ MiB.*"
                  r"planner: peak ([0-9.]+) MiB \(([+-]\d+)%\)")


def run(binary, pp, schedule, chunks, ckpt, steps, out_dir, tp=1, sp=False):
    layers = 4 if pp == 2 else 8
    sets = (f"gpt.num_layers={layers},lr_schedule.warmup_steps=1,eval_interval=0,"
            f"sample_tokens=0,parallelism.activation_checkpointing.interval={ckpt}")
    cmd = [binary, "--config=experiments/configs/gpt_small_pp2.textproto", f"--set={sets}",
           f"--pp={pp}", f"--schedule={schedule}", f"--chunks={chunks}",
           f"--microbatches={2 * pp}", f"--steps={steps}", f"--output_dir={out_dir}",
           f"--name={schedule}_pp{pp}_ckpt{ckpt}_tp{tp}{'_sp' if sp else ''}"]
    if tp > 1:
        cmd += [f"--tp={tp}", f"--sequence_parallel={'true' if sp else 'false'}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    ranks = []
    for m in LINE.finditer(proc.stdout + proc.stderr):
        ranks.append({"rank": int(m.group(1)), "stage": int(m.group(2)),
                      "measured_mib": float(m.group(3)), "predicted_mib": float(m.group(4)),
                      "error_pct": round(100 * (float(m.group(4)) / float(m.group(3)) - 1), 1)})
    if len(ranks) != pp * tp:
        raise SystemExit(f"expected {pp * tp} planner lines in the output of {' '.join(cmd)}")
    return " ".join(cmd), ranks


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_gpt", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor-parallel ranks: > 1 measures each configuration with and "
                             "without sequence parallelism")
    parser.add_argument("--tp_pp", default="2,4",
                        help="with --tp > 1: the pipeline sizes to measure (comma-separated)")
    parser.add_argument("--state", choices=("idle", "loaded"), default="loaded",
                        help="machine.state of the record (memory does not depend on load)")
    args = parser.parse_args()
    start = bc.utc_now().strftime("%Y-%m-%dT%H:%MZ")
    rows = []
    command = None
    with tempfile.TemporaryDirectory() as out_dir:
        tp_pps = [int(p) for p in args.tp_pp.split(",")]
        layouts = ([(pp, False) for pp in (2, 4)] if args.tp == 1 else
                   [(pp, sp) for pp in tp_pps for sp in (False, True)])
        for pp, sp in layouts:
            for schedule, chunks in SCHEDULES:
                for ckpt in (0, 1):
                    command, ranks = run(args.train_gpt, pp, schedule, chunks, ckpt, args.steps,
                                         out_dir, args.tp, sp)
                    worst = max(abs(r["error_pct"]) for r in ranks)
                    row = {"pp": pp, "schedule": schedule, "chunks": chunks,
                           "activation_checkpointing": ckpt, "ranks": ranks,
                           "worst_abs_error_pct": worst}
                    if args.tp > 1:
                        row.update({"tp": args.tp, "sequence_parallel": sp})
                    rows.append(row)
                    print(f"pp={pp} tp={args.tp}{' sp' if sp else ''} {schedule:17s} v={chunks} "
                          f"ckpt={ckpt}: " +
                          ", ".join(f"r{r['rank']} {r['measured_mib']:.1f} vs "
                                    f"{r['predicted_mib']:.1f} MiB ({r['error_pct']:+.0f}%)"
                                    for r in ranks), flush=True)
    worst = max(r["worst_abs_error_pct"] for r in rows)
    within = sum(1 for r in rows if r["worst_abs_error_pct"] <= 10)
    record = {
        "schema": "pipe-result/1", "date": start,
        "date_end": bc.utc_now().strftime("%Y-%m-%dT%H:%MZ"),
        "commit": args.commit,
        # tools/results.py's facts (CPU model, BLAS and its kernel, load), as
        # every record written through it has them.
        "machine": {**results.machine_facts(), "state": args.state},
        "command": f"bench/memory_planner.py --train_gpt {args.train_gpt} --steps {args.steps} "
                   f"--tp {args.tp} " + (f"--tp_pp {args.tp_pp} " if args.tp > 1 else "") +
                   f"(per configuration, e.g. {command})",
        "bench": "memory_planner",
        "figures": {"configurations": len(rows), "within_10_pct": within,
                    "worst_abs_error_pct": worst, "rows": rows},
        "note": f"tp {args.tp}: " * (args.tp > 1) +
                f"{within} of {len(rows)} configurations have every rank's predicted peak within "
                f"10% of the measured step peak (live CPU tensor bytes); worst {worst}%.",
    }
    bc.append_record(args.out, record)
    print(record["note"])


if __name__ == "__main__":
    main()
