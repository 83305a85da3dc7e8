"""The index builder of REALM's asynchronous refresh, as a long-running job (Guu et al., 2020, §3.4).

    "we asynchronously refresh the MIPS index by rerunning the embedding function every several hundred
     training steps ... two jobs running in parallel: a primary trainer job ... and a secondary index
     builder job, which uses the parameters sent by the trainer to embed and index all documents."

:class:`IndexRefresher` watches ``refresh.export_dir``. Whenever a complete export is newer than the newest
published index version, it runs the index builder it was given on it (``beam_jobs/embed_blocks``: the DirectRunner
locally, or any Beam runner through ``refresh.beam_options``), which publishes ``index_dir/<export step>/``
atomically. The builder is passed in by the entry point that composes the two (``realm-tf refresh-index``,
``realm-tf pretrain``), so the index package does not depend on the Beam jobs that sit above it. When it
falls behind it skips to the newest export. A failed run is logged and recorded where the trainer reads it
(:mod:`realm_tf.index.refresh_failures`), and retried up to ``refresh.max_failures`` attempts; the previous
index version stays in service meanwhile. It runs as ``realm-tf refresh-index --watch``, as a
child process of the trainer, or as a thread inside it (``refresh.mode``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Protocol, Sequence

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf.index import index_publisher
from realm_tf.index import refresh_failures

logger = logging.getLogger(__name__)


class IndexBuilder(Protocol):
    """Embeds every block with the retriever export ``export_path`` and publishes ``<index_dir>/<export step>/``
    (``beam_jobs.embed_blocks.embed_and_publish``); raises ``IndexVersionExistsError`` when that version exists."""

    def __call__(self, cfg: config_lib.ExperimentConfig, export_path: str, index_dir: str | None = None, *,
                 beam_args: Sequence[str] = (), pause_before_commit: float = 0.0) -> Any: ...


class IndexRefresher:
    """Runs the index builder on each new retriever export.

    Args:
      config_path: the experiment config file, or several layered (the trainer passes its ``params.yaml``).
      build_index: the index builder (``beam_jobs.embed_blocks.embed_and_publish``).
      overrides: dotted overrides applied on top of it.
      export_dir: exports to watch (default ``refresh.export_dir``).
      index_dir: where versions are published (default ``index.index_dir``).
      beam_args: Beam pipeline options (default ``refresh.beam_options``).
      pause_before_commit: passed to embed_blocks (fault-injection tests only).
    """

    def __init__(self, config_path: str | Sequence[str], build_index: IndexBuilder, overrides: Sequence[str] = (),
                 export_dir: str | None = None, index_dir: str | None = None, beam_args: Sequence[str] | None = None,
                 pause_before_commit: float = 0.0) -> None:
        self.config_path = config_path
        self.build_index = build_index
        self.overrides = list(overrides)
        self.cfg = cfg = config_lib.load_config(config_path, overrides)
        self.export_dir = export_dir or cfg.refresh.export_dir
        self.index_dir = index_dir or cfg.index.index_dir
        self.beam_args = list(cfg.refresh.beam_options if beam_args is None else beam_args)
        self.poll_seconds = cfg.refresh.poll_seconds
        self.pause_before_commit = pause_before_commit
        self.published: list[int] = []  # versions this refresher published
        self.failed: dict[int, str] = {}  # export step -> error, after refresh.max_failures attempts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pending_export(self) -> int | None:
        """The newest export step that is newer than the export of every published index version (None if
        none). Index versions are numbered by export step, except corpus updates, which keep their export."""
        exports = [s for s in artifacts.complete_versions(self.export_dir, artifacts.RETRIEVER_EXPORT)
                   if s not in self.failed]
        if not exports:
            return None
        indexed = index_publisher.newest_export_step(self.index_dir)
        return exports[-1] if indexed is None or exports[-1] > indexed else None

    def refresh_once(self) -> int | None:
        """Builds and publishes the index of the pending export, if any; returns its version."""
        step = self.pending_export()
        if step is None:
            return None
        export_path = os.path.join(self.export_dir, str(step))
        start = time.time()
        logger.info("refresh-index: building index version %d from %s", step, export_path)
        try:
            self.build_index(self.cfg, export_path, self.index_dir, beam_args=self.beam_args,
                             pause_before_commit=self.pause_before_commit)
        except index_publisher.IndexVersionExistsError:
            return None  # another builder published it meanwhile
        except Exception as e:  # pylint: disable=broad-except  # keep watching; the old index stays in service
            error = f"{type(e).__name__}: {e}"
            attempts = refresh_failures.record(self.export_dir, step, error)  # where the trainer reads it
            logger.exception("refresh-index: export %d failed (attempt %d of %d)", step, attempts,
                             self.cfg.refresh.max_failures)
            if attempts >= self.cfg.refresh.max_failures:
                self.failed[step] = error  # not retried; a newer export is
            return None
        self.published.append(step)
        logger.info("refresh-index: published index version %d in %.1fs", step, time.time() - start)
        return step

    def watch(self, max_versions: int | None = None) -> None:
        """Refreshes until :meth:`stop` (or after ``max_versions`` publishes), polling every ``poll_seconds``."""
        while not self._stop.is_set():
            self.refresh_once()
            if max_versions is not None and len(self.published) >= max_versions:
                return
            self._stop.wait(self.poll_seconds)

    def start_thread(self) -> threading.Thread:
        """Runs :meth:`watch` on a daemon thread (``refresh.mode: thread``)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.watch, name="index-refresher", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = None) -> None:
        """Stops watching; waits for a build in progress to finish (up to ``timeout``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
