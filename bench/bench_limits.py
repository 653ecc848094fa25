"""The physical limits on this machine for the peer GPT (issue #16).

What stops pipe's pp = 2 from going faster on 2 cores, measured, not assumed:

  single       pipe pp = 1 with 1 intra-op + 1 BLAS thread, alone: tokens/s
               (median of the steps after warm-up).
  two_singles  two such runs started at once: each one's tokens/s and their
               sum, the 2-core ceiling for this model with no communication
               and no bubble, each core one rank; sum / (2 x single) is what
               sharing caches and memory bandwidth costs.
  copy         bench_memcpy (large memcpy, GB/s) alone and as two processes
               copying in the same window: the memory system's share per core.
  pp2 runs     pipe pp = 2 (by default 1f1b and zbv with 2 chunks, the flags
               of bench_vs_deepspeed.py's pipe runs, bench_common.PEER_GPT): tokens/s, and every
               thread's CPU and run-queue wait from /proc/<pid>/task/<tid>/
               schedstat (ns) at the start and the end of the timed steps,
               grouped by what the thread runs (compute = the worker's main
               thread, which runs the step; gloo_transport = Gloo's TCP event
               loop; c10d_gloo_workers = ProcessGroupGloo's work threads;
               c10d_store = the TCP store's poll threads; launcher; other),
               per step. Groups come from one `gdb thread apply all bt` of
               each worker after the end snapshot (outside the timed steps);
               without gdb every thread but the main one is "other".
  derived      ceiling = two_singles' sum; the 1F1B bound = ceiling x m / (m
               + p - 1); the no-bubble bound = ceiling; pipe's runs (and
               DeepSpeed's, given with --deepspeed_tokens_per_s) as fractions
               of those. By CPU time (which other load distorts less than
               wall time): two_singles.cpu_ratio (CPU per step next to another
               run / alone), and per pp = 2 run cpu_vs_single (all its
               threads' CPU per step / single's) and cpu_bound_tokens_per_s
               (tokens per step x cores / its CPU per step: its speed if its
               own work filled the cores). cores_busy: a run's CPU over the
               cores' time; compute_share: per rank, the compute thread's CPU
               over the step's wall time.

Every repetition runs every configuration once, in the same order (slow
periods of a shared machine hit all of them); figures are medians over
repetitions. Prints a table on stderr and one JSON line on stdout.

Use bench/bench_limits.sh (builds train_gpt and bench_memcpy).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import PEER_GPT, load_average  # the peer GPT, as its peers run it

GROUPS = ("compute", "gloo_transport", "c10d_gloo_workers", "c10d_store", "blas",
          "intra_op_pool", "launcher", "other")


def merged_set(base, overrides):
    """`base` with the fields of `overrides` replacing its own, as one --set
    value (train_gpt refuses a field given twice)."""
    fields = {}
    for part in filter(None, (base + "," + (overrides or "")).split(",")):
        key, _, value = part.partition("=")
        fields[key] = value
    return ",".join(f"{k}={v}" for k, v in fields.items())


def children(pid):
    """The direct children of `pid` (all its threads' children)."""
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return kids


def schedstat(pid):
    """{tid: (cpu_ns, run_queue_wait_ns)} for every thread of `pid`."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu, wait, _ = f.read().split()
            out[int(tid)] = (int(cpu), int(wait))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass  # the thread exited between listing and reading
    return out


def label_threads(pids, gdb):
    """{pid: {tid: group}} for the threads of the workers `pids`, from their
    stacks (gdb -batch, all workers at once: each stops for ~2 s, so call it
    outside the timed steps). A worker gdb could not read (gdb missing, the
    process gone) is left out; its threads are then "compute" (the main
    thread) or "other"."""
    if not gdb or not pids:
        return {}
    procs = {pid: subprocess.Popen([gdb, "-batch", "-nx", "-p", str(pid), "-ex",
                                    "thread apply all bt 40"], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True) for pid in pids}
    labels = {}
    for pid, proc in procs.items():
        try:
            stdout, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        found = {}
        for block in re.split(r"\n(?=Thread \d+ )", stdout):
            head = re.match(r"Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\)", block)
            if head:
                found[int(head.group(1))] = thread_group(pid, int(head.group(1)), block)
        if pid in found:  # the main thread's stack was read: the worker was alive
            labels[pid] = found
    return labels


def thread_group(pid, tid, stack):
    if tid == pid:
        return "compute"  # the worker's main thread runs the training step
    if "gloo::transport::tcp::Loop::run" in stack:
        return "gloo_transport"
    if "ProcessGroupGloo::runLoop" in stack:
        return "c10d_gloo_workers"
    if "blas_thread_server" in stack or "libopenblas" in stack:
        return "blas"
    if "gomp" in stack or "at::internal" in stack or "ThreadPool" in stack:
        return "intra_op_pool"
    if "__poll" in stack and "libtorch" in stack:
        return "c10d_store"  # c10d's TCP store: server daemon and watch thread
    return "other"


class Training:
    """One train_gpt launch, its workers' threads sampled around the timed
    steps (metrics.jsonl lines warmup .. warmup + steps)."""

    def __init__(self, args, pp, flags, workdir, name, label=True):
        self.args, self.pp, self.name, self.label = args, pp, name, label
        self.out = Path(tempfile.mkdtemp(dir=workdir, prefix=name + "_"))
        tokens = shlex.split(flags)
        model = merged_set(PEER_GPT, args.model_set)
        # Steps after the timed ones (--tail_steps): the end snapshot and the
        # thread labels are taken while they run, with every thread alive.
        self.command = [args.train_gpt, f"--set={model}", f"--pp={pp}",
                        f"--microbatches={args.microbatches}",
                        f"--micro_batch_size={args.micro_batch_size}",
                        f"--steps={args.warmup + args.steps + args.tail_steps}", f"--output_dir={self.out}",
                        "--name=bench", f"--seed={args.seed}"] + tokens
        self.log = open(self.out / "train.log", "w+")
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        self.started = time.monotonic()
        self.start = self.end = None  # (monotonic time, {pid: schedstat}, metrics lines)
        self.labels = {}

    def metrics(self):
        found = list(self.out.glob("bench-*/metrics.jsonl"))
        if not found:
            return []
        lines = found[0].read_text().splitlines()
        # A line being written may be cut; keep only whole ones.
        return [json.loads(l) for l in lines if l.endswith("}")]

    def snapshot(self, lines):
        pids = [self.proc.pid] + children(self.proc.pid)
        return (time.monotonic(), {pid: schedstat(pid) for pid in pids}, lines)

    def poll(self):
        """Takes the snapshots when due; returns True once done (exited)."""
        if self.end is None:
            lines = len(self.metrics())
            if self.start is None and lines >= self.args.warmup:
                self.start = self.snapshot(lines)
            elif self.start is not None and lines >= self.args.warmup + self.args.steps:
                self.end = self.snapshot(lines)
                if self.label:
                    self.labels = label_threads(
                        [pid for pid in self.end[1] if pid != self.proc.pid], self.args.gdb)
        if time.monotonic() - self.started > self.args.timeout:
            self.proc.kill()
            raise RuntimeError(f"{self.name}: train_gpt ran over --timeout={self.args.timeout} s:"
                               f" {shlex.join(self.command)}")
        return self.proc.poll() is not None

    def result(self):
        self.log.seek(0)
        log = self.log.read()
        if self.proc.returncode != 0 or self.start is None or self.end is None:
            raise RuntimeError(f"{self.name}: train_gpt failed ({self.proc.returncode}) or ended "
                               f"before its timed steps: {shlex.join(self.command)}\n{log[-3000:]}")
        metrics = self.metrics()
        timed = [m for m in metrics
                 if self.args.warmup < m["step"] <= self.args.warmup + self.args.steps]
        steps = self.end[2] - self.start[2]  # steps logged between the snapshots
        if steps < 1:
            raise RuntimeError(f"{self.name}: no step logged between the snapshots (steps shorter "
                               "than the 2 ms poll?); use a larger model or more --steps")
        wall = self.end[0] - self.start[0]
        launcher = self.proc.pid
        groups = {}  # group -> {"cpu_s", "wait_s", "threads"} per step over all ranks
        per_rank = {}  # worker pid -> group -> cpu s per step
        ranks = sorted(p for p in self.end[1] if p != launcher)
        for pid, threads in self.end[1].items():
            before = self.start[1].get(pid, {})
            for tid, (cpu, wait) in threads.items():
                cpu0, wait0 = before.get(tid, (0, 0))
                if pid == launcher:
                    group = "launcher"
                elif tid == pid:
                    group = "compute"
                else:
                    group = self.labels.get(pid, {}).get(tid, "other")
                g = groups.setdefault(group, {"cpu_s": 0.0, "wait_s": 0.0, "threads": 0})
                g["cpu_s"] += (cpu - cpu0) * 1e-9 / steps
                g["wait_s"] += (wait - wait0) * 1e-9 / steps
                g["threads"] += 1
                if pid != launcher:
                    r = per_rank.setdefault(pid, {})
                    r[group] = r.get(group, 0.0) + (cpu - cpu0) * 1e-9 / steps
        cpu_total = sum(g["cpu_s"] for g in groups.values())
        threads_line = sorted({l.split("threads: ", 1)[1].split(" (")[0]
                               for l in log.splitlines()
                               if l.startswith("[launcher] rank ") and " threads: " in l})
        return {
            "tokens_per_s": statistics.median(m["tokens_per_s"] for m in timed),
            "step_s": statistics.median(m["step_s"] for m in timed),
            "steps_sampled": steps,
            "wall_s_per_step": wall / steps,
            "cpu_s_per_step": cpu_total,
            # CPU of every thread of the run over the cores' time in the
            # window: 1.0 = both cores busy with this run all the time.
            "cores_busy": cpu_total / (wall / steps) / self.args.cores,
            "groups": {k: {"cpu_s": round(v["cpu_s"], 5), "wait_s": round(v["wait_s"], 5),
                           "threads": v["threads"]} for k, v in sorted(groups.items())},
            "per_rank_cpu_s": [{k: round(v, 5) for k, v in sorted(per_rank[p].items())}
                               for p in ranks],
            # Per rank: its compute thread's CPU over the wall time, the share
            # of the step the rank computed (the rest it waited or was
            # preempted).
            "compute_share": [round(per_rank[p].get("compute", 0.0) / (wall / steps), 4)
                              for p in ranks],
            "labelled_by": ("gdb" if self.labels and len(self.labels) == len(ranks) else
                            "gdb (some workers unread)" if self.labels else "main thread only"),
            "threads": threads_line,
        }


def run_together(trainings):
    try:
        while not all([t.poll() for t in trainings]):
            time.sleep(0.002)
    finally:
        for t in trainings:
            if t.proc.poll() is None:
                t.proc.kill()
                t.proc.wait()
    return [t.result() for t in trainings]


def run_copies(args, count):
    start_at = time.time() + 1.0 + 0.1 * args.copy_bytes / 2**20 / 256
    procs = [subprocess.Popen([args.bench_memcpy, f"--bytes={args.copy_bytes}",
                               f"--seconds={args.copy_seconds}", f"--start_at={start_at:.3f}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=args.timeout)
        if p.returncode != 0:
            raise RuntimeError(f"bench_memcpy failed ({p.returncode}): {stderr}")
        out.append(json.loads(stdout.strip().splitlines()[-1])["gb_per_s"])
    return out


def median(values):
    return statistics.median(values) if values else None


def rounded(x, digits=4):
    return None if x is None else round(x, digits)


def threads_summary(runs):
    groups = sorted({g for x in runs for g in x["groups"]})
    return {g: {k: rounded(median([x["groups"][g][k] for x in runs if g in x["groups"]]), 5)
                for k in ("cpu_s", "wait_s")} | {
                    "threads": max(x["groups"].get(g, {}).get("threads", 0) for x in runs)}
            for g in groups}


def run_summary(runs):
    tps = median([x["tokens_per_s"] for x in runs])
    return {"tokens_per_s": rounded(tps, 1),
            "runs_tokens_per_s": [round(x["tokens_per_s"], 1) for x in runs],
            "step_s": rounded(median([x["step_s"] for x in runs])),
            "cpu_s_per_step": rounded(median([x["cpu_s_per_step"] for x in runs])),
            "cores_busy": rounded(median([x["cores_busy"] for x in runs])),
            "thread_groups_per_step": threads_summary(runs),
            "per_rank_cpu_s": [
                {g: rounded(median([x["per_rank_cpu_s"][i].get(g, 0.0) for x in runs]), 5)
                 for g in runs[0]["per_rank_cpu_s"][i]}
                for i in range(len(runs[0]["per_rank_cpu_s"]))],
            "compute_share": [rounded(median([x["compute_share"][i] for x in runs]))
                              for i in range(len(runs[0]["compute_share"]))],
            "labelled_by": runs[0]["labelled_by"], "threads": runs[0]["threads"]}


def parse_args():
    """The arguments and the pp = 2 runs, (name, flags) each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_gpt", required=True, help="pipe's train_gpt binary")
    parser.add_argument("--bench_memcpy", required=True)
    parser.add_argument("--gdb", default=shutil.which("gdb") or "",
                        help="gdb, to group threads by their stacks ('' : main thread only)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--tail_steps", type=int, default=2,
                        help="steps after the timed ones, during which the threads are labelled")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--micro_batch_size", type=int, default=4)
    parser.add_argument("--model_set", default="",
                        help="config overrides after the peer GPT's (e.g. a smaller model)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--pp2", action="append", default=[],
                        help="name='train_gpt flags': a pp = 2 run per repetition (default "
                             "1f1b='' and zbv='--schedule=zbv --chunks=2')")
    parser.add_argument("--single_flags", default="--intra_op_threads=1 --blas_threads=1",
                        help="train_gpt flags of the pp = 1 runs")
    parser.add_argument("--copy_bytes", type=int, default=256 << 20)
    parser.add_argument("--copy_seconds", type=float, default=2.0)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--deepspeed_tokens_per_s", type=float, default=None,
                        help="DeepSpeed pp = 2 1F1B tokens/s measured by bench_vs_deepspeed.sh "
                             "(reported as fractions of the bounds)")
    parser.add_argument("--deepspeed_source", default="",
                        help="where --deepspeed_tokens_per_s comes from (kept in the JSON)")
    args = parser.parse_args()
    for value, name in ((args.reps, "--reps"), (args.steps, "--steps"), (args.tail_steps, "--tail_steps"),
                        (args.microbatches, "--microbatches"),
                        (args.micro_batch_size, "--micro_batch_size"), (args.cores, "--cores")):
        if value < 1:
            parser.error(f"{name}={value} must be >= 1")
    if args.warmup < 1:
        # The start snapshot needs the workers running: after a logged step.
        parser.error(f"--warmup={args.warmup} must be >= 1")
    if args.deepspeed_tokens_per_s is not None and not args.deepspeed_tokens_per_s > 0:
        parser.error(f"--deepspeed_tokens_per_s={args.deepspeed_tokens_per_s} must be > 0")
    pp2 = []
    for v in args.pp2 or ["1f1b=", "zbv=--schedule=zbv --chunks=2"]:
        name, sep, flags = v.partition("=")
        if not sep or not re.fullmatch(r"\w+", name) or name in [n for n, _ in pp2]:
            parser.error(f"--pp2={v} must look like name='flags' (name a unique word)")
        pp2.append((name, flags))

    return args, pp2


