#!/usr/bin/env python3
"""Compare a run's loss curve with a recipe's reference curve and give a verdict.

    scripts/compare_curves.py RUN_DIR_OR_LOG REFERENCE [--recipe FILE] [--envelope FILE]
                              [--precision BF16|FP16|FP32] [--through-step N] [-o PNG]

RUN_DIR_OR_LOG is a training output directory (its log.csv) or a log.csv; REFERENCE is a
recipes/reference/NAME.csv. Every CSV is read by its header names, so extra columns do not matter.

The verdict has three outcomes:
  IDENTICAL   every train and validation loss of the reference, bit for bit (as logged): the same
              GPU model, build and recipe.
  REPRODUCED  the run stays within what changing only the order of the sums does early, and within
              the spread of other seeds late (below); what another GPU model gives.
  FAIL        naming the steps where the run left the reference and by how much.
Exit status: 0 IDENTICAL or REPRODUCED, 1 FAIL, 2 the inputs cannot be read or do not fit together.

REPRODUCED is judged against the reference's envelope, recipes/reference/NAME.envelope.csv (written
with scripts/write_envelope.sh on the reference's GPU): runs of the recipe that differ from the
reference only in the order of their sums ("order" runs: other kernels, batch sizes, tiles) and runs
with other seeds ("seed" runs). The steps are cut into windows (1-10, 11-20, ..., 41-50, then
51-75, 76-100, 101-150, 151-200, 201-300, ...). In each window two numbers are taken of every run
against the reference: the mean |train loss difference| over its steps and the largest |validation
loss difference| at its validation points.
  - Early, while ORDER_MARGIN times the largest of the order runs' number is still below the
    smallest of the seed runs', a window is an order window: the run's number must be at most
    ORDER_MARGIN times the order runs' largest (and never needs to be below one unit in the last
    place of an fp32 number the size of the window's losses: the trainer's loss is an fp32 value).
  - From the first window where that no longer holds, windows are seed windows: the run's number
    must be at most SEED_MARGIN times the seed runs' largest.
A changed summation order is a rounding-sized change that the training amplifies step by step; a
wrong setting (learning rate, warmup, AdamW's constants, a layer's arithmetic) changes the curve
from its first steps by far more than that. Late in a run both look like another seed.

A run of another precision than the reference's (an FP16 run against a BF16 reference: the build
named by the "# precision P" line of the run.conf beside its log.csv, or --precision) differs from
it from the first step by the other precision's roundings, which the order runs do not show. Its
early windows are judged against the envelope's runs of that precision instead (kind P: the recipe
with its seed in a build of precision P, each in another summation order; scripts/write_envelope.sh
--precision P), in the same way; an envelope without them cannot judge such a run (exit 2).

A reference with no envelope is judged by the recipe's fixed tolerances instead, and says so:
    # tolerance train-mean 0.01   mean |train loss - reference| over the steps, in nats
    # tolerance val-rel 0.01      every validation point within this fraction of the reference's
(comment lines of recipes/NAME.conf beside the reference directory, or --recipe).

--through-step N judges steps 0..N only: for a run stopped early on purpose, as the power study
(tests/gpu/test_recipe_power.sh) stops runs whose verdict is decided in their first steps. A window that
FAILs there FAILs the whole run too, since every window is judged on its own.

Draws the curves, the envelope and the differences into one PNG (default: compare_NAME.png beside
the run's log.csv), titled with the recipe and the verdict.
"""
import argparse
import csv
import hashlib
import math
import os
import re
import sys
import textwrap

TOLERANCES = ("train-mean", "val-rel")
PRECISIONS = ("BF16", "FP16", "FP32")
# A window's number may be this many times the largest of the order runs': the order runs are a
# handful of draws of a spread whose tail they do not show, and a run on another GPU model is one
# more draw. The power study shows what this margin still catches.
ORDER_MARGIN = 3.0
# Late windows: a correct run must be at most this many times as far off as the farthest seed run.
SEED_MARGIN = 1.5


