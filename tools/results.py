#!/usr/bin/env python3
"""Benchmark result files (bench/results/*.jsonl): validate, record, render, check.

A result file holds one JSON object per line, one per measured run (the schema is
in bench/results/README.md). Docs quote figures only through tables this tool
renders from those files: a named *view* (bench/results/views.json) says which
file, which records, which columns and how each cell is formatted. In a Markdown
file a rendered table sits between two HTML comments:

    <!-- results:VIEW -->
    | ... the table this tool wrote ... |
    <!-- /results -->

  tools/results.py --validate [FILES]   every record of the files (default: all)
  tools/results.py --render VIEW        print the view's table
  tools/results.py --check [DOCS...]    fail if a marked table differs (names file, view, diff);
                                        default: README.md, docs/**/*.md, package READMEs
  tools/results.py --write [DOCS...]    rewrite the marked tables
  tools/results.py --record FILE --bench NAME --command CMD --figures JSON [--config C]
                                        append a record with date, commit and machine facts

Debian's python3 only (no third-party modules), so CI and every helper can run it.
"""

import argparse
import datetime
import difflib
import glob
import json
import os
import re
import string
import subprocess
import sys

SCHEMA = "pipe-result/1"
MARK_RE = re.compile(r"^\s*<!-- results:([A-Za-z0-9_.-]+) -->\s*$")
END_MARK = "<!-- /results -->"
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?Z)?$")


class ResultsError(Exception):
    """A bad record, view or document: the message names where."""


def repo_root():
    """The workspace root: BUILD_WORKSPACE_DIRECTORY under `bazel run`, else ../ of this file."""
    env = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    if env:
        return env
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_results_dir(root=None):
    return os.path.join(root or repo_root(), "bench", "results")


# --------------------------------------------------------------------------- records


def lookup(record, path):
    """The value at a dotted path ("figures.tokens_per_s"), or None when absent."""
    value = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value


def validate_record(record, where):
    """Errors (strings naming `where` and the field) of one record; [] when valid.

    Required: date (UTC, ISO 8601), commit, machine.nproc, machine.loadavg, command.
    Optional `note`: free text, the run's reading in words (the dated paragraphs the
    docs once carried live here, on the record they describe), never empty.
    A record converted from the README's prose (`"history": true`) may give null for
    a commit or load average the prose did not record; a new measurement may not.
    """
    errors = []
    if not isinstance(record, dict):
        return ["%s: a record must be a JSON object, got %s" % (where, type(record).__name__)]
    history = record.get("history") is True
    date = record.get("date")
    if not isinstance(date, str) or not DATE_RE.match(date):
        errors.append("%s: date %r is not a UTC date like 2026-11-24T08:16Z or 2026-11-24" %
                      (where, date))
    if "commit" not in record:
        errors.append("%s: no commit (the git commit measured; null only in history records)" %
                      where)
    elif record["commit"] is None and not history:
        errors.append("%s: commit is null; only history records (\"history\": true) may lack it" %
                      where)
    elif record["commit"] is not None and not re.match(r"^[0-9a-f]{7,40}$", str(record["commit"])):
        errors.append("%s: commit %r is not a git hash (7-40 hex digits)" % (where, record["commit"]))
    machine = record.get("machine")
    if not isinstance(machine, dict):
        errors.append("%s: no machine object (nproc, loadavg, cpu_model)" % where)
    else:
        nproc = machine.get("nproc")
        if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
            errors.append("%s: machine.nproc %r must be a positive integer" % (where, nproc))
        if "loadavg" not in machine:
            errors.append("%s: no machine.loadavg (the /proc/loadavg line, or the range the run "
                          "saw)" % where)
        elif machine["loadavg"] is None and not history:
            errors.append("%s: machine.loadavg is null; only history records may lack it" % where)
    command = record.get("command")
    if not isinstance(command, str) or not command.strip():
        errors.append("%s: command %r must be the command line that produced the figures" %
                      (where, command))
    if "figures" in record and not isinstance(record["figures"], dict):
        errors.append("%s: figures must be an object of name -> value" % where)
    if "note" in record:
        note = record["note"]
        if not isinstance(note, str) or not note.strip():
            errors.append("%s: note %r must be text (what the run showed, in words); leave it "
                          "out when there is none" % (where, note))
    return errors


def load_records(path):
    """The records of one .jsonl file, each with "_file" and "_line"; raises on bad JSON."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ResultsError("%s:%d: not JSON: %s" % (path, number, e))
            if isinstance(record, dict):
                record["_file"] = path
                record["_line"] = number
            records.append(record)
    return records


def validate_files(paths):
    """All errors of the files' records."""
    errors = []
    for path in paths:
        try:
            records = load_records(path)
        except (OSError, ResultsError) as e:
            errors.append(str(e))
            continue
        for record in records:
            where = "%s:%s" % (path, record.get("_line", "?") if isinstance(record, dict) else "?")
            errors.extend(validate_record(record, where))
    return errors


