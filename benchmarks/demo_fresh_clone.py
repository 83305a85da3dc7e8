"""``make demo`` as a new user meets it: a fresh clone, the set-up included, timed and its memory measured.

Clones this checkout's HEAD into ``--clone`` (a new directory), runs ``/usr/bin/time -v make demo`` there, keeps
its whole output in ``<clone>/demo.log``, and writes the record ``demo-make-demo-fresh-clone`` from what the demo
printed (its closing table: EM, F1, steps, minutes, the peak of the demo's process tree, sampled) and from
``time -v`` (wall with the set-up, the largest single process's RSS). The goal: EM ≥ 0.33 and F1 ≥ 0.45 on the
held-out questions, at most 4.0 GB, at most 15 minutes with the set-up on an AVX-512 machine (20 on an AVX2 one).

    .venv/bin/python benchmarks/demo_fresh_clone.py --clone /tmp/fresh-demo
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import result_records  # (benchmarks/)

#: Rows of the demo's closing table (``realm_tf/demo.summary``) read for the record.
TABLE_ROWS = {"questions": r"held-out questions\s+(\d+)", "em": r"exact match\s+([\d.]+)", "f1": r"F1\s+([\d.]+)",
              "accuracy@5": r"retrieval accuracy@5\s+([\d.]+)", "steps": r"steps\s+(.+)",
              "minutes": r"minutes\s+([\d.]+)", "peak_gib": r"peak memory\s+([\d.]+) GiB"}
#: ``realm-tf demo``'s stage lines: ``=== <stage> done in <seconds>s``.
STAGE_DONE = re.compile(r"^=== ([\w-]+) done in (\d+)s(?: \(peak memory ([\d.]+) GiB\))?")


def demo_table(lines: list[str]) -> dict[str, str]:
    """The values of :data:`TABLE_ROWS` found in the demo's output ``lines`` (each row's first match after the
    line ``realm-tf demo finished``)."""
    found: dict[str, str] = {}
    after = lines[lines.index("realm-tf demo finished") + 1:] if "realm-tf demo finished" in lines else []
    for line in after:
        for key, pattern in TABLE_ROWS.items():
            if key not in found and (match := re.match(r"\s*" + pattern, line)):
                found[key] = match.group(1).strip()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--clone", required=True, help="a new directory for the fresh clone")
    parser.add_argument("--notebook", default="", help="the notebook entry the record points to")
    args = parser.parse_args()
    if os.path.exists(args.clone):
        raise SystemExit(f"demo_fresh_clone: {args.clone} exists: a fresh clone needs a new directory")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["git", "clone", "-q", repo, args.clone], check=True)
    log_path = os.path.join(args.clone, "demo.log")
    start = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(["/usr/bin/time", "-v", "make", "demo"], cwd=args.clone, stdout=log,
                              stderr=subprocess.STDOUT, check=False)
    wall = time.time() - start
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [part.rstrip() for line in f for part in line.split("\r")]
    if done.returncode != 0:
        print("\n".join(lines[-40:]))
        raise SystemExit(f"demo_fresh_clone: make demo exited {done.returncode}; its output: {log_path}")
    table = demo_table(lines)
    max_rss = next((int(m.group(1)) for line in lines if (m := re.search(r"Maximum resident set size \(kbytes\): "
                                                                          r"(\d+)", line))), 0)
    stages = ", ".join(f"{m.group(1)} {m.group(2)} s" + (f" ({float(m.group(3)) * 2 ** 30 / 1e9:.2f} GB)" if m.group(3)
                                                          else "") for line in lines if (m := STAGE_DONE.match(line)))
    first = next((line for line in lines if line.startswith("realm-tf demo: ")), "")
    gflops = re.search(r"at (\d+) GFLOP/s", first)
    avx512 = "avx512f" in first
    goal_minutes = 15 if avx512 else 20
    em, f1, peak = float(table["em"]), float(table["f1"]), float(table["peak_gib"]) * 2 ** 30 / 1e9
    holds = em >= 0.33 and f1 >= 0.45 and peak <= 4.0 and wall <= goal_minutes * 60
    print("\n".join(lines[lines.index("realm-tf demo finished"):]))
    result_records.write(
        "demo-make-demo-fresh-clone", area="Tests and the demo", order=20, verdict="holds" if holds else "negative",
        claim=f"make demo on a fresh clone trains the same steps on every machine and answers held-out questions at "
              f"EM >= 0.33 and F1 >= 0.45, within 4.0 GB and {goal_minutes} minutes with the set-up on this "
              f"machine type ({'AVX-512' if avx512 else 'AVX2'}).",
        figure=f"{int(wall) // 60}:{int(wall) % 60:02d} wall with the set-up; EM {table['em']}, F1 {table['f1']}, "
               f"accuracy@5 {table['accuracy@5']} on {table['questions']} held-out questions; steps: "
               f"{table['steps']}; peak memory {peak:.2f} GB (the demo's process tree, sampled), largest process "
               f"{max_rss / 1e6:.2f} GB (time -v); numpy sgemm {gflops.group(1) if gflops else '?'} GFLOP/s. "
               f"Stages: {stages}",
        interval="EM on 83 questions is about ±0.05 (1 s.e.): one fresh-clone run, not a comparison",
        notebook=args.notebook, at_commit=result_records.commit(args.clone))
    return 0


if __name__ == "__main__":
    sys.exit(main())
