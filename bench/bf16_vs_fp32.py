#!/usr/bin/env python3
"""bf16_vs_fp32: the peer GPT at pp = 2 with 1F1B and ZB-V, --precision=fp32 vs bf16
side by side (issue 26): step time, p2p payload bytes per step, per-rank memory.

    ./bazelw build //experiments:train_gpt && cp -L bazel-bin/experiments/train_gpt /tmp/tg
    bench/bf16_vs_fp32.py --train_gpt /tmp/tg --commit $(git rev-parse --short HEAD) \\
        --steps 6 --out bench/results/bf16_vs_fp32.jsonl

The peer GPT (/work/shared/peers/README.md: width 256, 8 blocks, 4 heads,
context 128, micro-batch 4, 8 micro-batches, AdamW, no clipping). Per schedule
the two precisions run back to back (alternating which goes first per pair), so
machine load hits both. Figures per run (pipe-result/1 schema, one record per
run): the median `step_s` of metrics.jsonl over steps 2..N (step 1 warms up),
the p2p payload bytes rank 0 sent (the `p2p (rank 0): ... payload bytes` line)
divided by the steps (the final evaluation's forward sends are included, the
same count in both precisions), and per rank the step's peak live CPU tensor
bytes above those at the step's start (`mem_peak_bytes - mem_start_bytes`: the
activations, their gradients and the step's gradient buffers), the maximum
over the measured steps.
"""

import argparse
import os
import re
import statistics
import tempfile

import bench_common as bc

PEER = (bc.PEER_GPT_SHAPE + ",optimizer.max_grad_norm=0,lr_schedule.name=constant,eval_interval=0,sample_tokens=0,"
        "log_interval=1")
SCHEDULES = {"1f1b": 1, "zbv": 2}
PRECISIONS = ["fp32", "bf16"]


def run(binary, precision, schedule, steps, out_dir, name):
    cmd = [binary, "--config=experiments/configs/gpt_small_pp2.textproto",
           f"--set={PEER},trace_step={steps + 1}", "--microbatches=8", "--micro_batch_size=4",
           "--pp=2", f"--schedule={schedule}", f"--chunks={SCHEDULES[schedule]}",
           f"--precision={precision}", f"--steps={steps}", f"--output_dir={out_dir}",
           f"--name={name}"]
    proc, _, lines, load_before, load_after = bc.run_train_gpt(cmd, out_dir, name, 1800, 2000)
    m = re.search(r"p2p \(rank 0\): \d+ messages sent \((\d+) payload bytes", proc.stdout)
    if m is None:
        raise SystemExit(f"no p2p line in the output of {' '.join(cmd)}")
    measured = [l for l in lines if l["step"] >= 2]
    peak = transient = None
    for l in measured:
        if "mem_peak_bytes" not in l:
            continue
        d = [p - c for p, c in zip(l["mem_peak_bytes"], l["mem_current_bytes"])]
        peak = l["mem_peak_bytes"] if peak is None else [max(a, b) for a, b in
                                                        zip(peak, l["mem_peak_bytes"])]
        transient = d if transient is None else [max(a, b) for a, b in zip(transient, d)]
    figures = {
        "median_step_s": statistics.median(l["step_s"] for l in measured),
        "step_s": [l["step_s"] for l in lines],
        "p2p_payload_bytes_rank0": int(m.group(1)),
        "p2p_payload_bytes_per_step_rank0": int(m.group(1)) / steps,
        "final_loss": lines[-1]["loss"],
    }
    if peak is not None:
        figures["peak_bytes_per_rank"] = peak
        figures["peak_above_step_end_bytes_per_rank"] = transient
    return cmd, load_before, load_after, figures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train_gpt", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    run_id = bc.utc_now().strftime("bf16_vs_fp32-%Y%m%dT%H%MZ")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for schedule in SCHEDULES:
                order = PRECISIONS if pair % 2 == 0 else list(reversed(PRECISIONS))
                for precision in order:
                    name = f"{precision}_{schedule}_{pair}"
                    start = bc.utc_now()
                    cmd, l0, l1, figures = run(args.train_gpt, precision, schedule, args.steps,
                                               tmp, name)
                    record = {
                        "schema": "pipe-result/1",
                        "date": bc.utc_seconds(start),
                        "date_end": bc.utc_seconds(),
                        "commit": args.commit,
                        "machine": {"nproc": os.cpu_count(),
                                    "loadavg": f"{l0[0]:.1f}-{l1[0]:.1f}",
                                    "state": "loaded" if l0[0] > os.cpu_count() else "idle"},
                        "command": " ".join(cmd), "bench": "bf16_vs_fp32", "run": run_id,
                        "config": f"{schedule}_{precision}", "figures": figures,
                    }
                    bc.append_record(args.out, record)
                    print(f"{schedule} {precision}: median step {figures['median_step_s']:.3f} s, "
                          f"{figures['p2p_payload_bytes_per_step_rank0']:.0f} p2p B/step "
                          f"(load {l0[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
