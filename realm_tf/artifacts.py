"""The artifacts one job publishes for another, and the only code that writes or lists them.

REALM's asynchronous refresh (Guu et al., 2020, §3.4) hands artefacts from one job to another: the trainer's
retriever export to the index builder, the index builder's MIPS index to the trainer's input pipeline, the
fine-tuned system to serving, and each data job's output to the next job. Every one is a directory that is
complete exactly when its **marker** (a JSON file, written last) exists:

* ``export.json``, a retriever SavedModel: written by ``export.retriever_export``, read by
  ``index.index_refresher``, ``beam_jobs/embed_blocks`` and the input pipeline (``index.index_loader``);
* ``index.json``, a MIPS index version: written by ``index.index_publisher``, read by ``index.index_loader``,
  ``tasks.open_qa`` and serving;
* ``realm_qa.json``, the Open-QA serving SavedModel: written by ``export.open_qa_export``, read by
  ``serving.answerer`` (and TF Serving);
* ``manifest.json``, a Beam job's output: written by every job (``data.job_manifest``), read by the next job.

Versioned artifacts live under ``<root>/<number>/``. :func:`staged` writes a directory under a staging name
next to its final one and publishes it in one step (marker last); :func:`complete_versions` lists only
complete versions, and :func:`delete_old_versions` prunes. Works on any TensorFlow filesystem (local, gs://).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import socket
import time
import uuid
from typing import Any, Collection, Iterator, Mapping

import tensorflow as tf

from realm_tf import errors

logger = logging.getLogger(__name__)

RETRIEVER_EXPORT = "export.json"  # a retriever SavedModel (embed_query / embed_block signatures)
INDEX = "index.json"  # a MIPS index version: embeddings.npy + searcher/
OPEN_QA_EXPORT = "realm_qa.json"  # the serving SavedModel of the Open-QA system
RETRO_EXPORT = "retro_lm.json"  # the SavedModel of a RETRO / baseline decoder (scoring and generation)
JOB_MANIFEST = "manifest.json"  # a Beam job's output directory (counts, shards, config)
REALM_IMPORT = "import.json"  # a run imported from Google's release (import-realm)
STAGING_PREFIX = ".staging-"
REPLACED_PREFIX = ".replaced-"  # a published directory moved aside while its replacement is committed
#: In a marker: ``{relative path: {"bytes": n, "sha256": hex}}`` of every file the artifact holds. Readers check
#: on load every size and the digest of every file up to :data:`LOAD_DIGEST_BYTES` (a missing, truncated or
#: corrupted graph, vocabulary, small index or fingerprint is named at once); ``realm-tf verify`` checks every
#: digest. Larger files (variables, a large index's embeddings) are hashed on demand only: TensorFlow's checkpoint
#: format carries its own CRC32C per tensor.
FILES = "files"
#: Files up to this size have their SHA-256 checked on every load (a few milliseconds each).
LOAD_DIGEST_BYTES = 16 << 20
#: Files that a served graph reads a record at a time (``data/block_records``' shards: tens of GB for a corpus of
#: millions of blocks) are size-checked on load and digested by ``realm-tf verify`` only.
READ_ON_DEMAND_PREFIXES = ("block_records-",)
MARKERS = (RETRIEVER_EXPORT, INDEX, OPEN_QA_EXPORT, RETRO_EXPORT, JOB_MANIFEST, REALM_IMPORT)


class Staging:
    """The directory being written inside :func:`staged`; set ``metadata`` to the marker's content."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.metadata: Mapping[str, Any] | None = None


