#!/usr/bin/env python3
"""auto_vs_registered: `train_gpt --schedule=auto` against the best registered
schedule of the same shape, measured on this machine (issue 27, "Measured").

    ./bazelw build //experiments:train_gpt && cp -L bazel-bin/experiments/train_gpt /tmp/tg
    bench/auto_vs_registered.py --train_gpt /tmp/tg --commit $(git rev-parse --short HEAD) \\
        --pairs 2 --steps 10 --out bench/results/auto_schedule.jsonl

Per configuration, the first run is `--schedule=auto`: it trains steps 1-3
under its measurement schedule (zb_h1 for one chunk per rank, zbv for two in
V placement), times F/I/W and messages on steps 2-3, synthesises, logs the
simulated step time of the result beside every registered schedule of the
shape under the same costs and cap (1F1B's activation memory), and trains on
with the synthesised schedule. The "best registered" side is read from that
table: the lowest simulated step among the registered schedules not marked
"over the cap". 1F1B (one chunk per rank, same model and data) runs as well,
as the baseline and for the loss check. The sides run alternately, pair after
pair (the order reversed in every other pair), so machine load hits all of
them; `/proc/loadavg` is read before and after every run.

Figures per run: the median `step_s` of metrics.jsonl over steps 5..N
(1-based; auto has switched after step 3, step 4 is its first under the
synthesised schedule, and every side is measured over the same steps). Per
side the median over its runs; `speed_auto_vs_best` = best's median step /
auto's median step (>= 0.99 is the goal: auto may not lose), also per pair
(auto's run against the best side's run of the same pair) and the median of
those, which a drifting machine load disturbs less.
Losses: every step's loss of every auto run against the first 1F1B run,
relative difference (the schedules train like sequential training, so they
agree up to round-off; with --no_1f1b, against the best registered side,
named in `loss_reference`). One pipe-result/1 record per configuration.
"""

import argparse
import os
import re
import statistics
import tempfile

import bench_common as bc

COMMON = "optimizer.max_grad_norm=0,lr_schedule.name=constant,eval_interval=0,sample_tokens=0,log_interval=1"
PEER = bc.PEER_GPT_SHAPE + "," + COMMON
PEER_ARGS = ["--microbatches=8", "--micro_batch_size=4", "--pp=2"]

# name -> (--set, shape flags without --chunks, chunks, note)
CONFIGS = {
    "peer_pp2_m8_v1": (PEER, PEER_ARGS, 1,
                       "peer GPT (width 256, 8 blocks, ctx 128), pp=2, m=8, one chunk per rank"),
    "peer_pp2_m8_v2": (PEER, PEER_ARGS, 2,
                       "peer GPT, pp=2, m=8, two chunks per rank in V placement"),
    "small_pp4_m8_v1": ("gpt.num_layers=8," + COMMON, ["--microbatches=8", "--pp=4"], 1,
                        "gpt_small_pp2 shape (width 128, ctx 64, micro-batch 8) with 8 blocks, "
                        "pp=4, m=8"),
    # Uneven layers: of the 11 layers (embedding, 8 blocks, final norm, head)
    # the last stage gets 6 blocks, the first the embedding and 2 blocks.
    "peer_pp2_m8_v1_last_heavy": (PEER, PEER_ARGS + ["--partition=explicit:0,3,11"], 1,
                                  "peer GPT, pp=2, m=8, explicit:0,3,11 (embedding + 2 blocks | "
                                  "6 blocks + norm + head)"),
    "small_pp4_m8_v1_last_heavy": ("gpt.num_layers=8," + COMMON,
                                   ["--microbatches=8", "--pp=4", "--partition=explicit:0,2,3,4,11"],
                                   1, "gpt_small_pp2 shape with 8 blocks, pp=4, m=8, "
                                   "explicit:0,2,3,4,11 (1 | 1 | 1 | 5 blocks + norm + head)"),
    # V placement with the embedding alone in the first chunk: rank 0 holds
    # the embedding and the last chunk (4 blocks + norm + head), rank 1 two
    # chunks of 2 blocks. Four blocks per rank, but the V's turn on rank 0 is
    # twice rank 1's chunks, which ZB-V's fixed pattern assumes equal; m = 4
    # leaves warm-up and cool-down a large share of the step.
    "peer_pp2_m4_v2_embed_alone": (PEER, ["--microbatches=4", "--micro_batch_size=4", "--pp=2",
                                          "--partition=explicit:0,1,3,5,11"], 2,
                                   "peer GPT, pp=2, m=4, V placement, explicit:0,1,3,5,11 "
                                   "(embedding | 2 blocks | 2 blocks | 4 blocks + norm + head)"),
}

