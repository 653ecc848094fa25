#!/usr/bin/env python3
"""observer_overhead: step time of the peer GPT with the executor's observers off
vs every step observed (issue 24: what "today's default" did on every step).

    ./bazelw build //experiments:train_gpt && cp -L bazel-bin/experiments/train_gpt /tmp/tg
    bench/observer_overhead.py --train_gpt /tmp/tg --commit $(git rev-parse --short HEAD) \\
        --pairs 3 --steps 12 --out bench/results/observer_overhead.jsonl

Variants, one binary: "observers_off" (log_interval past the run: only the
first and the last step are observed) and "every_step_observed"
(log_interval=1: every step gets the ActionTimer, the busy/idle all-gather
and the memory all-gather, the per-step work main's default did on the CPU,
where its per-action device wait is a no-op).

The peer GPT (/work/shared/peers/README.md: width 256, 8 blocks, 4 heads,
context 128, micro-batch 4, 8 micro-batches, AdamW, no clipping) at pp = 2,
for 1F1B and ZB-V (2 chunks, V placement). Per schedule and pair, the two
variants run back to back, alternating which goes first, so machine load hits
both. The figure per run: the median `step_s` of metrics.jsonl (the driver's
wall time of the whole step, observers' collectives included) over steps 3
to N-1 (the last is traced and evaluated in both). One JSON line per run: date (UTC), commit, nproc, load
average before and after, the command, the figures.
"""

import argparse
import os
import statistics
import tempfile

import bench_common as bc

PEER = (bc.PEER_GPT_SHAPE + ",optimizer.max_grad_norm=0,lr_schedule.name=constant,eval_interval=0,sample_tokens=0")
LOG_INTERVAL = {"observers_off": 1000, "every_step_observed": 1}
SCHEDULES = {"1f1b": 1, "zbv": 2}
CPU_MODEL = bc.cpu_model()


def run(binary, variant, schedule, steps, out_dir, name):
    cmd = [binary, "--config=experiments/configs/gpt_small_pp2.textproto",
           f"--set={PEER},log_interval={LOG_INTERVAL[variant]},trace_step={steps - 1}", "--microbatches=8", "--micro_batch_size=4",
           "--pp=2", f"--schedule={schedule}", f"--chunks={SCHEDULES[schedule]}",
           f"--steps={steps}", f"--output_dir={out_dir}", f"--name={name}"]
    _, _, lines, load_before, load_after = bc.run_train_gpt(cmd, out_dir, name, 1200, 2000)
    # 1-based steps 3 .. steps-1: unobserved in "observers_off", observed
    # (not traced) in "every_step_observed".
    middle = [l["step_s"] for l in lines if 3 <= l["step"] <= steps - 1]
    return cmd, load_before, load_after, {
        "median_step_s": statistics.median(middle),
        "min_step_s": min(middle),
        "steps_used": len(middle),
        "step_s": [l["step_s"] for l in lines],
        "observed_steps": [l["step"] for l in lines if "bubble" in l],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train_gpt", required=True)
    ap.add_argument("--commit", default="")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    nproc = os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for schedule in SCHEDULES:
                order = list(LOG_INTERVAL)
                if pair % 2 == 1:
                    order.reverse()
                for variant in order:
                    name = f"{variant}_{schedule}_{pair}"
                    cmd, l0, l1, figures = run(args.train_gpt, variant, schedule, args.steps, tmp,
                                               name)
                    # pipe-result/1 (bench/results/README.md).
                    record = {
                        "date": bc.utc_seconds(),
                        "bench": "observer_overhead", "variant": variant,
                        "schedule": schedule, "pair": pair, "commit": args.commit,
                        "load_before": [round(x, 2) for x in l0],
                        "load_after": [round(x, 2) for x in l1],
                        "command": " ".join(cmd), **figures,
                        "machine": {"nproc": nproc,
                                    "loadavg": f"{l0[0]:.2f} (before) .. {l1[0]:.2f} (after)",
                                    "cpu_model": CPU_MODEL},
                    }
                    bc.append_record(args.out, record)
                    print(f"{schedule} pair {pair} {variant}: median step "
                          f"{figures['median_step_s']:.4f} s (load {l0[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
