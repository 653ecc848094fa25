#!/usr/bin/env python3
"""Docs check: what README.md, docs/**/*.md and the package READMEs name must exist.

  - every Bazel label (`//pkg:name`, `//pkg`, `//pkg/...`, `//:name`) names a target
    (one `bazel query` over all of them);
  - every `--flag` given to one of pipe's binaries in a command (a code block line or an
    inline code span: `./bazelw run //experiments:train_gpt -- --steps=4`,
    `train_gpt --pp=4`, `bazel-bin/.../bench_gpt_kernels --reps=8`,
    `bench/bench_vs_deepspeed.sh --reps 4`) is a flag of that binary: the
    ABSL_FLAG definitions in the sources it is built from (`bazel query deps()`), plus
    Abseil's own (--helpfull, --flagfile, ...); for a shell or Python binary, the
    options its scripts parse (argparse `add_argument("--x"`, shell `--x)` cases);
  - every `--set=a.b=v,c=w` names fields of ExperimentConfig (the .proto files);
  - flags of `./bazelw`/`bazel` themselves (before `--`) are Bazel's and are skipped;
  - every relative link and image resolves (the file exists; for `#anchor`, a heading
    with that anchor exists in the target Markdown file);
  - every repo-relative path named in those docs, or in a comment of a source file
    (C++ and .proto `//` and `/* */` comments; `#` comments of Python, shell, BUILD and
    .bzl files; Python docstrings), exists as a file or folder. A path counts when it
    starts with a top-level folder of the repo (`pipeline/runtime/trainer.h`,
    `bench/results/`, `.ci/run`), so a user's files (`runs/<name>/`, `/ckpt`, `~/tb`)
    are not read as paths. A path without an extension may name a source's stem, as
    comments name a target by its package path (`pipeline/auto_schedule/auto_schedule` for
    auto_schedule.{h,cc}). A generated protobuf source (`x.pb.h`) stands for its
    `x.proto`. Skipped: anything after a `/` (`bazel-bin/x/y`, `//pkg:x`, URLs),
    patterns and placeholders (`*`, `{a,b}`, `<name>`, `$VAR`, `...`), a link's target
    (the link check's), and any line that carries the marker `check_docs: example path`
    (a file the reader makes, e.g. a new result file in a how-to).

Each problem is printed as FILE:LINE: what, and the exit status is 1 if there is any.

  tools/check_docs.py [--bazel=./bazelw] [FILES...]     default: README.md, docs/**/*.md,
                                                        every other README.md in the tree,
                                                        and (paths only) every source file
  tools/check_docs.py --workspace_json=F FILES...       targets and binary sources from F
                                                        (what --dump_workspace=F wrote)

Debian's python3 only.
"""

import argparse
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tokenize as py_tokenize  # tokenize() below splits shell commands

ABSL_BUILTIN_FLAGS = {
    "help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
    "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok",
}
# `//pkg:name`, `//pkg`, `//pkg/...`, `//:name`; not `https://`, `@repo//`, `chrome://`.
LABEL_RE = re.compile(r"(?<![\w:/@.])//([A-Za-z0-9_./-]*)(:[A-Za-z0-9_.+=,@~-]*)?")
ABSL_FLAG_RE = re.compile(r"ABSL_FLAG\(\s*[^,]+,\s*(\w+)\s*,")
ARGPARSE_RE = re.compile(r"add_argument\(([^)]*)")
SHELL_CASE_RE = re.compile(r"^\s*(?:\|?\s*)?((?:--[\w-]+(?:=\*)?\s*\|?\s*)+)\)", re.M)
LINK_RE = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "2>&1", "&"}
BAZEL_COMMANDS = {"run", "test", "build", "query", "aquery", "cquery", "coverage",
                  "shutdown", "info", "clean", "fetch"}


class Problem(object):
    def __init__(self, path, line, message):
        self.path, self.line, self.message = path, line, message

    def __str__(self):
        return "%s:%d: %s" % (self.path, self.line, self.message)


# --------------------------------------------------------------------------- Markdown


