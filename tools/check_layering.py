#!/usr/bin/env python3
"""Fails on a package cycle or a dependency that points up pipe's layer order.

Reads the target graph Bazel prints for `bazel query 'deps(//...)' --output=graph`,
collapses it to packages (an edge between two targets of different packages is an
edge between the packages) and checks two rules:

  1. No cycle between packages (Bazel forbids target cycles, not package cycles).
  2. Every edge goes down LAYERS below (or stays at one level). A package that is
     not listed counts as its nearest listed ancestor (models/gpt is `models`);
     a top-level package that is not listed is a researcher's own package and
     sits at the `examples` level: it may use all of pipe, and no package of
     pipe may depend on it. So a researcher's package needs no edit here.
     External repositories (@...) are ignored.

And, from the BUILD files themselves (not with --graph unless --root is given):

  3. Every package of pipe's own (below the `examples` level) declares
     `package(default_visibility = ["//visibility:private"])`: a target is
     private unless its `visibility` names its consumers (docs/architecture.md,
     "Visibility").

Usage:
  tools/check_layering.py                    # runs ./bazelw query itself
  tools/check_layering.py --bazel=bazel      # another Bazel
  tools/check_layering.py --graph=FILE       # a saved graph ('-' = stdin)
  tools/check_layering.py --graph=FILE --root=.   # ... and rule 3 on this tree

Exit status 0 when clean, 1 with one line per problem otherwise, 2 on bad usage.
The order is docs/architecture.md's; change both together.
"""

import argparse
import os
import re
import subprocess
import sys

# Bottom to top: a package may depend only on packages at its level or below.
# `tools` (build macros) sits at the bottom; the root package (aliases and test
# suites over everything, //:all_tests) at the top.
LAYERS = [
    "tools",
    "third_party",
    "common",
    "observability",
    "topology",
    "pipeline/layers",
    "pipeline/tensor_parallel",
    "pipeline/partition",
    "pipeline",
    "pipeline/schedule",  # its subpackages, bottom to top:
    "pipeline/schedule/ir",
    "pipeline/schedule/analysis",
    "pipeline/schedule/formats",
    "pipeline/schedule/schedules",
    "pipeline/autograd",
    "pipeline/runtime",
    "pipeline/auto_schedule",
    "checkpoint/model",
    "checkpoint/hf",
    "models",
    "driver",
    "experiments",
    "driver/e2e",
    "bench",
    "examples",
    "",
]

QUERY = "deps(//...)"

_EDGE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)"\s*->\s*"((?:[^"\\]|\\.)*)"')
_NODE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)"\s*(?:\[.*\])?\s*;?\s*$')


def _labels(node):
    """The labels in one graph node (a factored node joins several with \\n)."""
    return [label for label in node.split("\\n") if label]


def package_of(label):
    """'//pipeline/layers:layer' -> 'pipeline/layers'; None for external labels."""
    if label.startswith("@@//"):
        label = label[2:]
    elif label.startswith("@//"):
        label = label[1:]
    if not label.startswith("//"):
        return None  # @repo//..., or something that is not a label
    return label[2:].split(":", 1)[0]


def parse_graph(text):
    """Package-level edges of a dot graph: {(from_pkg, to_pkg): (from_label, to_label)}.

    Each package edge keeps one example target edge, for the error message. Nodes
    without edges are returned too, so a lone unknown package is still checked.
    """
    edges = {}
    packages = set()
    for line in text.splitlines():
        match = _EDGE.match(line)
        if match:
            for src in _labels(match.group(1)):
                for dst in _labels(match.group(2)):
                    src_pkg, dst_pkg = package_of(src), package_of(dst)
                    if src_pkg is not None:
                        packages.add(src_pkg)
                    if dst_pkg is not None:
                        packages.add(dst_pkg)
                    if src_pkg is None or dst_pkg is None or src_pkg == dst_pkg:
                        continue
                    edges.setdefault((src_pkg, dst_pkg), (src, dst))
            continue
        match = _NODE.match(line)
        if match:
            for label in _labels(match.group(1)):
                pkg = package_of(label)
                if pkg is not None:
                    packages.add(pkg)
    return packages, edges


# Where an unlisted top-level package (a researcher's own) sits.
USER_LEVEL = "examples"


def layer_of(package, layers=LAYERS):
    """The index in `layers` of `package` or its nearest listed ancestor.

    The root package ("") matches only itself: it is no package's ancestor here.
    A package with no listed ancestor is a researcher's: USER_LEVEL's index, or
    None when `layers` has no USER_LEVEL.
    """
    rank = {name: i for i, name in enumerate(layers)}
    if package == "":
        return rank.get("")
    parts = package.split("/")
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n])
        if candidate in rank:
            return rank[candidate]
    return rank.get(USER_LEVEL)


def _cycles(packages, edges):
    """Strongly connected components with more than one package (Tarjan), sorted."""
    graph = {p: [] for p in packages}
    for src, dst in edges:
        graph.setdefault(src, []).append(dst)
        graph.setdefault(dst, [])
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = [0]

    def visit(root):
        # Iterative Tarjan: a deep package chain must not hit Python's recursion limit.
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for package in sorted(graph):
        if package not in index:
            visit(package)
    return sorted(components)