def fp32_ulp(x):
    """One unit in the last place of an fp32 number of magnitude |x|: the finest difference two
    trainers' fp32 losses can show. No order window asks a run to be closer than that, so an envelope
    whose order runs all happen to equal the reference (the CPU build sums alike at any thread count)
    does not demand bit-identity. Measured on ci-tiny (docs/reproduce.md): FP32 runs on a GPU, under
    every kernel path, stay within 0.2 of an ulp of the CPU's reference in every window."""
    return 2.0 ** (math.frexp(abs(x))[1] - 24) if x else 0.0


def floor(reference, steps, i):
    """The order windows' floor for loss i (0 train, 1 val) over steps: an fp32 ulp of the largest."""
    return fp32_ulp(max(abs(reference[s][i]) for s in steps))


def die(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def finite(x):
    return x is not None and math.isfinite(x)


def read_rows(path, reader, where):
    """{step: (train_loss or None, val_loss or None)} of the rows `reader` yields; a later row of a
    step replaces an earlier. An empty field is "not measured"; "nan" or "inf" stays a value."""
    rows = {}
    for line, row in reader:
        step = number(row["step"])
        if step is None or step != int(step):
            die(f"{path} line {line}: step '{row['step']}' is not an integer{where}")
        train = number(row["train_loss"]) if row["train_loss"] not in ("", None) else None
        val = number(row["val_loss"]) if row["val_loss"] not in ("", None) else None
        rows[int(step)] = (train, val)
    return rows


def open_csv(path, columns):
    try:
        f = open(path, newline="")
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    reader = csv.DictReader(f)
    missing = set(columns) - set(reader.fieldnames or [])
    if missing:
        die(f"{path}: no column {', '.join(sorted(missing))} in the header {reader.fieldnames}")
    return f, reader


def read_log(path):
    f, reader = open_csv(path, ("step", "train_loss", "val_loss"))
    with f:
        rows = read_rows(path, enumerate(reader, start=2), "")
    if not rows:
        die(f"{path} has no rows")
    return rows


def recipe_settings(recipe):
    """The recipe's option lines, comments and blank lines left out, and their SHA-256: what an
    envelope must have been written with."""
    try:
        with open(recipe) as f:
            lines = [" ".join(line.split("#", 1)[0].split()) for line in f]
    except OSError as e:
        die(f"cannot read the recipe {recipe}: {e.strerror} (give it with --recipe)")
    settings = "\n".join(line for line in lines if line)
    return hashlib.sha256(settings.encode()).hexdigest()


def read_envelope(path, reference_path, reference, recipe, name):
    """{"order": {run: rows}, "seed": {run: rows}, and P: {run: rows} for each precision P it has runs
    of}, refused (exit 2) unless it was written for this recipe's settings and covers every step of
    the reference."""
    about = os.path.splitext(path)[0] + ".txt"
    fields = {}
    try:
        with open(about) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("recipe", "settings"):
                    fields[key.strip()] = value.strip()
    except OSError as e:
        die(f"cannot read {about}, the envelope's description: {e.strerror}")
    if fields.get("recipe") != name:
        die(f"the envelope {path} is of the recipe '{fields.get('recipe')}' ({about}), the reference "
            f"{reference_path} of '{name}'")
    if fields.get("settings") != recipe_settings(recipe):
        die(f"the envelope {path} was written for other settings of {recipe} than it has now (the "
            f"'settings:' line of {about}); the reference {reference_path} needs an envelope of its own: "
            f"scripts/write_envelope.sh")
    f, reader = open_csv(path, ("kind", "run", "step", "train_loss", "val_loss"))
    by_run = {}
    with f:
        for line, row in enumerate(reader, start=2):
            if row["kind"] not in ("order", "seed") + PRECISIONS:
                die(f"{path} line {line}: kind '{row['kind']}' is not 'order', 'seed' or a precision "
                    f"({', '.join(PRECISIONS)})")
            by_run.setdefault((row["kind"], row["run"]), []).append((line, row))
    runs = {"order": {}, "seed": {}}
    for (kind, run), lines in by_run.items():
        runs.setdefault(kind, {})
        rows = read_rows(path, lines, f" (run '{run}')")
        lacking = [s for s in sorted(reference) if s not in rows or
                   (reference[s][0] is not None and not finite(rows[s][0]))]
        if lacking:
            die(f"the envelope {path} does not fit the reference {reference_path}: its {kind} run '{run}' "
                f"has no train loss at step {lacking[0]} ({len(lacking)} steps of the reference lack one)")
        runs[kind][run] = rows
    for kind in ("order", "seed"):
        if not runs[kind]:
            die(f"the envelope {path} has no {kind} runs")
    return runs


def windows(last_step):
    """(first, last) step of each window covering 0..last_step: 0-10, 11-20, ..., 41-50, then 51-75,
    76-100, 101-150, 151-200, 201-300, 301-400, ... (step 0 holds the initial validation loss)."""
    edges, base = [10, 20, 30, 40, 50], 50
    while edges[-1] < last_step:
        edges += [base * 3 // 2, base * 2]
        base *= 2
    out, first = [], 0
    for edge in edges:
        if first > last_step:
            break
        out.append((first, min(edge, last_step)))
        first = edge + 1
    return out


def window_numbers(rows, reference, train_steps, val_steps):
    """(mean |train difference| over train_steps, largest |val difference| over val_steps or None)."""
    train = sum(abs(rows[s][0] - reference[s][0]) for s in train_steps) / len(train_steps) if train_steps else None
    val = max(abs(rows[s][1] - reference[s][1]) for s in val_steps) if val_steps else None
    return train, val


def early_runs(early, count=None):
    """How a message names the runs that set the order windows' limits (and how many)."""
    name = "order-only runs" if early == "order" else f"{early} runs"
    return name if count is None else f"{count} {name}"


def judge_envelope(run, reference, envelope, steps, early):
    """Every window's numbers against its threshold, the order windows' against the envelope's runs of
    kind `early` ("order", or the run's precision where it differs from the reference's). Returns
    (windows, failures), each window a dict with its steps, tier, numbers and thresholds; failures a
    list of messages, first failure first."""
    failures = []
    judged = []
    order_tier = True
    for first, last in windows(max(steps)):
        in_window = [s for s in steps if first <= s <= last]
        train_steps = [s for s in in_window if reference[s][0] is not None]
        val_steps = [s for s in in_window if reference[s][1] is not None]
        if not train_steps and not val_steps:
            continue
        numbers = {kind: [window_numbers(rows, reference, train_steps, val_steps) for rows in envelope[kind].values()]
                   for kind in (early, "seed")}
        order_train = max(n[0] for n in numbers[early]) if train_steps else 0.0
        seed_train_min = min(n[0] for n in numbers["seed"]) if train_steps else math.inf
        order_tier = order_tier and ORDER_MARGIN * order_train < seed_train_min
        w = {"first": first, "last": last, "tier": "order" if order_tier else "seed"}
        for i, what in ((0, "train"), (1, "val")):
            if (what == "train" and not train_steps) or (what == "val" and not val_steps):
                continue
            if order_tier:
                spread = ORDER_MARGIN * max(n[i] for n in numbers[early])
                resolution = floor(reference, train_steps if i == 0 else val_steps, i)
                limit = max(spread, resolution)
                basis = f"{ORDER_MARGIN:g} x the largest of {early_runs(early, len(numbers[early]))}" \
                    if spread >= resolution else f"an fp32 ulp of the loss: the {early_runs(early)} are closer still"
            else:
                limit = SEED_MARGIN * max(n[i] for n in numbers["seed"])
                basis = f"{SEED_MARGIN:g} x the largest of {len(numbers['seed'])} other seeds"
            got = window_numbers(run, reference, train_steps, val_steps)[i]
            w[what] = (got, limit)
            if not got <= limit:
                measure = "mean |train loss difference|" if what == "train" else "largest |val loss difference|"
                left = left_at(run, reference, envelope, train_steps if what == "train" else val_steps, i,
                               early if order_tier else "seed")
                failures.append(f"steps {first}-{last} ({w['tier']} window): {measure} {got:.3g} > {limit:.3g} "
                                f"({basis}); {left}")
        judged.append(w)
    return judged, failures


def left_at(run, reference, envelope, steps, i, kind):
    """Where in `steps` the run first went farther from the reference than the envelope's runs of
    `kind`, the window's tier's (times its margin), went at that step."""
    order_tier = kind != "seed"
    margin = ORDER_MARGIN if order_tier else SEED_MARGIN
    what = "train" if i == 0 else "val"
    for s in steps:
        off = abs(run[s][i] - reference[s][i])
        spread = max(abs(rows[s][i] - reference[s][i]) for rows in envelope[kind].values())
        if off > max(margin * spread, fp32_ulp(reference[s][i]) if order_tier else 0.0):
            return f"it left at step {s}: {what} loss {run[s][i]:.9g} against {reference[s][i]:.9g} ({off:.3g} off, " \
                   f"the {kind} runs at most {spread:.3g})"
    return f"no single step stands out; the window as a whole is off"


def judge_tolerances(run, reference, steps, tol):
    failures = []
    diffs = [abs(run[s][0] - reference[s][0]) for s in steps if reference[s][0] is not None]
    mean = sum(diffs) / len(diffs) if diffs else 0.0
    print(f"train loss over {len(diffs)} steps: mean |difference| {mean:.6f}")
    if not mean <= tol["train-mean"]:
        failures.append(f"mean |train loss difference| {mean:.6f} > {tol['train-mean']:g}")
    for s in steps:
        want = reference[s][1]
        if want is not None and not abs(run[s][1] - want) <= tol["val-rel"] * abs(want):
            failures.append(f"val loss of step {s}: {run[s][1]:.6f} against {want:.6f} "
                            f"({100 * abs(run[s][1] - want) / abs(want):.2f}% > {100 * tol['val-rel']:g}%)")
    return failures


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
        die(f"{recipe} has no envelope and states no '# tolerance {missing[0]} VALUE' line")
    return found


def reference_precision(about_lines):
    """The precision of the build that wrote the reference, from the "build:" line of its description
    (PRECISION=P; train_gpt_cpu is FP32), or None."""
    for line in about_lines:
        if line.startswith("build:"):
            m = re.search(r"PRECISION=(\w+)", line)
            return m.group(1) if m else "FP32" if "train_gpt_cpu" in line else None
    return None


def run_precision(log):
    """The precision of the build that trained the run: the "# precision P" line train_gpt writes into
    the run.conf beside its log.csv, or None."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(log)), "run.conf")) as f:
            for line in f:
                m = re.match(r"#\s*precision\s+(\w+)", line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    return None


def plot(png, title, verdict_ok, run, reference, envelope, early, steps, judged, fail_step):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    fig.suptitle(title, color="tab:green" if verdict_ok else "tab:red", fontsize=11)
    train_steps = [s for s in steps if reference[s][0] is not None]
    val_steps = [s for s in steps if reference[s][1] is not None]
    if envelope:
        for kind, color in (("seed", "0.8"), (early, "tab:blue")):
            values = [[rows[s][0] for rows in envelope[kind].values()] for s in train_steps]
            top.fill_between(train_steps, [min(v) for v in values], [max(v) for v in values], color=color,
                             alpha=0.6 if kind == "seed" else 0.35, lw=0,
                             label=f"{kind} envelope ({len(envelope[kind])} runs)")
    top.plot(train_steps, [reference[s][0] for s in train_steps], "k--", lw=1.2, label="reference train", zorder=3)
    top.plot(val_steps, [reference[s][1] for s in val_steps], "k--", marker="o", ms=3, lw=1.2, label="reference val",
             zorder=3)
    have = [s for s in train_steps if finite(run[s][0])]
    top.plot(have, [run[s][0] for s in have], color="tab:red", lw=0.8, label="run train", zorder=4)
    have = [s for s in val_steps if finite(run[s][1])]
    top.plot(have, [run[s][1] for s in have], color="tab:red", marker="o", ms=3, lw=1, label="run val", zorder=4)
    top.set_ylabel("loss (nats)")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)

    have = [s for s in train_steps if finite(run[s][0])]
    bottom.plot(have, [max(abs(run[s][0] - reference[s][0]), 1e-7) for s in have], color="tab:red", lw=0.8,
                label="|run - reference| (train)")
    if envelope:
        for kind, color in ((early, "tab:blue"), ("seed", "0.5")):
            spread = [max(max(abs(rows[s][0] - reference[s][0]) for rows in envelope[kind].values()), 1e-7)
                      for s in train_steps]
            bottom.plot(train_steps, spread, color=color, lw=0.8, alpha=0.8, label=f"largest of the {kind} runs")
        for k, w in enumerate(judged):
            if "train" in w:
                bottom.hlines(w["train"][1], max(w["first"], 1), w["last"], colors="k", lw=1.5,
                              label="window limit (mean)" if k == 0 else None)
    if fail_step is not None:
        bottom.axvline(fail_step, color="tab:red", ls=":", lw=1.5)
        top.axvline(fail_step, color="tab:red", ls=":", lw=1.5, label=None)
        bottom.annotate(f"left at step {fail_step}", (fail_step, bottom.get_ylim()[1]), color="tab:red",
                        fontsize=8, va="top")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("|difference| (nats)")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="training output directory or its log.csv")
    parser.add_argument("reference", help="recipes/reference/NAME.csv")
    parser.add_argument("--recipe", help="the recipe (default: recipes/NAME.conf beside the reference directory)")
    parser.add_argument("--envelope", help="default: NAME.envelope.csv beside the reference, when it exists")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="the run's build (default: the '# precision' line of its run.conf, else the reference's)")
    parser.add_argument("--through-step", type=int, metavar="N", help="judge steps 0..N only (a run stopped early)")
    parser.add_argument("-o", "--output", help="PNG of the curves (default: compare_NAME.png beside the log)")
    args = parser.parse_args()

    log = os.path.join(args.run, "log.csv") if os.path.isdir(args.run) else args.run
    name = os.path.splitext(os.path.basename(args.reference))[0]
    recipe = args.recipe or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.reference))),
                                         name + ".conf")
    envelope_path = args.envelope or os.path.splitext(args.reference)[0] + ".envelope.csv"
    if args.envelope and not os.path.exists(args.envelope):
        die(f"cannot read the envelope {args.envelope}: no such file")
    recipe_settings(recipe)  # the recipe must be readable whatever the verdict
    run, reference = read_log(log), read_log(args.reference)
    if args.through_step is not None:
        if args.through_step < 1:
            die(f"--through-step {args.through_step}: give a step of 1 or more")
        reference = {s: v for s, v in reference.items() if s <= args.through_step}
    steps = sorted(reference)

    print(f"run       {log}")
    print(f"reference {args.reference}")
    about = os.path.splitext(args.reference)[0] + ".txt"
    about_lines = []
    if os.path.exists(about):
        with open(about) as f:
            about_lines = [line.rstrip() for line in f if line.strip()]
    for line in about_lines:
        print(f"          {line}")
    if args.through_step is not None:
        print(f"judged through step {args.through_step} only (--through-step)")
    ref_precision = reference_precision(about_lines)
    precision, source = (args.precision, "--precision") if args.precision else (run_precision(log), "its run.conf")
    if precision is None:
        precision, source = ref_precision, "no run.conf names it: taken as the reference's"
    print(f"precision {precision or '?'} ({source}); the reference's {ref_precision or '?'}")

    missing = [s for s in steps if s not in run]
    bad = [s for s in steps if s in run and any(reference[s][i] is not None and not finite(run[s][i]) for i in (0, 1))]
    envelope = None
    if os.path.exists(envelope_path):
        envelope = read_envelope(envelope_path, args.reference, reference, recipe, name)
        others = "".join(f", {len(envelope[p])} {p} runs" for p in PRECISIONS if p in envelope)
        print(f"envelope  {envelope_path}: {len(envelope['order'])} order-only runs, {len(envelope['seed'])} seeds{others}")
    early = "order"
    if precision and ref_precision and precision != ref_precision:
        early = precision

    failures, judged = [], []
    identical = not missing and all(run[s][i] == reference[s][i] for s in steps for i in (0, 1)
                                    if reference[s][i] is not None)
    if missing:
        failures.append(f"the run lacks step {missing[0]} of the reference ({len(missing)} of its {len(steps)} steps "
                        f"missing; the run ends at step {max(run)})")
    elif bad:
        s = bad[0]
        what = [f"{name} loss {run[s][i] if run[s][i] is not None else '(none)'}" for i, name in ((0, "train"), (1, "val"))
                if reference[s][i] is not None and not finite(run[s][i])]
        failures.append(f"step {s}: the run's {' and '.join(what)} where the reference has one "
                        f"({len(bad)} such steps; a run of the recipe's own -v logs every validation point)")
    elif identical:
        pass
    elif envelope:
        if early not in envelope:
            die(f"the run was trained in {early} ({source}), the reference {args.reference} in {ref_precision}: "
                f"from its first step the run differs by {early}'s roundings, which the order-only runs of the "
                f"envelope {envelope_path} do not show, and it has no {early} runs to judge that by "
                f"(scripts/write_envelope.sh --precision {early} writes them on the reference's GPU model)")
        judged, failures = judge_envelope(run, reference, envelope, steps, early)
        print(f"{'steps':>9} {'tier':>5} {'train mean|d|':>13} {'limit':>9} {'val max|d|':>11} {'limit':>9}")
        for w in judged:
            t = w.get("train")
            v = w.get("val")
            print(f"{w['first']:>4}-{w['last']:<4} {w['tier']:>5} "
                  f"{t[0] if t else float('nan'):13.3g} {t[1] if t else float('nan'):9.3g} "
                  f"{v[0] if v else float('nan'):11.3g} {v[1] if v else float('nan'):9.3g}"
                  f"{'  over' if (t and not t[0] <= t[1]) or (v and not v[0] <= v[1]) else ''}")
    else:
        print(f"warning: no envelope ({envelope_path}): judged by the recipe's fixed tolerances, which cannot tell a "
              f"run on another GPU model from a wrong one (scripts/write_envelope.sh writes one)")
        failures = judge_tolerances(run, reference, steps, read_tolerances(recipe))

    last_val = [s for s in steps if reference[s][1] is not None]
    if last_val:
        s = last_val[-1]
        got = run.get(s, (None, None))[1]
        print(f"final val loss (step {s}): run {got if got is not None else '-'}, reference {reference[s][1]}")

    if failures:
        verdict = "FAIL"
        detail = failures[0]
    elif identical:
        verdict = "IDENTICAL"
        detail = "every loss of the reference, bit for bit"
    elif envelope:
        verdict = "REPRODUCED"
        detail = f"within the envelope of the {early_runs(early)} early and the seed band late"
    else:
        verdict = "REPRODUCED"
        detail = "within the recipe's fixed tolerances (no envelope)"

    png = args.output or os.path.join(os.path.dirname(os.path.abspath(log)), f"compare_{name}.png")
    fail_step = None
    m = re.search(r"left at step (\d+)|lacks step (\d+)", detail) if failures else None
    if m:
        fail_step = int(m.group(1) or m.group(2))
    try:
        plot(png, f"{name}: {verdict}\n" + "\n".join(textwrap.wrap(detail, 120)[:3]), not failures, run, reference, envelope,
             early, [s for s in steps if s in run], judged, fail_step)
        print(f"curves: {png}")
    except ImportError:
        print("warning: no matplotlib, no PNG (pip install matplotlib)", file=sys.stderr)

    print(f"{verdict}: {detail}")
    for f in failures[1:6]:
        print("      " + f)
    if len(failures) > 6:
        print(f"      ... and {len(failures) - 6} more")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