def blas_facts():
    """The BLAS Debian's LibTorch loads (libblas.so.3) and the kernel it picks here.

    OpenBLAS picks its kernel when it loads, from the CPU and OPENBLAS_CORETYPE,
    so loading it in this process (same environment as the run) sees what the
    run saw (issue #43: a generic kernel is several times slower). {} when
    there is no libblas.so.3; no kernel for a BLAS that does not name one.
    """
    import ctypes
    try:
        lib = ctypes.CDLL("libblas.so.3")
    except OSError:
        return {}
    facts = {}
    for name, key in (("openblas_get_config", "blas"), ("openblas_get_corename", "blas_kernel")):
        function = getattr(lib, name, None)
        if function is None:
            continue
        function.restype = ctypes.c_char_p
        value = function()
        if value:
            facts[key] = value.decode("utf-8", "replace").strip()
    facts.setdefault("blas", "libblas.so.3 (not OpenBLAS)")
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    if coretype:
        facts["openblas_coretype"] = coretype
    return facts


def machine_facts():
    """nproc, the CPU's model name, the BLAS and its kernel and /proc/loadavg, now."""
    facts = {"nproc": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    facts["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    facts.update(blas_facts())
    try:
        with open("/proc/loadavg") as f:
            facts["loadavg"] = f.read().strip()
    except OSError:
        facts["loadavg"] = None
    return facts


def current_commit(root):
    """HEAD's hash and whether the tree has uncommitted changes."""
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                          universal_newlines=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                           stdout=subprocess.PIPE, universal_newlines=True,
                           check=True).stdout.strip() != ""
    return head, dirty


def make_record(bench, command, figures, config=None, note=None, root=None):
    """A new record for a run that just ended: date, commit and machine filled in here."""
    head, dirty = current_commit(root or repo_root())
    record = {
        "schema": SCHEMA,
        "bench": bench,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": head,
        "dirty": dirty,
        "machine": machine_facts(),
        "command": command,
    }
    if config is not None:
        record["config"] = config
    record["figures"] = figures
    if note:
        record["note"] = note
    return record


# --------------------------------------------------------------------------- views


class CellFormatter(string.Formatter):
    """str.format over a record, with `!j` joining a list (each item formatted by the
    spec), so "{figures[runs]!j:.0f}" gives "3077, 2878"."""

    def convert_field(self, value, conversion):
        if conversion == "j":
            return _Joined(value)
        return super().convert_field(value, conversion)

    def format_field(self, value, format_spec):
        if isinstance(value, _Joined):
            return ", ".join(format(item, format_spec) for item in value.items)
        return format(value, format_spec)

    def get_field(self, field_name, args, kwargs):
        obj, first = super().get_field(field_name, args, kwargs)
        if obj is None:
            raise KeyError(field_name)
        return obj, first


class _Joined:
    def __init__(self, items):
        if not isinstance(items, list):
            raise TypeError("!j needs a list, got %r" % (items,))
        self.items = items


def load_views(path):
    try:
        with open(path, encoding="utf-8") as f:
            views = json.load(f)
    except (OSError, ValueError) as e:
        raise ResultsError("%s: %s" % (path, e))
    if not isinstance(views, dict):
        raise ResultsError("%s: views must be an object of name -> view" % path)
    return views


def select(records, view):
    """The view's rows: records matching `where` (dotted path -> value, or a list of
    allowed values), then with `latest_per` (a dotted path) only the latest record
    (by date, then file order) of each value, in the order of their first record."""
    where = view.get("where", {})
    rows = []
    for record in records:
        ok = True
        for path, want in where.items():
            got = lookup(record, path)
            if isinstance(want, list):
                ok = got in want
            else:
                ok = got == want
            if not ok:
                break
        if ok:
            rows.append(record)
    key_path = view.get("latest_per")
    if key_path:
        latest = {}
        order = []
        for record in rows:
            key = json.dumps(lookup(record, key_path), sort_keys=True)
            if key not in latest:
                order.append(key)
                latest[key] = record
            elif record.get("date", "") >= latest[key].get("date", ""):
                latest[key] = record
        rows = [latest[k] for k in order]
    return rows


def render_cell(record, column, view_name):
    """One cell: the column's `cell` template over the record; when a field it names is
    absent, its `missing_cell` template, else `missing` (default empty)."""
    text = None
    for key in ("cell", "missing_cell"):
        if key not in column:
            continue
        try:
            text = CellFormatter().vformat(column[key], (), record)
            break
        except (KeyError, IndexError):
            continue
        except (TypeError, ValueError) as e:
            raise ResultsError("view %s, column %r, record %s:%s: %s" % (
                view_name, column.get("header"), record.get("_file"), record.get("_line"), e))
    if text is None:
        return column.get("missing", "")
    if column.get("unicode_minus"):
        text = re.sub(r"(?<![\w.])-(?=\d)", "\u2212", text)
    if column.get("id") and column["id"] in record.get("bold", []):
        text = "**%s**" % text
    return text


def render_view(name, views, results_dir):
    """The Markdown table (lines, no trailing newline) of view `name`."""
    if name not in views:
        raise ResultsError("no view %r; views: %s" % (name, ", ".join(sorted(views))))
    view = views[name]
    path = os.path.join(results_dir, view["file"])
    if not os.path.exists(path):
        raise ResultsError("view %s: result file %s does not exist" % (name, path))
    rows = select(load_records(path), view)
    if not rows:
        raise ResultsError("view %s: no record of %s matches %s" % (
            name, view["file"], json.dumps(view.get("where", {}))))
    columns = view["columns"]
    lines = ["| " + " | ".join(c["header"] for c in columns) + " |",
             "|" + "|".join(c.get("align", "---") for c in columns) + "|"]
    for record in rows:
        lines.append("| " + " | ".join(render_cell(record, c, name) for c in columns) + " |")
    return [line.replace("|  |", "| |") for line in lines]


# --------------------------------------------------------------------------- documents


def marked_tables(text, path):
    """(view, start, end) for each marked table: lines[start:end] are the table's lines."""
    lines = text.split("\n")
    found = []
    in_fence = False
    i = 0
    while i < len(lines):
        if re.match(r"^\s*(```|~~~)", lines[i]):
            in_fence = not in_fence  # markers shown as examples in code are not tables
        m = None if in_fence else MARK_RE.match(lines[i])
        if m:
            for j in range(i + 1, len(lines)):
                if lines[j].strip() == END_MARK:
                    found.append((m.group(1), i + 1, j))
                    i = j
                    break
                if MARK_RE.match(lines[j]):
                    raise ResultsError("%s:%d: results:%s opened again before %s" % (
                        path, j + 1, m.group(1), END_MARK))
            else:
                raise ResultsError("%s:%d: results:%s has no closing %s" % (
                    path, i + 1, m.group(1), END_MARK))
        i += 1
    return lines, found


def check_or_write(paths, views, results_dir, write):
    """Problems found (check) or files rewritten (write); both lists of strings."""
    problems = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines, found = marked_tables(text, path)
        new_lines = list(lines)
        # Replace from the end so earlier indices stay valid.
        for view, start, end in reversed(found):
            # A table inside a list item keeps the marker's indentation.
            indent = re.match(r"\s*", lines[start - 1]).group(0)
            try:
                want = [indent + line for line in render_view(view, views, results_dir)]
            except ResultsError as e:
                problems.append("%s:%d: %s" % (path, start, e))
                continue
            have = lines[start:end]
            if have != want:
                if write:
                    new_lines[start:end] = want
                else:
                    diff = "\n".join(difflib.unified_diff(
                        have, want, "%s (results:%s, in the file)" % (path, view),
                        "%s (results:%s, rendered)" % (path, view), lineterm=""))
                    problems.append("%s:%d: the table of view %s differs from what "
                                    "tools/results.py renders from %s (run tools/results.py "
                                    "--write %s):\n%s" % (path, start, view, views[view]["file"],
                                                          path, diff))
        if write and new_lines != lines:
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(new_lines))
            problems.append("rewrote %s" % path)
    return problems