def scan_markdown(text):
    """(line number, kind, text) for the parts of a Markdown file the checks read:
    kind "code" for each line of a fenced block (continuation lines joined), "span" for
    each inline code span, "prose" for each line outside code (spans blanked). A span
    may run over a line break."""
    out = []
    in_fence = False
    open_span = None  # (line number, text so far) of a span not yet closed
    pending, pending_line = "", 0
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE_RE.match(line) and open_span is None:
            in_fence = not in_fence
            continue
        if in_fence:
            if pending:
                line = pending + " " + line.strip()
                number = pending_line
            if line.rstrip().endswith("\\"):
                if not pending:
                    pending_line = number
                pending = line.rstrip()[:-1]
                continue
            pending = ""
            out.append((number, "code", line))
            continue
        prose = []
        pos = 0
        while pos <= len(line):
            tick = line.find("`", pos)
            if open_span is not None:
                if tick < 0:
                    open_span = (open_span[0], open_span[1] + " " + line[pos:])
                    prose.append(" " * (len(line) - pos))
                    break
                out.append((open_span[0], "span", (open_span[1] + " " + line[pos:tick]).strip()))
                prose.append(" " * (tick + 1 - pos))
                pos = tick + 1
                open_span = None
                continue
            if tick < 0:
                prose.append(line[pos:])
                break
            prose.append(line[pos:tick])
            run = len(line[tick:]) - len(line[tick:].lstrip("`"))
            fence = "`" * run
            close = line.find(fence, tick + run)
            if close < 0:
                open_span = (number, line[tick + run:])
                prose.append(" " * (len(line) - tick))
                break
            out.append((number, "span", line[tick + run:close].strip()))
            prose.append(" " * (close + run - tick))
            pos = close + run
        out.append((number, "prose", "".join(prose)))
        if not line.strip():
            open_span = None  # a blank line ends a paragraph, and any unclosed span
    return out


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE)
    return text.replace(" ", "-")


def anchors_of(path):
    anchors = set()
    counts = {}
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE_RE.match(line):
                in_fence = not in_fence
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not in_fence:
                base = github_anchor(m.group(1))
                n = counts.get(base, 0)
                counts[base] = n + 1
                anchors.add(base if n == 0 else "%s-%d" % (base, n))
            for a in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
                anchors.add(a)
    return anchors


# --------------------------------------------------------------------------- labels


def labels_in(text):
    """Labels a piece of Markdown names (placeholders with <...> skipped). `//pkg` alone
    stands for the package (`//pkg:all`), as docs use it; `:all` and `/...` are patterns.
    Visibility specs: `//pkg:__pkg__` is `//pkg:all`, `//pkg:__subpackages__` is
    `//pkg/...`, and `//visibility:public` / `:private` name no package."""
    found = []
    for m in LABEL_RE.finditer(text):
        pkg, name = m.group(1), m.group(2)
        end = m.end()
        if end < len(text) and text[end] in "<{$*":
            continue
        if name is None:
            if pkg.endswith("/...") or pkg == "...":
                found.append("//" + pkg)
                continue
            pkg = pkg.rstrip(".").rstrip("/")
            if pkg:
                found.append("//%s:all" % pkg)
            continue
        name = name.rstrip(".,")
        if name == ":":
            continue  # "//:" alone: the root package in a listing
        if pkg == "visibility":
            continue  # //visibility:public, //visibility:private: no package
        if name == ":__pkg__":  # a visibility's package spec names the package
            name = ":all"
        elif name == ":__subpackages__":
            found.append("//%s/..." % pkg if pkg else "//...")
            continue
        found.append("//%s%s" % (pkg, name))
    return found


def label_exists(label, existing, root):
    """A label exists when bazel query returned it; a pattern (`//pkg/...`, `//pkg:all`)
    when it matched a target; a file label (`//driver:defs.bzl` in a load()) when
    the file is there."""
    if label.endswith("/..."):
        prefix = label[:-len("...")]
        own = label[:-len("/...")] + ":"
        return any(t.startswith(prefix) or t.startswith(own) for t in existing)
    pkg, _, name = label[2:].partition(":")
    if name in ("all", "*", "all-targets"):
        return any(t.startswith("//%s:" % pkg) for t in existing)
    if label in existing:
        return True
    return "." in name and os.path.isfile(os.path.join(root, pkg, name))


