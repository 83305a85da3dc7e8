"""Where a ``realm-tf`` stage's memory goes over time (issue #20: the demo's peak RSS).

Runs one ``realm-tf`` command in a child process, samples its resident set (``VmRSS`` of the child and of every
process it started, summed: ``realm-tf demo`` runs each stage in a process of its own) every ``--interval``
seconds, and stamps each line it logs. Prints the log lines that match ``--marks`` with the RSS at that moment, the RSS
timeline, the peak and when it came, and the child's CPU and page-fault totals (``getrusage``), so that a peak can be
put on a phase of the stage (start-up, tracing, the first step).

    .venv/bin/python benchmarks/stage_memory.py --cwd /tmp/ws19 -- pretrain --config runs/demo/params.yaml \\
        --set pretrain.model_dir=/tmp/memtest/s

Linux only (``/proc``).
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import threading
import time

import result_records  # (benchmarks/)

#: ``realm-tf demo``'s stage headers (realm_tf/demo.py), read to name the stage of the peak.
DEMO_STAGE = re.compile(r"^=== \[\d+/\d+\] ([\w-]+):")


def rss_gb(pid: int) -> float | None:
    """The process's resident set in GB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        return None
    return None


def tree_rss_gb(pid: int) -> float | None:
    """The summed resident set of ``pid`` and all its descendants in GB, or None once ``pid`` is gone."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the state
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    own = rss_gb(pid)
    if own is None:
        return None
    total, stack = own, list(children.get(pid, []))
    while stack:
        child = stack.pop()
        total += rss_gb(child) or 0.0
        stack.extend(children.get(child, []))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cwd", default=".", help="the directory the command runs in (its relative paths)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between timeline points printed")
    parser.add_argument("--marks", default=r"warm-up|serving index|phase|step \d+:|held-out|Compiled cluster",
                        help="regex of the log lines to print with the RSS at their time")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the realm-tf subcommand and its flags")
    args = parser.parse_args()
    command = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not command:
        parser.error("give the realm-tf command after --")

    start = time.time()
    child = subprocess.Popen([sys.executable, "-u", "-m", "realm_tf.cli", *command], cwd=args.cwd,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                 [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  os.environ.get("PYTHONPATH", "")])})
    samples: list[tuple[float, float]] = []  # (seconds since start, GB)
    marks: list[tuple[float, str]] = []
    pattern = re.compile(args.marks)
    demo_stages: list[tuple[float, str]] = []  # (seconds since start, stage name)

    def read_log() -> None:
        for line in child.stdout:
            for part in line.rstrip("\n").split("\r"):
                if pattern.search(part) and "%|" not in part:  # not a progress bar's redraw
                    marks.append((time.time() - start, part.strip()[:150]))
                part = part.strip()
                if found := DEMO_STAGE.match(part):
                    demo_stages.append((time.time() - start, found.group(1)))

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    while child.poll() is None:
        gb = tree_rss_gb(child.pid)
        if gb is not None:
            samples.append((time.time() - start, gb))
        time.sleep(args.interval)
    reader.join(timeout=10)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)

    def rss_at(t: float) -> float:
        before = [gb for s, gb in samples if s <= t]
        return before[-1] if before else 0.0

    print(f"realm-tf {' '.join(command)}  (cwd {args.cwd}; exit {child.returncode}; {time.time() - start:.0f} s)")
    print("log lines, with the RSS (the command and its child processes) at their time:")
    seen = set()
    for t, line in marks:
        key = line[:40]
        if key not in seen:
            seen.add(key)
            print(f"  {t:6.0f} s  {rss_at(t):5.2f} GB  {line}")
    points, next_t = [], 0.0
    for t, gb in samples:
        if t >= next_t:
            points.append(f"{t:.0f}s {gb:.2f}")
            next_t = t + args.every
    print("RSS timeline (GB): " + ", ".join(points))
    if samples:
        peak_t, peak = max(samples, key=lambda s: s[1])
        print(f"peak RSS {peak:.2f} GB at {peak_t:.0f} s; getrusage: max RSS {usage.ru_maxrss / 1e6:.2f} GB, "
              f"user {usage.ru_utime:.1f} s, system {usage.ru_stime:.1f} s "
              f"({usage.ru_stime / max(usage.ru_utime + usage.ru_stime, 1e-9):.1%}), minor faults {usage.ru_minflt:,}")
    if command[0] == "demo" and child.returncode == 0 and samples:
        kernel = usage.ru_stime / max(usage.ru_utime + usage.ru_stime, 1e-9)
        at_peak = [name for t, name in demo_stages if t <= peak_t]
        result_records.write(
            "speed-demo-peak-memory", area="Speed and memory", order=20,
            verdict="holds" if peak < 4 and kernel < 0.05 else "negative",
            claim="The demo runs within 4 GB and spends under 5% of its CPU time in the kernel.",
            figure=f"peak RSS {peak:.2f} GB" + (f" ({at_peak[-1]} stage)" if at_peak else "")
                   + f"; kernel {kernel:.1%} of CPU time")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
