"""GPT-2's reference model for the Hugging Face interop tests
(checkpoint/hf/hf_check.py make): exact GELU, no dropout, and random biases
everywhere, the key bias included (pipe drops it on import; softmax ignores
it), so that a mix-up of tensors shows in the logits."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def make_model():
    config = GPT2Config(vocab_size=300, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # biases and LayerNorms start at 0 and 1
                p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
    return model
