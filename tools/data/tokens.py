#!/usr/bin/env python3
"""pipe's data tool: trains a BPE tokenizer and writes pre-tokenized corpora.

  tokens.py train  --corpus FILE_OR_DIR... --vocab_size 8192 --out tokenizer.json
  tokens.py encode --tokenizer tokenizer.json --corpus FILE_OR_DIR... \
                   --format flat|megatron --out PATH [--dtype uint16|uint32]
  tokens.py decode --tokenizer tokenizer.json --ids 17,4,99
  tokens.py pairs  --corpus FILE_OR_DIR... --out pairs.jsonl
  tokens.py finetune --tokenizer tokenizer.json --pairs pairs.jsonl \
                   --format flat|megatron --out PATH [--dtype uint16|uint32]

Runs offline: Hugging Face `tokenizers` trains a byte-level BPE on the given
text (the licence texts in /usr/share/common-licenses make a small corpus),
nothing is downloaded. Each input file is one document and ends with the
end-of-text token "<|endoftext|>" (id 0).

Formats (models/data/token_file.h reads both through mmap):
  flat      PATH: little-endian uint16 (or uint32) ids back to back, nanoGPT's
            train.bin.
  megatron  PATH.bin + PATH.idx, Megatron-LM's indexed dataset: one sequence
            per document, uint16 (dtype code 8) or int32 (code 4) tokens.

Fine-tuning data (finetune): each JSON line {"prompt": ..., "response": ...}
is one document, prompt then response then "<|endoftext|>", and a loss mask
beside the tokens (flat PATH.loss_mask, Megatron PREFIX.loss_mask: one byte per
token, 1 where the token is a trained label: the response and its end, 0 for
the prompt), which pipe's data readers pick up (models/data/token_data.h).
`pairs` makes such a file from text on the machine: every paragraph of two or
more lines, its first line the prompt and the rest the response.

The tool is written from the published layout (magic, version, dtype code,
counts, lengths, pointers, document indices), not from Megatron's code.
"""

import argparse
import json
import os
import stat
import struct
import sys

# numpy and tokenizers (the torch-newest venv) are imported where used, so that
# bad arguments are refused, naming the value, by any python3.

EOT = "<|endoftext|>"
_MAGIC = b"MMIDIDX\x00\x00"
_DTYPE_CODES = {"uint16": 8, "int32": 4}


# Every vocabulary holds the 256 byte tokens and <|endoftext|>; the C++
# reader (models/data/bpe_vocab.h) takes ids below 2^24.
MIN_VOCAB = 257
MAX_VOCAB = 1 << 24


def is_regular(path):
    """Whether `path` (following links) is a regular file: opening a FIFO
    would block until a writer comes, a device never ends."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def kind(path):
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def regular_file(path, what):
    """`path` when it is a regular file, else exits naming it."""
    if not is_regular(path):
        if not os.path.exists(path):
            sys.exit(f"tokens.py: {what} {path} does not exist")
        sys.exit(f"tokens.py: {what} {path} is {kind(path)}; give a regular file")
    return path


def corpus_files(paths):
    """The text files under `paths` (files as given, directories walked; inside
    a directory, FIFOs, devices and dangling links are skipped), sorted."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                files += [f for f in (os.path.join(root, n) for n in names) if is_regular(f)]
        else:
            files.append(regular_file(path, "corpus path"))
    files = sorted(files)
    if not files:
        sys.exit(f"tokens.py: no regular files under {' '.join(paths)}")
    return files


def load_tokenizer(path):
    regular_file(path, "--tokenizer")
    try:
        with open(path, "rb") as f:
            json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        sys.exit(f"tokens.py: --tokenizer {path} is not JSON ({e}); tokens.py train writes one")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises its own Exception types
        sys.exit(f"tokens.py: --tokenizer {path} is not a tokenizer.json ({e}); "
                 "tokens.py train writes one")


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def train(args):
    files = corpus_files(args.corpus)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((read_text(f) for f in files), trainer=trainer)
    tokenizer.save(args.out)
    print(f"{args.out}: vocabulary {tokenizer.get_vocab_size()} from {len(files)} files")


def encode_documents(tokenizer, files):
    eot = tokenizer.token_to_id(EOT)
    for f in files:
        yield tokenizer.encode(read_text(f)).ids + [eot]


def token_dtype(args, tokenizer):
    vocab = tokenizer.get_vocab_size()
    dtype = args.dtype or ("uint16" if vocab <= 65536 else "uint32")
    if dtype == "uint16" and vocab > 65536:
        sys.exit(f"tokens.py: vocabulary {vocab} does not fit uint16; use --dtype uint32")
    return dtype


def encode(args):
    import numpy as np

    files = corpus_files(args.corpus)
    tokenizer = load_tokenizer(args.tokenizer)
    dtype = token_dtype(args, tokenizer)
    docs = [np.asarray(d, dtype=np.int64) for d in encode_documents(tokenizer, files)]
    write_tokens(docs, args.format, dtype, args.out)


def mask_path(out):
    """Where a loss mask goes: beside a flat file (PATH.loss_mask) or a Megatron
    prefix (PREFIX.loss_mask), where models/data/token_data.h looks."""
    return out + ".loss_mask"