# --------------------------------------------------------------------------- flags


def flags_of_sources(root, sources):
    """Flags defined in `sources` (paths relative to root): ABSL_FLAG in C++; argparse
    options in Python; `--x)` case patterns in shell."""
    flags = set()
    for rel in sources:
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if rel.endswith((".cc", ".h", ".cpp")):
            flags.update(ABSL_FLAG_RE.findall(text))
        elif rel.endswith(".py"):
            for args in ARGPARSE_RE.findall(text):
                flags.update(re.findall(r"[\"']--([\w-]+)[\"']", args))
        elif rel.endswith(".sh") or "\n" in text[:2] or text.startswith("#!"):
            for group in SHELL_CASE_RE.findall(text):
                flags.update(re.findall(r"--([\w-]+)", group))
    return flags


def script_flags(root, rel):
    """Options of a script named by path; a .sh's sibling .py of the same stem counts too
    (bench_vs_deepspeed.sh runs bench_vs_deepspeed.py)."""
    sources = [rel]
    stem, ext = os.path.splitext(rel)
    if ext == ".sh" and os.path.isfile(os.path.join(root, stem + ".py")):
        sources.append(stem + ".py")
    return flags_of_sources(root, sources)


def tokenize(command):
    try:
        return shlex.split(command, comments=False)
    except ValueError:
        return command.split()


def commands_in(text):
    """(binary, target or None, script path or None, [flag tokens]) for each invocation
    of a binary in a command line."""
    tokens = [t.strip("[]") for t in tokenize(text)]
    found = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        base = os.path.basename(tok)
        if base in ("bazelw", "bazel") and i + 1 < len(tokens):
            # ./bazelw CMD [bazel flags] TARGET [-- binary flags]
            j = i + 1
            while j < len(tokens) and tokens[j].startswith("-"):
                j += 1
            cmd = tokens[j] if j < len(tokens) else ""
            if cmd != "run":
                i = j + 1
                while i < len(tokens) and tokens[i] not in SHELL_OPERATORS:
                    i += 1
                continue
            j += 1
            target = None
            while j < len(tokens) and tokens[j] != "--" and tokens[j] not in SHELL_OPERATORS:
                if tokens[j].startswith("//"):
                    target = tokens[j]
                j += 1
            args = []
            if j < len(tokens) and tokens[j] == "--":
                j += 1
                while j < len(tokens) and tokens[j] not in SHELL_OPERATORS:
                    args.append(tokens[j])
                    j += 1
            if target:
                found.append((target.split(":")[-1], target, None, args))
            i = j
            continue
        name = None
        script = None
        if re.match(r"^[\w./-]+\.(sh|py)$", tok) and "/" in tok:
            script = tok
            name = os.path.splitext(base)[0]
        elif re.match(r"^[A-Za-z_][\w]*$", base):
            name = base
        if name:
            j = i + 1
            args = []
            while j < len(tokens) and tokens[j] not in SHELL_OPERATORS:
                args.append(tokens[j])
                j += 1
            found.append((name, None, script, args))
            i = j
            continue
        i += 1
    return found


def flag_names(args):
    """(flag name, its value or None) for each --flag token."""
    out = []
    for a in args:
        if not a.startswith("--") or a == "--":
            continue
        body = a[2:]
        name, _, value = body.partition("=")
        if not re.match(r"^[A-Za-z][\w-]*$", name):
            continue
        out.append((name, value if "=" in body else None))
    return out


# --------------------------------------------------------------------------- config fields


EXTENSIONS = "extensions of "


