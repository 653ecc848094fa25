"""The peer GPT in PyTorch, built from PyTorch's own modules: the model
../shared/peers/README.md describes (byte vocabulary, pre-LayerNorm
`nn.TransformerEncoderLayer` blocks with a 4x GELU MLP, no dropout, causal
float mask, learned positions, final LayerNorm, LM head tied to the token
embedding), its synthetic micro-batches (rows in arithmetic progression mod
the vocabulary) and the model, batch and run flags of the drivers that train
it (peer_gpt_kernels.py, torch_gpt_reference.py, torch_pipelining_gpt.py,
torch_zero1_peer.py). pipe's own definition of the same GPT is
bench/peer_gpt.h.
"""
import torch
import torch.nn.functional as F
from torch import nn


class PeerGpt(nn.Module):
    def __init__(self, vocab, width, layers, heads, context):
        super().__init__()
        self.tok = nn.Parameter(0.02 * torch.randn(vocab, width))
        self.pos = nn.Parameter(0.02 * torch.randn(context, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        causal = torch.full((context, context), float("-inf")).triu(diagonal=1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, ids):
        time_len = ids.shape[1]
        x = F.embedding(ids, self.tok) + self.pos[:time_len]
        mask = self.causal[:time_len, :time_len]
        for block in self.blocks:
            x = block(x, src_mask=mask)
        return F.linear(self.norm(x), self.tok)


def batch(gen, rows, seq, vocab):
    first = torch.randint(0, vocab, (rows, 1), generator=gen)
    step = torch.randint(1, 8, (rows, 1), generator=gen)
    tokens = (first + step * torch.arange(seq + 1)) % vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def add_training_arguments(ap, steps):
    """The model, batch and run flags of the drivers that train this GPT
    (torch_gpt_reference.py, torch_pipelining_gpt.py); defaults: the peer GPT."""
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--micro_batch_size", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=steps, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=1234)