@contextlib.contextmanager
def staged(final: str, marker: str, replace: bool = False, pause_before_commit: float = 0.0,
           marker_written: bool = False) -> Iterator[Staging]:
    """Publishes the directory ``final`` atomically, ``marker`` last.

    Yields a :class:`Staging` whose ``path`` (``<parent>/.staging-<name>-<random>``) the body fills and whose
    ``metadata`` it sets. On a normal exit the marker is written into the staging directory with that
    metadata, then the directory becomes ``final`` (:func:`commit`); if the body raises, the staging
    directory is removed and ``final`` is untouched. A directory already at ``final`` is replaced when it is
    incomplete (no marker: left by a crash) or when ``replace``; otherwise FileExistsError. Locally the two
    directories are swapped in one step (:func:`exchange`) where the system can; elsewhere the replaced directory
    is moved aside and restored if the commit fails; on an object store it is deleted first (no directory
    rename there). ``pause_before_commit`` > 0 sleeps that long with the staging directory
    complete (marker included) but not yet committed: for tests that kill a writer at the worst moment.
    ``marker_written``: the body writes the marker itself (a Beam job's manifest, with its own checksums).

    Staging and aside directories carry their writer's process id and host; those of a writer of ``final`` that
    died on this host are removed first, and a directory it had moved aside before its commit is put back when
    ``final`` is missing (:func:`recover`).
    """
    final = final.rstrip("/")
    parent = os.path.dirname(final) or "."
    tf.io.gfile.makedirs(parent)
    recover(final, marker)
    staging = Staging(os.path.join(parent, transient_name(STAGING_PREFIX, final)))
    tf.io.gfile.makedirs(staging.path)
    try:
        yield staging
        if marker_written:
            if not tf.io.gfile.exists(os.path.join(staging.path, marker)):
                raise ValueError(f"{final}: the job did not write its {marker}")
        elif staging.metadata is None:
            raise ValueError(f"{final}: nothing set the metadata of {marker}")
        else:
            write_marker(staging.path, marker,
                         {**staging.metadata, FILES: file_checksums(staging.path, exclude=(marker,))})
        if pause_before_commit > 0:
            logger.warning("%s: staged; pausing %.1fs before the commit", staging.path, pause_before_commit)
            time.sleep(pause_before_commit)
        _publish(staging.path, final, marker, replace)
    except BaseException:
        remove_quietly(staging.path)
        raise


def _publish(staging: str, final: str, marker: str, replace: bool) -> None:
    """Makes the complete ``staging`` directory ``final`` (:func:`staged`'s commit), replacing what is there."""
    parent = os.path.dirname(final) or "."
    aside = None
    if tf.io.gfile.exists(final):
        if tf.io.gfile.exists(os.path.join(final, marker)) and not replace:
            raise FileExistsError(f"{final}: already published")
        logger.warning("%s: replacing %s", final, "an earlier version" if replace else "an incomplete version")
        if is_local(final) and exchange(staging, final):  # one step: no moment without a version
            remove_quietly(staging)  # now the replaced directory (a dead writer's: cleaned by the next)
            return
        if is_local(final):  # kept aside until the new one is in place, and put back if the commit fails
            aside = os.path.join(parent, transient_name(REPLACED_PREFIX, final))
            os.rename(local_path(final), local_path(aside))
        else:  # object stores cannot move a directory in one step
            tf.io.gfile.rmtree(final)
    try:
        commit(staging, final, marker)
    except BaseException:
        if aside is not None and not tf.io.gfile.exists(final):
            os.rename(local_path(aside), local_path(final))
        raise
    if aside is not None:
        remove_quietly(aside)


def exchange(staging: str, final: str) -> bool:
    """Swaps two local directories in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``), ``staging``'s files
    fsynced first: ``final`` is the old directory or the new one at every moment, never missing. False (nothing
    done) where the system or the file system cannot (then :func:`staged` moves the old one aside first)."""
    import ctypes  # pylint: disable=import-outside-toplevel

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    src, dst = local_path(staging), local_path(final)
    _fsync_tree(src)
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_exchange) != 0:
        return False  # EINVAL / ENOSYS: not supported here
    _fsync_dir(os.path.dirname(dst))
    return True


def transient_name(prefix: str, final: str) -> str:
    """``<prefix><name>-<random>-<pid>@<host>``: a writer's transient directory beside ``final``."""
    return f"{prefix}{os.path.basename(final)}-{uuid.uuid4().hex[:12]}-{os.getpid()}@{socket.gethostname()}"


def dead_writer(name: str) -> bool:
    """True when the transient directory ``name`` belongs to a process of this host that no longer runs."""
    left, at, host = name.rpartition("@")
    pid = left.rsplit("-", 1)[-1]
    if not at or host != socket.gethostname() or not pid.isdigit():
        return False  # another host's, or an older name: its writer cannot be checked from here
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def dead_writers_directories(parent: str, prefixes: tuple[str, ...]) -> list[str]:
    """The directories under local ``parent`` whose names start with one of ``prefixes`` and belong to a writer
    of this host that no longer runs (:func:`transient_name`, :func:`dead_writer`)."""
    if not is_local(parent) or not tf.io.gfile.isdir(parent):
        return []
    names = (n.rstrip("/") for n in sorted(tf.io.gfile.listdir(parent)))
    return [os.path.join(parent, n) for n in names if n.startswith(prefixes) and dead_writer(n)]