ROW = re.compile(r"^(\S+)\s+([\d.]+)\s+([\d.]+)%\s+(\S+)(.*)$")


def run(binary, cfg, schedule, chunks, steps, out_dir, name):
    sets, shape, _, _ = CONFIGS[cfg]
    cmd = [binary, "--config=experiments/configs/gpt_small_pp2.textproto",
           f"--set={sets},trace_step={steps + 1}", *shape, f"--schedule={schedule}",
           f"--chunks={chunks}", f"--steps={steps}", f"--output_dir={out_dir}", f"--name={name}"]
    start = bc.utc_now()
    proc, rundir, lines, l0, l1 = bc.run_train_gpt(cmd, out_dir, name, 1800, 3000,
                                                   load=bc.loadavg_line)
    lines = [l for l in lines if "step_s" in l]
    measured = [l["step_s"] for l in lines if l["step"] >= 5]
    result = {
        "schedule": schedule, "chunks": chunks,
        "start": bc.utc_seconds(start),
        "loadavg_before": l0, "loadavg_after": l1,
        "median_step_s": statistics.median(measured),
        "step_s": [l["step_s"] for l in lines],
        "loss": [l["loss"] for l in lines],
        "command": " ".join(cmd),
    }
    if schedule == "auto":
        result["table"] = parse_table(proc.stdout)
        result["measured_costs"] = next(
            (l.split("):", 1)[1].strip() for l in strip_rank(proc.stdout).splitlines()
             if l.startswith("schedule auto: measured ms")), None)
        if not any("schedule auto: training on with" in l or "(no trial)" in l
                   for l in proc.stdout.splitlines()):
            raise SystemExit(f"{' '.join(cmd)}: auto chose nothing")
        result["auto_chosen"] = next(
            (l.split("chosen:", 1)[1].strip()
             for l in strip_rank(proc.stdout).splitlines() if l.startswith("chosen:")), None)
        # auto's own trial (steps 4-5 against 2-3): kept, or back to zb_h1/zbv
        result["auto_check"] = next(
            (l.split("checked by measurement:", 1)[1].strip()
             for l in strip_rank(proc.stdout).splitlines() if "checked by measurement:" in l),
            None)
        # every auto run measures (and may synthesise) anew: keep its schedule
        with open(os.path.join(rundir, "auto_schedule.csv")) as f:
            result["auto_schedule_csv"] = f.read()
    return result


def strip_rank(stdout):
    # rank 0's lines come prefixed "[rank 0] " when several ranks share the terminal
    return "\n".join(re.sub(r"^\[rank \d+\] ", "", l) for l in stdout.splitlines())


def parse_table(stdout):
    text = strip_rank(stdout).split("simulated with these costs:", 1)
    if len(text) != 2:
        raise SystemExit("no comparison table in auto's output")
    rows, cap = [], None
    for line in text[1].splitlines()[1:]:
        if line.startswith("memory cap"):
            cap = line.strip()
            break
        m = ROW.match(line)
        if m is None:
            continue
        rest = m.group(5)
        lb = re.search(r"lower bound ([\d.]+)", rest)
        rows.append({"schedule": m.group(1), "sim_step_ms": float(m.group(2)),
                     "bubble_pct": float(m.group(3)), "peak_act_x_stage": float(m.group(4)),
                     "over_cap": "over the cap" in rest,
                     **({"lower_bound_ms": float(lb.group(1))} if lb else {})})
    return {"rows": rows, "cap": cap}


def best_registered(table):
    fits = [r for r in table["rows"] if r["schedule"] != "auto" and not r["over_cap"]]
    # ties (interleaved_zb at one chunk is zb_h1) go to the plainer name
    plain = ["1f1b", "zb_h1", "zbv"]
    return min(fits, key=lambda r: (r["sim_step_ms"], r["schedule"] not in plain))["schedule"]


