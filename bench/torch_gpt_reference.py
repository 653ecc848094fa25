"""The PyTorch side of the GPU kit's throughput table (issue #31): the peer GPT
trained the way a PyTorch user writes it, on one device, timed per step.

The model is bench/peer_gpt.py's PeerGpt (byte vocabulary 256,
pre-LayerNorm nn.TransformerEncoderLayer blocks, 4x GELU MLP, no dropout,
causal mask, learned positions, LM head tied to the token embedding), the
model bench/gpu_pp1.cc trains with pipe's engine at pp = 1. A step is
m micro-batches of forward + backward with loss / m, then AdamW (lr 1e-3, no
weight decay, PyTorch's default implementation for the device), fp32 with TF32
off. Each step ends with torch.cuda.synchronize() (on a GPU), as gpu_pp1's
ends with a wait for the device. Data: rows in arithmetic progression mod 256,
like pipe's synthetic source (not the same rows: throughput does not depend
on them).

  python3 torch_gpt_reference.py --device=cuda --steps=20 --micro_batch_size=16

Prints a line and one JSON line last. Needs peer_gpt.py beside it or on
PYTHONPATH (tools/gpu/bundle.sh copies both into the bundle's py/).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from peer_gpt import PeerGpt, add_training_arguments, batch


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    add_training_arguments(ap, steps=20)
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads (torch.set_num_threads); 0 = PyTorch's default")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error(f"--steps ({args.steps}) must be >= 1 and --warmup ({args.warmup}) >= 0")
    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device '{args.device}' is not known; valid: cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_gpt_reference: --device=cuda but torch.cuda.is_available() is False")
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = 256
    model = PeerGpt(vocab, args.width, args.layers, args.heads, args.context).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seconds, losses = [], []
    for s in range(args.warmup + args.steps):
        # The batches are made (and copied) inside the step, as pipe's engine
        # draws its micro-batches inside Trainer::Step.
        sync()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for _ in range(args.microbatches):
            ids, labels = batch(gen, args.micro_batch_size, args.context, vocab)
            ids = ids.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            logits = model(ids)
            loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1)) / args.microbatches
            loss.backward()
            total += loss.detach()
        optimizer.step()
        loss_value = float(total)  # one host read per step, as pipe's StepResult.loss
        sync()
        elapsed = time.perf_counter() - t0
        losses.append(loss_value)
        if s >= args.warmup:
            seconds.append(elapsed)
    tokens = args.microbatches * args.micro_batch_size * args.context
    median = statistics.median(seconds)
    print(f"PyTorch {torch.__version__} reference on {device}: median step {median:.4f} s "
          f"(min {min(seconds):.4f})  {tokens / median:.1f} tokens/s  "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(json.dumps({
        "bench": "gpu_pp1", "system": "pytorch", "device": str(device), "torch": torch.__version__,
        "width": args.width, "layers": args.layers, "heads": args.heads, "context": args.context,
        "micro_batch_size": args.micro_batch_size, "microbatches": args.microbatches,
        "tokens_per_step": tokens, "step_s": seconds, "median_step_s": median,
        "tokens_per_s": tokens / median, "loss_first": losses[0], "loss_last": losses[-1],
        "intra_op_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main(sys.argv[1:])
