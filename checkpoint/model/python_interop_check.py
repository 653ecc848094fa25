"""Loads every tensor file of a pipe checkpoint with Python's torch.load and
compares it with a JSON reference dump written by the C++ test.

usage: python_interop_check.py CHECKPOINT_DIR REFERENCE_JSON
Exits 0 when every file loads and every tensor is bitwise equal.
"""
import json
import os
import re
import sys

import torch

DTYPES = {"Float": torch.float32, "Double": torch.float64, "Long": torch.int64,
          "Int": torch.int32, "Byte": torch.uint8, "Bool": torch.bool}


def main():
    ckpt, ref_path = sys.argv[1], sys.argv[2]
    with open(ref_path) as f:
        reference = json.load(f)
    with open(os.path.join(ckpt, "manifest.textproto")) as f:
        manifest_files = re.findall(r'^\s*path: "([^"]+)"', f.read(), re.M)
    if sorted(manifest_files) != sorted(reference):
        print("manifest files", sorted(manifest_files), "!= reference", sorted(reference))
        return 1
    checked = 0
    for name in manifest_files:
        state = torch.load(os.path.join(ckpt, name), map_location="cpu")
        want = reference[name]
        if not isinstance(state, dict) or list(state) != list(want):
            print(name, ": keys", list(state) if isinstance(state, dict) else type(state), "!=", list(want))
            return 1
        for key, spec in want.items():
            t = state[key]
            expected = torch.tensor(spec["values"], dtype=DTYPES[spec["dtype"]]).reshape(spec["shape"])
            if t.dtype != expected.dtype or list(t.shape) != spec["shape"] or not torch.equal(t, expected):
                print(name, key, ": got", t.dtype, list(t.shape), "expected", expected.dtype, spec["shape"])
                return 1
            checked += 1
    print("python torch %s loaded %d files, %d tensors equal" % (torch.__version__, len(manifest_files), checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
