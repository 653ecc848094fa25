"""Tests for check_layering on small synthetic graphs (no Bazel needed)."""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layering  # noqa: E402


def graph(*edges, nodes=()):
    """A dot graph in the shape `bazel query --output=graph` prints."""
    lines = ["digraph mygraph {", '  node [shape=box];']
    lines += ['  "%s"' % n for n in nodes]
    lines += ['  "%s" -> "%s"' % edge for edge in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


CLEAN = graph(
    ("//experiments:train_gpt", "//driver:run_experiment"),
    ("//driver:run_experiment", "//models/gpt:gpt"),
    ("//driver:run_experiment", "//pipeline/runtime:trainer"),
    ("//models/gpt:gpt", "//models/data:lm_data"),  # same layer (models), no cycle
    ("//models/gpt:gpt", "//pipeline/layers:layer_spec"),
    ("//pipeline/runtime:trainer", "//pipeline/schedule/ir:lowering"),
    ("//pipeline/runtime:trainer", "//pipeline:pipeline_model"),
    ("//pipeline:pipeline_model", "//pipeline/partition:all"),
    ("//pipeline/partition:all", "//pipeline/layers:layer_spec"),
    ("//pipeline/layers:layer_spec", "//third_party:torch"),
    ("//third_party:torch", "//third_party/torch:torch"),
    ("//third_party/torch:torch", "@libtorch_cuda//:libtorch"),  # external: ignored
    ("//pipeline/layers:layer_spec", "@bazel_tools//tools/cpp:toolchain"),
    ("//:train_gpt", "//experiments:train_gpt"),  # root aliases sit on top
)


def run_main(text):
    """Exit status and stderr of the command line on `text` given as a file."""
    with tempfile.NamedTemporaryFile("w", suffix=".dot", delete=False) as f:
        f.write(text)
    try:
        result = subprocess.run(
            [sys.executable, check_layering.__file__, "--graph=" + f.name],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    finally:
        os.unlink(f.name)
    return result.returncode, result.stdout, result.stderr


class PackageTest(unittest.TestCase):

    def test_package_of(self):
        self.assertEqual(check_layering.package_of("//pipeline/layers:layer"), "pipeline/layers")
        self.assertEqual(check_layering.package_of("//:all_tests"), "")
        self.assertEqual(check_layering.package_of("@//common:status_macros"), "common")
        self.assertEqual(check_layering.package_of("@@//common:status_macros"), "common")
        self.assertIsNone(check_layering.package_of("@absl//absl/status"))

    def test_layer_of_uses_nearest_listed_ancestor(self):
        layers = check_layering.LAYERS
        self.assertEqual(check_layering.layer_of("models/gpt"), layers.index("models"))
        self.assertEqual(check_layering.layer_of("pipeline/schedule/examples"),
                         layers.index("pipeline/schedule"))
        self.assertEqual(check_layering.layer_of("pipeline/layers"), layers.index("pipeline/layers"))
        self.assertEqual(check_layering.layer_of("third_party/torch"), layers.index("third_party"))
        self.assertEqual(check_layering.layer_of(""), layers.index(""))
        # The root is no package's ancestor: an unlisted top-level package is a
        # researcher's own, at the examples level.
        self.assertEqual(check_layering.layer_of("newpkg"), layers.index("examples"))
        self.assertEqual(check_layering.layer_of("newpkg/sub"), layers.index("examples"))
        self.assertIsNone(check_layering.layer_of("newpkg", ["common", "models"]))


class CheckTest(unittest.TestCase):

    def problems(self, text):
        packages, edges = check_layering.parse_graph(text)
        return check_layering.check(packages, edges)

    def test_clean_graph_passes(self):
        self.assertEqual(self.problems(CLEAN), [])
        status, out, err = run_main(CLEAN)
        self.assertEqual(status, 0, err)
        self.assertIn("no cycle, no up-edge", out)

    def test_cycle_fails_naming_the_packages_and_a_target_edge(self):
        text = CLEAN + graph(("//pipeline/partition:partitioner", "//pipeline:pipeline_model"))
        problems = self.problems(text)
        cycles = [p for p in problems if p.startswith("package cycle")]
        self.assertEqual(len(cycles), 1, problems)
        self.assertIn("//pipeline -> //pipeline/partition -> //pipeline", cycles[0])
        self.assertIn("//pipeline/partition:partitioner -> //pipeline:pipeline_model", cycles[0])
        status, _, err = run_main(text)
        self.assertEqual(status, 1)
        self.assertIn("package cycle: //pipeline -> //pipeline/partition -> //pipeline", err)

    def test_cycle_within_one_layer_fails(self):
        # models/gpt and models/data are both `models`: no up-edge, still a cycle.
        problems = self.problems(CLEAN + graph(("//models/data:lm_data", "//models/gpt:gpt")))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("package cycle: //models/data -> //models/gpt -> //models/data", problems[0])

    def test_three_package_cycle_is_reported_once_in_order(self):
        text = graph(
            ("//checkpoint/model:a", "//models/gpt:gpt"),
            ("//models/gpt:gpt", "//pipeline/runtime:trainer"),
            ("//pipeline/runtime:trainer", "//checkpoint/model:a"),
        )
        cycles = [p for p in self.problems(text) if p.startswith("package cycle")]
        self.assertEqual(len(cycles), 1, cycles)
        self.assertIn(
            "//checkpoint/model -> //models/gpt -> //pipeline/runtime -> //checkpoint/model",
            cycles[0])

    def test_up_edge_fails_naming_the_edge(self):
        text = CLEAN + graph(("//topology:launcher", "//pipeline/runtime:trainer"))
        problems = self.problems(text)
        self.assertEqual(len(problems), 1, problems)
        self.assertTrue(problems[0].startswith("up-edge: //topology -> //pipeline/runtime"),
                        problems[0])
        self.assertIn("e.g. //topology:launcher -> //pipeline/runtime:trainer", problems[0])
        status, _, err = run_main(text)
        self.assertEqual(status, 1)
        self.assertIn("up-edge: //topology -> //pipeline/runtime", err)

    def test_up_edge_from_a_subpackage_counts_as_its_ancestor(self):
        problems = self.problems(graph(("//pipeline/schedule/examples:x", "//checkpoint/model:y")))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("up-edge: //pipeline/schedule/examples -> //checkpoint/model", problems[0])
        self.assertIn("layer //pipeline/schedule", problems[0])

    def test_schedule_subpackages_go_up_from_ir_to_schedules(self):
        # ir < analysis < formats < schedules (docs/schedules.md, the reference part).
        self.assertEqual(self.problems(graph(
            ("//pipeline/schedule/schedules:registry", "//pipeline/schedule/formats:csv"),
            ("//pipeline/schedule/formats:csv", "//pipeline/schedule/analysis:validator"),
            ("//pipeline/schedule/analysis:validator", "//pipeline/schedule/ir:lowering"))), [])
        problems = self.problems(graph(
            ("//pipeline/schedule/analysis:x", "//pipeline/schedule/schedules:all_schedules")))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("up-edge: //pipeline/schedule/analysis -> //pipeline/schedule/schedules",
                      problems[0])

    def test_researcher_package_may_use_pipe(self):
        self.assertEqual(self.problems(graph(
            ("//mylab/sched:s", "//pipeline/schedule/schedules:registry"),
            ("//mylab/sched:s", "//driver:run_experiment"))), [])

    def test_pipe_may_not_depend_on_a_researcher_package(self):
        problems = self.problems(graph(("//models:m", "//mylab:thing")))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("up-edge: //models -> //mylab", problems[0])

    def test_unplaced_package_fails_without_a_user_level(self):
        packages, edges = check_layering.parse_graph(graph(nodes=["//scratch:thing"]))
        problems = check_layering.check(packages, edges, layers=["common", "models"])
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("package //scratch is not in the layer order", problems[0])

    def test_factored_nodes_are_split(self):
        # --graph_factored (Bazel's default) joins targets with equal edges into one node.
        text = graph(("//pipeline:a\\n//pipeline:b", "//pipeline/partition:c\\n//models:d"))
        packages, edges = check_layering.parse_graph(text)
        self.assertEqual(packages, {"pipeline", "pipeline/partition", "models"})
        self.assertEqual(set(edges), {("pipeline", "pipeline/partition"), ("pipeline", "models")})
        problems = check_layering.check(packages, edges)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("up-edge: //pipeline -> //models", problems[0])

    def test_empty_graph_is_an_error(self):
        status, _, err = run_main("digraph mygraph {\n}\n")
        self.assertEqual(status, 1)
        self.assertIn("no targets of this workspace", err)


class VisibilityTest(unittest.TestCase):
    """Rule 3 on a small tree of BUILD files."""

    PRIVATE = 'package(default_visibility = ["//visibility:private"])\n'

    def tree(self, files):
        root = tempfile.mkdtemp()
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", root]))
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        return root

    def test_private_default_passes(self):
        root = self.tree({"BUILD.bazel": self.PRIVATE,
                          "common/BUILD": 'load("//tools:pp.bzl", "x")\n\n' + self.PRIVATE,
                          "models/gpt/BUILD": self.PRIVATE})
        self.assertEqual(check_layering.check_visibility({"", "common", "models/gpt"}, root), [])

    def test_public_default_fails_naming_the_file(self):
        root = self.tree({"models/gpt/BUILD":
                          'package(default_visibility = ["//visibility:public"])\n'})
        problems = check_layering.check_visibility({"models/gpt"}, root)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("package //models/gpt: models/gpt/BUILD does not declare", problems[0])

    def test_missing_package_statement_fails(self):
        root = self.tree({"common/BUILD": 'cc_library(name = "x")\n'})
        self.assertEqual(len(check_layering.check_visibility({"common"}, root)), 1)

    def test_researcher_and_example_packages_are_exempt(self):
        root = self.tree({"examples/custom_model/BUILD": "", "mylab/BUILD": ""})
        self.assertEqual(check_layering.check_visibility({"examples/custom_model", "mylab"}, root),
                         [])

    def test_graph_alone_does_not_read_build_files(self):
        status, out, _ = run_main(CLEAN)
        self.assertEqual(status, 0)
        self.assertNotIn("private by default", out)


if __name__ == "__main__":
    unittest.main()
