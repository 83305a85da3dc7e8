"""The consumer half of REALM's asynchronous index refresh: serve the newest complete index, hot-swap it.

REALM (Guu et al., 2020, §3.4) trains against a MIPS index that is "stale" by a few hundred steps: a
background job re-embeds the corpus and publishes a new index (:mod:`realm_tf.index.index_publisher`),
and the trainer moves to it once it is ready, without pausing. :class:`IndexLoader` is that move:

* it serves the newest **complete** version of ``<index_dir>`` (numeric directory with ``index.json``);
* :meth:`IndexLoader.maybe_refresh`, called by the caller or by an optional watcher thread, loads a newer
  version *beside* the one in service and then swaps a single reference under a lock;
  :meth:`IndexLoader.refresh_in_background` (the tf.data pipeline, between batches) does the same on a thread of
  its own, so that batches keep coming while a version loads; searches take a snapshot of
  ``(version, index, metadata)`` first, so each result comes entirely from one version, and
  :class:`SearchResult` says which;
* a version whose ``dim``, ``vocab_hash`` or ``kind`` differs from what the model expects is refused with
  :class:`IndexMismatchError` naming its directory; any failure to load a new version leaves the previous
  one in service (logged and counted in :attr:`IndexLoader.failed_loads`);
* with ``blocks_dir``, each version comes with the :class:`~realm_tf.data.block_store.BlockStore` of the
  corpus version its rows point into (``index.json``: ``corpus_version``, :mod:`realm_tf.data.corpus_versions`),
  loaded beside the one in service and swapped with the index in the same step: a corpus update
  (``realm-tf update-corpus``) reaches the trainer like any refresh, without a restart.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from realm_tf import artifacts
from realm_tf import errors
from realm_tf.data import block_store as block_store_lib
from realm_tf.data import corpus_versions
from realm_tf.index import index_kinds
from realm_tf.index import index_publisher
from realm_tf.index import mips_index

logger = logging.getLogger(__name__)


class IndexMismatchError(errors.UserError, ValueError):
    """A published index does not fit the model (dim, vocabulary hash or kind); names the directory."""


class IndexNotFoundError(errors.UserError, FileNotFoundError):
    """No complete, loadable index version exists under the index directory."""


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Top-k blocks for a batch of queries, tagged with the index version that produced them.

    Attributes:
      version: the published version searched.
      rows: int64 ``[num_queries, k]`` block ids (rows of that version's embedding matrix).
      scores: float32 ``[num_queries, k]`` inner products Embed_input(x)ᵀ Embed_doc(z).
      directory: the version's directory.
    """

    version: int
    rows: np.ndarray
    scores: np.ndarray
    directory: str


@dataclasses.dataclass(frozen=True)
class CorpusSnapshot:
    """One index version in service and the blocks its rows point into (None without ``blocks_dir``)."""

    version: int
    directory: str
    index: mips_index.MipsIndex
    metadata: dict[str, Any]
    blocks: block_store_lib.BlockStore | None = None