def recover(final: str, marker: str) -> list[str]:
    """Cleans up after writers of ``final`` that died on this host (SIGKILL, power loss): their staging
    directories are removed, and a complete directory one had moved aside (:func:`staged` with a replacement)
    is put back when ``final`` is missing; otherwise it is removed. Local paths only; returns what it did."""
    final = final.rstrip("/")
    parent = os.path.dirname(final) or "."
    if not is_local(final) or not tf.io.gfile.isdir(parent):
        return []
    done = []
    base = os.path.basename(final)
    for path in dead_writers_directories(parent, (f"{STAGING_PREFIX}{base}-", f"{REPLACED_PREFIX}{base}-")):
        is_aside = os.path.basename(path).startswith(f"{REPLACED_PREFIX}{base}-")
        if is_aside and not tf.io.gfile.exists(final) and tf.io.gfile.exists(os.path.join(path, marker)):
            os.rename(local_path(path), local_path(final))
            logger.warning("%s: restored from %s, moved aside by a writer that died before its commit", final, path)
            done.append(f"restored {path}")
            continue
        remove_quietly(path)
        logger.warning("%s: removed, left by a writer that died", path)
        done.append(f"removed {path}")
    return done


def write_marker(directory: str, marker: str, content: Mapping[str, Any]) -> None:
    """Writes ``<directory>/<marker>`` as JSON: the completeness marker, so the last file of an artifact."""
    with tf.io.gfile.GFile(os.path.join(directory, marker), "w") as f:
        f.write(json.dumps(dict(content), indent=2, sort_keys=True))


def read_marker(directory: str, marker: str, what: str = "artifact") -> dict[str, Any]:
    """The marker of a complete artifact; FileNotFoundError naming the directory when it is incomplete."""
    path = os.path.join(directory, marker)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{directory}: no {marker}: not a complete {what}")
    with tf.io.gfile.GFile(path, "rb") as f:
        raw = f.read()
    try:
        marker_value = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise errors.UserError(f"{path}: not valid JSON ({e}): this {what} is damaged. Rebuild it, or delete "
                               f"{directory} so that readers use the previous complete version") from e
    if not isinstance(marker_value, dict):
        raise errors.UserError(f"{path}: not a JSON object: this {what} is damaged. Rebuild it, or delete "
                               f"{directory} so that readers use the previous complete version")
    problems = check_files(directory, marker_value, full=False, digest_up_to=LOAD_DIGEST_BYTES)
    if problems:
        raise errors.UserError(f"{problems[0]}: this {what} is damaged ({marker} lists every file it holds). "
                               f"Rebuild it, or delete {directory} so that readers use the previous complete version")
    return marker_value