def parse_protos(root):
    """message name -> {field name: type name} over every .proto in the tree."""
    messages = {}
    for path in glob.glob(os.path.join(root, "**", "*.proto"), recursive=True):
        if "/bazel-" in path or "/third_party/" in path:
            continue
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"//[^\n]*", "", f.read())
        stack = []
        for m in re.finditer(r"(message|oneof|enum|extend)\s+([\w.]+)\s*\{|\}|"
                             r"(?:optional|required|repeated)?\s*([\w.]+(?:<[^>]*>)?)\s+(\w+)\s*=\s*\d+",
                             text):
            if m.group(1) == "extend":
                # A model's settings extend ModelConfig; `--set=gpt.width=...`
                # names them with the extension's name (driver/experiment_config.h).
                name = EXTENSIONS + m.group(2).split(".")[-1]
                stack.append(("message", name))
                messages.setdefault(name, {})
            elif m.group(1):
                stack.append((m.group(1), m.group(2)))
                if m.group(1) == "message":
                    messages.setdefault(m.group(2), {})
            elif m.group(0) == "}":
                if stack:
                    stack.pop()
            elif m.group(4):
                owner = [n for k, n in stack if k == "message"]
                if owner and stack[-1][0] != "enum":
                    messages[owner[-1]][m.group(4)] = m.group(3).split(".")[-1]
    return messages


def check_set_value(value, messages, root_message="ExperimentConfig"):
    """Problems (strings) of one --set value: each assignment's field path must resolve."""
    if root_message not in messages:
        return []
    problems = []
    for part in value.split(","):
        if "=" not in part:
            continue  # a comma inside the previous value
        path = part.split("=", 1)[0].strip()
        message = root_message
        for i, field in enumerate(path.split(".")):
            fields = messages.get(message)
            if i == 0 and fields is not None and field not in fields:
                # A registered model's name stands for its ModelConfig extension.
                extension = messages.get(EXTENSIONS + "ModelConfig", {})
                if field in extension:
                    message = extension[field]
                    continue
            if fields is None:
                problems.append("--set field %s: %s is not a message" %
                                (path, ".".join(path.split(".")[:i])))
                break
            if field not in fields:
                problems.append("--set field %s: %s has no field '%s' (fields: %s)" % (
                    path, message, field, ", ".join(sorted(fields))))
                break
            message = fields[field]
    return problems


# --------------------------------------------------------------------------- workspace


class Workspace(object):
    """What the checks need from Bazel: existing targets and each binary's sources."""

    def __init__(self, existing, binaries):
        self.existing = set(existing)       # labels
        self.binaries = binaries            # label -> [source paths]

    def by_name(self, name):
        return [l for l in self.binaries if l.split(":")[-1] == name]

    def to_json(self):
        return {"existing": sorted(self.existing), "binaries": self.binaries}

    @staticmethod
    def from_json(data):
        return Workspace(data["existing"], data["binaries"])


def bazel_query(bazel, expr, keep_going=False):
    cmd = [bazel, "query", "--noshow_progress", expr, "--output=label"]
    if keep_going:
        cmd.insert(2, "--keep_going")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    if proc.returncode not in (0, 3) or (proc.returncode == 3 and not keep_going):
        raise SystemExit("check_docs: bazel query %r failed:\n%s" % (expr, proc.stderr))
    return [l.strip() for l in proc.stdout.splitlines() if l.strip()]


def query_workspace(bazel, labels):
    """One query for every named label (missing ones are skipped by --keep_going), one
    for the binaries, one per binary for its local sources."""
    existing = set()
    if labels:
        existing.update(bazel_query(bazel, "set(%s)" % " ".join(sorted(labels)), keep_going=True))
    binaries = {}
    for label in bazel_query(bazel, 'kind(".*_binary", //...)'):
        sources = bazel_query(bazel, 'kind("source file", deps(%s))' % label)
        binaries[label] = [s[2:].replace(":", "/").lstrip("/") for s in sources
                           if s.startswith("//")]
    return Workspace(existing, binaries)


# --------------------------------------------------------------------------- paths


SOURCE_EXTENSIONS = (".cc", ".h", ".cpp", ".proto", ".bzl", ".py", ".sh")
SOURCE_NAMES = ("BUILD", "BUILD.bazel", "WORKSPACE")
EXAMPLE_MARKER = "check_docs: example path"
PATH_CHARS = r"[A-Za-z0-9_.+/-]"


