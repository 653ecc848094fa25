#!/usr/bin/env python3
"""Shows or replaces the run path of an x86-64 ELF file, in place.

tools/gpu/bundle.sh copies binaries and libraries out of Bazel's tree into the
GPU bundle; their run paths name folders of this machine (Bazel's _solib_k8,
the pinned LibTorch in ~/.cache/pipe), which do not exist on the GPU machine
and, as DT_RPATH, would even be searched before LD_LIBRARY_PATH here (so a
rehearsal could silently load this machine's LibTorch instead of the
site-packages one). This rewrites the entry to a new string (which must not be
longer than the old: the string is overwritten inside .dynstr) and makes it a
DT_RUNPATH, which LD_LIBRARY_PATH takes precedence over. No patchelf needed.

  elf_runpath.py FILE                 # prints the run path ('' when none)
  elf_runpath.py FILE '$ORIGIN/../lib'   # replaces it (no-op without one)
  elf_runpath.py --list FILE...       # one line per file: FILE<TAB>run path
"""

import struct
import sys

DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29
PT_LOAD, PT_DYNAMIC = 1, 2


class ElfError(Exception):
    pass


def _dynamic(data):
    """(offset of each dynamic entry, tag, value) and the file offset of .dynstr."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dyn = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dyn = (p_offset, p_filesz)
    if dyn is None:
        return [], None  # static: nothing to do
    entries, strtab = [], None
    for off in range(dyn[0], dyn[0] + dyn[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == DT_NULL:
            break
        entries.append((off, tag, val))
        if tag == DT_STRTAB:
            strtab = val
    if strtab is None:
        raise ElfError("dynamic section without DT_STRTAB")
    for vaddr, offset, size in loads:
        if vaddr <= strtab < vaddr + size:
            return entries, strtab - vaddr + offset
    raise ElfError("DT_STRTAB is in no loaded segment")


def _string(data, at):
    end = data.index(b"\0", at)
    return data[at:end].decode()


def run_path(path):
    with open(path, "rb") as f:
        data = f.read()
    entries, strtab = _dynamic(data)
    for _, tag, val in entries:
        if tag in (DT_RPATH, DT_RUNPATH):
            return _string(data, strtab + val)
    return ""


def set_run_path(path, new):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    entries, strtab = _dynamic(bytes(data))
    changed = False
    for off, tag, val in entries:
        if tag not in (DT_RPATH, DT_RUNPATH):
            continue
        at = strtab + val
        old = _string(bytes(data), at)
        if len(new) > len(old):
            raise ElfError("%s: new run path %r is longer than the old %r" % (path, new, old))
        data[at:at + len(old)] = new.encode() + b"\0" * (len(old) - len(new))
        struct.pack_into("<q", data, off, DT_RUNPATH)
        changed = True
    if changed:
        with open(path, "wb") as f:
            f.write(data)
    return changed


def main(argv):
    if len(argv) >= 2 and argv[1] == "--list":
        status = 0
        for path in argv[2:]:
            try:
                print("%s\t%s" % (path, run_path(path)))
            except (ElfError, OSError, ValueError) as e:
                sys.stderr.write("elf_runpath: %s: %s\n" % (path, e))
                status = 1
        return status
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    try:
        if len(argv) == 2:
            print(run_path(argv[1]))
        else:
            set_run_path(argv[1], argv[2])
    except (ElfError, OSError, ValueError) as e:
        sys.stderr.write("elf_runpath: %s: %s\n" % (argv[1], e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
