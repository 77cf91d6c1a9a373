#!/usr/bin/env python3
"""Draws one or more log.csv files of train_gpt into a PNG: train and validation loss against step.

    python3 scripts/plot_loss.py out/naive/log.csv out/flash/log.csv -o curves.png [--labels naive flash]

Each file becomes one colour: a thin line for the training loss of every step, dots joined by a
thicker line for the validation loss, and a cross at each step whose update the divergence guard
skipped (column `skipped`; a non-finite loss is left out of the line). Give two runs to compare them (for example the ATTN=naive and
ATTN=flash builds); the title then shows the largest relative difference of their training losses.
"""
import argparse
import csv
import math
import os
import sys


def read_log(path):
    steps, train, val_steps, val, skipped = [], [], [], [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"step", "train_loss", "val_loss"} - set(reader.fieldnames or [])
        if missing:
            sys.exit(f"error: {path} is not a train_gpt log.csv (no column {', '.join(sorted(missing))})")
        for row in reader:
            step = int(row["step"])
            loss = float(row["train_loss"]) if row["train_loss"] else math.nan
            if math.isfinite(loss):
                steps.append(step)
                train.append(loss)
            if row.get("skipped") == "1":
                skipped.append((step, loss if math.isfinite(loss) else None))
            if row["val_loss"]:
                val_steps.append(step)
                val.append(float(row["val_loss"]))
    return steps, train, val_steps, val, skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", help="log.csv files")
    parser.add_argument("-o", "--output", default="loss.png", help="PNG to write (default loss.png)")
    parser.add_argument("--labels", nargs="*", help="one label per log (default: the directory names)")
    args = parser.parse_args()
    if args.labels and len(args.labels) != len(args.logs):
        sys.exit("error: give as many --labels as logs")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_log(p) for p in args.logs]
    labels = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in args.logs]
    fig, ax = plt.subplots(figsize=(9, 5))
    for (steps, train, val_steps, val, skipped), label in zip(runs, labels):
        line, = ax.plot(steps, train, linewidth=0.8, alpha=0.8, label=f"{label} train")
        if skipped: # at the step's loss, or at the top of the curve when the loss is not finite
            xs = [s for s, _ in skipped]
            ys = [l if l is not None else max(train, default=0.0) for _, l in skipped]
            ax.plot(xs, ys, "x", color=line.get_color(), markersize=7, label=f"{label} skipped ({len(xs)})")
        if val:
            ax.plot(val_steps, val, "o-", color=line.get_color(), linewidth=1.8, markersize=3,
                    label=f"{label} val")
    title = "loss"
    if len(runs) == 2:
        a, b = dict(zip(runs[0][0], runs[0][1])), dict(zip(runs[1][0], runs[1][1]))
        common = sorted(set(a) & set(b))
        if common:
            worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in common)
            title += f" (max relative train-loss difference {worst:.2e} over {len(common)} steps)"
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