def default_docs(root):
    """README.md, docs/**/*.md and every other README.md outside bazel-* and third_party/."""
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    for path in sorted(glob.glob(os.path.join(root, "**", "README.md"), recursive=True)):
        rel = os.path.relpath(path, root)
        if not (rel == "README.md" or rel.startswith(("bazel-", "third_party/"))):
            files.append(path)
    return [f for f in files if os.path.isfile(f)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results_dir", default=None, help="default: bench/results")
    parser.add_argument("--views", default=None, help="default: RESULTS_DIR/views.json")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--validate", action="store_true")
    mode.add_argument("--render", metavar="VIEW")
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--record", metavar="FILE")
    parser.add_argument("--bench")
    parser.add_argument("--command")
    parser.add_argument("--figures", help="a JSON object")
    parser.add_argument("--config")
    parser.add_argument("--note")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    results_dir = args.results_dir or default_results_dir()
    views_path = args.views or os.path.join(results_dir, "views.json")
    try:
        if args.validate:
            files = args.files or sorted(glob.glob(os.path.join(results_dir, "*.jsonl")))
            errors = validate_files(files)
            for e in errors:
                print(e, file=sys.stderr)
            if errors:
                return 1
            print("%d result file(s) valid" % len(files))
            return 0
        if args.record:
            if not (args.bench and args.command and args.figures):
                parser.error("--record needs --bench, --command and --figures")
            record = make_record(args.bench, args.command, json.loads(args.figures),
                                 config=args.config, note=args.note)
            errors = validate_record(record, args.record)
            if errors:
                print("\n".join(errors), file=sys.stderr)
                return 1
            with open(args.record, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            return 0
        views = load_views(views_path)
        if args.render:
            print("\n".join(render_view(args.render, views, results_dir)))
            return 0
        files = args.files or default_docs(repo_root())
        problems = check_or_write(files, views, results_dir, write=args.write)
        for p in problems:
            print(p, file=sys.stderr if args.check else sys.stdout)
        if args.check and problems:
            return 1
        if args.check:
            print("%d file(s): every marked table matches its result file" % len(files))
        return 0
    except ResultsError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