def top_folders(root):
    """The repo's top-level folders: what a repo-relative path starts with."""
    return sorted(n for n in os.listdir(root)
                  if os.path.isdir(os.path.join(root, n)) and not os.path.islink(
                      os.path.join(root, n)) and n != ".git" and not n.startswith("bazel-"))


def path_regex(root):
    tops = "|".join(re.escape(t) for t in sorted(top_folders(root), key=len, reverse=True))
    if not tops:
        return None
    # Not after a path, URL or label character: `bazel-bin/docs/x`, `https://h/docs`,
    # `//tools:x`, `$HOME/docs`, `~/tools` are someone else's paths.
    return re.compile(r"(?<![A-Za-z0-9_.+/@:~$\\-])(?:%s)/%s*" % (tops, PATH_CHARS))


def paths_in(text, regex):
    """The repo-relative paths a piece of text names (patterns and placeholders skipped)."""
    found = []
    if regex is None:
        return found
    for m in regex.finditer(text):
        path = m.group(0)
        end = m.end()
        following = text[end:end + 1]
        if following and following in "*{<$[":
            continue  # a glob or placeholder: `tools/*.py`, `runs/{a,b}`, `docs/<x>.md`
        if "..." in path or "*" in path:
            continue
        path = path.rstrip(".,;:)")
        if "//" in path:
            continue
        found.append(path)
    return found


def path_exists(root, path):
    rel = path.rstrip("/")
    for generated, source in ((".pb.h", ".proto"), (".pb.cc", ".proto"), ("_pb2.py", ".proto")):
        if rel.endswith(generated):
            rel = rel[:-len(generated)] + source
    full = os.path.join(root, rel)
    if os.path.exists(full):
        return True
    # A target named by its package path: a source file of that stem.
    return "." not in os.path.basename(rel) and bool(glob.glob(glob.escape(full) + ".*"))


def comment_lines(path, text):
    """(line number, comment text) of a source file's comments (and Python docstrings)."""
    base = os.path.basename(path)
    if base.endswith((".cc", ".h", ".cpp", ".proto")):
        return c_comments(text)
    if base.endswith(".py") or base.endswith(".bzl") or base in SOURCE_NAMES:
        found = python_comments(text)
        if found is not None:
            return found
    return hash_comments(text)


def c_comments(text):
    """`//` and `/* */` comments, outside string and character literals."""
    out = []
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append((line, text[i + 2:end]))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, end)
            i = end + 2
        elif text.startswith('R"', i) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            close = text.find(")%s\"" % m.group(1), i)
            close = n if close < 0 else close
            line += text.count("\n", i, close)
            i = close + 1
        elif c in "\"'":
            if c == "'" and i > 0 and re.match(r"[0-9A-Fa-f]", text[i - 1]):
                i += 1  # a digit separator: 1'000'000
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def python_comments(text):
    """`#` comments and docstrings (a string that is a statement of its own), or None
    where the file does not tokenize as Python."""
    out = []
    tk = py_tokenize
    statement_start = (tk.NEWLINE, tk.INDENT, tk.DEDENT, tk.NL)
    previous = tk.NEWLINE
    try:
        for tok in tk.generate_tokens(io.StringIO(text).readline):
            if tok.type == tk.COMMENT:
                out.append((tok.start[0], tok.string[1:]))
            elif tok.type == tk.STRING and previous in statement_start:
                for k, part in enumerate(tok.string.split("\n")):
                    out.append((tok.start[0] + k, part))
            if tok.type not in (tk.COMMENT, tk.NL):
                previous = tok.type
            elif tok.type == tk.NL and previous in statement_start:
                previous = tk.NL
    except (tk.TokenError, IndentationError, SyntaxError):
        return None
    return out


