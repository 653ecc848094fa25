"""DeepSpeed 0.14.1 pipeline-engine driver for the peer GPT (issue #16).

Run by bench/bench_vs_deepspeed.py through DeepSpeed's own launcher
(`deepspeed --num_gpus <pp> deepspeed_gpt.py ...`) with DS_ACCELERATOR=cpu, so
pipe and DeepSpeed train the same model on the same data of the same kind:

  byte vocabulary (256), width 256, 8 pre-LayerNorm blocks (4 heads, MLP 4x,
  GELU, no dropout, causal), learned positions, final LayerNorm, LM head tied
  to the token embedding; 8 micro-batches of 4 sequences of 128 tokens; AdamW
  without weight decay or clipping; fp32; Gloo.

Data: rows of tokens in arithmetic progression modulo 256 (start and stride
1-7 random from a seed), what pipe's data.source=synthetic draws.

Prints one line `RESULT {json}` on rank 0: the step times after warm-up, their
median and tokens/s.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import deepspeed
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

VOCAB = 256


class TokenEmbedding(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(0.02 * torch.randn(VOCAB, width))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


def tied_head(embedding, hidden):
    """The LM head reuses the embedding matrix: logits = h E^T."""
    return hidden @ embedding.weight.t()


class Positions(nn.Module):
    def __init__(self, context, width):
        super().__init__()
        self.table = nn.Parameter(0.02 * torch.randn(context, width))

    def forward(self, x):
        return x + self.table[: x.size(1)]


class CausalBlock(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(
            d_model=width, nhead=heads, dim_feedforward=4 * width, dropout=0.0,
            activation="gelu", batch_first=True, norm_first=True)
        mask = torch.full((context, context), float("-inf")).triu(1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x):
        t = x.size(1)
        return self.block(x, src_mask=self.causal[:t, :t])


def lm_loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def progression_batch(generator, rows, length):
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    stride = torch.randint(1, 8, (rows, 1), generator=generator)
    tokens = (start + stride * torch.arange(length + 1)) % VOCAB
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--micro_batch_size", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--intra_op_threads", type=int, default=1)
    parser.add_argument("--partition", default="type:CausalBlock")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--local_rank", type=int, default=-1)  # set by the launcher
    args = parser.parse_args()

    torch.set_num_threads(args.intra_op_threads)
    torch.manual_seed(args.seed)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()

    specs = [TiedLayerSpec("embedding", TokenEmbedding, args.width),
             LayerSpec(Positions, args.context, args.width)]
    specs += [LayerSpec(CausalBlock, args.width, args.heads, args.context)
              for _ in range(args.layers)]
    specs += [LayerSpec(nn.LayerNorm, args.width),
              TiedLayerSpec("embedding", TokenEmbedding, args.width, forward_fn=tied_head)]
    model = PipelineModule(layers=specs, num_stages=args.stages, loss_fn=lm_loss,
                           partition_method=args.partition, activation_checkpoint_interval=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer,
        config={"train_micro_batch_size_per_gpu": args.micro_batch_size,
                "gradient_accumulation_steps": args.microbatches,
                "steps_per_print": 1 << 30})

    generator = torch.Generator().manual_seed(args.seed)

    def batches():
        while True:
            yield progression_batch(generator, args.micro_batch_size, args.context)

    data = batches()
    seconds, cpu_seconds, losses = [], [], []
    for step in range(args.warmup + args.steps):
        torch.distributed.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        loss = engine.train_batch(data_iter=data)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        losses.append(float(loss))
        if step >= args.warmup:
            seconds.append(elapsed)
            cpu_seconds.append(cpu)
    # CPU time of every rank's process (all its threads), summed over ranks:
    # comparable on a loaded machine, where wall time is not.
    cpu_sum = torch.tensor([statistics.median(cpu_seconds)], dtype=torch.float64)
    torch.distributed.all_reduce(cpu_sum)
    tokens = args.micro_batch_size * args.microbatches * args.context
    if rank == 0:
        median = statistics.median(seconds)
        print("RESULT " + json.dumps({
            "system": "deepspeed", "stages": args.stages, "tokens_per_step": tokens,
            "step_s": seconds, "median_step_s": median, "cpu_s_per_step": float(cpu_sum[0]), "tokens_per_s": tokens / median,
            "loss_first": losses[0], "loss_last": losses[-1],
            "threads": [torch.get_num_threads()]}), flush=True)


if __name__ == "__main__":
    main()
