#!/usr/bin/env python3
"""Downloads pinned wheels once into a shared cache and unpacks them.

Used by the @libtorch2 repository rules (third_party/torch/repo.bzl):

  fetch_wheels.py --cache ~/.cache/pipe --dest ~/.cache/pipe/torch-2.11.0-cu130 \
      --wheel 'torch==2.11.0 <file name> <sha256> <member prefix>,<member prefix>' ...

Each wheel is fetched with pip (`pip download --no-deps`, the ordinary client
of the package index) into <cache>/wheels/, its sha256 checked against the
pinned one, and the named members unpacked under <dest>, keeping the wheel's
layout (torch/lib next to nvidia/*/lib, so the libraries' own
$ORIGIN/../../nvidia/... run paths find each other). A stamp file per wheel
makes a second run a no-op; a file lock keeps concurrent fetches (several
clones building at once) from racing. Nothing here is ever committed.
"""

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fail(message):
    sys.stderr.write("fetch_wheels: %s\n" % message)
    sys.exit(1)


def download(spec, file_name, sha256, wheels_dir):
    target = os.path.join(wheels_dir, file_name)
    if os.path.exists(target) and sha256_of(target) == sha256:
        return target
    # The file name pins the platform and the Python tag; the C++ libraries
    # inside do not depend on the Python version.
    python_tag = file_name.split("-")[2]
    # A compound platform tag ("manylinux2014_x86_64.manylinux_2_17_x86_64")
    # is one --platform per part: pip matches no wheel against the dotted
    # whole (it then reports only the index's placeholder version).
    platforms = file_name.rsplit("-", 1)[1][: -len(".whl")].split(".")
    tmp = tempfile.mkdtemp(dir=wheels_dir, prefix=".download-")
    try:
        command = [
            sys.executable, "-m", "pip", "download", spec, "--no-deps",
            "--only-binary=:all:", "-d", tmp, "-q",
        ]
        for platform in platforms:
            command += ["--platform", platform]
        if python_tag.startswith("cp"):
            command += ["--python-version", python_tag[2:3] + "." + python_tag[3:],
                        "--implementation", "cp"]
        sys.stderr.write("fetch_wheels: downloading %s (%s) once into %s\n" %
                         (spec, file_name, wheels_dir))
        result = subprocess.run(command)
        if result.returncode != 0:
            fail("'%s' failed with exit code %d; pip must reach the package index "
                 "(or set PP_LIBTORCH_DIR to a LibTorch folder)" %
                 (" ".join(command), result.returncode))
        fetched = os.path.join(tmp, file_name)
        if not os.path.exists(fetched):
            fail("pip did not produce %s (got: %s)" % (file_name, ", ".join(os.listdir(tmp))))
        actual = sha256_of(fetched)
        if actual != sha256:
            fail("%s has sha256 %s, the pinned one is %s" % (file_name, actual, sha256))
        os.replace(fetched, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def unpack(wheel, prefixes, dest):
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if not any(info.filename.startswith(p) for p in prefixes):
                continue
            path = archive.extract(info, dest)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--wheel", action="append", default=[],
                        help="'<pip spec> <file name> <sha256> <prefix>[,<prefix>...]'")
    args = parser.parse_args()
    wheels_dir = os.path.join(args.cache, "wheels")
    os.makedirs(wheels_dir, exist_ok=True)
    os.makedirs(args.dest, exist_ok=True)
    with open(os.path.join(args.cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for entry in args.wheel:
            fields = entry.split()
            if len(fields) != 4:
                fail("--wheel '%s': want '<spec> <file> <sha256> <prefixes>'" % entry)
            spec, file_name, sha256, prefixes = fields
            stamp = os.path.join(args.dest, ".unpacked-" + sha256)
            if os.path.exists(stamp):
                continue
            wheel = download(spec, file_name, sha256, wheels_dir)
            unpack(wheel, prefixes.split(","), args.dest)
            open(stamp, "w").close()


if __name__ == "__main__":
    main()
