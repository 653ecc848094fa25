"""The PyTorch side of llama_small_pp2's step-time ratio (issue 28, "Measured"):
the same LLaMA-style decoder trained the way a PyTorch user writes it, in one
process, timed per step.

The model is models/llama (llama.h): token embedding (no position table) ->
N pre-RMSNorm blocks (causal grouped-query attention with rotary q and k in the
rotate-half layout, scores and softmax in fp32; SwiGLU MLP; no biases) ->
final RMSNorm -> untied Linear(width -> vocab) head, N(0, 0.02) init, norms at
one. Loss: mean next-token cross-entropy. A step is m micro-batches of forward
+ backward with loss / m, global grad-norm clipping, then AdamW (lr 1e-3,
weight decay 0.01): what train_llama does with experiments/configs/
llama_small_pp2.textproto (whose defaults these are), fp32. Data: uniform
random token ids drawn inside the step (the step's cost does not depend on
which tokens they are).

  PY=$(tools/python_env.sh torch-newest)/bin/python
  $PY bench/torch_llama_reference.py --threads=1 --steps=8

On a GPU (the GPU kit's LLaMA bench, issue #43: tools/gpu/run_on_device.sh), with
--device=cuda --precision=bf16: attention through F.scaled_dot_product_attention,
forward and loss under torch.autocast(bfloat16) with fp32 weights, and
torch.optim.AdamW(fused=True): how a PyTorch user trains in bf16 eagerly. Each
timed step ends with torch.cuda.synchronize(). Its pipe side is bench/gpu_pp1
--model=llama.

Prints a line and one JSON line last. Besides wall time per step it reports the
process's CPU time per step (time.process_time), which with one thread is the
step's own work even when other processes load the machine.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RmsNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_tables(time_, head_dim, theta, device):
    inv_freq = 1.0 / torch.pow(theta, torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    freqs = torch.outer(torch.arange(time_, device=device).float(), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    half = x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def linear(i, o):
    layer = nn.Linear(i, o, bias=False)
    nn.init.normal_(layer.weight, 0.0, 0.02)
    return layer


class Attention(nn.Module):
    def __init__(self, width, heads, kv_heads, theta):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, width // heads, theta
        self.q_proj = linear(width, heads * self.head_dim)
        self.k_proj = linear(width, kv_heads * self.head_dim)
        self.v_proj = linear(width, kv_heads * self.head_dim)
        self.o_proj = linear(heads * self.head_dim, width)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary_tables(t, self.head_dim, self.theta, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            group = self.heads // self.kv_heads
            k = k.unsqueeze(2).expand(b, self.kv_heads, group, t, self.head_dim).reshape(
                b, self.heads, t, self.head_dim)
            v = v.unsqueeze(2).expand(b, self.kv_heads, group, t, self.head_dim).reshape(
                b, self.heads, t, self.head_dim)
        if x.is_cuda:  # fused attention, as pipe's LLaMA runs it on a GPU
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores, -1, dtype=torch.float).to(q.dtype)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, width, heads, kv_heads, hidden, theta, eps):
        super().__init__()
        self.input_layernorm = RmsNorm(width, eps)
        self.self_attn = Attention(width, heads, kv_heads, theta)
        self.post_attention_layernorm = RmsNorm(width, eps)
        self.gate_proj, self.up_proj = linear(width, hidden), linear(width, hidden)
        self.down_proj = linear(hidden, width)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab, width, layers, heads, kv_heads, hidden, theta=10000.0, eps=1e-5):
        super().__init__()
        self.tok_embed = nn.Embedding(vocab, width)
        nn.init.normal_(self.tok_embed.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(
            [Block(width, heads, kv_heads, hidden, theta, eps) for _ in range(layers)])
        self.norm = RmsNorm(width, eps)
        self.head = linear(width, vocab)

    def forward(self, ids):
        x = self.tok_embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def layer_costs(model, args, gen, repeats=5):
    """Median forward + backward CPU ms of each kind of layer on one micro-batch, each
    run on the previous layer's detached output, its backward from the sum of its
    output (what pipe's `profile` partitioner times: pipeline/partition/profile.cc),
    and the head again with the loss (cross-entropy) as the backward target."""
    rows = torch.randint(0, args.vocab, (args.micro_batch_size, args.context + 1), generator=gen)
    ids, labels = rows[:, :-1], rows[:, 1:]

    def timed(fn):
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            c0 = time.process_time()
            fn()
            times.append(1e3 * (time.process_time() - c0))
        return statistics.median(times)

    x = model.tok_embed(ids).detach().requires_grad_()
    h = model.blocks[0](x).detach().requires_grad_()
    n = model.norm(h).detach().requires_grad_()
    return {
        "embedding_ms": timed(lambda: model.tok_embed(ids).sum().backward()),
        "block_ms": timed(lambda: model.blocks[0](x).sum().backward()),
        "final_norm_ms": timed(lambda: model.norm(h).sum().backward()),
        "head_ms": timed(lambda: model.head(n).sum().backward()),
        "head_with_loss_ms": timed(lambda: F.cross_entropy(
            model.head(n).reshape(-1, args.vocab), labels.reshape(-1)).backward()),
    }


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--micro_batch_size", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layer_costs", action="store_true",
                    help="also time each kind of layer alone (forward + backward, CPU ms)")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads (torch.set_num_threads); 0 = PyTorch's default")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="bf16: forward and loss under torch.autocast(bfloat16)")
    ap.add_argument("--fused_adamw", type=int, default=None,
                    help="torch.optim.AdamW(fused=...): 1 or 0; default 1 on cuda, 0 on cpu")
    args = ap.parse_args(argv)
    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device={args.device} is not known; valid: cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device=cuda, but torch sees no CUDA device")
    fused = (args.device == "cuda") if args.fused_adamw is None else bool(args.fused_adamw)
    if args.steps < 1 or args.warmup < 0:
        ap.error(f"--steps ({args.steps}) must be >= 1 and --warmup ({args.warmup}) >= 0")
    if args.heads % args.kv_heads or args.width % args.heads:
        ap.error(f"--kv_heads ({args.kv_heads}) must divide --heads ({args.heads}), "
                 f"which must divide --width ({args.width})")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = Llama(args.vocab, args.width, args.layers, args.heads, args.kv_heads, args.intermediate)
    model.to(args.device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                                  **({"fused": True} if fused else {}))
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    seconds, cpu_seconds, losses = [], [], []
    for s in range(args.warmup + args.steps):
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=args.device)
        for _ in range(args.microbatches):
            rows = torch.randint(0, args.vocab, (args.micro_batch_size, args.context + 1),
                                 generator=gen).to(args.device, non_blocking=True)
            ids, labels = rows[:, :-1], rows[:, 1:]
            with autocast:
                logits = model(ids)
                loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), labels.reshape(-1))
            (loss / args.microbatches).backward()
            total += loss.detach() / args.microbatches
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(total)
        sync()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        losses.append(loss_value)
        if s >= args.warmup:
            seconds.append(elapsed)
            cpu_seconds.append(cpu)
    costs = layer_costs(model, args, gen) if args.layer_costs else None
    tokens = args.microbatches * args.micro_batch_size * args.context
    median = statistics.median(seconds)
    print(f"PyTorch {torch.__version__} LLaMA reference, {torch.get_num_threads()} thread(s): "
          f"median step {median:.4f} s (min {min(seconds):.4f}, CPU "
          f"{statistics.median(cpu_seconds):.4f})  {tokens / median:.1f} tokens/s  "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(json.dumps({
        "bench": "torch_llama_reference", "system": "pytorch", "torch": torch.__version__,
        "model": "llama", "device": args.device, "precision": args.precision,
        "fused_adamw": fused,
        "vocab": args.vocab, "width": args.width, "layers": args.layers, "heads": args.heads,
        "kv_heads": args.kv_heads, "intermediate": args.intermediate, "context": args.context,
        "micro_batch_size": args.micro_batch_size, "microbatches": args.microbatches,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_per_step": tokens, "step_s": seconds, "median_step_s": median,
        "step_cpu_s": cpu_seconds, "median_step_cpu_s": statistics.median(cpu_seconds),
        "tokens_per_s": tokens / median, "loss_first": losses[0], "loss_last": losses[-1],
        "intra_op_threads": torch.get_num_threads(), "layer_costs_cpu_ms": costs}))


if __name__ == "__main__":
    main(sys.argv[1:])
