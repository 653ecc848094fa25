"""PyTorch's own tensor parallelism (DTensor, torch.distributed.tensor.parallel,
PyTorch 2.15) training pipe's GPT (issue #38): the peer of pipe's Megatron-style
tp, alone (pp = 1) or under torch.distributed.pipelining (pp > 1).

The model is pipe's GPT (models/gpt) in nn modules, so that DTensor's styles
apply: token and position nn.Embedding, pre-LayerNorm blocks (eps 1e-5) with
separate q, k, v nn.Linear projections (k without bias, as pipe: GPT-2's key
bias only adds a constant per query row, which softmax ignores), scores scaled
by 1/sqrt(head width) with a causal mask, exact GELU 4x MLP, final LayerNorm,
and an LM head tied to the token table. Vocabulary 260 (pipe's byte
tokenizer), no dropout, fp32, Gloo, one thread per rank.

Weights: --hf_dir loads a GPT2LMHeadModel folder (make_hf below writes one;
Conv1D weights transposed into the Linears, c_attn cut into q, k, v), the
folder pipe's `hf_convert import --model=gpt2` reads, so both start alike.
Without it every rank draws the whole model from --seed.

Data: pipe's synthetic source (data.source synthetic,
models/data/synthetic_lm_data.cc, counter_rng.h) reproduced bit for bit:
global row r of step s (0-based) is an arithmetic progression mod 256 whose
start and stride 1-7 come from SplitMix64 seeded by (seed, s, r); micro-batch
m holds rows m*b .. m*b+b-1. The loss is pipe's: the mean over the step's
micro-batches of each one's mean token cross-entropy; gradients are those of
that mean. AdamW (torch.optim.AdamW, decoupled weight decay on every
parameter as LibTorch's), constant lr, and pipe's clipping: the global norm
over every stage and tp rank (a parameter whole on every tp rank counted
once, a shard once per shard, the tied table once), scaled by
max_norm / (norm + 1e-6) when that is below 1.

Parallel plan on a (pp, tp) DeviceMesh (rank = stage * tp + tp index, pipe's
order), Megatron's, as torchtitan writes it:
  token embedding   RowwiseParallel (vocabulary rows; output all-reduced, or
                    reduce-scattered along the sequence with --sequence_parallel)
  q, k, v, fc_in    ColwiseParallel (heads / MLP columns)
  proj, fc_out      RowwiseParallel (output all-reduced or reduce-scattered)
  LM head           ColwiseParallel over the vocabulary, output kept sharded;
                    the loss is loss_parallel's cross-entropy on the shards
                    (DTensor.from_local of the local logits, Shard(2))
  --sequence_parallel: ln1, ln2, the final norm and the position embedding
                    SequenceParallel (replicated weights, input sharded along
                    the sequence, weight gradients summed by DTensor);
                    the head all-gathers the sequence.
  attention, MLP    PrepareModuleInput: the input as one Replicate DTensor
                    (all-gathered along the sequence under
                    --sequence_parallel), so q, k, v share one input-gradient
                    reduction, as pipe's fused qkv projection does.
The head's weight is the token table's Parameter (re-tied after
parallelize_module; both are Shard(0) of the vocabulary). Under pipelining
(pp > 1): PipelineStage with static shapes on the mesh's pp group, one
stage per rank, Schedule1F1B (scale_grads: the mean over micro-batches); the
blocks split evenly, the embedding with stage 0, the final norm and head with
the last, which holds its own copy of the table (set from stage 0's), the two
gradients summed over the pp group after each step, as DeepSpeed's
TiedLayerSpec and pipe do. With sequence parallelism each rank sends only its
sequence slice to the next stage, as pipe.

Spawns its own pp x tp ranks (torch.multiprocessing + Gloo, no torchrun).
Rank 0 prints one line `RESULT {json}`: per-step losses, step times after
--warmup, the median, tokens/s, and with --profile_step, per rank, the last
step's Gloo collectives from torch.profiler, in all and per forward and
backward action (collective_times).

  OMP_NUM_THREADS=1 VENV/bin/python bench/torch_tp_gpt.py --tp=2 --sequence_parallel
  VENV/bin/python bench/torch_tp_gpt.py make_hf DIR --width=32 --heads=4 --layers=2 --context=16
  VENV/bin/python bench/torch_tp_gpt.py check_hf DIR     # this model's logits == transformers'
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB = 260  # pipe's ByteTokenizer::kVocabSize (models/data/tokenizer.h)
SYNTHETIC_VOCAB = 256  # synthetic tokens are bytes (SyntheticLmOptions.vocab)
MAX_STRIDE = 7
MASK64 = (1 << 64) - 1


# ---- pipe's synthetic data (models/data/counter_rng.h, synthetic_lm_data.cc) ----

def _mix(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class CounterRng:
    def __init__(self, seed, step, index):
        self.state = _mix(_mix(_mix(seed) ^ step) ^ ((index + 0x632BE59BD9B4E019) & MASK64))

    def below(self, n):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        return _mix(self.state) % n


def synthetic_microbatch(seed, step, index, rows, time_steps):
    """pipe's SyntheticLmBatchSource::AtGlobalIndex(step, index): (input_ids, labels)."""
    tokens = []
    for i in range(rows):
        rng = CounterRng(seed, step, index * rows + i)
        start = rng.below(SYNTHETIC_VOCAB)
        stride = 1 + rng.below(MAX_STRIDE)
        tokens.append([(start + j * stride) % SYNTHETIC_VOCAB for j in range(time_steps + 1)])
    t = torch.tensor(tokens, dtype=torch.long)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