def measure(args, pp2):
    """Every configuration once per repetition: the repetitions' figures and
    the load average at the start and the end."""
    reps = []
    load = {"start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench_limits_") as workdir:
        for rep in range(args.reps):
            r = {}
            (r["single"],) = run_together([Training(args, 1, args.single_flags, workdir,
                                                    "single")])
            # Not labelled: gdb would stop the driver's polling and take CPU
            # from the other run's timed steps.
            r["two_singles"] = run_together([Training(args, 1, args.single_flags, workdir,
                                                      f"pair{i}", label=False) for i in range(2)])
            r["copy_alone"] = run_copies(args, 1)[0]
            r["copy_pair"] = run_copies(args, 2)
            for name, flags in pp2:
                (r[name],) = run_together([Training(args, 2, flags, workdir, name)])
            reps.append(r)
            pair = [x["tokens_per_s"] for x in r["two_singles"]]
            print(f"rep {rep + 1}/{args.reps}: single {r['single']['tokens_per_s']:.0f} tok/s; "
                  f"two singles {pair[0]:.0f} + {pair[1]:.0f} = {sum(pair):.0f}; copy alone "
                  f"{r['copy_alone']:.2f} GB/s, two at once {r['copy_pair'][0]:.2f} + "
                  f"{r['copy_pair'][1]:.2f}; " + "; ".join(
                      f"{n} {r[n]['tokens_per_s']:.0f} tok/s" for n, _ in pp2) +
                  f"  load {load_average()}", file=sys.stderr, flush=True)
    load["end"] = load_average()

    return reps, load


