#!/usr/bin/env python3
"""The golden-value regression suite (issue #42): small GPT, BERT and LLaMA
runs through the real training binaries, each step's figures compared with
committed golden files (experiments/golden/values/<case>.json).

Per case, the golden file holds per step the loss, the gradient norm and the
p2p payload bytes each rank sent in that step, and per rank the byte planner's
predicted peak, with the machine facts it was made on (LibTorch, BLAS, its
kernel, the CPU's vector features: summary.json's "machine").

  check (default)   run the cases, compare: the loss and the gradient norm
                    bit for bit where the machine facts equal the golden
                    file's (the same arithmetic in the same order: the CPU is
                    deterministic, every rank pinned to one thread), else
                    within TOLERANCES (another kernel rounds each matrix
                    product differently); p2p bytes, planner bytes, the
                    schedule and the step count always exactly.
  --regenerate --why=TEXT
                    run the cases and write their golden files, recording
                    TEXT, the date and the commit; the commit that changes
                    them says why too (experiments/golden/README.md).
  --record_to=DIR   also write this run's records there (measuring the
                    differences between machines: --golden_dir=DIR on another).

Run through Bazel (the binaries in the runfiles):
  ./bazelw test //experiments:golden_values_test
  ./bazelw run //experiments:golden_values -- --regenerate --why="..."
"""

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

# The relative differences allowed when the machine facts differ from the
# golden file's, by precision and figure: about 10x the largest seen over
# every case of the suite (README.md "Tolerances"), on 2026-11-29 against
# goldens made with OpenBLAS's Zen kernel and LibTorch 1.13:
#   OPENBLAS_CORETYPE=Prescott       fp32 5.7e-7; bf16 0 (LibTorch 1.13's
#                                    bf16 products do not use OpenBLAS)
#   LibTorch 2.11 (MKL, oneDNN)      fp32 7.1e-7; bf16 loss 2.0e-4,
#                                    gradient norm 1.2e-2
# fp32: each matrix product sums in another order and rounds its last bit
# differently (~6e-8); six AdamW steps carry that into the loss and norm at
# a few 1e-7. bf16: a different fp32 sum can round a bf16 activation to its
# neighbour (2^-8 relative); the loss averages that away, the gradient norm
# much less.
TOLERANCES = {
    "fp32": {"loss": 1e-5, "grad_norm": 1e-5},
    "bf16": {"loss": 2e-3, "grad_norm": 1e-1},
}

# What every case shares: tiny models, 6 steps (warm-up 2 then cosine), one
# thread per rank and per BLAS (the same sums on every machine), logging every
# step (the p2p and memory figures are gathered on logged steps), no eval,
# no sample.
STEPS = 6
COMMON_SET = ("eval_interval=0,log_interval=1,sample_tokens=0,lr_schedule.warmup_steps=2,"
              "threads.intra_op=1,threads.blas=1,parallelism.micro_batch_size=2,"
              "parallelism.num_microbatches=4")
GPT_SET = "gpt.width=32,gpt.num_heads=4,gpt.num_layers=4,gpt.context_length=16,gpt.dropout=0.1"
BERT_SET = ("bert.width=32,bert.num_heads=4,bert.num_layers=4,bert.context_length=16,"
            "bert.dropout=0.1")
LLAMA_SET = ("llama.width=32,llama.num_layers=4,llama.num_heads=4,llama.num_kv_heads=2,"
             "llama.intermediate_size=48,llama.vocab_size=300,llama.context_length=16,"
             "llama.dropout=0.1,llama.tokenizer=")

