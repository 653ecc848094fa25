"""LLaMA's reference model for the Hugging Face interop tests
(checkpoint/hf/hf_check.py make): grouped-query attention, an untied head and
random norm weights (they start at one), so that a mix-up of tensors shows in
the logits."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def make_model():
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         rms_norm_eps=1e-5, rope_theta=5000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model