def hash_comments(text):
    """`#` comments of a shell script: a `#` at a word's start, outside quotes."""
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        if number == 1 and line.startswith("#!"):
            continue
        quote = None
        k = 0
        while k < len(line):
            c = line[k]
            if c == "\\" and quote != "'":
                k += 2  # an escaped character, outside quotes or in double quotes
                continue
            if quote:
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or line[k - 1] in " \t;|&("):
                out.append((number, line[k + 1:]))
                break
            k += 1
    return out


# Git-ignored outputs at the root (.gitignore): the GPU kit's bundle copies
# READMEs and sources whose links point outside it; runs and data are made.
GENERATED_DIRS = ("gpu_bundle", "gpu_bundle_packed", "runs", "data")


def source_files(root):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("bazel-", ".git"))
                             and not os.path.islink(os.path.join(dirpath, d))
                             and not (dirpath == root and d in GENERATED_DIRS))
        files.extend(os.path.join(dirpath, name) for name in sorted(filenames)
                     if is_source(name))
    return files


def is_source(path):
    base = os.path.basename(path)
    return base.endswith(SOURCE_EXTENSIONS) or base in SOURCE_NAMES


def check_paths(rel, lines, root, regex):
    """Problems for the paths named in (line number, text) pairs that do not exist."""
    problems = []
    marked = set(n for n, t in lines if EXAMPLE_MARKER in t)
    for number, text in lines:
        if number in marked:
            continue
        for path in paths_in(text, regex):
            STATS["paths"] += 1
            if not path_exists(root, path):
                problems.append(Problem(rel, number, "path %s does not exist" % path))
    return problems


def check_source(path, root, regex):
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    marked = set(n for n, line in enumerate(text.split("\n"), 1) if EXAMPLE_MARKER in line)
    lines = [(n, t) for n, t in comment_lines(path, text) if n not in marked]
    return check_paths(rel, lines, root, regex)


# --------------------------------------------------------------------------- checks


def default_files(root):
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    for path in sorted(glob.glob(os.path.join(root, "**", "README.md"), recursive=True)):
        rel = os.path.relpath(path, root)
        if (rel.startswith("bazel-") or rel.startswith("third_party/") or rel == "README.md"
                or rel.split(os.sep)[0] in GENERATED_DIRS):
            continue
        files.append(path)
    return [f for f in files if os.path.isfile(f)]


def collect_labels(files):
    labels = set()
    for path in files:
        with open(path, encoding="utf-8") as f:
            for _, kind, text in scan_markdown(f.read()):
                labels.update(labels_in(text))
    return labels


STATS = {"targets": 0, "flags": 0, "links": 0, "paths": 0, "sources": 0}


def check_file(path, root, workspace, messages, flag_cache, regex=None):
    problems = []
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parts = scan_markdown(text)
    marked = set(n for n, line in enumerate(text.split("\n"), 1) if EXAMPLE_MARKER in line)
    # A link's target is the link check's (relative to the file's folder), not a path.
    problems.extend(check_paths(rel, [(n, LINK_RE.sub("", t) if k == "prose" else t)
                                      for n, k, t in parts if n not in marked], root, regex))
    for number, kind, part in parts:
        for label in labels_in(part):
            STATS["targets"] += 1
            if not label_exists(label, workspace.existing, root):
                problems.append(Problem(rel, number, "target %s does not exist (bazel query)" %
                                        label))
        if kind == "prose":
            for bang, _, target in LINK_RE.findall(part):
                problems.extend(check_link(rel, number, path, root, target, bool(bang)))
            for target in re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", part):
                problems.extend(check_link(rel, number, path, root, target, True))
            continue
        for name, target, script, args in commands_in(part):
            flags = known_flags(name, target, script, root, workspace, flag_cache)
            if flags is None:
                continue
            for flag, value in flag_names(args):
                STATS["flags"] += 1
                if flag not in flags:
                    problems.append(Problem(rel, number, "--%s is not a flag of %s (%s)" % (
                        flag, target or script or name, flag_cache[("where", name, target,
                                                                    script)])))
                elif flag == "set" and value:
                    for p in check_set_value(value, messages):
                        problems.append(Problem(rel, number, "%s (given to %s)" % (
                            p, target or script or name)))
    return problems