# ---- the model ----

class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.head_width = width // heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)  # this rank's heads under tp
        b, t, local = q.shape
        h = local // self.head_width

        def heads(y):
            return y.view(b, t, h, self.head_width).transpose(1, 2)

        scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(self.head_width)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.proj((probs @ heads(v)).transpose(1, 2).reshape(b, t, local))


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc_in = nn.Linear(width, 4 * width)
        self.fc_out = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.fc_out(F.gelu(self.fc_in(x)))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = Mlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Positions(nn.Module):
    """The position table as a module of its own, so SequenceParallel can
    replicate it and shard its input (position ids [1, T or T / tp])."""

    def __init__(self, context, width):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(context, width))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class Embed(nn.Module):
    def __init__(self, width, context):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = Positions(context, width)
        self.sequence_slice = None  # (start, length) under sequence parallelism

    def forward(self, ids):
        start, length = self.sequence_slice or (0, ids.shape[1])
        return self.tok(ids) + self.pos(torch.arange(start, start + length).unsqueeze(0))


class Head(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.lm = nn.Linear(width, VOCAB, bias=False)

    def forward(self, x):
        return self.lm(self.norm(x))


class Gpt(nn.Module):
    def __init__(self, width, heads, layers, context):
        super().__init__()
        self.embed = Embed(width, context)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = Head(width)
        with torch.no_grad():  # GPT-2's N(0, 0.02) tables, as pipe draws them
            self.embed.tok.weight.normal_(0.0, 0.02)
            self.embed.pos.weight.normal_(0.0, 0.02)
        self.head.lm.weight = self.embed.tok.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def load_hf(gpt, folder, layers, width):
    """A GPT2LMHeadModel folder's tensors into `gpt` (pipe's models/gpt/gpt_hf.cc mapping)."""
    from safetensors.torch import load_file
    t = load_file(os.path.join(folder, "model.safetensors"))
    get = lambda name: t.get(name, t.get("transformer." + name))  # noqa: E731
    with torch.no_grad():
        gpt.embed.tok.weight.copy_(get("wte.weight"))
        gpt.embed.pos.weight.copy_(get("wpe.weight"))
        for i in range(layers):
            h, b = f"h.{i}.", gpt.blocks[i]
            for ln, hf in ((b.ln1, "ln_1"), (b.ln2, "ln_2")):
                ln.weight.copy_(get(h + hf + ".weight"))
                ln.bias.copy_(get(h + hf + ".bias"))
            qkv_w, qkv_b = get(h + "attn.c_attn.weight").t(), get(h + "attn.c_attn.bias")
            b.attn.q.weight.copy_(qkv_w[:width])
            b.attn.k.weight.copy_(qkv_w[width:2 * width])
            b.attn.v.weight.copy_(qkv_w[2 * width:])
            b.attn.q.bias.copy_(qkv_b[:width])
            b.attn.v.bias.copy_(qkv_b[2 * width:])  # the key bias is dropped (see above)
            b.attn.proj.weight.copy_(get(h + "attn.c_proj.weight").t())
            b.attn.proj.bias.copy_(get(h + "attn.c_proj.bias"))
            b.mlp.fc_in.weight.copy_(get(h + "mlp.c_fc.weight").t())
            b.mlp.fc_in.bias.copy_(get(h + "mlp.c_fc.bias"))
            b.mlp.fc_out.weight.copy_(get(h + "mlp.c_proj.weight").t())
            b.mlp.fc_out.bias.copy_(get(h + "mlp.c_proj.bias"))
        gpt.head.norm.weight.copy_(get("ln_f.weight"))
        gpt.head.norm.bias.copy_(get("ln_f.bias"))


# ---- tensor parallelism ----

def parallelize(gpt, tp_mesh, sequence_parallel, with_embed, blocks, with_head):
    """DTensor's plan (module docstring) on the parts this rank holds."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    residual = Shard(1) if sequence_parallel else Replicate()
    if with_embed:
        plan = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)}
        if sequence_parallel:
            plan["pos"] = SequenceParallel(use_local_output=True)
            size, rank = tp_mesh.size(), tp_mesh.get_local_rank()
            length = gpt.embed.pos.weight.shape[0] // size
            gpt.embed.sequence_slice = (rank * length, length)
        parallelize_module(gpt.embed, tp_mesh, plan)
    for i in blocks:
        # The attention's and the MLP's input becomes one Replicate DTensor
        # (all-gathered along the sequence under sequence parallelism), so q, k
        # and v share it and its gradient is reduced once, not once per
        # projection (torchtitan's plan).
        whole = PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),))
        plan = {"attn": whole, "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=residual),
                "mlp": whole, "mlp.fc_in": ColwiseParallel(),
                "mlp.fc_out": RowwiseParallel(output_layouts=residual)}
        if sequence_parallel:
            plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel()})
        parallelize_module(gpt.blocks[i], tp_mesh, plan)
    if with_head:
        plan = {"lm": ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1))}
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
        parallelize_module(gpt.head, tp_mesh, plan)


def sync_replicated_grads(params):
    """A gradient DTensor left Partial (summed lazily) is reduced to its
    parameter's placement, so the clipping and the optimizer see whole values."""
    from torch.distributed.tensor import DTensor
    for p in params:
        if isinstance(p, DTensor) and p.grad is not None and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(placements=p.placements)


def clip_grads(params, max_norm, tp_group, pp_group, skip=()):
    """pipe's global-norm clipping (pipeline/runtime/grad_sync.cc); returns the norm."""
    from torch.distributed.tensor import DTensor
    sharded = torch.zeros((), dtype=torch.float64)
    whole = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None or any(p is s for s in skip):
            continue
        g = p.grad
        if isinstance(g, DTensor):
            local = g.to_local().double().square().sum()
            if any(pl.is_shard() for pl in g.placements):
                sharded += local
            else:
                whole += local
        else:
            whole += g.double().square().sum()
    if tp_group is not None:
        dist.all_reduce(sharded, group=tp_group)
    total = sharded + whole
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    norm = float(total.sqrt())
    if max_norm > 0:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(coef)
    return norm


def local_tensor(t):
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


class StageModule(nn.Module):
    def __init__(self, gpt, first, blocks, last, own_head_table):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.embed = gpt.embed
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        if last:
            self.head = gpt.head
            if own_head_table:  # the tie across stages (module docstring)
                self.head.lm.weight = nn.Parameter(gpt.embed.tok.weight.detach().clone())

    def forward(self, x):
        if self.first:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.last else x


def train(args):
    # A little over 80 lines: the step closure shares the mesh, groups, stage and tied tables.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(args.threads)
    pp, tp = args.pp, args.tp
    mesh = init_device_mesh("cpu", (pp, tp), mesh_dim_names=("pp", "tp"))
    tp_mesh = mesh["tp"]
    tp_group = tp_mesh.get_group() if tp > 1 else None
    pp_group = mesh["pp"].get_group() if pp > 1 else None
    stage = rank // tp

    torch.manual_seed(args.seed)
    gpt = Gpt(args.width, args.heads, args.layers, args.context)
    if args.hf_dir:
        load_hf(gpt, args.hf_dir, args.layers, args.width)
    per = args.layers // pp
    first, last = stage == 0, stage == pp - 1
    blocks = list(range(stage * per, (stage + 1) * per))
    module = StageModule(gpt, first, blocks, last, own_head_table=pp > 1)
    if tp > 1:
        parallelize(gpt, tp_mesh, args.sequence_parallel, first, blocks, last)
        if pp == 1:  # parallelize_module made the two a Parameter each: tie them again
            gpt.head.lm.weight = gpt.embed.tok.weight
    params = list(dict.fromkeys(module.parameters()))  # the tied table once
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                                  weight_decay=args.weight_decay)
    table = module.embed.tok.weight if first and pp > 1 else None
    head_table = module.head.lm.weight if last and pp > 1 else None

    def loss_fn(logits, labels):
        if tp > 1:
            logits = DTensor.from_local(logits, tp_mesh, [Shard(2)], run_check=False)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return loss.to_local()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    local_t = args.context // tp if (args.sequence_parallel and tp > 1) else args.context
    schedule = None
    if pp > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
        act = torch.empty(args.micro_batch_size, local_t, args.width, requires_grad=True)
        inp = torch.zeros(args.micro_batch_size, args.context, dtype=torch.long) if first else act
        # A stage's output example must require grad too, or it receives no gradient.
        out = torch.empty(args.micro_batch_size, args.context, VOCAB // tp) if last else act
        pstage = PipelineStage(module, stage, pp, torch.device("cpu"), input_args=(inp,),
                               output_args=(out,), group=pp_group)
        schedule = Schedule1F1B(pstage, n_microbatches=args.microbatches, loss_fn=loss_fn,
                                scale_grads=True)
        if args.profile_step:  # Schedule1F1B marks no ranges: name each action's
            label_actions(pstage)

    def one_step(step):
        mbs = [synthetic_microbatch(args.data_seed, step, m, args.micro_batch_size, args.context)
               for m in range(args.microbatches)]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        with loss_parallel():
            if schedule is None:
                for x, y in mbs:
                    loss = loss_fn(module(x), y)
                    (loss / args.microbatches).backward()
                    total += float(loss.detach())
            else:
                mb_losses = []
                schedule.step(*([torch.cat([x for x, _ in mbs])] if first else []),
                              target=torch.cat([y for _, y in mbs]) if last else None,
                              losses=mb_losses if last else None, return_outputs=False)
                total = sum(float(l.detach()) for l in mb_losses)
        sync_replicated_grads(params)
        if pp > 1:  # the tied table: both copies take the summed gradient
            with torch.no_grad():
                tied = table if first else head_table if last else None
                if tied is not None:
                    dist.all_reduce(local_tensor(tied.grad), group=pp_group)
        norm = clip_grads(params, args.max_grad_norm, tp_group, pp_group,
                          skip=(head_table,) if head_table is not None else ())
        optimizer.step()
        return total / args.microbatches, norm

    report(args, *run_steps(args, one_step))


def run_steps(args, one_step):
    """Runs every step (one_step(step) -> (loss, grad norm)), the last one
    profiled with --profile_step: the losses, the norms, the timed steps'
    seconds and the profiled step's collective times (None unprofiled)."""
    seconds, losses, norms, comm = [], [], [], None
    for step in range(args.warmup + args.steps):
        dist.barrier()
        profiler = None
        if args.profile_step and step == args.warmup + args.steps - 1:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        start = time.perf_counter()
        loss, norm = one_step(step)
        elapsed = time.perf_counter() - start
        if profiler is not None:
            profiler.__exit__(None, None, None)
            comm = collective_times(profiler)
        losses.append(loss)
        norms.append(norm)
        if step >= args.warmup:
            seconds.append(elapsed)
    return losses, norms, seconds, comm


def report(args, losses, norms, seconds, comm):
    """Rank 0 prints the RESULT line: the last stage's losses and norms, every
    rank's collective times; then the ranks leave the process group."""
    pp, tp, rank = args.pp, args.tp, dist.get_rank()
    figures = torch.tensor([losses, norms], dtype=torch.float64)
    dist.broadcast(figures, src=(pp - 1) * tp)  # the last stage's tp rank 0 knows the loss
    comms = [None] * dist.get_world_size()
    dist.all_gather_object(comms, comm)
    if rank == 0:
        tokens = args.micro_batch_size * args.microbatches * args.context
        median = statistics.median(seconds) if seconds else 0.0
        print("RESULT " + json.dumps({
            "system": "pytorch_dtensor_tp", "torch": torch.__version__, "pp": pp, "tp": tp,
            "sequence_parallel": args.sequence_parallel,
            "schedule": "1F1B" if pp > 1 else "none", "tokens_per_step": tokens,
            "losses": figures[0].tolist(), "grad_norms": figures[1].tolist(),
            "step_s": seconds, "median_step_s": median,
            "tokens_per_s": tokens / median if median else 0.0,
            "tp_collectives_per_rank": comms if args.profile_step else None}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def label_actions(pstage):
    """Wraps the stage's forward and backward of one micro-batch in profiler
    ranges "Forward" / "Backward" (what collective_times attributes to)."""
    from torch.profiler import record_function

    def labelled(name, method):
        def run(*a, **k):
            with record_function(name):
                return method(*a, **k)
        return run

    pstage.forward_one_chunk = labelled("Forward", pstage.forward_one_chunk)
    pstage.backward_one_chunk = labelled("Backward", pstage.backward_one_chunk)


def collective_times(profiler):
    """This rank's profiled step: per collective name (Gloo's spans "gloo:*",
    enqueue to completion, and c10d's enqueue calls "c10d::*") the count and
    milliseconds; and per action kind (label_actions' "Forward" / "Backward"
    ranges; pp = 1: none) the count, mean duration and the Gloo all-reduce /
    all-gather spans that start inside it, i.e. the tensor-parallel
    collectives of that action (Gloo reduce-scatters as an all-reduce; the
    pipeline's sends and receives are gloo:send / gloo:recv, left out)."""
    events = list(profiler.events())
    step = {}
    for e in events:
        if e.name.startswith("gloo:") or e.name.startswith("c10d::"):
            cell = step.setdefault(e.name, {"count": 0, "ms": 0.0})
            cell["count"] += 1
            cell["ms"] += (e.time_range.end - e.time_range.start) / 1000.0
    ranges = [(e.name[0], e.time_range.start, e.time_range.end) for e in events
              if e.name in ("Forward", "Backward")]
    actions = {}
    for kind in ("F", "B"):
        mine = [(a, b) for k, a, b in ranges if k == kind]
        if not mine:
            continue
        tp = {}
        for e in events:
            if e.name not in ("gloo:all_reduce", "gloo:all_gather"):
                continue
            if any(a <= e.time_range.start < b for a, b in mine):
                cell = tp.setdefault(e.name, {"count": 0, "ms": 0.0})
                cell["count"] += 1
                cell["ms"] += (e.time_range.end - e.time_range.start) / 1000.0
        actions[kind] = {
            "count": len(mine),
            "mean_ms": round(sum(b - a for a, b in mine) / len(mine) / 1000.0, 3),
            "tp_collectives_per_action": {
                n: {"count": c["count"] / len(mine), "ms": round(c["ms"] / len(mine), 3)}
                for n, c in sorted(tp.items())},
            "tp_collective_ms_per_action": round(sum(c["ms"] for c in tp.values()) / len(mine), 3)}
    return {"step": {n: {"count": c["count"], "ms": round(c["ms"], 3)} for n, c in sorted(step.items())},
            "actions": actions}


def spawned(local_rank, args):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(args.pp * args.tp))
    train(args)
    # After the results are out and the groups destroyed, leave without the
    # interpreter's teardown: on Gloo a rank sometimes aborted there
    # ("terminate called without an active exception", a c10d thread still
    # joinable while static objects are destroyed), failing a finished run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def make_hf(argv):
    """A randomly initialised GPT2LMHeadModel of pipe's GPT's kind (exact GELU,
    vocabulary 260, random biases and norms so a mix-up shows), save_pretrained."""
    ap = argparse.ArgumentParser(prog="torch_tp_gpt.py make_hf")
    ap.add_argument("dir")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=a.context, n_embd=a.width, n_layer=a.layers,
                        n_head=a.heads, activation_function="gelu", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.2, 0.2) if name.endswith("bias") else p.uniform_(0.8, 1.2)
    model.save_pretrained(a.dir, safe_serialization=True)


def check_hf(argv):
    """This module's logits against transformers' on the folder: prints the
    largest difference, exits 1 above 1e-4 (the peer model is the folder's)."""
    folder = argv[0]
    from transformers import GPT2LMHeadModel
    hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    c = hf.config
    gpt = Gpt(c.n_embd, c.n_head, c.n_layer, c.n_positions)
    load_hf(gpt, folder, c.n_layer, c.n_embd)
    ids = synthetic_microbatch(1234, 0, 0, 2, c.n_positions)[0]
    with torch.no_grad():
        diff = (gpt(ids) - hf(input_ids=ids).logits).abs().max().item()
    print(f"max |peer - transformers| logits = {diff:.3g}")
    return 0 if diff < 1e-4 else 1


def main(argv):
    if argv and argv[0] == "make_hf":
        return make_hf(argv[1:])
    if argv and argv[0] == "check_hf":
        return check_hf(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--sequence_parallel", action="store_true")
    ap.add_argument("--hf_dir", default="", help="a GPT2LMHeadModel folder to start from")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=16)
    ap.add_argument("--micro_batch_size", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5, help="steps timed (after --warmup)")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0, help="weights when there is no --hf_dir")
    ap.add_argument("--data_seed", type=int, default=1234, help="pipe's `seed` (its data's)")
    # pipe's optimizer defaults (driver/config.proto), lr constant.
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--max_grad_norm", type=float, default=1.0)
    ap.add_argument("--profile_step", action="store_true",
                    help="profile the last step: Gloo collective time per rank")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--master_port", type=int, default=29541)
    args = ap.parse_args(argv)
    if args.heads % args.tp or args.layers % args.pp or (
            args.sequence_parallel and args.context % args.tp) or VOCAB % args.tp:
        ap.error("heads, the vocabulary (260) and (with --sequence_parallel) the context must "
                 "split over --tp, the layers over --pp")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.master_port)
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(args,), nprocs=args.pp * args.tp, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
