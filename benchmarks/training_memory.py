"""Whose memory a training process holds, step by step (issue #20, part 9).

Runs one ``realm-tf`` training command (``train-reader``, ``finetune``, ``pretrain`` …) in this process and,
after each step of ``--at`` and at the end, prints:

- the process's resident set (``VmRSS``), anonymous and file-backed (``/proc/self/status``);
- TensorFlow's CPU allocator: bytes in use now and at the peak (``tf.config.experimental.get_memory_info``; with
  ``TF_CPU_ALLOCATOR_USE_BFC=true``, which ``realm-tf`` sets, its regions are ``malloc``'s large mapped blocks);
- glibc ``malloc``: bytes in use in its heaps (``mallinfo2().uordblks``, summed over the arenas: what C++
  libraries keep outside TensorFlow's allocator, such as the oneDNN kernels TensorFlow caches per shape and per
  thread) and in mapped blocks (``hblkhd``).

A training step does not change ``malloc``'s bytes in use unless something keeps what it allocated; a column
that grows with the steps while TensorFlow's peak stays flat is a cache. The hook wraps
``TrainingLoop.run`` (the command itself is unchanged).

    cd <a demo workdir's parent> && /path/to/.venv/bin/python /path/to/benchmarks/training_memory.py \\
        --at 5,20,60,100,200,400 -- train-reader --config runs/demo/params.yaml --set reader.steps=400 ...

Linux with glibc only (``/proc``, ``mallinfo2``).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tensorflow as tf  # noqa: E402
import tqdm  # noqa: E402

from realm_tf import cli  # noqa: E402  (after TF_USE_LEGACY_KERAS)
from realm_tf import process_settings  # noqa: E402
from realm_tf.core import training_loop  # noqa: E402


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> _Mallinfo2:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    return libc.mallinfo2()


def snapshot(tensorflow_started: bool = True) -> dict[str, float]:
    """The process's memory now, in MB (TensorFlow's columns NaN before ``tensorflow_started``: asking its
    allocator would start TensorFlow, after which ``intra_op_threads`` can no longer be set)."""
    status = {}
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            name = line.split(":")[0]
            if name in ("VmRSS", "RssAnon", "RssFile"):
                status[name] = int(line.split()[1]) / 1024
    tf_memory = {"current": float("nan"), "peak": float("nan")}
    if tensorflow_started:
        try:
            tf_memory = tf.config.experimental.get_memory_info("CPU:0")
        except ValueError:  # an allocator without statistics (TF_CPU_ALLOCATOR_USE_BFC=false)
            pass
    info = _mallinfo2()
    return {"rss": status["VmRSS"], "anon": status["RssAnon"], "file": status["RssFile"],
            "tf_now": tf_memory["current"] / 2**20, "tf_peak": tf_memory["peak"] / 2**20,
            "malloc_heaps": info.uordblks / 2**20, "malloc_mapped": info.hblkhd / 2**20}


def _line(label: str, values: dict[str, float]) -> str:
    return f"{label:>8} " + " ".join(f"{values[k]:>10.0f}" for k in COLUMNS)


COLUMNS = ("rss", "anon", "file", "tf_now", "tf_peak", "malloc_heaps", "malloc_mapped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--at", default="1,5,20,60,100,200,400",
                        help="comma-separated steps after which to print (default: %(default)s)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the realm-tf training command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the realm-tf training command after --")
    at = {int(step) for step in args.at.split(",") if step}
    process_settings.apply()  # before the first snapshot creates TensorFlow's CPU allocator
    print(f"realm_tf from {os.path.dirname(cli.__file__)}; memory in MB; malloc_heaps: glibc malloc's bytes in "
          "use outside mapped blocks", flush=True)
    print(f"{'step':>8} " + " ".join(f"{k:>10}" for k in COLUMNS), flush=True)
    tqdm.tqdm.write(_line("start", snapshot(tensorflow_started=False)), file=sys.stdout)
    run = training_loop.TrainingLoop.run

    def run_with_hook(self, dataset, step_fn, hooks=(), **kwargs):
        def hook(step: int, logs: dict) -> None:
            del logs
            if step in at:  # above the training loop's progress bar
                tqdm.tqdm.write(_line(str(step), snapshot()), file=sys.stdout)
        return run(self, dataset, step_fn, (*hooks, hook), **kwargs)

    training_loop.TrainingLoop.run = run_with_hook
    code = cli.main(command)
    tqdm.tqdm.write(_line("end", snapshot()), file=sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
