"""Atomic, versioned publication of a MIPS index: the producer half of REALM's asynchronous refresh.

REALM (Guu et al., 2020, §3.4) re-embeds the corpus with a recent Embed_doc snapshot and rebuilds the MIPS
index "asynchronously": the trainer keeps searching the old index while the new one is built, then
switches. For the switch to be safe a reader must never see half an index. Layout::

    <index_dir>/
      0000000042/                   a complete version (10-digit zero-padded, so names sort like numbers)
        embeddings.npy              float32 [num_blocks, dim], row i = block i (no pickles)
        searcher/                   MipsIndex.save() output (ScaNN assets, relative paths)
        index.json                  written LAST: version, kind, counts, dim, vocab_hash, export_step, timings
      .staging-0000000043-1f2e.../  a version being written (or left by a crash): never read

:func:`publish` writes everything into a fresh staging directory, ``index.json`` last, then renames the
staging directory to its version name. On a local (POSIX) filesystem the rename is atomic, so the version
appears complete or not at all. Object stores (gs://) have no atomic directory rename; there the files are
moved one by one, ``index.json`` again last, and **a version is complete iff its ``index.json`` exists**,
which is the rule :func:`complete_versions` (and so the loader) applies everywhere.

A version built by ``embed_blocks`` is numbered by the step of its retriever export. A corpus update
(``beam_jobs/update_corpus``) publishes the version after the newest one, with the same export (same
embedding space) over a newer corpus version; ``index.json`` names both (``export_step``, ``corpus_version``).
A later export then gets the next number when its step is already taken or behind an update
(:func:`version_for_export`), so the newest version is always the one to serve.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import errors
from realm_tf.index import mips_index

logger = logging.getLogger(__name__)

EMBEDDINGS_NPY = "embeddings.npy"
SEARCHER_DIR = "searcher"
FORMAT_VERSION = 1
EXPORT_STEP = "export_step"  # index.json: the trainer step of the retriever export that embedded the blocks
CORPUS_VERSION = "corpus_version"  # index.json: the corpus version (data.corpus_versions) of its rows

_RESERVED = ("format", "version", "kind", "num_blocks", "dim", "embeddings", "searcher", "index",
             "published_at", "write_seconds")


class IndexVersionExistsError(errors.UserError, FileExistsError):
    """A complete index version with this number is already published; versions are immutable."""


def version_name(version: int) -> str:
    """Directory name of ``version``: 10-digit zero-padded, so lexicographic order is numeric order."""
    return f"{version:010d}"


def version_dir(index_dir: str, version: int) -> str:
    return os.path.join(index_dir, version_name(version))


def is_complete(path: str) -> bool:
    """True when the version directory ``path`` holds its ``index.json`` (written last)."""
    return artifacts.is_complete(path, artifacts.INDEX)


def complete_versions(index_dir: str) -> list[int]:
    """Version numbers in ``index_dir`` that are complete (``index.json`` written), ascending.

    Staging directories (``.staging-*``) and versions whose ``index.json`` was never written are ignored.
    """
    return list(artifacts.complete_versions(index_dir, artifacts.INDEX))


def read_index_json(path: str) -> dict[str, Any]:
    """The ``index.json`` of the version directory ``path``."""
    return artifacts.read_marker(path, artifacts.INDEX, "index version")


def map_embeddings(path: str) -> np.ndarray:
    """:func:`read_embeddings`, memory-mapped read-only when the version is on local disk (rows are paged in as
    they are read: REALM's 13M x 128 need not be resident)."""
    file = os.path.join(path, read_index_json(path).get("embeddings", EMBEDDINGS_NPY))
    if not artifacts.is_local(file):
        return read_embeddings(path)
    try:
        return np.load(artifacts.local_path(file), mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise errors.UserError(f"{file}: cannot be read ({e}): this index version is damaged. Rebuild it (realm-tf "
                               f"embed-blocks), or delete {path} so that the previous complete version is used") from e


def read_embeddings(path: str) -> np.ndarray:
    """float32 ``[num_blocks, dim]``: the embeddings a published version (its directory ``path``) was built on."""
    meta = read_index_json(path)
    file = os.path.join(path, meta.get("embeddings", EMBEDDINGS_NPY))
    try:
        with tf.io.gfile.GFile(file, "rb") as f:
            embeddings = np.load(f, allow_pickle=False)
    except (ValueError, EOFError, OSError, tf.errors.NotFoundError) as e:
        raise errors.UserError(f"{file}: cannot be read ({e}): this index version is damaged. Rebuild it (realm-tf "
                               f"embed-blocks), or delete {path} so that the previous complete version is used") from e
    if embeddings.ndim != 2 or "num_blocks" in meta and embeddings.shape[0] != meta["num_blocks"]:
        raise errors.UserError(f"{file}: shape {embeddings.shape}, but {path}/index.json records "
                               f"{meta.get('num_blocks')} blocks: this index version is damaged. Rebuild it, or "
                               f"delete {path} so that the previous complete version is used")
    return embeddings


def export_step(metadata: Mapping[str, Any]) -> int:
    """The step of the export that embedded a version's blocks (its ``index.json`` ``metadata``)."""
    return int(metadata.get(EXPORT_STEP, metadata.get("version", 0)))


def corpus_version(metadata: Mapping[str, Any]) -> int:
    """The corpus version a version's rows point into (0, the directory ``preprocess`` wrote, when not
    recorded: versions published before corpus versions existed, or from blocks outside ``data.blocks_dir``)."""
    value = metadata.get(CORPUS_VERSION)
    return int(value) if value is not None else 0


def newest_version(index_dir: str, vocab_hash: str) -> tuple[str, dict[str, Any]]:
    """``(directory, index.json)`` of the newest complete version, checked against the tokenizer vocabulary.

    Raises:
      UserError: there is none, or it was embedded with another vocabulary than ``vocab_hash``.
    """
    artifacts.warn_incomplete_versions(index_dir, artifacts.INDEX, "index version")
    versions = complete_versions(index_dir)
    if not versions:
        raise errors.UserError(f"{index_dir}: no index (run `realm-tf embed-blocks` with a retriever export)")
    path = version_dir(index_dir, versions[-1])
    meta = read_index_json(path)
    if meta.get("vocab_hash") != vocab_hash:
        raise errors.UserError(f"{path}: index built with another vocabulary ({meta.get('vocab_hash')}) than "
                               f"model.vocab_file ({vocab_hash})")
    return path, meta


def newest_export_step(index_dir: str) -> int | None:
    """The newest export any complete version embedded its blocks with (None: no version). Versions are numbered
    by export step, except corpus updates, which keep their export."""
    published = published_metadata(index_dir)
    return max(map(export_step, published)) if published else None


def published_metadata(index_dir: str) -> list[dict[str, Any]]:
    """The ``index.json`` of every complete version, oldest first (versions deleted meanwhile are skipped)."""
    found = []
    for version in complete_versions(index_dir):
        try:
            found.append(read_index_json(version_dir(index_dir, version)))
        except FileNotFoundError:
            continue
    return found


def version_for_export(index_dir: str, step: int) -> int:
    """The version number for an index built from the export of ``step``.

    ``step`` itself, as always, unless a corpus update (an index version whose ``export_step`` is older)
    already took that number or one after it: then the version after the newest, so that the new export's
    index is the one served. A version ``step`` built from that very export is left for
    :func:`publish` to refuse (:class:`IndexVersionExistsError`).
    """
    versions = complete_versions(index_dir)
    if not versions:
        return step
    taken = version_dir(index_dir, step)
    if is_complete(taken):
        return versions[-1] + 1 if export_step(read_index_json(taken)) < step else step
    newest = versions[-1]
    if newest > step and export_step(read_index_json(version_dir(index_dir, newest))) < step:
        return newest + 1
    return step


def publish_next(index_dir: str, embeddings: np.ndarray, index: mips_index.MipsIndex, metadata: Mapping[str, Any],
                 keep_versions: int, arrays: Mapping[str, np.ndarray] | None = None,
                 embeddings_file: str | None = None) -> tuple[int, str]:
    """:func:`publish` as the version after the highest complete one (0 for the first): ``(version, path)``.
    For indexes with one writer (a database build), whose versions are not trainer steps."""
    versions = complete_versions(index_dir)
    version = versions[-1] + 1 if versions else 0
    return version, publish(index_dir, version, embeddings, index, {"export_step": version, **metadata},
                            keep_versions, arrays=arrays, embeddings_file=embeddings_file)


def publish(index_dir: str, version: int, embeddings: np.ndarray, index: mips_index.MipsIndex,
            metadata: Mapping[str, Any], keep_versions: int, pause_before_commit: float = 0.0,
            arrays: Mapping[str, np.ndarray] | None = None, embeddings_file: str | None = None) -> str:
    """Publishes ``index`` (built over ``embeddings``) as ``<index_dir>/<version>`` and returns that path.

    Args:
      index_dir: root of the versioned index (local or gs://).
      version: a new, non-negative version number; readers switch to the highest complete one.
      embeddings: float32 ``[num_blocks, dim]`` the index was built from, in block_id order.
      index: a built :class:`MipsIndex` over ``embeddings``.
      metadata: recorded in ``index.json``; must contain ``vocab_hash`` (str, the tokenizer vocabulary the
        embeddings were computed with) and ``export_step`` (int, the trainer step of the Embed_doc
        snapshot); anything else JSON-serialisable is kept too (e.g. ``embed_seconds``).
      keep_versions: complete versions to keep (>= 1); older ones are deleted after publishing. The
        version just published is never deleted, even if higher versions exist.
      arrays: more arrays published with the version, ``{file name: array}`` (e.g. a kNN-LM datastore's
        ``values.npy``), saved without pickles and listed in ``index.json`` under ``arrays``.
      embeddings_file: a local ``.npy`` file that already holds ``embeddings`` (e.g. the memory map they were
        streamed into): moved into the version as ``embeddings.npy`` instead of being written again (a 13M x 128
        matrix is 6.8 GB). It is gone after a successful publication.

    Raises:
      IndexVersionExistsError: ``version`` is already published (complete).
      ValueError: inconsistent embeddings/index, or missing or reserved metadata keys.
    """
    start = time.perf_counter()
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
    final = version_dir(index_dir, version)  # the embeddings are checked once, by write_version (inside staging)
    if is_complete(final):
        raise IndexVersionExistsError(f"{final}: index version {version} is already published")
    try:
        with artifacts.staged(final, artifacts.INDEX, pause_before_commit=pause_before_commit) as staging:
            staging.metadata = write_version(staging.path, version, embeddings, index, metadata, arrays, start,
                                             embeddings_file=embeddings_file)
    except FileExistsError as e:
        raise IndexVersionExistsError(f"{final}: index version {version} was published concurrently") from e
    logger.info("published index version %d (%s, %d blocks) at %s", version, index.kind, index.num_blocks,
                 final)
    delete_old_versions(index_dir, keep_versions, protect=version)
    return final


def write_version(directory: str, version: int, embeddings: np.ndarray, index: mips_index.MipsIndex,
                  metadata: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None,
                  started: float | None = None, embeddings_file: str | None = None) -> dict[str, Any]:
    """Writes a version's files into ``directory`` (a staging directory) and returns its ``index.json``
    content, for a caller that commits the directory itself (:func:`publish`, or a corpus update that
    commits its blocks version first). Arguments as in :func:`publish`."""
    start = time.perf_counter() if started is None else started
    embeddings = _checked(embeddings, index, metadata)
    if embeddings_file is not None:
        _move_into(embeddings_file, os.path.join(directory, EMBEDDINGS_NPY))
    else:
        with tf.io.gfile.GFile(os.path.join(directory, EMBEDDINGS_NPY), "wb") as f:
            np.save(f, embeddings, allow_pickle=False)
    index.save(os.path.join(directory, SEARCHER_DIR))
    for name, array in (arrays or {}).items():
        with tf.io.gfile.GFile(os.path.join(directory, name), "wb") as f:
            np.save(f, np.asarray(array), allow_pickle=False)
    return {
        **dict(metadata), "format": FORMAT_VERSION, "version": version, "kind": index.kind,
        "num_blocks": index.num_blocks, "dim": index.dim, "embeddings": EMBEDDINGS_NPY,
        "searcher": SEARCHER_DIR, "index": index.describe(), "arrays": sorted(arrays or {}),
        "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "write_seconds": round(time.perf_counter() - start, 3)}


def delete_old_versions(index_dir: str, keep_versions: int, protect: int | None = None) -> list[int]:
    """Deletes all but the newest ``keep_versions`` complete versions (never ``protect``); returns them.

    Readers hold a loaded index in memory, so deleting the files of a version still being served is harmless.
    """
    return artifacts.delete_old_versions(index_dir, artifacts.INDEX, keep_versions, protect)


# ----------------------------------------------------------------------------------------------------------
# Implementation.


def _move_into(local_file: str, target: str) -> None:
    """Moves ``local_file`` to ``target`` (a rename on the same local filesystem, else a copy and a delete)."""
    if artifacts.is_local(target):
        shutil.move(local_file, artifacts.local_path(target))
    else:
        tf.io.gfile.copy(local_file, target, overwrite=True)
        os.unlink(local_file)


def _checked(embeddings: np.ndarray, index: mips_index.MipsIndex, metadata: Mapping[str, Any]) -> np.ndarray:
    """``embeddings`` as float32 ``[num_blocks, dim]`` after checking them against ``index`` and ``metadata``."""
    embeddings = mips_index.check_embeddings(embeddings)
    if (index.num_blocks, index.dim) != embeddings.shape:
        raise ValueError(f"index covers [{index.num_blocks}, {index.dim}] but embeddings are "
                         f"{list(embeddings.shape)}")
    _check_metadata(metadata)
    return embeddings


def _check_metadata(metadata: Mapping[str, Any]) -> None:
    reserved = sorted(set(metadata) & set(_RESERVED))
    if reserved:
        raise ValueError(f"metadata keys {reserved} are set by publish() itself")
    if not isinstance(metadata.get("vocab_hash"), str) or not metadata["vocab_hash"]:
        raise ValueError("metadata['vocab_hash'] (non-empty str) is required")
    step = metadata.get("export_step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"metadata['export_step'] (int) is required, got {step!r}")
    json.dumps(dict(metadata))  # fails early (before any file is written) on non-JSON values
