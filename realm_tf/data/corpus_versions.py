"""The knowledge corpus of record, in versions: what ``preprocess`` wrote, then each update on top of it.

REALM's knowledge lives in its corpus Z, not in its weights (Guu et al., 2020, §1, §4: the index can be
refreshed and the corpus swapped without re-training). Here Z is a directory of blocks (``data.blocks_dir``),
and a change to it is a new **version**, the previous one plus or minus some documents, published next to
the others like an index version::

    <blocks_dir>/
      blocks-*.tfrecord, manifest.json    version 0: what ``realm-tf preprocess`` wrote (unchanged layout)
      versions/
        0000000001/                       version 1 = version 0 ± a change (``realm-tf update-corpus``):
          blocks-*.tfrecord               every block of the new version, ids dense 0..N-1
          dead_letter-*.jsonl             the update's rejected lines (and deletes of unknown ids)
          changes-*.jsonl                 per document id: added, replaced, unchanged or deleted
          manifest.json                   written LAST: counts, the parent version, the index version built
        .staging-0000000002-.../          an update in progress (or killed): never read

The **current** version is the newest complete one (``manifest.json`` present); without any update it is
the directory itself, so a ``blocks_dir`` written before versions existed reads exactly as before. Block uids
are content hashes (``example_schemas.block_uid``), so a block that an update leaves in place keeps its uid,
and its embedding can be carried over instead of recomputed. Every index version records the corpus version
it was built over (``index.json``: ``corpus_version``), which is how the trainer and serving load the blocks
that its rows point into.
"""
from __future__ import annotations

import logging
import os
from typing import Collection

import tensorflow as tf

from realm_tf import artifacts

logger = logging.getLogger(__name__)

VERSIONS_DIR = "versions"
ROOT_VERSION = 0  # the blocks_dir itself (``realm-tf preprocess``)
BLOCKS_GLOB = "blocks-*.tfrecord*"


def version_name(version: int) -> str:
    """Directory name of an update version: 10-digit zero-padded, so names sort like numbers."""
    return f"{version:010d}"


def version_dir(blocks_dir: str, version: int) -> str:
    """The directory of ``version``: ``blocks_dir`` itself for version 0, else ``<blocks_dir>/versions/<v>``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"corpus version must be a non-negative int, got {version!r}")
    blocks_dir = blocks_dir.rstrip("/")
    return blocks_dir if version == ROOT_VERSION else os.path.join(blocks_dir, VERSIONS_DIR, version_name(version))


def blocks_pattern(blocks_dir: str, version: int, glob: str = BLOCKS_GLOB) -> str:
    """The block TFRecords of ``version`` (``glob`` inside its directory)."""
    return os.path.join(version_dir(blocks_dir, version), glob)


def update_versions(blocks_dir: str) -> list[int]:
    """The complete update versions (>= 1) of ``blocks_dir``, ascending."""
    return list(artifacts.complete_versions(os.path.join(blocks_dir, VERSIONS_DIR), artifacts.JOB_MANIFEST))


def current_version(blocks_dir: str) -> int:
    """The newest complete version: the newest update, else 0 (the directory ``preprocess`` wrote)."""
    versions = update_versions(blocks_dir)
    return versions[-1] if versions else ROOT_VERSION


def current_dir(blocks_dir: str) -> str:
    """The directory of the current version (``blocks_dir`` itself when nothing was ever updated)."""
    return version_dir(blocks_dir, current_version(blocks_dir))


def current_pattern(blocks_dir: str, glob: str = BLOCKS_GLOB) -> str:
    """The block TFRecords of the current version."""
    return os.path.join(current_dir(blocks_dir), glob)


def next_version(blocks_dir: str) -> int:
    """The number an update publishes next: one past every version directory (complete or left by a crash)."""
    root = os.path.join(blocks_dir, VERSIONS_DIR)
    taken = [int(name.rstrip("/")) for name in (tf.io.gfile.listdir(root) if tf.io.gfile.isdir(root) else [])
             if name.rstrip("/").isdecimal()]
    return max(taken, default=ROOT_VERSION) + 1


def version_of(blocks_dir: str, pattern: str) -> int | None:
    """The version whose directory holds the files of ``pattern``, or None when it is not one of ``blocks_dir``."""
    directory = _normalized(os.path.dirname(pattern))
    if directory == _normalized(blocks_dir):
        return ROOT_VERSION
    parent, name = os.path.split(directory)
    if name.isdecimal() and parent == _normalized(os.path.join(blocks_dir, VERSIONS_DIR)):
        return int(name)
    return None


def prune(blocks_dir: str, keep: Collection[int]) -> list[int]:
    """Deletes the complete update versions that are neither in ``keep`` nor the newest; returns them.

    ``keep`` holds the versions some index version was built over (their rows point into those blocks).
    Version 0 and directories without a manifest (an update in progress) are never touched.
    """
    versions = update_versions(blocks_dir)
    doomed = [v for v in versions[:-1] if v not in set(keep)]
    for version in doomed:
        path = version_dir(blocks_dir, version)
        try:
            tf.io.gfile.remove(os.path.join(path, artifacts.JOB_MANIFEST))  # incomplete first, then gone
            tf.io.gfile.rmtree(path)
        except tf.errors.NotFoundError:
            pass  # pruned concurrently
    return doomed


def discard_updates(blocks_dir: str) -> bool:
    """Removes every update version: ``preprocess`` rewrote version 0, and updates made on another version 0
    would shadow it. Returns whether there was anything to remove."""
    root = os.path.join(blocks_dir, VERSIONS_DIR)
    if not tf.io.gfile.isdir(root):
        return False
    logger.warning("%s: a new corpus replaces version 0; removing the updates made on the previous one", root)
    tf.io.gfile.rmtree(root)
    return True


def _normalized(path: str) -> str:
    return os.path.normpath(path if not artifacts.is_local(path) else os.path.abspath(artifacts.local_path(path)))
