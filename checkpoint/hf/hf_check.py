#!/usr/bin/env python3
"""The transformers side of the models' Hugging Face interop tests
(checkpoint/hf/hf_interop_testing.h), run with the real clients
(transformers, safetensors, torch from tools/python_envs/torch-newest.txt).
It names no model: transformers picks the class from the folder's config.json,
and each model's package holds the script that makes its reference model.

  hf_check.py load DIR CASE.safetensors
      AutoModelForCausalLM.from_pretrained(DIR) on CASE's input_ids must give
      CASE's logits (pipe's) within 1e-4; prints the largest difference.
  hf_check.py make MAKER.py DIR CASE.safetensors
      MAKER.py's make_model() (a randomly initialised transformers model, from
      the model's own package, e.g. models/llama/llama_hf_reference.py) saved
      with save_pretrained(DIR); CASE gets input_ids and transformers' logits.
"""

import importlib.util
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

VOCAB = 300  # the reference models' vocabulary: the ids drawn below


def load(folder, case):
    want = load_file(case)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        got = model(input_ids=want["input_ids"]).logits
    diff = (got - want["logits"]).abs().max().item()
    print(f"max |transformers - pipe| = {diff:.3g}")
    return 0 if diff < 1e-4 else 1


def make(maker, folder, case):
    spec = importlib.util.spec_from_file_location("hf_reference", maker)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.make_model()
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, case)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "load":
        sys.exit(load(*sys.argv[2:]))
    if len(sys.argv) == 5 and sys.argv[1] == "make":
        sys.exit(make(*sys.argv[2:]))
    sys.exit(__doc__)
