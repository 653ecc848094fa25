"""Loads pipe's schedule CSV files with the real PyTorch (torch.distributed.pipelining).

Run by pytorch_interop_test (which writes the files and reads the results):

    python pytorch_csv_check.py MANIFEST.json RESULTS.json

MANIFEST: {"p": ranks, "cases": [{"compute": csv, "comms": csv, "dump": csv,
"m": m}, ...], "interleaved": [{"m": m, "v": v, "out": csv}, ...]}. For each
case, as a user would (rank 0 of a p-rank fake process group, with rank 0's
stages as the files place them):
  - comms:   _PipelineScheduleRuntime._load_csv(comms, "compute_comms");
  - compute: _load_csv(compute, "compute_only"), then
             _dump_csv(dump, "compute_comms") (PyTorch's own lowering);
and for each interleaved entry, ScheduleInterleaved1F1B's pipeline_order
written as a compute-only CSV. RESULTS: per case and entry, null or the error.
"""

import csv
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    ScheduleInterleaved1F1B,
    _Action,
    _PipelineScheduleRuntime,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


def loss_fn(output, target):
    return output.sum()


def rank0_stages(path, num_stages):
    """PipelineStages for the stages row 0 of a compute-only CSV names."""
    with open(path, newline="") as f:
        row = next(csv.reader(f))
    indices = set()
    for cell in row:
        if not cell:
            continue
        action = _Action.from_str(cell)
        for part in action.sub_actions or (action,):
            indices.add(part.stage_index)
    return [
        PipelineStage(torch.nn.Linear(4, 4), stage_index=s, num_stages=num_stages,
                      device=torch.device("cpu"))
        for s in sorted(indices)
    ]


def num_stages_of(path):
    largest = 0
    with open(path, newline="") as f:
        for row in csv.reader(f):
            for cell in row:
                if cell:
                    action = _Action.from_str(cell)
                    for part in action.sub_actions or (action,):
                        largest = max(largest, part.stage_index)
    return largest + 1


def main():
    manifest = json.load(open(sys.argv[1]))
    p = manifest["p"]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=p)
    results = {"torch": torch.__version__, "cases": [], "interleaved": []}
    for case in manifest["cases"]:
        out = {"comms": None, "compute": None}
        num_stages = num_stages_of(case["compute"])
        for key, fmt in (("comms", "compute_comms"), ("compute", "compute_only")):
            try:
                runtime = _PipelineScheduleRuntime(
                    rank0_stages(case["compute"], num_stages), n_microbatches=case["m"],
                    loss_fn=loss_fn)
                runtime._load_csv(case[key], format=fmt)
                if key == "compute":
                    runtime._dump_csv(case["dump"], format="compute_comms")
            except Exception as e:  # the result names it; the test fails on it
                out[key] = f"{type(e).__name__}: {e}"
        results["cases"].append(out)
    for entry in manifest["interleaved"]:
        m, v = entry["m"], entry["v"]
        try:
            stages = [
                PipelineStage(torch.nn.Linear(4, 4), stage_index=c * p, num_stages=p * v,
                              device=torch.device("cpu"))
                for c in range(v)
            ]
            schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
            with open(entry["out"], "w", newline="") as f:
                writer = csv.writer(f)
                for rank in range(p):
                    writer.writerow(
                        ["" if a is None else str(a) for a in schedule.pipeline_order[rank]])
            results["interleaved"].append(None)
        except Exception as e:
            results["interleaved"].append(f"{type(e).__name__}: {e}")
    json.dump(results, open(sys.argv[2], "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
