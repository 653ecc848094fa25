"""Tests for tools/loss_curves.py on synthetic run directories (no Bazel needed)."""

import json
import os
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loss_curves  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def write_run(root, name, losses, evals):
    run_dir = os.path.join(root, name)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for step, loss in enumerate(losses, 1):
            line = {"step": step, "loss": loss, "lr": 1e-3}
            if step in evals:
                line["eval_loss"] = evals[step]
            f.write(json.dumps(line) + "\n")
    return run_dir


class LossCurvesTest(unittest.TestCase):

    def test_one_line_and_eval_dots_per_run_with_final_losses_in_the_legend(self):
        with tempfile.TemporaryDirectory() as tmp:
            a = write_run(tmp, "a", [5.0, 4.0, 3.0, 2.5], {2: 4.2, 4: 2.9})
            b = write_run(tmp, "b", [5.0, 4.1, 3.1, 2.6], {2: 4.3, 4: 3.0})
            out = os.path.join(tmp, "c.svg")
            self.assertEqual(loss_curves.main(["--title", "a <vs> b", "--out", out,
                                               "fp32=" + a, "bf16=" + b]), 0)
            root = ET.parse(out).getroot()
        lines = root.findall(SVG + "polyline")
        self.assertEqual(len(lines), 2)
        self.assertEqual([len(l.get("points").split()) for l in lines], [4, 4])
        self.assertEqual(len(root.findall(SVG + "circle")), 4)
        texts = [t.text for t in root.findall(SVG + "text")]
        self.assertIn("a <vs> b", texts)
        self.assertIn("fp32: train 2.5000, eval 2.9000", texts)
        self.assertIn("bf16: train 2.6000, eval 3.0000", texts)

    def test_a_run_without_metrics_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(SystemExit):
                loss_curves.main(["--out", os.path.join(tmp, "x.svg"), "fp32=" + tmp])
            with self.assertRaises(SystemExit):
                loss_curves.main(["--out", os.path.join(tmp, "x.svg"), tmp])


if __name__ == "__main__":
    unittest.main()