class IndexLoader:
    """Serves the newest complete index version under ``index_dir`` and swaps in newer ones.

    Args:
      index_dir: root written by :func:`realm_tf.index.index_publisher.publish`.
      expected_dim: the retriever's projection size; other dims are refused.
      expected_vocab_hash: hash of the tokenizer vocabulary; an index embedded with another is refused.
      kind: index implementation expected (``"scann"`` or ``"brute_force"``).
      require_index: raise :class:`IndexNotFoundError` at construction when no version can be loaded;
        with False, :meth:`search_batched` raises it until one appears and :meth:`maybe_refresh` loads it.
      min_refresh_interval_seconds: :meth:`maybe_refresh` lists the directory at most this often (a listing
        is a network call on gs://; the input pipeline may call it every batch).
      blocks_dir: the corpus of record (``data.blocks_dir``); when given, every version is served with the
        blocks of its corpus version (:meth:`snapshot`), and one whose corpus does not have as many blocks as
        the index has rows is refused like a mismatch.

    Raises:
      IndexMismatchError: the newest complete version does not match (at construction only; later ones
        are skipped and counted instead, so training continues on the index it has).
      IndexNotFoundError: ``require_index`` and nothing loadable.
    """

    def __init__(self, index_dir: str, expected_dim: int, expected_vocab_hash: str, kind: str = "scann",
                 require_index: bool = True, min_refresh_interval_seconds: float = 0.0,
                 blocks_dir: str | None = None) -> None:
        index_kinds.index_class(kind)  # an unknown kind fails here, before any version is read
        self.index_dir = index_dir
        self.expected_dim = int(expected_dim)
        self.expected_vocab_hash = expected_vocab_hash
        self.kind = kind
        self.min_refresh_interval_seconds = float(min_refresh_interval_seconds)
        self.blocks_dir = blocks_dir
        self.failed_loads = 0  # versions that could not be loaded (mismatch, corrupt, vanished)
        self.swaps = 0  # versions put in service, the first one included
        self.last_error: BaseException | None = None  # why the last failed version could not be loaded
        self.last_failed_directory: str | None = None  # ... and which directory it was
        self._failed_versions: set[int] = set()
        self._snapshot: CorpusSnapshot | None = None
        self._lock = threading.Lock()  # guards _snapshot
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._last_check = float("-inf")
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        artifacts.warn_incomplete_versions(index_dir, artifacts.INDEX, "index version")
        self._refresh(raise_mismatch=True)
        if require_index and self._snapshot is None:
            raise self._not_found() from self.last_error

    # ---- serving ------------------------------------------------------------------------------------------

    def search_batched(self, queries: np.ndarray, k: int) -> SearchResult:
        """Top-``k`` blocks for ``queries`` ([num_queries, dim]) from one consistent index version."""
        snap = self._current()
        rows, scores = snap.index.search_batched(queries, k)  # [num_queries, k] each
        return SearchResult(version=snap.version, rows=rows, scores=scores, directory=snap.directory)

    @property
    def version(self) -> int | None:
        """The version in service (None before the first one is loaded)."""
        snap = self._snapshot
        return None if snap is None else snap.version

    def current(self) -> tuple[int, mips_index.MipsIndex, dict[str, Any]]:
        """A consistent ``(version, index, index.json metadata)`` of the version in service."""
        snap = self._current()
        return snap.version, snap.index, snap.metadata

    def snapshot(self) -> CorpusSnapshot:
        """The version in service with its blocks (``blocks`` is None unless the loader has a ``blocks_dir``)."""
        return self._current()

    # ---- refreshing ---------------------------------------------------------------------------------------

    def maybe_refresh(self) -> bool:
        """Swaps in the newest complete version if it is newer than the one in service.

        Cheap when nothing changed (one directory listing, rate-limited by ``min_refresh_interval_seconds``).
        Loading happens outside the swap lock, so concurrent searches continue on the old version meanwhile.
        Returns True when a new version went into service. Never raises for a bad new version: it is
        logged, counted in :attr:`failed_loads`, kept in :attr:`last_error` / :attr:`last_failed_directory`,
        and not retried.
        """
        now = time.monotonic()
        if now - self._last_check < self.min_refresh_interval_seconds:
            return False
        return self._refresh(raise_mismatch=False)

    def refresh_in_background(self) -> bool:
        """:meth:`maybe_refresh` on a thread of its own, so that the caller (the input pipeline, between batches)
        does not wait while a new version loads: the batches go on with the version in service until the swap.
        Rate-limited like :meth:`maybe_refresh`; returns True when it started a check."""
        now = time.monotonic()
        if now - self._last_check < self.min_refresh_interval_seconds or self._refresh_lock.locked():
            return False
        self._last_check = now
        thread = threading.Thread(target=self._logged, args=(lambda: self._refresh(raise_mismatch=False),),
                                  name="index-load", daemon=True)
        thread.start()
        return True

    def _logged(self, refresh: Callable[[], Any]) -> None:
        """``refresh()`` on a thread of this loader's: an error (a listing's) is logged; the next check tries
        again."""
        try:
            refresh()
        except Exception:  # pylint: disable=broad-except
            logger.exception("%s: index refresh failed", self.index_dir)

    def start_watcher(self, interval_seconds: float = 30.0) -> threading.Thread:
        """Calls :meth:`maybe_refresh` every ``interval_seconds`` on a daemon thread until :meth:`stop`."""
        if self._watcher is not None and self._watcher.is_alive():
            return self._watcher
        self._stop.clear()

        def watch() -> None:
            while not self._stop.wait(interval_seconds):
                self._logged(self.maybe_refresh)

        self._watcher = threading.Thread(target=watch, name="index-watcher", daemon=True)
        self._watcher.start()
        return self._watcher

    def stop(self, timeout: float | None = None) -> None:
        """Stops the watcher thread, if any, and waits for it."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout)
            self._watcher = None

    def __enter__(self) -> "IndexLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- implementation -----------------------------------------------------------------------------------

    def _current(self) -> CorpusSnapshot:
        with self._lock:
            snap = self._snapshot
        if snap is None:
            raise self._not_found()
        return snap

    def _refresh(self, raise_mismatch: bool) -> bool:
        if not self._refresh_lock.acquire(blocking=False):
            return False  # another thread is already loading
        try:
            self._last_check = time.monotonic()
            current = self._snapshot
            newer = [v for v in reversed(index_publisher.complete_versions(self.index_dir))
                     if (current is None or v > current.version) and v not in self._failed_versions]
            for version in newer:  # newest first; fall back to older-but-newer-than-current on failure
                path = index_publisher.version_dir(self.index_dir, version)
                try:
                    snap = self._load(version, path)
                except IndexMismatchError as e:
                    if raise_mismatch:
                        raise
                    self._record_failure(version, path, e)
                    continue
                except Exception as e:  # pylint: disable=broad-except  # keep serving the old version
                    self._record_failure(version, path, e)
                    continue
                with self._lock:
                    self._snapshot = snap  # the swap: one reference assignment
                    self.swaps += 1
                logger.info("%s: serving index version %d (%d blocks)", self.index_dir, version,
                             snap.index.num_blocks)
                return True
            return False
        finally:
            self._refresh_lock.release()

    def _load(self, version: int, path: str) -> CorpusSnapshot:
        meta = index_publisher.read_index_json(path)
        problems = []
        if meta.get("version") != version:
            problems.append(f"index.json says version {meta.get('version')!r}")
        if meta.get("kind") != self.kind:
            problems.append(f"kind {meta.get('kind')!r} != expected {self.kind!r}")
        if meta.get("dim") != self.expected_dim:
            problems.append(f"dim {meta.get('dim')!r} != expected {self.expected_dim}")
        if meta.get("vocab_hash") != self.expected_vocab_hash:
            problems.append(f"vocab_hash {meta.get('vocab_hash')!r} != expected {self.expected_vocab_hash!r}")
        if problems:
            raise IndexMismatchError(f"{path}: index does not match the model: {'; '.join(problems)}")
        index = index_kinds.load_index(self.kind, path, meta["searcher"])
        if (index.num_blocks, index.dim) != (meta["num_blocks"], meta["dim"]):
            raise IndexMismatchError(f"{path}: searcher is [{index.num_blocks}, {index.dim}] but index.json "
                                     f"says [{meta['num_blocks']}, {meta['dim']}]")
        return CorpusSnapshot(version=version, directory=path, index=index, metadata=meta,
                              blocks=self._blocks_of(path, meta))

    def _blocks_of(self, path: str, meta: dict[str, Any]) -> block_store_lib.BlockStore | None:
        """The blocks of the version's corpus (shared with the version in service when it is the same)."""
        if self.blocks_dir is None:
            return None
        corpus = index_publisher.corpus_version(meta)
        current = self._snapshot
        if current is not None and current.blocks is not None and \
                index_publisher.corpus_version(current.metadata) == corpus:
            blocks = current.blocks
        else:
            blocks = block_store_lib.BlockStore.load(corpus_versions.blocks_pattern(self.blocks_dir, corpus))
        if len(blocks) != meta["num_blocks"]:
            raise IndexMismatchError(f"{path}: index has {meta['num_blocks']} rows but corpus version {corpus} "
                                     f"({blocks.source}) has {len(blocks)} blocks")
        return blocks

    def _record_failure(self, version: int, path: str, error: BaseException) -> None:
        self.failed_loads += 1
        self.last_error = error
        self.last_failed_directory = path
        self._failed_versions.add(version)
        logger.error("%s: cannot load index version %d, keeping version %s in service: %s", path, version,
                      self.version, error)

    def _not_found(self) -> IndexNotFoundError:
        detail = (f" (last failure: {self.last_failed_directory}: {self.last_error})"
                  if self.last_error is not None else "")
        return IndexNotFoundError(f"{self.index_dir}: no complete, loadable index version{detail}")
