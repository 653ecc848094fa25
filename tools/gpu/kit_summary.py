#!/usr/bin/env python3
"""The GPU kit's bookkeeping, called by run_on_device.sh (stdlib only: it runs
with the GPU machine's python3). Each subcommand prints one JSON record that
the script appends to its records file; `assemble` turns the records into the
one summary.json the run leaves in its output folder.

  kit_summary.py tests NAME FILTER XML RC SECONDS TIMEOUT_S
  kit_summary.py train NAME METRICS_JSONL RC SECONDS TIMEOUT_S
  kit_summary.py compare CPU_METRICS DEVICE_METRICS RTOL STEPS [NAME]
  kit_summary.py bench PIPE_LOG TORCH_LOG TARGET [NAME]   (logs of alternating rounds)
  kit_summary.py assemble RECORDS_JSONL HEADER_JSON OUT_JSON
"""
import json
import statistics
import sys
import xml.etree.ElementTree as ET


def tests(name, gtest_filter, xml_path, rc, seconds, timeout_s):
    rec = {"kind": "tests", "binary": name, "filter": gtest_filter, "rc": int(rc),
           "seconds": float(seconds), "timeout_s": int(timeout_s), "tests": 0, "failures": 0,
           "skipped": 0, "failed": [], "skipped_cases": [], "skip_reasons": {}}
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as e:
        rec["error"] = "no gtest XML (%s): the binary did not finish" % e
        rec["ok"] = False
        return rec
    for case in root.iter("testcase"):
        full = "%s.%s" % (case.get("classname"), case.get("name"))
        if case.get("status") == "notrun":
            continue
        rec["tests"] += 1
        failure = case.find("failure")
        skipped = case.find("skipped")
        if failure is not None:
            rec["failures"] += 1
            if len(rec["failed"]) < 50:
                rec["failed"].append({"case": full, "message": (failure.get("message") or "")[:500]})
        elif skipped is not None or case.get("result") == "skipped":
            rec["skipped"] += 1
            message = (skipped.get("message") if skipped is not None else "") or ""
            if "\n" in message:  # gtest puts "file:line" first
                message = message.split("\n", 1)[1]
            # Why, with a count: hundreds of cases skip for the same reason.
            reasons = rec["skip_reasons"]
            reasons[message[:300]] = reasons.get(message[:300], 0) + 1
            if len(rec["skipped_cases"]) < 5:
                rec["skipped_cases"].append(full)
    if rec["tests"] == 0:
        rec["error"] = "the filter selected no test case"
    rec["ok"] = rec["rc"] == 0 and rec["tests"] > 0 and rec["failures"] == 0
    return rec


def losses(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def train(name, metrics, rc, seconds, timeout_s):
    rec = {"kind": "train", "name": name, "rc": int(rc), "seconds": float(seconds),
           "timeout_s": int(timeout_s)}
    try:
        rows = losses(metrics)
    except (OSError, ValueError) as e:
        rec.update(ok=False, error="no metrics.jsonl (%s)" % e)
        return rec
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][10:]
    rec.update(steps=len(rows), loss_first=rows[0]["loss"] if rows else None,
               loss_last=rows[-1]["loss"] if rows else None,
               eval_loss=next((r["eval_loss"] for r in reversed(rows) if "eval_loss" in r), None),
               tokens_per_s_median=statistics.median(rates) if rates else None)
    rec["ok"] = rec["rc"] == 0 and len(rows) > 0
    return rec


def compare(cpu_metrics, device_metrics, rtol, steps, name=None):
    rec = {"kind": "compare", "rtol": float(rtol), "steps": int(steps)}
    if name:
        rec["name"] = name
    try:
        a = [r["loss"] for r in losses(cpu_metrics)]
        b = [r["loss"] for r in losses(device_metrics)]
    except (OSError, ValueError, KeyError) as e:
        rec.update(ok=False, error="missing metrics (%s)" % e)
        return rec
    rec["cpu_losses"], rec["device_losses"] = a, b
    if len(a) != int(steps) or len(b) != int(steps):
        rec.update(ok=False, error="expected %s losses each, got cpu %d, device %d" % (steps, len(a), len(b)))
        return rec
    rel = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)]
    worst = max(range(len(rel)), key=lambda i: rel[i])
    rec.update(max_rel_diff=rel[worst], worst_step=worst + 1, ok=rel[worst] <= float(rtol))
    return rec