# The covering set (not the full product): every registered training
# schedule once; pp 1, 2 and 4; dp 2 with and without the distributed
# optimizer; chunks 2 under every interleaved and V schedule; activation
# checkpointing; bf16 on each model; tp 2 with sequence parallelism (GPT)
# and without (LLaMA, BERT); auto on fixed costs; GPT's tied and LLaMA's untied
# and tied heads; BERT's padding mask and masked-LM loss.
CASES = [
    # name, binary, flags
    ("gpt_pp1", "train_gpt", ["--pp=1"]),
    ("gpt_pp2_1f1b_dp2", "train_gpt", ["--dp=2"]),
    ("gpt_pp4_gpipe", "train_gpt", ["--pp=4", "--schedule=gpipe"]),
    ("gpt_pp2_interleaved_1f1b", "train_gpt", ["--schedule=interleaved_1f1b", "--chunks=2"]),
    ("gpt_pp2_looped_bfs", "train_gpt", ["--schedule=looped_bfs", "--chunks=2"]),
    ("gpt_pp2_zb_h1", "train_gpt", ["--schedule=zb_h1"]),
    ("gpt_pp2_zb_h2", "train_gpt", ["--schedule=zb_h2"]),
    ("gpt_pp2_zbv", "train_gpt", ["--schedule=zbv", "--chunks=2"]),
    ("gpt_pp2_dualpipev", "train_gpt", ["--schedule=dualpipev", "--chunks=2"]),
    ("gpt_pp2_interleaved_zb", "train_gpt", ["--schedule=interleaved_zb", "--chunks=2"]),
    ("gpt_pp2_synth", "train_gpt", ["--schedule=synth"]),
    ("gpt_pp2_auto_fixed_costs", "train_gpt", ["--schedule=auto", "--auto_costs=F:1,I:1,W:1"]),
    ("gpt_pp2_checkpointing", "train_gpt", ["--ckpt_interval=1"]),
    ("gpt_pp2_bf16", "train_gpt", ["--precision=bf16"]),
    ("gpt_pp2_tp2_sp", "train_gpt", ["--tp=2", "--sequence_parallel=true"]),
    ("gpt_pp2_dp2_distributed_optimizer", "train_gpt",
     ["--dp=2", "--distributed_optimizer=true", "--set_extra=parallelism.ddp_bucket_size=4000"]),
    ("bert_pp2_1f1b", "train_bert", []),
    ("bert_pp2_tp2", "train_bert", ["--tp=2"]),
    ("bert_pp2_zbv_bf16_checkpointing", "train_bert",
     ["--schedule=zbv", "--chunks=2", "--precision=bf16", "--ckpt_interval=1"]),
    ("llama_pp2_1f1b_untied", "train_llama", []),
    ("llama_pp2_interleaved_tied_bf16", "train_llama",
     ["--schedule=interleaved_1f1b", "--chunks=2", "--precision=bf16",
      "--set_extra=llama.tie_embeddings=true"]),
    ("llama_pp2_tp2", "train_llama", ["--tp=2"]),
]
CONFIGS = {
    "train_gpt": "experiments/configs/gpt_small_pp2.textproto",
    "train_bert": "experiments/configs/bert_small_pp2.textproto",
    "train_llama": "experiments/configs/llama_small_pp2.textproto",
}
GOLDEN_DIR = pathlib.Path("experiments/golden/values")
FORMAT = "pipe-golden/1"


def write_data(tmp):
    """The cases' data, the same bytes on every machine: an English-like
    corpus for GPT and BERT, and for LLaMA a flat uint16 token file of
    documents ending in 0 with ids below 300, and a byte-level tokenizer."""
    words = ("stage sends activations gradients bubble schedule micro batch rank pipeline "
             "forward backward weight optimizer step loss token layer").split()
    lines = []
    for i in range(400):
        n = 6 + i % 7
        lines.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(n)).capitalize() + ".")
    (tmp / "corpus.txt").write_text("\n".join(lines) + "\n")
    tokens = []
    for doc in range(60):
        tokens += [((doc + j) % 7) * 37 % 251 + 1 + (j % 3) for j in range(40 + doc % 13)] + [0]
    (tmp / "tokens.bin").write_bytes(b"".join(t.to_bytes(2, "little") for t in tokens))
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {"<|endoftext|>": 0}
    vocab.update({chr(c): b + 1 for b, c in zip(bs, cs)})
    (tmp / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
        "model": {"type": "BPE", "vocab": vocab, "merges": []}}))


def command(case, bin_dir, tmp):
    """The case's command line."""
    name, binary, flags = case
    model_set = {"train_gpt": GPT_SET, "train_bert": BERT_SET,
                 "train_llama": LLAMA_SET + str(tmp / "tokenizer.json")}[binary]
    extra = [f.split("=", 1)[1] for f in flags if f.startswith("--set_extra=")]
    flags = [f for f in flags if not f.startswith("--set_extra=")]
    data = tmp / ("tokens.bin" if binary == "train_llama" else "corpus.txt")
    return [str(bin_dir / binary), f"--config={CONFIGS[binary]}", f"--data={data}",
            f"--output_dir={tmp / 'runs'}", f"--name={name}", f"--steps={STEPS}",
            "--set=" + ",".join([COMMON_SET, model_set] + extra)] + flags