def known_flags(name, target, script, root, workspace, cache):
    """The flags of a binary, or None when the name is not one of pipe's binaries."""
    key = (name, target, script)
    if key in cache:
        return cache[key]
    flags, where = None, ""
    if script:
        if os.path.isfile(os.path.join(root, script)):
            flags = script_flags(root, script)
            where = "options parsed by %s" % script
            if not flags:
                flags = None  # a script whose options this check cannot read
    else:
        labels = [target] if target else workspace.by_name(name)
        if target and target not in workspace.binaries:
            # An alias (//:train_gpt) or a target the binaries list lacks: by name.
            labels = workspace.by_name(name) if workspace.by_name(name) else []
        if labels:
            sources = sorted({s for l in labels for s in workspace.binaries[l]})
            cc = [s for s in sources if s.endswith((".cc", ".h", ".cpp"))]
            # A shell or Python binary: its own scripts (bench_schedules.sh/.py), not
            # the sources of the binaries it runs (train_gpt's, through data).
            scripts = [s for s in sources if s.endswith((".py", ".sh")) and
                       os.path.splitext(os.path.basename(s))[0] == name]
            if scripts:
                flags = flags_of_sources(root, scripts)
                where = "options parsed by %s" % ", ".join(scripts)
            elif cc:
                flags = flags_of_sources(root, cc) | ABSL_BUILTIN_FLAGS
                where = "ABSL_FLAG in the sources of %s" % ", ".join(labels)
    cache[key] = flags
    cache[("where", name, target, script)] = where
    return flags


def check_link(rel, number, path, root, target, image):
    STATS["links"] += 1
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
        return []  # http:, https:, mailto:, ...
    what = "image" if image else "link"
    file_part, _, anchor = target.partition("#")
    if file_part:
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if not os.path.exists(dest):
            return [Problem(rel, number, "%s %s: %s does not exist" % (
                what, target, os.path.relpath(dest, root)))]
    else:
        dest = path
    if anchor and dest.endswith(".md") and os.path.isfile(dest):
        if anchor not in anchors_of(dest):
            return [Problem(rel, number, "%s %s: %s has no heading with anchor #%s" % (
                what, target, os.path.relpath(dest, root), anchor))]
    return []


def run(files, root, workspace, sources=()):
    messages = parse_protos(root)
    regex = path_regex(root)
    cache = {}
    problems = []
    for path in files:
        if is_source(path):
            STATS["sources"] += 1
            problems.extend(check_source(path, root, regex))
        else:
            problems.extend(check_file(path, root, workspace, messages, cache, regex))
    for path in sources:
        STATS["sources"] += 1
        problems.extend(check_source(path, root, regex))
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bazel", default="./bazelw")
    parser.add_argument("--root", default=None, help="the workspace (default: ../ of this file)")
    parser.add_argument("--workspace_json", help="targets and binaries instead of bazel query")
    parser.add_argument("--dump_workspace", help="write what bazel query gave to this file")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root or os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    files = [os.path.abspath(f) for f in args.files] or default_files(root)
    sources = [] if args.files else source_files(root)
    if args.workspace_json:
        with open(args.workspace_json) as f:
            workspace = Workspace.from_json(json.load(f))
    else:
        os.chdir(root)
        workspace = query_workspace(args.bazel, collect_labels(
            [f for f in files if not is_source(f)]))
        if args.dump_workspace:
            with open(args.dump_workspace, "w") as f:
                json.dump(workspace.to_json(), f, indent=1, sort_keys=True)
    problems = run(files, root, workspace, sources)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("check_docs: %d problem(s) in %d file(s)" % (
            len(problems), len({p.path for p in problems})), file=sys.stderr)
        return 1
    print("check_docs: %d file(s): every target (%d named), flag (%d given to pipe's binaries), "
          "link and image (%d) resolves; every path (%d, in the docs and the comments of %d "
          "source files) exists" % (len(files), STATS["targets"], STATS["flags"],
                                   STATS["links"], STATS["paths"], STATS["sources"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
