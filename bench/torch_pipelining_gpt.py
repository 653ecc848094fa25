"""PyTorch's own pipeline runtime (torch.distributed.pipelining, PyTorch 2.15)
training the peer GPT (issue #30): pipe's other side-by-side peer, beside
DeepSpeed's (bench/deepspeed_gpt.py).

The model is bench/peer_gpt.py's PeerGpt (byte vocabulary 256,
pre-LayerNorm nn.TransformerEncoderLayer blocks, 4x GELU MLP, no dropout,
causal mask, learned positions, final LayerNorm, LM head tied to the token
embedding), built whole on every rank from one seed, so every rank's slice
starts from the same weights; each rank keeps the layers of its stages. Loss
is the mean cross-entropy of a micro-batch; the schedule's scale_grads divides
the accumulated gradients by the number of micro-batches (DeepSpeed's 1/GAS).
AdamW without weight decay or clipping, fp32, Gloo, one thread per rank.
Data: rows in arithmetic progression mod 256, like pipe's synthetic source.

Stages: --schedule picks the class and how many stages a rank holds. 1F1B and
GPipe: one stage per rank. Interleaved1F1B, InterleavedZeroBubble: 2 per rank,
loop placement (rank r holds stages r and r + pp). ZBVZeroBubble, DualPipeV: 2
per rank, V placement (rank r holds r and 2 pp - 1 - r). The blocks split
evenly over the stages, the embedding going with stage 0 and the final
LayerNorm and head with the last; when the blocks do not divide evenly, the
units [embedding, block 0, ..., final LayerNorm + head] are split as evenly as
possible instead (the overhead benchmark's 2 blocks over 4 stages: one unit
each). Shapes are static (hand-built PipelineStage with example tensors).

Tied embedding: torch.distributed.pipelining does not tie weights across
stages, so the last stage holds its own copy of the embedding matrix for the
head (set from stage 0's at start), and after each schedule step the two
gradients are summed, by an all-reduce between the two ranks or a local add
when one rank holds both (V placement); each copy then takes the same AdamW
step, so they stay equal. This is what DeepSpeed's TiedLayerSpec does.

Spawns its own --pp ranks (torch.multiprocessing, no torchrun). Rank 0 prints
one line `RESULT {json}`: step times after warm-up, median, tokens/s, losses,
CPU time per step over all ranks, the torch version.

  OMP_NUM_THREADS=1 VENV/bin/python bench/torch_pipelining_gpt.py --schedule=ZBVZeroBubble
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from peer_gpt import PeerGpt, add_training_arguments, batch

VOCAB = 256


def schedules():
    """name -> (schedule class, stages per rank, placement)."""
    from torch.distributed.pipelining import schedules as s
    return {
        "1F1B": (s.Schedule1F1B, 1, "loop"),
        "GPipe": (s.ScheduleGPipe, 1, "loop"),
        "Interleaved1F1B": (s.ScheduleInterleaved1F1B, 2, "loop"),
        "InterleavedZeroBubble": (s.ScheduleInterleavedZeroBubble, 2, "loop"),
        "ZBVZeroBubble": (s.ScheduleZBVZeroBubble, 2, "v"),
        "DualPipeV": (s.ScheduleDualPipeV, 2, "v"),
    }


SCHEDULE_NAMES = ("1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble",
                  "DualPipeV")


def stages_of_rank(rank, pp, per_rank, placement):
    if per_rank == 1:
        return [rank]
    if placement == "loop":
        return [rank + k * pp for k in range(per_rank)]
    return [rank, 2 * pp - 1 - rank]


def split_units(layers, num_stages):
    """Per stage, (has embedding, [block indices], has head)."""
    if layers % num_stages == 0:
        per = layers // num_stages
        return [(s == 0, list(range(s * per, (s + 1) * per)), s == num_stages - 1)
                for s in range(num_stages)]
    units = ["embedding"] + list(range(layers)) + ["head"]
    if len(units) < num_stages:
        raise SystemExit(f"{layers} blocks cannot fill {num_stages} stages")
    bounds = [round(s * len(units) / num_stages) for s in range(num_stages + 1)]
    parts = [units[bounds[s]:bounds[s + 1]] for s in range(num_stages)]
    return [("embedding" in p, [u for u in p if isinstance(u, int)], "head" in p) for p in parts]


class StageModule(nn.Module):
    """One stage's slice of a PeerGpt (shares its parameters; the head gets
    its own copy of the embedding matrix, see the module comment)."""

    def __init__(self, gpt, first, blocks, last):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok, self.pos = gpt.tok, gpt.pos
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        self.register_buffer("causal", gpt.causal, persistent=False)
        if last:
            self.norm = gpt.norm
            self.head = nn.Parameter(gpt.tok.detach().clone())

    def forward(self, x):
        if self.first:
            x = F.embedding(x, self.tok) + self.pos[:x.shape[1]]
        mask = self.causal[:x.shape[1], :x.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=mask)
        if self.last:
            x = F.linear(self.norm(x), self.head)
        return x


def lm_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def train(args):
    from torch.distributed.pipelining import PipelineStage
    dist.init_process_group("gloo")
    rank, pp = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    cls, per_rank, placement = schedules()[args.schedule]
    num_stages = pp * per_rank
    units = split_units(args.layers, num_stages)
    owner = {s: r for r in range(pp) for s in stages_of_rank(r, pp, per_rank, placement)}
    mine = stages_of_rank(rank, pp, per_rank, placement)

    torch.manual_seed(args.seed)
    gpt = PeerGpt(VOCAB, args.width, args.layers, args.heads, args.context)
    modules = {s: StageModule(gpt, *units[s]) for s in mine}
    first, last = owner[0], owner[num_stages - 1]
    embedding = modules[0].tok if 0 in modules else None
    head = modules[num_stages - 1].head if num_stages - 1 in modules else None
    tie_group = dist.new_group(sorted({first, last})) if first != last else None

    def sum_tied_gradients():
        if first == last:
            if rank == first:
                total = embedding.grad + head.grad
                embedding.grad.copy_(total)
                head.grad.copy_(total)
        elif rank in (first, last):
            dist.all_reduce((embedding if rank == first else head).grad, group=tie_group)

    # The example activation must require grad, or no gradient is sent back.
    act = torch.empty(args.micro_batch_size, args.context, args.width, requires_grad=True)
    stages = []
    for s in mine:
        inp = torch.zeros(args.micro_batch_size, args.context, dtype=torch.long) if s == 0 else act
        out = torch.empty(args.micro_batch_size, args.context, VOCAB) if s == num_stages - 1 else act
        stages.append(PipelineStage(modules[s], s, num_stages, torch.device("cpu"),
                                    input_args=(inp,), output_args=(out,)))
    schedule = cls(stages[0] if per_rank == 1 else stages, n_microbatches=args.microbatches,
                   loss_fn=lm_loss, scale_grads=True)
    params = [p for s in mine for p in modules[s].parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)

    gen = torch.Generator().manual_seed(args.seed)  # every rank draws the same rows
    seconds, cpu_seconds, losses = [], [], []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        mbs = [batch(gen, args.micro_batch_size, args.context, VOCAB)
               for _ in range(args.microbatches)]
        optimizer.zero_grad(set_to_none=True)
        mb_losses = []
        schedule.step(arg_mbs=[(x,) for x, _ in mbs] if 0 in mine else None,
                      target_mbs=[y for _, y in mbs] if last == rank else None,
                      losses=mb_losses if last == rank else None, return_outputs=False)
        sum_tied_gradients()
        optimizer.step()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        losses.append(sum(l.detach().item() for l in mb_losses) / args.microbatches if mb_losses else 0.0)
        if step >= args.warmup:
            seconds.append(elapsed)
            cpu_seconds.append(cpu)
    loss_tensor = torch.tensor(losses, dtype=torch.float64)
    dist.broadcast(loss_tensor, src=last)
    cpu_sum = torch.tensor([statistics.median(cpu_seconds)], dtype=torch.float64)
    dist.all_reduce(cpu_sum)
    if rank == 0:
        tokens = args.micro_batch_size * args.microbatches * args.context
        median = statistics.median(seconds)
        print("RESULT " + json.dumps({
            "system": "pytorch_pipelining", "torch": torch.__version__,
            "schedule": args.schedule, "pp": pp, "stages": num_stages,
            "tokens_per_step": tokens, "step_s": seconds, "median_step_s": median,
            "tokens_per_s": tokens / median, "cpu_s_per_step": float(cpu_sum[0]),
            "loss_first": float(loss_tensor[0]), "loss_last": float(loss_tensor[-1]),
            "threads": [torch.get_num_threads()]}), flush=True)
    dist.destroy_process_group()


def spawned(local_rank, args):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.pp))
    train(args)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedule", default="1F1B", choices=SCHEDULE_NAMES)
    ap.add_argument("--pp", type=int, default=2, help="ranks (processes) to spawn")
    add_training_arguments(ap, steps=10)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--master_port", type=int, default=29531)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.pp < 2:
        ap.error(f"--steps ({args.steps}) must be >= 1, --warmup ({args.warmup}) >= 0 and "
                 f"--pp ({args.pp}) >= 2")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.master_port)
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(args,), nprocs=args.pp, join=True)


if __name__ == "__main__":
    main(sys.argv[1:])
