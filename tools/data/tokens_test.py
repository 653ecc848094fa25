"""tools/data/tokens.py refuses bad arguments with one line naming the value,
never a traceback or a hang (issue #42, classes 4 and 10). Runs with any
python3: the checks come before numpy and tokenizers are imported (the
tokenizer-dependent refusals are in //models/data:token_tool_test)."""

import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokens.py")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                          timeout=30)


class TokensToolRefusals(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.fifo = os.path.join(self.dir, "fifo")
        os.mkfifo(self.fifo)
        self.text = os.path.join(self.dir, "a.txt")
        with open(self.text, "w") as f:
            f.write("some text\n")
        self.not_json = os.path.join(self.dir, "tok.json")
        with open(self.not_json, "w") as f:
            f.write("not json {")

    def refused(self, expected, *args):
        result = run(*args)
        self.assertNotEqual(result.returncode, 0, result)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn(expected, result.stderr)

    def test_bad_values_are_named(self):
        self.refused("--vocab_size (1) must be in [257, 16777216]",
                     "train", "--corpus", self.text, "--vocab_size", "1", "--out", "t.json")
        self.refused("--ids: 'a' is not a token id",
                     "decode", "--tokenizer", self.not_json, "--ids", "1,2,a")
        self.refused("--ids: '-3' is not a token id",
                     "decode", "--tokenizer", self.not_json, "--ids", "-3")
        self.refused(f"--tokenizer {self.not_json} is not JSON",
                     "decode", "--tokenizer", self.not_json, "--ids", "1")
        self.refused(f"--out {self.dir} cannot be written",
                     "train", "--corpus", self.text, "--out", self.dir)
        self.refused(f"--out {self.dir}/no/such/x.bin cannot be written",
                     "encode", "--tokenizer", self.not_json, "--corpus", self.text,
                     "--format", "flat", "--out", f"{self.dir}/no/such/x.bin")

    def test_fifos_are_refused_or_skipped_without_blocking(self):
        self.refused(f"corpus path {self.fifo} is a FIFO",
                     "train", "--corpus", self.fifo, "--out", os.path.join(self.dir, "t.json"))
        self.refused(f"--tokenizer {self.fifo} is a FIFO",
                     "decode", "--tokenizer", self.fifo, "--ids", "1")
        only_fifo = os.path.join(self.dir, "corpus")
        os.mkdir(only_fifo)
        os.mkfifo(os.path.join(only_fifo, "pipe.txt"))
        self.refused("no regular files under",
                     "train", "--corpus", only_fifo, "--out", os.path.join(self.dir, "t.json"))


if __name__ == "__main__":
    unittest.main()
