"""The machine a job runs on: its CPU, its dense float32 rate, and the memory of a process tree.

A job whose steps are fixed takes longer on a slower machine; what it can say at its start is which CPU it found
and how fast that CPU multiplies matrices, the rate that a BERT step's time follows. Reads no TensorFlow, so a
parent process (``realm-tf demo``) can ask without loading it.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

#: CPU features that decide which kernels TensorFlow's oneDNN runs.
_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_summary(cpuinfo: str = "/proc/cpuinfo") -> str:
    """``"Intel(R) Xeon(R) Processor, 2 cores, avx2 avx512f amx_bf16"``: the model name, the cores this process
    may use and the features of :data:`_FEATURES` it has ("unknown CPU" where ``cpuinfo`` cannot be read)."""
    name, flags = "unknown CPU", set()
    if os.path.exists(cpuinfo):
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    features = " ".join(f for f in _FEATURES if f in flags) or "no AVX2"
    return f"{name}, {cores} cores, {features}"


def sgemm_gflops(size: int = 1024, repeats: int = 3) -> float:
    """GFLOP/s of the fastest of ``repeats`` float32 ``size × size`` matrix products (numpy's BLAS)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b  # warm-up: threads started, pages touched
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best / 1e9


def tree_rss_bytes(pid: int | None = None) -> int:
    """The summed resident memory of process ``pid`` (default: this one) and all its descendants (Linux
    ``/proc``; 0 where it cannot be read)."""
    total, todo = 0, [pid or os.getpid()]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/statm", encoding="ascii") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(child) for child in f.read().split())
        except (OSError, ValueError, IndexError):
            continue  # the process ended while it was read
    return total


class PeakMemory:
    """Samples :func:`tree_rss_bytes` of this process tree every ``interval`` seconds on a daemon thread, between
    :meth:`start` and :meth:`stop`; ``peak`` is the largest sum seen, in bytes."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-memory", daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes())
            self._stop.wait(self.interval)

    def start(self) -> "PeakMemory":
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_bytes())
        return self.peak
