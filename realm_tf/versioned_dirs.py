"""Versioned directories published atomically: retriever exports and MIPS index versions.

REALM's asynchronous refresh (Guu et al., 2020, §3.4) hands artefacts from one job to another through
directories ``<root>/<number>/``. A version is complete only when its marker file (``export.json``,
``index.json``), written last, exists; staging directories and half-written versions are never listed.
Works on any TensorFlow filesystem (local, gs://).
"""
from __future__ import annotations

import logging
import os
from typing import Collection

import tensorflow as tf


def is_local(path: str) -> bool:
    """True for a path on the local filesystem (no ``scheme://``), which native libraries can open."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def commit(staging: str, final: str, marker: str) -> None:
    """Makes a fully written staging directory visible as ``final``, its ``marker`` file last.

    Locally: every file is fsynced, then one atomic ``rename``. Object stores (gs://) have no directory
    rename: every object is moved, the marker last, so the version is complete exactly when it appears.

    Raises:
      FileExistsError: ``final`` became a complete version meanwhile (a concurrent publisher won).
    """
    if is_local(staging):
        src, dst = local_path(staging), local_path(final)
        _fsync_tree(src)
        try:
            os.rename(src, dst)  # atomic
        except OSError as e:
            if tf.io.gfile.exists(os.path.join(final, marker)):
                raise FileExistsError(f"{final}: already published concurrently") from e
            raise
        _fsync_dir(os.path.dirname(dst))
        return
    for parent, _, files in tf.io.gfile.walk(staging):
        rel = os.path.relpath(parent, staging)
        target = final if rel == "." else os.path.join(final, rel)
        tf.io.gfile.makedirs(target)
        for name in files:
            if rel == "." and name == marker:
                continue
            tf.io.gfile.rename(os.path.join(parent, name), os.path.join(target, name), overwrite=True)
    tf.io.gfile.rename(os.path.join(staging, marker), os.path.join(final, marker), overwrite=False)
    remove_quietly(staging)


def remove_quietly(path: str) -> None:
    """Deletes a directory tree, logging (not raising) a failure: for clean-up paths."""
    try:
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)
    except Exception:  # pylint: disable=broad-except
        logging.exception("could not remove %s", path)


def complete_versions(root: str, marker: str) -> dict[int, str]:
    """``{version: directory}`` of the complete versions under ``root``, in ascending version order.

    A version is a subdirectory whose name is all digits (any zero padding) and which holds ``marker``.
    """
    if not tf.io.gfile.isdir(root):
        return {}
    found: dict[int, str] = {}
    for name in tf.io.gfile.listdir(root):
        name = name.rstrip("/")
        path = os.path.join(root, name)
        if name.isdecimal() and tf.io.gfile.exists(os.path.join(path, marker)):
            found[int(name)] = path
    return dict(sorted(found.items()))


def delete_old_versions(root: str, marker: str, keep: int, protect: int | Collection[int] | None = None) -> list[int]:
    """Deletes all but the newest ``keep`` complete versions (never those in ``protect``); returns the deleted ones.

    The marker goes first, so a reader listing concurrently sees the version as incomplete, not torn.
    Staging directories and incomplete versions may belong to a publish in progress and are left alone.
    """
    versions = complete_versions(root, marker)
    protected = {protect} if isinstance(protect, int) else set(protect or ())
    doomed = [v for v in list(versions)[:-keep] if v not in protected] if keep > 0 else []
    for version in doomed:
        try:
            tf.io.gfile.remove(os.path.join(versions[version], marker))
            tf.io.gfile.rmtree(versions[version])
        except tf.errors.NotFoundError:
            pass  # deleted concurrently by another publisher
    return doomed


def _fsync_tree(root: str) -> None:
    """Flushes every file and directory under ``root`` so the rename never exposes unwritten data."""
    for parent, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(parent, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(parent)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
