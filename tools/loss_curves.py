#!/usr/bin/env python3
"""loss_curves: several runs' loss curves in one SVG, to compare them by eye.

    python3 tools/loss_curves.py --title "gpt_small_pp2: fp32 vs bf16" \\
        --out docs/gpt_small_pp2_bf16_vs_fp32_loss.svg \\
        fp32=/tmp/meas_runs/gpt400_fp32-<time> bf16=/tmp/meas_runs/gpt400_bf16-<time>

Each LABEL=RUN_DIR reads RUN_DIR/metrics.jsonl (what train_gpt, train_bert and
train_llama write): the train loss of every step as a line, the eval losses as
dots, one colour per run, with a legend giving each run's final train and eval
loss. The chart's geometry, axes and colours follow the single-run loss.svg a
run writes (driver/loss_curve.cc), so the two read alike. Debian's python3 only.
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402  (load_records: one JSON object a line)

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 400, 60, 20, 40, 50
# matplotlib's first colours, as driver/loss_curve.cc uses for train (blue) and eval (orange).
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def read_run(run_dir):
    """(train, eval): lists of (step, loss) from RUN_DIR/metrics.jsonl."""
    try:
        records = results.load_records(os.path.join(run_dir, "metrics.jsonl"))
    except results.ResultsError as e:
        raise SystemExit("loss_curves: %s" % e)
    train, evals = [], []
    for record in records:
        if not isinstance(record, dict) or record.get("step") is None:
            continue
        step = record["step"]
        if isinstance(record.get("loss"), (int, float)):
            train.append((step, float(record["loss"])))
        if isinstance(record.get("eval_loss"), (int, float)):
            evals.append((step, float(record["eval_loss"])))
    return train, evals


def curves_svg(title, runs):
    """runs: list of (label, train, eval). A self-contained SVG string."""
    points = [p for _, train, evals in runs for p in train + evals if math.isfinite(p[1])]
    if points:
        min_step, max_step = min(s for s, _ in points), max(s for s, _ in points)
        min_loss, max_loss = min(l for _, l in points), max(l for _, l in points)
    else:
        min_step, max_step, min_loss, max_loss = 0, 1, 0.0, 1.0
    if max_step == min_step:
        max_step = min_step + 1
    if max_loss - min_loss < 1e-9:
        max_loss = min_loss + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step):
        return LEFT + plot_w * (step - min_step) / float(max_step - min_step)

    def y(loss):
        return TOP + plot_h * (max_loss - loss) / (max_loss - min_loss)

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (WIDTH, HEIGHT),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%.0f" y="24" font-size="15">%s</text>' % (LEFT, escape(title)),
           '<path d="M%.1f %.1f V%.1f H%.1f" stroke="black" fill="none"/>' %
           (LEFT, TOP, TOP + plot_h, LEFT + plot_w),
           '<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>' %
           (LEFT, TOP + plot_h / 2, LEFT + plot_w, TOP + plot_h / 2)]
    for value, ypos in ((max_loss, TOP + 4), ((max_loss + min_loss) / 2, TOP + plot_h / 2 + 4),
                        (min_loss, TOP + plot_h + 4)):
        out.append('<text x="%.1f" y="%.1f" text-anchor="end">%.3g</text>' %
                   (LEFT - 5, ypos, value))
    for step, xpos in ((min_step, LEFT), (max_step, LEFT + plot_w)):
        out.append('<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>' %
                   (xpos, TOP + plot_h + 18, step))
    out.append('<text x="%.1f" y="%.1f" text-anchor="middle">step</text>' %
               (LEFT + plot_w / 2, HEIGHT - 12))
    out.append('<text x="14" y="%.1f" transform="rotate(-90 14 %.1f)" '
               'text-anchor="middle">loss</text>' % (TOP + plot_h / 2, TOP + plot_h / 2))
    for i, (label, train, evals) in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        line = " ".join("%.1f,%.1f" % (x(s), y(l)) for s, l in train if math.isfinite(l))
        # Later runs dashed, so a curve drawn exactly over another still shows.
        dash = ' stroke-dasharray="6 3"' if i else ""
        out.append('<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>' %
                   (colour, dash, line))
        for s, l in evals:
            if math.isfinite(l):
                shape = ('<circle cx="%.1f" cy="%.1f" r="4" fill="none" stroke="%s" '
                         'stroke-width="1.5"/>' if i else
                         '<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>')
                out.append(shape % (x(s), y(l), colour))
        legend = "%s: train %s, eval %s" % (
            label, "%.4f" % train[-1][1] if train else "-", "%.4f" % evals[-1][1] if evals else "-")
        out.append('<text x="%.1f" y="%.1f" fill="%s" text-anchor="end">%s</text>' %
                   (LEFT + plot_w, TOP + 12 + 16 * i, colour, escape(legend)))
    out.append('<text x="%.1f" y="%.1f" fill="#555" text-anchor="end">line: train loss per '
               'step; dots: eval loss</text>' % (LEFT + plot_w, TOP + 12 + 16 * len(runs)))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--title", default="loss")
    ap.add_argument("--out", required=True, help="the SVG file to write")
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    args = ap.parse_args(argv)
    runs = []
    for spec in args.runs:
        label, sep, run_dir = spec.partition("=")
        if not sep or not label or not run_dir:
            ap.error("run %r must be LABEL=RUN_DIR" % spec)
        if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
            ap.error("run %r: no metrics.jsonl in %s" % (label, run_dir))
        train, evals = read_run(run_dir)
        runs.append((label, train, evals))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(curves_svg(args.title, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
