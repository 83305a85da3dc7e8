"""Resumable benchmark stages: each stage's result is kept in ``<out>/stages.json`` when it completes and a rerun
skips it, so a long benchmark continues where it stopped (a stage killed midway resumes from its own
checkpoints, if it has any). Also ``cli``: one ``realm-tf`` command in a child process, as a user runs it.

A run directory lives on one machine. A benchmark longer than a machine's life keeps the results it cannot afford
to lose in the repository: a stage called with ``kept=True`` also writes ``<kept_dir>/<name>.json.gz`` (its result
with the minutes, commit, machine and date that produced it), and a later run on any machine reads it from there
instead of running the stage again. Kept results are evidence: commit them with the records they feed.
"""
from __future__ import annotations

import datetime
import gzip
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

from realm_tf import config as config_lib


def cli(args: list[str], capture: bool = False) -> str:
    """Runs ``realm-tf ARGS`` in a child process (its own TensorFlow runtime); its stdout if ``capture``."""
    print("$ realm-tf " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "realm_tf.cli", *args], check=True, text=True,
                          stdout=subprocess.PIPE if capture else None)
    return done.stdout if capture else ""


class Stages:
    """The stages of one benchmark run directory ``out``; ``kept_dir``: where kept stages' results live in the
    repository (see the module's docstring)."""

    def __init__(self, out: str, kept_dir: str | None = None) -> None:
        os.makedirs(out, exist_ok=True)
        self.path = os.path.join(out, "stages.json")
        self.kept_dir = kept_dir
        self.state: dict[str, Any] = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                self.state = json.load(f)

    def __call__(self, name: str, fn: Callable[[], Any], kept: bool = False) -> Any:
        """``fn()``'s result, run now or read from an earlier run (JSON-serialisable); with ``kept``, also read
        from and written to the repository's ``kept_dir``."""
        if kept and name not in self.state and self.is_kept(name):
            entry = read_kept(self._kept_path(name))
            print(f"== {name}: kept in the repository ({entry['minutes']:.1f} min at {entry['commit']} on "
                  f"{entry['machine']}, {entry['date']}), skipped", flush=True)
            self.state[name] = {"minutes": entry["minutes"], "result": entry["result"], "kept": True}
            return entry["result"]
        if name in self.state:
            print(f"== {name}: done before ({self.state[name]['minutes']:.1f} min), skipped", flush=True)
            return self.state[name].get("result")
        print(f"== {name}", flush=True)
        start = time.time()
        result = fn()
        self.state[name] = {"minutes": (time.time() - start) / 60, "result": result}
        if kept:
            write_kept(self._kept_path(name), name, self.state[name]["minutes"], result)
        config_lib.atomic_write_text(self.path, json.dumps(self.state, indent=2) + "\n")
        return result

    def is_kept(self, name: str) -> bool:
        """Whether the repository keeps ``name``'s result."""
        return self.kept_dir is not None and os.path.exists(self._kept_path(name))

    def _kept_path(self, name: str) -> str:
        if self.kept_dir is None:
            raise ValueError(f"stage {name!r} is kept, but Stages was given no kept_dir")
        return os.path.join(self.kept_dir, name + ".json.gz")

    def result(self, name: str) -> Any:
        return self.state[name].get("result")

    def minutes(self) -> str:
        return ", ".join(f"{k} {v['minutes']:.1f}" for k, v in self.state.items())


def write_kept(path: str, name: str, minutes: float, result: Any) -> None:
    """``path`` (gzipped JSON, atomically): ``result`` with what produced it (the gzip header without a time)."""
    import result_records  # pylint: disable=import-outside-toplevel  (benchmarks/)

    entry = {"stage": name, "minutes": round(minutes, 2), "commit": result_records.commit(),
             "machine": result_records.machine(), "date": datetime.date.today().isoformat(), "result": result}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    config_lib.atomic_write_bytes(path, gzip.compress((json.dumps(entry, sort_keys=True) + "\n").encode("utf-8"),
                                                      mtime=0))


def read_kept(path: str) -> dict[str, Any]:
    """The entry :func:`write_kept` wrote; a clear error naming ``path`` when it is not one."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: not a kept stage result ({e})") from e
    missing = {"stage", "minutes", "commit", "machine", "date", "result"} - set(entry)
    if missing:
        raise ValueError(f"{path}: kept stage result lacks {sorted(missing)}")
    return entry


class OutOfTime(Exception):
    """``--max-hours`` reached between two stages or chunks: the same command continues the run."""


def read_curve(path: str) -> list[dict[str, Any]]:
    """A training curve written so far (one point per chunk; empty before the first)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def add_plateau_args(parser: Any, chunk: int, chunk_help: str, min_delta: float, min_delta_help: str,
                     max_chunks: int) -> None:
    """The flags of a run that trains in chunks until its held-out scores plateau
    (``realm_tf.tasks.held_out_progress.plateaued``), resumable across sessions of limited length."""
    parser.add_argument("--chunk", type=int, default=chunk, help=chunk_help)
    parser.add_argument("--patience", type=int, default=3, help="evaluations without improvement before stopping")
    parser.add_argument("--min-delta", dest="min_delta", type=float, default=min_delta, help=min_delta_help)
    parser.add_argument("--max-chunks", dest="max_chunks", type=int, default=max_chunks)
    parser.add_argument("--max-hours", dest="max_hours", type=float, default=0.0,
                        help="stop between stages after this long (0: never); the same command resumes")
