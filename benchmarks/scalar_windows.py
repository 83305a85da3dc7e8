"""Prints a training run's TensorBoard scalars as window means over step ranges (the curves in RESULTS.md).

    .venv/bin/python benchmarks/scalar_windows.py runs/bench/qa2/finetune/train --tags loss span_accuracy \
        --window 250
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def read_scalars(logdir: str) -> dict[str, dict[int, float]]:
    """``tag -> {step: value}`` from every event file in ``logdir`` (a resumed run's later value wins)."""
    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")), key=os.path.getmtime):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                scalars.setdefault(value.tag, {})[event.step] = number
    return scalars


def window_means(values: dict[int, float], window: int) -> list[tuple[int, int, float, int]]:
    """(first step, last step, mean, points) of ``values`` ({step: value}) over windows of ``window`` steps."""
    points = sorted(values.items())
    if not points:
        return []
    last = points[-1][0]
    rows = []
    for start in range(0, last, window):
        inside = [v for s, v in points if start < s <= start + window]
        if inside:
            rows.append((start + 1, min(start + window, last), float(np.mean(inside)), len(inside)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", help="a run's train/ (or eval/) directory")
    parser.add_argument("--tags", nargs="+", default=["loss"], help="scalars to print")
    parser.add_argument("--window", type=int, default=100, help="steps per window")
    args = parser.parse_args()
    scalars = read_scalars(args.logdir)
    if not scalars:
        print(f"{args.logdir}: no event files", file=sys.stderr)
        return 1
    for tag in args.tags:
        rows = window_means(scalars.get(tag, {}), args.window)
        if not rows:
            print(f"{tag}: not logged (tags: {', '.join(sorted(scalars))})")
            continue
        for first, last, mean, count in rows:
            print(f"{tag:<20} steps {first:>5}-{last:<5} mean {mean:.3f} ({count} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
