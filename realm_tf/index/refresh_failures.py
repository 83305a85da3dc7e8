"""The index builder's failures, where the trainer reads them (REALM's asynchronous refresh, Guu et al., 2020, §3.4).

The builder of the refresh runs beside the trainer: in a child process, a thread or a job of its own. When it fails
to build the index of an export, it writes ``<export_dir>/refresh-failures/<export step>.json`` (attempts, the
last error, when): a directory the builder owns, beside the exports the trainer owns, so that the trainer learns
of the failure wherever the builder runs. The builder retries the export up to ``refresh.max_failures``
attempts. The trainer counts the failures since the newest published index version and stops with the error
once they reach ``refresh.max_failures``: it never trains on against an index that no longer refreshes without
saying so.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import tensorflow as tf

from realm_tf.index import index_publisher

DIRECTORY = "refresh-failures"


def _path(export_dir: str, step: int) -> str:
    return os.path.join(export_dir, DIRECTORY, f"{step}.json")


def read(export_dir: str, step: int) -> dict[str, Any] | None:
    """The failure record of export ``step``, or None where no build of it failed (or the record is unreadable)."""
    path = _path(export_dir, step)
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            record = json.loads(f.read())
    except (tf.errors.NotFoundError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def record(export_dir: str, step: int, error: str) -> int:
    """Counts one more failed build of export ``step`` (its record replaced atomically); returns the attempts."""
    attempts = int((read(export_dir, step) or {}).get("attempts", 0)) + 1
    content = {"attempts": attempts, "error": error[-4000:], "time": time.time()}
    final = _path(export_dir, step)
    tf.io.gfile.makedirs(os.path.dirname(final))
    staging = f"{final}.{os.getpid()}.tmp"
    with tf.io.gfile.GFile(staging, "w") as f:
        f.write(json.dumps(content, indent=2, sort_keys=True))
    tf.io.gfile.rename(staging, final, overwrite=True)
    return attempts


def since_last_index(export_dir: str, index_dir: str) -> tuple[int, str | None]:
    """``(failed builds, the newest error)`` over the exports newer than the newest published index version's."""
    indexed = index_publisher.newest_export_step(index_dir)
    newest = -1 if indexed is None else indexed
    failures, error, when = 0, None, -1.0
    directory = os.path.join(export_dir, DIRECTORY)
    names = tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []
    for step in sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdecimal()):
        failed = read(export_dir, step) if step > newest else None
        if failed:
            failures += int(failed.get("attempts", 1))
            if failed.get("time", 0.0) > when:
                error, when = str(failed.get("error")), failed.get("time", 0.0)
    return failures, error
