#!/usr/bin/env python3
"""pipe's data tool: trains a BPE tokenizer and writes pre-tokenized corpora.

  tokens.py train  --corpus FILE_OR_DIR... --vocab_size 8192 --out tokenizer.json
  tokens.py encode --tokenizer tokenizer.json --corpus FILE_OR_DIR... \
                   --format flat|megatron --out PATH [--dtype uint16|uint32]
  tokens.py decode --tokenizer tokenizer.json --ids 17,4,99

Runs offline: Hugging Face `tokenizers` trains a byte-level BPE on the given
text (the licence texts in /usr/share/common-licenses make a small corpus),
nothing is downloaded. Each input file is one document and ends with the
end-of-text token "<|endoftext|>" (id 0).

Formats (models/data/token_file.h reads both through mmap):
  flat      PATH: little-endian uint16 (or uint32) ids back to back, nanoGPT's
            train.bin.
  megatron  PATH.bin + PATH.idx, Megatron-LM's indexed dataset: one sequence
            per document, uint16 (dtype code 8) or int32 (code 4) tokens.

The tool is written from the published layout (magic, version, dtype code,
counts, lengths, pointers, document indices), not from Megatron's code.
"""

import argparse
import os
import struct
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
_MAGIC = b"MMIDIDX\x00\x00"
_DTYPE_CODES = {"uint16": 8, "int32": 4}


def corpus_files(paths):
    """The text files under `paths` (files as given, directories walked), sorted."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                files += [os.path.join(root, n) for n in names]
        elif os.path.isfile(path):
            files.append(path)
        else:
            sys.exit(f"tokens.py: corpus path {path} does not exist")
    files = sorted(f for f in files if not os.path.islink(f) or os.path.exists(f))
    if not files:
        sys.exit(f"tokens.py: no files under {paths}")
    return files


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def train(args):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = corpus_files(args.corpus)
    tokenizer.train_from_iterator((read_text(f) for f in files), trainer=trainer)
    tokenizer.save(args.out)
    print(f"{args.out}: vocabulary {tokenizer.get_vocab_size()} from {len(files)} files")


def encode_documents(tokenizer, files):
    eot = tokenizer.token_to_id(EOT)
    for f in files:
        yield tokenizer.encode(read_text(f)).ids + [eot]


def encode(args):
    tokenizer = Tokenizer.from_file(args.tokenizer)
    vocab = tokenizer.get_vocab_size()
    dtype = args.dtype or ("uint16" if vocab <= 65536 else "uint32")
    if dtype == "uint16" and vocab > 65536:
        sys.exit(f"tokens.py: vocabulary {vocab} does not fit uint16; use --dtype uint32")
    docs = [np.asarray(d, dtype=np.int64) for d in encode_documents(tokenizer, corpus_files(args.corpus))]
    if args.format == "flat":
        np.concatenate(docs).astype("<u2" if dtype == "uint16" else "<u4").tofile(args.out)
        print(f"{args.out}: {sum(len(d) for d in docs)} tokens ({dtype})")
        return
    # Megatron stores uint16 (code 8) or int32 (code 4).
    np_dtype = "<u2" if dtype == "uint16" else "<i4"
    code = _DTYPE_CODES["uint16" if dtype == "uint16" else "int32"]
    size = np.dtype(np_dtype).itemsize
    with open(args.out + ".bin", "wb") as f:
        for d in docs:
            f.write(d.astype(np_dtype).tobytes())
    lengths = np.array([len(d) for d in docs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * size)[:-1]]).astype("<i8")
    document_indices = np.arange(len(docs) + 1, dtype="<i8")  # one sequence per document
    with open(args.out + ".idx", "wb") as f:
        f.write(_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(document_indices.tobytes())
    print(f"{args.out}.bin/.idx: {len(docs)} documents, {int(lengths.sum())} tokens (code {code})")


def decode(args):
    tokenizer = Tokenizer.from_file(args.tokenizer)
    ids = [int(x) for x in args.ids.split(",") if x]
    sys.stdout.write(tokenizer.decode(ids, skip_special_tokens=False))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--out", required=True)
    p.set_defaults(run=train)
    p = sub.add_parser("encode")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--format", choices=["flat", "megatron"], required=True)
    p.add_argument("--dtype", choices=["uint16", "uint32"])
    p.add_argument("--out", required=True)
    p.set_defaults(run=encode)
    p = sub.add_parser("decode")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--ids", required=True)
    p.set_defaults(run=decode)
    args = parser.parse_args()
    if getattr(args, "vocab_size", 1) <= 0:
        sys.exit(f"tokens.py: --vocab_size ({args.vocab_size}) must be positive")
    args.run(args)


if __name__ == "__main__":
    main()
