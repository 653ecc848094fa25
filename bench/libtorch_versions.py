#!/usr/bin/env python3
"""libtorch_versions: the same sources built against two LibTorch versions
(issue #43: Debian's 1.13 with OpenBLAS against a 2.x with MKL and oneDNN),
run alternately on the peer GPT at pp = 1 and pp = 2 (1F1B), in fp32 and bf16.

    ./bazelw build //experiments:train_gpt && cp -L bazel-bin/experiments/train_gpt /tmp/tg113
    ./bazelw build --config=torch2 //experiments:train_gpt    # (or --config=cuda)
    bench/libtorch_versions.py --workspace . --binary 1.13=/tmp/tg113 \\
        --binary 2.11=bazel-bin/experiments/train_gpt --commit $(git rev-parse --short HEAD) \\
        --out bench/results/libtorch_versions.jsonl

A binary runs from --workspace (its configs); one that links shared libraries
from Bazel's output tree runs from the tree it was built in. Every
configuration (pp, precision) runs once per version per repetition, the
versions' order alternating between repetitions, so machine load hits both.
Figures per run (one pipe-result/1 record each): the median `step_s` of
metrics.jsonl over steps 2..N (step 1 warms up), tokens/s from it, the last
loss, and the BLAS line the launcher prints (the BLAS, its kernel, the CPU).
"""

import argparse
import os
import re
import statistics
import tempfile

import bench_common as bc

PEER = (bc.PEER_GPT_SHAPE + ",optimizer.max_grad_norm=0,lr_schedule.name=constant,eval_interval=0,"
        "sample_tokens=0,log_interval=1")
TOKENS_PER_STEP = 4 * 8 * 128  # micro-batch 4, 8 micro-batches, context 128


def run(binary, workspace, pp, precision, steps, out_dir, name):
    cmd = [binary, "--config=experiments/configs/gpt_small_pp2.textproto", f"--set={PEER}",
           "--microbatches=8", "--micro_batch_size=4", f"--pp={pp}", "--schedule=1f1b",
           f"--precision={precision}", f"--steps={steps}", f"--output_dir={out_dir}",
           f"--name={name}"]
    cwd = os.getcwd()
    os.chdir(workspace)
    try:
        proc, _, lines, load_before, load_after = bc.run_train_gpt(cmd, out_dir, name, 1800, 2000)
    finally:
        os.chdir(cwd)
    blas = re.search(r"(BLAS [^\n]*)", proc.stdout + proc.stderr)
    measured = [l["step_s"] for l in lines if l["step"] >= 2]
    step_s = statistics.median(measured)
    figures = {"median_step_s": step_s, "tokens_per_s": TOKENS_PER_STEP / step_s,
               "step_s": [l["step_s"] for l in lines], "last_loss": lines[-1]["loss"],
               "blas": blas.group(1) if blas else "not printed"}
    return cmd, load_before, load_after, figures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", action="append", required=True, metavar="LABEL=PATH",
                    help="a train_gpt build and its label; give two (or more)")
    ap.add_argument("--workspace", action="append", metavar="LABEL=DIR", default=[],
                    help="where LABEL's binary runs (default: this folder)")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    binaries = dict(b.split("=", 1) for b in args.binary)
    workspaces = dict(w.split("=", 1) for w in args.workspace)
    if len(binaries) < 2:
        ap.error("--binary: give at least two LABEL=PATH")
    run_id = bc.utc_now().strftime("libtorch_versions-%Y%m%dT%H%MZ")
    labels = list(binaries)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repetitions):
            order = labels if rep % 2 == 0 else list(reversed(labels))
            for pp in (1, 2):
                for precision in ("fp32", "bf16"):
                    for label in order:
                        name = f"{label}_pp{pp}_{precision}_{rep}".replace(".", "_")
                        binary = os.path.abspath(binaries[label])
                        workspace = os.path.abspath(workspaces.get(label, "."))
                        cmd, before, after, figures = run(binary, workspace, pp, precision,
                                                          args.steps, tmp, name)
                        print(f"{label:6} pp{pp} {precision}: {figures['tokens_per_s']:7.0f} "
                              f"tokens/s, loss {figures['last_loss']:.4f}, {figures['blas']}")
                        bc.append_record(args.out, {
                            "schema": "pipe-result/1", "bench": "libtorch_versions",
                            "date": bc.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "commit": args.commit, "run": run_id,
                            "machine": {"nproc": os.cpu_count(), "cpu_model": bc.cpu_model(),
                                        "loadavg": f"{before[0]:.2f} -> {after[0]:.2f}"},
                            "command": " ".join(cmd),
                            "config": f"{label} pp{pp} {precision} rep{rep}",
                            "figures": dict(figures, libtorch=label, pp=pp,
                                            precision=precision, repetition=rep)})


if __name__ == "__main__":
    main()
