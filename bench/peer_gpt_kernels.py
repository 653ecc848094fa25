"""The peer GPT's forward + backward per micro-batch in PyTorch (Python), timed
by this thread's CPU time: the Python side of bench_gpt_kernels (issue #16).

The model is peer_gpt.py's, the one ../shared/peers/README.md describes, built from
PyTorch's own modules: byte vocabulary (256), width 256, 8 pre-LayerNorm
`nn.TransformerEncoderLayer`s (4 heads, MLP 4x, GELU, no dropout, causal float
mask), learned positions, final LayerNorm, LM head tied to the token embedding;
micro-batches of 4 sequences of 128 tokens in arithmetic progression mod 256.
With one intra-op and one BLAS thread every kernel runs on this thread, so
`time.thread_time` is the kernels' cost (plus Python's) even on a loaded
machine. Compare with bench_gpt_kernels by running the two alternately:

  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 bench/peer_gpt_kernels.py --reps 30
  bazel-bin/bench/bench_gpt_kernels --reps=30

--profile prints torch.autograd.profiler's operator table (self CPU time) of
--profile_reps micro-batches after the timed ones. Prints one JSON line last.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from peer_gpt import PeerGpt, batch


def step(model, ids, labels):
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    for p in model.parameters():
        p.grad = None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--micro_batch_size", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30, help="timed micro-batches after 3 warm-up ones")
    ap.add_argument("--profile", action="store_true", help="print the operator table")
    ap.add_argument("--profile_reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.profile_reps < 1:
        ap.error(f"--reps ({args.reps}) and --profile_reps ({args.profile_reps}) must be >= 1")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = PeerGpt(args.vocab, args.width, args.layers, args.heads, args.context)
    model.train()
    cpu, wall = [], []
    for i in range(args.reps + 3):
        ids, labels = batch(gen, args.micro_batch_size, args.context, args.vocab)
        c0, t0 = time.thread_time(), time.perf_counter()
        step(model, ids, labels)
        c1, t1 = time.thread_time(), time.perf_counter()
        if i >= 3:
            cpu.append(c1 - c0)
            wall.append(t1 - t0)
    if args.profile:
        ids, labels = batch(gen, args.micro_batch_size, args.context, args.vocab)
        with torch.autograd.profiler.profile() as prof:
            for _ in range(args.profile_reps):
                step(model, ids, labels)
        print(f"operators over {args.profile_reps} micro-batches (self CPU time, profiled):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45))
    print(f"PyTorch peer GPT F+B per micro-batch (1 intra-op thread, {args.reps} reps)")
    print(f"  wall  median {1e3 * statistics.median(wall):.2f} ms  min {1e3 * min(wall):.2f} ms")
    print(f"  cpu   median {1e3 * statistics.median(cpu):.2f} ms  min {1e3 * min(cpu):.2f} ms")
    print(json.dumps({"bench": "peer_gpt_kernels", "torch": torch.__version__,
                      "cpu_ms_median": 1e3 * statistics.median(cpu), "cpu_ms_min": 1e3 * min(cpu),
                      "wall_ms_median": 1e3 * statistics.median(wall), "reps": args.reps}))


if __name__ == "__main__":
    main(sys.argv[1:])