def sha256_of(path: str, chunk_bytes: int = 8 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (any TensorFlow filesystem)."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def file_checksums(directory: str, exclude: Collection[str] = (), recursive: bool = True) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` of the files under ``directory`` (only its own files unless
    ``recursive``), hidden ones (``.name``) and ``exclude`` left out; the content of a marker's :data:`FILES`.
    A subdirectory that is an artifact of its own (it holds one of :data:`MARKERS`, e.g. an imported run's blocks
    and index versions) is left out too: its own marker lists and checks its files."""
    out: dict[str, dict[str, Any]] = {}
    for parent, subdirs, names in tf.io.gfile.walk(directory):
        relative_parent = os.path.relpath(parent, directory)
        if not recursive:
            subdirs[:] = []
        if relative_parent != "." and any(marker in names for marker in MARKERS):
            subdirs[:] = []
            continue
        if any(part.startswith(".") for part in relative_parent.split(os.sep) if part != "."):
            continue
        for name in names:
            relative = name if relative_parent == "." else os.path.join(relative_parent, name)
            if name.startswith(".") or relative in exclude:
                continue
            path = os.path.join(parent, name)
            out[relative] = {"bytes": tf.io.gfile.stat(path).length, "sha256": sha256_of(path)}
    return dict(sorted(out.items()))


def check_files(directory: str, marker_value: Mapping[str, Any], full: bool = False,
                digest_up_to: int = 0) -> list[str]:
    """What is wrong with the files a marker lists (``[]``: nothing): each missing file, each whose size differs
    (truncated or overwritten) and each whose SHA-256 differs (corrupted): every file's when ``full``, else those
    of files up to ``digest_up_to`` bytes but the :data:`READ_ON_DEMAND_PREFIXES` ones. A marker written without
    :data:`FILES` has nothing to check."""
    problems = []
    for relative, expected in dict(marker_value.get(FILES) or {}).items():
        path = os.path.join(directory, relative)
        if not tf.io.gfile.exists(path):
            problems.append(f"{path}: missing")
            continue
        size = tf.io.gfile.stat(path).length
        if size != expected["bytes"]:
            problems.append(f"{path}: {size} bytes where {expected['bytes']} were written (truncated or overwritten)")
        elif ((full or (size <= digest_up_to and not os.path.basename(relative).startswith(READ_ON_DEMAND_PREFIXES)))
              and sha256_of(path) != expected["sha256"]):
            problems.append(f"{path}: its SHA-256 differs from the one written (corrupted)")
    return problems


def verify(path: str) -> list[tuple[str, list[str]]]:
    """``[(artifact directory, problems)]`` for ``path``: a complete artifact (any of :data:`MARKERS`) or a
    directory of numbered versions of one; every listed file's size and SHA-256 is checked. An artifact written
    without checksums is reported as such. ValueError when ``path`` holds no artifact."""
    path = path.rstrip("/")
    found = [m for m in MARKERS if is_complete(path, m)]
    targets = [(path, m) for m in found] or [(v, m) for m in MARKERS for v in complete_versions(path, m).values()]
    if not targets:
        raise ValueError(f"{path}: no artifact here (none of {', '.join(MARKERS)}, nor numbered versions "
                         f"holding one)")
    out = []
    for directory, marker in targets:
        try:
            with tf.io.gfile.GFile(os.path.join(directory, marker)) as f:
                value = json.loads(f.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            out.append((directory, [f"{os.path.join(directory, marker)}: not valid JSON ({e})"]))
            continue
        if not isinstance(value, dict) or not value.get(FILES):
            out.append((directory, [f"{os.path.join(directory, marker)}: written without checksums "
                                    f"(nothing to verify; publish it again to add them)"]))
            continue
        out.append((directory, check_files(directory, value, full=True)))
    return out


def is_complete(directory: str, marker: str) -> bool:
    return tf.io.gfile.exists(os.path.join(directory, marker))


def drop_mapped_pages(array: Any) -> None:
    """Drops the pages a memory-mapped ``array`` (an ``np.memmap``, or a view of one: the map is found through the
    views' ``base`` chain) has read from this process's resident memory (``madvise(MADV_DONTNEED)``; they stay
    in the page cache and are read again on the next access; a writable map must be flushed first). A pass over
    REALM's 13M x 128 ``embeddings.npy`` would otherwise leave 6.8 GB counted in the process's RSS. Anything
    else: nothing to do."""
    owner: Any = array
    while owner is not None:
        mapping = owner if isinstance(owner, mmap.mmap) else getattr(owner, "_mmap", None)
        if isinstance(mapping, mmap.mmap):
            mapping.madvise(mmap.MADV_DONTNEED)
            return
        owner = getattr(owner, "base", None)


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
        logger.exception("could not remove %s", path)


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


def warn_incomplete_versions(root: str, marker: str, what: str) -> list[str]:
    """Logs each numbered directory under ``root`` newer than its newest complete version that lacks ``marker``
    (a version damaged, or copied in by hand and not finished: writers here publish whole versions, so none is
    ever seen half-written) and returns them; readers skip them and serve the newest complete version."""
    if not tf.io.gfile.isdir(root):
        return []
    complete = complete_versions(root, marker)
    newest = max(complete, default=-1)
    skipped = sorted((int(n.rstrip("/")), os.path.join(root, n.rstrip("/"))) for n in tf.io.gfile.listdir(root)
                     if n.rstrip("/").isdecimal() and int(n.rstrip("/")) > newest)
    for _, path in skipped:
        logger.warning("%s: no %s: not a complete %s (damaged, or still being copied); skipped, the newest complete "
                       "version is %s", path, marker, what, complete.get(newest, "none"))
    return [path for _, path in skipped]


def newest_complete(path: str, marker: str) -> str | None:
    """``path`` itself when it is a complete artifact, else its newest complete version (TF Serving's model
    base path convention: numbered versions under one directory, the newest served); None when neither."""
    path = path.rstrip("/")
    if is_complete(path, marker):
        return path
    versions = complete_versions(path, marker)
    return versions[max(versions)] if versions else None


def next_version_dir(root: str, marker: str) -> str:
    """``<root>/<n>``: the version after the newest complete one (1 for the first), unpadded as TF Serving names
    them."""
    return os.path.join(root.rstrip("/"), str(max(complete_versions(root, marker), default=0) + 1))


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
