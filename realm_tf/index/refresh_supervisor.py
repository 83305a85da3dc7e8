"""Who builds the next index while REALM trains (Guu et al., 2020, §3.4: "two jobs running in parallel: a
primary trainer job ... and a secondary index builder job"): the trainer's side of the asynchronous refresh.

:class:`RefreshSupervisor` publishes the first index version if there is none, starts the index builder
(:class:`realm_tf.index.index_refresher.IndexRefresher`) as ``refresh.mode`` says, and stops it when training
ends; :func:`wait_for_index` gives an :class:`~realm_tf.index.index_loader.IndexLoader` once a version exists
(a non-chief worker waits for the chief's).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any, Callable

from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.index import index_loader
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.index import refresh_failures

logger = logging.getLogger(__name__)


class RefreshSupervisor:
    """Starts the index builder the way ``refresh.mode`` says, and stops it at the end.

    ``process``: ``realm-tf refresh-index --watch`` as a child process (log in ``<model_dir>/refresh-index.log``);
    ``thread``: an :class:`IndexRefresher` on a thread of the trainer; ``external``: nothing (your own job).

    Args:
      cfg: the trainer's config.
      params_path: its ``params.yaml``, which the index builder reads.
      build_index: the index builder to run in this process (the first version, and ``thread`` mode). Without
        one, the first version is built by ``realm-tf refresh-index`` in a child process, and ``thread`` mode is
        refused.
    """

    def __init__(self, cfg: config_lib.ExperimentConfig, params_path: str,
                 build_index: index_refresher.IndexBuilder | None = None):
        self.cfg = cfg
        self.params_path = params_path
        self.build_index = build_index
        self.refresher: index_refresher.IndexRefresher | None = None
        self.process: subprocess.Popen | None = None
        self.exits = 0  # times the builder's child process exited while training went on
        self.last_exit = ""

    def bootstrap(self, step: int, export: Callable[[], str]) -> None:
        """Publishes a first index when ``index_dir`` has none: ``export()`` writes the current retriever's export
        (of ``step``), which is then embedded in this process."""
        if index_publisher.complete_versions(self.cfg.index.index_dir):
            return
        logger.info("no index in %s: exporting the retriever at step %d and embedding the corpus for the first "
                    "index version", self.cfg.index.index_dir, step)
        export()
        if self.build_index is None:
            done = subprocess.run([*self._refresh_index_command(), "--config", self.params_path], check=False,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            failure = f"realm-tf refresh-index exited with {done.returncode}: {done.stdout[-2000:]}"
            built = done.returncode == 0 and index_publisher.complete_versions(self.cfg.index.index_dir)
        else:
            refresher = index_refresher.IndexRefresher(self.params_path, self.build_index)
            built = refresher.refresh_once() is not None
            failure = refresh_failures.since_last_index(self.cfg.refresh.export_dir, self.cfg.index.index_dir)[1]
            failure = failure or "no export"
        if not built:
            raise errors.UserError(f"{self.cfg.index.index_dir}: could not build the first index: {failure}")

    @staticmethod
    def _refresh_index_command() -> list[str]:
        return [sys.executable, "-m", "realm_tf.cli", "refresh-index"]

    def start(self) -> None:
        mode = self.cfg.refresh.mode
        if self.cfg.refresh.export_every_steps <= 0 or mode == "external":
            return
        if mode == "thread":
            if self.build_index is None:
                raise config_lib.ConfigError("refresh.mode=thread runs the index builder inside the trainer, which "
                                             "was given none: use refresh.mode=process, or pass the builder "
                                             "(realm-tf pretrain passes beam_jobs.embed_blocks)")
            self.refresher = index_refresher.IndexRefresher(self.params_path, self.build_index)
            self.refresher.start_thread()
        else:
            self._start_process()

    @property
    def log_path(self) -> str:
        return os.path.join(self.cfg.pretrain.model_dir, "refresh-index.log")

    def _start_process(self) -> None:
        """``realm-tf refresh-index --watch`` as a child; with ``refresh.devices: cpu`` the GPUs are hidden from
        it, so that it neither fails for want of the memory the trainer holds nor takes the trainer's."""
        env = dict(os.environ)
        if self.cfg.refresh.devices == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = open(self.log_path, "ab")  # pylint: disable=consider-using-with
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [*self._refresh_index_command(), "--config", self.params_path, "--watch"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        logger.info("index builder running as process %d (log: %s)", self.process.pid, self.log_path)

    def check(self, report: Callable[[int], None] = lambda failures: None) -> int:
        """The index builder's failures since the newest index version: its failed builds
        (:mod:`realm_tf.index.refresh_failures`) and, in ``process`` mode, the times its child exited (it is
        started again), handed to ``report`` first. Raises :class:`~realm_tf.errors.UserError` with the last error
        once they reach ``refresh.max_failures``."""
        if self.process is not None and self.process.poll() is not None:
            self.exits += 1
            logger.warning("the index builder (process %d) exited with %s; starting it again (log: %s)",
                           self.process.pid, self.process.returncode, self.log_path)
            self.last_exit = f"realm-tf refresh-index exited with {self.process.returncode}"
            self._start_process()
        failures, error = refresh_failures.since_last_index(self.cfg.refresh.export_dir, self.cfg.index.index_dir)
        failures += self.exits
        report(failures)  # before any error: the count that stops the run is in the trainer's scalars
        if failures >= self.cfg.refresh.max_failures:
            raise errors.UserError(
                f"the index builder failed {failures} times since index version "
                f"{max(index_publisher.complete_versions(self.cfg.index.index_dir), default=None)} "
                f"(refresh.max_failures={self.cfg.refresh.max_failures}), so the index no longer refreshes: "
                f"{error or self.last_exit} (log: {self.log_path if self.process is not None else 'the builder'})")
        return failures

    def stop(self) -> None:
        if self.refresher is not None:
            self.refresher.stop()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def wait_for_index(loader_args: dict[str, Any], timeout: float) -> index_loader.IndexLoader:
    """An IndexLoader once a first version is published (non-chief workers wait for the chief's)."""
    deadline = time.time() + timeout
    while True:
        try:
            return index_loader.IndexLoader(**loader_args)
        except index_loader.IndexNotFoundError:
            if time.time() > deadline:
                raise
            time.sleep(2.0)