def summarize(args, pp2, reps, load):
    """The JSON result (medians over the repetitions, bounds, fractions) and
    the unrounded figures the table prints."""
    m, p = args.microbatches, 2
    single = median([r["single"]["tokens_per_s"] for r in reps])
    pair_sum = median([sum(x["tokens_per_s"] for x in r["two_singles"]) for r in reps])
    copy_alone = median([r["copy_alone"] for r in reps])
    copy_pair = median([sum(r["copy_pair"]) for r in reps])
    ceiling = pair_sum
    bound_1f1b = ceiling * m / (m + p - 1)

    result = {
        "bench": "limits", "reps": args.reps, "steps": args.steps, "warmup": args.warmup,
        "microbatches": m, "stages": p, "cores": args.cores,
        "tokens_per_step": m * args.micro_batch_size * _context_length(args.model_set),
        "model_set": args.model_set, "load_average": load,
        "single": run_summary([r["single"] for r in reps]),
        "two_singles": {
            "tokens_per_s": [rounded(median([r["two_singles"][i]["tokens_per_s"] for r in reps]), 1)
                             for i in range(2)],
            "sum_tokens_per_s": rounded(pair_sum, 1),
            "runs_sum_tokens_per_s": [round(sum(x["tokens_per_s"] for x in r["two_singles"]), 1)
                                      for r in reps],
            "sharing_ratio": rounded(pair_sum / (2 * single)),
            "cpu_s_per_step": rounded(median([x["cpu_s_per_step"] for r in reps
                                              for x in r["two_singles"]])),
            # CPU per step next to another run over alone: the sharing cost in
            # CPU time (caches, memory bandwidth), which other load inflates
            # less than wall time.
            "cpu_ratio": rounded(median([x["cpu_s_per_step"] for r in reps
                                         for x in r["two_singles"]]) /
                                 median([r["single"]["cpu_s_per_step"] for r in reps])),
            "thread_groups_per_step": threads_summary([x for r in reps
                                                       for x in r["two_singles"]]),
        },
        "copy": {"bytes": args.copy_bytes, "alone_gb_per_s": rounded(copy_alone, 3),
                 "pair_gb_per_s": [rounded(median([r["copy_pair"][i] for r in reps]), 3)
                                   for i in range(2)],
                 "pair_sum_gb_per_s": rounded(copy_pair, 3),
                 "sharing_ratio": rounded(copy_pair / (2 * copy_alone)),
                 "runs_alone_gb_per_s": [round(r["copy_alone"], 3) for r in reps]},
        "pp2": {name: run_summary([r[name] for r in reps]) for name, _ in pp2},
        "bounds": {"ceiling_tokens_per_s": rounded(ceiling, 1),
                   "no_bubble_tokens_per_s": rounded(ceiling, 1),
                   "one_f_one_b_tokens_per_s": rounded(bound_1f1b, 1),
                   "one_f_one_b_factor": rounded(m / (m + p - 1)),
                   "perfect_2x_single_tokens_per_s": rounded(2 * single, 1)},
    }
    fractions = {}
    for name, _ in pp2:
        tps = result["pp2"][name]["tokens_per_s"]
        cpu = result["pp2"][name]["cpu_s_per_step"]
        fractions[name] = {"of_ceiling": rounded(tps / ceiling),
                           "of_1f1b_bound": rounded(tps / bound_1f1b),
                           "vs_single": rounded(tps / single),
                           # All of the run's CPU per step (every thread, both
                           # ranks) over the single run's: what pp = 2 adds.
                           "cpu_vs_single": rounded(cpu / result["single"]["cpu_s_per_step"]),
                           # Its tokens/s if that CPU filled the cores with no
                           # idle time: the limit for this run's own work.
                           "cpu_bound_tokens_per_s": rounded(
                               result["tokens_per_step"] * args.cores / cpu, 1)}
    if args.deepspeed_tokens_per_s:
        ds = args.deepspeed_tokens_per_s
        fractions["deepspeed"] = {"tokens_per_s": ds, "source": args.deepspeed_source,
                                  "of_ceiling": rounded(ds / ceiling),
                                  "of_1f1b_bound": rounded(ds / bound_1f1b),
                                  "vs_single": rounded(ds / single)}
        for name, _ in pp2:
            fractions[name]["vs_deepspeed"] = rounded(result["pp2"][name]["tokens_per_s"] / ds)
    result["fractions"] = fractions

    figures = {"single": single, "pair_sum": pair_sum, "copy_alone": copy_alone,
               "copy_pair": copy_pair, "ceiling": ceiling, "bound_1f1b": bound_1f1b}
    return result, figures


