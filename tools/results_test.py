"""Tests for tools/results.py on synthetic result files and documents (no Bazel needed)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402


def record(**overrides):
    r = {
        "schema": results.SCHEMA,
        "bench": "bench_x",
        "date": "2026-11-24T08:16Z",
        "commit": "6881600",
        "machine": {"nproc": 2, "loadavg": "1.70 2.10 2.30 3/300 42", "cpu_model": "AMD EPYC"},
        "command": "experiments/bench_x.sh --reps 4",
        "figures": {"tokens_per_s": 3000},
    }
    r.update(overrides)
    return r


VIEWS = {
    "speed": {
        "file": "x.jsonl",
        "where": {"bench": "bench_x"},
        "latest_per": "config",
        "columns": [
            {"header": "config", "cell": "{config}"},
            {"id": "tps", "header": "tokens/s", "cell": "{figures[tokens_per_s]:.0f}"},
            {"header": "runs", "cell": "{figures[runs]!j}", "missing": "-"},
            {"header": "error", "cell": "{figures[err]:.1f}%", "unicode_minus": True},
            {"header": "vs", "cell": "{figures[vs]:.2f}x ({figures[pairs]}/4)",
             "missing_cell": "{figures[vs]:.2f}x"},
        ],
    },
}


class ResultsTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def write_records(self, name, records):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        return path

    # ---------------------------------------------------------------- validation

    def test_a_complete_record_is_valid(self):
        self.assertEqual(results.validate_record(record(), "f:1"), [])

    def test_each_required_field_is_named_when_missing(self):
        cases = {
            "date": (lambda r: r.pop("date"), "date None"),
            "commit": (lambda r: r.pop("commit"), "no commit"),
            "nproc": (lambda r: r["machine"].pop("nproc"), "machine.nproc None"),
            "loadavg": (lambda r: r["machine"].pop("loadavg"), "no machine.loadavg"),
            "command": (lambda r: r.pop("command"), "command None"),
        }
        for field, (drop, message) in cases.items():
            r = record()
            drop(r)
            errors = results.validate_record(r, "bench/results/x.jsonl:7")
            self.assertEqual(len(errors), 1, (field, errors))
            self.assertIn("bench/results/x.jsonl:7", errors[0])
            self.assertIn(message, errors[0])

    def test_bad_values_are_named(self):
        self.assertIn("not a UTC date", results.validate_record(record(date="24.11.2026"), "w")[0])
        self.assertIn("not a git hash", results.validate_record(record(commit="main"), "w")[0])
        r = record()
        r["machine"]["nproc"] = 0
        self.assertIn("positive integer", results.validate_record(r, "w")[0])

    def test_a_note_is_optional_free_text(self):
        self.assertEqual(results.validate_record(record(note="Quiet machine: pipe 1.13x."), "w"),
                         [])
        for bad in ("", "  ", ["a", "b"], {"text": "x"}, 3):
            errors = results.validate_record(record(note=bad), "bench/results/x.jsonl:3")
            self.assertEqual(len(errors), 1, (bad, errors))
            self.assertIn("bench/results/x.jsonl:3: note", errors[0])
            self.assertIn("must be text", errors[0])

    def test_only_history_records_may_lack_commit_and_load(self):
        r = record(commit=None)
        r["machine"]["loadavg"] = None
        self.assertEqual(len(results.validate_record(r, "w")), 2)
        r["history"] = True
        self.assertEqual(results.validate_record(r, "w"), [])

    def test_bad_json_names_the_line(self):
        path = os.path.join(self.dir, "bad.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(record()) + "\n{not json\n")
        errors = results.validate_files([path])
        self.assertEqual(len(errors), 1)
        self.assertIn("bad.jsonl:2: not JSON", errors[0])

    def test_record_fills_date_commit_and_machine(self):
        repo = os.path.join(self.dir, "repo")
        os.mkdir(repo)
        git = ["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(git + ["init", "-q"], check=True)
        with open(os.path.join(repo, "f"), "w") as f:
            f.write("x")
        subprocess.run(git + ["add", "f"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", "c"], check=True)
        r = results.make_record("bench_x", "cmd", {"a": 1}, config="c", root=repo)
        self.assertEqual(results.validate_record(r, "new"), [])
        self.assertEqual(len(r["commit"]), 40)
        self.assertFalse(r["dirty"])
        self.assertEqual(r["machine"]["nproc"], os.cpu_count())
        # Issue #43: the BLAS and the kernel it picked (OpenBLAS reads
        # OPENBLAS_CORETYPE when it loads, so a forced one shows).
        if "blas_kernel" in r["machine"]:
            self.assertIn(r["machine"]["blas_kernel"], r["machine"]["blas"])
            if os.environ.get("OPENBLAS_CORETYPE") == "Prescott":
                self.assertEqual(r["machine"]["blas_kernel"], "Prescott")
                self.assertEqual(r["machine"]["openblas_coretype"], "Prescott")

    def test_blas_facts_name_a_forced_kernel(self):
        script = ("import json, sys; sys.path.insert(0, %r); import results; "
                  "print(json.dumps(results.blas_facts()))" % os.path.dirname(results.__file__))
        env = dict(os.environ, OPENBLAS_CORETYPE="Prescott")
        facts = json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                          stdout=subprocess.PIPE).stdout)
        if "blas_kernel" not in facts:
            self.skipTest("libblas.so.3 is not OpenBLAS: %r" % facts)
        self.assertEqual(facts["blas_kernel"], "Prescott")
        self.assertIn("Prescott", facts["blas"])
        self.assertEqual(facts["openblas_coretype"], "Prescott")

    # ---------------------------------------------------------------- rendering

    def test_render_latest_per_config_with_formats(self):
        self.write_records("x.jsonl", [
            record(config="a", figures={"tokens_per_s": 100.4, "runs": [1, 2], "err": -0.55,
                                        "vs": 1.0}),
            record(config="b", date="2026-11-24T09:00Z",
                   figures={"tokens_per_s": 200, "err": 1.25, "vs": 1.06, "pairs": 3},
                   bold=["tps"]),
            record(config="a", date="2026-11-25T01:00Z",
                   figures={"tokens_per_s": 110, "runs": [3, 4], "err": -1.0, "vs": 1.1}),
            record(bench="other", config="c"),
        ])
        table = results.render_view("speed", VIEWS, self.dir)
        self.assertEqual(table, [
            "| config | tokens/s | runs | error | vs |",
            "|---|---|---|---|---|",
            "| a | 110 | 3, 4 | \u22121.0% | 1.10x |",
            "| b | **200** | - | 1.2% | 1.06x (3/4) |",
        ])

    def test_unknown_view_and_empty_selection_are_errors(self):
        self.write_records("x.jsonl", [record(bench="other")])
        with self.assertRaisesRegex(results.ResultsError, "no view 'nope'; views: speed"):
            results.render_view("nope", VIEWS, self.dir)
        with self.assertRaisesRegex(results.ResultsError, "view speed: no record of x.jsonl"):
            results.render_view("speed", VIEWS, self.dir)

    # ---------------------------------------------------------------- --check / --write

    def doc(self, table_lines, indent=""):
        path = os.path.join(self.dir, "perf.md")
        body = ["# Performance", "", "Intro.", "", indent + "<!-- results:speed -->"]
        body += [indent + line for line in table_lines]
        body += [indent + "<!-- /results -->", "", "After."]
        with open(path, "w") as f:
            f.write("\n".join(body) + "\n")
        return path

    def run_cli(self, *args):
        with open(os.path.join(self.dir, "views.json"), "w") as f:
            json.dump(VIEWS, f)
        proc = subprocess.run(
            [sys.executable, results.__file__, "--results_dir=" + self.dir] + list(args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        return proc.returncode, proc.stdout, proc.stderr

    def test_a_matching_table_passes(self):
        self.write_records("x.jsonl", [record(config="a", figures={"tokens_per_s": 5, "vs": 1})])
        for indent in ("", "  "):
            path = self.doc([l for l in results.render_view("speed", VIEWS, self.dir)], indent)
            code, out, err = self.run_cli("--check", path)
            self.assertEqual(code, 0, err)
            self.assertIn("every marked table matches", out)

    def test_a_stale_table_fails_naming_file_view_and_diff_and_write_fixes_it(self):
        self.write_records("x.jsonl", [record(config="a", figures={"tokens_per_s": 5, "vs": 1})])
        good = results.render_view("speed", VIEWS, self.dir)
        stale = list(good)
        stale[2] = stale[2].replace("| 5 |", "| 7 |")
        path = self.doc(stale)
        code, _, err = self.run_cli("--check", path)
        self.assertEqual(code, 1)
        self.assertIn(path + ":5: the table of view speed differs", err)
        self.assertIn("-| a | 7 |", err)
        self.assertIn("+| a | 5 |", err)
        code, out, _ = self.run_cli("--write", path)
        self.assertEqual(code, 0)
        self.assertIn("rewrote " + path, out)
        with open(path) as f:
            text = f.read()
        self.assertIn("\n".join(good), text)
        self.assertTrue(text.startswith("# Performance\n") and text.endswith("After.\n"))
        self.assertEqual(self.run_cli("--check", path)[0], 0)

    def test_a_new_record_makes_the_old_table_stale(self):
        self.write_records("x.jsonl", [record(config="a", figures={"tokens_per_s": 5, "vs": 1})])
        path = self.doc(results.render_view("speed", VIEWS, self.dir))
        self.write_records("x.jsonl", [
            record(config="a", figures={"tokens_per_s": 5, "vs": 1}),
            record(config="a", date="2026-11-26T00:00Z", figures={"tokens_per_s": 6, "vs": 1})])
        code, _, err = self.run_cli("--check", path)
        self.assertEqual(code, 1)
        self.assertIn("+| a | 6 |", err)

    def test_unclosed_marker_and_unknown_view_fail(self):
        path = os.path.join(self.dir, "bad.md")
        with open(path, "w") as f:
            f.write("<!-- results:speed -->\n| a |\n")
        code, _, err = self.run_cli("--check", path)
        self.assertEqual(code, 1)
        self.assertIn("bad.md:1: results:speed has no closing <!-- /results -->", err)
        with open(path, "w") as f:
            f.write("<!-- results:nope -->\n<!-- /results -->\n")
        self.write_records("x.jsonl", [record()])
        code, _, err = self.run_cli("--check", path)
        self.assertEqual(code, 1)
        self.assertIn("bad.md:1: no view 'nope'", err)

    def test_markers_in_code_blocks_are_examples(self):
        path = os.path.join(self.dir, "howto.md")
        with open(path, "w") as f:
            f.write("```\n<!-- results:VIEW -->\n| stale |\n<!-- /results -->\n```\n")
        self.write_records("x.jsonl", [record()])
        code, _, err = self.run_cli("--check", path)
        self.assertEqual(code, 0, err)

    def test_validate_cli(self):
        self.write_records("x.jsonl", [record(), record(command="")])
        code, _, err = self.run_cli("--validate")
        self.assertEqual(code, 1)
        self.assertIn("x.jsonl:2: command", err)


if __name__ == "__main__":
    unittest.main()
