#!/usr/bin/env python3
"""The transformers side of the models' Hugging Face interop tests
(checkpoint/hf/hf_interop_testing.h: //models/gpt:gpt_hf_interop_test,
//models/llama:llama_hf_interop_test), run with the real clients
(transformers, safetensors, torch from tools/python_envs/hf-interop.txt).

  hf_check.py load llama|gpt2 DIR CASE.safetensors
      {Llama,GPT2LMHead}Model.from_pretrained(DIR) on CASE's input_ids must
      give CASE's logits (pipe's) within 1e-4; prints the largest difference.
  hf_check.py make llama|gpt2 DIR CASE.safetensors
      a randomly initialised model (LLaMA: GQA, untied head; GPT-2: exact GELU,
      random biases everywhere, the key bias included) saved with
      save_pretrained(DIR); CASE gets input_ids and transformers' logits.
"""

import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

CLASSES = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}


def load(arch, folder, case):
    want = load_file(case)
    model = CLASSES[arch].from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        got = model(input_ids=want["input_ids"]).logits
    diff = (got - want["logits"]).abs().max().item()
    print(f"max |transformers - pipe| = {diff:.3g}")
    return 0 if diff < 1e-4 else 1


def make(arch, folder, case):
    torch.manual_seed(0)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=300, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                            activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:  # biases and LayerNorms start at 0 and 1
                    p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
        return save(model, folder, case)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         rms_norm_eps=1e-5, rope_theta=5000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Norm weights start at one: make them random so a mix-up shows.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return save(model, folder, case)


def save(model, folder, case):
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, case)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("load", "make") or sys.argv[2] not in CLASSES:
        sys.exit(__doc__)
    sys.exit({"load": load, "make": make}[sys.argv[1]](*sys.argv[2:]))
