"""kit_summary.py's verdicts: a run_on_device.sh stage must fail when a test
failed, when a filter selected nothing, when the binary left no XML, and when
losses differ beyond the tolerance; the bench reports the ratio it measured."""
import json
import os
import tempfile
import unittest

import kit_summary

XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="1" disabled="0" errors="0" name="AllTests">
  <testsuite name="Devices/P2PDeviceTest" tests="4" failures="1" skipped="2">
    <testcase name="Arrives/cuda" status="run" result="completed" classname="Devices/P2PDeviceTest" />
    <testcase name="Sums/cuda" status="run" result="completed" classname="Devices/P2PDeviceTest">
      <failure message="Expected equality" type=""><![CDATA[boom]]></failure>
    </testcase>
    <testcase name="A/cuda" status="run" result="skipped" classname="S"><skipped message="needs 2 GPUs"/></testcase>
    <testcase name="B/cuda" status="run" result="skipped" classname="S"><skipped message="needs 2 GPUs"/></testcase>
  </testsuite>
</testsuites>
"""

EMPTY = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="0" failures="0" disabled="0" errors="0" name="AllTests"></testsuites>
"""


class KitSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_counts_failures_and_skip_reasons(self):
        r = kit_summary.tests("p2p_test", "*cuda", self.write("a.xml", XML), "1", "3", "90")
        self.assertEqual((r["tests"], r["failures"], r["skipped"]), (4, 1, 2))
        self.assertEqual(r["skip_reasons"], {"needs 2 GPUs": 2})
        self.assertEqual(r["failed"][0]["case"], "Devices/P2PDeviceTest.Sums/cuda")
        self.assertFalse(r["ok"])

    def test_a_filter_that_selects_nothing_fails(self):
        r = kit_summary.tests("x", "NoSuch.*", self.write("e.xml", EMPTY), "0", "1", "90")
        self.assertFalse(r["ok"])
        self.assertIn("selected no test", r["error"])

    def test_no_xml_fails(self):
        r = kit_summary.tests("x", "*", os.path.join(self.dir, "missing.xml"), "124", "90", "90")
        self.assertFalse(r["ok"])

    def metrics(self, name, losses):
        return self.write(name, "".join(json.dumps({"step": i + 1, "loss": l}) + "\n"
                                        for i, l in enumerate(losses)))

    def test_compare_within_and_beyond_tolerance(self):
        cpu = self.metrics("cpu", [5.0, 4.0, 3.0])
        close = self.metrics("close", [5.0, 4.0002, 3.0])
        far = self.metrics("far", [5.0, 4.0, 3.01])
        ok = kit_summary.compare(cpu, close, "1e-4", "3")
        self.assertTrue(ok["ok"])
        self.assertAlmostEqual(ok["max_rel_diff"], 0.00005)
        bad = kit_summary.compare(cpu, far, "1e-4", "3")
        self.assertFalse(bad["ok"])
        self.assertEqual(bad["worst_step"], 3)
        short = kit_summary.compare(cpu, self.metrics("short", [5.0]), "1e-4", "3")
        self.assertFalse(short["ok"])

    def test_bench_ratio_of_best_rounds(self):
        line = lambda system, rate: json.dumps({"bench": "gpu_pp1", "system": system,
                                                "tokens_per_s": rate, "median_step_s": 1.0 / rate})
        pipe = self.write("p", "noise\n" + line("pipe", 90.0) + "\n" + line("pipe", 100.0) + "\n")
        ref = self.write("t", line("pytorch", 110.0) + "\n" + line("pytorch", 125.0) + "\n")
        r = kit_summary.bench(pipe, ref, "0.95")
        self.assertAlmostEqual(r["ratio"], 0.8)
        self.assertFalse(r["meets_target"])
        self.assertTrue(r["ok"])
        missing = kit_summary.bench(pipe, os.path.join(self.dir, "none"), "0.95")
        self.assertFalse(missing["ok"])

    def test_named_records_and_argument_counts(self):
        cpu = self.metrics("cpu2", [5.0, 4.0])
        named = kit_summary.compare(cpu, cpu, "1e-4", "2", "compare_pp2_shared")
        self.assertEqual(named["name"], "compare_pp2_shared")
        self.assertTrue(named["ok"])
        self.assertNotIn("name", kit_summary.compare(cpu, cpu, "1e-4", "2"))
        # Too few or too many arguments print the usage and exit 2.
        self.assertEqual(kit_summary.main(["kit_summary.py", "compare", cpu, cpu, "1e-4"]), 2)
        self.assertEqual(kit_summary.main(["kit_summary.py", "bench", "a", "b", "0.95", "n", "x"]), 2)

    def test_assemble_is_not_ok_when_a_record_failed(self):
        good = {"kind": "train", "ok": True}
        bad = {"kind": "compare", "ok": False}
        records = self.write("r.jsonl", json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        header = self.write("h.json", json.dumps({"kit": "x"}))
        out = os.path.join(self.dir, "s.json")
        kit_summary.assemble(records, header, out)
        with open(out) as f:
            s = json.load(f)
        self.assertFalse(s["ok"])
        self.assertEqual(s["train"], [good])

    def test_llama_flops_per_token_and_mfu(self):
        # TinyLlama 1.1B's shape: 22 layers of width 2048, 32 heads of 64, 4 kv
        # heads, SwiGLU 5632, vocabulary 32000, context 2048.
        config = {"model": "llama", "width": 2048, "layers": 22, "heads": 32, "kv_heads": 4,
                  "intermediate": 5632, "vocab": 32000, "context": 2048}
        per_layer = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632
        want = 6 * (22 * per_layer + 2048 * 32000) + 12 * 22 * 2048 * 2048
        self.assertEqual(kit_summary.model_flops_per_token(config), want)
        self.assertIsNone(kit_summary.model_flops_per_token({**config, "model": "bert"}))
        self.assertIsNone(kit_summary.model_flops_per_token({"model": "llama"}))
        line = lambda system, rate: json.dumps(dict(config, bench="b", system=system,
                                                    precision="bf16", tokens_per_s=rate,
                                                    median_step_s=1.0 / rate))
        r = kit_summary.bench(self.write("p", line("pipe", 3e4)), self.write("t", line("pytorch", 2e4)), "1.0")
        records = self.write("r.jsonl", json.dumps(r) + "\n")
        out = os.path.join(self.dir, "s.json")
        for gpu, mfu in (("NVIDIA H200, 570.1, 143771 MiB", want * 3e4 / 989.4e12), ("", None)):
            kit_summary.assemble(records, self.write("h.json", json.dumps({"machine": {"gpu": gpu}})), out)
            with open(out) as f:
                b = json.load(f)["bench"][0]
            self.assertEqual(b["ratio"], 1.5)
            if mfu is None:
                self.assertNotIn("pipe_mfu", b)  # a GPU of unknown peak: no utilisation
            else:
                self.assertAlmostEqual(b["pipe_mfu"], mfu)
                self.assertAlmostEqual(b["pytorch_mfu"], mfu / 1.5)


if __name__ == "__main__":
    unittest.main()
