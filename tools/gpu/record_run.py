#!/usr/bin/env python3
"""Appends one bench/results record (schema pipe-result/1) for a GPU kit run:
the figures a reader looks for first, plus the run's whole summary.json.

  tools/gpu/record_run.py SUMMARY_JSON --bench=gpu_kit|gpu_kit_rehearsal --command=CMD
      --exit_status=N --machine=WORDS [--state=idle|loaded] [--note=TEXT] >> bench/results/<bench>.jsonl

rehearse.sh records its CPU rehearsals with it; a device run's summary.json
(fetched from the device tool's files) is recorded the same way, with the
device's description as --machine.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def record(summary, bench, command, exit_status, machine, state, note, commit, now):
    totals = summary.get("tests_total", {})
    bench_rows = summary.get("bench") or [{}]
    compare = summary.get("compare") or [{}]
    figures = {"tests_cases": totals.get("cases"), "tests_failed": totals.get("failures"),
               "tests_skipped": totals.get("skipped"),
               "bundle_bytes": summary.get("bundle", {}).get("bytes"),
               "compare_max_rel_diff": compare[0].get("max_rel_diff"),
               "bench_ratio": bench_rows[0].get("ratio"), "seconds": summary.get("seconds"),
               "ok": summary.get("ok")}
    # Named rows (several compares and benches per run) each get a figure.
    for row in bench_rows:
        if row.get("name"):
            figures["bench_ratio_" + row["name"]] = row.get("ratio")
    for row in compare:
        if row.get("name"):
            figures["max_rel_diff_" + row["name"]] = row.get("max_rel_diff")
    host = summary.get("machine", {})
    rec = {"schema": "pipe-result/1", "bench": bench,
           "date": summary.get("date_utc") or now, "commit": commit,
           "machine": {"nproc": host.get("nproc") or os.cpu_count(),
                       "loadavg": host.get("loadavg") or list(os.getloadavg()),
                       "state": state, "what": machine},
           "command": command, "exit_status": int(exit_status), "figures": figures,
           "summary": summary}
    # The CPU and its BLAS (the CPU runs' kernels), as every result record names them.
    for key in ("gpu", "cpu_model", "blas"):
        if host.get(key):
            rec["machine"][key] = host[key]
    if note:
        rec["note"] = note
    return rec


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary")
    p.add_argument("--bench", required=True, choices=["gpu_kit", "gpu_kit_rehearsal"])
    p.add_argument("--command", required=True)
    p.add_argument("--exit_status", type=int, required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--state", default="loaded", choices=["idle", "loaded"])
    p.add_argument("--note", default="")
    a = p.parse_args(argv)
    try:
        with open(a.summary) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        summary = {"error": "no summary.json: %s" % e}
    # The bundle's commit (what ran), else this checkout's.
    commit = str(summary.get("bundle", {}).get("commit", "")).split("+")[0]
    if not commit:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(record(summary, a.bench, a.command, a.exit_status, a.machine, a.state,
                            a.note, commit, now), sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