def _json_lines(path, system):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{") and '"bench"' in line:
                    r = json.loads(line)
                    if r.get("system") == system:
                        out.append(r)
    except OSError:
        pass
    return out


def model_flops_per_token(config):
    """Training FLOPs per token of the benched model (forward + backward: 6 per
    weight of every matrix product, the LM head included, plus 12 * layers *
    width * context for attention's scores and weighted sum, PaLM's count,
    causal masking not discounted); None for a model it does not know."""
    try:
        width, layers, context, vocab = (int(config[k]) for k in ("width", "layers", "context", "vocab"))
        if config.get("model") == "llama":
            head_dim = width // int(config["heads"])
            per_layer = (2 * width * width + 2 * width * int(config["kv_heads"]) * head_dim
                         + 3 * width * int(config["intermediate"]))
        elif config.get("model", "gpt") == "gpt":
            per_layer = 12 * width * width  # q, k, v, out and the 4x MLP
        else:
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return 6 * (layers * per_layer + width * vocab) + 12 * layers * width * context


# Dense peak FLOP/s per GPU by name and precision (NVIDIA's data sheets, SXM
# parts; fp32 without TF32, which the kit keeps off).
PEAK_FLOPS = {"H100": {"bf16": 989.4e12, "fp32": 66.9e12},
              "H200": {"bf16": 989.4e12, "fp32": 66.9e12}}


def peak_flops(gpu, precision):
    for name, peaks in PEAK_FLOPS.items():
        if name in (gpu or ""):
            return peaks.get(precision)
    return None


def bench(pipe_log, torch_log, target, name=None):
    rec = {"kind": "bench", "target_ratio": float(target)}
    if name:
        rec["name"] = name
    pipe, ref = _json_lines(pipe_log, "pipe"), _json_lines(torch_log, "pytorch")
    if not pipe or not ref:
        rec.update(ok=False, error="rounds finished: pipe %d, pytorch %d" % (len(pipe), len(ref)))
        return rec
    # Each side's best round (the median step of a round), as rounds alternate.
    best_pipe = max(pipe, key=lambda r: r["tokens_per_s"])
    best_ref = max(ref, key=lambda r: r["tokens_per_s"])
    keys = ("device", "model", "precision", "vocab", "width", "layers", "heads", "kv_heads",
            "intermediate", "context", "micro_batch_size", "microbatches", "tokens_per_step",
            "parameters")
    rec["config"] = {k: best_pipe.get(k) for k in keys if k in best_pipe}
    rec["model_flops_per_token"] = model_flops_per_token(best_pipe)
    rec["pytorch_fused_adamw"] = best_ref.get("fused_adamw")
    rec["pipe_tokens_per_s"] = [r["tokens_per_s"] for r in pipe]
    rec["pytorch_tokens_per_s"] = [r["tokens_per_s"] for r in ref]
    rec["pipe_median_step_s"] = best_pipe["median_step_s"]
    rec["pytorch_median_step_s"] = best_ref["median_step_s"]
    rec["pytorch_version"] = best_ref.get("torch")
    rec["ratio"] = best_pipe["tokens_per_s"] / best_ref["tokens_per_s"]
    rec["meets_target"] = rec["ratio"] >= float(target)
    rec["ok"] = True  # ran; the ratio against the target is a finding, not a failure
    return rec


def assemble(records_path, header_path, out_path):
    with open(header_path) as f:
        summary = json.load(f)
    records = losses(records_path) if records_path else []
    summary["tests"] = [r for r in records if r["kind"] == "tests"]
    for kind in ("train", "compare", "bench"):
        summary[kind] = [r for r in records if r["kind"] == kind]
    # Model FLOPs utilisation of each side, where the GPU's peak is known.
    gpu = summary.get("machine", {}).get("gpu", "")
    for r in summary["bench"]:
        peak = peak_flops(gpu, (r.get("config") or {}).get("precision", "fp32"))
        flops = r.get("model_flops_per_token")
        if peak and flops and r.get("ok"):
            r["peak_flops"] = peak
            r["pipe_mfu"] = flops * max(r["pipe_tokens_per_s"]) / peak
            r["pytorch_mfu"] = flops * max(r["pytorch_tokens_per_s"]) / peak
    for r in records:
        if r["kind"] == "stage":
            summary.setdefault("stages", []).append(r)
    t = summary["tests"]
    summary["tests_total"] = {
        "binaries": len(t), "binaries_ok": sum(1 for r in t if r["ok"]),
        "cases": sum(r["tests"] for r in t), "failures": sum(r["failures"] for r in t),
        "skipped": sum(r["skipped"] for r in t)}
    summary["ok"] = all(r.get("ok", False) for r in records if r["kind"] != "stage") and bool(records)
    with open(out_path, "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")
    return {"kind": "assembled", "ok": summary["ok"], "path": out_path}


def main(argv):
    # name -> (function, fewest arguments, most arguments)
    commands = {"tests": (tests, 6, 6), "train": (train, 5, 5), "compare": (compare, 4, 5),
                "bench": (bench, 3, 4), "assemble": (assemble, 3, 3)}
    if (len(argv) < 2 or argv[1] not in commands
            or not commands[argv[1]][1] <= len(argv) - 2 <= commands[argv[1]][2]):
        sys.stderr.write(__doc__)
        return 2
    print(json.dumps(commands[argv[1]][0](*argv[2:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
