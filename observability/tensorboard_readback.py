#!/usr/bin/env python3
"""Reads event files with the real TensorBoard and checks them against expectations.

  tensorboard_readback.py LOGDIR EXPECTED_JSON

EXPECTED_JSON: {"scalars": {tag: [[step, value, wall_time], ...]},
                "texts":   {tag: [[step, text], ...]}}
Every scalar series must hold exactly those steps, with the value rounded to
float32 (TensorBoard stores scalars as float32) and the wall time; every text
exactly those strings; and no other scalar or text tags may exist. Checked
twice: with EventAccumulator (the classic loader) and with the plugin event
accumulator the TensorBoard server feeds its Scalars and Text dashboards from.

Exit status: 0 all match, 1 a mismatch (printed), 77 TensorBoard cannot be
imported or installed (reason printed; the caller skips).

TensorBoard comes from the system if importable, else from a private target
directory, installed there once with pip from the Python package index:
  $PIPE_PYTHON_CACHE (default ${XDG_CACHE_HOME:-<home>/.cache}/pipe-python)
      /tensorboard-<version>-<python tag>
PIPE_NO_PIP=1 never installs (skips instead); PIPE_TENSORBOARD_VERSION pins
another version.
"""

import fcntl
import json
import os
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
DEFAULT_VERSION = "2.21.0"


def cache_dir():
    root = os.environ.get("PIPE_PYTHON_CACHE")
    if not root:
        # Bazel points HOME at the test's temporary directory: use the real
        # home, so the install survives the test.
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
            pwd.getpwuid(os.getuid()).pw_dir, ".cache")
        root = os.path.join(base, "pipe-python")
    return root


def import_tensorboard():
    """Returns None once tensorboard imports, else the reason it cannot."""
    try:
        import tensorboard  # noqa: F401
        return None
    except ImportError:
        pass
    version = os.environ.get("PIPE_TENSORBOARD_VERSION", DEFAULT_VERSION)
    root = cache_dir()
    target = os.path.join(root, "tensorboard-%s-%s" % (version, sys.implementation.cache_tag))
    if not os.path.isdir(target):
        if os.environ.get("PIPE_NO_PIP"):
            return "tensorboard is not importable and PIPE_NO_PIP is set"
        reason = install(root, target, version)
        if reason:
            return reason
    sys.path.insert(0, target)
    try:
        import tensorboard  # noqa: F401
        return None
    except ImportError as e:
        return "tensorboard installed in %s does not import: %s" % (target, e)


def install(root, target, version):
    """pip-installs tensorboard==version into target; returns None or the reason it failed."""
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        return "cannot create the cache directory %s: %s" % (root, e)
    with open(os.path.join(root, ".lock"), "w") as lock:
        # Another test process may be installing the same thing.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(target):
            return None
        staging = tempfile.mkdtemp(prefix=".install-", dir=root)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "--no-input", "--target", staging, "tensorboard==" + version]
        print("installing TensorBoard once: " + " ".join(command), flush=True)
        try:
            result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    timeout=600, text=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            shutil.rmtree(staging, ignore_errors=True)
            return "pip install of tensorboard failed: %s" % e
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            return "pip install of tensorboard failed (exit %d):\n%s" % (
                result.returncode, result.stdout[-3000:])
        # Only a complete install ever appears under the final name.
        os.rename(staging, target)
    return None


def as_float32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


class Checker:
    def __init__(self):
        self.errors = []

    def check(self, ok, message):
        if not ok:
            self.errors.append(message)

    def scalars(self, loader, read, expected, tags):
        self.check(sorted(tags) == sorted(expected),
                   "%s: scalar tags %s, expected %s" % (loader, sorted(tags), sorted(expected)))
        for tag, points in expected.items():
            if tag not in tags:
                continue
            got = read(tag)
            want = [(step, as_float32(value), wall) for step, value, wall in points]
            self.check(got == want,
                       "%s: scalar %r:\n  got      %s\n  expected %s" % (loader, tag, got, want))

    def texts(self, loader, read, expected, tags):
        self.check(sorted(tags) == sorted(expected),
                   "%s: text tags %s, expected %s" % (loader, sorted(tags), sorted(expected)))
        for tag, points in expected.items():
            if tag not in tags:
                continue
            got = read(tag)
            want = [(step, text) for step, text in points]
            self.check(got == want,
                       "%s: text %r:\n  got      %r\n  expected %r" % (loader, tag, got, want))


def plugin_tags(accumulator, plugin):
    try:
        return list(accumulator.PluginTagToContent(plugin))
    except KeyError:  # no tag of that plugin at all
        return []


def text_of(tensor_proto):
    values = list(tensor_proto.string_val)
    if len(values) != 1 or tensor_proto.tensor_shape.dim:
        return "<not a scalar string tensor: %s>" % tensor_proto
    return values[0].decode("utf-8")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    logdir, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    reason = import_tensorboard()
    if reason:
        print("SKIP: the real TensorBoard is unavailable: " + reason)
        return SKIP
    import tensorboard
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    files = [f for f in os.listdir(logdir) if "tfevents" in f]
    if len(files) != 1:
        print("expected one event file in %s, found %s" % (logdir, files))
        return 1
    checker = Checker()
    want_scalars = expected.get("scalars", {})
    want_texts = expected.get("texts", {})

    # The classic loader: simple_value scalars, text as tensors.
    classic = event_accumulator.EventAccumulator(
        logdir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    classic.Reload()
    tags = classic.Tags()
    checker.scalars("EventAccumulator", lambda t: [(e.step, e.value, e.wall_time)
                                                   for e in classic.Scalars(t)],
                    want_scalars, tags["scalars"])
    checker.texts("EventAccumulator", lambda t: [(e.step, text_of(e.tensor_proto))
                                                 for e in classic.Tensors(t)],
                  want_texts, tags["tensors"])

    # What the dashboards read: scalars migrated to tensors of the "scalars"
    # plugin, texts under the "text" plugin.
    served = plugin_event_accumulator.EventAccumulator(
        logdir, size_guidance={plugin_event_accumulator.TENSORS: 0})
    served.Reload()
    checker.scalars("plugin_event_accumulator", lambda t: [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time)
        for e in served.Tensors(t)], want_scalars, plugin_tags(served, "scalars"))
    checker.texts("plugin_event_accumulator", lambda t: [(e.step, text_of(e.tensor_proto))
                                                         for e in served.Tensors(t)],
                  want_texts, plugin_tags(served, "text"))

    if checker.errors:
        print("\n".join(checker.errors))
        return 1
    print("TensorBoard %s read %d scalar series (%d points) and %d text series from %s: all match"
          % (tensorboard.__version__, len(want_scalars),
             sum(len(p) for p in want_scalars.values()), len(want_texts), files[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