def run_case(case, bin_dir, tmp, env):
    """Runs one case; returns its record (the golden file's contents less the
    provenance) and the seconds it took."""
    name = case[0]
    cmd = command(case, bin_dir, tmp)
    start = time.monotonic()
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600)
    seconds = time.monotonic() - start
    if out.returncode != 0:
        raise SystemExit(f"FAIL: case {name} exited {out.returncode}: {' '.join(cmd)}\n"
                         + out.stdout[-4000:])
    run_dirs = sorted((tmp / "runs").glob(f"{name}-*"))
    if len(run_dirs) != 1:
        raise SystemExit(f"FAIL: case {name}: want one run directory, found {run_dirs}")
    run_dir = run_dirs[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l]
    steps, before = [], None
    for line in lines:
        sent = line["p2p_bytes_sent"]
        delta = sent if before is None else [a - b for a, b in zip(sent, before)]
        before = sent
        steps.append({"step": line["step"], "loss": line["loss"], "grad_norm": line["grad_norm"],
                      "p2p_bytes": delta})
    precision = "bf16" if "--precision=bf16" in case[2] else "fp32"
    shutil.rmtree(run_dir)
    return {
        "format": FORMAT,
        "case": name,
        "command": " ".join([case[1]] + cmd[1:]).replace(str(tmp), "$TMP"),
        "precision": precision,
        "machine": summary["machine"],
        "schedule": summary["schedule"],
        "planner_peak_bytes": [r["planner_peak_bytes"] for r in summary["ranks"]],
        "steps": steps,
    }, seconds


def same_machine(a, b):
    """Whether two records' arithmetic is the same: LibTorch, the BLAS and its
    kernel, and the vector features LibTorch's own kernels dispatch on."""
    keys = ("libtorch", "blas", "blas_kernel", "cpu_features")
    return all(a["machine"].get(k) == b["machine"].get(k) for k in keys)


def compare(got, want, tolerant=False):
    """The differences of `got` from `want` as lines (empty: equal), and
    whether the comparison was exact (the same machine facts, unless
    `tolerant`)."""
    exact = same_machine(got, want) and not tolerant
    rtols = {k: 0.0 if exact else v for k, v in TOLERANCES[want["precision"]].items()}
    diffs = []
    for key in ("schedule", "planner_peak_bytes", "precision"):
        if got[key] != want[key]:
            diffs.append(f"{key}: {got[key]} (golden {want[key]})")
    if len(got["steps"]) != len(want["steps"]):
        diffs.append(f"{len(got['steps'])} steps (golden {len(want['steps'])})")
    for g, w in zip(got["steps"], want["steps"]):
        for key in ("loss", "grad_norm"):
            a, b = g[key], w[key]
            if a != b and abs(a - b) > rtols[key] * abs(b):
                diffs.append(f"step {w['step']} {key}: {a!r} (golden {b!r}, relative "
                             f"difference {abs(a - b) / abs(b):.2e}, allowed "
                             f"{'none' if exact else rtols[key]})")
        if g["p2p_bytes"] != w["p2p_bytes"]:
            diffs.append(f"step {w['step']} p2p bytes per rank: {g['p2p_bytes']} "
                         f"(golden {w['p2p_bytes']})")
    return diffs, exact


def describe(record):
    m = record["machine"]
    return (f"LibTorch {m['libtorch']}, {m['blas'].split(' ')[0] or 'BLAS'} kernel "
            f"{m['blas_kernel'] or '(not OpenBLAS)'}, {m['cpu_features']}")


def worst_difference(got, want):
    """The largest relative loss or gradient-norm difference."""
    worst = 0.0
    for g, w in zip(got["steps"], want["steps"]):
        for key in ("loss", "grad_norm"):
            worst = max(worst, abs(g[key] - w[key]) / abs(w[key]))
    return worst


