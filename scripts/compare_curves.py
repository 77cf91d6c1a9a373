#!/usr/bin/env python3
"""Compare a run's loss curve with a recipe's reference curve and give a verdict.

    scripts/compare_curves.py RUN_DIR_OR_LOG REFERENCE [--recipe FILE] [-o PNG]

RUN_DIR_OR_LOG is a training output directory (its log.csv) or a log.csv; REFERENCE is a
recipes/reference/NAME.csv. Both are read by their header names, so extra columns do not matter.
The tolerances come from the recipe, recipes/NAME.conf beside the reference directory (or
--recipe), as comment lines the trainer skips:

    # tolerance train-mean 0.01   mean |train loss - reference| over the steps, in nats
    # tolerance val-rel 0.01      every validation point within this fraction of the reference's

Prints the mean and largest |train loss difference|, every validation point, the final validation
loss and the verdict; PASS needs every reference step present in the run and both tolerances met.
Draws both curves into one PNG (default: compare_NAME.png beside the run's log.csv).
Exit status: 0 PASS, 1 FAIL, 2 the inputs cannot be read.
"""
import argparse
import csv
import math
import os
import re
import sys

TOLERANCES = ("train-mean", "val-rel")


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value


def read_log(path):
    """{step: (train_loss or None, val_loss or None)}; a later row of a step replaces an earlier."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = {"step", "train_loss", "val_loss"} - set(reader.fieldnames or [])
            if missing:
                die(f"{path}: no column {', '.join(sorted(missing))} in the header {reader.fieldnames}")
            rows = {}
            for line, row in enumerate(reader, start=2):
                step = number(row["step"])
                if step is None or step != int(step):
                    die(f"{path} line {line}: step '{row['step']}' is not an integer")
                # an empty field is "not measured"; "nan" or "inf" stays a (failing) value
                train = number(row["train_loss"]) if row["train_loss"] not in ("", None) else None
                val = number(row["val_loss"]) if row["val_loss"] not in ("", None) else None
                rows[int(step)] = (train, val)
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    if not rows:
        die(f"{path} has no rows")
    return rows


def read_tolerances(recipe):
    found = {}
    try:
        with open(recipe) as f:
            for line in f:
                m = re.match(r"\s*#\s*tolerance\s+(\S+)\s+(\S+)", line)
                if m:
                    if m.group(1) not in TOLERANCES:
                        die(f"{recipe}: unknown tolerance '{m.group(1)}' (known: {', '.join(TOLERANCES)})")
                    value = number(m.group(2))
                    if value is None or not value > 0:
                        die(f"{recipe}: tolerance {m.group(1)} '{m.group(2)}' is not a positive number")
                    found[m.group(1)] = value
    except OSError as e:
        die(f"cannot read the recipe {recipe}: {e.strerror} (give it with --recipe)")
    missing = [t for t in TOLERANCES if t not in found]
    if missing:
        die(f"{recipe} states no '# tolerance {missing[0]} VALUE' line")
    return found


def finite(x):
    return x is not None and math.isfinite(x)


def plot(png, run, ref, run_label, ref_label):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for rows, label, color in ((ref, ref_label, "black"), (run, run_label, "tab:red")):
        steps = sorted(s for s in rows if finite(rows[s][0]))
        ax.plot(steps, [rows[s][0] for s in steps], color=color, alpha=0.5, lw=1, label=f"{label} train")
        steps = sorted(s for s in rows if finite(rows[s][1]))
        ax.plot(steps, [rows[s][1] for s in steps], color=color, marker="o", ms=3, lw=1.5, label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="training output directory or its log.csv")
    parser.add_argument("reference", help="recipes/reference/NAME.csv")
    parser.add_argument("--recipe", help="recipe with the '# tolerance' lines (default: recipes/NAME.conf)")
    parser.add_argument("-o", "--output", help="PNG of both curves (default: compare_NAME.png beside the log)")
    args = parser.parse_args()

    log = os.path.join(args.run, "log.csv") if os.path.isdir(args.run) else args.run
    name = os.path.splitext(os.path.basename(args.reference))[0]
    recipe = args.recipe or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.reference))),
                                         name + ".conf")
    tol = read_tolerances(recipe)
    run, ref = read_log(log), read_log(args.reference)

    print(f"run       {log}")
    print(f"reference {args.reference}")
    about = os.path.splitext(args.reference)[0] + ".txt"
    if os.path.exists(about):
        with open(about) as f:
            for line in f:
                if line.strip():
                    print(f"          {line.rstrip()}")
    print(f"tolerances from {recipe}: mean |train loss difference| <= {tol['train-mean']:g}, "
          f"every val point within {100 * tol['val-rel']:g}%")

    problems = []
    missing = sorted(s for s in ref if s not in run)
    if missing:
        problems.append(f"the run lacks {len(missing)} of the reference's {len(ref)} steps "
                        f"(first {missing[0]}; the run ends at step {max(run)})")

    diffs = []  # (|difference|, step) of the train losses
    for step in sorted(ref):
        if step in run and ref[step][0] is not None:
            r = run[step][0]
            if not finite(r):
                problems.append(f"train loss of step {step} is {r if r is not None else 'missing'}")
            else:
                diffs.append((abs(r - ref[step][0]), step))
    if diffs:
        mean = sum(d for d, _ in diffs) / len(diffs)
        worst, worst_step = max(diffs)
        print(f"train loss over {len(diffs)} steps: mean |difference| {mean:.6f}, "
              f"largest {worst:.6f} at step {worst_step}")
        if not mean <= tol["train-mean"]:
            problems.append(f"mean |train loss difference| {mean:.6f} > {tol['train-mean']:g}")
    else:
        problems.append("no train loss to compare")

    val_steps = [s for s in sorted(ref) if ref[s][1] is not None]
    print(f"{'step':>7} {'val run':>10} {'val ref':>10} {'rel diff':>9}")
    for step in val_steps:
        want = ref[step][1]
        got = run[step][1] if step in run else None
        if not finite(got):
            print(f"{step:>7} {'-':>10} {want:10.6f}")
            if step in run:
                problems.append(f"val loss of step {step} is {got if got is not None else 'missing'}")
            continue
        rel = abs(got - want) / abs(want)
        flag = "" if rel <= tol["val-rel"] else "  over"
        print(f"{step:>7} {got:10.6f} {want:10.6f} {100 * rel:8.3f}%{flag}")
        if rel > tol["val-rel"]:
            problems.append(f"val loss of step {step}: {got:.6f} against {want:.6f} ({100 * rel:.2f}% > "
                            f"{100 * tol['val-rel']:g}%)")
    if val_steps:
        last = val_steps[-1]
        got = run.get(last, (None, None))[1]
        print(f"final val loss (step {last}): run {got if got is not None else '-'}, reference {ref[last][1]}")

    png = args.output or os.path.join(os.path.dirname(os.path.abspath(log)), f"compare_{name}.png")
    try:
        plot(png, run, ref, "run", "reference")
        print(f"curves: {png}")
    except ImportError:
        print("warning: no matplotlib, no PNG (pip install matplotlib)", file=sys.stderr)

    if problems:
        print("FAIL: " + problems[0])
        for p in problems[1:6]:
            print("      " + p)
        if len(problems) > 6:
            print(f"      ... and {len(problems) - 6} more")
        return 1
    print("PASS: the run reproduces the reference curve within the recipe's tolerances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