def print_table(args, pp2, result, load, figures):
    single, pair_sum = figures["single"], figures["pair_sum"]
    copy_alone, copy_pair = figures["copy_alone"], figures["copy_pair"]
    ceiling, bound_1f1b = figures["ceiling"], figures["bound_1f1b"]
    fractions = result["fractions"]

    def line(label, value, note=""):
        print(f"{label:<44} {value:>14}  {note}", file=sys.stderr)

    print(f"\nlimits on this machine ({args.cores} cores), medians of {args.reps} repetitions, "
          f"load {load['start']} -> {load['end']}", file=sys.stderr)
    line("single (pp=1, 1+1 threads) tok/s", f"{single:.0f}",
         f"cpu/step {result['single']['cpu_s_per_step']:.3f} s")
    line("two singles at once: each / sum tok/s",
         f"{result['two_singles']['tokens_per_s'][0]:.0f} + "
         f"{result['two_singles']['tokens_per_s'][1]:.0f} = {pair_sum:.0f}",
         f"sum / (2 x single) = {result['two_singles']['sharing_ratio']:.3f}; CPU per step "
         f"{result['two_singles']['cpu_ratio']:.3f}x alone")
    line("memcpy GB/s: alone / two at once (sum)", f"{copy_alone:.2f} / {copy_pair:.2f}",
         f"sum / (2 x alone) = {result['copy']['sharing_ratio']:.3f}")
    line("bounds tok/s: no bubble / 1F1B m/(m+p-1)", f"{ceiling:.0f} / {bound_1f1b:.0f}",
         f"(2 x single would be {2 * single:.0f})")
    for name, _ in pp2:
        s, f = result["pp2"][name], fractions[name]
        ds = f" {f['vs_deepspeed']:.3f}x DeepSpeed" if "vs_deepspeed" in f else ""
        line(f"pp=2 {name} tok/s", f"{s['tokens_per_s']:.0f}",
             f"{f['of_ceiling']:.3f} of ceiling, {f['of_1f1b_bound']:.3f} of 1F1B bound{ds}; "
             f"cores busy {s['cores_busy']:.3f}, compute share per rank {s['compute_share']}")
        line(f"  all threads' CPU per step / vs single", f"{s['cpu_s_per_step']:.3f} s",
             f"{f['cpu_vs_single']:.3f}x single's; CPU-packed bound "
             f"{f['cpu_bound_tokens_per_s']:.0f} tok/s")
        for g, v in s["thread_groups_per_step"].items():
            line(f"  {g} ({v['threads']} threads) cpu / wait s per step",
                 f"{v['cpu_s']:.4f} / {v['wait_s']:.4f}")
    if "deepspeed" in fractions:
        f = fractions["deepspeed"]
        line("DeepSpeed pp=2 1F1B tok/s (given)", f"{f['tokens_per_s']:.0f}",
             f"{f['of_ceiling']:.3f} of ceiling, {f['of_1f1b_bound']:.3f} of 1F1B bound")


def main():
    args, pp2 = parse_args()
    reps, load = measure(args, pp2)
    result, figures = summarize(args, pp2, reps, load)
    print_table(args, pp2, result, load, figures)
    print(json.dumps(result), flush=True)


def _context_length(model_set):
    found = re.findall(r"gpt\.context_length=(\d+)", PEER_GPT + "," + model_set)
    return int(found[-1])


if __name__ == "__main__":
    main()