def git_commit():
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")
    try:
        head = subprocess.run(["git", "-C", workspace, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", workspace, "status", "--porcelain", "--",
                                ".", ":!experiments/golden/values"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin_dir", default="experiments",
                        help="where train_gpt, train_bert and train_llama are")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--regenerate", action="store_true")
    parser.add_argument("--why", default="", help="with --regenerate: why the values change")
    parser.add_argument("--golden_dir", default="",
                        help="default: experiments/golden/values of the workspace")
    parser.add_argument("--record_to", default="", help="write this run's records there")
    parser.add_argument("--tolerant", action="store_true",
                        help="compare within TOLERANCES even on the golden's machine facts")
    parser.add_argument("--expect_differences", action="store_true",
                        help="succeed only when every case differs (the planted-change test)")
    args = parser.parse_args()

    if args.list:
        for name, binary, flags in CASES:
            print(f"{name:36s} {binary} {' '.join(flags)}")
        return 0
    names = [n for n in args.cases.split(",") if n]
    known = [c[0] for c in CASES]
    for n in names:
        if n not in known:
            print(f"error: --cases: no case '{n}'; valid: {', '.join(known)}", file=sys.stderr)
            return 2
    if args.regenerate and not args.why.strip():
        print("error: --regenerate needs --why=\"...\" (recorded in the golden files; the commit "
              "that changes them says the same)", file=sys.stderr)
        return 2
    golden_dir = pathlib.Path(args.golden_dir) if args.golden_dir else (
        pathlib.Path(os.environ["BUILD_WORKSPACE_DIRECTORY"]) / GOLDEN_DIR
        if args.regenerate and "BUILD_WORKSPACE_DIRECTORY" in os.environ else GOLDEN_DIR)
    cases = [c for c in CASES if not names or c[0] in names]

    env = dict(os.environ)
    env.pop("PP_PROGRESS_TTY", None)
    env["OMP_NUM_THREADS"] = "1"
    env["OPENBLAS_NUM_THREADS"] = "1"
    failures, differing, total = [], set(), 0.0
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as d:
        tmp = pathlib.Path(d)
        write_data(tmp)
        for case in cases:
            name = case[0]
            got, seconds = run_case(case, pathlib.Path(args.bin_dir), tmp, env)
            total += seconds
            if args.record_to:
                out = pathlib.Path(args.record_to)
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{name}.json").write_text(json.dumps(got, indent=1) + "\n")
            if args.regenerate:
                got["made"] = {"date": datetime.date.today().isoformat(), "commit": git_commit(),
                               "why": args.why.strip()}
                golden_dir.mkdir(parents=True, exist_ok=True)
                (golden_dir / f"{name}.json").write_text(json.dumps(got, indent=1) + "\n")
                print(f"wrote {golden_dir / name}.json ({seconds:.1f} s)")
                continue
            path = golden_dir / f"{name}.json"
            if not path.is_file():
                differing.add(name)
                failures.append(f"{name}: no {path}; make it with "
                                "./bazelw run //experiments:golden_values -- --regenerate "
                                f"--why=\"...\" --cases={name}")
                continue
            want = json.loads(path.read_text())
            diffs, exact = compare(got, want, args.tolerant)
            how = ("bit for bit" if exact else
                   "within " + ", ".join(f"{k} {v:g}" for k, v in
                                        TOLERANCES[want["precision"]].items()) + " relative ("
                   + ("--tolerant" if same_machine(got, want) else
                      f"another machine: {describe(got)}; the golden's: {describe(want)}")
                   + f"), largest difference {worst_difference(got, want):.2e}")
            if diffs:
                differing.add(name)
                failures.append(f"{name} ({how}):\n    " + "\n    ".join(diffs[:12]) +
                                (f"\n    ... {len(diffs) - 12} more" if len(diffs) > 12 else ""))
                print(f"DIFFERS {name} ({seconds:.1f} s)")
            else:
                print(f"ok {name}: {len(got['steps'])} steps {how} ({seconds:.1f} s)")
    print(f"{len(cases)} cases in {total:.0f} s")
    if args.regenerate:
        return 0
    if args.expect_differences:
        same = [c[0] for c in cases if c[0] not in differing]
        if same:
            print(f"FAIL: expected every case to differ; equal: {', '.join(same)}")
            return 1
        print("ok: every case differs:\n" + "\n".join(failures))
        return 0
    if failures:
        print("FAIL: golden values differ (a change meant to move them: regenerate with "
              "./bazelw run //experiments:golden_values -- --regenerate --why=\"...\" and say why "
              "in the commit):\n" + "\n".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