def _cycle_path(component, edges):
    """A shortest cycle through the component's first package: [p0, p1, ..., p0]."""
    members = set(component)
    start = component[0]
    successors = {}
    for src, dst in sorted(edges):
        if src in members and dst in members:
            successors.setdefault(src, []).append(dst)
    parents = {start: None}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for dst in successors.get(node, []):
                if dst == start:
                    path = [node]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return list(reversed(path)) + [start]
                if dst not in parents:
                    parents[dst] = node
                    next_frontier.append(dst)
        frontier = next_frontier
    raise AssertionError("no cycle through %s in a strongly connected component" % start)


def _show(package):
    return "//" + package


def check(packages, edges, layers=LAYERS):
    """Problems found, one human-readable line each; empty when the graph is clean."""
    problems = []
    for component in _cycles(packages, edges):
        path = _cycle_path(component, edges)
        hops = []
        for src, dst in zip(path, path[1:]):
            hops.append("%s -> %s" % edges[(src, dst)])
        problems.append(
            "package cycle: %s (target edges: %s)"
            % (" -> ".join(_show(p) for p in path), "; ".join(hops))
        )
    for package in sorted(packages):
        if layer_of(package, layers) is None:
            problems.append(
                "package %s is not in the layer order and has no listed ancestor; "
                "place it in LAYERS (tools/check_layering.py) and docs/architecture.md's "
                "architecture section; listed: %s"
                % (_show(package), ", ".join(_show(p) for p in layers))
            )
    for (src, dst), (src_label, dst_label) in sorted(edges.items()):
        src_layer, dst_layer = layer_of(src, layers), layer_of(dst, layers)
        if src_layer is None or dst_layer is None or dst_layer <= src_layer:
            continue
        problems.append(
            "up-edge: %s -> %s (%s, layer %s, may not depend on %s, layer %s, which sits "
            "above it), e.g. %s -> %s"
            % (_show(src), _show(dst), _show(src), _show(layers[src_layer]), _show(dst),
               _show(layers[dst_layer]), src_label, dst_label)
        )
    return problems


_PRIVATE_DEFAULT = re.compile(
    r'^package\(\s*default_visibility\s*=\s*\[\s*"//visibility:private",?\s*\]', re.M)


def check_visibility(packages, root, layers=LAYERS):
    """Rule 3: problems for pipe's packages whose BUILD file lacks the private default.

    Packages at the USER_LEVEL (examples/, a researcher's own) are theirs to decide.
    """
    rank = {name: i for i, name in enumerate(layers)}
    problems = []
    for package in sorted(packages):
        layer = layer_of(package, layers)
        if layer is None or layer == rank.get(USER_LEVEL):
            continue
        for name in ("BUILD.bazel", "BUILD"):
            path = os.path.join(root, package, name)
            if os.path.exists(path):
                break
        else:
            continue  # not a package of this tree (a graph from elsewhere)
        with open(path) as f:
            if not _PRIVATE_DEFAULT.search(f.read()):
                problems.append(
                    'package %s: %s does not declare package(default_visibility = '
                    '["//visibility:private"]); name each target\'s consumers in its '
                    "visibility instead (docs/architecture.md, Visibility)"
                    % (_show(package), os.path.relpath(path, root)))
    return problems


def _query(bazel):
    command = [bazel, "query", QUERY, "--output=graph", "--noimplicit_deps", "--nograph:factored"]
    result = subprocess.run(command, stdout=subprocess.PIPE, universal_newlines=True)
    if result.returncode != 0:
        sys.exit("check_layering: %s failed with exit status %d" % (" ".join(command),
                                                                     result.returncode))
    return result.stdout


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", help="dot graph from `bazel query --output=graph` ('-': stdin)")
    parser.add_argument("--bazel", default="./bazelw", help="Bazel to query when --graph is unset")
    parser.add_argument("--root", help="tree whose BUILD files rule 3 reads (default: . when "
                        "querying, none with --graph)")
    args = parser.parse_args(argv)
    if args.graph == "-":
        text = sys.stdin.read()
    elif args.graph:
        with open(args.graph) as f:
            text = f.read()
    else:
        text = _query(args.bazel)
        if args.root is None:
            args.root = "."
    packages, edges = parse_graph(text)
    if not edges and not packages:
        print("check_layering: the graph has no targets of this workspace; is it a "
              "`bazel query --output=graph` output?", file=sys.stderr)
        return 1
    problems = check(packages, edges)
    if args.root is not None:
        problems += check_visibility(packages, args.root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("check_layering: %d problem(s) in %d packages, %d package edges"
              % (len(problems), len(packages), len(edges)), file=sys.stderr)
        return 1
    print("check_layering: %d packages, %d package edges, no cycle, no up-edge%s"
          % (len(packages), len(edges),
             ", private by default" if args.root is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
