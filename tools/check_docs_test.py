"""Tests for check_docs on a small synthetic workspace (no Bazel needed: the targets and
each binary's sources come from a workspace file, as --dump_workspace writes it)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_docs  # noqa: E402

# Paths that exist, and forms that are not read as paths.
PATHS = textwrap.dedent("""    # Paths

    `tool/main.cc`, tool/bench_x.py, `tool/`, docs/pic.png, `tool/config.pb.h`
    (generated from tool/config.proto), `tool/lib` (a target: tool/lib.h). Not paths:
    `runs/gpt-<time>/`, `tool/*.cc`, `tool/{a,b}.cc`, `tool/<name>.cc`, `tool/.../x`,
    `bazel-bin/tool/gone`, https://example.com/tool/gone.md, `//tool:main.cc`,
    `~/tool/gone`, `$HOME/tool/gone`, `/tool/gone`, [a link](../tool/main.cc).
    A result you make: `tool/mine.jsonl` <!-- check_docs: example path -->
    """)

FILES = {
    "tool/main.cc": 'ABSL_FLAG(int, steps, 400, "steps");\nABSL_FLAG(std::string, set, "", "x");\n'
                    'ABSL_FLAG(bool, p2p_static_shapes, false,\n          "static");\n',
    "tool/launcher.cc": 'ABSL_FLAG(int32_t, nproc_per_node, 0, "workers");\n',
    "tool/other.cc": 'ABSL_FLAG(int, reps, 3, "reps");\n',
    "tool/bench_x.sh": '#!/bin/bash\nwhile [[ $# -gt 0 ]]; do case "$1" in\n'
                       '  --reps) shift ;;\n  --variant|--variant=*) shift ;;\nesac; done\n',
    "tool/bench_x.py": 'p.add_argument("--steps", type=int)\np.add_argument("-w", "--warmup")\n',
    "tool/config.proto": textwrap.dedent("""\
        message OptimizerConfig {
          optional double lr = 1;  // the learning rate
        }
        message ExperimentConfig {
          optional OptimizerConfig optimizer = 1;
          oneof model { GptModelConfig gpt = 2; }
          optional int64 steps = 3;
        }
        message GptModelConfig { optional int64 num_layers = 1; }
        """),
    "docs/pic.png": "png",
    "docs/paths.md": PATHS,
    "tool/lib.h": "// What the library is for; see tool/main.cc and docs/guide.md.\n"
                  "const char* kPath = \"tool/not_a_comment.cc\";  // tool/bench_x.sh\n",
    "tool/run.py": '"""Reads tool/config.proto."""\nX = "tool/gone.txt"  # tool/lib\n',
    "tool/run.sh": '#!/bin/bash\necho "# tool/gone.sh"  # tool/\n',
    "docs/guide.md": "# Guide\n\n## Running `train` fast\n\nBack to [the README](../README.md#two-commands).\n",
}

WORKSPACE = {
    "existing": ["//tool:train", "//tool:bench_x", "//tool:lib", "//tool/sub:thing", "//:train"],
    "binaries": {
        "//tool:train": ["tool/main.cc", "tool/launcher.cc"],
        "//tool:bench_x": ["tool/bench_x.sh", "tool/bench_x.py", "tool/main.cc"],
        "//tool:other": ["tool/other.cc"],
    },
}

CLEAN = textwrap.dedent("""\
    # Demo

    ## Two commands

    ```sh
    ./bazelw run //tool:train -- --steps=4 --nproc_per_node=2 \\
        --set=optimizer.lr=1e-3,gpt.num_layers=8 --helpfull
    ./bazelw test --config=asan --test_output=errors //tool/... //tool:all
    ./bazelw run --config=cuda //:train -- --p2p_static_shapes=true
    bazel-bin/tool/train --steps 3 | tee log
    tool/bench_x.sh --reps 2 --variant a='--x' --steps 3 --warmup 1
    ./bazelw run //tool:bench_x -- --reps 1
    python3 -m venv ~/tb && ~/tb/bin/pip install --upgrade tensorboard
    ```

    Run `train --steps=5` or `other --reps=2`; `//tool/sub:thing` and `//tool` exist, as
    does `//tool:main.cc` (a file); https://example.com//x is no label. A span may run
    over a line: `train
    --steps=2`. [Guide](docs/guide.md#running-train-fast), ![pic](docs/pic.png),
    [up](#two-commands), [web](https://example.com/a).
    """)



class CheckDocsTest(unittest.TestCase):

    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root)
        for rel, text in FILES.items():
            path = os.path.join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        self.ws = os.path.join(self.root, "ws.json")
        with open(self.ws, "w") as f:
            json.dump(WORKSPACE, f)

    def check(self, readme, sources=("tool/lib.h", "tool/run.py", "tool/run.sh")):
        with open(os.path.join(self.root, "README.md"), "w") as f:
            f.write(readme)
        files = [os.path.join(self.root, "README.md"), os.path.join(self.root, "docs/guide.md"),
                 os.path.join(self.root, "docs/paths.md")]
        files += [os.path.join(self.root, s) for s in sources]
        proc = subprocess.run(
            [sys.executable, check_docs.__file__, "--root=" + self.root,
             "--workspace_json=" + self.ws] + files,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        return proc.returncode, proc.stdout, proc.stderr

    def assert_fails(self, planted, *messages):
        code, _, err = self.check(CLEAN + planted)
        self.assertEqual(code, 1, err)
        for m in messages:
            self.assertIn(m, err)
        return err

    def test_clean_docs_pass(self):
        code, out, err = self.check(CLEAN)
        self.assertEqual(code, 0, err)
        self.assertIn("6 file(s)", out)

    def test_a_broken_target_fails_naming_file_and_line(self):
        self.assert_fails("\nSee `//tool:gone`.\n",
                          "README.md:22: target //tool:gone does not exist")
        self.assert_fails("\n```\n./bazelw test //nope/...\n```\n",
                          "README.md:23: target //nope/... does not exist")
        self.assert_fails("\nThe `//nopkg` package.\n", "README.md:22: target //nopkg:all")

    def test_visibility_specs_name_packages(self):
        self.assertEqual(
            check_docs.labels_in("`//visibility:private`, `//tool:__pkg__`, "
                                 "`//tool:__subpackages__`, `//:__pkg__`"),
            ["//tool:all", "//tool/...", "//:all"])
        self.assert_fails("\n`//nopkg:__pkg__`\n", "README.md:22: target //nopkg:all")

    def test_a_flag_the_binary_lacks_fails(self):
        err = self.assert_fails("\n```sh\n./bazelw run //tool:train -- --stpes=4\n```\n",
                                "README.md:23: --stpes is not a flag of //tool:train")
        self.assertIn("ABSL_FLAG in the sources of //tool:train", err)
        # --reps is a flag of another binary only.
        self.assert_fails("\nRun `train --reps=2`.\n", "README.md:22: --reps is not a flag of train")
        self.assert_fails("\n```\ntool/bench_x.sh --repz 2\n```\n",
                          "README.md:23: --repz is not a flag of tool/bench_x.sh")
        # A shell binary's options are its scripts', not those of what it runs.
        self.assert_fails("\n```\n./bazelw run //tool:bench_x -- --nproc_per_node=2\n```\n",
                          "--nproc_per_node is not a flag of //tool:bench_x")

    def test_flags_before_the_double_dash_are_bazels(self):
        code, _, err = self.check(CLEAN + "\n```\n./bazelw run --nonsense_bazel_flag //tool:train\n```\n")
        self.assertEqual(code, 0, err)

    def test_a_set_field_must_exist(self):
        self.assert_fails("\n`train --set=optimizer.lrr=1`\n",
                          "README.md:22: --set field optimizer.lrr: OptimizerConfig has no "
                          "field 'lrr' (fields: lr)")
        self.assert_fails("\n`train --set=steps=1,optimizer.lr.x=2`\n",
                          "--set field optimizer.lr.x: optimizer.lr is not a message")

    def test_a_broken_link_anchor_or_image_fails(self):
        self.assert_fails("\n[a](docs/missing.md)\n",
                          "README.md:22: link docs/missing.md: docs/missing.md does not exist")
        self.assert_fails("\n![b](docs/missing.png)\n",
                          "README.md:22: image docs/missing.png: docs/missing.png does not exist")
        self.assert_fails("\n[c](docs/guide.md#nowhere)\n",
                          "README.md:22: link docs/guide.md#nowhere: docs/guide.md has no heading "
                          "with anchor #nowhere")
        self.assert_fails("\n[d](#nowhere)\n", "README.md:22: link #nowhere")
        self.assert_fails('\n<img src="docs/gone.svg">\n', "README.md:22: image docs/gone.svg")

    def test_a_link_from_a_docs_file_resolves_from_its_folder(self):
        with open(os.path.join(self.root, "docs/guide.md"), "a") as f:
            f.write("\n[bad](README.md)\n")
        code, _, err = self.check(CLEAN)
        self.assertEqual(code, 1)
        self.assertIn("docs/guide.md:7: link README.md: docs/README.md does not exist", err)

    def test_code_is_not_read_as_links(self):
        code, _, err = self.check(CLEAN + "\n`[x](nope.md)`\n\n```\n[y](nope.md)\n```\n")
        self.assertEqual(code, 0, err)

    def test_a_missing_path_in_a_doc_fails(self):
        self.assert_fails("\nSee `tool/gone.cc`.\n", "README.md:22: path tool/gone.cc does not exist")
        self.assert_fails("\nSee docs/gone/, then\ntool/sub/x.h.\n",
                          "README.md:22: path docs/gone/ does not exist",
                          "README.md:23: path tool/sub/x.h does not exist")
        self.assert_fails("\n```\npython3 tool/gone.py --x\n```\n",
                          "README.md:23: path tool/gone.py does not exist")
        # A generated source stands for its .proto, a stem for its sources.
        self.assert_fails("\n`tool/other.pb.h`\n", "path tool/other.pb.h does not exist")
        self.assert_fails("\n`tool/gone_lib`\n", "path tool/gone_lib does not exist")

    def write(self, rel, text):
        with open(os.path.join(self.root, rel), "w") as f:
            f.write(text)

    def test_a_missing_path_in_a_comment_fails(self):
        self.write("tool/lib.h", "int x;  // see tool/gone.h\n/* and\n   tool/gone2.cc */\n")
        self.write("tool/run.py", '"""Usage: python3 tool/gone.py"""\n# tool/gone3.py\n'
                                  'def f():\n    """tool/gone4.py"""\n')
        self.write("tool/run.sh", "#!/bin/bash\nx=1  # tool/gone.sh\n")
        code, _, err = self.check(CLEAN)
        self.assertEqual(code, 1, err)
        for m in ("tool/lib.h:1: path tool/gone.h does not exist",
                  "tool/lib.h:3: path tool/gone2.cc does not exist",
                  "tool/run.py:1: path tool/gone.py does not exist",
                  "tool/run.py:2: path tool/gone3.py does not exist",
                  "tool/run.py:4: path tool/gone4.py does not exist",
                  "tool/run.sh:2: path tool/gone.sh does not exist"):
            self.assertIn(m, err)
        self.assertEqual(err.count(" does not exist"), 6, err)

    def test_code_outside_comments_is_not_read(self):
        self.write("tool/lib.h", 'const char* k = "tool/gone.h // tool/gone2.h";\n'
                                 "char c = '/'; int n = 1'000;  // tool/main.cc\n"
                                 'auto r = R"(tool/gone3.h)";\n')
        self.write("tool/run.py", 'X = "tool/gone.py"\nY = ("tool/gone2.py"\n     "x")\n')
        self.write("tool/run.sh", '#!/bin/bash\nls tool/gone  "a # tool/gone2"\n'
                                  'echo "a \\" # tool/gone3" \\# tool/gone4\n')
        code, _, err = self.check(CLEAN)
        self.assertEqual(code, 0, err)

    def test_the_marker_skips_a_line(self):
        self.write("tool/lib.h", "// tool/mine.cc (check_docs: example path)\n")
        code, _, err = self.check(CLEAN + "\n`tool/mine.md`  <!-- check_docs: example path -->\n")
        self.assertEqual(code, 0, err)

    def test_anchors(self):
        self.assertEqual(check_docs.github_anchor("Build mode, send path (2026-11-24, loaded)"),
                         "build-mode-send-path-2026-11-24-loaded")
        self.assertEqual(check_docs.github_anchor("Runtime (`pipeline/runtime/`): one process"),
                         "runtime-pipelineruntime-one-process")


if __name__ == "__main__":
    unittest.main()