def paragraphs(text):
    """Runs of non-blank lines, each a list of its lines."""
    out, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def pairs(args):
    files = corpus_files(args.corpus)
    count = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for path in files:
            for lines in paragraphs(read_text(path)):
                if len(lines) < 2:
                    continue
                prompt = lines[0] + "\n"
                response = "\n".join(lines[1:]) + "\n"
                f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
                count += 1
    if count == 0:
        sys.exit(f"tokens.py: no paragraph of two or more lines under {' '.join(args.corpus)}")
    print(f"{args.out}: {count} prompt/response pairs from {len(files)} files")


def read_pairs(path):
    regular_file(path, "--pairs")
    out = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                sys.exit(f"tokens.py: --pairs {path} line {number} is not JSON ({e})")
            if (not isinstance(record, dict) or not isinstance(record.get("prompt"), str)
                    or not isinstance(record.get("response"), str)):
                sys.exit(f"tokens.py: --pairs {path} line {number}: want an object with string "
                         "fields \"prompt\" and \"response\"")
            if not record["response"]:
                sys.exit(f"tokens.py: --pairs {path} line {number}: the response is empty "
                         "(nothing to train on)")
            out.append((record["prompt"], record["response"]))
    if not out:
        sys.exit(f"tokens.py: --pairs {path} holds no pair")
    return out


def finetune(args):
    import numpy as np

    records = read_pairs(args.pairs)
    tokenizer = load_tokenizer(args.tokenizer)
    dtype = token_dtype(args, tokenizer)
    eot = tokenizer.token_to_id(EOT)
    docs, masks = [], []
    for prompt, response in records:
        p = tokenizer.encode(prompt).ids
        r = tokenizer.encode(response).ids + [eot]
        docs.append(np.asarray(p + r, dtype=np.int64))
        masks.append(np.concatenate([np.zeros(len(p), np.uint8), np.ones(len(r), np.uint8)]))
    write_tokens(docs, args.format, dtype, args.out)
    path = mask_path(args.out)
    np.concatenate(masks).tofile(path)
    trained = int(sum(m.sum() for m in masks))
    total = int(sum(len(m) for m in masks))
    print(f"{path}: {trained} of {total} tokens trained (the responses)")


def write_tokens(docs, fmt, dtype, out):
    import numpy as np

    if fmt == "flat":
        np.concatenate(docs).astype("<u2" if dtype == "uint16" else "<u4").tofile(out)
        print(f"{out}: {sum(len(d) for d in docs)} tokens ({dtype})")
        return
    # Megatron stores uint16 (code 8) or int32 (code 4).
    np_dtype = "<u2" if dtype == "uint16" else "<i4"
    code = _DTYPE_CODES["uint16" if dtype == "uint16" else "int32"]
    size = np.dtype(np_dtype).itemsize
    with open(out + ".bin", "wb") as f:
        for d in docs:
            f.write(d.astype(np_dtype).tobytes())
    lengths = np.array([len(d) for d in docs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * size)[:-1]]).astype("<i8")
    document_indices = np.arange(len(docs) + 1, dtype="<i8")  # one sequence per document
    with open(out + ".idx", "wb") as f:
        f.write(_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(document_indices.tobytes())
    print(f"{out}.bin/.idx: {len(docs)} documents, {int(lengths.sum())} tokens (code {code})")


def decode(args):
    ids = [x.strip() for x in args.ids.split(",") if x.strip()]
    for x in ids:
        if not x.isdigit():
            sys.exit(f"tokens.py: --ids: '{x}' is not a token id (a non-negative integer)")
    tokenizer = load_tokenizer(args.tokenizer)
    vocab = tokenizer.get_vocab_size()
    for x in ids:
        if int(x) >= vocab:
            sys.exit(f"tokens.py: --ids: {x} is not a token id of {args.tokenizer} "
                     f"(its ids are 0 to {vocab - 1})")
    sys.stdout.write(tokenizer.decode([int(x) for x in ids], skip_special_tokens=False))


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
    p = sub.add_parser("pairs")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=pairs)
    p = sub.add_parser("finetune")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--format", choices=["flat", "megatron"], required=True)
    p.add_argument("--dtype", choices=["uint16", "uint32"])
    p.add_argument("--out", required=True)
    p.set_defaults(run=finetune)
    p = sub.add_parser("decode")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--ids", required=True)
    p.set_defaults(run=decode)
    args = parser.parse_args()
    vocab_size = getattr(args, "vocab_size", MIN_VOCAB)
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        sys.exit(f"tokens.py: --vocab_size ({vocab_size}) must be in [{MIN_VOCAB}, {MAX_VOCAB}] "
                 f"(the 256 byte tokens and {EOT} come first)")
    out = getattr(args, "out", None)
    if out is not None:
        # Megatron writes OUT.bin and OUT.idx beside OUT.
        for path in [out + ".bin", out + ".idx"] if getattr(args, "format", "") == "megatron" else [out]:
            if os.path.isdir(path) or not os.path.isdir(os.path.dirname(path) or "."):
                sys.exit(f"tokens.py: --out {path} cannot be written: it is a directory or its "
                         "folder does not exist")
    try:
        args.run(args)
    except OSError as e:  # a write refused by the system: the path and why
        sys.exit(f"tokens.py: {e}")


if __name__ == "__main__":
    main()
