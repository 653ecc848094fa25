"""PyTorch's ZeRO-1 on Gloo (issue #39's peer): the peer GPT
(bench/peer_gpt.py's PeerGpt) trained data-parallel with
DistributedDataParallel over --dp ranks, once with torch.optim.AdamW on every
rank and once with torch.distributed.optim.ZeroRedundancyOptimizer(AdamW),
which keeps each parameter's AdamW state on one rank only and broadcasts the
updated parameters. DeepSpeed 0.14.1's ZeRO-1 does not run here (it needs
Gloo's _allgather_base, which Debian's torch 1.13 lacks), so this is the peer
that does.

Per mode, rank 0 prints one line `RESULT {json}`: every rank's optimizer
state in bytes (the state tensors' storage, as pipe measures its own), the
median step time after warm-up, the losses, the torch version. Each rank runs
one thread; Gloo over loopback; AdamW without weight decay or clipping, fp32.

  OMP_NUM_THREADS=1 VENV/bin/python bench/torch_zero1_peer.py --dp=2 --mode=zero1
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from peer_gpt import PeerGpt, add_training_arguments, batch

VOCAB = 256


def state_bytes(optimizer):
    """Bytes of the optimizer's state tensors, each storage once."""
    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    seen, total = set(), 0
    for state in inner.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.numel() > 1:
                storage = value.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
    return total


def worker(rank, args, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.master_port))
    dist.init_process_group("gloo", rank=rank, world_size=args.dp)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = DistributedDataParallel(
        PeerGpt(VOCAB, args.width, args.layers, args.heads, args.context))
    if args.mode == "zero1":
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                            lr=1e-3, weight_decay=0.0)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        # This rank's share of the global batch: micro-batches dealt round robin.
        for mb in range(args.microbatches * args.dp):
            ids, labels = batch(gen, args.micro_batch_size, args.context, VOCAB)
            if mb % args.dp != rank:
                continue
            last = mb // args.dp == args.microbatches - 1
            ctx = model.no_sync() if not last else contextlib.nullcontext()
            with ctx:
                logits = model(ids)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
                (loss / args.microbatches).backward()
            total += loss.item() / args.microbatches
        optimizer.step()
        elapsed = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(elapsed)
        losses.append(total)
    mine = torch.tensor([float(state_bytes(optimizer))])
    gathered = [torch.zeros(1) for _ in range(args.dp)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        out.put({"mode": args.mode, "dp": args.dp, "torch": torch.__version__,
                 "optimizer_state_bytes_per_rank": [int(g.item()) for g in gathered],
                 "median_step_s": round(statistics.median(times), 4), "steps": len(times),
                 "first_loss_rank0": losses[0], "last_loss_rank0": losses[-1]})
    dist.destroy_process_group()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_arguments(ap, steps=10)
    ap.add_argument("--dp", type=int, default=2, help="ranks (processes) to spawn")
    ap.add_argument("--mode", choices=["adamw", "zero1"], default="zero1")
    ap.add_argument("--master_port", type=int, default=29541)
    args = ap.parse_args(argv)
    if args.dp < 1 or args.steps < 1:
        ap.error(f"--dp ({args.dp}) and --steps ({args.steps}) must be >= 1")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, out)) for r in range(args.dp)]
    for p in procs:
        p.start()
    result = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            sys.exit(f"rank exited {p.exitcode}")
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
