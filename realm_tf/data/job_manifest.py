"""``manifest.json``: the last file a data job writes, so that a run can be checked without its shards.

Readers (the trainer, the index builder, ``make demo``) treat an output directory as complete only when
its manifest exists; the manifest is written through a temporary name and a rename, with Beam's
``FileSystems`` so the same code works on local disk and on gs://.
"""
from __future__ import annotations

import json
import time
from typing import Any, Mapping

from apache_beam.io import filesystems

from realm_tf import artifacts
from realm_tf import errors

MANIFEST = artifacts.JOB_MANIFEST


def manifest_path(output_dir: str) -> str:
    return filesystems.FileSystems.join(output_dir, MANIFEST)


def write_manifest(output_dir: str, content: Mapping[str, Any]) -> str:
    """Writes ``content`` (plus ``written_at`` and the size and SHA-256 of each file of ``output_dir``, its
    subdirectories aside) as ``<output_dir>/manifest.json`` atomically; returns the path."""
    path = manifest_path(output_dir)
    tmp = filesystems.FileSystems.join(output_dir, f".{MANIFEST}.tmp-{time.time_ns()}")
    payload = dict(content)
    payload.setdefault("written_at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    payload[artifacts.FILES] = artifacts.file_checksums(output_dir, exclude=(MANIFEST,), recursive=False)
    with filesystems.FileSystems.create(tmp) as f:
        f.write(json.dumps(payload, indent=2, sort_keys=True).encode("utf-8"))
    if filesystems.FileSystems.exists(path):
        filesystems.FileSystems.delete([path])
    filesystems.FileSystems.rename([tmp], [path])
    return path


def read_manifest(output_dir: str) -> dict[str, Any]:
    """Reads a job's manifest; FileNotFoundError (naming the directory) when the job has not finished, UserError
    naming the file when one it lists is missing or of another size."""
    path = manifest_path(output_dir)
    if not filesystems.FileSystems.exists(path):
        raise FileNotFoundError(f"{output_dir}: no {MANIFEST}: the job that writes it has not finished")
    with filesystems.FileSystems.open(path) as f:
        content = json.loads(f.read().decode("utf-8"))
    problems = artifacts.check_files(output_dir, content, full=False)
    if problems:
        raise errors.UserError(f"{problems[0]}: the output of the job that wrote {path} is damaged (its manifest "
                               f"lists every file it wrote). Run that job again")
    return content