def max_rel_diff(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def measure_config(args, cfg, tmp):
    """auto's first run, the best registered schedule its table names, and
    every side's runs (auto, best and 1f1b alternating, pair after pair)."""
    chunks = CONFIGS[cfg][2]
    runs = {}
    first = run(args.train_gpt, cfg, "auto", chunks, args.steps, tmp, f"{cfg}_auto_0")
    runs["auto"] = [first]
    best = best_registered(first["table"])
    sides = {"auto": ("auto", chunks), "best": (best, chunks)}
    if best != "1f1b" and not args.no_1f1b:
        sides["1f1b"] = ("1f1b", 1)
    print(f"{cfg}: best registered under the cap per auto's table: {best}", flush=True)
    print(f"  auto pair 0: median {first['median_step_s']:.3f} s "
          f"(load {first['loadavg_before'].split()[0]})", flush=True)
    for pair in range(args.pairs):
        order = list(sides)
        if pair % 2 == 1:
            order.reverse()
        for side in order:
            if pair == 0 and side == "auto":
                continue
            sched, ch = sides[side]
            r = run(args.train_gpt, cfg, sched, ch, args.steps, tmp, f"{cfg}_{side}_{pair}")
            runs.setdefault(side, []).append(r)
            print(f"  {side} ({sched}) pair {pair}: median {r['median_step_s']:.3f} s "
                  f"(load {r['loadavg_before'].split()[0]} -> "
                  f"{r['loadavg_after'].split()[0]})", flush=True)
    return first, best, runs


def config_figures(args, first, best, runs):
    """One configuration's figures (see the module comment)."""
    med = {s: statistics.median(r["median_step_s"] for r in rs) for s, rs in runs.items()}
    pair_speed = [b["median_step_s"] / a["median_step_s"]
                  for a, b in zip(runs["auto"], runs["best"])]
    ref = runs["1f1b"][0] if "1f1b" in runs else runs["best"][0]
    loss_diff = max(max_rel_diff(r["loss"], ref["loss"]) for r in runs["auto"])
    return {
        "best_registered": best,
        "simulated": first["table"],
        "measured_costs_ms": first["measured_costs"],
        "median_step_s": med,
        "speed_auto_vs_best": med["best"] / med["auto"],
        "speed_auto_vs_best_per_pair": pair_speed,
        "speed_auto_vs_best_median_of_pairs": statistics.median(pair_speed),
        "goal_speed_ge_0_99": med["best"] / med["auto"] >= 0.99,
        "loss_reference": ref["schedule"],
        f"loss_max_rel_diff_auto_vs_{ref['schedule']}": loss_diff,
        "losses_equal_1e-4": loss_diff <= 1e-4,
        **({"speed_auto_vs_1f1b": med.get("1f1b", med["best"]) / med["auto"]}
           if "1f1b" in med or best == "1f1b" else {}),
        "steps_measured": f"5..{args.steps}",
        "runs": {s: [{k: v for k, v in r.items() if k != "table" and
                      not (r is first and k == "measured_costs")}
                     for r in rs] for s, rs in runs.items()},
        # per auto run: its simulated step and the best registered's, from its own table
        "auto_runs_simulated_ms": [
            {row["schedule"]: row["sim_step_ms"] for row in r["table"]["rows"]
             if row["schedule"] in ("auto", best, "1f1b")} for r in runs["auto"]],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train_gpt", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--no_1f1b", action="store_true",
                    help="only auto and the best registered (losses then checked against it)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    run_id = bc.utc_now().strftime("auto_vs_registered-%Y%m%dT%H%MZ")
    cpu_model = bc.cpu_model()
    bench_cmd = (f"bench/auto_vs_registered.py --train_gpt {args.train_gpt} --commit {args.commit} "
                 f"--pairs {args.pairs} --steps {args.steps} --configs {args.configs} --out {args.out}"
                 + (" --no_1f1b" if args.no_1f1b else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in args.configs.split(","):
            start = bc.utc_now()
            first, best, runs = measure_config(args, cfg, tmp)
            figures = config_figures(args, first, best, runs)
            med, pair_speed = figures["median_step_s"], figures["speed_auto_vs_best_per_pair"]
            loss_diff = figures[f"loss_max_rel_diff_auto_vs_{figures['loss_reference']}"]
            loads = [float(x.split()[0]) for rs in runs.values() for r in rs
                     for x in (r["loadavg_before"], r["loadavg_after"])]
            record = {
                "schema": "pipe-result/1",
                "date": bc.utc_seconds(start),
                "date_end": bc.utc_seconds(),
                "commit": args.commit,
                "machine": {"nproc": os.cpu_count(), "cpu_model": cpu_model,
                            "loadavg": f"{min(loads):.1f}-{max(loads):.1f}",
                            "state": "loaded" if max(loads) > 2.5 else "idle"},
                "command": bench_cmd, "bench": "auto_vs_registered", "run": run_id,
                "config": cfg, "note": CONFIGS[cfg][3], "figures": figures,
            }
            bc.append_record(args.out, record)
            print(f"{cfg}: auto {med['auto']:.3f} s, best ({best}) {med['best']:.3f} s, "
                  f"speed auto/best {figures['speed_auto_vs_best']:.3f} "
                  f"(pairs {', '.join(f'{x:.3f}' for x in pair_speed)}); "
                  f"vs 1f1b {figures.get('speed_auto_vs_1f1b', float('nan')):.3f}; "
                  f"loss max rel diff {loss_diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
