"""Plots drawn from the result records themselves (``benchmarks/records/*.json``), so a picture in ``RESULTS.md``
shows exactly the recorded figures: served memory against corpus size, and RETRO's neighbour dose.

    .venv/bin/python benchmarks/results_plots.py     # writes benchmarks/notebook/results-*.png
"""
from __future__ import annotations

import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _record(name: str) -> dict:
    with open(os.path.join(HERE, "records", f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def memory_points(figure: str, phase: str) -> tuple[list[float], list[float]]:
    """``(millions of blocks, GiB)`` of one phase (``import``, ``export``, ``ask``, ``steady``) of the memory
    model's figure: its ``<phase>: ...; 0.25M 1.0 GiB (...), ...`` segment."""
    segment = next(part for part in figure.split(" | ") if part.startswith(f"{phase}:"))
    found = re.findall(r"(\d+(?:\.\d+)?)M (\d+(?:\.\d+)?) GiB", segment)
    return [float(m) for m, _ in found], [float(g) for _, g in found]


def dose_points(figure: str) -> tuple[list[float], list[float], list[float]]:
    """``(p, bpb with retrieval, bpb without)`` of a dose record's ``p 0.1: 2.090/2.090`` items."""
    found = re.findall(r"p (\d+(?:\.\d+)?): (\d+\.\d+)/(\d+\.\d+)", figure)
    return [float(p) for p, _, _ in found], [float(a) for _, a, _ in found], [float(b) for _, _, b in found]


def plot_memory(path: str) -> None:
    figure = _record("google-release-memory-model-served-int8")["figure"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for phase in ("import", "export", "ask", "steady"):
        blocks, gib = memory_points(figure, phase)
        ax.plot(blocks, gib, marker="o", label=phase)
    ax.set_xlabel("blocks (millions)")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title("Serving Google's release from ScaNN's int8 state")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_dose(path: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, label in (("retro-positive-control-retrofit-dose", "RETRO-fit"),
                        ("retro-positive-control-retro-dose", "RETRO from scratch")):
        p, on, off = dose_points(_record(name)["figure"])
        ax.plot(p, on, marker="o", label=f"{label}, retrieval on")
        ax.plot(p, off, marker="x", linestyle="--", label=f"{label}, retrieval off")
    ax.set_xscale("log")
    ax.set_xlabel("share of chunks whose own continuation is forced in (p)")
    ax.set_ylabel("validation bits per byte")
    ax.set_title("RETRO's neighbour dose (one seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    plot_memory(os.path.join(HERE, "notebook", "results-serving-memory.png"))
    plot_dose(os.path.join(HERE, "notebook", "results-retro-dose.png"))
    print("wrote benchmarks/notebook/results-serving-memory.png, results-retro-dose.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
